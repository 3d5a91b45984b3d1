// The inter-host exchange of the hierarchical collectives (collectives/src/algorithms/hier/spec.md
// is the specification: the argument struct, the slot halves, the rounds and the acknowledgements). One
// block: thread 0 posts the port-channel triggers and waits on the semaphores, every thread
// copies and reduces. Vendor-neutral: the same text is compiled by NVRTC and by hipRTC (the
// module of collectives/src/algorithms/hier/mod.rs, with the host kernel beside it). Waits give
// up on the communicator's abort word (HierArgs::abort; mscclpp/core.cuh).
#define MSCCLPP_DEVICE_ABORT 1
#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/numeric.cuh"
#include "mscclpp/port_channel.cuh"
#include "mscclpp/word.cuh"

namespace mscclpp {

constexpr uint32_t kHierMaxHosts = 64;

// HierArgs of collectives/src/algorithms/hier/args.rs.
struct HierArgs {
  uint64_t chans;
  uint64_t send;
  uint64_t recv;
  uint64_t slotBytes;
  uint64_t bytes;
  uint32_t rank;
  uint32_t nranks;
  uint32_t reduce;
  uint32_t dtype;
  uint32_t op;
  uint32_t pad;
  uint64_t abort;
  uint64_t counter;
  uint64_t src[kHierMaxHosts];
  uint64_t dst[kHierMaxHosts];
};
#ifndef MSCCLPP_LAYOUT_OFFSETOF
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif
#endif
static_assert(sizeof(HierArgs) == 1104, "HierArgs size (hier/args.rs)");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(HierArgs, rank) == 40, "HierArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(HierArgs, abort) == 64, "HierArgs::abort");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(HierArgs, counter) == 72, "HierArgs::counter");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(HierArgs, src) == 80, "HierArgs::src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(HierArgs, dst) == 592, "HierArgs::dst");

// Copies `len` bytes, 8 at a time per thread (any alignment).
MSCCLPP_DEVICE_INLINE void hierCopy(uint64_t dst, uint64_t src, uint64_t len) {
  if (dst == src) return;
  for (uint64_t at = (uint64_t)threadIdx.x * 8; at < len; at += (uint64_t)blockDim.x * 8) {
    const uint32_t nb = len - at < 8 ? (uint32_t)(len - at) : 8u;
    storeWordBytes((char*)(dst + at), loadWordBytes((const char*)(src + at), nb), nb);
  }
}

// dst = the reduction in rail order of this rank's source and the receive slots (half `h`).
template <uint32_t DTYPE, uint32_t OP>
__device__ __noinline__ void hierReduce(const HierArgs& a, uint64_t off, uint64_t len, uint64_t h) {
  const uint64_t out = a.dst[0] + off;
  for (uint64_t at = (uint64_t)threadIdx.x * 8; at < len; at += (uint64_t)blockDim.x * 8) {
    const uint32_t nb = len - at < 8 ? (uint32_t)(len - at) : 8u;
    Reducer<DTYPE, OP> r;
    for (uint32_t p = 0; p < a.nranks; ++p) {
      const uint64_t base = p == a.rank ? a.src[p] + off : a.recv + (uint64_t)p * a.slotBytes + h;
      const uint64_t w = loadWordBytes((const char*)(base + at), nb);
      if (p == 0) {
        r.load(w);
      } else {
        r.add(w);
      }
    }
    storeWordBytes((char*)(out + at), r.finish(a.nranks), nb);
  }
}

template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void hierReduceOp(const HierArgs& a, uint64_t off, uint64_t len, uint64_t h) {
  switch (a.op) {
    case kReduceSum: hierReduce<DTYPE, kReduceSum>(a, off, len, h); break;
    case kReduceProd: hierReduce<DTYPE, kReduceProd>(a, off, len, h); break;
    case kReduceMin: hierReduce<DTYPE, kReduceMin>(a, off, len, h); break;
    case kReduceMax: hierReduce<DTYPE, kReduceMax>(a, off, len, h); break;
    case kReduceAvg: hierReduce<DTYPE, kReduceAvg>(a, off, len, h); break;
    default: break;
  }
}

