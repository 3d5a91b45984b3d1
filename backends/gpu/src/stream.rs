//! Streams, events and graphs of the GPU backends.
//!
//! **Buffer lifetime on streams** ([`crate::keep`]). Every operation that names a
//! [`BufferSlice`] keeps a clone of it in the stream's keep-alive list, tagged with the
//! operation's sequence number; a successful wait (synchronize, a host copy, or a stream query
//! that finds the stream idle) releases the entries it covers. So a buffer dropped by its user
//! while a copy is queued is freed only after the copy ran — the HAL contract. A stream dropped
//! with work still running waits a little, then leaks what the work still uses rather than free
//! memory under the GPU.
//!
//! **Waits with deadlines.** The runtimes have no timed wait: a wait records an event and polls
//! it until it is reached or the deadline passes. Sticky errors (a faulting kernel) come back
//! from those queries.
//!
//! **Borrowed streams and graphs** exist where the runtime has them ([`Features`]): a borrowed
//! stream is the caller's, never destroyed or queried here; a capture turns what was enqueued
//! since `begin_capture` into a graph that owns what that work uses.
//!
//! [`Features`]: crate::Features

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use mscclpp_hal::kernel::{aligned_args, check_launch};
use mscclpp_hal::{
    BufferSlice, Error, EventApi, GraphApi, LaunchConfig, Result, StreamApi, WaitCmp,
};

use crate::capture::Relaxed;
use crate::context::Context;
use crate::keep::{KeepAlive, check_copy_len, poll_until, staged_host_read, staged_host_write};
use crate::module::{GpuKernel, LoadedModule};
use crate::runtime::Runtime;

/// The deadline of the blocking host copies (the HAL gives them none; one hour, as on host).
pub const HOST_COPY_DEADLINE: Duration = Duration::from_secs(3600);
/// How long dropping a busy stream waits before leaking the buffers its work still uses.
pub const DROP_WAIT: Duration = Duration::from_secs(5);

/// Something an enqueued operation needs until it has run.
#[derive(Debug)]
#[allow(dead_code)] // the fields are held for their `Drop`, never read
enum Keep<R: Runtime> {
    Slice(BufferSlice),
    Module(Arc<LoadedModule<R>>),
    Graph(Arc<GraphInner<R>>),
}

#[derive(Debug)]
struct State<R: Runtime> {
    /// Sequence numbers of enqueued operations and what they still need.
    keep: KeepAlive<Keep<R>>,
    /// While capturing: the sequence number the capture started after.
    capture_from: Option<u64>,
}

/// An owned event handle, destroyed on drop (with its context current).
#[derive(Debug)]
struct RawEvent<R: Runtime> {
    ctx: Arc<Context<R>>,
    raw: R::Event,
}

impl<R: Runtime> RawEvent<R> {
    fn new(ctx: Arc<Context<R>>, timing: bool) -> Result<Self> {
        ctx.bind()?;
        // SAFETY: the context is current.
        let raw = unsafe { ctx.runtime().event_create(timing) }?;
        Ok(RawEvent { ctx, raw })
    }

    /// Reached / not yet / sticky error.
    fn done(&self) -> Result<bool> {
        self.ctx.bind()?;
        // SAFETY: live event; the context is current.
        unsafe { self.ctx.runtime().event_query(self.raw) }
    }
}

impl<R: Runtime> Drop for RawEvent<R> {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            // SAFETY: created by event_create, destroyed once; destroying an event whose
            // recording is pending is allowed (the runtime releases it on completion).
            if let Err(e) = unsafe { self.ctx.runtime().event_destroy(self.raw) } {
                tracing::warn!("{e}");
            }
        }
    }
}

/// An in-order stream of a GPU backend (created non-blocking, so it does not synchronise with
/// the runtime's default stream).
#[derive(Debug)]
pub struct GpuStream<R: Runtime> {
    ctx: Arc<Context<R>>,
    raw: R::Stream,
    max_threads_per_block: u32,
    state: Mutex<State<R>>,
    /// A caller's stream ([`GpuStream::borrowed`]): never destroyed here, keeps nothing alive.
    borrowed: bool,
}

// SAFETY: a stream is a runtime handle usable from any thread with its context current; the
// mutable state is behind a mutex.
unsafe impl<R: Runtime> Send for GpuStream<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for GpuStream<R> {}

fn device_addr<R: Runtime>(s: &BufferSlice, what: &str) -> Result<u64> {
    let backend = s.buffer().backend();
    if backend != R::VENDOR.kind {
        return Err(Error::invalid(format!(
            "{what} buffer belongs to the {backend} backend, not {}",
            R::VENDOR.name
        )));
    }
    Ok(s.ptr().0)
}

