// Where does the LL all-reduce's small-message time go? One process, two GPUs with peer access
// (rank r on GPU r), bf16 sum, graph-timed as mscclpp-perf times (a graph of 20 calls per GPU,
// replayed; time per call), every result checked. Variants, each on the same buffers:
//   empty      an empty kernel with the same grid (the launch floor);
//   ours       the library's general LL kernel (kernels/collectives/ll.cu, included below);
//   minimal    the floor of docs/gpu-machines.md: one packet per thread, poll, add; a flag counter
//              per block; min-early: the same with the input loaded before the counter is used;
//   short      the library's short all-reduce (mscclpp_collective_ll_short_allreduce_*);
//   sN         the short kernel's steps (shortVar<N> below; what the library adopted is s17);
//   one, ladN  earlier steps from the general kernel towards minimal (oneRound, ladder;
//              runs 35 and 36 in docs/performance.md).
// The grid is the library's: one block per `argv[1]` packets (default 512), a thread per packet.
//
// Build (here or on the GPU machine; nvcc 13 and cudart, both in NVIDIA's PyPI wheels):
//   nvcc -O3 -arch=sm_90 -std=c++17 -I kernels/cuda/include -I kernels/include -I kernels -o ll_probe \
//        experiments/ll-latency/ll_probe.cu
// Run: ll_probe [packets-per-block]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <string>
#include <cuda_runtime.h>

#include "../../kernels/collectives/ll.cu"

#define CK(x)                                                                                   \
  do {                                                                                          \
    cudaError_t e_ = (x);                                                                       \
    if (e_ != cudaSuccess) {                                                                    \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      exit(1);                                                                                  \
    }                                                                                           \
  } while (0)

