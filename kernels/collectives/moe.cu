// Expert parallelism: the layout of a routing, dispatch and combine through an exchange buffer
// that every rank of a host maps (collectives/src/moe/spec.md is the specification: the buffer's
// header and regions, a row's layout, the handle, the sequences and acknowledgements). The host
// kernels beside it (collectives/src/moe/host.rs) follow the same protocol. Vendor-neutral: the
// same text is compiled by NVRTC and by hipRTC. Waits give up on the communicator's abort word.
#define MSCCLPP_DEVICE_ABORT 1
#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/numeric.cuh"
#include "collectives/args.cuh"
#include "collectives/args_check.h"

namespace mscclpp {

// The buffer's header (hdr in collectives/src/moe/args.rs), byte offsets.
constexpr uint64_t kMoeHeaderBytes = 4096;
constexpr uint64_t kN = kMoeMaxRanks;
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchFlag(uint64_t s) { return 8 * s; }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchCount(uint64_t s) { return 8 * (kN + s); }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchAck(uint64_t d) { return 8 * (2 * kN + d); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineFlag(uint64_t s) { return 8 * (3 * kN + s); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineAck(uint64_t d) { return 8 * (4 * kN + d); }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchSeq() { return 8 * (5 * kN); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineSeq() { return 8 * (6 * kN); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineDone() { return 8 * (7 * kN); }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchDone() { return 8 * (7 * kN + 1); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineCount(uint64_t s) { return 8 * (8 * kN + s); }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchShape(uint64_t s) { return 8 * (9 * kN + s); }
// Blocks of this rank that finished sending to rank d (dispatch) or back to rank s (combine): the
// one that completes a call's share publishes the flag.
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchSent(uint64_t d) { return 8 * (10 * kN + d); }
MSCCLPP_DEVICE_INLINE uint64_t moeCombineSent(uint64_t s) { return 8 * (11 * kN + s); }
// Expert-major combine: source s's weights are in the rows it dispatched here (its flag), and
// this rank's blocks that finished writing weights to rank d.
MSCCLPP_DEVICE_INLINE uint64_t moeWeightsFlag(uint64_t s) { return 8 * (12 * kN + s); }
MSCCLPP_DEVICE_INLINE uint64_t moeWeightsSent(uint64_t d) { return 8 * (13 * kN + d); }
MSCCLPP_DEVICE_INLINE uint64_t* moeWord(uint64_t base, uint64_t off) { return (uint64_t*)(base + off); }
MSCCLPP_DEVICE_INLINE uint64_t moeDispatchRegion(const MoeArgs& a, uint64_t src) {
  return kMoeHeaderBytes + src * a.max_tokens * a.row_bytes;
}
MSCCLPP_DEVICE_INLINE uint64_t moeCombineRegion(const MoeArgs& a, uint64_t src) {
  return kMoeHeaderBytes + ((uint64_t)a.nranks + src) * a.max_tokens * a.row_bytes;
}

// Status bits (args.rs: STATUS_*), or-ed into the handle.
constexpr int32_t kMoeStatusExpertRange = 1;
constexpr int32_t kMoeStatusCapacity = 2;
constexpr int32_t kMoeStatusRowSize = 4;
constexpr int32_t kMoeStatusCombineMissing = 8;
MSCCLPP_DEVICE_INLINE void moeFail(int32_t* status, int32_t bit) { atomicOr((int*)status, bit); }
constexpr uint32_t kMoeMaxThreads = 1024;

struct alignas(16) MoeVec {
  uint64_t lo, hi;
};

// `bytes` from `src` to `dst` by the `lanes` threads of a group: 16 bytes at a time where both
// sides and the length allow it, else 8, else 1. Four loads are issued before their stores: the
// compiler must assume that `dst` may alias `src`, so a loop of single copies would wait out each
// load's latency in turn.
MSCCLPP_DEVICE_INLINE void moeCopy(char* dst, const char* src, uint64_t bytes, uint32_t lane, uint32_t lanes) {
  const uint64_t all = (uint64_t)dst | (uint64_t)src | bytes;
  if ((all & 15) == 0) {
    MoeVec* d = (MoeVec*)dst;
    const MoeVec* s = (const MoeVec*)src;
    const uint64_t n = bytes / 16, l = lanes;
    uint64_t i = lane;
    for (; i + 3 * l < n; i += 4 * l) {
      const MoeVec v0 = s[i], v1 = s[i + l], v2 = s[i + 2 * l], v3 = s[i + 3 * l];
      d[i] = v0;
      d[i + l] = v1;
      d[i + 2 * l] = v2;
      d[i + 3 * l] = v3;
    }
    for (; i < n; i += l) d[i] = s[i];
  } else if ((all & 7) == 0) {
    for (uint64_t i = (uint64_t)lane * 8; i < bytes; i += (uint64_t)lanes * 8)
      *(uint64_t*)(dst + i) = *(const uint64_t*)(src + i);
  } else {
    for (uint64_t i = lane; i < bytes; i += lanes) dst[i] = src[i];
  }
}

// The sum of every thread's `v` (all threads of the block call it).
MSCCLPP_DEVICE_INLINE uint64_t moeBlockSum(uint32_t v) {
  __shared__ unsigned long long sum;
  if (threadIdx.x == 0) sum = 0;
  __syncthreads();
  if (v != 0) atomicAdd(&sum, (unsigned long long)v);
  __syncthreads();
  const uint64_t r = sum;
  __syncthreads();
  return r;
}

// Whether token t has an expert on rank d; an index outside -1..E is reported where `report`.
MSCCLPP_DEVICE_INLINE bool moeMember(const MoeArgs& a, uint64_t t, uint64_t d, uint64_t local, int32_t* status,
                                     bool report) {
  bool member = false;
  for (uint32_t i = 0; i < a.topk; ++i) {
    const int64_t x = ((const int64_t*)a.topk_idx)[t * a.topk + i];
    if (x < -1 || x >= (int64_t)a.num_experts) {
      if (report) moeFail(status, kMoeStatusExpertRange);
    } else if (x >= 0 && (uint64_t)x / local == d) {
      member = true;
    }
  }
  return member;
}

// Thread 0 adds this block to the word counting the blocks done with a peer's share (after a
// system fence: what the block wrote is seen first); true in the block that completes the call's
// `blocks`.
MSCCLPP_DEVICE_INLINE bool moeLastOf(uint64_t* counter, uint64_t seq, uint32_t blocks) {
  fenceSystem();
  return fetchAddAcqRelSystem(counter, 1) + 1 == seq * blocks;
}

// Thread 0 waits until the word is at least `seq`; false (in every thread) when the wait gave up
// on the abort word.
MSCCLPP_DEVICE_INLINE bool moeWaitGe(const uint64_t* w, uint64_t seq) {
  __shared__ uint32_t ok;
  if (threadIdx.x == 0) ok = spinUntil([&] { return loadAcquireSystem(w) >= seq; }) ? 1u : 0u;
  __syncthreads();
  const bool r = ok != 0;
  __syncthreads();
  return r;
}

MSCCLPP_DEVICE_INLINE float moeLoad(uint32_t dtype, const char* p) {
  if (dtype == kDataTypeF16) return halfToFloat(*(const uint16_t*)p);
  if (dtype == kDataTypeBF16) return bf16ToFloat(*(const uint16_t*)p);
  return *(const float*)p;
}
MSCCLPP_DEVICE_INLINE void moeStore(uint32_t dtype, char* p, float x) {
  if (dtype == kDataTypeF16)
    *(uint16_t*)p = (uint16_t)floatToHalf(x);
  else if (dtype == kDataTypeBF16)
    *(uint16_t*)p = (uint16_t)floatToBf16(x);
  else
    *(float*)p = x;
}

// Per-rank and per-expert counts of a routing and each token's ranks (one thread per token).
MSCCLPP_DEVICE_INLINE void moeLayout(const MoeLayoutArgs& a) {
  if (a.nranks == 0 || a.nranks > 64 || a.num_experts == 0 || a.num_experts % a.nranks != 0) deviceTrap();
  const int64_t e = a.num_experts;
  const int64_t local = e / a.nranks;
  for (uint64_t t = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x; t < a.tokens;
       t += (uint64_t)gridDim.x * blockDim.x) {
    uint64_t mask = 0;
    for (uint32_t j = 0; j < a.topk; ++j) {
      const int64_t x = ((const int64_t*)a.topk_idx)[t * a.topk + j];
      if (x == -1) continue;
      if (x < 0 || x >= e) {
        moeFail((int32_t*)a.status, kMoeStatusExpertRange);
        continue;
      }
      atomicAdd((int*)a.per_expert + x, 1);
      mask |= 1ull << (uint32_t)(x / local);
    }
    for (uint32_t d = 0; d < a.nranks; ++d) {
      const bool in = (mask >> d) & 1;
      ((uint8_t*)a.in_rank)[t * a.nranks + d] = in ? 1 : 0;
      if (in) atomicAdd((int*)a.per_rank + d, 1);
    }
  }
}

// The grid holds B blocks per rank (gridDim.x = n B, fixed for the exchange's life: the counters
// below count to the call's sequence times B). Block b serves rank b / B, its share b % B.
MSCCLPP_DEVICE_INLINE bool moeGridOk(const MoeArgs& a) {
  return a.nranks >= 2 && a.nranks <= kMoeMaxRanks && a.rank < a.nranks && gridDim.x % a.nranks == 0 &&
         a.num_experts != 0 && a.num_experts % a.nranks == 0 && a.tokens <= a.max_tokens &&
         blockDim.x <= kMoeMaxThreads && blockDim.x % kWarpSize == 0;
}

// Adds one to `counts[e]` for every top-k entry with local expert e of rows [from, to) of source
// p's region (the block's threads share the rows).
MSCCLPP_DEVICE_INLINE void moeCountEntries(const MoeArgs& a, uint32_t p, uint64_t from, uint64_t to,
                                           uint32_t* counts) {
  const uint32_t local = a.num_experts / a.nranks;
  const uint64_t region = a.buffer + moeDispatchRegion(a, p);
  for (uint64_t j = from + threadIdx.x; j < to; j += blockDim.x) {
    const int32_t* le = (const int32_t*)(region + j * a.row_bytes + a.meta_at + 4);
    for (uint32_t q = 0; q < a.topk; ++q) {
      if (le[q] >= 0 && (uint32_t)le[q] < local) atomicAdd(&counts[le[q]], 1u);
    }
  }
}

// A received row's scales into the expert-major layout at (e, slot): f32 each, or DeepEP's packed
// UE8M0 (each scale's biased exponent in a byte, four 128-channel blocks an int32, the first in
// the low byte), at the strides the caller gave (column-major per expert in DeepEP's tensors).
MSCCLPP_DEVICE_INLINE void moeEmScales(const MoeArgs& a, const char* sc, uint64_t e, uint64_t slot, uint32_t lane) {
  const uint32_t* bits = (const uint32_t*)sc;
  const uint64_t blocks = a.scale_bytes / 4;
  const uint64_t base = e * a.em_scale_strides[0] + slot * a.em_scale_strides[1];
  uint32_t* out = (uint32_t*)a.em_scales;
  if (a.em_flags & kMoeEmUe8m0) {
    for (uint64_t g = lane; g < blocks / 4; g += kWarpSize) {
      uint32_t w = 0;
      for (uint32_t i = 0; i < 4; ++i) w |= ((bits[4 * g + i] >> 23) & 0xFFu) << (8 * i);
      out[base + g * a.em_scale_strides[2]] = w;
    }
  } else {
    for (uint64_t b = lane; b < blocks; b += kWarpSize) out[base + b * a.em_scale_strides[2]] = bits[b];
  }
}

// Entries of a row whose places the expert-major receive keeps in registers (DeepSeek's, Qwen's
// and Kimi's top-8); a row of more entries takes a copy per entry.
constexpr uint32_t kMoeHoist = 8;

// Received row `row` into every expert-major place its entries took (`sl`: the row's slots, -1
// where none; `le`: its local experts), by one warp: each 16 bytes read once and stored to each
// place, four in flight per lane.
MSCCLPP_DEVICE_INLINE void moeFanOut(const MoeArgs& a, const char* row, const int32_t* sl, const int32_t* le,
                                     uint32_t lane) {
  const uint32_t k = a.topk;
  const uint64_t cap = a.em_capacity;
  if (k > kMoeHoist || ((a.payload_bytes | a.em_x) & 15) != 0) {
    for (uint32_t q = 0; q < k; ++q) {
      if (sl[q] < 0) continue;
      char* to = (char*)a.em_x + ((uint64_t)le[q] * cap + (uint64_t)sl[q]) * a.payload_bytes;
      moeCopy(to, row, a.payload_bytes, lane, kWarpSize);
    }
    return;
  }
  MoeVec* to[kMoeHoist];
#pragma unroll
  for (uint32_t q = 0; q < kMoeHoist; ++q) {
    to[q] = q < k && sl[q] >= 0 ? (MoeVec*)(a.em_x + ((uint64_t)le[q] * cap + (uint64_t)sl[q]) * a.payload_bytes)
                                : nullptr;
  }
  const MoeVec* from = (const MoeVec*)row;
  const uint64_t n = a.payload_bytes / 16, l = kWarpSize;
  for (uint64_t i = lane; i < n; i += 4 * l) {
    MoeVec v[4];
#pragma unroll
    for (uint32_t c = 0; c < 4; ++c) {
      if (i + c * l < n) v[c] = from[i + c * l];
    }
#pragma unroll
    for (uint32_t q = 0; q < kMoeHoist; ++q) {
      if (to[q] == nullptr) continue;
#pragma unroll
      for (uint32_t c = 0; c < 4; ++c) {
        if (i + c * l < n) to[q][i + c * l] = v[c];
      }
    }
  }
}

// Expert-major receive of share `share` of source s's c rows (prefix: rows of the sources before
// it): each (row, top-k entry) with a local expert takes that expert's next slot — sources in rank
// order, each source's rows in order, so every backend gives the same layout — and is copied
// there (DeepEP's low-latency recv_x, src_info, layout_range, counts). The slot is kept for the
// combine. The block counts the entries before its share itself, as the send half does.
MSCCLPP_DEVICE_INLINE void moeExpertMajor(const MoeArgs& a, uint32_t s, uint32_t share, uint32_t blocks, uint64_t c,
                                          uint64_t prefix, uint64_t shape, int32_t* handle) {
  const uint32_t n = a.nranks, k = a.topk, tid = threadIdx.x, local = a.num_experts / n;
  const uint32_t warps = blockDim.x / kWarpSize, warp = tid / kWarpSize, lane = tid % kWarpSize;
  int32_t* status = handle + n;
  __shared__ uint32_t begin[kMoeEmMaxLocal];
  __shared__ uint32_t next[kMoeEmMaxLocal];
  for (uint32_t e = tid; e < local; e += blockDim.x) begin[e] = 0;
  __syncthreads();
  for (uint32_t p = 0; p < s; ++p) {
    // A source whose rows differ in size sent none (phase 2 said so).
    if (loadRelaxedSystem(moeWord(a.buffer, moeDispatchShape(p))) != shape) continue;
    moeCountEntries(a, p, 0, loadRelaxedSystem(moeWord(a.buffer, moeDispatchCount(p))), begin);
  }
  __syncthreads();
  for (uint32_t e = tid; e < local; e += blockDim.x) next[e] = begin[e];
  __syncthreads();
  const uint64_t lo = c * share / blocks, hi = c * (share + 1) / blocks;
  moeCountEntries(a, s, 0, lo, next);
  __syncthreads();
  const uint64_t region = a.buffer + moeDispatchRegion(a, s);
  int32_t* slots = (int32_t*)a.em_slots;
  const uint64_t cap = a.em_capacity;
  for (uint64_t j = lo + tid; j < hi; j += blockDim.x) {
    const int32_t* le = (const int32_t*)(region + j * a.row_bytes + a.meta_at + 4);
    for (uint32_t q = 0; q < k; ++q) {
      if (le[q] < 0 || (uint32_t)le[q] >= local) slots[(prefix + j) * k + q] = -1;
    }
  }
  // A thread per local expert walks the share's rows in order.
  for (uint32_t e = tid; e < local; e += blockDim.x) {
    uint64_t slot = next[e];
    for (uint64_t j = lo; j < hi; ++j) {
      const int32_t* le = (const int32_t*)(region + j * a.row_bytes + a.meta_at + 4);
      for (uint32_t q = 0; q < k; ++q) {
        if (le[q] != (int32_t)e) continue;
        if (slot >= cap) moeFail(status, kMoeStatusCapacity);
        slots[(prefix + j) * k + q] = slot < cap ? (int32_t)slot : -1;
        ++slot;
      }
    }
    if (share == blocks - 1) {
      // The last share ends the source's entries: its range, and the counts.
      const uint64_t b = begin[e] < cap ? begin[e] : cap, end = slot < cap ? slot : cap;
      const uint32_t got = (uint32_t)(end - b);
      ((int64_t*)a.em_range)[(uint64_t)e * n + s] = (int64_t)(b << 32 | got);
      if (got != 0) {
        atomicAdd((int*)a.em_count + e, (int)got);
        atomicAdd((int*)handle + n + 2 + e, (int)got);
        if (a.em_stats != 0) atomicAdd((int*)a.em_stats + e, (int)got);
      }
    }
  }
  __syncthreads();
  for (uint64_t j = lo + warp; j < hi; j += warps) {
    const char* row = (const char*)(region + j * a.row_bytes);
    const int32_t* le = (const int32_t*)(row + a.meta_at + 4);
    const int32_t* sl = slots + (prefix + j) * k;
    const int32_t tok = *(const int32_t*)(row + a.meta_at);
    for (uint32_t q = 0; q < k; ++q) {
      const int32_t slot = sl[q];
      if (slot < 0) continue;
      const uint64_t at = (uint64_t)le[q] * cap + (uint64_t)slot;
      if (lane == 0) ((int32_t*)a.em_src)[at] = tok;
      if (a.em_scales != 0) moeEmScales(a, row + a.scales_at, (uint64_t)le[q], (uint64_t)slot, lane);
    }
    moeFanOut(a, row, sl, le, lane);
  }
}

// The smallest power of two at least `s` (a positive normal float).
MSCCLPP_DEVICE_INLINE float moePow2Ceil(float s) {
  const uint32_t b = floatBits(s);
  return (b & 0x7fffffu) == 0 ? s : bitsFloat((b & 0x7f800000u) + 0x800000u);
}

// Token tok's bf16 row (payload_bytes channels) as DeepEP's low-latency dispatch sends it, into
// `row`: per 128 channels the largest magnitude (at least 1e-4) over 448 is the scale (the next
// power of two up where kMoeEmRoundScale); each channel divided by it and rounded to E4M3 is the
// payload, the f32 scales the row's scales. A warp per row; each lane takes 128 / kWarpSize
// neighbouring channels of each 128.
MSCCLPP_DEVICE_INLINE void moeCastFp8(const MoeArgs& a, char* row, uint64_t tok, uint32_t lane) {
  constexpr uint32_t kPer = 128 / kWarpSize;
  const uint64_t hidden = a.payload_bytes;
  const uint16_t* src = (const uint16_t*)(a.x + tok * hidden * 2);
  float* scales = (float*)(row + a.scales_at);
  for (uint64_t b = 0; b < hidden / 128; ++b) {
    const uint64_t at = b * 128 + (uint64_t)lane * kPer;
    float v[kPer];
    float m = 0.0f;
    for (uint32_t i = 0; i < kPer; ++i) {
      v[i] = bf16ToFloat(src[at + i]);
      m = fmaxf(m, fabsf(v[i]));
    }
    m = fmaxf(warpMax(m), 1e-4f);
    float scale = m / 448.0f;
    if (a.em_flags & kMoeEmRoundScale) scale = moePow2Ceil(scale);
    uint32_t packed = 0;
    for (uint32_t i = 0; i < kPer; ++i) packed |= floatToFp8<true>(v[i] / scale) << (8 * i);
    if (kPer == 4)
      *(uint32_t*)(row + at) = packed;
    else
      *(uint16_t*)(row + at) = (uint16_t)packed;
    if (lane == 0) scales[b] = scale;
  }
}

// Phase 1: the tokens of share j for rank d, in token order, into its region for this rank, after
// the rows of the tokens before the share (each block counts those itself). Phase 2: share j of
// the rows source s = d sent here, after those of the sources before it.
MSCCLPP_DEVICE_INLINE void moeDispatch(const MoeArgs& a) {
  abortWordInit(a.abort);
  if (!moeGridOk(a)) deviceTrap();
  const uint32_t n = a.nranks, k = a.topk, tid = threadIdx.x, blocks = gridDim.x / n;
  const uint32_t d = blockIdx.x / blocks, share = blockIdx.x % blocks;
  const uint64_t local = a.num_experts / n, r = a.rank;
  const uint64_t seq = *(volatile uint64_t*)moeWord(a.buffer, moeDispatchSeq()) + 1;
  int32_t* handle = (int32_t*)a.handle;
  int32_t* status = handle + n;
  int32_t* positions = handle + n + 2 + local;
  const uint64_t shape = a.payload_bytes | a.scale_bytes << 32;
  const uint32_t warps = blockDim.x / kWarpSize, warp = tid / kWarpSize, lane = tid % kWarpSize;
  if ((a.phases & kMoeHalfSend) && blockIdx.x == 0 && tid == 0) handle[n + 1] = (int32_t)a.tokens;

  __shared__ uint32_t scan[kMoeMaxThreads];
  __shared__ uint32_t list[kMoeMaxThreads];
  if (a.phases & kMoeHalfSend) {
  if (!moeWaitGe(moeWord(a.buffer, moeDispatchAck(d)), seq - 1)) return;
  const uint64_t region = a.peer_dispatch[d];
  const uint64_t lo = a.tokens * share / blocks, hi = a.tokens * (share + 1) / blocks;
  uint32_t earlier = 0;
  for (uint64_t t = tid; t < lo; t += blockDim.x) earlier += moeMember(a, t, d, local, status, false) ? 1 : 0;
  uint64_t base = moeBlockSum(earlier);
  for (uint64_t t0 = lo; t0 < hi; t0 += blockDim.x) {
    const uint64_t t = t0 + tid;
    const uint32_t member = t < hi && moeMember(a, t, d, local, status, true) ? 1 : 0;
    scan[tid] = member;
    __syncthreads();
    for (uint32_t off = 1; off < blockDim.x; off <<= 1) {
      const uint32_t v = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += v;
      __syncthreads();
    }
    const uint32_t before = scan[tid] - member, total = scan[blockDim.x - 1];
    if (t < hi) positions[t * n + d] = member ? (int32_t)(base + before) : -1;
    if (member) list[before] = (uint32_t)(t - t0);
    __syncthreads();
    for (uint32_t q = warp; q < total; q += warps) {
      const uint64_t tok = t0 + list[q];
      char* row = (char*)(region + (base + q) * a.row_bytes);
      if (a.em_flags & kMoeEmCastFp8) {
        moeCastFp8(a, row, tok, lane);
      } else {
        moeCopy(row, (const char*)a.x + tok * a.payload_bytes, a.payload_bytes, lane, kWarpSize);
        if (a.scales != 0)
          moeCopy(row + a.scales_at, (const char*)a.scales + tok * a.scale_bytes, a.scale_bytes, lane, kWarpSize);
      }
      char* meta = row + a.meta_at;
      if (lane == 0) *(int32_t*)meta = (int32_t)tok;
      for (uint32_t i = lane; i < k; i += kWarpSize) {
        const int64_t x = ((const int64_t*)a.topk_idx)[tok * k + i];
        const bool mine = x >= 0 && x < (int64_t)a.num_experts && (uint64_t)x / local == d;
        const float w = mine && a.topk_weights != 0 ? ((const float*)a.topk_weights)[tok * k + i] : 0.0f;
        ((int32_t*)(meta + 4))[i] = mine ? (int32_t)((uint64_t)x - d * local) : -1;
        ((float*)(meta + 4 + 4 * (uint64_t)k))[i] = w;
      }
    }
    base += total;
    __syncthreads();
  }
  if (tid == 0) {
    // The last share knows the count; it is stored before the flag, which the block that
    // completes the call's shares publishes.
    if (share == blocks - 1) {
      storeRelaxedSystem(moeWord(a.peer_buffer[d], moeDispatchCount(r)), base);
      storeRelaxedSystem(moeWord(a.peer_buffer[d], moeDispatchShape(r)), shape);
    }
    if (moeLastOf(moeWord(a.buffer, moeDispatchSent(d)), seq, blocks))
      storeReleaseSystem(moeWord(a.peer_buffer[d], moeDispatchFlag(r)), seq);
  }
  }
  if (!(a.phases & kMoeHalfReceive)) return;

  // Phase 2.
  const uint32_t s = d;
  __shared__ uint32_t arrived;
  if (tid == 0) arrived = 1;
  __syncthreads();
  if (tid <= s) {
    if (!spinUntil([&] { return loadAcquireSystem(moeWord(a.buffer, moeDispatchFlag(tid))) >= seq; })) arrived = 0;
  }
  __syncthreads();
  if (!arrived) return;
  // A source whose rows differ in size from this rank's counts as having sent none.
  uint64_t prefix = 0;
  for (uint32_t p = 0; p < s; ++p) {
    if (loadRelaxedSystem(moeWord(a.buffer, moeDispatchShape(p))) == shape)
      prefix += loadRelaxedSystem(moeWord(a.buffer, moeDispatchCount(p)));
  }
  uint64_t c = loadRelaxedSystem(moeWord(a.buffer, moeDispatchCount(s)));
  if (c != 0 && loadRelaxedSystem(moeWord(a.buffer, moeDispatchShape(s))) != shape) {
    if (tid == 0 && share == 0) moeFail(status, kMoeStatusRowSize);
    c = 0;
  }
  if (tid == 0 && share == 0) handle[s] = (int32_t)c;
  const uint64_t src = a.buffer + moeDispatchRegion(a, s);
  if (a.em_flags & kMoeEmOn) moeExpertMajor(a, s, share, blocks, c, prefix, shape, handle);
  // The flat outputs (none in the expert-major form: out_capacity 0).
  for (uint64_t j = c * share / blocks + warp; j < c * (share + 1) / blocks; j += warps) {
    const uint64_t i = prefix + j;
    if (i >= a.out_capacity) {
      if (lane == 0 && !(a.em_flags & kMoeEmOn)) moeFail(status, kMoeStatusCapacity);
      continue;
    }
    const char* row = (const char*)(src + j * a.row_bytes);
    moeCopy((char*)a.out_x + i * a.payload_bytes, row, a.payload_bytes, lane, kWarpSize);
    if (a.out_scales != 0)
      moeCopy((char*)a.out_scales + i * a.scale_bytes, row + a.scales_at, a.scale_bytes, lane, kWarpSize);
    const char* meta = row + a.meta_at;
    if (lane == 0) ((int32_t*)a.out_src)[i] = *(const int32_t*)meta;
    for (uint32_t q = lane; q < k; q += kWarpSize) {
      const int32_t le = ((const int32_t*)(meta + 4))[q];
      ((int64_t*)a.out_idx)[i * k + q] = le;
      if (a.out_weights != 0) ((float*)a.out_weights)[i * k + q] = ((const float*)(meta + 4 + 4 * (uint64_t)k))[q];
      if (le >= 0) atomicAdd((int*)handle + n + 2 + le, 1);
    }
  }
  __syncthreads();
  if (tid == 0) {
    // Every block reads the counts of the sources before its own: only when all have finished
    // may a source write its next dispatch (and count) here. The last block says so to all, and
    // records the call (every block has read the sequence by then).
    if (moeLastOf(moeWord(a.buffer, moeDispatchDone()), seq, gridDim.x)) {
      for (uint32_t q = 0; q < n; ++q) storeRelaxedSystem(moeWord(a.peer_buffer[q], moeDispatchAck(r)), seq);
      *(volatile uint64_t*)moeWord(a.buffer, moeDispatchSeq()) = seq;
    }
  }
}

// Adds the 16 bytes at `p` (8 halves or 4 floats) into `acc`.
MSCCLPP_DEVICE_INLINE void moeAccumulate(uint32_t dtype, const char* p, float* acc) {
  const MoeVec v = *(const MoeVec*)p;
  if (dtype == kDataTypeF32) {
    const float* f = (const float*)&v;
    for (int i = 0; i < 4; ++i) acc[i] += f[i];
  } else {
    const uint16_t* h = (const uint16_t*)&v;
    for (int i = 0; i < 8; ++i) acc[i] += dtype == kDataTypeF16 ? halfToFloat(h[i]) : bf16ToFloat(h[i]);
  }
}
MSCCLPP_DEVICE_INLINE void moeStoreVec(uint32_t dtype, char* p, const float* acc) {
  MoeVec v;
  if (dtype == kDataTypeF32) {
    float* f = (float*)&v;
    for (int i = 0; i < 4; ++i) f[i] = acc[i];
  } else {
    uint16_t* h = (uint16_t*)&v;
    for (int i = 0; i < 8; ++i)
      h[i] = dtype == kDataTypeF16 ? (uint16_t)floatToHalf(acc[i]) : (uint16_t)floatToBf16(acc[i]);
  }
  *(MoeVec*)p = v;
}

// Adds w times the 16 bytes at `p` (8 halves or 4 floats) into `acc` (fused, as the host's).
MSCCLPP_DEVICE_INLINE void moeAccumulateWeighted(uint32_t dtype, const char* p, float w, float* acc) {
  const MoeVec v = *(const MoeVec*)p;
  if (dtype == kDataTypeF32) {
    const float* f = (const float*)&v;
    for (int i = 0; i < 4; ++i) acc[i] = fmaf(w, f[i], acc[i]);
  } else {
    const uint16_t* h = (const uint16_t*)&v;
    for (int i = 0; i < 8; ++i) acc[i] = fmaf(w, dtype == kDataTypeF16 ? halfToFloat(h[i]) : bf16ToFloat(h[i]), acc[i]);
  }
}

// Expert-major combine, at the experts' rank: received row j of source s (i among all rows)
// becomes the sum, over its top-k entries with a slot here, of the entry's weight (written into
// the row by the source) times the expert's output at the slot; f32, top-k order, rounded once
// into the combine row `out`.
MSCCLPP_DEVICE_INLINE void moeWeightedRow(const MoeArgs& a, uint32_t s, uint64_t j, uint64_t i, char* out,
                                          uint32_t lane) {
  const uint32_t k = a.topk, local = a.num_experts / a.nranks;
  const char* drow = (const char*)(a.buffer + moeDispatchRegion(a, s) + j * a.row_bytes);
  const int32_t* le = (const int32_t*)(drow + a.meta_at + 4);
  const float* w = (const float*)(drow + a.meta_at + 4 + 4 * (uint64_t)k);
  const int32_t* sl = (const int32_t*)a.em_slots + i * k;
  const uint32_t size = a.dtype == kDataTypeF32 ? 4u : 2u;
  const bool vec = ((a.payload_bytes | a.x) & 15) == 0;
  if (vec) {
    for (uint64_t v = lane; v < a.payload_bytes / 16; v += kWarpSize) {
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (uint32_t q = 0; q < k; ++q) {
        if (sl[q] < 0 || (uint64_t)sl[q] >= a.em_capacity || le[q] < 0 || (uint32_t)le[q] >= local) continue;
        const uint64_t at = (uint64_t)le[q] * a.em_capacity + (uint64_t)sl[q];
        moeAccumulateWeighted(a.dtype, (const char*)a.x + at * a.payload_bytes + v * 16, w[q], acc);
      }
      moeStoreVec(a.dtype, out + v * 16, acc);
    }
  } else {
    for (uint64_t el = lane; el < a.payload_bytes / size; el += kWarpSize) {
      float acc = 0.0f;
      for (uint32_t q = 0; q < k; ++q) {
        if (sl[q] < 0 || (uint64_t)sl[q] >= a.em_capacity || le[q] < 0 || (uint32_t)le[q] >= local) continue;
        const uint64_t at = (uint64_t)le[q] * a.em_capacity + (uint64_t)sl[q];
        acc = fmaf(w[q], moeLoad(a.dtype, (const char*)a.x + at * a.payload_bytes + el * size), acc);
      }
      moeStore(a.dtype, out + el * size, acc);
    }
  }
}

// Phase 1: share j of the rows that came from rank s = b / B, back to it in the order they
// came (expert-major: first this rank's weights into the rows it dispatched to rank b / B, then
// the weighted sums). Phase 2: every rank's rows back here, then this block's tokens (t = b,
// b + n B, ...).
MSCCLPP_DEVICE_INLINE void moeCombine(const MoeArgs& a) {
  abortWordInit(a.abort);
  if (!moeGridOk(a) || (a.dtype != kDataTypeF32 && a.dtype != kDataTypeF16 && a.dtype != kDataTypeBF16)) {
    deviceTrap();
  }
  const uint32_t n = a.nranks, k = a.topk, tid = threadIdx.x, blocks = gridDim.x / n;
  const uint32_t s = blockIdx.x / blocks, share = blockIdx.x % blocks;
  const uint64_t local = a.num_experts / n, r = a.rank;
  const uint64_t seq = *(volatile uint64_t*)moeWord(a.buffer, moeCombineSeq()) + 1;
  int32_t* handle = (int32_t*)a.handle;
  int32_t* status = handle + n;
  const int32_t* positions = handle + n + 2 + local;
  const uint64_t dispatched = handle[n + 1] < 0 ? 0 : (uint64_t)handle[n + 1];
  const uint32_t warps = blockDim.x / kWarpSize, warp = tid / kWarpSize, lane = tid % kWarpSize;

  const bool em = (a.em_flags & kMoeEmOn) != 0;
  if (a.phases & kMoeHalfSend) {
  if (em) {
    // The weights of this rank's tokens into the rows it dispatched to rank d = s, once d has
    // read them (its acknowledgement of the dispatch whose handle this is: the last one).
    const uint32_t d = s;
    const uint64_t dseq = *(volatile uint64_t*)moeWord(a.buffer, moeDispatchSeq());
    if (!moeWaitGe(moeWord(a.buffer, moeDispatchAck(d)), dseq)) return;
    // Tokens past the call's have no weights given (the rows keep the dispatch's zeros).
    const uint64_t weighed = dispatched < a.tokens ? dispatched : a.tokens;
    const uint64_t lo = weighed * share / blocks, hi = weighed * (share + 1) / blocks;
    for (uint64_t t = lo + warp; t < hi; t += warps) {
      const int32_t p = positions[t * n + d];
      if (p < 0 || (uint64_t)p >= a.max_tokens) continue;
      float* w = (float*)(a.peer_dispatch[d] + (uint64_t)p * a.row_bytes + a.meta_at + 4 + 4 * (uint64_t)k);
      for (uint32_t q = lane; q < k; q += kWarpSize) w[q] = ((const float*)a.em_weights)[t * k + q];
    }
    __syncthreads();
    // The block completing a group of the B blocks publishes (expert-major combines alone count
    // here, so the group, not the sequence, says when).
    if (tid == 0) {
      fenceSystem();
      if ((fetchAddAcqRelSystem(moeWord(a.buffer, moeWeightsSent(d)), 1) + 1) % blocks == 0)
        storeReleaseSystem(moeWord(a.peer_buffer[d], moeWeightsFlag(r)), seq);
    }
    if (!moeWaitGe(moeWord(a.buffer, moeWeightsFlag(s)), seq)) return;
  }
  // Phase 1.
  if (!moeWaitGe(moeWord(a.buffer, moeCombineAck(s)), seq - 1)) return;
  uint64_t prefix = 0;
  for (uint32_t p = 0; p < s; ++p) prefix += (uint64_t)(handle[p] < 0 ? 0 : handle[p]);
  uint64_t c = (uint64_t)(handle[s] < 0 ? 0 : handle[s]);
  if (c > a.max_tokens) c = a.max_tokens;
  if (prefix + c > a.out_capacity) c = a.out_capacity > prefix ? a.out_capacity - prefix : 0;
  const uint64_t region = a.peer_combine[s];
  for (uint64_t j = c * share / blocks + warp; j < c * (share + 1) / blocks; j += warps) {
    char* row = (char*)(region + j * a.row_bytes);
    const uint64_t i = prefix + j;
    if (em)
      moeWeightedRow(a, s, j, i, row, lane);
    else
      moeCopy(row, (const char*)a.x + i * a.payload_bytes, a.payload_bytes, lane, kWarpSize);
    // Without weights, zeros: a peer that sums weights must not read a previous call's.
    if (a.topk_weights != 0)
      moeCopy(row + a.meta_at + 4 + 4 * (uint64_t)k, (const char*)a.topk_weights + 4 * i * k, 4 * (uint64_t)k, lane,
              kWarpSize);
    else
      for (uint32_t q = lane; q < k; q += kWarpSize) ((float*)(row + a.meta_at + 4 + 4 * (uint64_t)k))[q] = 0.0f;
  }
  __syncthreads();
  if (tid == 0) {
    if (share == 0) storeRelaxedSystem(moeWord(a.peer_buffer[s], moeCombineCount(r)), c);
    if (moeLastOf(moeWord(a.buffer, moeCombineSent(s)), seq, blocks))
      storeReleaseSystem(moeWord(a.peer_buffer[s], moeCombineFlag(r)), seq);
  }
  }
  if (!(a.phases & kMoeHalfReceive)) return;

  // Phase 2.
  __shared__ uint32_t arrived;
  __shared__ int32_t pos[kMoeMaxRanks];
  if (tid == 0) arrived = 1;
  __syncthreads();
  if (tid < n) {
    if (!spinUntil([&] { return loadAcquireSystem(moeWord(a.buffer, moeCombineFlag(tid))) >= seq; })) arrived = 0;
  }
  __syncthreads();
  if (!arrived) return;
  const uint32_t size = a.dtype == kDataTypeF32 ? 4u : 2u;
  const uint64_t elems = a.payload_bytes / size;
  // Whole rows 16 bytes at a time where the rows and the output allow it (the buffer's rows are
  // 16-byte aligned), else element by element; the same sums either way.
  const bool vec = ((a.payload_bytes | a.out_x) & 15) == 0;
  for (uint64_t t = blockIdx.x; t < a.tokens; t += gridDim.x) {
    // Tokens past the dispatch's have no positions of this call; rows a rank did not send back
    // are left out. Either is said in the status.
    const bool known = t < dispatched;
    if (tid < n) {
      const int32_t p = known ? positions[t * n + tid] : -1;
      const uint64_t sent = loadRelaxedSystem(moeWord(a.buffer, moeCombineCount(tid)));
      if (!known || (p >= 0 && (uint64_t)p >= sent)) moeFail(status, kMoeStatusCombineMissing);
      pos[tid] = p >= 0 && (uint64_t)p < sent ? p : -1;
    }
    __syncthreads();
    char* out = (char*)a.out_x + t * a.payload_bytes;
    if (vec) {
      for (uint64_t v = tid; v < a.payload_bytes / 16; v += blockDim.x) {
        float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        for (uint32_t d = 0; d < n; ++d) {
          if (pos[d] < 0) continue;
          const char* row = (const char*)(a.buffer + moeCombineRegion(a, d) + (uint64_t)pos[d] * a.row_bytes);
          moeAccumulate(a.dtype, row + v * 16, acc);
        }
        moeStoreVec(a.dtype, out + v * 16, acc);
      }
    } else {
      for (uint64_t el = tid; el < elems; el += blockDim.x) {
        float acc = 0.0f;
        for (uint32_t d = 0; d < n; ++d) {
          if (pos[d] < 0) continue;
          const char* row = (const char*)(a.buffer + moeCombineRegion(a, d) + (uint64_t)pos[d] * a.row_bytes);
          acc += moeLoad(a.dtype, row + el * size);
        }
        moeStore(a.dtype, out + el * size, acc);
      }
    }
    if (a.out_weights != 0) {
      for (uint32_t q = tid; q < k; q += blockDim.x) {
        float w = 0.0f;
        for (uint32_t d = 0; d < n; ++d) {
          if (pos[d] < 0) continue;
          const char* row = (const char*)(a.buffer + moeCombineRegion(a, d) + (uint64_t)pos[d] * a.row_bytes);
          w += ((const float*)(row + a.meta_at + 4 + 4 * (uint64_t)k))[q];
        }
        ((float*)a.out_weights)[t * k + q] = w;
      }
    }
    __syncthreads();
  }
  __syncthreads();
  if (tid == 0) {
    // The last block to finish reading tells every rank its rows here may be overwritten.
    if (moeLastOf(moeWord(a.buffer, moeCombineDone()), seq, gridDim.x)) {
      for (uint32_t d = 0; d < n; ++d) storeRelaxedSystem(moeWord(a.peer_buffer[d], moeCombineAck(r)), seq);
      *(volatile uint64_t*)moeWord(a.buffer, moeCombineSeq()) = seq;
    }
  }
}

}  // namespace mscclpp

// C++ names, not extern "C": profilers show `mscclpp::moe::dispatch(mscclpp::MoeArgs)`, and
// tools written for DeepEP find a dispatch and a combine kernel by `::dispatch` and `::combine`.
// The loader asks for the mangled names (collectives/src/moe/mod.rs).
namespace mscclpp {
namespace moe {
__global__ void layout(MoeLayoutArgs a) { moeLayout(a); }
__global__ void dispatch(MoeArgs a) { moeDispatch(a); }
__global__ void combine(MoeArgs a) { moeCombine(a); }
}  // namespace moe
}  // namespace mscclpp
