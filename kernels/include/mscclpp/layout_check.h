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

#undef MSCCLPP_LAYOUT_OFFSETOF
