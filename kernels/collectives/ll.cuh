// The body of the LL modules (collectives/ll.cu: f32, f16, bf16, i32, u32; collectives/ll_wide.cu:
// f64, i64, u64, i8, u8, e4m3, e5m2): everything but the entry points, compiled by each with
// MSCCLPP_COLLECTIVE_WIDE set (collectives/dtypes.cuh), so that one source serves both and the
// base module's code is not touched by the wide types.
//
// The LL-packet algorithm of every collective (collectives/src/algorithms/ll/spec.md is the
// specification: the
// argument struct, the scratch layout, the flags and the rounds). Entry points: one per element
// type and operator for the reducing collectives (mscclpp_collective_ll_reduce_<type>_<op>), one
// for the copying ones (mscclpp_collective_ll_copy), so that each compiles only its own case. Vendor-neutral: the same text
// is compiled by NVRTC and by hipRTC (the module of collectives/src/algorithms/ll/module.rs, with
// the host kernels beside it).
//
// Work split, per round (flag f = base + 1 + k, half f % 2, piece k = bytes [k R, k R + R) of a
// rank's block, R = slot_bytes / 2): threads of the whole grid stride over
//   - sends of the same data to every peer (all-reduce, all-gather, broadcast): one item per
//     packet; the thread loads 8 input bytes once and stores the packet into every peer's slot;
//   - sends of different data per peer (reduce-scatter, all-to-all) and copying receives
//     (all-gather, all-to-all): one item per (peer, packet), peer-major, so that neighbouring
//     threads touch neighbouring packets;
//   - reducing receives: one item per packet; the thread combines the packets of every rank in
//     rank order (its own input in place of a packet at its own rank), so that every rank computes
//     bit-identical results.
// All-reduce's send and receive of packet i are the same thread's (the same stride), so that an
// in-place call reads each input word before it is overwritten.
// Between rounds the grid synchronises (only calls of more than one round): a rank then sends
// round k + 1 only after all its threads have read round k, which is what makes round k + 2
// reusing the half of round k safe whatever the grid shapes of the ranks. Broadcast's root,
// which reads nothing, waits instead for an acknowledgement packet of each round from every other
// rank: block b of that rank writes packet b of that rank's slot in the root's scratch (the
// round's half and flag) once all its threads have read the round (ranks launch the same grid).
//
// The flag counter: every thread reads it at its start (alongside its first input loads); after
// its first sends every block but block 0 counts itself in (a fire-and-forget add); block 0 waits
// for that count (while its first packets travel) and, once it has finished, stores the counter
// advanced by the number of rounds. No block waits
// for the others at the end, and no round trip to memory sits on the last block's path (the next
// call on the stream starts after every block has ended).
//
// The per-communicator state at `flag` (LL_STATE_BYTES in collectives/src/algorithms/ll/args.rs, zeroed at creation, never reset)
// holds the counter, the start count and the grid barrier, so that communicators sharing a device
// never share them.
#pragma once

// Waits give up on the communicator's abort word (LlCollectiveArgs::abort; mscclpp/core.cuh).
#define MSCCLPP_DEVICE_ABORT 1

#if !defined(MSCCLPP_COLLECTIVE_WIDE)
#error "define MSCCLPP_COLLECTIVE_WIDE (0: the base types, 1: the wide ones) before including collectives/ll.cuh"
#endif

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/device_syncer.cuh"
#include "mscclpp/memory_channel.cuh"  // Bytes16
#include "mscclpp/numeric.cuh"
#include "mscclpp/word.cuh"
#include "mscclpp/packet.cuh"
#include "collectives/args.cuh"
#include "collectives/args_check.h"
#include "collectives/dtypes.cuh"