impl<R: Runtime> GpuStream<R> {
    /// Creates a stream in `ctx`.
    pub fn new(ctx: Arc<Context<R>>, max_threads_per_block: u32) -> Result<Self> {
        ctx.bind()?;
        // SAFETY: the context is current.
        let raw = unsafe { ctx.runtime().stream_create() }?;
        Ok(Self::with(ctx, raw, max_threads_per_block, false))
    }

    fn with(
        ctx: Arc<Context<R>>,
        raw: R::Stream,
        max_threads_per_block: u32,
        borrowed: bool,
    ) -> Self {
        GpuStream {
            ctx,
            raw,
            max_threads_per_block,
            state: Mutex::new(State {
                keep: KeepAlive::default(),
                capture_from: None,
            }),
            borrowed,
        }
    }

    /// Wraps a stream the caller owns (the default stream included). The wrapper never
    /// destroys it, never waits for it on drop and keeps no buffer alive for the work it
    /// enqueues: the owner orders frees after the work (NCCL's contract with its callers). It
    /// never queries the stream on its own either, so enqueueing stays legal while the owner
    /// captures the stream into a graph.
    ///
    /// # Safety
    /// `raw` must be the default stream or a live stream of `ctx`'s device that outlives the
    /// wrapper.
    pub unsafe fn borrowed(
        ctx: Arc<Context<R>>,
        raw: R::Stream,
        max_threads_per_block: u32,
    ) -> Self {
        Self::with(ctx, raw, max_threads_per_block, true)
    }

    /// Whether this wraps a caller's stream ([`GpuStream::borrowed`]).
    pub fn is_borrowed(&self) -> bool {
        self.borrowed
    }

