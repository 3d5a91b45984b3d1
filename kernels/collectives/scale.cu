// Scales an array by a factor of its own element type, in place or from a source array: the
// first half of ncclRedOpCreatePreMulSum, which the library serves as each rank's input scaled by
// that rank's own factor, then a sum. The factor is read when the kernel runs when it lives in
// device memory, so that a graph replay sees its current value.
// Vendor-neutral: the same text is compiled by NVRTC and by hipRTC (the module of
// collectives/src/scale.rs, with the host kernel beside it).
#include "mscclpp/core.cuh"
#include "mscclpp/numeric.cuh"
#include "collectives/args.cuh"
#include "collectives/args_check.h"

namespace mscclpp {

// The factor's bits, zero-extended: from device memory when `a.scalar` names it, else the value
// the host copied into the arguments.
MSCCLPP_DEVICE_INLINE uint64_t scaleFactor(const ScaleArgs& a, uint32_t size) {
  if (a.scalar == 0) return a.imm;
  switch (size) {
    case 1: return *(const volatile uint8_t*)a.scalar;
    case 2: return *(const volatile uint16_t*)a.scalar;
    case 4: return *(const volatile uint32_t*)a.scalar;
    default: return *(const volatile uint64_t*)a.scalar;
  }
}

// 16- and 8-bit floats are widened to f32, multiplied and rounded back once (round to nearest
// even; FP8 saturates), as the host kernel does.
template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void scaleLoop(const ScaleArgs& a, uint64_t f) {
  const uint64_t stride = (uint64_t)gridDim.x * blockDim.x;
  const uint64_t first = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  // Out of place when `src` is set (PreMulSum scales each rank's input before the sum).
  const uint64_t src = a.src != 0 ? a.src : a.data;
  for (uint64_t i = first; i < a.count; i += stride) {
    if (DTYPE == kDataTypeF32) {
      float* p = (float*)a.data + i;
      *p = ((const float*)src)[i] * bitsFloat((uint32_t)f);
    } else if (DTYPE == kDataTypeF64) {
      double* p = (double*)a.data + i;
      *p = ((const double*)src)[i] * bitsDouble(f);
    } else if (DTYPE == kDataTypeF16) {
      uint16_t* p = (uint16_t*)a.data + i;
      *p = (uint16_t)floatToHalf(halfToFloat(((const uint16_t*)src)[i]) * halfToFloat((uint32_t)f));
    } else if (DTYPE == kDataTypeBF16) {
      uint16_t* p = (uint16_t*)a.data + i;
      *p = (uint16_t)floatToBf16(bf16ToFloat(((const uint16_t*)src)[i]) * bf16ToFloat((uint32_t)f));
    } else if (DTYPE == kDataTypeF8E4M3 || DTYPE == kDataTypeF8E5M2) {
      constexpr bool E4M3 = DTYPE == kDataTypeF8E4M3;
      uint8_t* p = (uint8_t*)a.data + i;
      *p = (uint8_t)floatToFp8<E4M3>(fp8ToFloat<E4M3>(((const uint8_t*)src)[i]) *
                                     fp8ToFloat<E4M3>((uint32_t)f));
    } else if (DTYPE == kDataTypeI32 || DTYPE == kDataTypeU32) {
      uint32_t* p = (uint32_t*)a.data + i;
      *p = ((const uint32_t*)src)[i] * (uint32_t)f;
    } else if (DTYPE == kDataTypeI64 || DTYPE == kDataTypeU64) {
      uint64_t* p = (uint64_t*)a.data + i;
      *p = ((const uint64_t*)src)[i] * f;
    } else {
      uint8_t* p = (uint8_t*)a.data + i;
      *p = (uint8_t)((uint32_t)((const uint8_t*)src)[i] * (uint32_t)f);
    }
  }
}

// The host checked the type; an unknown one scales nothing.
MSCCLPP_DEVICE_INLINE void scaleEntry(const ScaleArgs& a) {
  const uint64_t f = scaleFactor(a, dataTypeSize(a.dtype));
  switch (a.dtype) {
    case kDataTypeF32: scaleLoop<kDataTypeF32>(a, f); break;
    case kDataTypeF16: scaleLoop<kDataTypeF16>(a, f); break;
    case kDataTypeBF16: scaleLoop<kDataTypeBF16>(a, f); break;
    case kDataTypeI32: scaleLoop<kDataTypeI32>(a, f); break;
    case kDataTypeU32: scaleLoop<kDataTypeU32>(a, f); break;
    case kDataTypeF64: scaleLoop<kDataTypeF64>(a, f); break;
    case kDataTypeI64: scaleLoop<kDataTypeI64>(a, f); break;
    case kDataTypeU64: scaleLoop<kDataTypeU64>(a, f); break;
    case kDataTypeI8: scaleLoop<kDataTypeI8>(a, f); break;
    case kDataTypeU8: scaleLoop<kDataTypeU8>(a, f); break;
    case kDataTypeF8E4M3: scaleLoop<kDataTypeF8E4M3>(a, f); break;
    case kDataTypeF8E5M2: scaleLoop<kDataTypeF8E5M2>(a, f); break;
    default: break;
  }
}

}  // namespace mscclpp

extern "C" __global__ void mscclpp_collective_scale(mscclpp::ScaleArgs a) { mscclpp::scaleEntry(a); }