namespace mscclpp {

// The per-communicator state the `flag` argument points at.
struct LlState {
  uint64_t counter;     // flag of the previous call's last round
  uint32_t started;     // blocks other than block 0 that have read the counter (block 0 resets it)
  uint32_t unused;
  DeviceSyncer syncer;  // between rounds
};
static_assert(sizeof(LlState) <= 64, "LlState must fit LL_STATE_BYTES (collectives/src/algorithms/ll/args.rs)");

// CollectiveKind codes (collectives/src/kind.rs).
constexpr uint32_t kCollAllReduce = 0;
constexpr uint32_t kCollAllGather = 1;
constexpr uint32_t kCollReduceScatter = 2;
constexpr uint32_t kCollBroadcast = 3;
constexpr uint32_t kCollAllToAll = 4;


template <typename T>
MSCCLPP_DEVICE_INLINE void copyUnits(char* dst, const char* src, uint64_t n, uint64_t tid, uint64_t nthreads) {
  T* d = (T*)dst;
  const T* s = (const T*)src;
  for (uint64_t i = tid; i < n; i += nthreads) d[i] = s[i];
}

// Copies `bytes` (a multiple of `esize`: 2 or 4 in the base module, 1, 2, 4 or 8 in the wide one) from `src` to `dst` (both aligned to `esize` at
// least) with the widest accesses their alignment allows.
MSCCLPP_DEVICE_INLINE void copyBytes(char* dst, const char* src, uint64_t bytes, uint32_t esize, uint64_t tid,
                                     uint64_t nthreads) {
  if (dst == src || bytes == 0) return;
  const uint64_t align = ((uint64_t)dst | (uint64_t)src) & 15;
  uint64_t main = 0;
  if (align == 0) {
    main = bytes & ~(uint64_t)15;
    copyUnits<Bytes16>(dst, src, main / 16, tid, nthreads);
  } else if ((align & 7) == 0) {
    main = bytes & ~(uint64_t)7;
    copyUnits<uint64_t>(dst, src, main / 8, tid, nthreads);
  } else if ((align & 3) == 0) {
    main = bytes & ~(uint64_t)3;
    copyUnits<uint32_t>(dst, src, main / 4, tid, nthreads);
  }
  // The rest (fewer than 16 bytes, or everything when only 2-byte aligned) in elements.
#if MSCCLPP_COLLECTIVE_WIDE
  if (esize >= 4) {
    copyUnits<uint32_t>(dst + main, src + main, (bytes - main) / 4, tid, nthreads);
  } else if (esize == 2) {
    copyUnits<uint16_t>(dst + main, src + main, (bytes - main) / 2, tid, nthreads);
  } else {
    copyUnits<uint8_t>(dst + main, src + main, bytes - main, tid, nthreads);
  }
#else
  if (esize == 4) {
    copyUnits<uint32_t>(dst + main, src + main, (bytes - main) / 4, tid, nthreads);
  } else {
    copyUnits<uint16_t>(dst + main, src + main, (bytes - main) / 2, tid, nthreads);
  }
#endif
}

// What every phase of a call shares.
struct LlCall {
  const char* input;
  char* output;
  uint64_t blockBytes;  // data bytes per peer (count * element size)
  uint64_t roundBytes;  // R
  uint64_t slotBytes;
  uint64_t halfBytes;  // MAX_RANKS * slot_bytes
  uint64_t scratch;    // this rank's scratch
  uint64_t base;       // flag counter at kernel start
  uint64_t rounds;
  uint32_t rank;
  uint32_t nranks;
  uint32_t tid;
  uint32_t nthreads;
  uint32_t esize;
};

// The packets of round `k`: flag, offset of the piece in the block, packets in it and bytes of
// data in it.
struct LlRound {
  uint64_t flag64;
  uint32_t flag;
  uint64_t half;  // byte offset of this round's half in a scratch buffer
  uint64_t pieceOff;
  uint32_t pieceBytes;
  uint32_t npackets;
};

MSCCLPP_DEVICE_INLINE LlRound llRound(const LlCall& c, uint64_t k) {
  LlRound r;
  r.flag64 = c.base + 1 + k;
  r.flag = (uint32_t)r.flag64;
  r.half = (r.flag64 & 1) * c.halfBytes;
  r.pieceOff = k * c.roundBytes;
  const uint64_t left = c.blockBytes - r.pieceOff;
  r.pieceBytes = (uint32_t)(left < c.roundBytes ? left : c.roundBytes);
  r.npackets = (r.pieceBytes + 7) / 8;
  return r;
}

// Once per call, after the first sends (every thread of the block has used, so read, the counter
// by then): a block other than block 0 counts itself in; block 0 waits until every other block has
// (so that it may advance the counter when it ends) and resets the count for the next call.
MSCCLPP_DEVICE_INLINE void countStarts(LlState* st, uint64_t k) {
  if (k != 0 || gridDim.x == 1) return;
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (blockIdx.x != 0) {
    addRelaxedDevice(&st->started, 1u);
  } else {
    spinUntil([&] { return loadRelaxedDevice(&st->started) == gridDim.x - 1; });
    storeRelaxedDevice(&st->started, 0u);
  }
}

// The `q`-th peer (q < nranks - 1) of `rank`, staggered so that ranks start on different peers.
MSCCLPP_DEVICE_INLINE uint32_t peerOf(uint32_t rank, uint32_t nranks, uint32_t q) {
  uint32_t p = rank + 1 + q;
  return p >= nranks ? p - nranks : p;
}

// Valid data bytes of packet `i` of a piece of `pieceBytes`.
MSCCLPP_DEVICE_INLINE uint32_t packetBytes(uint32_t pieceBytes, uint32_t i) {
  const uint32_t left = pieceBytes - 8 * i;
  return left < 8 ? left : 8;
}

// Strides over (peer index q < npeers, packet i < npackets), peer-major, without a division per
// item: `body(q, i)`.
template <typename Body>
MSCCLPP_DEVICE_INLINE void forPeerPackets(uint32_t npeers, uint32_t npackets, uint32_t tid, uint32_t nthreads,
                                          Body body) {
  if (npackets == 0) return;
  uint32_t q = tid / npackets;
  uint32_t i = tid - q * npackets;
  const uint32_t dq = nthreads / npackets;
  const uint32_t di = nthreads - dq * npackets;
  while (q < npeers) {
    body(q, i);
    i += di;
    q += dq;
    if (i >= npackets) {
      i -= npackets;
      ++q;
    }
  }
}

// Sends packet `i` of `piece` (the same data for every destination) to every peer.
MSCCLPP_DEVICE_INLINE void sendSame(const LlCollectiveArgs& a, const LlCall& c, const LlRound& r, const char* piece,
                                    uint32_t i) {
  const uint32_t n = packetBytes(r.pieceBytes, i);
  const uint64_t w = collLoadWord(piece + 8 * (uint64_t)i, n);
  const uint64_t off = r.half + c.rank * c.slotBytes + 16 * (uint64_t)i;
#pragma unroll 1
  for (uint32_t q = 0; q + 1 < c.nranks; ++q) {
    const uint32_t p = peerOf(c.rank, c.nranks, q);
    ((LL16Packet*)(a.peer_scratch[p] + off))->write(w, r.flag);
  }
}

// Sends piece `r` of input block `p` to every peer `p` (reduce-scatter, all-to-all).
MSCCLPP_DEVICE_INLINE void sendBlocks(const LlCollectiveArgs& a, const LlCall& c, const LlRound& r) {
  const uint64_t slotOff = r.half + c.rank * c.slotBytes;
  forPeerPackets(c.nranks - 1, r.npackets, c.tid, c.nthreads, [&](uint32_t q, uint32_t i) {
    const uint32_t p = peerOf(c.rank, c.nranks, q);
    const uint32_t n = packetBytes(r.pieceBytes, i);
    const uint64_t w = collLoadWord(c.input + p * c.blockBytes + r.pieceOff + 8 * (uint64_t)i, n);
    ((LL16Packet*)(a.peer_scratch[p] + slotOff + 16 * (uint64_t)i))->write(w, r.flag);
  });
}

// The reduction of packet `i` of round `r`: every rank's piece of block `ownBlock`.
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void reducePacket(const LlCall& c, const LlRound& r, const char* ownPiece, char* outPiece,
                                        uint32_t i) {
  const uint32_t n = packetBytes(r.pieceBytes, i);
  const uint64_t own = collLoadWord(ownPiece + 8 * (uint64_t)i, n);
  const char* slot0 = (const char*)(c.scratch + r.half + 16 * (uint64_t)i);
  Reducer<DTYPE, OP> acc;
  acc.load(c.rank == 0 ? own : ((const LL16Packet*)slot0)->read(r.flag));
#pragma unroll 1
  for (uint32_t p = 1; p < c.nranks; ++p) {
    acc.add(p == c.rank ? own : ((const LL16Packet*)(slot0 + p * c.slotBytes))->read(r.flag));
  }
  collStoreWord(outPiece + 8 * (uint64_t)i, acc.finish(c.nranks), n);
}

MSCCLPP_DEVICE_INLINE void betweenRounds(LlState* st, const LlCall& c, uint64_t k) {
  if (k + 1 < c.rounds) st->syncer.sync(gridDim.x);
}

// Round `r`'s reduction into the output: one item per packet.
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void reduceRound(const LlCall& c, const LlRound& r, const char* ownPiece, char* outPiece) {
  for (uint32_t i = c.tid; i < r.npackets; i += c.nthreads) reducePacket<DTYPE, OP>(c, r, ownPiece, outPiece, i);
}

// All-reduce (block = the whole buffer) and reduce-scatter (peer j gets block j of the input).
template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void llReduce(const LlCollectiveArgs& a, LlState* st, const LlCall& c, bool scatter) {
  const char* ownBlock = c.input + (scatter ? c.rank * c.blockBytes : 0);
  for (uint64_t k = 0; k < c.rounds; ++k) {
    const LlRound r = llRound(c, k);
    if (scatter) {
      sendBlocks(a, c, r);
    } else {
      // The same stride as the reduction below: in place, packet i's input word is read (here)
      // before the same thread overwrites it (there).
      for (uint32_t i = c.tid; i < r.npackets; i += c.nthreads) sendSame(a, c, r, c.input + r.pieceOff, i);
    }
    countStarts(st, k);
    const char* ownPiece = ownBlock + r.pieceOff;
    char* outPiece = c.output + r.pieceOff;
    reduceRound<DTYPE, OP>(c, r, ownPiece, outPiece);
    betweenRounds(st, c, k);
  }
}

// All-gather (everyone's block to everyone, into output block `source`), all-to-all (input block
// j to peer j, into output block `source`) and broadcast (the root's buffer to everyone).
MSCCLPP_DEVICE_INLINE void llCopy(const LlCollectiveArgs& a, LlState* st, const LlCall& c, uint32_t kind) {
  const bool toBlocks = kind != kCollBroadcast;  // received data goes to output block `source`
  const bool isRoot = c.rank == a.root;
  for (uint64_t k = 0; k < c.rounds; ++k) {
    const LlRound r = llRound(c, k);
    // Sends.
    if (kind == kCollAllToAll) {
      sendBlocks(a, c, r);
    } else if (kind == kCollAllGather || isRoot) {
      for (uint32_t i = c.tid; i < r.npackets; i += c.nthreads) sendSame(a, c, r, c.input + r.pieceOff, i);
    }
    countStarts(st, k);
    // The own contribution, once, while the first packets travel.
    if (k == 0) {
      if (kind == kCollAllGather) {
        copyBytes(c.output + c.rank * c.blockBytes, c.input, c.blockBytes, c.esize, c.tid, c.nthreads);
      } else if (kind == kCollAllToAll) {
        copyBytes(c.output + c.rank * c.blockBytes, c.input + c.rank * c.blockBytes, c.blockBytes, c.esize, c.tid,
                  c.nthreads);
      } else if (isRoot) {
        copyBytes(c.output, c.input, c.blockBytes, c.esize, c.tid, c.nthreads);
      }
    }
    // Receives.
    if (toBlocks) {
      forPeerPackets(c.nranks - 1, r.npackets, c.tid, c.nthreads, [&](uint32_t q, uint32_t i) {
        const uint32_t p = peerOf(c.rank, c.nranks, q);
        const uint64_t w = ((const LL16Packet*)(c.scratch + r.half + p * c.slotBytes + 16 * (uint64_t)i))->read(r.flag);
        collStoreWord(c.output + p * c.blockBytes + r.pieceOff + 8 * (uint64_t)i, w, packetBytes(r.pieceBytes, i));
      });
    } else if (!isRoot) {
      const char* slot = (const char*)(c.scratch + r.half + a.root * c.slotBytes);
      for (uint32_t i = c.tid; i < r.npackets; i += c.nthreads) {
        const uint64_t w = ((const LL16Packet*)(slot + 16 * (uint64_t)i))->read(r.flag);
        collStoreWord(c.output + r.pieceOff + 8 * (uint64_t)i, w, packetBytes(r.pieceBytes, i));
      }
    }
    if (kind == kCollBroadcast) {
      // Data flows only from the root, so nothing else would stop a rank from running two rounds
      // (or calls) ahead and overwriting a half that a peer still reads: every non-root
      // acknowledges each round to every peer once all its threads have read it (block b writes
      // an empty packet with the round's flag as packet b of its own slot in each peer's scratch;
      // the grid has at most one block per packet of a slot and at least one thread per peer),
      // and every rank waits for the acknowledgements of every other non-root.
      const uint64_t ackOff = r.half;
      if (!isRoot) {
        __syncthreads();
        if (threadIdx.x + 1 < c.nranks) {
          const uint32_t p = peerOf(c.rank, c.nranks, threadIdx.x);
          ((LL16Packet*)(a.peer_scratch[p] + ackOff + c.rank * c.slotBytes + 16 * (uint64_t)blockIdx.x))
              ->write(0, r.flag);
        }
      }
      for (uint32_t j = c.tid; j < (c.nranks - 1) * gridDim.x; j += c.nthreads) {
        const uint32_t p = peerOf(c.rank, c.nranks, j / gridDim.x);
        if (p == a.root) continue;
        ((const LL16Packet*)(c.scratch + ackOff + p * c.slotBytes + 16 * (uint64_t)(j % gridDim.x)))->read(r.flag);
      }
    }
    betweenRounds(st, c, k);
  }
}

// The body of every entry point: a reducing collective of DTYPE and OP (REDUCE), or a copying
// one. Launch with a one-dimensional grid whose blocks are all resident, the same arguments'
// kind, count, dtype, op, root and slot_bytes on every rank; a launch of the wrong entry point
// for its arguments traps.
template <bool REDUCE, uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void llEntry(const LlCollectiveArgs& a) {
  abortWordInit(a.abort);
  LlCall c;
  LlState* st = (LlState*)a.flag;
  c.base = st->counter;
  c.esize = collDataTypeSize(a.dtype);
  const bool reduces = a.kind == kCollAllReduce || a.kind == kCollReduceScatter;
  if (c.esize == 0 || a.nranks < 2 || a.nranks > kCollectiveMaxRanks || a.rank >= a.nranks ||
      a.kind > kCollAllToAll || (a.kind == kCollBroadcast && a.root >= a.nranks) || reduces != REDUCE ||
      (REDUCE && (a.dtype != DTYPE || a.op != OP))) {
    deviceTrap();
  }
  c.input = (const char*)a.input;
  c.output = (char*)a.output;
  c.blockBytes = a.count * c.esize;
  c.slotBytes = a.slot_bytes;
  c.roundBytes = a.slot_bytes / 8 * 8 / 2;
  c.halfBytes = kCollectiveMaxRanks * a.slot_bytes;
  c.scratch = a.scratch;
  c.rank = a.rank;
  c.nranks = a.nranks;
  c.tid = blockIdx.x * blockDim.x + threadIdx.x;
  c.nthreads = gridDim.x * blockDim.x;
  if (c.blockBytes == 0) {
    c.rounds = 0;
  } else {
    if (c.roundBytes == 0) deviceTrap();
    c.rounds = (c.blockBytes + c.roundBytes - 1) / c.roundBytes;
  }

  if (REDUCE) {
    llReduce<DTYPE, OP>(a, st, c, a.kind == kCollReduceScatter);
  } else {
    llCopy(a, st, c, a.kind);
  }

  // Every block has read the counter (countStarts) and every thread of block 0 has finished its
  // last round: advance the counter.
  if (c.rounds == 0) countStarts(st, 0);
  if (blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) st->counter = c.base + c.rounds;
  }
}

