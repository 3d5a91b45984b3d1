// Argument structs of the HAL conformance and benchmark kernels (hal/src/kernel.rs:
// FillU32Args, AtomicAddU64Args, MemoryChannelPutArgs, PortChannelPutArgs). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/memory_channel.cuh"
#include "mscclpp/port_channel.cuh"

namespace mscclpp {

// mscclpp_fill_u32: fills `count` 32-bit words at `dst` with `value`.
struct FillU32Args {
  uint64_t dst;
  uint64_t count;
  uint32_t value;
  uint32_t _pad;
};

// mscclpp_atomic_add_u64: every thread of the grid adds `value` to the counter at `counter`.
struct AtomicAddU64Args {
  uint64_t counter;
  uint64_t value;
};

// mscclpp_bench_memory_channel_put: `iters` rounds of put (all threads) + signal + wait.
struct MemoryChannelPutArgs {
  MemoryChannelDeviceHandle chan;
  uint64_t bytes;
  uint64_t iters;
};

// mscclpp_bench_port_channel_put: `iters` rounds of putWithSignal + wait.
struct PortChannelPutArgs {
  PortChannelDeviceHandle chan;
  uint64_t bytes;
  uint64_t iters;
};

// mscclpp_example_ping_pong: `rounds` signal/wait round trips; the initiator signals first.
struct PingPongArgs {
  BaseMemoryChannelDeviceHandle chan;
  uint64_t rounds;
  uint32_t initiator;
  uint32_t relaxed;
};

// mscclpp_collective_ll_*: every collective through LL packets in scratch buffers
// (hal/src/collective.rs documents the algorithm and the scratch layout).
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
};

// mscclpp_collective_direct: all-reduce, all-gather and reduce-scatter through plain stores into
// the peers' scratch, pipelined in steps (hal/src/collective.rs documents the protocol and the
// scratch layout).
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
};

// Arguments of mscclpp_collective_read_allreduce: every rank reads the peers' inputs where they
// lie and reduces locally (hal/src/collective.rs documents the protocol, the windows and the
// scratch layout).
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
};

}  // namespace mscclpp
