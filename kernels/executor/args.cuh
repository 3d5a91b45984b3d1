// The executor's device records (executor/src/flat.rs: FlatRef, FlatOp, FlatBlock;
// executor/src/kernel.rs: DevicePlan, ExecutorArgs), checked against them by
// executor/args_check.h; and the codes they carry (OpKind codes, REF_*, CHANNEL_*, the state
// layout), checked against the Rust constants by a test of the executor crate
// (`device_constants_match_the_rust_ones`). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

// flat::MAX_REFS, flat::MAX_IDS.
constexpr uint32_t kExecMaxRefs = 10;
constexpr uint32_t kExecMaxIds = 16;
// plan::MAX_BARRIERS.
constexpr uint32_t kExecMaxBarriers = 16;
// kernel::STATE_HEADER_WORDS: the last flag, the count of blocks done with the current launch,
// then two words per barrier (the device keeps a DeviceSyncer in the first of the two).
constexpr uint32_t kExecStateHeaderWords = 2 + 2 * kExecMaxBarriers;

// FlatRef::kind.
constexpr uint32_t kExecRefLocal = 0;
constexpr uint32_t kExecRefRemoteMemory = 1;
constexpr uint32_t kExecRefRemotePort = 2;
constexpr uint32_t kExecRefSwitch = 3;

// FlatOp::channel_type.
constexpr uint32_t kExecChannelNone = 0;
constexpr uint32_t kExecChannelMemory = 1;
constexpr uint32_t kExecChannelPort = 2;
constexpr uint32_t kExecChannelSwitch = 3;

// FlatRef::buffer (plan::BufferType).
constexpr uint32_t kExecBufferInput = 0;
constexpr uint32_t kExecBufferOutput = 1;
constexpr uint32_t kExecBufferScratch = 2;

// OpKind codes (executor/src/plan.rs, `op_kinds!`).
constexpr uint32_t kOpNop = 0;
constexpr uint32_t kOpBarrier = 1;
constexpr uint32_t kOpPut = 2;
constexpr uint32_t kOpPutPackets = 3;
constexpr uint32_t kOpReadPutPackets = 4;
constexpr uint32_t kOpPutWithSignal = 5;
constexpr uint32_t kOpPutWithSignalAndFlush = 6;
constexpr uint32_t kOpGet = 7;
constexpr uint32_t kOpCopy = 8;
constexpr uint32_t kOpCopyPackets = 9;
constexpr uint32_t kOpUnpackPackets = 10;
constexpr uint32_t kOpSignal = 11;
constexpr uint32_t kOpWait = 12;
constexpr uint32_t kOpFlush = 13;
constexpr uint32_t kOpReduce = 14;
constexpr uint32_t kOpReducePackets = 15;
constexpr uint32_t kOpReduceCopyPackets = 16;
constexpr uint32_t kOpReduceSend = 17;
constexpr uint32_t kOpReduceSendPackets = 18;
constexpr uint32_t kOpReduceCopySendPackets = 19;
constexpr uint32_t kOpReadReduce = 20;
constexpr uint32_t kOpReadReduceSend = 21;
constexpr uint32_t kOpMultiLoadReduceStore = 22;
constexpr uint32_t kOpRelaxedSignal = 23;
constexpr uint32_t kOpRelaxedWait = 24;
constexpr uint32_t kOpPipeline = 25;
constexpr uint32_t kOpSemRelease = 26;
constexpr uint32_t kOpSemAcquire = 27;
constexpr uint32_t kOpMultiStore = 28;
constexpr uint32_t kOpMultiStorePackets = 29;

// One resolved buffer reference.
struct FlatRef {
  uint64_t offset;
  uint32_t size;
  uint8_t kind;
  uint8_t buffer;
  uint8_t id;
  uint8_t packets;
};

// One operation.
struct FlatOp {
  uint8_t code;
  uint8_t channel_type;
  uint8_t n_src;
  uint8_t n_dst;
  uint8_t n_ids;
  uint8_t reduce;
  uint8_t _pad[2];
  uint32_t a;
  uint32_t b;
  uint32_t c;
  uint32_t _pad2;
  uint8_t ids[kExecMaxIds];
  FlatRef src[kExecMaxRefs];
  FlatRef dst[kExecMaxRefs];
};

// A threadblock's ops: ops[first_op .. first_op + n_ops].
struct FlatBlock {
  uint32_t first_op;
  uint32_t n_ops;
};

// A rank's flattened plan and the tables its ops index, in device memory.
struct DevicePlan {
  uint32_t n_blocks;
  uint32_t n_ops;
  uint64_t blocks;
  uint64_t ops;
  uint64_t memory_channels;
  uint64_t port_channels;
  uint64_t remote_addrs;
  uint64_t remote_ids;
  uint32_t local_ids[4];
  uint32_t n_memory;
  uint32_t n_port;
  uint32_t n_remote;
  uint32_t _pad;
};

// The interpreter's argument struct.
struct ExecutorArgs {
  uint64_t plan;
  uint64_t state;
  uint64_t input;
  uint64_t output;
  uint64_t scratch;
  uint64_t scratch_bytes;
  uint32_t dtype;
  uint32_t op;
  uint32_t double_scratch;
  uint32_t n_semaphores;
  // The communicator's abort word (0: none; mscclpp/core.cuh, MSCCLPP_DEVICE_ABORT).
  uint64_t abort;
};

}  // namespace mscclpp