namespace probe {
using mscclpp::uint32_t;
using mscclpp::uint64_t;

struct MinimalArgs {
  const uint64_t* input;
  uint64_t* output;
  char* scratch;      // own
  char* peerScratch;  // the peer's
  uint64_t* flags;    // one counter per block
  uint64_t halfBytes;
  uint32_t npackets;
  uint32_t rank;
};

// EARLY (min-early): the input word is loaded before the counter is used.
template <bool EARLY>
__global__ void minimal(MinimalArgs a) {
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  uint64_t w = 0;
  if (EARLY && i < a.npackets) w = a.input[i];
  const uint64_t f64 = a.flags[blockIdx.x] + 1;
  const uint32_t flag = (uint32_t)f64;
  const uint64_t half = (f64 & 1) * a.halfBytes;
  if (i < a.npackets) {
    if (!EARLY) w = a.input[i];
    ((mscclpp::LL16Packet*)(a.peerScratch + half + 16 * (uint64_t)i))->write(w, flag);
    const uint64_t p = ((const mscclpp::LL16Packet*)(a.scratch + half + 16 * (uint64_t)i))->read(flag);
    mscclpp::Reducer<mscclpp::kDataTypeBF16, mscclpp::kReduceSum> acc;
    acc.load(a.rank == 0 ? w : p);
    acc.add(a.rank == 0 ? p : w);
    a.output[i] = acc.finish(2);
  }
  __syncthreads();
  if (threadIdx.x == 0) a.flags[blockIdx.x] = f64;
}

__global__ void empty(MinimalArgs) {}

// One round of the library's all-reduce with the library's arguments, counter and scratch layout,
// compact: COUNTERS = 0 uses the shared counter (block 0 waits for the others' start count and
// advances it); COUNTERS = 1 a counter per block at flag + 64 + 8 b (no block waits for another;
// no faster in run35, where it ran on a state and scratch quarter of its own; not launched now).
// TAIL: the general kernel follows for what one round cannot serve (never taken here), to see
// whether its code alone costs time.
template <int COUNTERS, bool TAIL>
__global__ void oneRound(mscclpp::LlCollectiveArgs a) {
  using namespace mscclpp;
  LlState* st = (LlState*)a.flag;
  uint64_t* myCounter = COUNTERS ? (uint64_t*)(a.flag + 64) + blockIdx.x : &st->counter;
  const uint64_t base = *myCounter;
  const uint64_t bytes = a.count * 2;
  if (TAIL && (a.kind != 0 || bytes > a.slot_bytes / 2 || bytes == 0)) {
    llEntry<true, kDataTypeBF16, kReduceSum>(a);
    return;
  }
  const uint32_t flag = (uint32_t)(base + 1);
  const uint64_t half = ((base + 1) & 1) * kCollectiveMaxRanks * a.slot_bytes;
  const uint32_t npackets = (uint32_t)((bytes + 7) / 8);
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = gridDim.x * blockDim.x;
  const char* in = (const char*)a.input;
  for (uint32_t i = tid; i < npackets; i += nthreads) {
    const uint32_t n = bytes - 8 * i < 8 ? (uint32_t)(bytes - 8 * i) : 8;
    const uint64_t w = loadWord(in + 8 * (uint64_t)i, n);
    const uint64_t off = half + a.rank * a.slot_bytes + 16 * (uint64_t)i;
#pragma unroll 1
    for (uint32_t q = 0; q + 1 < a.nranks; ++q) {
      uint32_t p = a.rank + 1 + q;
      if (p >= a.nranks) p -= a.nranks;
      ((LL16Packet*)(a.peer_scratch[p] + off))->write(w, flag);
    }
  }
  if (!COUNTERS) countStarts(st, 0);
  for (uint32_t i = tid; i < npackets; i += nthreads) {
    const uint32_t n = bytes - 8 * i < 8 ? (uint32_t)(bytes - 8 * i) : 8;
    const uint64_t own = loadWord(in + 8 * (uint64_t)i, n);
    const char* slot0 = (const char*)(a.scratch + half + 16 * (uint64_t)i);
    Reducer<kDataTypeBF16, kReduceSum> acc;
    acc.load(a.rank == 0 ? own : ((const LL16Packet*)slot0)->read(flag));
#pragma unroll 1
    for (uint32_t p = 1; p < a.nranks; ++p) {
      acc.add(p == a.rank ? own : ((const LL16Packet*)(slot0 + p * a.slot_bytes))->read(flag));
    }
    storeWord((char*)a.output + 8 * (uint64_t)i, acc.finish(a.nranks), n);
  }
  if (COUNTERS || blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) *myCounter = base + 1;
  }
}
// The steps from oneRound<0, false> (F = 0) towards minimal, one feature bit each:
//   1  the peer's scratch address picked by selects over the eight argument words (no indexed
//      load from the parameter bank);
//   2  the own input word kept in a register from the send to the reduction (loaded once);
//   4  two ranks only: one peer, no loops over ranks;
//   8  one packet per thread (an if, not a loop).
template <int F>
MSCCLPP_DEVICE_INLINE mscclpp::uint64_t peerScratch(const mscclpp::LlCollectiveArgs& a, mscclpp::uint32_t p) {
  if (!(F & 1)) return a.peer_scratch[p];
  mscclpp::uint64_t v = a.peer_scratch[0];
#pragma unroll
  for (mscclpp::uint32_t j = 1; j < mscclpp::kCollectiveMaxRanks; ++j) v = p == j ? a.peer_scratch[j] : v;
  return v;
}

