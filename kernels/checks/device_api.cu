// Compile-only coverage of the device API: one kernel per header that calls every function, so
// that each compile for each architecture generates (and the assembler checks) every inline-asm
// and template path. Never launched; compiled by the backends' compile tests.
#include "mscclpp/mscclpp.cuh"
#include "mscclpp/layout_check.h"

// Inside the namespace rather than `using namespace mscclpp`: on HIP, <hip/hip_runtime.h> brings
// a global uint64_t too, and unqualified uses would be ambiguous.
namespace mscclpp {

extern "C" __global__ void check_core(uint64_t* p64, uint32_t* p32, uint64_t* out) {
  uint64_t v = loadAcquireSystem(p64) + loadAcquireDevice(p64) + loadRelaxedSystem(p64) + loadRelaxedDevice(p64);
  storeReleaseSystem(p64 + 1, v);
  storeRelaxedSystem(p64 + 2, v);
  storeRelaxedDevice(p64 + 3, v);
  v += fetchAddRelaxedDevice(p64 + 4, 1) + fetchAddAcqRelSystem(p64 + 5, 1);
  uint32_t w = loadAcquireDevice(p32) + loadRelaxedDevice(p32) + fetchIncWrapAcqRelDevice(p32 + 1, 7);
  storeReleaseDevice(p32 + 2, w);
  fenceSystem();
  fenceDevice();
  uint32_t a, b, c, d;
  loadVolatile16(p64 + 6, a, b, c, d);
  storeVolatile16(p64 + 8, a, b, c, d);
  loadVolatile8(p64 + 10, a, b);
  storeVolatile8(p64 + 11, a, b);
  spinUntil([&] { return loadRelaxedDevice(p64) != 0; }, 10);
  spinUntil([&] { return loadRelaxedDevice(p64) != 0; });
  *out = v + w + kWarpSize;
}

extern "C" __global__ void check_packets(LL16Packet* p16, LL8Packet* p8, uint64_t* data, uint32_t flag) {
  p16[0].write(data[0], flag);
  p16[1].write(1u, 2u, flag);
  uint64_t v16 = 0;
  if (p16[2].readOnce(flag, v16)) data[1] = v16;
  data[2] = p16[3].read(flag);
  data[3] = p16[4].read(flag, 1000);
  p8[0].write((uint32_t)data[4], flag);
  uint32_t v8 = 0;
  if (p8[1].readOnce(flag, v8)) data[5] = v8;
  data[6] = p8[2].read(flag) + p8[3].read(flag, -1);
  putPackets<LL16Packet>(p16 + 8, data, 64, threadIdx.x, blockDim.x, flag);
  unpackPackets<LL16Packet>(data, p16 + 8, 64, threadIdx.x, blockDim.x, flag);
  putPackets<LL8Packet>(p8 + 8, data, 64, threadIdx.x, blockDim.x, flag);
  unpackPackets<LL8Packet>(data, p8 + 8, 64, threadIdx.x, blockDim.x, flag, 1000);
}

extern "C" __global__ void check_semaphores(Host2DeviceSemaphoreDeviceHandle h2d,
                                            MemoryDevice2DeviceSemaphoreDeviceHandle d2d, int* out) {
  h2d.wait();
  h2d.wait(100);
  d2d.signal();
  d2d.relaxedSignal();
  d2d.wait();
  d2d.relaxedWait(100);
  *out = (int)h2d.poll() + (int)d2d.poll() + (int)d2d.incrementOutbound();
}

extern "C" __global__ void check_fifo(FifoDeviceHandle fifo, ProxyTrigger t, uint64_t* out) {
  ProxyTrigger m = ProxyTrigger::make(TriggerData | TriggerFlag, 3, 64, 4, 128, 4096, 5);
  uint64_t pos = fifo.push(t);
  fifo.push(m, 1000);
  fifo.sync(pos);
  fifo.sync(pos, 1000);
  *out = m.size() + m.srcOffset() + m.dstOffset() + m.srcMemory() + m.dstMemory() + m.type() + m.semaphoreId() +
         ProxyTrigger::parityFor(pos, fifo.size);
}

extern "C" __global__ void check_memory_channel(MemoryChannelDeviceHandle ch, BaseMemoryChannelDeviceHandle base,
                                                uint32_t flag, uint64_t* out) {
  const uint32_t tid = blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t n = gridDim.x * blockDim.x;
  ch.put(0, 64, 4096, tid, n);
  ch.put(128, 1000, tid, n);
  ch.get(0, 64, 4096, tid, n);
  ch.get(8, 100, tid, n);
  copy((char*)ch.dst + 3, (const char*)ch.src + 5, 77, tid, n);
  ch.write<uint32_t>(tid, 7u);
  ch.write<Bytes16>(tid, Bytes16{1, 2, 3, 4});
  uint64_t r = ch.read<uint64_t>(tid) + ch.read<Bytes16>(tid).w;
  ch.putPackets(0, 0, 1024, tid, n, flag);
  ch.putPackets<LL8Packet>(0, 0, 1024, tid, n, flag);
  ch.unpackPackets(0, 0, 1024, tid, n, flag);
  ch.unpackPackets<LL8Packet>(0, 0, 1024, tid, n, flag, 1000);
  if (tid == 0) {
    ch.signal();
    ch.relaxedSignal();
    ch.wait();
    ch.relaxedWait(1000);
    r += ch.poll();
    BaseMemoryChannelDeviceHandle b = ch.base();
    b.signal();
    base.signal();
    base.relaxedSignal();
    base.wait();
    base.relaxedWait();
    r += base.poll();
  }
  out[tid] = r;
}

extern "C" __global__ void check_port_channel(PortChannelDeviceHandle ch, uint64_t* out) {
  ch.put(0, 64, 4096);
  ch.put(128, 256);
  ch.signal();
  ch.putWithSignal(0, 64, 4096);
  ch.putWithSignal(0, 4096);
  ch.putWithSignalAndFlush(0, 64, 4096);
  ch.putWithSignalAndFlush(0, 4096);
  ch.flush();
  ch.wait();
  ch.wait(1000);
  *out = ch.poll() + ch.trigger(TriggerSync, 0, 0, 0).snd;
}

extern "C" __global__ void check_switch_channel(SwitchChannelDeviceHandle ch, float* out) {
  const uint64_t off = 16 * (blockIdx.x * blockDim.x + threadIdx.x);
  float a, b, c, d;
  ch.reduceAddF32x4(off, a, b, c, d);
  ch.broadcastF32x4(off, a, b, c, d);
  float s = ch.reduceAddF32(off);
  ch.broadcastF32(off, s);
  s += (float)ch.reduce<int32_t>(off, ReduceOp::Max) + (float)ch.reduce<uint32_t>(off, ReduceOp::Min) +
       ch.reduce<float>(off, ReduceOp::Prod) + (float)ch.reduce<uint64_t>(off, ReduceOp::Sum);
  ch.broadcast<uint64_t>(off, 1);
  out[threadIdx.x] = s + (float)ch.hardware() + a + b + c + d;
}

__device__ DeviceSyncer gSyncer;

extern "C" __global__ void check_device_syncer(DeviceSyncer* syncer, uint32_t* out) {
  gSyncer.sync(gridDim.x);
  syncer->sync(gridDim.x, 1000);
  out[blockIdx.x] = 1;
}

}  // namespace mscclpp
