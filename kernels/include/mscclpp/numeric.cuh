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
constexpr uint32_t kDataTypeF64 = 5;
constexpr uint32_t kDataTypeI64 = 6;
constexpr uint32_t kDataTypeU64 = 7;
constexpr uint32_t kDataTypeI8 = 8;
constexpr uint32_t kDataTypeU8 = 9;
constexpr uint32_t kDataTypeF8E4M3 = 10;
constexpr uint32_t kDataTypeF8E5M2 = 11;

// ReduceOp codes (hal/src/dtype.rs).
constexpr uint32_t kReduceSum = 0;
constexpr uint32_t kReduceProd = 1;
constexpr uint32_t kReduceMin = 2;
constexpr uint32_t kReduceMax = 3;
constexpr uint32_t kReduceAvg = 4;

// Bytes per element of a DataType code (0 for an unknown code).
MSCCLPP_HOST_DEVICE_INLINE uint32_t dataTypeSize(uint32_t dtype) {
  return dtype == kDataTypeF16 || dtype == kDataTypeBF16 ? 2u
         : dtype <= kDataTypeU32                         ? 4u
         : dtype <= kDataTypeU64                         ? 8u
         : dtype <= kDataTypeF8E5M2                      ? 1u
                                                         : 0u;
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

// ---- 8-bit floats (OCP FP8: E4M3 = E4M3FN, bias 7, no infinities; E5M2, bias 15) -----------
// The same bits as hal/src/dtype.rs (fp8_to_f32, f32_to_fp8): exact widening; narrowing rounds to
// nearest even and saturates to the largest finite value (NVIDIA's __NV_SATFINITE), NaN stays NaN.

template <bool E4M3>
MSCCLPP_HOST_DEVICE_INLINE float fp8ToFloat(uint32_t v) {
  constexpr uint32_t M = E4M3 ? 3u : 2u;
  constexpr uint32_t BIAS = E4M3 ? 7u : 15u;
  const uint32_t sign = (v & 0x80u) << 24;
  const uint32_t e = (v & 0x7fu) >> M;
  const uint32_t m = v & ((1u << M) - 1u);
  if (E4M3 && (v & 0x7fu) == 0x7fu) return bitsFloat(0x7fc00000u);
  if (!E4M3 && e == 31u) return bitsFloat(sign | (m ? 0x7fc00000u : 0x7f800000u));
  if (e == 0) {
    // m * 2^(1 - BIAS - M), exact in f32.
    const float q = E4M3 ? 1.953125e-3f : 1.52587890625e-5f;
    return bitsFloat(sign | floatBits((float)m * q));
  }
  return bitsFloat(sign | ((e + 127u - BIAS) << 23) | (m << (23u - M)));
}

template <bool E4M3>
MSCCLPP_HOST_DEVICE_INLINE uint32_t floatToFp8(float f) {
  constexpr uint32_t M = E4M3 ? 3u : 2u;
  constexpr int BIAS = E4M3 ? 7 : 15;
  constexpr uint32_t MAXV = E4M3 ? 0x7eu : 0x7bu;
  const uint32_t bits = floatBits(f);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t x = bits & 0x7fffffffu;
  if (x > 0x7f800000u) return sign | 0x7fu;
  if (x < 0x00800000u) return sign;
  const int e = (int)(x >> 23) - 127;
  if (e >= 1 - BIAS) {
    constexpr uint32_t DROP = 23u - M;
    const uint32_t q = (x & 0x7fffffu) >> DROP;
    const uint32_t r = x & ((1u << DROP) - 1u);
    constexpr uint32_t HALF = 1u << (DROP - 1u);
    uint32_t v = ((uint32_t)(e + BIAS) << M) | q;
    if (r > HALF || (r == HALF && (q & 1u))) ++v;
    return sign | (v < MAXV ? v : MAXV);
  }
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t s = (uint32_t)(24 - BIAS - (int)M - e);
  if (s >= 25u) return sign;
  uint32_t q = m >> s;
  const uint32_t r = m & ((1u << s) - 1u);
  const uint32_t half = 1u << (s - 1u);
  if (r > half || (r == half && (q & 1u))) ++q;
  return sign | q;
}

MSCCLPP_HOST_DEVICE_INLINE uint64_t doubleBits(double d) {
  union {
    double d;
    uint64_t u;
  } c;
  c.d = d;
  return c.u;
}
MSCCLPP_HOST_DEVICE_INLINE double bitsDouble(uint64_t u) {
  union {
    double d;
    uint64_t u;
  } c;
  c.u = u;
  return c.d;
}

// ---- reduction of 8-byte words ------------------------------------------------------------
//
// A Reducer<DTYPE, OP> combines the elements packed in 8-byte words (2 x 32-bit or 4 x 16-bit,
// little-endian: the element at the lower address in the low bits; 1 x 64-bit and 8 x 8-bit too): `load` starts an
// accumulator from a word, `add` combines a word into it, `finish` gives the output word
// (Avg divides by `n` there). 16-bit floats accumulate in f32 and round once, in `finish`; 8-bit
// types stay packed in the word (few registers: the wide kernels keep several reducers per
// thread) and FP8 rounds back after every operation, as NCCL does.

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

template <uint32_t OP>
MSCCLPP_HOST_DEVICE_INLINE double combineF64(double a, double b) {
  if (OP == kReduceProd) return a * b;
  // As fmin/fmax: a NaN operand gives the other one.
  if (OP == kReduceMin) return a != a ? b : b != b ? a : (b < a ? b : a);
  if (OP == kReduceMax) return a != a ? b : b != b ? a : (b > a ? b : a);
  return a + b;
}

template <uint32_t OP>
struct Reducer<kDataTypeF64, OP> {
  double v;
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) { v = bitsDouble(w); }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) { v = combineF64<OP>(v, bitsDouble(w)); }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    return doubleBits(OP == kReduceAvg ? v / (double)n : v);
  }
};

