// The body of the direct modules (collectives/direct.cu: f32, f16, bf16, i32, u32;
// collectives/direct_wide.cu: f64, i64, u64, i8, u8, e4m3, e5m2): everything but the entry
// points, compiled by each with MSCCLPP_COLLECTIVE_WIDE set (collectives/dtypes.cuh), so that one
// source serves both and the base module's code is not touched by the wide types.
//
// The direct algorithm of every collective, and the read algorithm of all-reduce (at the end of the
// file). collectives/src/algorithms/direct/spec.md and read/spec.md are the specification: the
// argument structs, the scratch layouts, the sequences, the steps and why three buffers suffice.
// Vendor-neutral: the same text is compiled by NVRTC and by hipRTC (the module of
// collectives/src/algorithms/direct/module.rs, with the host kernels beside it).
//
// Data moves in 16-byte units with plain stores into the peers' scratch; the threads of a block
// stride over the units of a piece. Blocks are independent: block b synchronises only with block
// b of the peers, through per-(phase, half, block, source) flag words, and keeps its own sequence
// counter at the start of its rank's scratch. There is no grid-wide barrier.
#pragma once

// Waits give up on the communicator's abort word (the argument structs' `abort`; mscclpp/core.cuh).
#define MSCCLPP_DEVICE_ABORT 1

#if !defined(MSCCLPP_COLLECTIVE_WIDE)
#error "define MSCCLPP_COLLECTIVE_WIDE (0: the base types, 1: the wide ones) before including collectives/direct.cuh"
#endif

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/memory_channel.cuh"  // Bytes16
#include "mscclpp/numeric.cuh"
#include "mscclpp/packet.cuh"
#include "mscclpp/word.cuh"
#include "collectives/args.cuh"
#include "collectives/args_check.h"
#include "collectives/dtypes.cuh"

namespace mscclpp {

// CollectiveKind codes (collectives/src/kind.rs) this kernel implements.
constexpr uint32_t kDirectAllReduce = 0;
constexpr uint32_t kDirectAllGather = 1;
constexpr uint32_t kDirectReduceScatter = 2;
constexpr uint32_t kDirectBroadcast = 3;
constexpr uint32_t kDirectAllToAll = 4;

// Slot and flag buffers per (phase, block): sequence q uses buffer q % 3.
constexpr uint32_t kDirectBuffers = 3;
MSCCLPP_DEVICE_INLINE uint32_t bufferOf(uint64_t seq) { return (uint32_t)(seq % kDirectBuffers); }

// 16 bytes as two words (the lower address in `lo`).
struct Unit {
  uint64_t lo;
  uint64_t hi;
};

// A whole unit at a 16-byte aligned address (scratch slots).
MSCCLPP_DEVICE_INLINE Unit loadUnitAligned(const char* p) {
  const Bytes16 v = *(const Bytes16*)p;
  Unit u;
  u.lo = (uint64_t)v.x | ((uint64_t)v.y << 32);
  u.hi = (uint64_t)v.z | ((uint64_t)v.w << 32);
  return u;
}
MSCCLPP_DEVICE_INLINE void storeUnitAligned(char* p, const Unit& u) {
  Bytes16 v;
  v.x = (uint32_t)u.lo;
  v.y = (uint32_t)(u.lo >> 32);
  v.z = (uint32_t)u.hi;
  v.w = (uint32_t)(u.hi >> 32);
  *(Bytes16*)p = v;
}

// The `nb` (1..16) valid bytes of a unit at `p` of a user buffer (any element alignment),
// zero-padded.
MSCCLPP_DEVICE_INLINE Unit loadUnit(const char* p, uint32_t nb) {
  if (nb == 16 && ((uint64_t)p & 15) == 0) return loadUnitAligned(p);
  Unit u;
  u.lo = collLoadWord(p, nb < 8 ? nb : 8);
  u.hi = nb > 8 ? collLoadWord(p + 8, nb - 8) : 0;
  return u;
}
MSCCLPP_DEVICE_INLINE void storeUnit(char* p, const Unit& u, uint32_t nb) {
  if (nb == 16 && ((uint64_t)p & 15) == 0) {
    storeUnitAligned(p, u);
    return;
  }
  collStoreWord(p, u.lo, nb < 8 ? nb : 8);
  if (nb > 8) collStoreWord(p + 8, u.hi, nb - 8);
}

// Valid bytes of unit `i` of a piece of `bytes`.
MSCCLPP_DEVICE_INLINE uint32_t unitBytes(uint64_t bytes, uint64_t i) {
  const uint64_t left = bytes - 16 * i;
  return left < 16 ? (uint32_t)left : 16u;
}

// The `q`-th peer (q < nranks - 1) of `rank`, staggered so that ranks start on different peers.
MSCCLPP_DEVICE_INLINE uint32_t directPeerOf(uint32_t rank, uint32_t nranks, uint32_t q) {
  uint32_t p = rank + 1 + q;
  return p >= nranks ? p - nranks : p;
}

// What every iteration of a block shares.
struct DirectCall {
  const char* input;
  char* output;
  uint64_t blockBytes;  // B
  uint64_t chunk;       // C
  uint64_t flagsOff;    // F
  uint64_t dataOff;     // D
  uint64_t slotBytes;   // S
  uint64_t scratch;     // this rank's scratch
  uint32_t maxBlocks;
  uint32_t block;
  uint32_t rank;
  uint32_t nranks;
};

MSCCLPP_DEVICE_INLINE uint64_t flagOffset(const DirectCall& c, uint32_t phase, uint32_t half, uint32_t src) {
  return c.flagsOff + ((((uint64_t)phase * kDirectBuffers + half) * c.maxBlocks + c.block) * kCollectiveMaxRanks + src) * 8;
}
MSCCLPP_DEVICE_INLINE uint64_t slotOffset(const DirectCall& c, uint32_t phase, uint32_t half, uint32_t src) {
  return c.dataOff + ((((uint64_t)c.block * 2 + phase) * kDirectBuffers + half) * c.nranks + src) * c.slotBytes;
}

// Every thread's stores of the block are done; one thread publishes `seq` to every peer.
MSCCLPP_DEVICE_INLINE void directSignal(const DirectCollectiveArgs& a, const DirectCall& c, uint32_t phase,
                                        uint32_t half, uint64_t seq) {
  __syncthreads();
  if (threadIdx.x == 0) {
    fenceSystem();
    const uint64_t off = flagOffset(c, phase, half, c.rank);
#pragma unroll 1
    for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
      const uint32_t p = directPeerOf(c.rank, c.nranks, q);
      storeRelaxedSystem((uint64_t*)(a.peer_scratch[p] + off), seq);
    }
  }
}