// ---- The short kernels (collectives/src/algorithms/ll_short/spec.md): one round, one packet per thread -------------
// All-reduce, reduce-scatter, all-gather and all-to-all of one round by the general kernel's
// protocol, with nothing else on the path: thread i sends packet i (of the input block of each
// peer for reduce-scatter and all-to-all) and receives packet i from every peer. NRANKS is 2
// (one peer, no loops over ranks) or 0 (any). Every instruction before the send is on the
// latency, so the input words are loaded before anything waits for the counter (the loads
// overlap) and, for two ranks, the argument checks follow the send (what each costs:
// docs/performance.md, "Figures formerly in code comments").

// Whether KIND sends each peer its own input block (reduce-scatter, all-to-all), and whether it
// copies what it receives (all-gather, all-to-all) rather than reducing it.
MSCCLPP_HOST_DEVICE_INLINE constexpr bool llShortPerPeer(uint32_t kind) {
  return kind == kCollReduceScatter || kind == kCollAllToAll;
}
MSCCLPP_HOST_DEVICE_INLINE constexpr bool llShortCopies(uint32_t kind) {
  return kind == kCollAllGather || kind == kCollAllToAll;
}

// The data bytes per rank block of a short call of KIND (the copying kinds: of the call's type).
template <uint32_t KIND, uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE uint64_t llShortBytes(const LlCollectiveArgs& a) {
  return a.count * (llShortCopies(KIND) ? collDataTypeSize(a.dtype) : collDataTypeSize(DTYPE));
}

