// The reduction of the copy-engine reduce-scatter (collectives/src/algorithms/ce/reduce.rs, with
// its host kernel): `dst` = the combination, in rank order, of `nsrc` arrays of `bytes` bytes,
// which the copy engines have gathered. A few blocks suffice: the copy engines move the data, the
// SMs stay with the caller's compute. Every element type; vendor-neutral (NVRTC and hipRTC).
#include "mscclpp/core.cuh"
#include "mscclpp/numeric.cuh"
#include "mscclpp/word.cuh"

namespace mscclpp {

// Mirror of `CeReduceArgs` (collectives/src/algorithms/ce/reduce.rs; ce_args_check.h checks it).
struct CeReduceArgs {
  uint64_t dst;
  uint64_t srcs[8];
  uint64_t bytes;
  uint32_t nsrc;
  uint32_t dtype;
  uint32_t op;
  uint32_t _pad;
};

}  // namespace mscclpp

#include "collectives/ce_args_check.h"

namespace mscclpp {

// Word `i` (8 bytes, fewer at the end) of every source, combined in order; byte-wise loads and
// stores, since the arrays need not be 8-byte aligned (a rank block may start anywhere).
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void ceReduce(const CeReduceArgs& a) {
  const uint64_t words = (a.bytes + 7) / 8;
  const uint64_t n = (uint64_t)gridDim.x * blockDim.x;
  for (uint64_t i = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += n) {
    const uint32_t nb = (uint32_t)(a.bytes - 8 * i < 8 ? a.bytes - 8 * i : 8);
    Reducer<DTYPE, OP> r;
    r.load(loadWordBytes(reinterpret_cast<const char*>(a.srcs[0]) + 8 * i, nb));
    for (uint32_t s = 1; s < a.nsrc; ++s) {
      r.add(loadWordBytes(reinterpret_cast<const char*>(a.srcs[s]) + 8 * i, nb));
    }
    storeWordBytes(reinterpret_cast<char*>(a.dst) + 8 * i, r.finish(a.nsrc), nb);
  }
}

template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void ceReduceOp(const CeReduceArgs& a) {
  switch (a.op) {
    case kReduceSum: ceReduce<DTYPE, kReduceSum>(a); break;
    case kReduceProd: ceReduce<DTYPE, kReduceProd>(a); break;
    case kReduceMin: ceReduce<DTYPE, kReduceMin>(a); break;
    case kReduceMax: ceReduce<DTYPE, kReduceMax>(a); break;
    case kReduceAvg: ceReduce<DTYPE, kReduceAvg>(a); break;
    default: mscclpp::deviceTrap();
  }
}

}  // namespace mscclpp

// Launch with any one-dimensional grid; `nsrc` from 1 to 8.
extern "C" __global__ void mscclpp_collective_ce_reduce(mscclpp::CeReduceArgs a) {
  switch (a.dtype) {
    case mscclpp::kDataTypeF32: mscclpp::ceReduceOp<mscclpp::kDataTypeF32>(a); break;
    case mscclpp::kDataTypeF16: mscclpp::ceReduceOp<mscclpp::kDataTypeF16>(a); break;
    case mscclpp::kDataTypeBF16: mscclpp::ceReduceOp<mscclpp::kDataTypeBF16>(a); break;
    case mscclpp::kDataTypeI32: mscclpp::ceReduceOp<mscclpp::kDataTypeI32>(a); break;
    case mscclpp::kDataTypeU32: mscclpp::ceReduceOp<mscclpp::kDataTypeU32>(a); break;
    case mscclpp::kDataTypeF64: mscclpp::ceReduceOp<mscclpp::kDataTypeF64>(a); break;
    case mscclpp::kDataTypeI64: mscclpp::ceReduceOp<mscclpp::kDataTypeI64>(a); break;
    case mscclpp::kDataTypeU64: mscclpp::ceReduceOp<mscclpp::kDataTypeU64>(a); break;
    case mscclpp::kDataTypeI8: mscclpp::ceReduceOp<mscclpp::kDataTypeI8>(a); break;
    case mscclpp::kDataTypeU8: mscclpp::ceReduceOp<mscclpp::kDataTypeU8>(a); break;
    case mscclpp::kDataTypeF8E4M3: mscclpp::ceReduceOp<mscclpp::kDataTypeF8E4M3>(a); break;
    case mscclpp::kDataTypeF8E5M2: mscclpp::ceReduceOp<mscclpp::kDataTypeF8E5M2>(a); break;
    default: mscclpp::deviceTrap();
  }
}
