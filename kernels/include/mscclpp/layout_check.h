// Generated from the Rust definitions in hal/src/dev by `cargo run -p mscclpp-hal --example gen_layout`.
// Do not edit: a test fails when this file and the Rust layouts disagree.
#pragma once

// NVRTC's front end has no __builtin_offsetof (nor <cstddef>); it has __INTADDR__.
#if defined(__CUDACC_RTC__)
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __INTADDR__(&((type*)0)->field)
#else
#define MSCCLPP_LAYOUT_OFFSETOF(type, field) __builtin_offsetof(type, field)
#endif

static_assert(sizeof(mscclpp::ProxyTrigger) == 16, "size of ProxyTrigger");
static_assert(alignof(mscclpp::ProxyTrigger) == 16, "alignment of ProxyTrigger");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ProxyTrigger, fst) == 0, "offset of ProxyTrigger::fst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::ProxyTrigger, snd) == 8, "offset of ProxyTrigger::snd");

static_assert(sizeof(mscclpp::FifoDeviceHandle) == 32, "size of FifoDeviceHandle");
static_assert(alignof(mscclpp::FifoDeviceHandle) == 8, "alignment of FifoDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FifoDeviceHandle, triggers) == 0, "offset of FifoDeviceHandle::triggers");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FifoDeviceHandle, head) == 8, "offset of FifoDeviceHandle::head");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FifoDeviceHandle, tail) == 16, "offset of FifoDeviceHandle::tail");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FifoDeviceHandle, size) == 24, "offset of FifoDeviceHandle::size");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::FifoDeviceHandle, _pad) == 28, "offset of FifoDeviceHandle::_pad");

static_assert(sizeof(mscclpp::LL16Packet) == 16, "size of LL16Packet");
static_assert(alignof(mscclpp::LL16Packet) == 16, "alignment of LL16Packet");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL16Packet, data1) == 0, "offset of LL16Packet::data1");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL16Packet, flag1) == 4, "offset of LL16Packet::flag1");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL16Packet, data2) == 8, "offset of LL16Packet::data2");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL16Packet, flag2) == 12, "offset of LL16Packet::flag2");

static_assert(sizeof(mscclpp::LL8Packet) == 8, "size of LL8Packet");
static_assert(alignof(mscclpp::LL8Packet) == 8, "alignment of LL8Packet");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL8Packet, data) == 0, "offset of LL8Packet::data");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::LL8Packet, flag) == 4, "offset of LL8Packet::flag");

static_assert(sizeof(mscclpp::Host2DeviceSemaphoreDeviceHandle) == 16, "size of Host2DeviceSemaphoreDeviceHandle");
static_assert(alignof(mscclpp::Host2DeviceSemaphoreDeviceHandle) == 8, "alignment of Host2DeviceSemaphoreDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::Host2DeviceSemaphoreDeviceHandle, inbound_token) == 0, "offset of Host2DeviceSemaphoreDeviceHandle::inbound_token");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::Host2DeviceSemaphoreDeviceHandle, expected_inbound_token) == 8, "offset of Host2DeviceSemaphoreDeviceHandle::expected_inbound_token");

static_assert(sizeof(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle) == 32, "size of MemoryDevice2DeviceSemaphoreDeviceHandle");
static_assert(alignof(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle) == 8, "alignment of MemoryDevice2DeviceSemaphoreDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle, inbound_token) == 0, "offset of MemoryDevice2DeviceSemaphoreDeviceHandle::inbound_token");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle, outbound_token) == 8, "offset of MemoryDevice2DeviceSemaphoreDeviceHandle::outbound_token");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle, remote_inbound_token) == 16, "offset of MemoryDevice2DeviceSemaphoreDeviceHandle::remote_inbound_token");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryDevice2DeviceSemaphoreDeviceHandle, expected_inbound_token) == 24, "offset of MemoryDevice2DeviceSemaphoreDeviceHandle::expected_inbound_token");

static_assert(sizeof(mscclpp::BaseMemoryChannelDeviceHandle) == 32, "size of BaseMemoryChannelDeviceHandle");
static_assert(alignof(mscclpp::BaseMemoryChannelDeviceHandle) == 8, "alignment of BaseMemoryChannelDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::BaseMemoryChannelDeviceHandle, semaphore) == 0, "offset of BaseMemoryChannelDeviceHandle::semaphore");

static_assert(sizeof(mscclpp::MemoryChannelDeviceHandle) == 56, "size of MemoryChannelDeviceHandle");
static_assert(alignof(mscclpp::MemoryChannelDeviceHandle) == 8, "alignment of MemoryChannelDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelDeviceHandle, semaphore) == 0, "offset of MemoryChannelDeviceHandle::semaphore");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelDeviceHandle, dst) == 32, "offset of MemoryChannelDeviceHandle::dst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelDeviceHandle, src) == 40, "offset of MemoryChannelDeviceHandle::src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::MemoryChannelDeviceHandle, packet_buffer) == 48, "offset of MemoryChannelDeviceHandle::packet_buffer");

static_assert(sizeof(mscclpp::PortChannelDeviceHandle) == 64, "size of PortChannelDeviceHandle");
static_assert(alignof(mscclpp::PortChannelDeviceHandle) == 8, "alignment of PortChannelDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, semaphore_id) == 0, "offset of PortChannelDeviceHandle::semaphore_id");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, dst) == 4, "offset of PortChannelDeviceHandle::dst");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, src) == 8, "offset of PortChannelDeviceHandle::src");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, _pad) == 12, "offset of PortChannelDeviceHandle::_pad");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, semaphore) == 16, "offset of PortChannelDeviceHandle::semaphore");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::PortChannelDeviceHandle, fifo) == 32, "offset of PortChannelDeviceHandle::fifo");

static_assert(sizeof(mscclpp::SwitchChannelDeviceHandle) == 40, "size of SwitchChannelDeviceHandle");
static_assert(alignof(mscclpp::SwitchChannelDeviceHandle) == 8, "alignment of SwitchChannelDeviceHandle");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, device_ptr) == 0, "offset of SwitchChannelDeviceHandle::device_ptr");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, mc_ptr) == 8, "offset of SwitchChannelDeviceHandle::mc_ptr");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, member_ptrs) == 16, "offset of SwitchChannelDeviceHandle::member_ptrs");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, buffer_size) == 24, "offset of SwitchChannelDeviceHandle::buffer_size");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, num_members) == 32, "offset of SwitchChannelDeviceHandle::num_members");
static_assert(MSCCLPP_LAYOUT_OFFSETOF(mscclpp::SwitchChannelDeviceHandle, _pad) == 36, "offset of SwitchChannelDeviceHandle::_pad");

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

static_assert(sizeof(mscclpp::LlCollectiveArgs) == 136, "size of LlCollectiveArgs");
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

static_assert(sizeof(mscclpp::DirectCollectiveArgs) == 144, "size of DirectCollectiveArgs");
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

static_assert(sizeof(mscclpp::ReadCollectiveArgs) == 144, "size of ReadCollectiveArgs");
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

#undef MSCCLPP_LAYOUT_OFFSETOF
