// The proxy FIFO: a power-of-two ring of 16-byte triggers in host-mapped memory through which
// device code asks the host proxy to move data. Mirrors hal/src/dev/fifo.rs; vendor-neutral.
//
// push: claim position p with an atomic add on `head`, wait until p - tail < size, store `fst`,
// then release-store `snd` whose top bit is the lap parity of p (1 on even laps, 0 on odd), so a
// zeroed ring reads as empty. sync(p): wait until tail > p (the proxy has handled p).
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"

namespace mscclpp {

// Kinds of work a trigger asks for; combined as bits (TriggerType in Rust).
constexpr uint64_t TriggerData = 1;  // copy `size` bytes from source to destination memory
constexpr uint64_t TriggerFlag = 2;  // signal the peer's semaphore (after the data)
constexpr uint64_t TriggerSync = 4;  // flush the connection before acknowledging

// Largest ids a trigger carries.
constexpr uint32_t kMaxMemoryId = (1u << 9) - 1;
constexpr uint32_t kMaxSemaphoreId = (1u << 10) - 1;
constexpr uint64_t kTriggerParity = 1ull << 63;

// fst: bits 0-31 size, 32-63 source offset. snd: bits 0-31 destination offset, 32-40 source
// memory id, 41-49 destination memory id, 50-52 type bits, 53-62 semaphore id, 63 lap parity.
struct alignas(16) ProxyTrigger {
  uint64_t fst;
  uint64_t snd;

  // Builds a trigger (parity bit clear). Fields wider than their bits are cut to them: the host
  // side (ProxyTrigger::new) is where sizes are checked.
  static MSCCLPP_HOST_DEVICE_INLINE ProxyTrigger make(uint64_t type, uint32_t dstMemory, uint64_t dstOffset,
                                                      uint32_t srcMemory, uint64_t srcOffset, uint64_t size,
                                                      uint32_t semaphoreId) {
    ProxyTrigger t;
    t.fst = (size & 0xffffffffull) | ((srcOffset & 0xffffffffull) << 32);
    t.snd = (dstOffset & 0xffffffffull) | ((uint64_t)(srcMemory & kMaxMemoryId) << 32) |
            ((uint64_t)(dstMemory & kMaxMemoryId) << 41) | ((type & 0x7) << 50) |
            ((uint64_t)(semaphoreId & kMaxSemaphoreId) << 53);
    return t;
  }

  MSCCLPP_HOST_DEVICE_INLINE uint64_t size() const { return fst & 0xffffffffull; }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t srcOffset() const { return fst >> 32; }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t dstOffset() const { return snd & 0xffffffffull; }
  MSCCLPP_HOST_DEVICE_INLINE uint32_t srcMemory() const { return (uint32_t)((snd >> 32) & 0x1ff); }
  MSCCLPP_HOST_DEVICE_INLINE uint32_t dstMemory() const { return (uint32_t)((snd >> 41) & 0x1ff); }
  MSCCLPP_HOST_DEVICE_INLINE uint64_t type() const { return (snd >> 50) & 0x7; }
  MSCCLPP_HOST_DEVICE_INLINE uint32_t semaphoreId() const { return (uint32_t)((snd >> 53) & 0x3ff); }

  // The parity bit of position `pos` in a ring of `size` (a power of two) slots.
  static MSCCLPP_HOST_DEVICE_INLINE uint64_t parityFor(uint64_t pos, uint64_t size) {
    return ((pos / size) % 2 == 0) ? kTriggerParity : 0;
  }
};

struct FifoDeviceHandle {
  // Address of `size` ProxyTrigger slots (host-mapped memory).
  uint64_t triggers;
  // Address of the 64-bit count of claimed positions (this device's memory).
  uint64_t head;
  // Address of the 64-bit count of positions the proxy has handled (written by the proxy).
  uint64_t tail;
  // Number of slots, a power of two.
  uint32_t size;
  uint32_t _pad;

  // Claims a position, waits for its slot to be free and publishes `trigger` there; returns the
  // position (for sync).
  MSCCLPP_DEVICE_INLINE uint64_t push(ProxyTrigger trigger, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    const uint64_t n = size;
    const uint64_t pos = fetchAddRelaxedDevice((uint64_t*)head, 1);
    const uint64_t* t = (const uint64_t*)tail;
    // A wait that gave up on the kernel's abort word publishes nothing: the slot may still hold
    // a trigger the proxy has not read.
    if (!spinUntil([&] { return pos - loadAcquireSystem(t) < n; }, maxSpinCount)) return pos;
    uint64_t* slot = (uint64_t*)(triggers + (pos & (n - 1)) * sizeof(ProxyTrigger));
    storeRelaxedSystem(slot, trigger.fst);
    storeReleaseSystem(slot + 1, (trigger.snd & ~kTriggerParity) | ProxyTrigger::parityFor(pos, n));
    return pos;
  }

  // Waits until the proxy has handled position `pos`.
  MSCCLPP_DEVICE_INLINE void sync(uint64_t pos, int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    const uint64_t* t = (const uint64_t*)tail;
    spinUntil([&] { return loadAcquireSystem(t) > pos; }, maxSpinCount);
  }
};

}  // namespace mscclpp