// Waits until every peer has signalled `seq` (or later) for (phase, half) of this block.
MSCCLPP_DEVICE_INLINE void directWait(const DirectCall& c, uint32_t phase, uint32_t half, uint64_t seq) {
  const uint32_t p = threadIdx.x;
  if (p < c.nranks && p != c.rank) {
    const uint64_t* f = (const uint64_t*)(c.scratch + flagOffset(c, phase, half, p));
    spinUntil([&] { return loadAcquireSystem(f) >= seq; });
  }
  __syncthreads();
}

// Sends `bytes` at `src` (a user buffer) into the slot at offset `slotOff` of peer `p`.
MSCCLPP_DEVICE_INLINE void pushPiece(const DirectCollectiveArgs& a, uint32_t p, uint64_t slotOff, const char* src,
                                     uint64_t bytes) {
  char* dst = (char*)(a.peer_scratch[p] + slotOff);
  const uint64_t units = (bytes + 15) / 16;
  for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
    storeUnitAligned(dst + 16 * i, loadUnit(src + 16 * i, unitBytes(bytes, i)));
  }
}

// Copies `bytes` from the own slot at `slotOff` into `dst` (a user buffer).
MSCCLPP_DEVICE_INLINE void pullPiece(const DirectCall& c, uint64_t slotOff, char* dst, uint64_t bytes) {
  const char* src = (const char*)(c.scratch + slotOff);
  const uint64_t units = (bytes + 15) / 16;
  for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
    storeUnit(dst + 16 * i, loadUnitAligned(src + 16 * i), unitBytes(bytes, i));
  }
}