// Whether `a` is what the short kernel of KIND (DTYPE and OP: reducing kinds) serves with this
// grid.
template <uint32_t KIND, uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE bool llShortArgsOk(const LlCollectiveArgs& a, uint64_t bytes) {
  return a.kind == KIND && (llShortCopies(KIND) || (a.dtype == DTYPE && a.op == OP)) && a.nranks >= 2 &&
         a.nranks <= kCollectiveMaxRanks && a.rank < a.nranks && bytes != 0 && bytes <= a.slot_bytes / 8 * 8 / 2 &&
         bytes >> 32 == 0 && (uint64_t)gridDim.x * blockDim.x * 8 >= bytes;
}

template <uint32_t KIND, uint32_t DTYPE, uint32_t OP, uint32_t NRANKS>
MSCCLPP_DEVICE_INLINE void llShortBody(const LlCollectiveArgs& a) {
  const uint32_t nranks = NRANKS ? NRANKS : a.nranks;
  const uint64_t bytes = llShortBytes<KIND, DTYPE>(a);
  const uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
  const bool mine = i < (bytes + 7) / 8;
  const uint32_t n = mine ? packetBytes((uint32_t)bytes, i) : 0;
  const char* input = (const char*)a.input;
  char* output = (char*)a.output;
  // Masked, so that the peer index stays inside the argument array whatever the (not yet
  // checked) rank. Arguments the host never passes (a rank of 2-7 with two ranks, a count past
  // one round) can still make the loads and the send fault before the checks trap: both end the
  // context with an error.
  const uint32_t rank = a.rank & (kCollectiveMaxRanks - 1);
  const uint32_t peer2 = rank ^ 1;  // the peer of two ranks
  // The own word (per-peer kinds: of the own input block) and, for two ranks of those, the
  // peer's word: both loads issued before the counter is used.
  const uint64_t own = mine ? collLoadWord(input + (llShortPerPeer(KIND) ? rank * bytes : 0) + 8 * (uint64_t)i, n) : 0;
  const uint64_t toPeer2 =
      llShortPerPeer(KIND) && NRANKS == 2 && mine ? collLoadWord(input + peer2 * bytes + 8 * (uint64_t)i, n) : own;
  LlState* st = (LlState*)a.flag;
  const uint64_t base = st->counter;
  if (NRANKS != 2 && !llShortArgsOk<KIND, DTYPE, OP>(a, bytes)) deviceTrap();
  const uint32_t flag = (uint32_t)(base + 1);
  const uint64_t half = ((base + 1) & 1) * kCollectiveMaxRanks * a.slot_bytes;
  if (mine) {
    const uint64_t off = half + rank * a.slot_bytes + 16 * (uint64_t)i;
    if (NRANKS == 2) {
      ((LL16Packet*)(a.peer_scratch[peer2] + off))->write(toPeer2, flag);
    } else {
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < nranks; ++q) {
        const uint32_t p = peerOf(rank, nranks, q);
        const uint64_t w = llShortPerPeer(KIND) ? collLoadWord(input + p * bytes + 8 * (uint64_t)i, n) : own;
        ((LL16Packet*)(a.peer_scratch[p] + off))->write(w, flag);
      }
    }
  }
  if (NRANKS == 2 && !llShortArgsOk<KIND, DTYPE, OP>(a, bytes)) deviceTrap();
  // After the send, which nothing but the argument loads may delay; before the first wait.
  abortWordInit(a.abort);
  countStarts(st, 0);
  if (mine) {
    const char* slot0 = (const char*)(a.scratch + half + 16 * (uint64_t)i);
    if (llShortCopies(KIND)) {
      // All-gather in place (input = output block rank) stores the word where it was.
      collStoreWord(output + rank * bytes + 8 * (uint64_t)i, own, n);
#pragma unroll 1
      for (uint32_t q = 0; q + 1 < nranks; ++q) {
        const uint32_t p = NRANKS == 2 ? peer2 : peerOf(rank, nranks, q);
        const uint64_t w = ((const LL16Packet*)(slot0 + p * a.slot_bytes))->read(flag);
        collStoreWord(output + p * bytes + 8 * (uint64_t)i, w, n);
      }
    } else {
      // In rank order, the own word in place of a packet at the own rank.
      Reducer<DTYPE, OP> acc;
      if (NRANKS == 2) {
        const uint64_t w = ((const LL16Packet*)(slot0 + peer2 * a.slot_bytes))->read(flag);
        acc.load(rank == 0 ? own : w);
        acc.add(rank == 0 ? w : own);
      } else {
        acc.load(rank == 0 ? own : ((const LL16Packet*)slot0)->read(flag));
#pragma unroll 1
        for (uint32_t p = 1; p < nranks; ++p) {
          acc.add(p == rank ? own : ((const LL16Packet*)(slot0 + p * a.slot_bytes))->read(flag));
        }
      }
      collStoreWord(output + 8 * (uint64_t)i, acc.finish(nranks), n);
    }
  }
  // Every block has read the counter (countStarts): block 0 advances it once all its threads
  // are done.
  if (blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) st->counter = base + 1;
  }
}

