//! Streams and events of the CUDA backend.
//!
//! **Buffer lifetime on streams** ([`mscclpp_hal::gpu_stream`]). Every operation that names a [`BufferSlice`] keeps a clone of
//! it in the stream's keep-alive list, tagged with the operation's sequence number; a successful
//! wait (synchronize, a host copy, or a stream query that finds the stream idle) releases the
//! entries it covers. So a buffer dropped by its user while a copy is queued is freed only after
//! the copy ran — the HAL contract. A stream dropped with work still running waits a little,
//! then leaks what the work still uses rather than free memory under the GPU.
//!
//! **Waits with deadlines.** CUDA has no timed wait: a wait records an event and polls
//! `cuEventQuery` (yielding, then sleeping with a growing interval) until it is reached or the
//! deadline passes. Sticky errors (a faulting kernel) come back from those queries.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use cudarc::driver::sys;
use mscclpp_hal::gpu_stream::{
    KeepAlive, check_copy_len, poll_until, staged_host_read, staged_host_write,
};
use mscclpp_hal::kernel::{aligned_args, check_launch};
use mscclpp_hal::{
    BackendKind, BufferSlice, Error, Event, Graph, Kernel, LaunchConfig, Result, Stream,
};

use crate::device::{Context, Features};
use crate::driver::check;
use crate::module::{CudaKernel, LoadedModule};

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
    Graph(Arc<GraphInner>),
}

#[derive(Debug, Default)]
struct State {
    /// Sequence numbers of enqueued operations and what they still need.
    keep: KeepAlive<Keep>,
    /// While capturing: the sequence number the capture started after.
    capture_from: Option<u64>,
}

/// `cuEventQuery` as reached / not yet / sticky error.
fn event_done(call: &'static str, ev: sys::CUevent) -> Result<bool> {
    // SAFETY: `ev` is a live event of the current context.
    match unsafe { sys::cuEventQuery(ev) } {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        r => check(call, r).map(|_| false),
    }
}

/// An owned event handle, destroyed on drop (with its context current).
#[derive(Debug)]
struct RawEvent {
    ctx: Arc<Context>,
    raw: sys::CUevent,
}

impl RawEvent {
    fn new(ctx: Arc<Context>, flags: sys::CUevent_flags) -> Result<Self> {
        ctx.bind()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(&mut raw, flags as u32)
        })?;
        Ok(RawEvent { ctx, raw })
    }
}