// The reduction of `bytes`: every rank's data in rank order (this rank's from `own`, the others'
// from the own phase-0 slots at `slot0 + p * S`), into `out`; when `fwdOff` is not ~0, also into
// the slot at that offset of every peer (all-reduce's all-gather phase).
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void reducePiece(const DirectCollectiveArgs& a, const DirectCall& c, const char* own,
                                       uint64_t slot0, char* out, uint64_t fwdOff, uint64_t bytes) {
  const uint64_t units = (bytes + 15) / 16;
  for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
    const uint32_t nb = unitBytes(bytes, i);
    const Unit mine = loadUnit(own + 16 * i, nb);
    Reducer<DTYPE, OP> lo, hi;
    if (c.rank == 0) {
      lo.load(mine.lo);
      hi.load(mine.hi);
    } else {
      const Unit v = loadUnitAligned((const char*)(slot0 + 16 * i));
      lo.load(v.lo);
      hi.load(v.hi);
    }
#pragma unroll 1
    for (uint32_t p = 1; p < c.nranks; ++p) {
      if (p == c.rank) {
        lo.add(mine.lo);
        hi.add(mine.hi);
      } else {
        const Unit v = loadUnitAligned((const char*)(slot0 + p * c.slotBytes + 16 * i));
        lo.add(v.lo);
        hi.add(v.hi);
      }
    }
    Unit r;
    r.lo = lo.finish(c.nranks);
    r.hi = hi.finish(c.nranks);
    storeUnit(out + 16 * i, r, nb);
    if (fwdOff != ~(uint64_t)0) {
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
        const uint32_t p = directPeerOf(c.rank, c.nranks, q);
        storeUnitAligned((char*)(a.peer_scratch[p] + fwdOff + 16 * i), r);
      }
    }
  }
}

template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void reducePieceOp(const DirectCollectiveArgs& a, const DirectCall& c, const char* own,
                                         uint64_t slot0, char* out, uint64_t fwdOff, uint64_t bytes) {
  switch (a.op) {
    case kReduceSum: reducePiece<DTYPE, kReduceSum>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kReduceProd: reducePiece<DTYPE, kReduceProd>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kReduceMin: reducePiece<DTYPE, kReduceMin>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kReduceMax: reducePiece<DTYPE, kReduceMax>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kReduceAvg: reducePiece<DTYPE, kReduceAvg>(a, c, own, slot0, out, fwdOff, bytes); break;
    default: deviceTrap();
  }
}

MSCCLPP_DEVICE_INLINE void reducePieceAny(const DirectCollectiveArgs& a, const DirectCall& c, const char* own,
                                          uint64_t slot0, char* out, uint64_t fwdOff, uint64_t bytes) {
  switch (a.dtype) {
    // The module's types (collDataTypeSize refused the others at entry).
#if MSCCLPP_COLLECTIVE_WIDE
    case kDataTypeF64: reducePieceOp<kDataTypeF64>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeI64: reducePieceOp<kDataTypeI64>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeU64: reducePieceOp<kDataTypeU64>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeI8: reducePieceOp<kDataTypeI8>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeU8: reducePieceOp<kDataTypeU8>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeF8E4M3: reducePieceOp<kDataTypeF8E4M3>(a, c, own, slot0, out, fwdOff, bytes); break;
    default: reducePieceOp<kDataTypeF8E5M2>(a, c, own, slot0, out, fwdOff, bytes); break;
#else
    case kDataTypeF32: reducePieceOp<kDataTypeF32>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeF16: reducePieceOp<kDataTypeF16>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeBF16: reducePieceOp<kDataTypeBF16>(a, c, own, slot0, out, fwdOff, bytes); break;
    case kDataTypeI32: reducePieceOp<kDataTypeI32>(a, c, own, slot0, out, fwdOff, bytes); break;
    default: reducePieceOp<kDataTypeU32>(a, c, own, slot0, out, fwdOff, bytes); break;
#endif
  }
}

// All-reduce step `s`: its offset, bytes and piece size.
struct ArStep {
  uint64_t off;
  uint64_t len;
  uint64_t piece;
};
MSCCLPP_DEVICE_INLINE ArStep arStep(const DirectCall& c, uint64_t s) {
  ArStep t;
  const uint64_t stepBytes = c.nranks * c.chunk;
  t.off = s * stepBytes;
  const uint64_t left = c.blockBytes - t.off;
  t.len = left < stepBytes ? left : stepBytes;
  const uint64_t even = ((t.len + c.nranks - 1) / c.nranks + 15) / 16 * 16;
  t.piece = even < c.chunk ? even : c.chunk;
  return t;
}
// Bytes of piece `j` of a step.
MSCCLPP_DEVICE_INLINE uint64_t pieceBytes(const ArStep& t, uint32_t j) {
  const uint64_t start = j * t.piece;
  if (start >= t.len) return 0;
  const uint64_t left = t.len - start;
  return left < t.piece ? left : t.piece;
}

