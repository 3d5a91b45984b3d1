// Element types of collectives without vendor headers: bit-level conversions between f32 and the
// 16-bit float formats (IEEE binary16 "half" and bfloat16), rounding to nearest even, and the
// reduction operators (hal/src/dtype.rs: DataType and ReduceOp codes). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

// DataType codes (hal/src/dtype.rs).
constexpr uint32_t kDataTypeF32 = 0;
constexpr uint32_t kDataTypeF16 = 1;
constexpr uint32_t kDataTypeBF16 = 2;
constexpr uint32_t kDataTypeI32 = 3;
constexpr uint32_t kDataTypeU32 = 4;

// ReduceOp codes (hal/src/dtype.rs).
constexpr uint32_t kReduceSum = 0;
constexpr uint32_t kReduceProd = 1;
constexpr uint32_t kReduceMin = 2;
constexpr uint32_t kReduceMax = 3;
constexpr uint32_t kReduceAvg = 4;

// Bytes per element of a DataType code (0 for an unknown code).
MSCCLPP_HOST_DEVICE_INLINE uint32_t dataTypeSize(uint32_t dtype) {
  return dtype == kDataTypeF16 || dtype == kDataTypeBF16 ? 2u : dtype <= kDataTypeU32 ? 4u : 0u;
}

MSCCLPP_HOST_DEVICE_INLINE uint32_t floatBits(float f) {
  union {
    float f;
    uint32_t u;
  } c;
  c.f = f;
  return c.u;
}
MSCCLPP_HOST_DEVICE_INLINE float bitsFloat(uint32_t u) {
  union {
    float f;
    uint32_t u;
  } c;
  c.u = u;
  return c.f;
}

// ---- bfloat16 -----------------------------------------------------------------------------

MSCCLPP_HOST_DEVICE_INLINE float bf16ToFloat(uint32_t h) { return bitsFloat((h & 0xffffu) << 16); }

// Round to nearest even; NaN stays NaN (quiet), infinities and overflow give infinity.
MSCCLPP_HOST_DEVICE_INLINE uint32_t floatToBf16(float f) {
  const uint32_t x = floatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return (x >> 16) | 0x0040u;
  return (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
}

// ---- IEEE half ----------------------------------------------------------------------------

MSCCLPP_HOST_DEVICE_INLINE float halfToFloat(uint32_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1fu) return bitsFloat(sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0u));
  if (exp != 0) return bitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in f32.
  return bitsFloat(sign | floatBits((float)mant * 5.9604644775390625e-8f));
}

