// Generated from the Rust definitions in collectives/src/algorithms/*/args.rs (collectives/src/algorithms/layout.rs; regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p mscclpp-collectives layout).
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::LlCollectiveArgs) == 144, "size of LlCollectiveArgs");
static_assert(alignof(mscclpp::LlCollectiveArgs) == 8, "alignment of LlCollectiveArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, input) == 0, "offset of LlCollectiveArgs::input");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, output) == 8, "offset of LlCollectiveArgs::output");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, count) == 16, "offset of LlCollectiveArgs::count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, flag) == 24, "offset of LlCollectiveArgs::flag");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, scratch) == 32, "offset of LlCollectiveArgs::scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, slot_bytes) == 40, "offset of LlCollectiveArgs::slot_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, peer_scratch) == 48, "offset of LlCollectiveArgs::peer_scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, kind) == 112, "offset of LlCollectiveArgs::kind");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, dtype) == 116, "offset of LlCollectiveArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, op) == 120, "offset of LlCollectiveArgs::op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, rank) == 124, "offset of LlCollectiveArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, nranks) == 128, "offset of LlCollectiveArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, root) == 132, "offset of LlCollectiveArgs::root");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LlCollectiveArgs, abort) == 136, "offset of LlCollectiveArgs::abort");

static_assert(sizeof(mscclpp::DirectCollectiveArgs) == 152, "size of DirectCollectiveArgs");
static_assert(alignof(mscclpp::DirectCollectiveArgs) == 8, "alignment of DirectCollectiveArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, input) == 0, "offset of DirectCollectiveArgs::input");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, output) == 8, "offset of DirectCollectiveArgs::output");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, count) == 16, "offset of DirectCollectiveArgs::count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, scratch) == 24, "offset of DirectCollectiveArgs::scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, slot_bytes) == 32, "offset of DirectCollectiveArgs::slot_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, chunk_bytes) == 40, "offset of DirectCollectiveArgs::chunk_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, peer_scratch) == 48, "offset of DirectCollectiveArgs::peer_scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, kind) == 112, "offset of DirectCollectiveArgs::kind");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, dtype) == 116, "offset of DirectCollectiveArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, op) == 120, "offset of DirectCollectiveArgs::op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, rank) == 124, "offset of DirectCollectiveArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, nranks) == 128, "offset of DirectCollectiveArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, root) == 132, "offset of DirectCollectiveArgs::root");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, max_blocks) == 136, "offset of DirectCollectiveArgs::max_blocks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, _pad) == 140, "offset of DirectCollectiveArgs::_pad");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::DirectCollectiveArgs, abort) == 144, "offset of DirectCollectiveArgs::abort");

static_assert(sizeof(mscclpp::P2pChannel) == 16, "size of P2pChannel");
static_assert(alignof(mscclpp::P2pChannel) == 4, "alignment of P2pChannel");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pChannel, peer) == 0, "offset of P2pChannel::peer");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pChannel, send) == 4, "offset of P2pChannel::send");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pChannel, first_op) == 8, "offset of P2pChannel::first_op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pChannel, nops) == 12, "offset of P2pChannel::nops");

static_assert(sizeof(mscclpp::P2pOpDesc) == 16, "size of P2pOpDesc");
static_assert(alignof(mscclpp::P2pOpDesc) == 8, "alignment of P2pOpDesc");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pOpDesc, addr) == 0, "offset of P2pOpDesc::addr");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pOpDesc, bytes) == 8, "offset of P2pOpDesc::bytes");

static_assert(sizeof(mscclpp::P2pArgs) == 1392, "size of P2pArgs");
static_assert(alignof(mscclpp::P2pArgs) == 8, "alignment of P2pArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, scratch) == 0, "offset of P2pArgs::scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, slot_bytes) == 8, "offset of P2pArgs::slot_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, lane_min_bytes) == 16, "offset of P2pArgs::lane_min_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, peer_scratch) == 24, "offset of P2pArgs::peer_scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, rank) == 88, "offset of P2pArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, nranks) == 92, "offset of P2pArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, lanes) == 96, "offset of P2pArgs::lanes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, nchannels) == 100, "offset of P2pArgs::nchannels");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, channels) == 104, "offset of P2pArgs::channels");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, ops) == 360, "offset of P2pArgs::ops");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::P2pArgs, abort) == 1384, "offset of P2pArgs::abort");

