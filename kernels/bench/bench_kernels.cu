// Benchmark and example kernels (their module and host versions: mscclpp/src/bench_kernels.rs).
// Vendor-neutral: the same text is compiled by NVRTC and by hipRTC.
#include "mscclpp/mscclpp.cuh"
#include "mscclpp/layout_check.h"
#include "bench/args.cuh"
#include "bench/args_check.h"

namespace mscclpp {

// One grid barrier per module; zero-initialised at load, never reset (replays stay consistent).
__device__ DeviceSyncer benchSyncer;

MSCCLPP_DEVICE_INLINE uint32_t flatThread() { return blockIdx.x * blockDim.x + threadIdx.x; }
MSCCLPP_DEVICE_INLINE uint32_t flatThreads() { return gridDim.x * blockDim.x; }

}  // namespace mscclpp

// `iters` rounds: every thread puts its share of `bytes`, the grid synchronises, thread 0
// signals the peer and waits for the peer's signal, the grid synchronises again.
// Launch with a one-dimensional grid whose blocks are all resident.
extern "C" __global__ void mscclpp_bench_memory_channel_put(mscclpp::MemoryChannelPutArgs a) {
  const mscclpp::uint32_t tid = mscclpp::flatThread();
  const mscclpp::uint32_t n = mscclpp::flatThreads();
  for (mscclpp::uint64_t it = 0; it < a.iters; ++it) {
    a.chan.put(0, 0, a.bytes, tid, n);
    mscclpp::benchSyncer.sync(gridDim.x);
    if (tid == 0) {
      a.chan.signal();
      a.chan.wait();
    }
    mscclpp::benchSyncer.sync(gridDim.x);
  }
}

// `iters` rounds of putWithSignal through the proxy and a wait for the peer's signal (thread 0).
extern "C" __global__ void mscclpp_bench_port_channel_put(mscclpp::PortChannelPutArgs a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (mscclpp::uint64_t it = 0; it < a.iters; ++it) {
    a.chan.putWithSignal(0, 0, a.bytes);
    a.chan.wait();
  }
}

// `rounds` signal/wait round trips on one thread; the initiator signals first.
extern "C" __global__ void mscclpp_example_ping_pong(mscclpp::PingPongArgs a) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  for (mscclpp::uint64_t r = 0; r < a.rounds; ++r) {
    if (a.initiator) {
      if (a.relaxed) a.chan.relaxedSignal(); else a.chan.signal();
    }
    if (a.relaxed) a.chan.relaxedWait(); else a.chan.wait();
    if (!a.initiator) {
      if (a.relaxed) a.chan.relaxedSignal(); else a.chan.signal();
    }
  }
}