// Round to nearest even; NaN stays NaN (quiet), values from 65520 up give infinity.
MSCCLPP_HOST_DEVICE_INLINE uint32_t floatToHalf(float f) {
  const uint32_t bits = floatBits(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t x = bits & 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7e00u | ((x >> 13) & 0x3ffu);
  if (x >= 0x477ff000u) return sign | 0x7c00u;
  if (x >= 0x38800000u) {
    // Normal: rebias the exponent (127 -> 15), keep 10 mantissa bits, round the 13 dropped
    // ones; a carry moves into the exponent (and up to infinity) as it should.
    const uint32_t t = x - 0x38000000u;
    uint32_t q = t >> 13;
    const uint32_t r = t & 0x1fffu;
    if (r > 0x1000u || (r == 0x1000u && (q & 1u))) ++q;
    return sign | q;
  }
  if (x <= 0x33000000u) return sign;  // at most 2^-25: rounds (ties to even) to zero
  // Subnormal: mant = round(value * 2^24) = round(m >> s), m the 24-bit significand.
  const uint32_t e = x >> 23;
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t s = 126u - e;  // 14..24
  uint32_t q = m >> s;
  const uint32_t r = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  if (r > half || (r == half && (q & 1u))) ++q;
  return sign | q;
}

// ---- reduction of 8-byte words ------------------------------------------------------------
//
// A Reducer<DTYPE, OP> combines the elements packed in 8-byte words (2 x 32-bit or 4 x 16-bit,
// little-endian: the element at the lower address in the low bits): `load` starts an
// accumulator from a word, `add` combines a word into it, `finish` gives the output word
// (Avg divides by `n` there). 16-bit floats accumulate in f32 and round once, in `finish`.

template <uint32_t OP>
MSCCLPP_HOST_DEVICE_INLINE float combineF32(float a, float b) {
  if (OP == kReduceProd) return a * b;
  if (OP == kReduceMin) return fminf(a, b);
  if (OP == kReduceMax) return fmaxf(a, b);
  return a + b;  // Sum, Avg
}

template <uint32_t OP>
MSCCLPP_HOST_DEVICE_INLINE uint32_t combineI32(uint32_t a, uint32_t b) {
  if (OP == kReduceProd) return a * b;  // wraps (two's complement): the low 32 bits agree
  if (OP == kReduceMin) return (int32_t)a < (int32_t)b ? a : b;
  if (OP == kReduceMax) return (int32_t)a > (int32_t)b ? a : b;
  return a + b;
}

template <uint32_t OP>
MSCCLPP_HOST_DEVICE_INLINE uint32_t combineU32(uint32_t a, uint32_t b) {
  if (OP == kReduceProd) return a * b;
  if (OP == kReduceMin) return a < b ? a : b;
  if (OP == kReduceMax) return a > b ? a : b;
  return a + b;
}

template <uint32_t DTYPE, uint32_t OP>
struct Reducer;

template <uint32_t OP>
struct Reducer<kDataTypeF32, OP> {
  float v0, v1;
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) {
    v0 = bitsFloat((uint32_t)w);
    v1 = bitsFloat((uint32_t)(w >> 32));
  }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) {
    v0 = combineF32<OP>(v0, bitsFloat((uint32_t)w));
    v1 = combineF32<OP>(v1, bitsFloat((uint32_t)(w >> 32)));
  }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    float a = v0, b = v1;
    if (OP == kReduceAvg) {
      a = a / (float)n;
      b = b / (float)n;
    }
    return (uint64_t)floatBits(a) | ((uint64_t)floatBits(b) << 32);
  }
};

// f16 (BF16 = false) and bf16 (BF16 = true): four elements per word, accumulated in f32.
template <bool BF16, uint32_t OP>
struct Reducer16 {
  float v[4];
  MSCCLPP_HOST_DEVICE_INLINE static float toFloat(uint32_t h) { return BF16 ? bf16ToFloat(h) : halfToFloat(h); }
  MSCCLPP_HOST_DEVICE_INLINE static uint32_t fromFloat(float f) { return BF16 ? floatToBf16(f) : floatToHalf(f); }
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = toFloat((uint32_t)(w >> (16 * i)) & 0xffffu);
  }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = combineF32<OP>(v[i], toFloat((uint32_t)(w >> (16 * i)) & 0xffffu));
  }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    uint64_t w = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float x = OP == kReduceAvg ? v[i] / (float)n : v[i];
      w |= (uint64_t)fromFloat(x) << (16 * i);
    }
    return w;
  }
};
template <uint32_t OP>
struct Reducer<kDataTypeF16, OP> : Reducer16<false, OP> {};
template <uint32_t OP>
struct Reducer<kDataTypeBF16, OP> : Reducer16<true, OP> {};

template <uint32_t OP>
struct Reducer<kDataTypeI32, OP> {
  uint32_t v0, v1;
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) {
    v0 = (uint32_t)w;
    v1 = (uint32_t)(w >> 32);
  }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) {
    v0 = combineI32<OP>(v0, (uint32_t)w);
    v1 = combineI32<OP>(v1, (uint32_t)(w >> 32));
  }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    uint32_t a = v0, b = v1;
    if (OP == kReduceAvg) {  // truncating signed division, as Rust's `x / n`
      a = (uint32_t)((int32_t)a / (int32_t)n);
      b = (uint32_t)((int32_t)b / (int32_t)n);
    }
    return (uint64_t)a | ((uint64_t)b << 32);
  }
};

template <uint32_t OP>
struct Reducer<kDataTypeU32, OP> {
  uint32_t v0, v1;
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) {
    v0 = (uint32_t)w;
    v1 = (uint32_t)(w >> 32);
  }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) {
    v0 = combineU32<OP>(v0, (uint32_t)w);
    v1 = combineU32<OP>(v1, (uint32_t)(w >> 32));
  }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    uint32_t a = v0, b = v1;
    if (OP == kReduceAvg) {
      a /= n;
      b /= n;
    }
    return (uint64_t)a | ((uint64_t)b << 32);
  }
};

}  // namespace mscclpp
