// Generated from the Rust definitions in perf/src/bench_kernels.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-perf --lib bench_kernels).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::MemoryChannelPutArgs) == 72, "size of MemoryChannelPutArgs");
static_assert(alignof(mscclpp::MemoryChannelPutArgs) == 8, "alignment of MemoryChannelPutArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelPutArgs, chan) == 0, "offset of MemoryChannelPutArgs::chan");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelPutArgs, bytes) == 56, "offset of MemoryChannelPutArgs::bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelPutArgs, iters) == 64, "offset of MemoryChannelPutArgs::iters");

static_assert(sizeof(mscclpp::PortChannelPutArgs) == 80, "size of PortChannelPutArgs");
static_assert(alignof(mscclpp::PortChannelPutArgs) == 8, "alignment of PortChannelPutArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelPutArgs, chan) == 0, "offset of PortChannelPutArgs::chan");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelPutArgs, bytes) == 64, "offset of PortChannelPutArgs::bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelPutArgs, iters) == 72, "offset of PortChannelPutArgs::iters");

static_assert(sizeof(mscclpp::PingPongArgs) == 48, "size of PingPongArgs");
static_assert(alignof(mscclpp::PingPongArgs) == 8, "alignment of PingPongArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PingPongArgs, chan) == 0, "offset of PingPongArgs::chan");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PingPongArgs, rounds) == 32, "offset of PingPongArgs::rounds");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PingPongArgs, initiator) == 40, "offset of PingPongArgs::initiator");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PingPongArgs, relaxed) == 44, "offset of PingPongArgs::relaxed");

#undef MSCCLPP_LAYOUT_OFFSETOF
