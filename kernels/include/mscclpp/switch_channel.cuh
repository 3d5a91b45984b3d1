// Switch channels: reduce and broadcast through multicast memory. With NVLink SHARP (sm_90+,
// mc_ptr set) one multicast address does it in hardware; otherwise the handle's member list
// (emulation) is visited one member at a time, with the same results. A handle with neither
// traps. Mirrors hal/src/dev/switch_channel.rs; vendor-neutral (HIP has no multicast, so only the
// member-list form works there).
#pragma once

#include "mscclpp/core.cuh"

namespace mscclpp {

enum class ReduceOp : uint32_t { Sum = 0, Prod = 1, Min = 2, Max = 3 };

template <typename T>
MSCCLPP_DEVICE_INLINE T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
      return a + b;
    case ReduceOp::Prod:
      return a * b;
    case ReduceOp::Min:
      return b < a ? b : a;
    default:
      return b > a ? b : a;
  }
}

struct SwitchChannelDeviceHandle {
  // This member's own buffer.
  uint64_t device_ptr;
  // Hardware multicast address, or 0 under emulation.
  uint64_t mc_ptr;
  // Address of an array of num_members member addresses (emulation), or 0.
  uint64_t member_ptrs;
  // Bytes of each member's buffer.
  uint64_t buffer_size;
  // Number of members.
  uint32_t num_members;
  uint32_t _pad;

  // Whether this compilation can use the hardware path of this handle.
  MSCCLPP_DEVICE_INLINE bool hardware() const { return MSCCLPP_HAS_MULTIMEM && mc_ptr != 0; }

  MSCCLPP_DEVICE_INLINE uint64_t member(uint32_t i) const {
    if (member_ptrs == 0) deviceTrap();
    return ((const volatile uint64_t*)member_ptrs)[i];
  }

  // The element of type T at byte `offset`, combined with `op` over every member (emulation).
  template <typename T>
  MSCCLPP_DEVICE_INLINE T reduce(uint64_t offset, ReduceOp op) const {
    T acc = *(const volatile T*)(member(0) + offset);
    for (uint32_t m = 1; m < num_members; ++m) acc = combine(acc, *(const volatile T*)(member(m) + offset), op);
    return acc;
  }

  // Stores `value` at byte `offset` in every member (emulation).
  template <typename T>
  MSCCLPP_DEVICE_INLINE void broadcast(uint64_t offset, T value) const {
    for (uint32_t m = 0; m < num_members; ++m) *(volatile T*)(member(m) + offset) = value;
  }

  // Sum over the members of the f32 at byte `offset`: multimem on hardware, else the member list.
  MSCCLPP_DEVICE_INLINE float reduceAddF32(uint64_t offset) const {
    if (hardware()) return multimemLoadReduceAddF32((const float*)(mc_ptr + offset));
    return reduce<float>(offset, ReduceOp::Sum);
  }

  // The same for four f32 at a 16-byte aligned `offset`.
  MSCCLPP_DEVICE_INLINE void reduceAddF32x4(uint64_t offset, float& a, float& b, float& c, float& d) const {
    if (hardware()) {
      multimemLoadReduceAddF32x4((const float*)(mc_ptr + offset), a, b, c, d);
      return;
    }
    a = reduce<float>(offset, ReduceOp::Sum);
    b = reduce<float>(offset + 4, ReduceOp::Sum);
    c = reduce<float>(offset + 8, ReduceOp::Sum);
    d = reduce<float>(offset + 12, ReduceOp::Sum);
  }

  // Stores the f32 `value` at byte `offset` in every member.
  MSCCLPP_DEVICE_INLINE void broadcastF32(uint64_t offset, float value) const {
    if (hardware()) {
      multimemStoreF32((float*)(mc_ptr + offset), value);
      return;
    }
    broadcast<float>(offset, value);
  }

  // Stores four f32 at a 16-byte aligned `offset` in every member.
  MSCCLPP_DEVICE_INLINE void broadcastF32x4(uint64_t offset, float a, float b, float c, float d) const {
    if (hardware()) {
      multimemStoreF32x4((float*)(mc_ptr + offset), a, b, c, d);
      return;
    }
    broadcast<float>(offset, a);
    broadcast<float>(offset + 4, b);
    broadcast<float>(offset + 8, c);
    broadcast<float>(offset + 12, d);
  }
};

}  // namespace mscclpp