// All-reduce phase 0 of step `s`: piece j of the input to peer j; then the signal.
MSCCLPP_DEVICE_INLINE void arPush(const DirectCollectiveArgs& a, const DirectCall& c, uint64_t s, uint64_t seq) {
  const ArStep t = arStep(c, s);
  const uint32_t h = bufferOf(seq);
  const uint64_t slotOff = slotOffset(c, 0, h, c.rank);
#pragma unroll 1
  for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
    const uint32_t p = directPeerOf(c.rank, c.nranks, q);
    pushPiece(a, p, slotOff, c.input + t.off + p * t.piece, pieceBytes(t, p));
  }
  directSignal(a, c, 0, h, seq);
}

MSCCLPP_DEVICE_INLINE void allReduce(const DirectCollectiveArgs& a, const DirectCall& c, uint64_t base,
                                     uint64_t iters) {
  const uint64_t G = gridDim.x;
  for (uint64_t k = 0; k < iters; ++k) {
    const uint64_t s = c.block + k * G;
    const uint64_t seq = base + 1 + k;
    const uint32_t h = bufferOf(seq);
    const ArStep t = arStep(c, s);
    if (k == 0) arPush(a, c, s, seq);
    directWait(c, 0, h, seq);
    // The own piece: reduced into the output and forwarded into every peer's phase-1 slot.
    const uint64_t own = t.off + c.rank * t.piece;
    reducePieceAny(a, c, c.input + own, c.scratch + slotOffset(c, 0, h, 0), c.output + own,
                   slotOffset(c, 1, h, c.rank), pieceBytes(t, c.rank));
    directSignal(a, c, 1, h, seq);
    // Look-ahead: the next step's phase 0 travels during this step's last handshake.
    if (k + 1 < iters) arPush(a, c, s + G, seq + 1);
    directWait(c, 1, h, seq);
#pragma unroll 1
    for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
      const uint32_t p = directPeerOf(c.rank, c.nranks, q);
      pullPiece(c, slotOffset(c, 1, h, p), c.output + t.off + p * t.piece, pieceBytes(t, p));
    }
  }
}

// Bytes of step `s` of a rank block (all-gather, reduce-scatter, broadcast, all-to-all).
MSCCLPP_DEVICE_INLINE uint64_t stepLen(const DirectCall& c, uint64_t s) {
  const uint64_t off = s * c.chunk;
  const uint64_t left = c.blockBytes - off;
  return left < c.chunk ? left : c.chunk;
}

// Phase 0 of step `s` with sequence `seq` for the one-phase kinds: this rank's data into the
// peers' slots (and its own part of the output), then the signal (every rank signals, even one
// that sent nothing: the signal also says "I have consumed what you sent two sequences ago").
MSCCLPP_DEVICE_INLINE void onePhasePush(const DirectCollectiveArgs& a, const DirectCall& c, uint32_t kind, uint64_t s,
                                        uint64_t seq) {
  const uint32_t h = bufferOf(seq);
  const uint64_t off = s * c.chunk;
  const uint64_t len = stepLen(c, s);
  const uint64_t slotOff = slotOffset(c, 0, h, c.rank);
  if (kind == kDirectAllGather || (kind == kDirectBroadcast && c.rank == a.root)) {
    // The same data to every peer, and into the own output.
    char* ownOut = kind == kDirectAllGather ? c.output + c.rank * c.blockBytes : c.output;
    const bool inPlace = ownOut == c.input;
    const uint64_t units = (len + 15) / 16;
    for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
      const uint32_t nb = unitBytes(len, i);
      const Unit v = loadUnit(c.input + off + 16 * i, nb);
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
        const uint32_t p = directPeerOf(c.rank, c.nranks, q);
        storeUnitAligned((char*)(a.peer_scratch[p] + slotOff + 16 * i), v);
      }
      if (!inPlace) storeUnit(ownOut + off + 16 * i, v, nb);
    }
  } else if (kind == kDirectReduceScatter || kind == kDirectAllToAll) {
    // Block p of the input to peer p.
#pragma unroll 1
    for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
      const uint32_t p = directPeerOf(c.rank, c.nranks, q);
      pushPiece(a, p, slotOff, c.input + p * c.blockBytes + off, len);
    }
    if (kind == kDirectAllToAll) {
      const char* src = c.input + c.rank * c.blockBytes + off;
      char* dst = c.output + c.rank * c.blockBytes + off;
      const uint64_t units = (len + 15) / 16;
      for (uint64_t i = threadIdx.x; i < units; i += blockDim.x) {
        const uint32_t nb = unitBytes(len, i);
        storeUnit(dst + 16 * i, loadUnit(src + 16 * i, nb), nb);
      }
    }
  }
  directSignal(a, c, 0, h, seq);
}

