//! Streams, graphs and events of the host backend: one worker thread per stream runs jobs in
//! order.
//!
//! The stream's queue and worker are in `queue` (a bounded queue: a producer that runs ahead
//! of the worker by [`QUEUE_DEPTH`] operations blocks, for up to [`QUEUE_WAIT`]); graphs (a
//! capture replayed) in `graph`; events in `event`. This file holds the operations a host
//! stream offers ([`Stream`] for [`HostStream`]): copies, fills, flag writes and waits, kernel
//! launches, event records and waits, synchronisation and capture.

mod event;
mod graph;
mod queue;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_hal::{BufferSlice, Error, LaunchConfig, Result, StreamApi, WaitCmp};

use crate::kernels::{HostKernel, MAX_THREADS_PER_BLOCK};
use event::relay;

pub use event::HostEvent;
pub use graph::HostGraph;
pub use queue::{HostStream, QUEUE_DEPTH, QUEUE_WAIT};

fn check_host(s: &BufferSlice, what: &str) -> Result<*mut u8> {
    if s.buffer().backend() != mscclpp_hal::BackendKind::Host {
        return Err(Error::invalid(format!(
            "{what} buffer belongs to the {} backend, not host",
            s.buffer().backend()
        )));
    }
    s.host_ptr()
        .ok_or_else(|| Error::Internal(format!("{what} host buffer without a host pointer")))
}

/// A raw pointer that may cross to the worker thread: the job that uses it also holds the
/// buffer it points into, which keeps the mapping alive.
#[derive(Clone, Copy)]
struct SendPtr(*mut u8);
// SAFETY: see the type's doc; the pointee is shared memory with device semantics.
unsafe impl Send for SendPtr {}
// SAFETY: the pointer is only copied out, never dereferenced through a shared reference; a
// replayed (captured) operation holds it the same way as a one-shot one.
unsafe impl Sync for SendPtr {}

impl SendPtr {
    /// Taking `self` makes closures capture the whole `SendPtr` (not its non-`Send` field).
    fn get(self) -> *mut u8 {
        self.0
    }
}