    /// The raw stream (for interoperation, e.g. graph capture by a caller).
    pub fn raw(&self) -> R::Stream {
        self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State<R>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Enqueues one operation (with the context current and the state locked, so that its
    /// sequence number orders it against recorded waits) and keeps `keep` alive until it ran.
    fn enqueue(
        &self,
        keep: impl IntoIterator<Item = Keep<R>>,
        op: impl FnOnce(&'static R, R::Stream) -> Result<()>,
    ) -> Result<()> {
        self.ctx.bind()?;
        let rt = self.ctx.runtime();
        let mut st = self.lock();
        op(rt, self.raw)?;
        if self.borrowed {
            st.keep.enqueued_untracked();
            return Ok(());
        }
        st.keep.enqueued(keep, || {
            // SAFETY: live stream of the current context. Everything enqueued so far was
            // enqueued under this lock, so an idle stream has run all of it.
            unsafe { rt.stream_query(self.raw) }.unwrap_or(false)
        });
        Ok(())
    }

    /// Waits until everything enqueued so far has run; releases what it kept alive. Its callers
    /// (drop, host copies, `synchronize_timeout`) hold [`Relaxed`] around it.
    fn wait_all(&self, timeout: Duration, what: &str) -> Result<()> {
        if self.lock().capture_from.is_some() {
            return Err(Error::invalid(format!(
                "{what}: the stream is capturing a graph; end the capture first"
            )));
        }
        let ev = RawEvent::new(self.ctx.clone(), false)?;
        let seq = {
            let st = self.lock();
            // SAFETY: live event and stream of the current context (bound in RawEvent::new).
            unsafe { self.ctx.runtime().event_record(ev.raw, self.raw) }?;
            st.keep.seq()
        };
        poll_until(
            timeout,
            || {
                format!(
                    "{} stream on device {} ({what})",
                    R::VENDOR.name,
                    self.ctx.ordinal()
                )
            },
            || ev.done(),
        )?;
        self.lock().keep.release(seq);
        Ok(())
    }

    fn check_capture_supported(&self, what: &str) -> Result<()> {
        if self.ctx.runtime().features().graph_capture {
            Ok(())
        } else {
            Err(Error::unavailable(
                "graph capture",
                format!(
                    "{what}: the {} runtime in use lacks stream capture",
                    R::VENDOR.runtime
                ),
            ))
        }
    }
}

impl<R: Runtime> Drop for GpuStream<R> {
    fn drop(&mut self) {
        if self.borrowed {
            return;
        }
        if self.ctx.lost() {
            // A device reset already freed the stream and everything it used.
            std::mem::forget(self.lock().keep.take());
            return;
        }
        if self.ctx.bind().is_err() {
            tracing::warn!(
                "cannot make the {} device current to destroy a stream; leaking it",
                R::VENDOR.name
            );
            std::mem::forget(self.lock().keep.take());
            return;
        }
        // A stream may be dropped on any thread at any time (a Python object collected while
        // PyTorch captures a graph): its wait and destroy must not end that capture.
        let _relaxed = Relaxed::new(self.ctx.runtime());
        let busy = !self.lock().keep.is_empty();
        if busy {
            if let Err(e) = self.wait_all(DROP_WAIT, "dropping the stream") {
                // The work may still be running and using these buffers: leaking them is the
                // only safe choice (freeing memory under the GPU would corrupt whatever is
                // allocated there next).
                let kept = self.lock().keep.take();
                tracing::warn!(
                    entries = kept.len(),
                    "dropping a {} stream whose work has not finished ({e}); leaking the buffers it uses",
                    R::VENDOR.runtime
                );
                std::mem::forget(kept);
            }
        }
        // SAFETY: created by stream_create, destroyed once; pending work (if any) still
        // completes.
        if let Err(e) = unsafe { self.ctx.runtime().stream_destroy(self.raw) } {
            tracing::warn!("{e}");
        }
    }
}

impl<R: Runtime> StreamApi for GpuStream<R> {
    type A = crate::Gpu<R>;

    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()> {
        check_copy_len("copy", src.len(), dst.len())?;
        let (d, s) = (
            device_addr::<R>(dst, "destination")?,
            device_addr::<R>(src, "source")?,
        );
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        self.enqueue(
            [Keep::Slice(dst.clone()), Keep::Slice(src.clone())],
            // SAFETY: both ranges were bounds-checked when the slices were made and are kept
            // alive until the copy ran; with unified addressing the runtime finds each
            // pointer's device (peer-mapped IPC memory included).
            |rt, stream| unsafe { rt.memcpy_dtod(d, s, len, stream) },
        )
    }

    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()> {
        let d = device_addr::<R>(dst, "destination")?;
        if dst.is_empty() {
            return Ok(());
        }
        let len = dst.len();
        // SAFETY: bounds-checked range, kept alive until the fill ran.
        self.enqueue([Keep::Slice(dst.clone())], |rt, stream| unsafe {
            rt.memset_d8(d, value, len, stream)
        })
    }

    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()> {
        let d = device_addr::<R>(dst, "destination")?;
        if dst.len() != 8 || d % 8 != 0 {
            return Err(Error::invalid(format!(
                "write_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                dst.len(),
                dst.ptr()
            )));
        }
        // SAFETY: an aligned 8-byte location, kept alive until the write ran.
        self.enqueue([Keep::Slice(dst.clone())], |rt, stream| unsafe {
            rt.write_value64(d, value, stream)
        })
    }

    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        let d = device_addr::<R>(flag, "flag")?;
        if flag.len() != 8 || d % 8 != 0 {
            return Err(Error::invalid(format!(
                "wait_value64 needs an 8-byte aligned 8-byte slice; got {} bytes at {:?}",
                flag.len(),
                flag.ptr()
            )));
        }
        // SAFETY: an aligned 8-byte location, kept alive until the wait ran.
        self.enqueue([Keep::Slice(flag.clone())], |rt, stream| unsafe {
            rt.wait_value64(d, value, cmp, stream)
        })
    }

    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()> {
        // Pinned staging, a copy and a wait: host work of this library's own (capture.rs).
        let _relaxed = Relaxed::new(self.ctx.runtime());
        check_copy_len("host write", src.len(), dst.len())?;
        let d = device_addr::<R>(dst, "destination")?;
        if src.is_empty() {
            return Ok(());
        }
        // Through `staged_host_write`: earlier work is waited for first (a copy from pageable
        // memory would otherwise block inside the runtime, without a deadline).
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_write(src, wait, |ptr, len| {
            // SAFETY: the staging copy holds `len` bytes and outlives the copy (leaked if the
            // wait fails); the destination range is bounds-checked and kept alive.
            self.enqueue([Keep::Slice(dst.clone())], |rt, stream| unsafe {
                rt.memcpy_htod(d, ptr, len, stream)
            })
        })
    }

    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()> {
        // As in `write_from_host`.
        let _relaxed = Relaxed::new(self.ctx.runtime());
        check_copy_len("host read", src.len(), dst.len())?;
        let s = device_addr::<R>(src, "source")?;
        if dst.is_empty() {
            return Ok(());
        }
        let wait = |what: &str| self.wait_all(HOST_COPY_DEADLINE, what);
        staged_host_read(dst, wait, |ptr, len| {
            // SAFETY: the staging buffer holds `len` writable bytes and outlives the copy
            // (leaked if the wait fails); the source range is bounds-checked and kept alive.
            self.enqueue([Keep::Slice(src.clone())], |rt, stream| unsafe {
                rt.memcpy_dtoh(ptr, s, len, stream)
            })
        })
    }

    unsafe fn launch_raw(&self, k: &GpuKernel<R>, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let name = R::VENDOR.name;
        if k.device_ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "kernel {} was loaded on {name} device {} but launched on a stream of device {}",
                k.id(),
                k.device_ordinal(),
                self.ctx.ordinal()
            )));
        }
        let limit = self.max_threads_per_block.min(k.max_threads_per_block());
        check_launch(k.id(), &cfg, limit, Some(k.param_size()), args)?;
        // An 8-byte aligned copy of the argument struct, read by the runtime during the call.
        let mut words = aligned_args(args);
        let len = args.len();
        let func = k.raw();
        self.enqueue([Keep::Module(k.module().clone())], |rt, stream| {
            // SAFETY: `func` belongs to a module kept alive until the kernel ran; `words` holds
            // the `len` argument bytes for the call; the shape was validated; device addresses
            // inside `args` are the caller's contract.
            unsafe { rt.launch(func, &cfg, stream, &mut words, len) }
                .map_err(|e| e.with_context(|| format!("kernel {}, {cfg:?}", k.id())))
        })
    }

    fn record(&self, ev: &GpuEvent<R>) -> Result<()> {
        if ev.inner.ctx.ordinal() != self.ctx.ordinal() {
            return Err(Error::invalid(format!(
                "event of {} device {} recorded on a stream of device {}",
                R::VENDOR.name,
                ev.inner.ctx.ordinal(),
                self.ctx.ordinal()
            )));
        }
        let raw = ev.inner.raw;
        // SAFETY: live event and stream of the same (current) context.
        self.enqueue([], |rt, stream| unsafe { rt.event_record(raw, stream) })
    }

    fn is_capturing(&self) -> Result<bool> {
        if self.lock().capture_from.is_some() {
            return Ok(true);
        }
        if !self.ctx.runtime().features().graph_capture {
            return Ok(false);
        }
        self.ctx.bind()?;
        // SAFETY: live stream of the current context.
        unsafe { self.ctx.runtime().stream_is_capturing(self.raw) }
    }

    fn wait_event(&self, event: &GpuEvent<R>) -> Result<()> {
        let raw = event.inner.raw;
        // SAFETY: live event and stream; waiting on another device's event is allowed.
        self.enqueue([], |rt, stream| unsafe {
            rt.stream_wait_event(stream, raw)
        })
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        let _relaxed = Relaxed::new(self.ctx.runtime());
        self.wait_all(timeout, "synchronize")
    }

    fn begin_capture(&self) -> Result<()> {
        self.check_capture_supported("begin_capture")?;
        self.ctx.bind()?;
        let mut st = self.lock();
        if st.capture_from.is_some() {
            return Err(Error::invalid(
                "begin_capture: the stream is already capturing",
            ));
        }
        // SAFETY: live stream of the current context.
        unsafe { self.ctx.runtime().stream_begin_capture(self.raw) }?;
        st.capture_from = Some(st.keep.seq());
        Ok(())
    }

    fn end_capture(&self) -> Result<Box<GpuGraph<R>>> {
        self.check_capture_supported("end_capture")?;
        self.ctx.bind()?;
        let rt = self.ctx.runtime();
        let mut st = self.lock();
        let from = st
            .capture_from
            .take()
            .ok_or_else(|| Error::invalid("end_capture: the stream is not capturing"))?;
        // SAFETY: live stream of the current context, capturing (checked).
        let graph = unsafe { rt.stream_end_capture(self.raw) }?;
        // The captured operations never ran: what they use now belongs to the graph.
        let keep: Vec<Keep<R>> = st.keep.take_after(from);
        // SAFETY: `graph` was just produced by the capture.
        let exec = match unsafe { rt.graph_instantiate(graph) } {
            Ok(exec) => exec,
            Err(e) => {
                // SAFETY: the graph is ours and not instantiated.
                if let Err(d) = unsafe { rt.graph_destroy(graph) } {
                    tracing::warn!("{d}");
                }
                return Err(e);
            }
        };
        Ok(Box::new(GpuGraph {
            inner: Arc::new(GraphInner {
                ctx: self.ctx.clone(),
                graph,
                exec,
                _keep: keep,
            }),
        }))
    }

    fn device_lost(&self) -> bool {
        self.ctx.lost()
    }

    fn native_handle(&self) -> Option<u64> {
        Some(R::stream_to_native(self.raw))
    }

    unsafe fn record_native_event(&self, native: u64) -> Result<()> {
        if native == 0 {
            return Err(Error::invalid("recording a NULL event"));
        }
        let raw = R::event_from_native(native);
        // SAFETY: the caller's live event (contract) and this live stream.
        self.enqueue([], |rt, stream| unsafe { rt.event_record(raw, stream) })
    }
}

