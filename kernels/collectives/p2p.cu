// Point-to-point sends and receives (collectives/src/algorithms/p2p/spec.md is the
// specification: the argument struct, the scratch layout, the lanes, the rounds, the headers and
// the acknowledgements). One launch serves a group of sends and receives of one rank: block b is
// lane b % lanes of channel b / lanes (a peer and a direction), and runs that channel's
// operations in call order. Blocks never wait for each other, so a send to a peer and a receive
// from it in one group do not either. Vendor-neutral: the same text is compiled by NVRTC and by
// hipRTC (the module of collectives/src/algorithms/p2p/module.rs, with the host kernel beside it).
// Waits give up on the communicator's abort word (P2pArgs::abort; mscclpp/core.cuh).
#define MSCCLPP_DEVICE_ABORT 1
#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"
#include "mscclpp/packet.cuh"
#include "mscclpp/word.cuh"
#include "collectives/args.cuh"
#include "collectives/args_check.h"

namespace mscclpp {

// The layout (P2pArgs in collectives/src/algorithms/p2p/args.rs).
MSCCLPP_DEVICE_INLINE uint64_t p2pSendSeqOffset(uint32_t lanes, uint32_t peer, uint32_t lane) {
  return (uint64_t)(peer * lanes + lane) * 8;
}
MSCCLPP_DEVICE_INLINE uint64_t p2pRecvSeqOffset(uint32_t lanes, uint32_t peer, uint32_t lane) {
  return ((uint64_t)kCollectiveMaxRanks * lanes + peer * lanes + lane) * 8;
}
MSCCLPP_DEVICE_INLINE uint64_t p2pAckOffset(uint32_t lanes, uint32_t dst, uint32_t lane) {
  return (2ull * kCollectiveMaxRanks * lanes + dst * lanes + lane) * 8;
}
MSCCLPP_DEVICE_INLINE uint64_t p2pSlotOffset(uint32_t lanes, uint64_t slotBytes, uint32_t src, uint32_t lane,
                                             uint64_t half) {
  const uint64_t slots = (3ull * kCollectiveMaxRanks * lanes * 8 + 127) / 128 * 128;
  return slots + ((uint64_t)(src * lanes + lane) * 2 + half) * slotBytes;
}
MSCCLPP_DEVICE_INLINE uint32_t p2pLanesUsed(uint64_t bytes, uint64_t laneMin, uint32_t lanes) {
  const uint64_t m = laneMin ? laneMin : 1;
  const uint64_t u = (bytes + m - 1) / m;
  return u < 1 ? 1u : (u > lanes ? lanes : (uint32_t)u);
}
MSCCLPP_DEVICE_INLINE void p2pLanePart(uint64_t bytes, uint32_t used, uint32_t lane, uint64_t& off, uint64_t& part) {
  const uint64_t per = ((bytes + used - 1) / used + 15) / 16 * 16;
  off = (uint64_t)lane * per;
  if (off > bytes) off = bytes;
  part = bytes - off < per ? bytes - off : per;
}

// Sends `part` bytes at `src` (a message of `bytes`) on (peer, lane) from flag seq + 1 on; returns
// the rounds used.
MSCCLPP_DEVICE_INLINE uint64_t p2pSend(const P2pArgs& a, uint32_t peer, uint32_t lane, uint64_t seq, uint64_t bytes,
                                       const char* src, uint64_t part) {
  const uint64_t perRound = a.slot_bytes / 16;
  const uint64_t packets = 1 + (part + 7) / 8;
  const uint64_t rounds = (packets + perRound - 1) / perRound;
  const uint64_t* ack = (const uint64_t*)(a.scratch + p2pAckOffset(a.lanes, peer, lane));
  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t f = seq + 1 + k;
    if (f > 2) {
      // The receiver must have read the round that used this half before (flag f - 2).
      if (threadIdx.x == 0) spinUntil([&] { return loadAcquireSystem(ack) >= f - 2; });
      __syncthreads();
    }
    const uint64_t slot = a.peer_scratch[peer] + p2pSlotOffset(a.lanes, a.slot_bytes, a.rank, lane, f & 1);
    const uint64_t first = k * perRound;
    const uint64_t last = first + perRound < packets ? first + perRound : packets;
    for (uint64_t j = first + threadIdx.x; j < last; j += blockDim.x) {
      uint64_t v = bytes;
      if (j != 0) {
        const uint64_t at = 8 * (j - 1);
        v = loadWordBytes(src + at, part - at < 8 ? (uint32_t)(part - at) : 8u);
      }
      ((LL16Packet*)(slot + 16 * (j - first)))->write(v, (uint32_t)f);
    }
  }
  return rounds;
}

