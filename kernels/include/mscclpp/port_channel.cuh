// Port channels: the device posts requests into the proxy FIFO and the host proxy carries them
// out over the connection, then signals the peer's semaphore. Mirrors
// hal/src/dev/port_channel.rs; vendor-neutral.
#pragma once

#include "mscclpp/core.cuh"
#include "mscclpp/fifo.cuh"
#include "mscclpp/semaphore.cuh"

namespace mscclpp {

struct PortChannelDeviceHandle {
  // Which of the proxy's semaphores (and connections) the channel uses.
  uint32_t semaphore_id;
  // Proxy memory id of the destination (the peer's registered memory).
  uint32_t dst;
  // Proxy memory id of the local source.
  uint32_t src;
  uint32_t _pad;
  // The local side of the semaphore the peer's proxy signals.
  Host2DeviceSemaphoreDeviceHandle semaphore;
  // The proxy's FIFO.
  FifoDeviceHandle fifo;

  MSCCLPP_DEVICE_INLINE ProxyTrigger trigger(uint64_t type, uint64_t dstOffset, uint64_t srcOffset,
                                             uint64_t size) const {
    return ProxyTrigger::make(type, dst, dstOffset, src, srcOffset, size, semaphore_id);
  }

  // Asks the proxy to copy `size` bytes from src + srcOffset to dst + dstOffset.
  MSCCLPP_DEVICE_INLINE void put(uint64_t dstOffset, uint64_t srcOffset, uint64_t size,
                                 int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    fifo.push(trigger(TriggerData, dstOffset, srcOffset, size), maxSpinCount);
  }
  MSCCLPP_DEVICE_INLINE void put(uint64_t offset, uint64_t size) { put(offset, offset, size); }

  // Asks the proxy to signal the peer (after everything posted before).
  MSCCLPP_DEVICE_INLINE void signal(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    fifo.push(trigger(TriggerFlag, 0, 0, 0), maxSpinCount);
  }

  // put then signal, in one trigger.
  MSCCLPP_DEVICE_INLINE void putWithSignal(uint64_t dstOffset, uint64_t srcOffset, uint64_t size,
                                           int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    fifo.push(trigger(TriggerData | TriggerFlag, dstOffset, srcOffset, size), maxSpinCount);
  }
  MSCCLPP_DEVICE_INLINE void putWithSignal(uint64_t offset, uint64_t size) { putWithSignal(offset, offset, size); }

  // put, signal and flush in one trigger; returns once the proxy has flushed.
  MSCCLPP_DEVICE_INLINE void putWithSignalAndFlush(uint64_t dstOffset, uint64_t srcOffset, uint64_t size,
                                                   int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    uint64_t pos = fifo.push(trigger(TriggerData | TriggerFlag | TriggerSync, dstOffset, srcOffset, size), maxSpinCount);
    fifo.sync(pos, maxSpinCount);
  }
  MSCCLPP_DEVICE_INLINE void putWithSignalAndFlush(uint64_t offset, uint64_t size) {
    putWithSignalAndFlush(offset, offset, size);
  }

  // Returns once everything posted before has completed on the connection.
  MSCCLPP_DEVICE_INLINE void flush(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) {
    uint64_t pos = fifo.push(trigger(TriggerSync, 0, 0, 0), maxSpinCount);
    fifo.sync(pos, maxSpinCount);
  }

  // Waits for the peer's next signal.
  MSCCLPP_DEVICE_INLINE void wait(int64_t maxSpinCount = MSCCLPP_DEFAULT_MAX_SPIN) { semaphore.wait(maxSpinCount); }

  // Consumes the peer's next signal if it has arrived.
  MSCCLPP_DEVICE_INLINE bool poll() { return semaphore.poll(); }
};

}  // namespace mscclpp