impl StreamApi for HostStream {
    type A = crate::Host;

    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::invalid(format!(
                "copy of {} bytes into a destination of {} bytes",
                src.len(),
                dst.len()
            )));
        }
        let (d, s) = (
            SendPtr(check_host(dst, "destination")?),
            SendPtr(check_host(src, "source")?),
        );
        let (keep_d, keep_s, len) = (dst.clone(), src.clone(), dst.len());
        self.submit(Arc::new(move || {
            let _keep = (&keep_d, &keep_s);
            // SAFETY: both ranges were bounds-checked when the slices were made and the mappings
            // are kept alive by the slices held in this closure. `copy` (memmove) tolerates
            // overlap, which can happen when both are views of one buffer.
            unsafe { std::ptr::copy(s.get(), d.get(), len) };
            Ok(())
        }))
    }

    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        let d = SendPtr(check_host(dst, "destination")?);
        let (keep, len) = (dst.clone(), dst.len());
        self.submit(Arc::new(move || {
            let _keep = &keep;
            // SAFETY: bounds-checked range of a mapping kept alive by `keep`.
            unsafe { std::ptr::write_bytes(d.get(), value, len) };
            Ok(())
        }))
    }

    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        let d = SendPtr(check_host(dst, "destination")?);
        if dst.len() != 8 || d.get() as usize % 8 != 0 {
            return Err(Error::invalid(format!(
                "write_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                dst.len(),
                dst.ptr()
            )));
        }
        let keep = dst.clone();
        self.submit(Arc::new(move || {
            let _keep = &keep;
            // SAFETY: an aligned 8-byte location inside a mapping kept alive by `keep`; every
            // concurrent access to a token is atomic.
            let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(d.get().cast::<u64>()) };
            a.store(value, std::sync::atomic::Ordering::Release);
            Ok(())
        }))
    }

    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        let d = SendPtr(check_host(flag, "flag")?);
        if flag.len() != 8 || d.get() as usize % 8 != 0 {
            return Err(Error::invalid(format!(
                "wait_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                flag.len(),
                flag.ptr()
            )));
        }
        let (keep, at) = (flag.clone(), flag.ptr());
        // As a kernel's waits do: the launching thread's abort word ends the wait when a peer
        // is known dead, and the deadline when a peer never comes.
        let abort = mscclpp_hal::dev::current_abort();
        self.submit(Arc::new(move || {
            let _keep = &keep;
            let _abort = mscclpp_hal::dev::abort_scope(abort);
            // SAFETY: an aligned 8-byte location inside a mapping kept alive by `keep`; every
            // concurrent access to a flag is atomic.
            let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(d.get().cast::<u64>()) };
            mscclpp_hal::dev::spin_until(
                mscclpp_hal::dev::DEFAULT_WAIT,
                || {
                    format!(
                        "the word at {at:?} to be {cmp:?} {value} (it holds {})",
                        a.load(std::sync::atomic::Ordering::Relaxed)
                    )
                },
                || cmp.holds(a.load(std::sync::atomic::Ordering::Acquire), value),
            )
        }))
    }

    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::invalid(format!(
                "host write of {} bytes into a destination of {} bytes",
                src.len(),
                dst.len()
            )));
        }
        let d = SendPtr(check_host(dst, "destination")?);
        let keep = dst.clone();
        // Staged through an owned copy so that a timed-out wait can never leave the worker
        // reading the caller's slice after we have returned.
        let data = src.to_vec();
        self.run_and_wait(move || {
            let _keep = &keep;
            // SAFETY: bounds-checked range of a mapping kept alive by `keep`; `data` is ours.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), d.get(), data.len()) };
            Ok(())
        })
    }

    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        if dst.len() != src.len() {
            return Err(Error::invalid(format!(
                "host read of {} bytes into a destination of {} bytes",
                src.len(),
                dst.len()
            )));
        }
        let s = SendPtr(check_host(src, "source")?);
        let (keep, len) = (src.clone(), src.len());
        let data = self.run_and_wait(move || {
            let _keep = &keep;
            let mut out = vec![0u8; len];
            // SAFETY: bounds-checked range of a mapping kept alive by `keep`.
            unsafe { std::ptr::copy_nonoverlapping(s.get(), out.as_mut_ptr(), len) };
            Ok(out)
        })?;
        dst.copy_from_slice(&data);
        Ok(())
    }

    unsafe fn launch_raw(&self, k: &HostKernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        cfg.validate(MAX_THREADS_PER_BLOCK)?;
        let (func, id, args) = (k.func, k.id, args.to_vec());
        // The launching thread's abort word (its communicator's), polled by the kernel's waits.
        let abort = mscclpp_hal::dev::current_abort();
        self.submit(Arc::new(move || {
            tracing::trace!(kernel = %id, ?cfg, "host kernel");
            let _abort = mscclpp_hal::dev::abort_scope(abort);
            func(&cfg, &args)
        }))
    }

    fn record(&self, event: &HostEvent) -> Result<()> {
        self.refuse_while_capturing("recording an event")?;
        let ev = event.inner.clone();
        let generation = {
            let mut s = ev.lock();
            s.recorded += 1;
            s.recorded
        };
        let skipped = ev.clone();
        // Not `submit`: a record is refused while capturing (above).
        self.enqueue_with(
            Arc::new(move || {
                ev.reach(generation, None);
                Ok(())
            }),
            // Behind an error the event is still reached, carrying the error, so that a stream
            // waiting for it fails with it instead of waiting for its deadline.
            Some(Arc::new(move |e: &Error| {
                skipped.reach(generation, Some(relay(e)))
            })),
        )
    }

    fn is_capturing(&self) -> Result<bool> {
        Ok(self.capturing())
    }

    fn wait_event(&self, event: &HostEvent) -> Result<()> {
        self.refuse_while_capturing("waiting for an event")?;
        let ev = event.inner.clone();
        let generation = ev.lock().recorded;
        self.submit(Arc::new(move || {
            ev.wait_for(generation, Duration::from_secs(3600))
        }))
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        self.refuse_while_capturing("synchronize")?;
        let deadline = Instant::now() + timeout;
        let mut p = self.shared.lock();
        let target = p.enqueued;
        while p.completed < target {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "host stream: {} of {} operations still pending",
                        target - p.completed,
                        target
                    ),
                    after: timeout,
                });
            }
            p = self
                .shared
                .changed
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match p.error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn begin_capture(&self) -> Result<()> {
        let mut c = self.capture.lock().unwrap_or_else(|p| p.into_inner());
        if c.is_some() {
            return Err(Error::invalid(
                "begin_capture: the stream is already capturing",
            ));
        }
        *c = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<HostGraph>> {
        let ops = self
            .capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::invalid("end_capture: the stream is not capturing"))?;
        Ok(Box::new(HostGraph::new(ops)))
    }
}