impl Drop for RawEvent {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once; destroying an event whose
            // recording is pending is allowed (the driver releases it on completion).
            let r = unsafe { sys::cuEventDestroy_v2(self.raw) };
            if let Err(e) = check("cuEventDestroy", r) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// An in-order CUDA stream (created non-blocking, so it does not synchronise with the legacy
/// default stream).
#[derive(Debug)]
pub struct CudaStream {
    ctx: Arc<Context>,
    raw: sys::CUstream,
    max_threads_per_block: u32,
    state: Mutex<State>,
    /// A caller's stream ([`CudaStream::borrowed`]): never destroyed here, keeps nothing alive.
    borrowed: bool,
}

// SAFETY: a CUstream is a driver handle usable from any thread with its context current; the
// mutable state is behind a mutex.
unsafe impl Send for CudaStream {}
// SAFETY: as above.
unsafe impl Sync for CudaStream {}

fn cuda_slice(s: &BufferSlice, what: &str) -> Result<sys::CUdeviceptr> {
    if s.buffer().backend() != BackendKind::Cuda {
        return Err(Error::invalid(format!(
            "{what} buffer belongs to the {} backend, not cuda",
            s.buffer().backend()
        )));
    }
    Ok(s.ptr().0)
}

fn cuda_event(e: &dyn Event) -> Result<&CudaEvent> {
    e.as_any()
        .downcast_ref::<CudaEvent>()
        .ok_or_else(|| Error::invalid("event was not created by the cuda backend"))
}

impl CudaStream {
    /// Creates a stream in `ctx`.
    pub fn new(ctx: Arc<Context>, max_threads_per_block: u32) -> Result<Self> {
        ctx.bind()?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the context is current.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut raw, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32)
        })?;
        Ok(CudaStream {
            ctx,
            raw,
            max_threads_per_block,
            state: Mutex::new(State::default()),
            borrowed: false,
        })
    }

    /// Wraps a stream the caller owns (`raw` may be null: the legacy default stream). The
    /// wrapper never destroys it, never waits for it on drop and keeps no buffer alive for the
    /// work it enqueues: the owner orders frees after the work (NCCL's contract with its
    /// callers). It never queries the stream on its own either, so enqueueing stays legal while
    /// the owner captures the stream into a CUDA graph.
    ///
    /// # Safety
    /// `raw` must be null or a live stream of `ctx`'s device that outlives the wrapper.
    pub unsafe fn borrowed(
        ctx: Arc<Context>,
        raw: sys::CUstream,
        max_threads_per_block: u32,
    ) -> Self {
        CudaStream {
            ctx,
            raw,
            max_threads_per_block,
            state: Mutex::new(State::default()),
            borrowed: true,
        }
    }

    /// Whether this wraps a caller's stream ([`CudaStream::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The raw `CUstream` (for interoperation, e.g. graph capture by a caller).
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues one operation (with the context current and the state locked, so that its
    /// sequence number orders it against recorded waits) and keeps `keep` alive until it ran.
    fn enqueue(
        &self,
        keep: impl IntoIterator<Item = Keep>,
        op: impl FnOnce(sys::CUstream) -> Result<()>,
    ) -> Result<()> {
        self.ctx.bind()?;
        let mut st = self.lock();
        op(self.raw)?;
        if self.borrowed {
            st.keep.enqueued_untracked();
            return Ok(());
        }
        st.keep.enqueued(keep, || {
            // SAFETY: live stream of the current context. Everything enqueued so far was
            // enqueued under this lock, so an idle stream has run all of it.
            let r = unsafe { sys::cuStreamQuery(self.raw) };
            r == sys::CUresult::CUDA_SUCCESS
        });
        Ok(())
    }

    /// Releases keep-alive entries of operations up to `seq` (which have run).
    fn release(&self, seq: u64) {
        self.lock().keep.release(seq);
    }

    /// Waits until everything enqueued so far has run; releases what it kept alive.
    fn wait_all(&self, timeout: Duration, what: &str) -> Result<()> {
        if self.lock().capture_from.is_some() {
            return Err(Error::invalid(format!(
                "{what}: the stream is capturing a graph; end the capture first"
            )));
        }
        let ev = RawEvent::new(
            self.ctx.clone(),
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING,
        )?;
        let seq = {
            let st = self.lock();
            // SAFETY: live event and stream of the current context (bound in RawEvent::new).
            check("cuEventRecord", unsafe {
                sys::cuEventRecord(ev.raw, self.raw)
            })?;
            st.keep.seq()
        };
        poll_until(
            timeout,
            || format!("cuda stream on device {} ({what})", self.ctx.ordinal()),
            || {
                self.ctx.bind()?;
                event_done("cuEventQuery", ev.raw)
            },
        )?;
        self.release(seq);
        Ok(())
    }
}

impl Drop for CudaStream {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if self.ctx.bind().is_err() {
            tracing::warn!("cannot make the context current to destroy a CUDA stream; leaking it");
            std::mem::forget(self.lock().keep.take());
            return;
        }
        let busy = !self.lock().keep.is_empty();
        if busy {
            if let Err(e) = self.wait_all(DROP_WAIT, "dropping the stream") {
                // The work may still be running and using these buffers: leaking them is the
                // only safe choice (freeing memory under the GPU would corrupt whatever is
                // allocated there next).
                let kept = self.lock().keep.take();
                tracing::warn!(
                    entries = kept.len(),
                    "dropping a CUDA stream whose work has not finished ({e}); leaking the buffers it uses"
                );
                std::mem::forget(kept);
            }
        }
        // SAFETY: created by cuStreamCreate, destroyed once; pending work (if any) still
        // completes, as the driver defers the release.
        let r = unsafe { sys::cuStreamDestroy_v2(self.raw) };
        if let Err(e) = check("cuStreamDestroy", r) {
            tracing::warn!("{e}");
        }
    }
}

