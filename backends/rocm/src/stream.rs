//! Streams and events of the ROCm backend.
//!
//! **Buffer lifetime on streams** (as on CUDA, through [`mscclpp_hal::gpu_stream`]). Every operation that names a [`BufferSlice`]
//! keeps a clone of it in the stream's keep-alive list, tagged with the operation's sequence
//! number; a successful wait (synchronize, a host copy, or a stream query that finds the stream
//! idle) releases the entries it covers. So a buffer dropped by its user while a copy is queued
//! is freed only after the copy ran. A stream dropped with work still running waits a little,
//! then leaks what the work still uses rather than free memory under the GPU.
//!
//! **Waits with deadlines.** HIP has no timed wait either: a wait records an event and polls
//! `hipEventQuery` (yielding, then sleeping with a growing interval) until it is reached or the
//! deadline passes. Sticky errors (a faulting kernel) come back from those queries.
//!
//! Copies of every direction go through `hipMemcpyAsync` with `hipMemcpyDefault`: HIP's unified
//! addressing finds each pointer's kind and device (peer-mapped IPC memory included).

use std::ffi::c_void;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mscclpp_hal::gpu_stream::{
    KeepAlive, check_copy_len, poll_until, staged_host_read, staged_host_write,
};
use mscclpp_hal::kernel::{aligned_args, check_launch};
use mscclpp_hal::{BackendKind, BufferSlice, Error, Event, Kernel, LaunchConfig, Result, Stream};

use crate::device::DeviceCtx;
use crate::ffi::{self, HipEvent, HipStream};
use crate::module::{LoadedModule, RocmKernel};

/// The deadline of the blocking host copies (the HAL gives them none; one hour, as on host).
pub const HOST_COPY_DEADLINE: Duration = Duration::from_secs(3600);
/// How long dropping a busy stream waits before leaking the buffers its work still uses.
pub const DROP_WAIT: Duration = Duration::from_secs(5);

/// Something an enqueued operation needs until it has run.
#[derive(Debug)]
#[allow(dead_code)] // the fields are held for their `Drop`, never read
enum Keep {
    Slice(BufferSlice),
    Module(Arc<LoadedModule>),
}

/// Sequence numbers of enqueued operations and what they still need.
type State = KeepAlive<Keep>;

/// `hipEventQuery` as reached / not yet / sticky error.
fn event_done(ctx: &DeviceCtx, ev: HipEvent) -> Result<bool> {
    let api = ctx.api();
    // SAFETY: `ev` is a live event of this device.
    match unsafe { (api.event_query)(ev) } {
        ffi::code::SUCCESS => Ok(true),
        ffi::code::NOT_READY => Ok(false),
        r => api.check("hipEventQuery", r).map(|_| false),
    }
}

/// An owned event handle, destroyed on drop.
#[derive(Debug)]
struct RawEvent {
    ctx: Arc<DeviceCtx>,
    raw: HipEvent,
}

