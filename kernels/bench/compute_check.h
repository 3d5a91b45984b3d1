// Generated from the Rust definitions in perf/src/bench_compute.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-perf --lib bench_compute).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::ComputeArgs) == 32, "size of ComputeArgs");
static_assert(alignof(mscclpp::ComputeArgs) == 8, "alignment of ComputeArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ComputeArgs, data) == 0, "offset of ComputeArgs::data");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ComputeArgs, out) == 8, "offset of ComputeArgs::out");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ComputeArgs, words) == 16, "offset of ComputeArgs::words");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ComputeArgs, passes) == 24, "offset of ComputeArgs::passes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ComputeArgs, fmas) == 28, "offset of ComputeArgs::fmas");

#undef MSCCLPP_LAYOUT_OFFSETOF
