// Generated from the Rust definitions in tests/src/kernels.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-conformance --lib kernels).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::FillU32Args) == 24, "size of FillU32Args");
static_assert(alignof(mscclpp::FillU32Args) == 8, "alignment of FillU32Args");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FillU32Args, dst) == 0, "offset of FillU32Args::dst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FillU32Args, count) == 8, "offset of FillU32Args::count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FillU32Args, value) == 16, "offset of FillU32Args::value");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FillU32Args, _pad) == 20, "offset of FillU32Args::_pad");

static_assert(sizeof(mscclpp::AtomicAddU64Args) == 16, "size of AtomicAddU64Args");
static_assert(alignof(mscclpp::AtomicAddU64Args) == 8, "alignment of AtomicAddU64Args");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::AtomicAddU64Args, counter) == 0, "offset of AtomicAddU64Args::counter");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::AtomicAddU64Args, value) == 8, "offset of AtomicAddU64Args::value");

#undef MSCCLPP_LAYOUT_OFFSETOF
