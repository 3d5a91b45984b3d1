// LL ("low-latency") packets: data and a flag written in one store, so that a reader knows the
// data has arrived by seeing the flag. Mirrors hal/src/dev/packet.rs.
//
// An LL16Packet carries 8 data bytes in 16 (each 4-byte half followed by its own copy of the
// flag, so that each 8-byte half validates itself even where a 16-byte store may tear); an
// LL8Packet carries 4 data bytes in 8. Vendor-neutral: the stores and loads come from core.cuh.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"

namespace mscclpp {

struct alignas(16) LL16Packet {
  uint32_t data1;
  uint32_t flag1;
  uint32_t data2;
  uint32_t flag2;

  // Data bytes one packet carries.
  static constexpr uint32_t kDataBytes = 8;

  // Writes `value` (low word into data1) with `flag`, in one 16-byte store.
  MSCCLPP_DEVICE_INLINE void write(uint64_t value, uint32_t flag) {
    storeVolatile16(this, (uint32_t)value, flag, (uint32_t)(value >> 32), flag);
  }
  MSCCLPP_DEVICE_INLINE void write(uint32_t lo, uint32_t hi, uint32_t flag) { storeVolatile16(this, lo, flag, hi, flag); }

  // One look: true and the data when both halves carry `flag`.
  MSCCLPP_DEVICE_INLINE bool readOnce(uint32_t flag, uint64_t& value) const {
    uint32_t d1, f1, d2, f2;
    loadVolatile16(this, d1, f1, d2, f2);
    value = (uint64_t)d1 | ((uint64_t)d2 << 32);
    return f1 == flag && f2 == flag;
  }

  // Waits until the packet carries `flag` and returns its data (garbage when the wait gave up
  // on the kernel's abort word: see waitRead).
  MSCCLPP_DEVICE_INLINE uint64_t read(uint32_t flag, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) const {
    uint64_t v = 0;
    spinUntil([&] { return readOnce(flag, v); }, maxSpinCount);
    return v;
  }

  // The same, saying whether the data came: false when the wait gave up on the kernel's abort
  // word (core.cuh), for callers whose control flow depends on the value.
  MSCCLPP_DEVICE_INLINE bool waitRead(uint32_t flag, uint64_t& value,
                                      int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) const {
    return spinUntil([&] { return readOnce(flag, value); }, maxSpinCount);
  }
};

struct alignas(8) LL8Packet {
  uint32_t data;
  uint32_t flag;

  static constexpr uint32_t kDataBytes = 4;

  // Writes `value` with `flag`, in one 8-byte store.
  MSCCLPP_DEVICE_INLINE void write(uint32_t value, uint32_t flag) { storeVolatile8(this, value, flag); }

  MSCCLPP_DEVICE_INLINE bool readOnce(uint32_t flag, uint32_t& value) const {
    uint32_t f;
    loadVolatile8(this, value, f);
    return f == flag;
  }

  MSCCLPP_DEVICE_INLINE uint32_t read(uint32_t flag, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) const {
    uint32_t v = 0;
    spinUntil([&] { return readOnce(flag, v); }, maxSpinCount);
    return v;
  }
};

// The data word a packet type carries.
template <typename Packet>
struct PacketData;
template <>
struct PacketData<LL16Packet> {
  typedef uint64_t Type;
};
template <>
struct PacketData<LL8Packet> {
  typedef uint32_t Type;
};

// Writes `bytes` of data at `data` as packets carrying `flag` at `packets` (packet i holds data
// bytes [i * kDataBytes, (i + 1) * kDataBytes)); thread `threadId` of `numThreads` writes
// packets threadId, threadId + numThreads, ... `bytes` must be a multiple of the packet's data
// bytes, `data` aligned to them and `packets` to the packet size.
template <typename Packet>
MSCCLPP_DEVICE_INLINE void putPackets(void* packets, const void* data, uint64_t bytes, uint32_t threadId,
                                      uint32_t numThreads, uint32_t flag) {
  typedef typename PacketData<Packet>::Type Word;
  const Word* src = (const Word*)data;
  Packet* dst = (Packet*)packets;
  const uint64_t n = bytes / Packet::kDataBytes;
  for (uint64_t i = threadId; i < n; i += numThreads) dst[i].write(src[i], flag);
}

// Reads the packets carrying `flag` at `packets` into `bytes` of data at `data`, waiting for each;
// thread `threadId` of `numThreads` takes the same packets as in putPackets.
template <typename Packet>
MSCCLPP_DEVICE_INLINE void unpackPackets(void* data, const void* packets, uint64_t bytes, uint32_t threadId,
                                         uint32_t numThreads, uint32_t flag,
                                         int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
  typedef typename PacketData<Packet>::Type Word;
  Word* dst = (Word*)data;
  const Packet* src = (const Packet*)packets;
  const uint64_t n = bytes / Packet::kDataBytes;
  for (uint64_t i = threadId; i < n; i += numThreads) dst[i] = src[i].read(flag, maxSpinCount);
}

}  // namespace mscclpp