/// An event of a GPU backend (timing enabled).
#[derive(Debug)]
pub struct GpuEvent<R: Runtime> {
    inner: RawEvent<R>,
}

// SAFETY: an event is a runtime handle usable from any thread with its context current.
unsafe impl<R: Runtime> Send for GpuEvent<R> {}
// SAFETY: as above.
unsafe impl<R: Runtime> Sync for GpuEvent<R> {}

impl<R: Runtime> GpuEvent<R> {
    /// Creates an event in `ctx` that records timing.
    pub fn new(ctx: Arc<Context<R>>) -> Result<Self> {
        Ok(GpuEvent {
            inner: RawEvent::new(ctx, true)?,
        })
    }

    /// Creates an event in `ctx` for ordering only (no timing).
    pub fn new_untimed(ctx: Arc<Context<R>>) -> Result<Self> {
        Ok(GpuEvent {
            inner: RawEvent::new(ctx, false)?,
        })
    }

    /// The raw event.
    pub fn raw(&self) -> R::Event {
        self.inner.raw
    }
}

impl<R: Runtime> EventApi for GpuEvent<R> {
    type A = crate::Gpu<R>;

    fn query(&self) -> Result<bool> {
        self.inner.done()
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        let _relaxed = Relaxed::new(self.inner.ctx.runtime());
        poll_until(
            timeout,
            || {
                format!(
                    "a {} event on device {}",
                    R::VENDOR.name,
                    self.inner.ctx.ordinal()
                )
            },
            || self.query(),
        )
    }