// Receives on (peer, lane) from flag seq + 1 on into `dst` (a buffer of `bytes`): the header says
// the sender's bytes, which decide the stream; returns the rounds used. A size that differs from
// the sender's is recorded in `*mismatch` (the stream is still consumed, so nobody hangs).
MSCCLPP_DEVICE_INLINE uint64_t p2pRecv(const P2pArgs& a, uint32_t peer, uint32_t lane, uint64_t seq, uint64_t bytes,
                                       char* dst, bool* mismatch) {
  __shared__ uint64_t sent;
  const uint64_t perRound = a.slot_bytes / 16;
  const uint64_t slot0 = a.scratch + p2pSlotOffset(a.lanes, a.slot_bytes, peer, lane, (seq + 1) & 1);
  if (threadIdx.x == 0) {
    uint64_t v = 0;
    // A header that never came (the wait gave up on the abort word): the expected size, so that
    // the rest stays bounded and is no mismatch.
    sent = ((const LL16Packet*)slot0)->waitRead((uint32_t)(seq + 1), v) ? v : bytes;
  }
  __syncthreads();
  const uint64_t s = sent;
  __syncthreads();  // `sent` may be rewritten by the next operation
  if (s != bytes) *mismatch = true;
  uint64_t off, part;
  p2pLanePart(s, p2pLanesUsed(s, a.lane_min_bytes, a.lanes), lane, off, part);
  const uint64_t packets = 1 + (part + 7) / 8;
  const uint64_t rounds = (packets + perRound - 1) / perRound;
  uint64_t* ack = (uint64_t*)(a.peer_scratch[peer] + p2pAckOffset(a.lanes, a.rank, lane));
  for (uint64_t k = 0; k < rounds; ++k) {
    const uint64_t f = seq + 1 + k;
    const uint64_t slot = a.scratch + p2pSlotOffset(a.lanes, a.slot_bytes, peer, lane, f & 1);
    const uint64_t first = k * perRound;
    const uint64_t last = first + perRound < packets ? first + perRound : packets;
    for (uint64_t j = (first == 0 ? 1 : first) + threadIdx.x; j < last; j += blockDim.x) {
      const uint64_t v = ((const LL16Packet*)(slot + 16 * (j - first)))->read((uint32_t)f);
      const uint64_t at = off + 8 * (j - 1);
      if (at < bytes) {
        uint64_t n = off + part - at;
        if (n > 8) n = 8;
        if (n > bytes - at) n = bytes - at;
        storeWordBytes(dst + at, v, (uint32_t)n);
      }
    }
    // Every thread has read the round: the sender may reuse its half.
    __syncthreads();
    if (threadIdx.x == 0) {
      fenceSystem();
      storeRelaxedSystem(ack, f);
    }
  }
  return rounds;
}

}  // namespace mscclpp

// Every send and receive of a group (collectives/src/algorithms/p2p/spec.md). Launch with
// nchannels * lanes blocks (all resident: a block waits for its peer's block) of any number of
// threads; a send and its receive must have the same size: a difference traps once the stream is
// consumed.
extern "C" __global__ void mscclpp_p2p(mscclpp::P2pArgs a) {
  mscclpp::abortWordInit(a.abort);
  const mscclpp::uint32_t lanes = a.lanes;
  if (lanes == 0 || a.nranks < 2 || a.nranks > mscclpp::kCollectiveMaxRanks || a.rank >= a.nranks ||
      a.nchannels > mscclpp::kP2pMaxChannels || a.slot_bytes < 32 || (a.slot_bytes & 15) != 0) {
    mscclpp::deviceTrap();
  }
  const mscclpp::uint32_t c = blockIdx.x / lanes;
  const mscclpp::uint32_t lane = blockIdx.x % lanes;
  if (c >= a.nchannels) return;
  const mscclpp::P2pChannel ch = a.channels[c];
  if (ch.peer >= a.nranks || ch.peer == a.rank || ch.first_op + ch.nops > mscclpp::kP2pMaxOps) mscclpp::deviceTrap();
  mscclpp::uint64_t* seqw =
      (mscclpp::uint64_t*)(a.scratch + (ch.send ? mscclpp::p2pSendSeqOffset(lanes, ch.peer, lane)
                                                : mscclpp::p2pRecvSeqOffset(lanes, ch.peer, lane)));
  mscclpp::uint64_t seq = *seqw;
  bool mismatch = false;
  for (mscclpp::uint32_t i = ch.first_op; i < ch.first_op + ch.nops; ++i) {
    const mscclpp::P2pOpDesc op = a.ops[i];
    const mscclpp::uint32_t used = mscclpp::p2pLanesUsed(op.bytes, a.lane_min_bytes, lanes);
    if (op.bytes == 0 || lane >= used) continue;
    if (ch.send) {
      mscclpp::uint64_t off, part;
      mscclpp::p2pLanePart(op.bytes, used, lane, off, part);
      seq += mscclpp::p2pSend(a, ch.peer, lane, seq, op.bytes, (const char*)op.addr + off, part);
    } else {
      seq += mscclpp::p2pRecv(a, ch.peer, lane, seq, op.bytes, (char*)op.addr, &mismatch);
    }
  }
  // Every thread has read the counter: advance it.
  __syncthreads();
  if (threadIdx.x == 0) *seqw = seq;
  if (mismatch) mscclpp::deviceTrap();
}
