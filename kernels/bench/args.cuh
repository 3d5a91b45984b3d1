// Argument structs of the benchmark and example kernels (perf/src/bench_kernels.rs:
// MemoryChannelPutArgs, PortChannelPutArgs, PingPongArgs; checked against them by
// bench/args_check.h). Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/memory_channel.cuh"
#include "mscclpp/port_channel.cuh"

namespace mscclpp {

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

}  // namespace mscclpp