impl RawEvent {
    fn new(ctx: Arc<DeviceCtx>, flags: u32) -> Result<Self> {
        ctx.bind()?;
        let api = ctx.api();
        let mut raw: HipEvent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is current.
        api.check("hipEventCreateWithFlags", unsafe {
            (api.event_create_with_flags)(&mut raw, flags)
        })?;
        Ok(RawEvent { ctx, raw })
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let api = self.ctx.api();
            // SAFETY: created by hipEventCreateWithFlags, destroyed once; destroying an event
            // whose recording is pending is allowed (the runtime releases it on completion).
            let r = unsafe { (api.event_destroy)(self.raw) };
            if let Err(e) = api.check("hipEventDestroy", r) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// An in-order HIP stream (created non-blocking, so it does not synchronise with the null
/// stream).
#[derive(Debug)]
pub struct RocmStream {
    ctx: Arc<DeviceCtx>,
    raw: HipStream,
    max_threads_per_block: u32,
    state: Mutex<State>,
}

// SAFETY: a hipStream_t is a runtime handle usable from any thread (with its device current);
// the mutable state is behind a mutex.
unsafe impl Send for RocmStream {}
// SAFETY: as above.
unsafe impl Sync for RocmStream {}

fn rocm_slice(s: &BufferSlice, what: &str) -> Result<*mut c_void> {
    if s.buffer().backend() != BackendKind::Rocm {
        return Err(Error::invalid(format!(
            "{what} buffer belongs to the {} backend, not rocm",
            s.buffer().backend()
        )));
    }
    Ok(s.ptr().0 as *mut c_void)
}

fn rocm_event(e: &dyn Event) -> Result<&RocmEvent> {
    e.as_any()
        .downcast_ref::<RocmEvent>()
        .ok_or_else(|| Error::invalid("event was not created by the rocm backend"))
}

impl RocmStream {
    /// Creates a stream on `ctx`'s device.
    pub fn new(ctx: Arc<DeviceCtx>, max_threads_per_block: u32) -> Result<Self> {
        ctx.bind()?;
        let api = ctx.api();
        let mut raw: HipStream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the device is current.
        api.check("hipStreamCreateWithFlags", unsafe {
            (api.stream_create_with_flags)(&mut raw, ffi::STREAM_NON_BLOCKING)
        })?;
        Ok(RocmStream {
            ctx,
            raw,
            max_threads_per_block,
            state: Mutex::new(State::default()),
        })
    }

    /// The raw `hipStream_t` (for interoperation, e.g. graph capture by a caller).
    pub fn raw(&self) -> HipStream {
        self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues one operation (with the device current and the state locked, so that its
    /// sequence number orders it against recorded waits) and keeps `keep` alive until it ran.
    fn enqueue(
        &self,
        keep: impl IntoIterator<Item = Keep>,
        op: impl FnOnce(&'static ffi::Api, HipStream) -> Result<()>,
    ) -> Result<()> {
        self.ctx.bind()?;
        let api = self.ctx.api();
        let mut st = self.lock();
        op(api, self.raw)?;
        st.enqueued(keep, || {
            // SAFETY: live stream of the current device. Everything enqueued so far was
            // enqueued under this lock, so an idle stream has run all of it.
            let r = unsafe { (api.stream_query)(self.raw) };
            r == ffi::code::SUCCESS
        });
        Ok(())
    }

    /// Releases keep-alive entries of operations up to `seq` (which have run).
    fn release(&self, seq: u64) {
        self.lock().release(seq);
    }

    /// Waits until everything enqueued so far has run; releases what it kept alive.
    fn wait_all(&self, timeout: Duration, what: &str) -> Result<()> {
        let ev = RawEvent::new(self.ctx.clone(), ffi::EVENT_DISABLE_TIMING)?;
        let api = self.ctx.api();
        let seq = {
            let st = self.lock();
            // SAFETY: live event and stream of the current device (bound in RawEvent::new).
            api.check("hipEventRecord", unsafe {
                (api.event_record)(ev.raw, self.raw)
            })?;
            st.seq()
        };
        poll_until(
            timeout,
            || format!("rocm stream on device {} ({what})", self.ctx.ordinal()),
            || {
                self.ctx.bind()?;
                event_done(&self.ctx, ev.raw)
            },
        )?;
        self.release(seq);
        Ok(())
    }
}

impl Drop for RocmStream {
    fn drop(&mut self) {
        if self.ctx.bind().is_err() {
            tracing::warn!("cannot make the device current to destroy a HIP stream; leaking it");
            std::mem::forget(self.lock().take());
            return;
        }
        let busy = !self.lock().is_empty();
        if busy {
            if let Err(e) = self.wait_all(DROP_WAIT, "dropping the stream") {
                // The work may still be running and using these buffers: leaking them is the
                // only safe choice (freeing memory under the GPU would corrupt whatever is
                // allocated there next).
                let kept = self.lock().take();
                tracing::warn!(
                    entries = kept.len(),
                    "dropping a HIP stream whose work has not finished ({e}); leaking the buffers it uses"
                );
                std::mem::forget(kept);
            }
        }
        let api = self.ctx.api();
        // SAFETY: created by hipStreamCreateWithFlags, destroyed once; pending work (if any)
        // still completes (hipStreamDestroy waits for it).
        let r = unsafe { (api.stream_destroy)(self.raw) };
        if let Err(e) = api.check("hipStreamDestroy", r) {
            tracing::warn!("{e}");
        }
    }
}

impl Stream for RocmStream {
    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        check_copy_len("copy", src.len(), dst.len())?;
        let (d, s) = (rocm_slice(dst, "destination")?, rocm_slice(src, "source")?);
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        self.enqueue(
            [Keep::Slice(dst.clone()), Keep::Slice(src.clone())],
            |api, stream| {
                // SAFETY: both ranges were bounds-checked when the slices were made and are kept
                // alive until the copy ran; hipMemcpyDefault lets the runtime find each
                // pointer's device (peer-mapped IPC memory included).
                api.check("hipMemcpyAsync", unsafe {
                    (api.memcpy_async)(d, s, len, ffi::MEMCPY_DEFAULT, stream)
                })
            },
        )
    }

    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        let d = rocm_slice(dst, "destination")?;
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        self.enqueue([Keep::Slice(dst.clone())], |api, stream| {
            // SAFETY: bounds-checked range, kept alive until the memset ran.
            api.check("hipMemsetD8Async", unsafe {
                (api.memset_d8_async)(d, value, len, stream)
            })
        })
    }

    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        let d = rocm_slice(dst, "destination")?;
        if dst.len() != 8 || (d as u64) % 8 != 0 {
            return Err(Error::invalid(format!(
                "write_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                dst.len(),
                dst.ptr()
            )));
        }
        self.enqueue([Keep::Slice(dst.clone())], |api, stream| {
            // SAFETY: an aligned 8-byte location of device-accessible memory, kept alive until
            // the write ran; flags 0 is the plain ordered write.
            api.check("hipStreamWriteValue64", unsafe {
                (api.stream_write_value64)(stream, d, value, 0)
            })
        })
    }

    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        check_copy_len("host write", src.len(), dst.len())?;
        let d = rocm_slice(dst, "destination")?;
        if src.is_empty() {
            return Ok(());
        }
        // Through `staged_host_write`: earlier work is waited for first (a copy from pageable
        // memory may otherwise block inside the runtime, without a deadline).
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_write(src, wait, |ptr, len| {
            self.enqueue([Keep::Slice(dst.clone())], |api, stream| {
                // SAFETY: the staging copy holds `len` bytes and outlives the copy (leaked if the
                // wait fails); the destination range is bounds-checked and kept alive.
                api.check("hipMemcpyAsync", unsafe {
                    (api.memcpy_async)(d, ptr.cast(), len, ffi::MEMCPY_DEFAULT, stream)
                })
            })
        })
    }

    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        check_copy_len("host read", src.len(), dst.len())?;
        let s = rocm_slice(src, "source")?;
        if dst.is_empty() {
            return Ok(());
        }
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_read(dst, wait, |ptr, len| {
            self.enqueue([Keep::Slice(src.clone())], |api, stream| {
                // SAFETY: the staging buffer holds `len` writable bytes and outlives the copy
                // (leaked if the wait fails); the source range is bounds-checked and kept alive.
                api.check("hipMemcpyAsync", unsafe {
                    (api.memcpy_async)(ptr.cast(), s, len, ffi::MEMCPY_DEFAULT, stream)
                })
            })
        })
    }

    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let k = kernel
            .as_any()
            .downcast_ref::<RocmKernel>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel {} was not loaded by the rocm backend",
                    kernel.id()
                ))
            })?;
        if k.device_ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "kernel {} was loaded on rocm device {} but launched on a stream of device {}",
                k.id(),
                k.device_ordinal(),
                self.ctx.ordinal()
            )));
        }
        let limit = self.max_threads_per_block.min(k.max_threads_per_block());
        check_launch(k.id(), &cfg, limit, k.param_size(), args)?;
        // The kernel's argument segment holds the one struct parameter at offset 0; HIP copies
        // the buffer named by HIP_LAUNCH_PARAM_BUFFER_POINTER (of HIP_LAUNCH_PARAM_BUFFER_SIZE
        // bytes) into it during hipModuleLaunchKernel. An 8-byte aligned copy keeps the layout
        // the kernel expects whatever the caller's slice alignment.
        let mut words = aligned_args(args);
        let mut size: usize = args.len();
        let mut extra: [*mut c_void; 5] = [
            ffi::LAUNCH_PARAM_BUFFER_POINTER,
            words.as_mut_ptr().cast(),
            ffi::LAUNCH_PARAM_BUFFER_SIZE,
            (&mut size as *mut usize).cast(),
            ffi::LAUNCH_PARAM_END,
        ];
        let extra_ptr: *mut *mut c_void = if args.is_empty() {
            std::ptr::null_mut()
        } else {
            extra.as_mut_ptr()
        };
        let func = k.raw();
        self.enqueue([Keep::Module(k.module().clone())], |api, stream| {
            // SAFETY: `func` belongs to a module kept alive until the kernel ran; `extra` is the
            // documented BUFFER_POINTER/BUFFER_SIZE/END triple, read during the call, pointing
            // to `size` bytes; the shape was validated; device addresses inside `args` are the
            // caller's contract.
            api.check("hipModuleLaunchKernel", unsafe {
                (api.module_launch_kernel)(
                    func,
                    cfg.grid[0],
                    cfg.grid[1],
                    cfg.grid[2],
                    cfg.block[0],
                    cfg.block[1],
                    cfg.block[2],
                    cfg.shared_mem_bytes,
                    stream,
                    std::ptr::null_mut(),
                    extra_ptr,
                )
            })
            .map_err(|e| e.with_context(|| format!("kernel {}, {cfg:?}", k.id())))
        })
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let ev = rocm_event(event)?;
        if ev.inner.ctx.ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "event of rocm device {} recorded on a stream of device {}",
                ev.inner.ctx.ordinal(),
                self.ctx.ordinal()
            )));
        }
        let raw = ev.inner.raw;
        self.enqueue([], |api, stream| {
            // SAFETY: live event and stream of the same (current) device.
            api.check("hipEventRecord", unsafe { (api.event_record)(raw, stream) })
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let raw = rocm_event(event)?.inner.raw;
        self.enqueue([], |api, stream| {
            // SAFETY: live event and stream; waiting on another device's event is allowed.
            api.check("hipStreamWaitEvent", unsafe {
                (api.stream_wait_event)(stream, raw, 0)
            })
        })
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        self.wait_all(timeout, "synchronize")
    }

    fn native_handle(&self) -> Option<u64> {
        Some(self.raw() as u64)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An event of the ROCm backend (timing enabled).
#[derive(Debug)]
pub struct RocmEvent {
    inner: RawEvent,
}

// SAFETY: a hipEvent_t is a runtime handle usable from any thread.
unsafe impl Send for RocmEvent {}
// SAFETY: as above.
unsafe impl Sync for RocmEvent {}

impl RocmEvent {
    /// Creates an event on `ctx`'s device.
    pub fn new(ctx: Arc<DeviceCtx>) -> Result<Self> {
        Ok(RocmEvent {
            inner: RawEvent::new(ctx, ffi::EVENT_DEFAULT)?,
        })
    }

    /// The raw `hipEvent_t`.
    pub fn raw(&self) -> HipEvent {
        self.inner.raw
    }
}

impl Event for RocmEvent {
    fn query(&self) -> Result<bool> {
        self.inner.ctx.bind()?;
        event_done(&self.inner.ctx, self.inner.raw)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        poll_until(
            timeout,
            || format!("a rocm event on device {}", self.inner.ctx.ordinal()),
            || self.query(),
        )
    }

    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64> {
        let start = rocm_event(start)?;
        self.inner.ctx.bind()?;
        let api = self.inner.ctx.api();
        let mut ms = 0f32;
        // SAFETY: valid out-pointer and live events.
        let r = unsafe { (api.event_elapsed_time)(&mut ms, start.inner.raw, self.inner.raw) };
        match r {
            ffi::code::SUCCESS => Ok(f64::from(ms)),
            ffi::code::NOT_READY | ffi::code::INVALID_HANDLE => Err(Error::invalid(format!(
                "elapsed time asked of events that have not both been recorded and reached ({})",
                api.describe(r)
            ))),
            r => api.check("hipEventElapsedTime", r).map(|_| 0.0),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_until_times_out_and_propagates_errors() {
        let e =
            poll_until(Duration::from_millis(5), || "nothing".into(), || Ok(false)).unwrap_err();
        assert!(matches!(e, Error::Timeout { .. }), "{e}");
        let mut n = 0;
        poll_until(
            Duration::from_secs(5),
            || "three polls".into(),
            || {
                n += 1;
                Ok(n >= 3)
            },
        )
        .unwrap();
        let e = poll_until(
            Duration::from_secs(5),
            || "x".into(),
            || Err(Error::Internal("boom".into())),
        )
        .unwrap_err();
        assert!(e.to_string().contains("boom"));
    }
}