// All-gather, reduce-scatter, broadcast and all-to-all: iteration k pushes step k + 1 ahead (into
// the third buffer) before consuming step k, so that the links stay busy while it consumes.
MSCCLPP_DEVICE_INLINE void onePhase(const DirectCollectiveArgs& a, const DirectCall& c, uint32_t kind, uint64_t base,
                                    uint64_t iters) {
  const uint64_t G = gridDim.x;
  for (uint64_t k = 0; k < iters; ++k) {
    const uint64_t s = c.block + k * G;
    const uint64_t seq = base + 1 + k;
    const uint32_t h = bufferOf(seq);
    if (k == 0) onePhasePush(a, c, kind, s, seq);
    directWait(c, 0, h, seq);
    if (k + 1 < iters) onePhasePush(a, c, kind, s + G, seq + 1);
    const uint64_t off = s * c.chunk;
    const uint64_t len = stepLen(c, s);
    if (kind == kDirectReduceScatter) {
      reducePieceAny(a, c, c.input + c.rank * c.blockBytes + off, c.scratch + slotOffset(c, 0, h, 0), c.output + off,
                     ~(uint64_t)0, len);
    } else if (kind == kDirectBroadcast) {
      if (c.rank != a.root) pullPiece(c, slotOffset(c, 0, h, a.root), c.output + off, len);
    } else {
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
        const uint32_t p = directPeerOf(c.rank, c.nranks, q);
        pullPiece(c, slotOffset(c, 0, h, p), c.output + p * c.blockBytes + off, len);
      }
    }
  }
}

}  // namespace mscclpp

// ---------------------------------------------------------------------------------------------
// The read algorithm of all-reduce (collectives/src/algorithms/read/spec.md): every rank reads
// the peers' inputs where they lie (a registered window, or the peer's staging area) and reduces
// locally. A thread keeps its results in registers until every peer has said it finished reading
// this rank's input, then stores them: that makes in-place calls safe and lets the caller reuse
// the input as soon as the call ends. Block b only ever waits for block b of the peers.