static_assert(sizeof(mscclpp::ReadCollectiveArgs) == 152, "size of ReadCollectiveArgs");
static_assert(alignof(mscclpp::ReadCollectiveArgs) == 8, "alignment of ReadCollectiveArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, input) == 0, "offset of ReadCollectiveArgs::input");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, output) == 8, "offset of ReadCollectiveArgs::output");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, count) == 16, "offset of ReadCollectiveArgs::count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, scratch) == 24, "offset of ReadCollectiveArgs::scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, table) == 32, "offset of ReadCollectiveArgs::table");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, in_key) == 40, "offset of ReadCollectiveArgs::in_key");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, staging_bytes) == 48, "offset of ReadCollectiveArgs::staging_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, peer_scratch) == 56, "offset of ReadCollectiveArgs::peer_scratch");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, dtype) == 120, "offset of ReadCollectiveArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, op) == 124, "offset of ReadCollectiveArgs::op");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, rank) == 128, "offset of ReadCollectiveArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, nranks) == 132, "offset of ReadCollectiveArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, max_blocks) == 136, "offset of ReadCollectiveArgs::max_blocks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, _pad) == 140, "offset of ReadCollectiveArgs::_pad");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ReadCollectiveArgs, abort) == 144, "offset of ReadCollectiveArgs::abort");

static_assert(sizeof(mscclpp::ScaleArgs) == 48, "size of ScaleArgs");
static_assert(alignof(mscclpp::ScaleArgs) == 8, "alignment of ScaleArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, data) == 0, "offset of ScaleArgs::data");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, count) == 8, "offset of ScaleArgs::count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, scalar) == 16, "offset of ScaleArgs::scalar");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, imm) == 24, "offset of ScaleArgs::imm");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, dtype) == 32, "offset of ScaleArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, _pad) == 36, "offset of ScaleArgs::_pad");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ScaleArgs, src) == 40, "offset of ScaleArgs::src");

static_assert(sizeof(mscclpp::MoeLayoutArgs) == 64, "size of MoeLayoutArgs");
static_assert(alignof(mscclpp::MoeLayoutArgs) == 8, "alignment of MoeLayoutArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, topk_idx) == 0, "offset of MoeLayoutArgs::topk_idx");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, tokens) == 8, "offset of MoeLayoutArgs::tokens");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, per_rank) == 16, "offset of MoeLayoutArgs::per_rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, per_expert) == 24, "offset of MoeLayoutArgs::per_expert");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, in_rank) == 32, "offset of MoeLayoutArgs::in_rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, status) == 40, "offset of MoeLayoutArgs::status");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, topk) == 48, "offset of MoeLayoutArgs::topk");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, num_experts) == 52, "offset of MoeLayoutArgs::num_experts");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, nranks) == 56, "offset of MoeLayoutArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeLayoutArgs, _pad) == 60, "offset of MoeLayoutArgs::_pad");

static_assert(sizeof(mscclpp::MoeArgs) == 1056, "size of MoeArgs");
static_assert(alignof(mscclpp::MoeArgs) == 8, "alignment of MoeArgs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, buffer) == 0, "offset of MoeArgs::buffer");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, peer_buffer) == 8, "offset of MoeArgs::peer_buffer");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, max_tokens) == 776, "offset of MoeArgs::max_tokens");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, row_bytes) == 784, "offset of MoeArgs::row_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, scales_at) == 792, "offset of MoeArgs::scales_at");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, meta_at) == 800, "offset of MoeArgs::meta_at");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, tokens) == 808, "offset of MoeArgs::tokens");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, payload_bytes) == 816, "offset of MoeArgs::payload_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, scale_bytes) == 824, "offset of MoeArgs::scale_bytes");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, x) == 832, "offset of MoeArgs::x");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, topk_idx) == 840, "offset of MoeArgs::topk_idx");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, topk_weights) == 848, "offset of MoeArgs::topk_weights");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, scales) == 856, "offset of MoeArgs::scales");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_x) == 864, "offset of MoeArgs::out_x");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_idx) == 872, "offset of MoeArgs::out_idx");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_weights) == 880, "offset of MoeArgs::out_weights");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_scales) == 888, "offset of MoeArgs::out_scales");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_src) == 896, "offset of MoeArgs::out_src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, out_capacity) == 904, "offset of MoeArgs::out_capacity");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, handle) == 912, "offset of MoeArgs::handle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, topk) == 920, "offset of MoeArgs::topk");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, num_experts) == 924, "offset of MoeArgs::num_experts");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, rank) == 928, "offset of MoeArgs::rank");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, nranks) == 932, "offset of MoeArgs::nranks");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, dtype) == 936, "offset of MoeArgs::dtype");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, phases) == 940, "offset of MoeArgs::phases");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, abort) == 944, "offset of MoeArgs::abort");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_x) == 952, "offset of MoeArgs::em_x");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_scales) == 960, "offset of MoeArgs::em_scales");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_scale_strides) == 968, "offset of MoeArgs::em_scale_strides");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_src) == 992, "offset of MoeArgs::em_src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_range) == 1000, "offset of MoeArgs::em_range");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_count) == 1008, "offset of MoeArgs::em_count");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_slots) == 1016, "offset of MoeArgs::em_slots");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_stats) == 1024, "offset of MoeArgs::em_stats");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_weights) == 1032, "offset of MoeArgs::em_weights");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_capacity) == 1040, "offset of MoeArgs::em_capacity");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, em_flags) == 1048, "offset of MoeArgs::em_flags");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MoeArgs, _pad) == 1052, "offset of MoeArgs::_pad");

#undef MSCCLPP_LAYOUT_OFFSETOF