impl Stream for CudaStream {
    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        check_copy_len("copy", src.len(), dst.len())?;
        let (d, s) = (cuda_slice(dst, "destination")?, cuda_slice(src, "source")?);
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        self.enqueue(
            [Keep::Slice(dst.clone()), Keep::Slice(src.clone())],
            |stream| {
                // SAFETY: both ranges were bounds-checked when the slices were made and are kept
                // alive until the copy ran; with unified addressing the driver finds each
                // pointer's device (peer-mapped IPC memory included).
                check("cuMemcpyDtoDAsync", unsafe {
                    sys::cuMemcpyDtoDAsync_v2(d, s, len, stream)
                })
            },
        )
    }

    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        let d = cuda_slice(dst, "destination")?;
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        self.enqueue([Keep::Slice(dst.clone())], |stream| {
            // SAFETY: bounds-checked range, kept alive until the memset ran.
            check("cuMemsetD8Async", unsafe {
                sys::cuMemsetD8Async(d, value, len, stream)
            })
        })
    }

    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        let d = cuda_slice(dst, "destination")?;
        if dst.len() != 8 || d % 8 != 0 {
            return Err(Error::invalid(format!(
                "write_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                dst.len(),
                dst.ptr()
            )));
        }
        self.enqueue([Keep::Slice(dst.clone())], |stream| {
            // SAFETY: an aligned 8-byte location, kept alive until the write ran.
            check("cuStreamWriteValue64", unsafe {
                sys::cuStreamWriteValue64_v2(
                    stream,
                    d,
                    value,
                    sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32,
                )
            })
        })
    }

    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        check_copy_len("host write", src.len(), dst.len())?;
        let d = cuda_slice(dst, "destination")?;
        if src.is_empty() {
            return Ok(());
        }
        // Through `staged_host_write`: earlier work is waited for first (a copy from pageable
        // memory would otherwise block inside the driver, without a deadline).
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_write(src, wait, |ptr, len| {
            self.enqueue([Keep::Slice(dst.clone())], |stream| {
                // SAFETY: the staging copy holds `len` bytes and outlives the copy (leaked if the
                // wait fails); the destination range is bounds-checked and kept alive.
                check("cuMemcpyHtoDAsync", unsafe {
                    sys::cuMemcpyHtoDAsync_v2(d, ptr.cast(), len, stream)
                })
            })
        })
    }

    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        check_copy_len("host read", src.len(), dst.len())?;
        let s = cuda_slice(src, "source")?;
        if dst.is_empty() {
            return Ok(());
        }
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_read(dst, wait, |ptr, len| {
            self.enqueue([Keep::Slice(src.clone())], |stream| {
                // SAFETY: the staging buffer holds `len` writable bytes and outlives the copy
                // (leaked if the wait fails); the source range is bounds-checked and kept alive.
                check("cuMemcpyDtoHAsync", unsafe {
                    sys::cuMemcpyDtoHAsync_v2(ptr.cast(), s, len, stream)
                })
            })
        })
    }

    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let k = kernel
            .as_any()
            .downcast_ref::<CudaKernel>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel {} was not loaded by the cuda backend",
                    kernel.id()
                ))
            })?;
        if k.device_ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "kernel {} was loaded on cuda device {} but launched on a stream of device {}",
                k.id(),
                k.device_ordinal(),
                self.ctx.ordinal()
            )));
        }
        let limit = self.max_threads_per_block.min(k.max_threads_per_block());
        check_launch(k.id(), &cfg, limit, k.param_size(), args)?;
        // An 8-byte aligned copy of the argument struct: cuLaunchKernel reads the parameter
        // through kernelParams[0] during the call.
        let mut words = aligned_args(args);
        let mut param: *mut std::ffi::c_void = words.as_mut_ptr().cast();
        let params: *mut *mut std::ffi::c_void = if args.is_empty() {
            std::ptr::null_mut()
        } else {
            &mut param
        };
        let func = k.raw();
        self.enqueue([Keep::Module(k.module().clone())], |stream| {
            // SAFETY: `func` belongs to a module kept alive until the kernel ran; `params` points
            // to one pointer to the argument bytes (one struct parameter), read during the call;
            // the shape was validated; device addresses inside `args` are the caller's contract.
            check("cuLaunchKernel", unsafe {
                sys::cuLaunchKernel(
                    func,
                    cfg.grid[0],
                    cfg.grid[1],
                    cfg.grid[2],
                    cfg.block[0],
                    cfg.block[1],
                    cfg.block[2],
                    cfg.shared_mem_bytes,
                    stream,
                    params,
                    std::ptr::null_mut(),
                )
            })
            .map_err(|e| e.with_context(|| format!("kernel {}, {cfg:?}", k.id())))
        })
    }

    fn record(&self, event: &dyn Event) -> Result<()> {
        let ev = cuda_event(event)?;
        if ev.inner.ctx.ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "event of cuda device {} recorded on a stream of device {}",
                ev.inner.ctx.ordinal(),
                self.ctx.ordinal()
            )));
        }
        let raw = ev.inner.raw;
        self.enqueue([], |stream| {
            // SAFETY: live event and stream of the same (current) context.
            check("cuEventRecord", unsafe { sys::cuEventRecord(raw, stream) })
        })
    }

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        let raw = cuda_event(event)?.inner.raw;
        self.enqueue([], |stream| {
            // SAFETY: live event and stream; waiting on another device's event is allowed.
            check("cuStreamWaitEvent", unsafe {
                sys::cuStreamWaitEvent(stream, raw, 0)
            })
        })
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        self.wait_all(timeout, "synchronize")
    }

    fn begin_capture(&self) -> Result<()> {
        self.ctx.bind()?;
        let mut st = self.lock();
        if st.capture_from.is_some() {
            return Err(Error::invalid(
                "begin_capture: the stream is already capturing",
            ));
        }
        // SAFETY: live stream of the current context. Relaxed mode: other threads may keep
        // making unrelated driver calls (the proxy, other streams) while this one captures.
        check("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(
                self.raw,
                sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
            )
        })?;
        st.capture_from = Some(st.keep.seq());
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        self.ctx.bind()?;
        let mut st = self.lock();
        let from = st
            .capture_from
            .take()
            .ok_or_else(|| Error::invalid("end_capture: the stream is not capturing"))?;
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: live stream of the current context, capturing (checked); valid out-pointer.
        check("cuStreamEndCapture", unsafe {
            sys::cuStreamEndCapture(self.raw, &mut graph)
        })?;
        // The captured operations never ran: what they use now belongs to the graph.
        let keep: Vec<Keep> = st.keep.take_after(from);
        let mut exec: sys::CUgraphExec = std::ptr::null_mut();
        // SAFETY: `graph` was just produced by the capture; valid out-pointer.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        if let Err(e) = check("cuGraphInstantiateWithFlags", r) {
            // SAFETY: the graph is ours and not instantiated.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok(Box::new(CudaGraph {
            inner: Arc::new(GraphInner {
                ctx: self.ctx.clone(),
                graph,
                exec,
                _keep: keep,
            }),
        }))
    }

    fn native_handle(&self) -> Option<u64> {
        Some(self.raw() as u64)
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// An event of the CUDA backend (timing enabled).
#[derive(Debug)]
pub struct CudaEvent {
    inner: RawEvent,
    features: Features,
}

// SAFETY: a CUevent is a driver handle usable from any thread with its context current.
unsafe impl Send for CudaEvent {}
// SAFETY: as above.
unsafe impl Sync for CudaEvent {}

type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

impl CudaEvent {
    /// Creates an event in `ctx`.
    pub fn new(ctx: Arc<Context>, features: Features) -> Result<Self> {
        Ok(CudaEvent {
            inner: RawEvent::new(ctx, sys::CUevent_flags::CU_EVENT_DEFAULT)?,
            features,
        })
    }

    /// The raw `CUevent`.
    pub fn raw(&self) -> sys::CUevent {
        self.inner.raw
    }
}

impl Event for CudaEvent {
    fn query(&self) -> Result<bool> {
        self.inner.ctx.bind()?;
        event_done("cuEventQuery", self.inner.raw)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        poll_until(
            timeout,
            || format!("a cuda event on device {}", self.inner.ctx.ordinal()),
            || self.query(),
        )
    }

    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64> {
        let start = cuda_event(start)?;
        self.inner.ctx.bind()?;
        let mut ms = 0f32;
        let r = if self.features.elapsed_time_v2 {
            // SAFETY: valid out-pointer and live events; the symbol exists (probe).
            unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.inner.raw, self.inner.raw) }
        } else if self.features.elapsed_time_v1 {
            // SAFETY: the probe found the library and this symbol; the type is the C declaration
            // `CUresult cuEventElapsedTime(float*, CUevent, CUevent)`.
            let f = unsafe {
                cudarc::driver::sys::culib()
                    .get::<ElapsedFn>(crate::driver::optional::EVENT_ELAPSED_TIME_V1.as_bytes())
            }
            .map_err(|e| Error::unavailable("cuEventElapsedTime", e.to_string()))?;
            // SAFETY: as above.
            unsafe { f(&mut ms, start.inner.raw, self.inner.raw) }
        } else {
            return Err(Error::unavailable(
                "event timing",
                "the CUDA driver has neither cuEventElapsedTime_v2 nor cuEventElapsedTime",
            ));
        };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(f64::from(ms)),
            sys::CUresult::CUDA_ERROR_NOT_READY | sys::CUresult::CUDA_ERROR_INVALID_HANDLE => {
                Err(Error::invalid(format!(
                    "elapsed time asked of events that have not both been recorded and reached ({})",
                    crate::driver::describe(r)
                )))
            }
            r => check("cuEventElapsedTime", r).map(|_| 0.0),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// The driver objects of a captured graph and what its work uses.
#[derive(Debug)]
struct GraphInner {
    ctx: Arc<Context>,
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    _keep: Vec<Keep>,
}

// SAFETY: driver handles usable from any thread with the context current.
unsafe impl Send for GraphInner {}
// SAFETY: as above; launching only reads the handles.
unsafe impl Sync for GraphInner {}

impl Drop for GraphInner {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by instantiation / capture, destroyed once; no launch is pending
            // (every launch keeps this value alive until its stream has passed it).
            unsafe {
                sys::cuGraphExecDestroy(self.exec);
                sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// A captured CUDA graph.
#[derive(Debug)]
pub struct CudaGraph {
    inner: Arc<GraphInner>,
}

impl Graph for CudaGraph {
    fn launch(&self, stream: &dyn Stream) -> Result<()> {
        let s = stream
            .as_any()
            .downcast_ref::<CudaStream>()
            .ok_or_else(|| {
                Error::invalid("a CUDA graph launched on a stream of another backend")
            })?;
        if !Arc::ptr_eq(&s.ctx, &self.inner.ctx) {
            return Err(Error::invalid(format!(
                "a graph captured on device {} launched on a stream of device {}",
                self.inner.ctx.ordinal(),
                s.ctx.ordinal()
            )));
        }
        let exec = self.inner.exec;
        s.enqueue([Keep::Graph(self.inner.clone())], |raw| {
            // SAFETY: live graph exec and stream of the current context (bound by enqueue).
            check("cuGraphLaunch", unsafe { sys::cuGraphLaunch(exec, raw) })
        })
    }
}