    fn elapsed_ms_since(&self, start: &GpuEvent<R>) -> Result<f64> {
        self.inner.ctx.bind()?;
        // SAFETY: live events; the context is current.
        let ms = unsafe {
            self.inner
                .ctx
                .runtime()
                .event_elapsed_ms(start.inner.raw, self.inner.raw)
        }?;
        Ok(f64::from(ms))
    }
}

/// The runtime objects of a captured graph and what its work uses.
#[derive(Debug)]
struct GraphInner<R: Runtime> {
    ctx: Arc<Context<R>>,
    graph: R::Graph,
    exec: R::GraphExec,
    _keep: Vec<Keep<R>>,
}

// SAFETY: runtime handles usable from any thread with the context current.
unsafe impl<R: Runtime> Send for GraphInner<R> {}
// SAFETY: as above; launching only reads the handles.
unsafe impl<R: Runtime> Sync for GraphInner<R> {}

impl<R: Runtime> Drop for GraphInner<R> {
    fn drop(&mut self) {
        if self.ctx.bind().is_ok() {
            let rt = self.ctx.runtime();
            // SAFETY: created by instantiation / capture, destroyed once; no launch is pending
            // (every launch keeps this value alive until its stream has passed it).
            let exec = unsafe { rt.graph_exec_destroy(self.exec) };
            // SAFETY: as above.
            let graph = unsafe { rt.graph_destroy(self.graph) };
            for e in [exec, graph].into_iter().filter_map(Result::err) {
                tracing::warn!("{e}");
            }
        }
    }
}

/// A captured graph.
#[derive(Debug)]
pub struct GpuGraph<R: Runtime> {
    inner: Arc<GraphInner<R>>,
}

impl<R: Runtime> GraphApi for GpuGraph<R> {
    type A = crate::Gpu<R>;

    fn launch(&self, s: &GpuStream<R>) -> Result<()> {
        if !Arc::ptr_eq(&s.ctx, &self.inner.ctx) {
            return Err(Error::invalid(format!(
                "a graph captured on device {} launched on a stream of device {}",
                self.inner.ctx.ordinal(),
                s.ctx.ordinal()
            )));
        }
        let exec = self.inner.exec;
        // SAFETY: live graph exec and stream of the current context (bound by enqueue).
        s.enqueue([Keep::Graph(self.inner.clone())], |rt, raw| unsafe {
            rt.graph_launch(exec, raw)
        })
    }
}
