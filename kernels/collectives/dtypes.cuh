// The element types a collectives module instantiates, chosen by MSCCLPP_COLLECTIVE_WIDE, which
// the module's .cu file defines before including its body (collectives/ll.cuh, direct.cuh):
//   0  the base types f32, f16, bf16, i32, u32 (collectives/ll.cu, direct.cu): the code exactly as
//      it was before the wide types existed (elements of 2 bytes or more: 2-byte-granular partial
//      words), so that their kernels keep their registers and launch bounds;
//   1  the wide types f64, i64, u64, i8, u8, float8 e4m3, e5m2 (collectives/ll_wide.cu,
//      direct_wide.cu): byte-granular partial words; the base types are refused.
// The host (collectives/src/algorithms) launches a call's kernel from the module of its type.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/numeric.cuh"
#include "mscclpp/word.cuh"

#if !defined(MSCCLPP_COLLECTIVE_WIDE)
#error "define MSCCLPP_COLLECTIVE_WIDE (0: the base types, 1: the wide ones) before including a collectives body"
#endif

namespace mscclpp {

// Bytes per element of a DataType code this module serves, 0 for any other (the kernels trap).
MSCCLPP_DEVICE_INLINE uint32_t collDataTypeSize(uint32_t dtype) {
#if MSCCLPP_COLLECTIVE_WIDE
  return dtype >= kDataTypeF64 ? dataTypeSize(dtype) : 0u;
#else
  return dtype == kDataTypeF16 || dtype == kDataTypeBF16 ? 2u : dtype <= kDataTypeU32 ? 4u : 0u;
#endif
}

// A partial or unaligned word of this module's elements (word.cuh).
MSCCLPP_DEVICE_INLINE uint64_t collLoadWord(const char* p, uint32_t n) {
#if MSCCLPP_COLLECTIVE_WIDE
  return loadWordBytes(p, n);
#else
  return loadWord(p, n);
#endif
}
MSCCLPP_DEVICE_INLINE void collStoreWord(char* p, uint64_t w, uint32_t n) {
#if MSCCLPP_COLLECTIVE_WIDE
  storeWordBytes(p, w, n);
#else
  storeWord(p, w, n);
#endif
}

}  // namespace mscclpp
