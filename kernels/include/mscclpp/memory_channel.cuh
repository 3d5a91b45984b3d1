// Memory channels: peer-to-peer over mapped memory, the device itself moving the data.
// Mirrors hal/src/dev/memory_channel.rs; vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/packet.cuh"
#include "mscclpp/semaphore.cuh"

namespace mscclpp {

struct alignas(16) Bytes16 {
  uint32_t x, y, z, w;
};

// Copies `bytes` from `src` to `dst` (not overlapping); thread `threadId` of `numThreads` takes
// 16-byte units threadId, threadId + numThreads, ... when both addresses are 16-byte aligned
// (4-byte units when 4-byte aligned, bytes otherwise), and the first threads take the tail.
MSCCLPP_DEVICE_INLINE void copy(void* dst, const void* src, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
  char* d = (char*)dst;
  const char* s = (const char*)src;
  const uint64_t align = ((uintptr_t)d | (uintptr_t)s);
  uint64_t done = 0;
  if ((align & 15) == 0) {
    const uint64_t n = bytes / 16;
    for (uint64_t i = threadId; i < n; i += numThreads) ((Bytes16*)d)[i] = ((const Bytes16*)s)[i];
    done = n * 16;
  }
  if ((align & 3) == 0) {
    const uint64_t n = (bytes - done) / 4;
    for (uint64_t i = threadId; i < n; i += numThreads) ((uint32_t*)(d + done))[i] = ((const uint32_t*)(s + done))[i];
    done += n * 4;
  }
  for (uint64_t i = done + threadId; i < bytes; i += numThreads) d[i] = s[i];
}

// Signal/wait only, between two devices that map each other's memory.
struct BaseMemoryChannelDeviceHandle {
  MemoryDevice2DeviceSemaphoreDeviceHandle semaphore;

  // Signals the peer (release).
  MSCCLPP_DEVICE_INLINE void signal() { semaphore.signal(); }
  // Signals without ordering earlier writes.
  MSCCLPP_DEVICE_INLINE void relaxedSignal() { semaphore.relaxedSignal(); }
  // Waits for the peer's next signal (acquire).
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) { semaphore.wait(maxSpinCount); }
  // Waits without acquiring.
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    semaphore.relaxedWait(maxSpinCount);
  }
  // Consumes a signal if one has arrived.
  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
};

// The peer's registered memory (`dst`) mapped here, a local source (`src`) and a local packet
// buffer the peer writes packets into.
struct MemoryChannelDeviceHandle {
  MemoryDevice2DeviceSemaphoreDeviceHandle semaphore;
  // The peer's memory, mapped here.
  uint64_t dst;
  // Local source memory.
  uint64_t src;
  // Local packet buffer (written by the peer's putPackets), or 0.
  uint64_t packet_buffer;

  // Copies `bytes` from local src + srcOffset to the peer's dst + dstOffset; thread `threadId`
  // of `numThreads` copies its share.
  MSCCLPP_DEVICE_INLINE void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint32_t threadId,
                                 uint32_t numThreads) {
    copy((char*)dst + dstOffset, (const char*)src + srcOffset, bytes, threadId, numThreads);
  }
  MSCCLPP_DEVICE_INLINE void put(uint64_t offset, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
    put(offset, offset, bytes, threadId, numThreads);
  }

  // Copies `bytes` from the peer's dst + remoteOffset to local src + localOffset.
  MSCCLPP_DEVICE_INLINE void get(uint64_t remoteOffset, uint64_t localOffset, uint64_t bytes, uint32_t threadId,
                                 uint32_t numThreads) {
    copy((char*)src + localOffset, (const char*)dst + remoteOffset, bytes, threadId, numThreads);
  }
  MSCCLPP_DEVICE_INLINE void get(uint64_t offset, uint64_t bytes, uint32_t threadId, uint32_t numThreads) {
    get(offset, offset, bytes, threadId, numThreads);
  }

  // Writes one element into the peer's memory at element index `index` (a plain store: order
  // it with signal/wait, as for put).
  template <typename T>
  MSCCLPP_DEVICE_INLINE void write(uint64_t index, const T& value) {
    *((T*)dst + index) = value;
  }
  // Reads one element of the peer's memory at element index `index` (a plain load).
  template <typename T>
  MSCCLPP_DEVICE_INLINE T read(uint64_t index) const {
    return *((const T*)dst + index);
  }

  // Writes `bytes` of local data at src + srcOffset as packets with `flag` into the peer's
  // memory at dst + dstOffset (a packet area of bytes * 2).
  template <typename Packet = LL16Packet>
  MSCCLPP_DEVICE_INLINE void putPackets(uint64_t dstOffset, uint64_t srcOffset, uint64_t bytes, uint32_t threadId,
                                        uint32_t numThreads, uint32_t flag) {
    mscclpp::putPackets<Packet>((char*)dst + dstOffset, (const char*)src + srcOffset, bytes, threadId, numThreads,
                                flag);
  }

  // Reads packets with `flag` from the local packet buffer at packetOffset into local data at
  // src + srcOffset, waiting for each.
  template <typename Packet = LL16Packet>
  MSCCLPP_DEVICE_INLINE void unpackPackets(uint64_t srcOffset, uint64_t packetOffset, uint64_t bytes,
                                           uint32_t threadId, uint32_t numThreads, uint32_t flag,
                                           int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    if (packet_buffer == 0) deviceTrap();
    mscclpp::unpackPackets<Packet>((char*)src + srcOffset, (const char*)packet_buffer + packetOffset, bytes, threadId,
                                   numThreads, flag, maxSpinCount);
  }

  // The signalling part of the channel.
  MSCCLPP_DEVICE_INLINE BaseMemoryChannelDeviceHandle base() const {
    BaseMemoryChannelDeviceHandle b;
    b.semaphore = semaphore;
    return b;
  }
  MSCCLPP_DEVICE_INLINE void signal() { semaphore.signal(); }
  MSCCLPP_DEVICE_INLINE void relaxedSignal() { semaphore.relaxedSignal(); }
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) { semaphore.wait(maxSpinCount); }
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    semaphore.relaxedWait(maxSpinCount);
  }
  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
};

}  // namespace mscclpp
