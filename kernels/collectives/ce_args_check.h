// Generated from the Rust definitions in collectives/src/algorithms/ce/reduce.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-collectives ce_args).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::CeReduceArgs) == 96, "size of CeReduceArgs");
static_assert(alignof(mscclpp::CeReduceArgs) == 8, "alignment of CeReduceArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, dst) == 0, "offset of CeReduceArgs::dst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, srcs) == 8, "offset of CeReduceArgs::srcs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, bytes) == 72, "offset of CeReduceArgs::bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, nsrc) == 80, "offset of CeReduceArgs::nsrc");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, dtype) == 84, "offset of CeReduceArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, op) == 88, "offset of CeReduceArgs::op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::CeReduceArgs, _pad) == 92, "offset of CeReduceArgs::_pad");

#undef MSCCLPP_LAYOUT_OFFSETOF