// Launch with a one-dimensional grid of resident blocks and at least one thread per packet of a
// rank block, for a call of KIND (DTYPE and OP for the reducing kinds) of at most one round;
// anything else traps.
template <uint32_t KIND, uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void llShort(const LlCollectiveArgs& a) {
  if (a.nranks == 2) {
    llShortBody<KIND, DTYPE, OP, 2>(a);
  } else {
    llShortBody<KIND, DTYPE, OP, 0>(a);
  }
}

// ---- LL128 lines (collectives/src/algorithms/ll128/spec.md): all-reduce of one round ---------
// Eight neighbouring threads (a group) own one 128-byte line: thread j < 7 of the group the data
// bytes [16 j, 16 j + 16) of the line's 120, thread 7 the last 8 and the flag word. A group writes
// a line with one 16-byte store per thread (one instruction) and reads it the same way, retrying
// until thread 7 sees the flag; the group agrees through a shuffle.

#if MSCCLPP_HAS_LL128
constexpr uint64_t kLl128LineBytes = 128;
constexpr uint64_t kLl128LineData = 120;

template <uint32_t DTYPE, uint32_t OP>
MSCCLPP_DEVICE_INLINE void ll128AllReduce(const LlCollectiveArgs& a, LlState* st, uint64_t base, uint64_t bytes) {
  const uint32_t flag = (uint32_t)(base + 1);
  // The LL128 halves follow the two LL halves: LL packets never lie where a line's data did (an
  // LL reader would take data words equal to its flag for a packet).
  const uint64_t half = (2 + ((base + 1) & 1)) * kCollectiveMaxRanks * a.slot_bytes;
  const uint64_t tid = (uint64_t)blockIdx.x * blockDim.x + threadIdx.x;
  const uint32_t lane = threadIdx.x & 7;
  const uint64_t groups = (uint64_t)gridDim.x * blockDim.x / 8;
  const uint64_t lines = (bytes + kLl128LineData - 1) / kLl128LineData;
  const char* input = (const char*)a.input;
  char* output = (char*)a.output;
  // This thread's piece of line L: data offset and valid bytes (0 past the end).
  auto piece = [&](uint64_t L, uint64_t& off) -> uint32_t {
    off = L * kLl128LineData + 16 * lane;
    const uint64_t cap = lane == 7 ? 8 : 16;
    if (off >= bytes) return 0;
    return (uint32_t)(bytes - off < cap ? bytes - off : cap);
  };
  // Sends: every line of this group, to every peer.
  for (uint64_t L = tid / 8; L < lines; L += groups) {
    uint64_t off;
    const uint32_t nb = piece(L, off);
    const uint64_t lo = nb ? collLoadWord(input + off, nb < 8 ? nb : 8) : 0;
    const uint64_t hi = nb > 8 ? collLoadWord(input + off + 8, nb - 8) : 0;
    const uint64_t dst = half + a.rank * a.slot_bytes + L * kLl128LineBytes + 16 * lane;
    // One store instruction for the whole group: lane 7's upper half is the flag word.
    const uint32_t z = lane == 7 ? flag : (uint32_t)hi;
    const uint32_t w = lane == 7 ? flag : (uint32_t)(hi >> 32);
#pragma unroll 1
    for (uint32_t q = 0; q + 1 < a.nranks; ++q) {
      const uint32_t p = peerOf(a.rank, a.nranks, q);
      storeVolatile16((void*)(a.peer_scratch[p] + dst), (uint32_t)lo, (uint32_t)(lo >> 32), z, w);
    }
  }
  countStarts(st, 0);
  // Receives: the lines of every rank, reduced in rank order (the own input in place of a line).
  for (uint64_t L = tid / 8; L < lines; L += groups) {
    uint64_t off;
    const uint32_t nb = piece(L, off);
    const uint64_t line = half + L * kLl128LineBytes + 16 * lane;
    Reducer<DTYPE, OP> rlo, rhi;
#pragma unroll 1
    for (uint32_t r = 0; r < a.nranks; ++r) {
      uint64_t lo, hi;
      if (r == a.rank) {
        lo = nb ? collLoadWord(input + off, nb < 8 ? nb : 8) : 0;
        hi = nb > 8 ? collLoadWord(input + off + 8, nb - 8) : 0;
      } else {
        const void* src = (const void*)(a.scratch + line + r * a.slot_bytes);
        uint32_t x, y, z, w;
        // The group gives up together (lane 7 decides), so that its shuffles stay together.
        spinUntil(
            [&] {
              loadVolatile16(src, x, y, z, w);
              const uint32_t mine = lane != 7 || (z == flag && w == flag);
              return shuffleInGroupOf8(mine, 7) != 0;
            },
            MSCCLPP_DEFAULT_MAX_SPIN, [](bool giveUp) { return shuffleInGroupOf8(giveUp, 7) != 0; });
        lo = (uint64_t)x | ((uint64_t)y << 32);
        hi = lane == 7 ? 0 : ((uint64_t)z | ((uint64_t)w << 32));
      }
      if (r == 0) {
        rlo.load(lo);
        rhi.load(hi);
      } else {
        rlo.add(lo);
        rhi.add(hi);
      }
    }
    if (nb) collStoreWord(output + off, rlo.finish(a.nranks), nb < 8 ? nb : 8);
    if (nb > 8) collStoreWord(output + off + 8, rhi.finish(a.nranks), nb - 8);
  }
}