template <int F>
__global__ void ladder(mscclpp::LlCollectiveArgs a) {
  using namespace mscclpp;
  LlState* st = (LlState*)a.flag;
  const uint64_t base = st->counter;
  const uint64_t bytes = a.count * 2;
  const uint32_t flag = (uint32_t)(base + 1);
  const uint64_t half = ((base + 1) & 1) * kCollectiveMaxRanks * a.slot_bytes;
  const uint32_t npackets = (uint32_t)((bytes + 7) / 8);
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t nthreads = (F & 8) ? 0xffffffffu : gridDim.x * blockDim.x;
  const char* in = (const char*)a.input;
  uint64_t keep = 0;
  for (uint32_t i = tid; i < npackets; i += nthreads) {
    const uint32_t n = bytes - 8 * i < 8 ? (uint32_t)(bytes - 8 * i) : 8;
    const uint64_t w = loadWord(in + 8 * (uint64_t)i, n);
    keep = w;
    const uint64_t off = half + a.rank * a.slot_bytes + 16 * (uint64_t)i;
    if (F & 4) {
      ((LL16Packet*)(peerScratch<F>(a, a.rank ^ 1) + off))->write(w, flag);
    } else {
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < a.nranks; ++q) {
        uint32_t p = a.rank + 1 + q;
        if (p >= a.nranks) p -= a.nranks;
        ((LL16Packet*)(peerScratch<F>(a, p) + off))->write(w, flag);
      }
    }
    if (F & 8) break;
  }
  countStarts(st, 0);
  for (uint32_t i = tid; i < npackets; i += nthreads) {
    const uint32_t n = bytes - 8 * i < 8 ? (uint32_t)(bytes - 8 * i) : 8;
    const uint64_t own = (F & 2) ? keep : loadWord(in + 8 * (uint64_t)i, n);
    const char* slot0 = (const char*)(a.scratch + half + 16 * (uint64_t)i);
    Reducer<kDataTypeBF16, kReduceSum> acc;
    if (F & 4) {
      const uint64_t pk = ((const LL16Packet*)(slot0 + (a.rank ^ 1) * a.slot_bytes))->read(flag);
      acc.load(a.rank == 0 ? own : pk);
      acc.add(a.rank == 0 ? pk : own);
    } else {
      acc.load(a.rank == 0 ? own : ((const LL16Packet*)slot0)->read(flag));
#pragma unroll 1
      for (uint32_t p = 1; p < a.nranks; ++p) {
        acc.add(p == a.rank ? own : ((const LL16Packet*)(slot0 + p * a.slot_bytes))->read(flag));
      }
    }
    storeWord((char*)a.output + 8 * (uint64_t)i, acc.finish(a.nranks), n);
    if (F & 8) break;
  }
  if (blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) st->counter = base + 1;
  }
}
// The library's short all-reduce (two ranks), with changes, one bit each:
//   1  the input word is loaded first, before anything waits for the counter, so that the two
//      loads overlap;
//   2  the peer's scratch address by a select of two argument words (no indexed load);
//   4  no argument checks;
//   8  the counter read by a relaxed atomic load (asm volatile: issued where written);
//   16 the argument checks after the send.
template <int F>
__global__ void shortVar(mscclpp::LlCollectiveArgs a) {
  using namespace mscclpp;
  LlState* st = (LlState*)a.flag;
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const uint64_t bytes = a.count * 2;
  const bool mine = i < (bytes + 7) / 8;
  const uint32_t n = mine ? packetBytes((uint32_t)bytes, i) : 0;
  uint64_t own = 0;
  if ((F & 1) && mine) own = loadWord((const char*)a.input + 8 * (uint64_t)i, n);
  const uint64_t base = (F & 8) ? loadRelaxedDevice(&st->counter) : st->counter;
  if (!(F & 4) && !(F & 16) && (a.kind != 0 || a.nranks != 2 || a.rank >= a.nranks || bytes == 0 ||
                   bytes > a.slot_bytes / 8 * 8 / 2 || (uint64_t)gridDim.x * blockDim.x * 8 < bytes)) {
    deviceTrap();
  }
  const uint32_t flag = (uint32_t)(base + 1);
  const uint64_t half = ((base + 1) & 1) * kCollectiveMaxRanks * a.slot_bytes;
  if (mine) {
    if (!(F & 1)) own = loadWord((const char*)a.input + 8 * (uint64_t)i, n);
    const uint64_t off = half + a.rank * a.slot_bytes + 16 * (uint64_t)i;
    const uint64_t peerBase = (F & 2) ? (a.rank ? a.peer_scratch[0] : a.peer_scratch[1]) : a.peer_scratch[a.rank ^ 1];
    ((LL16Packet*)(peerBase + off))->write(own, flag);
  }
  if ((F & 16) && (a.kind != 0 || a.nranks != 2 || a.rank >= a.nranks || bytes == 0 ||
                   bytes > a.slot_bytes / 8 * 8 / 2 || (uint64_t)gridDim.x * blockDim.x * 8 < bytes)) {
    deviceTrap();
  }
  countStarts(st, 0);
  if (mine) {
    const char* slot0 = (const char*)(a.scratch + half + 16 * (uint64_t)i);
    Reducer<kDataTypeBF16, kReduceSum> acc;
    const uint64_t peer = ((const LL16Packet*)(slot0 + (a.rank ^ 1) * a.slot_bytes))->read(flag);
    acc.load(a.rank == 0 ? own : peer);
    acc.add(a.rank == 0 ? peer : own);
    storeWord((char*)a.output + 8 * (uint64_t)i, acc.finish(2), n);
  }
  if (blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) st->counter = base + 1;
  }
}

}  // namespace probe

