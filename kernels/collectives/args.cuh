// Argument structs of the collective kernels (collectives/src/algorithms/{ll,direct,read,p2p}/args.rs:
// LlCollectiveArgs, DirectCollectiveArgs, ReadCollectiveArgs, P2pArgs; collectives/src/scale.rs:
// ScaleArgs; collectives/src/moe/args.rs: MoeLayoutArgs, MoeArgs; checked against them by
// collectives/args_check.h). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"

namespace mscclpp {

// The structs of the kernels that wait on peers end with `abort`: the device address of the
// communicator's abort word (0: none), which the kernels hand to abortWordInit (mscclpp/core.cuh).

// mscclpp_collective_ll_*: every collective through LL packets in scratch buffers
// (collectives/src/algorithms/ll/spec.md documents the algorithm and the scratch layout).
constexpr uint32_t kCollectiveMaxRanks = 8;
struct LlCollectiveArgs {
  uint64_t input;
  uint64_t output;
  uint64_t count;
  uint64_t flag;
  uint64_t scratch;
  uint64_t slot_bytes;
  uint64_t peer_scratch[kCollectiveMaxRanks];
  uint32_t kind;
  uint32_t dtype;
  uint32_t op;
  uint32_t rank;
  uint32_t nranks;
  uint32_t root;
  uint64_t abort;
};

// mscclpp_collective_direct: all-reduce, all-gather and reduce-scatter through plain stores into
// the peers' scratch, pipelined in steps (collectives/src/algorithms/direct/spec.md documents the
// protocol and the scratch layout).
struct DirectCollectiveArgs {
  uint64_t input;
  uint64_t output;
  uint64_t count;
  uint64_t scratch;
  uint64_t slot_bytes;
  uint64_t chunk_bytes;
  uint64_t peer_scratch[kCollectiveMaxRanks];
  uint32_t kind;
  uint32_t dtype;
  uint32_t op;
  uint32_t rank;
  uint32_t nranks;
  uint32_t root;
  uint32_t max_blocks;
  uint32_t _pad;
  uint64_t abort;
};

// Arguments of mscclpp_collective_read_allreduce: every rank reads the peers' inputs where they
// lie and reduces locally (collectives/src/algorithms/read/spec.md documents the protocol, the
// windows and the scratch layout).
struct ReadCollectiveArgs {
  uint64_t input;
  uint64_t output;
  uint64_t count;
  uint64_t scratch;
  uint64_t table;
  uint64_t in_key;
  uint64_t staging_bytes;
  uint64_t peer_scratch[kCollectiveMaxRanks];
  uint32_t dtype;
  uint32_t op;
  uint32_t rank;
  uint32_t nranks;
  uint32_t max_blocks;
  uint32_t _pad;
  uint64_t abort;
};

// Arguments of mscclpp_p2p: a group's sends and receives of one rank through LL packets in the
// peers' point-to-point scratch (collectives/src/algorithms/p2p/spec.md documents the protocol
// and the scratch layout).
constexpr uint32_t kP2pMaxOps = 64;
constexpr uint32_t kP2pMaxChannels = 2 * kCollectiveMaxRanks;
struct P2pChannel {
  uint32_t peer;
  uint32_t send;
  uint32_t first_op;
  uint32_t nops;
};
struct P2pOpDesc {
  uint64_t addr;
  uint64_t bytes;
};
struct P2pArgs {
  uint64_t scratch;
  uint64_t slot_bytes;
  uint64_t lane_min_bytes;
  uint64_t peer_scratch[kCollectiveMaxRanks];
  uint32_t rank;
  uint32_t nranks;
  uint32_t lanes;
  uint32_t nchannels;
  P2pChannel channels[kP2pMaxChannels];
  P2pOpDesc ops[kP2pMaxOps];
  uint64_t abort;
};

// Arguments of mscclpp_collective_scale: `count` elements of type `dtype` at `data` multiplied in
// place by a factor read from `scalar` (device memory) when it is not 0, else `imm` (the
// element's bits, zero-extended).
struct ScaleArgs {
  uint64_t data;
  uint64_t count;
  uint64_t scalar;
  uint64_t imm;
  uint32_t dtype;
  uint32_t _pad;
  uint64_t src;
};

// mscclpp::moe::layout (collectives/src/moe/args.rs: MoeLayoutArgs).
struct MoeLayoutArgs {
  uint64_t topk_idx;
  uint64_t tokens;
  uint64_t per_rank;
  uint64_t per_expert;
  uint64_t in_rank;
  uint64_t status;
  uint32_t topk;
  uint32_t num_experts;
  uint32_t nranks;
  uint32_t _pad;
};

// mscclpp::moe::dispatch and mscclpp::moe::combine (collectives/src/moe/args.rs: MoeArgs;
// collectives/src/moe/spec.md). An exchange serves more ranks than the collectives (MoE layers
// span hosts of 8 GPUs each: DeepEP's internode tests take 16 and more).
constexpr uint32_t kMoeMaxRanks = 32;
struct MoeArgs {
  uint64_t buffer;
  uint64_t peer_buffer[kMoeMaxRanks];
  // Where this rank's dispatch rows (combine rows) for rank d go: its region in d's buffer, or in
  // the compact mirror of d's buffer where d is on another host.
  uint64_t peer_dispatch[kMoeMaxRanks];
  uint64_t peer_combine[kMoeMaxRanks];
  uint64_t max_tokens;
  uint64_t row_bytes;
  uint64_t scales_at;
  uint64_t meta_at;
  uint64_t tokens;
  uint64_t payload_bytes;
  uint64_t scale_bytes;
  uint64_t x;
  uint64_t topk_idx;
  uint64_t topk_weights;
  uint64_t scales;
  uint64_t out_x;
  uint64_t out_idx;
  uint64_t out_weights;
  uint64_t out_scales;
  uint64_t out_src;
  uint64_t out_capacity;
  uint64_t handle;
  uint32_t topk;
  uint32_t num_experts;
  uint32_t rank;
  uint32_t nranks;
  uint32_t dtype;
  uint32_t phases;  // kMoeHalfSend | kMoeHalfReceive
  uint64_t abort;
  // The expert-major ("low-latency") form where em_flags has kMoeEmOn (args.rs says what each is).
  uint64_t em_x;
  uint64_t em_scales;
  uint64_t em_scale_strides[3];
  uint64_t em_src;
  uint64_t em_range;
  uint64_t em_count;
  uint64_t em_slots;
  uint64_t em_stats;
  uint64_t em_weights;
  uint64_t em_capacity;
  uint32_t em_flags;
  uint32_t _pad;
};
constexpr uint32_t kMoeHalfSend = 1;
constexpr uint32_t kMoeHalfReceive = 2;
constexpr uint32_t kMoeEmOn = 1;
constexpr uint32_t kMoeEmUe8m0 = 2;
constexpr uint32_t kMoeEmCastFp8 = 4;
constexpr uint32_t kMoeEmRoundScale = 8;
constexpr uint32_t kMoeEmMaxLocal = 1024;

}  // namespace mscclpp