template <uint32_t DTYPE>
MSCCLPP_DEVICE_INLINE void ll128AllReduceOp(const LlCollectiveArgs& a, LlState* st, uint64_t base, uint64_t bytes) {
  switch (a.op) {
    case kReduceSum: ll128AllReduce<DTYPE, kReduceSum>(a, st, base, bytes); break;
    case kReduceProd: ll128AllReduce<DTYPE, kReduceProd>(a, st, base, bytes); break;
    case kReduceMin: ll128AllReduce<DTYPE, kReduceMin>(a, st, base, bytes); break;
    case kReduceMax: ll128AllReduce<DTYPE, kReduceMax>(a, st, base, bytes); break;
    case kReduceAvg: ll128AllReduce<DTYPE, kReduceAvg>(a, st, base, bytes); break;
    default: deviceTrap();
  }
}

MSCCLPP_DEVICE_INLINE void ll128Entry(const LlCollectiveArgs& a) {
  abortWordInit(a.abort);
  LlState* st = (LlState*)a.flag;
  const uint64_t base = st->counter;
  const uint32_t esize = collDataTypeSize(a.dtype);
  const uint64_t bytes = a.count * esize;
  if (esize == 0 || a.nranks < 2 || a.nranks > kCollectiveMaxRanks || a.rank >= a.nranks ||
      a.kind != kCollAllReduce || bytes > a.slot_bytes / kLl128LineBytes * kLl128LineData || (blockDim.x & 7) != 0 ||
      (a.slot_bytes % kLl128LineBytes) != 0 || (a.scratch % kLl128LineBytes) != 0) {
    deviceTrap();
  }
  if (bytes == 0) {
    countStarts(st, 0);
    return;
  }
  switch (a.dtype) {
    // The module's types (collDataTypeSize refused the others above).
#if MSCCLPP_COLLECTIVE_WIDE
    case kDataTypeF64: ll128AllReduceOp<kDataTypeF64>(a, st, base, bytes); break;
    case kDataTypeI64: ll128AllReduceOp<kDataTypeI64>(a, st, base, bytes); break;
    case kDataTypeU64: ll128AllReduceOp<kDataTypeU64>(a, st, base, bytes); break;
    case kDataTypeI8: ll128AllReduceOp<kDataTypeI8>(a, st, base, bytes); break;
    case kDataTypeU8: ll128AllReduceOp<kDataTypeU8>(a, st, base, bytes); break;
    case kDataTypeF8E4M3: ll128AllReduceOp<kDataTypeF8E4M3>(a, st, base, bytes); break;
    default: ll128AllReduceOp<kDataTypeF8E5M2>(a, st, base, bytes); break;
#else
    case kDataTypeF32: ll128AllReduceOp<kDataTypeF32>(a, st, base, bytes); break;
    case kDataTypeF16: ll128AllReduceOp<kDataTypeF16>(a, st, base, bytes); break;
    case kDataTypeBF16: ll128AllReduceOp<kDataTypeBF16>(a, st, base, bytes); break;
    case kDataTypeI32: ll128AllReduceOp<kDataTypeI32>(a, st, base, bytes); break;
    default: ll128AllReduceOp<kDataTypeU32>(a, st, base, bytes); break;
#endif
  }
  // Every block has read the counter (countStarts) and every thread of block 0 is done: advance.
  if (blockIdx.x == 0) {
    __syncthreads();
    if (threadIdx.x == 0) st->counter = base + 1;
  }
}
#else
MSCCLPP_DEVICE_INLINE void ll128Entry(const LlCollectiveArgs&) { deviceTrap(); }
#endif

}  // namespace mscclpp
