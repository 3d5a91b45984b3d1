//! Port channels: the device posts requests into the proxy FIFO and the host proxy carries them
//! out over the connection (copy engine, TCP, RDMA), then signals the peer's semaphore.

use std::time::Duration;

use super::{FifoDeviceHandle, Host2DeviceSemaphoreDeviceHandle, ProxyTrigger, TriggerType};
use crate::error::Result;

/// What device code holds of a port channel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PortChannelDeviceHandle {
    /// Which of the proxy's semaphores (and connections) the channel uses.
    pub semaphore_id: u32,
    /// Proxy memory id of the destination (the peer's registered memory).
    pub dst: u32,
    /// Proxy memory id of the local source.
    pub src: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
    /// The local side of the semaphore the peer's proxy signals.
    pub semaphore: Host2DeviceSemaphoreDeviceHandle,
    /// The proxy's FIFO.
    pub fifo: FifoDeviceHandle,
}

impl PortChannelDeviceHandle {
    fn trigger(&self, kind: u64, dst_off: u64, src_off: u64, size: u64) -> Result<ProxyTrigger> {
        ProxyTrigger::new(
            kind,
            self.dst,
            dst_off,
            self.src,
            src_off,
            size,
            self.semaphore_id,
        )
    }

    /// Asks the proxy to copy `size` bytes from `src + src_off` to `dst + dst_off`.
    ///
    /// # Safety
    /// The FIFO's addresses must be live (see [`FifoDeviceHandle::push`]).
    pub unsafe fn put(
        &self,
        dst_off: u64,
        src_off: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        let t = self.trigger(TriggerType::DATA, dst_off, src_off, size)?;
        // SAFETY: caller's contract.
        unsafe { self.fifo.push(t, timeout) }.map(|_| ())
    }

    /// Asks the proxy to signal the peer (after everything posted before).
    ///
    /// # Safety
    /// As for [`Self::put`].
    pub unsafe fn signal(&self, timeout: Duration) -> Result<()> {
        let t = self.trigger(TriggerType::FLAG, 0, 0, 0)?;
        // SAFETY: caller's contract.
        unsafe { self.fifo.push(t, timeout) }.map(|_| ())
    }

    /// `put` then `signal`, in one trigger.
    ///
    /// # Safety
    /// As for [`Self::put`].
    pub unsafe fn put_with_signal(
        &self,
        dst_off: u64,
        src_off: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        let t = self.trigger(
            TriggerType::DATA | TriggerType::FLAG,
            dst_off,
            src_off,
            size,
        )?;
        // SAFETY: caller's contract.
        unsafe { self.fifo.push(t, timeout) }.map(|_| ())
    }

    /// `put`, `signal` and `flush` in one trigger; returns once the proxy has flushed.
    ///
    /// # Safety
    /// As for [`Self::put`].
    pub unsafe fn put_with_signal_and_flush(
        &self,
        dst_off: u64,
        src_off: u64,
        size: u64,
        timeout: Duration,
    ) -> Result<()> {
        let t = self.trigger(
            TriggerType::DATA | TriggerType::FLAG | TriggerType::SYNC,
            dst_off,
            src_off,
            size,
        )?;
        // SAFETY: caller's contract.
        unsafe {
            let pos = self.fifo.push(t, timeout)?;
            self.fifo.sync(pos, timeout)
        }
    }

    /// Returns once everything posted before has completed on the connection.
    ///
    /// # Safety
    /// As for [`Self::put`].
    pub unsafe fn flush(&self, timeout: Duration) -> Result<()> {
        let t = self.trigger(TriggerType::SYNC, 0, 0, 0)?;
        // SAFETY: caller's contract.
        unsafe {
            let pos = self.fifo.push(t, timeout)?;
            self.fifo.sync(pos, timeout)
        }
    }

    /// Waits for the peer's next signal.
    ///
    /// # Safety
    /// The semaphore's addresses must be live.
    pub unsafe fn wait(&self, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        unsafe { self.semaphore.wait(timeout) }
    }

    /// Consumes the peer's next signal if it has arrived.
    ///
    /// # Safety
    /// As for [`Self::wait`].
    pub unsafe fn poll(&self) -> bool {
        // SAFETY: caller's contract.
        unsafe { self.semaphore.poll() }
    }
}