static float bf16f(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

int main(int argc, char** argv) {
  int G = 20, iters = 50, warm = 10, ppb = 512;
  if (argc > 1) ppb = atoi(argv[1]);
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  const int dev[2] = {0, ndev > 1 ? 1 : 0};
  printf("devices %d, ranks on %d and %d, packets per block %d\n", ndev, dev[0], dev[1], ppb);
  const uint64_t slot = 2ull << 20, half = 8 * slot, scratchBytes = 4 * half, maxBytes = 2ull << 20;
  char* scratch[2];
  char* in[2];
  char* out[2];
  char* state[2];   // LlState (64 B) then 256 per-block counters (minimal)
  cudaStream_t st[2];
  for (int r = 0; r < 2; ++r) {
    CK(cudaSetDevice(dev[r]));
    if (dev[0] != dev[1]) {
      cudaError_t e = cudaDeviceEnablePeerAccess(dev[1 - r], 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) CK(e);
    }
    CK(cudaMalloc(&scratch[r], scratchBytes));
    CK(cudaMemset(scratch[r], 0, scratchBytes));
    CK(cudaMalloc(&in[r], maxBytes));
    CK(cudaMalloc(&out[r], maxBytes));
    CK(cudaMalloc(&state[r], 64 + 256 * 8));
    CK(cudaMemset(state[r], 0, 64 + 256 * 8));
    CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    std::vector<uint16_t> h(maxBytes / 2);
    for (size_t i = 0; i < h.size(); ++i) {
      float v = (float)((i * 7 + r * 3) % 64);
      uint32_t u;
      memcpy(&u, &v, 4);
      h[i] = (uint16_t)(u >> 16);
    }
    CK(cudaMemcpy(in[r], h.data(), maxBytes, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, dev[0]));
  const uint64_t sizes[] = {1024, 4096, 16384, 65536, 131072};
  const char* names[] = {"empty", "ours", "minimal", "min-early", "short", "s1", "s2", "s3", "s4", "s5", "s9", "s17", "s25", "one", "one+tail", "lad2", "lad8", "lad14"};
  const int nvariants = 18;
  printf("%-8s %8s %6s %7s %10s %10s %6s\n", "variant", "bytes", "blocks", "threads", "us(gpu0)", "us(gpu1)", "wrong");
  for (uint64_t bytes : sizes) {
    const uint64_t packets = bytes / 8;
    uint64_t blocks = (packets + ppb - 1) / ppb;
    if (blocks < 1) blocks = 1;
    if (blocks > (uint64_t)prop.multiProcessorCount) blocks = prop.multiProcessorCount;
    uint64_t threads = (packets + blocks - 1) / blocks;
    threads = (threads + 31) / 32 * 32;
    if (threads > 1024) threads = 1024;
    for (int v = 0; v < nvariants; ++v) {
      cudaGraphExec_t exec[2];
      for (int r = 0; r < 2; ++r) {
        CK(cudaSetDevice(dev[r]));
        CK(cudaMemsetAsync(out[r], 0xA5, bytes, st[r]));
        mscclpp::LlCollectiveArgs la;
        memset(&la, 0, sizeof la);
        la.input = (uint64_t)in[r];
        la.output = (uint64_t)out[r];
        la.count = bytes / 2;
        la.flag = (uint64_t)state[r];
        la.scratch = (uint64_t)scratch[r];
        la.slot_bytes = slot;
        la.peer_scratch[0] = (uint64_t)scratch[0];
        la.peer_scratch[1] = (uint64_t)scratch[1];
        la.kind = 0;
        la.dtype = mscclpp::kDataTypeBF16;
        la.op = mscclpp::kReduceSum;
        la.rank = r;
        la.nranks = 2;
        probe::MinimalArgs ma;
        ma.input = (const mscclpp::uint64_t*)in[r];
        ma.output = (mscclpp::uint64_t*)out[r];
        ma.scratch = scratch[r] + 2 * half;  // apart from the LL halves: flags of the two variants differ
        ma.peerScratch = scratch[1 - r] + 2 * half;
        ma.flags = (mscclpp::uint64_t*)(state[r] + 64);
        ma.halfBytes = half;
        ma.npackets = packets;
        ma.rank = r;
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(st[r], cudaStreamCaptureModeThreadLocal));
        for (int k = 0; k < G; ++k) {
          if (v == 0) probe::empty<<<blocks, threads, 0, st[r]>>>(ma);
          if (v == 1) mscclpp_collective_ll_reduce_bf16_sum<<<blocks, threads, 0, st[r]>>>(la);
          if (v == 2) probe::minimal<false><<<blocks, threads, 0, st[r]>>>(ma);
          if (v == 3) probe::minimal<true><<<blocks, threads, 0, st[r]>>>(ma);
          if (v == 4) mscclpp_collective_ll_short_allreduce_bf16_sum<<<blocks, threads, 0, st[r]>>>(la);
          if (v == 5) probe::shortVar<1><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 6) probe::shortVar<2><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 7) probe::shortVar<3><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 8) probe::shortVar<4><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 9) probe::shortVar<5><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 10) probe::shortVar<9><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 11) probe::shortVar<17><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 12) probe::shortVar<25><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 13) probe::oneRound<0, false><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 14) probe::oneRound<0, true><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 15) probe::ladder<2><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 16) probe::ladder<8><<<blocks, threads, 0, st[r]>>>(la);
          if (v == 17) probe::ladder<14><<<blocks, threads, 0, st[r]>>>(la);
        }
        CK(cudaStreamEndCapture(st[r], &g));
        CK(cudaGraphInstantiate(&exec[r], g, 0));
        CK(cudaGraphDestroy(g));
      }
      cudaEvent_t e0[2], e1[2];
      for (int r = 0; r < 2; ++r) {
        CK(cudaSetDevice(dev[r]));
        CK(cudaEventCreate(&e0[r]));
        CK(cudaEventCreate(&e1[r]));
      }
      for (int k = 0; k < warm; ++k)
        for (int r = 0; r < 2; ++r) CK(cudaGraphLaunch(exec[r], st[r]));
      for (int r = 0; r < 2; ++r) CK(cudaStreamSynchronize(st[r]));
      for (int r = 0; r < 2; ++r) CK(cudaEventRecord(e0[r], st[r]));
      for (int k = 0; k < iters; ++k)
        for (int r = 0; r < 2; ++r) CK(cudaGraphLaunch(exec[r], st[r]));
      for (int r = 0; r < 2; ++r) CK(cudaEventRecord(e1[r], st[r]));
      float ms[2];
      long wrong = 0;
      for (int r = 0; r < 2; ++r) {
        CK(cudaStreamSynchronize(st[r]));
        CK(cudaEventElapsedTime(&ms[r], e0[r], e1[r]));
        if (v != 0) {
          std::vector<uint16_t> h(bytes / 2);
          CK(cudaMemcpy(h.data(), out[r], bytes, cudaMemcpyDeviceToHost));
          for (size_t i = 0; i < h.size(); ++i) {
            const float want = (float)((i * 7) % 64) + (float)((i * 7 + 3) % 64);
            if (bf16f(h[i]) != want) ++wrong;
          }
        }
        CK(cudaGraphExecDestroy(exec[r]));
      }
      printf("%-8s %8llu %6llu %7llu %10.2f %10.2f %6ld\n", names[v], (unsigned long long)bytes,
             (unsigned long long)blocks, (unsigned long long)threads, ms[0] * 1e3 / (iters * G),
             ms[1] * 1e3 / (iters * G), wrong);
    }
  }
  return 0;
}