namespace mscclpp {

constexpr uint32_t kReadMaxUnits = 4;  // ReadCollectiveArgs::MAX_UNITS_PER_THREAD (read/args.rs)
constexpr uint32_t kReadKeyOffsetBits = 48;
constexpr uint64_t kReadMaxWindows = 256;

struct ReadCall {
  uint64_t bytes;      // B
  uint64_t first;      // first unit of this block
  uint64_t units;      // units of this block
  uint32_t perThread;  // units per thread, <= kReadMaxUnits
  uint32_t nranks;
};

// Where rank `p`'s input (`bytes`) is, in this rank's address space, for the key it sent; traps
// when the key names no window or runs past it (ranks called with different counts).
MSCCLPP_DEVICE_INLINE uint64_t readSource(const ReadCollectiveArgs& a, uint32_t p, uint64_t key, uint64_t bytes) {
  const uint64_t w = key >> kReadKeyOffsetBits;
  const uint64_t off = key & ((1ull << kReadKeyOffsetBits) - 1);
  if (w >= kReadMaxWindows) deviceTrap();
  const uint64_t* table = (const uint64_t*)a.table;
  const uint64_t base = table[w * kCollectiveMaxRanks + p];
  const uint64_t len = table[(kReadMaxWindows + w) * kCollectiveMaxRanks + p];
  if (base == 0 || off > len || bytes > len - off) deviceTrap();
  return base + off;
}

// Loads this thread's units of the input at `src` (units past the block's end read as zero).
MSCCLPP_DEVICE_INLINE void readUnits(const ReadCall& c, const char* src, Unit (&v)[kReadMaxUnits]) {
#pragma unroll
  for (uint32_t j = 0; j < kReadMaxUnits; ++j) {
    const uint64_t u = threadIdx.x + (uint64_t)j * blockDim.x;
    v[j].lo = 0;
    v[j].hi = 0;
    if (j < c.perThread && u < c.units) {
      const uint64_t g = c.first + u;
      v[j] = loadUnit(src + 16 * g, unitBytes(c.bytes, g));
    }
  }
}

// The reduction, in rank order, of this thread's units of every rank's input (`srcs`); the loads
// of rank p + 1 are issued before rank p's are combined, so that two ranks' loads are in flight.
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void readReduce(const ReadCall& c, const uint64_t* srcs, Unit (&res)[kReadMaxUnits]) {
  Reducer<DTYPE, OP> lo[kReadMaxUnits], hi[kReadMaxUnits];
  Unit v[kReadMaxUnits];
  readUnits(c, (const char*)srcs[0], v);
#pragma unroll
  for (uint32_t j = 0; j < kReadMaxUnits; ++j) {
    lo[j].load(v[j].lo);
    hi[j].load(v[j].hi);
  }
#pragma unroll 1
  for (uint32_t p = 1; p < c.nranks; ++p) {
    readUnits(c, (const char*)srcs[p], v);
#pragma unroll
    for (uint32_t j = 0; j < kReadMaxUnits; ++j) {
      lo[j].add(v[j].lo);
      hi[j].add(v[j].hi);
    }
  }
#pragma unroll
  for (uint32_t j = 0; j < kReadMaxUnits; ++j) {
    res[j].lo = lo[j].finish(c.nranks);
    res[j].hi = hi[j].finish(c.nranks);
  }
}

template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void readReduceOp(uint32_t op, const ReadCall& c, const uint64_t* srcs,
                                        Unit (&res)[kReadMaxUnits]) {
  switch (op) {
    case kReduceSum: readReduce<DTYPE, kReduceSum>(c, srcs, res); break;
    case kReduceProd: readReduce<DTYPE, kReduceProd>(c, srcs, res); break;
    case kReduceMin: readReduce<DTYPE, kReduceMin>(c, srcs, res); break;
    case kReduceMax: readReduce<DTYPE, kReduceMax>(c, srcs, res); break;
    case kReduceAvg: readReduce<DTYPE, kReduceAvg>(c, srcs, res); break;
    default: deviceTrap();
  }
}

// One block's call.
MSCCLPP_DEVICE_INLINE void readAllReduce(const ReadCollectiveArgs& a) {
  abortWordInit(a.abort);
  const uint32_t esize = collDataTypeSize(a.dtype);
  if (esize == 0 || a.nranks < 2 || a.nranks > kCollectiveMaxRanks || a.rank >= a.nranks ||
      gridDim.x > a.max_blocks || blockDim.x < a.nranks || (a.scratch & 127) != 0) {
    deviceTrap();
  }
  ReadCall c;
  c.bytes = a.count * esize;
  c.nranks = a.nranks;
  const uint64_t allUnits = (c.bytes + 15) / 16;
  const uint64_t per = (allUnits + gridDim.x - 1) / gridDim.x;
  c.first = blockIdx.x * per;
  c.units = c.first < allUnits ? (allUnits - c.first < per ? allUnits - c.first : per) : 0;
  c.perThread = (uint32_t)((per + blockDim.x - 1) / blockDim.x);
  if (c.perThread > kReadMaxUnits) deviceTrap();
  const uint64_t packetsOff = (8ull * a.max_blocks + 127) / 128 * 128;
  const uint64_t doneOff = packetsOff + 16ull * kCollectiveMaxRanks * a.max_blocks;
  const uint64_t stagingOff = packetsOff + 32ull * kCollectiveMaxRanks * a.max_blocks;
  const uint64_t slot = 16ull * ((uint64_t)blockIdx.x * kCollectiveMaxRanks + a.rank);
  uint64_t* seq = (uint64_t*)(a.scratch + 8ull * blockIdx.x);
  const uint64_t q = *seq + 1;
  const uint32_t flag = (uint32_t)q;
  const char* input = (const char*)a.input;

  // 1. A staged input: this block's units into the staging area, visible before the start packet.
  if ((a.in_key >> kReadKeyOffsetBits) == 0) {
    if (c.bytes > a.staging_bytes || (a.in_key & ((1ull << kReadKeyOffsetBits) - 1)) != 0) deviceTrap();
    char* staging = (char*)(a.scratch + stagingOff);
    for (uint64_t u = threadIdx.x; u < c.units; u += blockDim.x) {
      const uint64_t g = c.first + u;
      const uint32_t nb = unitBytes(c.bytes, g);
      storeUnit(staging + 16 * g, loadUnit(input + 16 * g, nb), nb);
    }
    __syncthreads();
    if (threadIdx.x == 0) fenceSystem();
    __syncthreads();
  }
  // 2-3. Start packets out, the peers' in: where each rank's input is.
  __shared__ uint64_t srcs[kCollectiveMaxRanks];
  if (threadIdx.x + 1 < a.nranks) {
    const uint32_t p = directPeerOf(a.rank, a.nranks, threadIdx.x);
    ((LL16Packet*)(a.peer_scratch[p] + packetsOff + slot))->write(a.in_key, flag);
    uint64_t key = 0;
    // A wait that gave up on the abort word has no key: the own input stands in (garbage results,
    // but no trap on a key that names nothing).
    srcs[p] = ((const LL16Packet*)(a.scratch + packetsOff + 16ull * ((uint64_t)blockIdx.x * kCollectiveMaxRanks + p)))
                      ->waitRead(flag, key)
                  ? readSource(a, p, key, c.bytes)
                  : a.input;
  }
  if (threadIdx.x == 0) srcs[a.rank] = a.input;
  __syncthreads();

  // 4. Reduce into registers.
  Unit res[kReadMaxUnits];
  switch (a.dtype) {
    // The module's types (collDataTypeSize refused the others at entry).
#if MSCCLPP_COLLECTIVE_WIDE
    case kDataTypeF64: readReduceOp<kDataTypeF64>(a.op, c, srcs, res); break;
    case kDataTypeI64: readReduceOp<kDataTypeI64>(a.op, c, srcs, res); break;
    case kDataTypeU64: readReduceOp<kDataTypeU64>(a.op, c, srcs, res); break;
    case kDataTypeI8: readReduceOp<kDataTypeI8>(a.op, c, srcs, res); break;
    case kDataTypeU8: readReduceOp<kDataTypeU8>(a.op, c, srcs, res); break;
    case kDataTypeF8E4M3: readReduceOp<kDataTypeF8E4M3>(a.op, c, srcs, res); break;
    default: readReduceOp<kDataTypeF8E5M2>(a.op, c, srcs, res); break;
#else
    case kDataTypeF32: readReduceOp<kDataTypeF32>(a.op, c, srcs, res); break;
    case kDataTypeF16: readReduceOp<kDataTypeF16>(a.op, c, srcs, res); break;
    case kDataTypeBF16: readReduceOp<kDataTypeBF16>(a.op, c, srcs, res); break;
    case kDataTypeI32: readReduceOp<kDataTypeI32>(a.op, c, srcs, res); break;
    default: readReduceOp<kDataTypeU32>(a.op, c, srcs, res); break;
#endif
  }

  // 5. Every load of the block is done: tell the peers, and wait until they have said the same.
  __syncthreads();
  if (threadIdx.x == 0) fenceSystem();
  __syncthreads();
  if (threadIdx.x + 1 < a.nranks) {
    const uint32_t p = directPeerOf(a.rank, a.nranks, threadIdx.x);
    ((LL16Packet*)(a.peer_scratch[p] + doneOff + slot))->write(0, flag);
    ((const LL16Packet*)(a.scratch + doneOff + 16ull * ((uint64_t)blockIdx.x * kCollectiveMaxRanks + p)))->read(flag);
  }
  __syncthreads();

  // 6. The results, then the counter (every thread has read it by now).
  char* output = (char*)a.output;
#pragma unroll
  for (uint32_t j = 0; j < kReadMaxUnits; ++j) {
    const uint64_t u = threadIdx.x + (uint64_t)j * blockDim.x;
    if (j < c.perThread && u < c.units) {
      const uint64_t g = c.first + u;
      storeUnit(output + 16 * g, res[j], unitBytes(c.bytes, g));
    }
  }
  if (threadIdx.x == 0) *seq = q;
}

}  // namespace mscclpp
