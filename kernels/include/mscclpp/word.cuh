// Partial and unaligned 8-byte words, shared by the collective kernels: a piece's last packet or
// step unit carries fewer than 8 bytes, and user buffers may be aligned only to the element
// size. Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

// The slow paths of loadWord and storeWord (a piece's last packet, or a buffer not 8-byte
// aligned): out of line, so that the many inlined copies of the fast path stay small. `p` and `n`
// are even (elements of 2 bytes or more); loadWordSlowBytes and storeWordSlowBytes below take
// any. Kept apart so that the 16- and 32-bit collectives' code stays what it was before 8-bit
// types existed (a byte loop in these functions changes every kernel that calls them).
__device__ __noinline__ uint64_t loadWordSlow(const char* p, uint32_t n) {
  uint64_t w = 0;
  if ((((uint64_t)p | n) & 3) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 4) w |= (uint64_t)(*(const uint32_t*)(p + b)) << (8 * b);
  } else {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 2) w |= (uint64_t)(*(const uint16_t*)(p + b)) << (8 * b);
  }
  return w;
}
__device__ __noinline__ void storeWordSlow(char* p, uint64_t w, uint32_t n) {
  if ((((uint64_t)p | n) & 3) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 4) *(uint32_t*)(p + b) = (uint32_t)(w >> (8 * b));
  } else {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 2) *(uint16_t*)(p + b) = (uint16_t)(w >> (8 * b));
  }
}

// The `n` (2..8, a multiple of the element size, which is 2 bytes or more) bytes at `p` as the
// low bytes of a word, zero-padded; `p` is aligned to the element size at least.
MSCCLPP_DEVICE_INLINE uint64_t loadWord(const char* p, uint32_t n) {
  if (n == 8 && ((uint64_t)p & 7) == 0) return *(const uint64_t*)p;
  return loadWordSlow(p, n);
}

// Stores the low `n` bytes of `w` at `p` (as for loadWord).
MSCCLPP_DEVICE_INLINE void storeWord(char* p, uint64_t w, uint32_t n) {
  if (n == 8 && ((uint64_t)p & 7) == 0) {
    *(uint64_t*)p = w;
  } else {
    storeWordSlow(p, w, n);
  }
}

// The same for any `n` (1..8) and any `p`: 8-bit element types and byte streams.
__device__ __noinline__ uint64_t loadWordSlowBytes(const char* p, uint32_t n) {
  uint64_t w = 0;
  if ((((uint64_t)p | n) & 3) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 4) w |= (uint64_t)(*(const uint32_t*)(p + b)) << (8 * b);
  } else if ((((uint64_t)p | n) & 1) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 2) w |= (uint64_t)(*(const uint16_t*)(p + b)) << (8 * b);
  } else {
#pragma unroll 1
    for (uint32_t b = 0; b < n; ++b) w |= (uint64_t)(*(const uint8_t*)(p + b)) << (8 * b);
  }
  return w;
}
__device__ __noinline__ void storeWordSlowBytes(char* p, uint64_t w, uint32_t n) {
  if ((((uint64_t)p | n) & 3) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 4) *(uint32_t*)(p + b) = (uint32_t)(w >> (8 * b));
  } else if ((((uint64_t)p | n) & 1) == 0) {
#pragma unroll 1
    for (uint32_t b = 0; b < n; b += 2) *(uint16_t*)(p + b) = (uint16_t)(w >> (8 * b));
  } else {
#pragma unroll 1
    for (uint32_t b = 0; b < n; ++b) *(uint8_t*)(p + b) = (uint8_t)(w >> (8 * b));
  }
}
MSCCLPP_DEVICE_INLINE uint64_t loadWordBytes(const char* p, uint32_t n) {
  if (n == 8 && ((uint64_t)p & 7) == 0) return *(const uint64_t*)p;
  return loadWordSlowBytes(p, n);
}
MSCCLPP_DEVICE_INLINE void storeWordBytes(char* p, uint64_t w, uint32_t n) {
  if (n == 8 && ((uint64_t)p & 7) == 0) {
    *(uint64_t*)p = w;
  } else {
    storeWordSlowBytes(p, w, n);
  }
}

}  // namespace mscclpp
