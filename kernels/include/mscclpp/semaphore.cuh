// Semaphores: monotonically increasing 64-bit tokens, never reset (so that kernels using them
// replay in CUDA graphs: every launch continues the count). Mirrors hal/src/dev/semaphore.rs.
// Vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/spin.cuh"

namespace mscclpp {

namespace detail {
// Advances the count of completed waits and returns the token value the next wait needs.
MSCCLPP_DEVICE_INLINE uint64_t nextExpected(uint64_t expectedAddr) {
  uint64_t* e = (uint64_t*)expectedAddr;
  uint64_t next = loadRelaxedDevice(e) + 1;
  storeRelaxedDevice(e, next);
  return next;
}
// Consumes one signal if `inbound` has reached one past the completed waits.
MSCCLPP_DEVICE_INLINE bool pollToken(uint64_t inboundAddr, uint64_t expectedAddr) {
  uint64_t* e = (uint64_t*)expectedAddr;
  uint64_t next = loadRelaxedDevice(e) + 1;
  if (loadAcquireSystem((const uint64_t*)inboundAddr) >= next) {
    storeRelaxedDevice(e, next);
    return true;
  }
  return false;
}
}  // namespace detail

// Signalled by the host (the proxy's update_and_sync), waited on by the device. One thread
// waits on a semaphore at a time.
struct Host2DeviceSemaphoreDeviceHandle {
  // Address of the token the signaller advances (this device's memory).
  uint64_t inbound_token;
  // Address of the count of waits completed so far (persists across launches).
  uint64_t expected_inbound_token;

  // Consumes one signal if it has arrived; returns whether it had.
  MSCCLPP_DEVICE_INLINE bool poll() { return detail::pollToken(inbound_token, expected_inbound_token); }

  // Waits for the next signal (acquire: what the signaller wrote before it is visible after).
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    const uint64_t next = detail::nextExpected(expected_inbound_token);
    const uint64_t* in = (const uint64_t*)inbound_token;
    spinUntil([&] { return loadAcquireSystem(in) >= next; }, maxSpinCount);
  }
};

// Between two devices that map each other's memory: the signaller stores its advanced outbound
// count straight into the peer's inbound token. One thread signals and one waits per direction.
struct MemoryDevice2DeviceSemaphoreDeviceHandle {
  // Address of this side's inbound token (the peer writes it).
  uint64_t inbound_token;
  // Address of this side's count of signals sent.
  uint64_t outbound_token;
  // The peer's inbound token, mapped here.
  uint64_t remote_inbound_token;
  // Address of the count of waits completed so far.
  uint64_t expected_inbound_token;

  // Signals the peer; this thread's earlier writes are visible to the peer once it sees the
  // signal (release, system scope).
  MSCCLPP_DEVICE_INLINE void signal() { storeReleaseSystem((uint64_t*)remote_inbound_token, incrementOutbound()); }

  // Signals without ordering earlier writes.
  MSCCLPP_DEVICE_INLINE void relaxedSignal() {
    storeRelaxedSystem((uint64_t*)remote_inbound_token, incrementOutbound());
  }

  // Consumes one signal if it has arrived; returns whether it had.
  MSCCLPP_DEVICE_INLINE bool poll() { return detail::pollToken(inbound_token, expected_inbound_token); }

  // Waits for the next signal (acquire: the peer's writes before it are visible after).
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    const uint64_t next = detail::nextExpected(expected_inbound_token);
    const uint64_t* in = (const uint64_t*)inbound_token;
    spinUntil([&] { return loadAcquireSystem(in) >= next; }, maxSpinCount);
  }

  // Waits for the next signal without acquiring the peer's earlier writes.
  MSCCLPP_DEVICE_INLINE void relaxedWait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    const uint64_t next = detail::nextExpected(expected_inbound_token);
    const uint64_t* in = (const uint64_t*)inbound_token;
    spinUntil([&] { return loadRelaxedSystem(in) >= next; }, maxSpinCount);
  }

  // Advances the outbound count and returns the new value.
  MSCCLPP_DEVICE_INLINE uint64_t incrementOutbound() {
    uint64_t* o = (uint64_t*)outbound_token;
    uint64_t v = loadRelaxedDevice(o) + 1;
    storeRelaxedDevice(o, v);
    return v;
  }
};

}  // namespace mscclpp