// The host checked the type and operator; an unknown one reduces nothing.
MSCCLPP_DEVICE_INLINE void hierReduceAll(const HierArgs& a, uint64_t off, uint64_t len, uint64_t h) {
  switch (a.dtype) {
    case kDataTypeF32: hierReduceOp<kDataTypeF32>(a, off, len, h); break;
    case kDataTypeF16: hierReduceOp<kDataTypeF16>(a, off, len, h); break;
    case kDataTypeBF16: hierReduceOp<kDataTypeBF16>(a, off, len, h); break;
    case kDataTypeI32: hierReduceOp<kDataTypeI32>(a, off, len, h); break;
    case kDataTypeU32: hierReduceOp<kDataTypeU32>(a, off, len, h); break;
    case kDataTypeF64: hierReduceOp<kDataTypeF64>(a, off, len, h); break;
    case kDataTypeI64: hierReduceOp<kDataTypeI64>(a, off, len, h); break;
    case kDataTypeU64: hierReduceOp<kDataTypeU64>(a, off, len, h); break;
    case kDataTypeI8: hierReduceOp<kDataTypeI8>(a, off, len, h); break;
    case kDataTypeU8: hierReduceOp<kDataTypeU8>(a, off, len, h); break;
    case kDataTypeF8E4M3: hierReduceOp<kDataTypeF8E4M3>(a, off, len, h); break;
    case kDataTypeF8E5M2: hierReduceOp<kDataTypeF8E5M2>(a, off, len, h); break;
    default: break;
  }
}

// Rounds are numbered across calls by the counter in device memory (read at the start, advanced
// at the end by thread 0): round k uses half k % 2 of every slot, and its waits consume the
// peer's acknowledgement of round k - 1 and then its data of round k.
MSCCLPP_DEVICE_INLINE void hierEntry(const HierArgs& a) {
  const PortChannelDeviceHandle* chans = (const PortChannelDeviceHandle*)a.chans;
  const uint32_t me = a.rank;
  const uint64_t half = a.slotBytes / 2;
  const uint64_t first = *(volatile const uint64_t*)a.counter;
  uint64_t k = first;
  for (uint64_t off = 0; off < a.bytes; off += half, ++k) {
    const uint64_t len = a.bytes - off < half ? a.bytes - off : half;
    const uint64_t h = (k % 2) * half;
    for (uint32_t p = 0; p < a.nranks; ++p) {
      if (p != me && a.src[p] != 0) hierCopy(a.send + (uint64_t)p * a.slotBytes + h, a.src[p] + off, len);
    }
    // The proxy reads the send slots once the trigger is visible.
    fenceSystem();
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t p = 0; p < a.nranks; ++p) {
        if (p == me) continue;
        PortChannelDeviceHandle c = chans[p];
        if (a.src[p] != 0) {
          c.putWithSignal((uint64_t)me * a.slotBytes + h, (uint64_t)p * a.slotBytes + h, len);
        } else {
          c.signal();
        }
      }
      for (uint32_t p = 0; p < a.nranks; ++p) {
        if (p == me) continue;
        PortChannelDeviceHandle c = chans[p];
        if (k > 0) c.wait();
        c.wait();
      }
    }
    __syncthreads();
    if (a.reduce) {
      hierReduceAll(a, off, len, h);
    } else {
      for (uint32_t p = 0; p < a.nranks; ++p) {
        if (p != me && a.dst[p] != 0) hierCopy(a.dst[p] + off, a.recv + (uint64_t)p * a.slotBytes + h, len);
      }
      if (a.src[me] != 0 && a.dst[me] != 0) hierCopy(a.dst[me] + off, a.src[me] + off, len);
    }
    // Every thread has read the peers' half before they may write it again two rounds on.
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t p = 0; p < a.nranks; ++p) {
        if (p == me) continue;
        PortChannelDeviceHandle c = chans[p];
        c.signal();
      }
    }
  }
  if (threadIdx.x == 0) *(volatile uint64_t*)a.counter = k;
}

}  // namespace mscclpp

extern "C" __global__ void mscclpp_hier_xchg(mscclpp::HierArgs a) {
  mscclpp::abortWordInit(a.abort);
  mscclpp::hierEntry(a);
}
