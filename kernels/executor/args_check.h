// Generated from the Rust definitions in executor/src/{flat,kernel}.rs (executor/src/layout.rs; regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-executor layout).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::FlatRef) == 16, "size of FlatRef");
static_assert(alignof(mscclpp::FlatRef) == 8, "alignment of FlatRef");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, offset) == 0, "offset of FlatRef::offset");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, size) == 8, "offset of FlatRef::size");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, kind) == 12, "offset of FlatRef::kind");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, buffer) == 13, "offset of FlatRef::buffer");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, id) == 14, "offset of FlatRef::id");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatRef, packets) == 15, "offset of FlatRef::packets");

static_assert(sizeof(mscclpp::FlatOp) == 360, "size of FlatOp");
static_assert(alignof(mscclpp::FlatOp) == 8, "alignment of FlatOp");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, code) == 0, "offset of FlatOp::code");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, channel_type) == 1, "offset of FlatOp::channel_type");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, n_src) == 2, "offset of FlatOp::n_src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, n_dst) == 3, "offset of FlatOp::n_dst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, n_ids) == 4, "offset of FlatOp::n_ids");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, reduce) == 5, "offset of FlatOp::reduce");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, _pad) == 6, "offset of FlatOp::_pad");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, a) == 8, "offset of FlatOp::a");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, b) == 12, "offset of FlatOp::b");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, c) == 16, "offset of FlatOp::c");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, _pad2) == 20, "offset of FlatOp::_pad2");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, ids) == 24, "offset of FlatOp::ids");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, src) == 40, "offset of FlatOp::src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatOp, dst) == 200, "offset of FlatOp::dst");

static_assert(sizeof(mscclpp::FlatBlock) == 8, "size of FlatBlock");
static_assert(alignof(mscclpp::FlatBlock) == 4, "alignment of FlatBlock");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatBlock, first_op) == 0, "offset of FlatBlock::first_op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FlatBlock, n_ops) == 4, "offset of FlatBlock::n_ops");

static_assert(sizeof(mscclpp::DevicePlan) == 88, "size of DevicePlan");
static_assert(alignof(mscclpp::DevicePlan) == 8, "alignment of DevicePlan");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, n_blocks) == 0, "offset of DevicePlan::n_blocks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, n_ops) == 4, "offset of DevicePlan::n_ops");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, blocks) == 8, "offset of DevicePlan::blocks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, ops) == 16, "offset of DevicePlan::ops");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, memory_channels) == 24, "offset of DevicePlan::memory_channels");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, port_channels) == 32, "offset of DevicePlan::port_channels");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, remote_addrs) == 40, "offset of DevicePlan::remote_addrs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, remote_ids) == 48, "offset of DevicePlan::remote_ids");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, local_ids) == 56, "offset of DevicePlan::local_ids");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, n_memory) == 72, "offset of DevicePlan::n_memory");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, n_port) == 76, "offset of DevicePlan::n_port");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, n_remote) == 80, "offset of DevicePlan::n_remote");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DevicePlan, _pad) == 84, "offset of DevicePlan::_pad");

static_assert(sizeof(mscclpp::ExecutorArgs) == 72, "size of ExecutorArgs");
static_assert(alignof(mscclpp::ExecutorArgs) == 8, "alignment of ExecutorArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, plan) == 0, "offset of ExecutorArgs::plan");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, state) == 8, "offset of ExecutorArgs::state");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, input) == 16, "offset of ExecutorArgs::input");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, output) == 24, "offset of ExecutorArgs::output");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, scratch) == 32, "offset of ExecutorArgs::scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, scratch_bytes) == 40, "offset of ExecutorArgs::scratch_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, dtype) == 48, "offset of ExecutorArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, op) == 52, "offset of ExecutorArgs::op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, double_scratch) == 56, "offset of ExecutorArgs::double_scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, n_semaphores) == 60, "offset of ExecutorArgs::n_semaphores");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ExecutorArgs, abort) == 64, "offset of ExecutorArgs::abort");

#undef MSCCLPP_LAYOUT_OFFSETOF