// 64-bit integers (SIGNED: i64, else u64); Avg truncates.
template <bool SIGNED, uint32_t OP>
struct Reducer64 {
  uint64_t v;
  MSCCLPP_HOST_DEVICE_INLINE void load(uint64_t w) { v = w; }
  MSCCLPP_HOST_DEVICE_INLINE void add(uint64_t w) {
    if (OP == kReduceProd) {
      v = v * w;
    } else if (OP == kReduceMin) {
      v = (SIGNED ? (int64_t)w < (int64_t)v : w < v) ? w : v;
    } else if (OP == kReduceMax) {
      v = (SIGNED ? (int64_t)w > (int64_t)v : w > v) ? w : v;
    } else {
      v = v + w;
    }
  }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t finish(uint32_t n) const {
    if (OP != kReduceAvg) return v;
    return SIGNED ? (uint64_t)((int64_t)v / (int64_t)n) : v / (uint64_t)n;
  }
};
template <uint32_t OP>
struct Reducer<kDataTypeI64, OP> : Reducer64<true, OP> {};
template <uint32_t OP>
struct Reducer<kDataTypeU64, OP> : Reducer64<false, OP> {};

// The 8-bit lane `i` of `w` as the lane type's value: sign-extended for i8.
template <uint32_t DTYPE>
MSCCLPP_HOST_DEVICE_INLINE uint32_t lane8(uint64_t w, int i) {
  const uint32_t b = (uint32_t)(w >> (8 * i)) & 0xffu;
  return DTYPE == kDataTypeI8 ? (uint32_t)(int32_t)(int8_t)b : b;
}

// One 8-bit lane: integers wrap, FP8 in f32 rounded back.
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_HOST_DEVICE_INLINE uint32_t combine8(uint32_t a, uint32_t b) {
  if (DTYPE == kDataTypeF8E4M3 || DTYPE == kDataTypeF8E5M2) {
    constexpr bool E4 = DTYPE == kDataTypeF8E4M3;
    return floatToFp8<E4>(combineF32<OP>(fp8ToFloat<E4>(a), fp8ToFloat<E4>(b)));
  }
  if (DTYPE == kDataTypeI8) return combineI32<OP>(a, b) & 0xffu;
  return combineU32<OP>(a, b) & 0xffu;
}

// The lane-wise operation and the division of Avg on words of eight 8-bit lanes: out of line, so
// that the many entry points' copies stay small (these types are rarely on a hot path).
template <uint32_t DTYPE, uint32_t OP>
__device__ __noinline__ uint64_t combineWord8(uint64_t v, uint64_t w) {
  uint64_t r = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    r |= (uint64_t)(combine8<DTYPE, OP>(lane8<DTYPE>(v, i), lane8<DTYPE>(w, i)) & 0xffu) << (8 * i);
  }
  return r;
}
template <uint32_t DTYPE>
__device__ __noinline__ uint64_t divideWord8(uint64_t v, uint32_t n) {
  uint64_t r = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    uint32_t x;
    if (DTYPE == kDataTypeF8E4M3) {
      x = floatToFp8<true>(fp8ToFloat<true>(lane8<DTYPE>(v, i)) / (float)n);
    } else if (DTYPE == kDataTypeF8E5M2) {
      x = floatToFp8<false>(fp8ToFloat<false>(lane8<DTYPE>(v, i)) / (float)n);
    } else if (DTYPE == kDataTypeI8) {
      x = (uint32_t)((int32_t)lane8<DTYPE>(v, i) / (int32_t)n);
    } else {
      x = lane8<DTYPE>(v, i) / n;
    }
    r |= (uint64_t)(x & 0xffu) << (8 * i);
  }
  return r;
}

// i8, u8, FP8: eight lanes packed in the word.
template <uint32_t DTYPE, uint32_t OP>
struct Reducer8 {
  uint64_t v;
  MSCCLPP_DEVICE_INLINE void load(uint64_t w) { v = w; }
  MSCCLPP_DEVICE_INLINE void add(uint64_t w) {
    if ((OP == kReduceSum || OP == kReduceAvg) && (DTYPE == kDataTypeI8 || DTYPE == kDataTypeU8)) {
      // Lane-wise wrapping add without carries across lanes.
      const uint64_t h = 0x8080808080808080ull;
      v = ((v & ~h) + (w & ~h)) ^ ((v ^ w) & h);
    } else {
      v = combineWord8<DTYPE, OP>(v, w);
    }
  }
  MSCCLPP_DEVICE_INLINE uint64_t finish(uint32_t n) const { return OP == kReduceAvg ? divideWord8<DTYPE>(v, n) : v; }
};
template <uint32_t OP>
struct Reducer<kDataTypeI8, OP> : Reducer8<kDataTypeI8, OP> {};
template <uint32_t OP>
struct Reducer<kDataTypeU8, OP> : Reducer8<kDataTypeU8, OP> {};
template <uint32_t OP>
struct Reducer<kDataTypeF8E4M3, OP> : Reducer8<kDataTypeF8E4M3, OP> {};
template <uint32_t OP>
struct Reducer<kDataTypeF8E5M2, OP> : Reducer8<kDataTypeF8E5M2, OP> {};

}  // namespace mscclpp
