//! Streams and events of the host backend: one worker thread per stream runs jobs in order.
//!
//! A stream's queue is bounded, as a GPU's launch queue is: a producer that runs ahead of the
//! worker by [`QUEUE_DEPTH`] operations blocks until one finishes, and gives up with
//! `Error::Timeout` after [`QUEUE_WAIT`]. Without the bound a loop of launches grows memory
//! without limit whenever the worker falls behind (a slow peer, a dead one).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::{
    BufferSlice, Error, Event, Graph, Kernel, LaunchConfig, Result, Stream, WaitCmp,
};

use crate::kernels::{HostKernel, MAX_THREADS_PER_BLOCK};

/// Operations a stream holds before its producer blocks (CUDA's launch queue is about as deep).
pub const QUEUE_DEPTH: usize = 1024;

/// How long a producer waits for room in a full queue. The worker's own waits (kernels waiting
/// for a peer, events) end on their deadlines, so a full queue that stays full this long means
/// a job that never returns.
pub const QUEUE_WAIT: Duration = Duration::from_secs(3600);

/// One enqueued operation. `Fn` (not `FnOnce`) so that a captured graph can replay it.
type Job = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// What a job does instead when it is skipped behind an earlier error (an event record: the
/// event is reached, failed, so that a stream waiting for it does not wait forever).
type OnSkip = Arc<dyn Fn(&Error) + Send + Sync>;

/// A job in a stream's queue.
struct Queued {
    job: Job,
    on_skip: Option<OnSkip>,
}

/// Progress of a stream, shared with its worker.
#[derive(Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
    /// The first error since the last synchronize; later jobs are skipped while it is pending,
    /// since they usually depend on the failed one.
    error: Option<Error>,
    /// Jobs not yet taken by the worker; at most the stream's depth.
    queue: VecDeque<Queued>,
    /// Set when the stream is dropped: the worker finishes the queue and exits.
    closed: bool,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("enqueued", &self.enqueued)
            .field("completed", &self.completed)
            .field("error", &self.error)
            .field("queued", &self.queue.len())
            .finish()
    }
}

#[derive(Debug, Default)]
struct Shared {
    progress: Mutex<Progress>,
    /// Signalled when a job completes (room in the queue, synchronize).
    changed: Condvar,
    /// Signalled when a job is queued or the stream closes (the worker).
    queued: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Progress> {
        // A job that panicked is caught in the worker, so poisoning only means a panic inside
        // this module's own short critical sections; the counters are still consistent.
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An in-order stream executed by a worker thread.
pub struct HostStream {
    shared: Arc<Shared>,
    /// While capturing: the operations recorded so far.
    capture: Mutex<Option<Vec<Job>>>,
    depth: usize,
    wait: Duration,
}

impl std::fmt::Debug for HostStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStream")
            .field("progress", &self.shared.progress)
            .field("capturing", &self.capturing())
            .field("depth", &self.depth)
            .finish()
    }
}

impl HostStream {
    /// Starts the worker, with a queue of [`QUEUE_DEPTH`] operations.
    pub fn new() -> Result<Self> {
        Self::with_queue(QUEUE_DEPTH, QUEUE_WAIT)
    }

    /// Starts the worker with a queue of `depth` operations; a producer waits up to `wait` for
    /// room in it.
    pub fn with_queue(depth: usize, wait: Duration) -> Result<Self> {
        if depth == 0 {
            return Err(Error::invalid(
                "a host stream queue of depth 0 could never hold an operation; expected at least 1",
            ));
        }
        let shared = Arc::new(Shared::default());
        let worker_shared = shared.clone();
        std::thread::Builder::new()
            .name("mscclpp-host-stream".into())
            .spawn(move || worker(&worker_shared))
            .map_err(|e| Error::io("spawning a host stream worker", e))?;
        Ok(HostStream {
            shared,
            capture: Mutex::new(None),
            depth,
            wait,
        })
    }

    fn capturing(&self) -> bool {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing() {
            return Err(Error::invalid(format!(
                "{what} while the stream is capturing a graph; end the capture first"
            )));
        }
        Ok(())
    }

    fn submit(&self, job: Job) -> Result<()> {
        if let Some(ops) = self
            .capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_mut()
        {
            ops.push(job);
            return Ok(());
        }
        self.enqueue(job)
    }

    /// Queues a job, waiting (up to the stream's wait) while the queue is full.
    fn enqueue(&self, job: Job) -> Result<()> {
        self.enqueue_with(job, None)
    }

    /// [`HostStream::enqueue`], with what the job does when it is skipped.
    fn enqueue_with(&self, job: Job, on_skip: Option<OnSkip>) -> Result<()> {
        let mut p = self.shared.lock();
        if p.queue.len() >= self.depth {
            let deadline = Instant::now() + self.wait;
            while p.queue.len() >= self.depth {
                let now = Instant::now();
                if now >= deadline {
                    return Err(Error::Timeout {
                        waiting_for: format!(
                            "room in a full host stream queue ({} operations queued, the \
                             oldest still running or blocked)",
                            p.queue.len()
                        ),
                        after: self.wait,
                    });
                }
                p = self
                    .shared
                    .changed
                    .wait_timeout(p, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
        if p.closed {
            return Err(Error::Internal("host stream used after shutdown".into()));
        }
        p.enqueued += 1;
        p.queue.push_back(Queued { job, on_skip });
        drop(p);
        self.shared.queued.notify_one();
        Ok(())
    }

    /// Enqueues a job and waits for its result.
    fn run_and_wait<T: Send + 'static>(
        &self,
        job: impl Fn() -> Result<T> + Send + Sync + 'static,
    ) -> Result<T> {
        self.refuse_while_capturing("a blocking host copy")?;
        let (tx, rx) = mpsc::sync_channel(1);
        // The caller receives the job's error itself, so it is kept off the sticky slot.
        self.submit(Arc::new(move || {
            let _ = tx.send(job());
            Ok(())
        }))?;
        const LIMIT: Duration = Duration::from_secs(3600);
        match rx.recv_timeout(LIMIT) {
            Ok(r) => r,
            Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::Timeout {
                waiting_for: "a host stream copy (earlier work on the stream is stuck)".into(),
                after: LIMIT,
            }),
            // The worker dropped the job unrun: an earlier operation failed.
            Err(mpsc::RecvTimeoutError::Disconnected) => match self.shared.lock().error.take() {
                Some(e) => Err(e),
                None => Err(Error::Internal("host stream dropped a copy unrun".into())),
            },
        }
    }
}

impl Drop for HostStream {
    fn drop(&mut self) {
        // The worker finishes what is queued and exits; we do not join, so that dropping a
        // stream whose work waits on a dead peer cannot hang the caller.
        self.shared.lock().closed = true;
        self.shared.queued.notify_all();
    }
}

fn worker(shared: &Shared) {
    loop {
        let mut p = shared.lock();
        let Queued { job, on_skip } = loop {
            if let Some(job) = p.queue.pop_front() {
                break job;
            }
            if p.closed {
                return;
            }
            p = shared.queued.wait(p).unwrap_or_else(|e| e.into_inner());
        };
        let skipped = p.error.as_ref().map(relay);
        drop(p);
        let result = if let Some(e) = skipped {
            if let Some(f) = on_skip {
                f(&e);
            }
            Ok(())
        } else {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job())).unwrap_or_else(|p| {
                let msg = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "unknown panic".into());
                Err(Error::Internal(format!("host stream job panicked: {msg}")))
            })
        };
        // Dropped outside the lock: a job may own the last reference to a large buffer.
        drop(job);
        let mut p = shared.lock();
        p.completed += 1;
        if let Err(e) = result {
            p.error.get_or_insert(e);
        }
        drop(p);
        shared.changed.notify_all();
    }
}

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

impl Stream for HostStream {
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

    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()> {
        let k = kernel
            .as_any()
            .downcast_ref::<HostKernel>()
            .ok_or_else(|| {
                Error::invalid(format!(
                    "kernel {} was not loaded by the host backend",
                    kernel.id()
                ))
            })?;
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

    fn record(&self, event: &dyn Event) -> Result<()> {
        self.refuse_while_capturing("recording an event")?;
        let ev = host_event(event)?.inner.clone();
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

    fn wait_event(&self, event: &dyn Event) -> Result<()> {
        self.refuse_while_capturing("waiting for an event")?;
        let ev = host_event(event)?.inner.clone();
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

    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        let ops = self
            .capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .ok_or_else(|| Error::invalid("end_capture: the stream is not capturing"))?;
        Ok(Box::new(HostGraph { ops }))
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A captured sequence of host-stream operations; a replay enqueues them again in order.
pub struct HostGraph {
    ops: Vec<Job>,
}

impl std::fmt::Debug for HostGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostGraph")
            .field("ops", &self.ops.len())
            .finish()
    }
}

impl Graph for HostGraph {
    fn launch(&self, stream: &dyn Stream) -> Result<()> {
        let s = stream
            .as_any()
            .downcast_ref::<HostStream>()
            .ok_or_else(|| {
                Error::invalid("a host graph launched on a stream of another backend")
            })?;
        for op in &self.ops {
            s.submit(op.clone())?;
        }
        Ok(())
    }
}

#[derive(Debug, Default)]
struct EventState {
    recorded: u64,
    reached: u64,
    at: Option<Instant>,
    /// The error of the stream that reached the last generation, when it reached it skipping
    /// its work behind that error.
    failed: Option<Error>,
}

#[derive(Debug, Default)]
struct EventInner {
    state: Mutex<EventState>,
    changed: Condvar,
}

impl EventInner {
    fn lock(&self) -> MutexGuard<'_, EventState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks `generation` reached (`failed`: behind that error of the recording stream).
    fn reach(&self, generation: u64, failed: Option<Error>) {
        let mut s = self.lock();
        if generation > s.reached {
            s.reached = generation;
            s.at = Some(Instant::now());
            s.failed = failed;
        }
        drop(s);
        self.changed.notify_all();
    }

    fn wait_for(&self, generation: u64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        let mut s = self.lock();
        while s.reached < generation {
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    waiting_for: "a host event".into(),
                    after: timeout,
                });
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        match &s.failed {
            Some(e) => Err(relay(e)),
            None => Ok(()),
        }
    }
}

/// A copy of `e` for another stream (errors are not `Clone`: an I/O error keeps its kind and
/// message).
fn relay(e: &Error) -> Error {
    match e {
        Error::InvalidUsage(m) => Error::InvalidUsage(m.clone()),
        Error::Unavailable { what, reason } => Error::Unavailable {
            what: what.clone(),
            reason: reason.clone(),
        },
        Error::Io { context, source } => Error::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Driver {
            backend,
            call,
            code,
            message,
        } => Error::Driver {
            backend,
            call,
            code: *code,
            message: message.clone(),
        },
        Error::Timeout { waiting_for, after } => Error::Timeout {
            waiting_for: waiting_for.clone(),
            after: *after,
        },
        Error::Remote { rank, message } => Error::Remote {
            rank: *rank,
            message: message.clone(),
        },
        Error::Malformed { what, why } => Error::Malformed {
            what,
            why: why.clone(),
        },
        Error::Internal(m) => Error::Internal(m.clone()),
    }
}

/// An event of the host backend.
#[derive(Debug, Default)]
pub struct HostEvent {
    inner: Arc<EventInner>,
}

fn host_event(e: &dyn Event) -> Result<&HostEvent> {
    e.as_any()
        .downcast_ref::<HostEvent>()
        .ok_or_else(|| Error::invalid("event was not created by the host backend"))
}

impl Event for HostEvent {
    fn query(&self) -> Result<bool> {
        let s = self.inner.lock();
        Ok(s.reached >= s.recorded)
    }

    fn synchronize_timeout(&self, timeout: Duration) -> Result<()> {
        let generation = self.inner.lock().recorded;
        self.inner.wait_for(generation, timeout)
    }

    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64> {
        let start = host_event(start)?;
        let t0 = start.inner.lock().at;
        let t1 = self.inner.lock().at;
        match (t0, t1) {
            (Some(a), Some(b)) => Ok(if b >= a {
                (b - a).as_secs_f64() * 1e3
            } else {
                -((a - b).as_secs_f64() * 1e3)
            }),
            _ => Err(Error::invalid(
                "elapsed time asked of an event that has not been reached",
            )),
        }
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use mscclpp_hal::{Backend, ErrorClass, MemoryKind, Stream};

    use super::HostStream;
    use crate::HostBackend;

    #[test]
    fn a_full_queue_blocks_the_producer_until_its_deadline() {
        let s = HostStream::with_queue(4, Duration::from_millis(200)).unwrap();
        let (started_tx, started_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let release_rx = std::sync::Mutex::new(release_rx);
        s.submit(std::sync::Arc::new(move || {
            let _ = started_tx.send(());
            let _ = release_rx
                .lock()
                .map(|r| r.recv_timeout(Duration::from_secs(30)));
            Ok(())
        }))
        .unwrap();
        started_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        for _ in 0..4 {
            s.submit(std::sync::Arc::new(|| Ok(()))).unwrap();
        }
        let t = Instant::now();
        let e = s.submit(std::sync::Arc::new(|| Ok(()))).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
        assert!(e.to_string().contains("full host stream queue"), "{e}");
        assert!(t.elapsed() >= Duration::from_millis(200));
        release_tx.send(()).unwrap();
        s.synchronize_timeout(Duration::from_secs(10)).unwrap();
        // Room again: the producer goes on.
        s.submit(std::sync::Arc::new(|| Ok(()))).unwrap();
        s.synchronize_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn wait_value64_holds_later_work_until_another_stream_writes_the_flag() {
        use mscclpp_hal::WaitCmp;
        let dev = HostBackend::new().open_device(0).unwrap();
        let flag = dev.alloc(16, MemoryKind::Device).unwrap();
        let data = dev.alloc(8, MemoryKind::Device).unwrap();
        let (waiter, writer) = (HostStream::new().unwrap(), HostStream::new().unwrap());
        waiter.fill(&flag.full(), 0).unwrap();
        waiter.fill(&data.full(), 0).unwrap();
        waiter.synchronize().unwrap();
        let word = flag.slice(0..8).unwrap();
        waiter.wait_value64(&word, 2, WaitCmp::Geq).unwrap();
        waiter.fill(&data.full(), 7).unwrap();
        writer.write_value64(&word, 1).unwrap();
        writer.synchronize().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let mut seen = [0u8; 8];
        writer.read_to_host(&mut seen, &data.full()).unwrap();
        assert_eq!(seen, [0; 8], "the fill ran before the flag reached 2");
        writer.write_value64(&word, 2).unwrap();
        waiter.synchronize_timeout(Duration::from_secs(10)).unwrap();
        waiter.read_to_host(&mut seen, &data.full()).unwrap();
        assert_eq!(seen, [7; 8]);
        // Eq waits for the exact value; a misaligned or short flag is refused.
        waiter.wait_value64(&word, 2, WaitCmp::Eq).unwrap();
        waiter.synchronize_timeout(Duration::from_secs(10)).unwrap();
        let e = waiter
            .wait_value64(&flag.slice(4..12).unwrap(), 1, WaitCmp::Eq)
            .unwrap_err();
        assert!(e.to_string().contains("8-byte aligned"), "{e}");
        assert!(
            WaitCmp::Geq.holds(0, u64::MAX),
            "cyclic comparison, as the GPUs do"
        );
        assert!(!WaitCmp::Geq.holds(1, 2));
    }

    #[test]
    fn wait_value64_ends_with_the_abort_error() {
        use mscclpp_hal::WaitCmp;
        let dev = HostBackend::new().open_device(0).unwrap();
        let flag = dev.alloc(16, MemoryKind::Device).unwrap();
        let s = HostStream::new().unwrap();
        s.fill(&flag.full(), 0).unwrap();
        // The abort word: rank 1 died (value rank + 1).
        let abort = flag.slice(8..16).unwrap();
        s.write_value64(&abort, 2).unwrap();
        s.synchronize().unwrap();
        {
            let _scope = mscclpp_hal::dev::abort_scope(abort.ptr().0);
            s.wait_value64(&flag.slice(0..8).unwrap(), 1, WaitCmp::Eq)
                .unwrap();
        }
        let t = Instant::now();
        let e = s.synchronize_timeout(Duration::from_secs(30)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{e}");
        assert!(e.to_string().contains("rank 1"), "{e}");
    }

    /// A stream that failed still reaches the events it records after the failure, carrying the
    /// error: a stream waiting for one fails with it (naming the dead rank) at once instead of
    /// waiting for its deadline; a later record on a healthy stream clears it.
    #[test]
    fn an_event_recorded_behind_an_error_fails_its_waiters() {
        use mscclpp_hal::WaitCmp;
        let dev = HostBackend::new().open_device(0).unwrap();
        let flag = dev.alloc(16, MemoryKind::Device).unwrap();
        let (a, b) = (HostStream::new().unwrap(), HostStream::new().unwrap());
        a.fill(&flag.full(), 0).unwrap();
        let abort = flag.slice(8..16).unwrap();
        a.write_value64(&abort, 3).unwrap();
        a.synchronize().unwrap();
        let ev = super::HostEvent::default();
        {
            let _scope = mscclpp_hal::dev::abort_scope(abort.ptr().0);
            a.wait_value64(&flag.slice(0..8).unwrap(), 1, WaitCmp::Eq)
                .unwrap();
        }
        a.record(&ev).unwrap();
        b.wait_event(&ev).unwrap();
        let t = Instant::now();
        let e = b.synchronize_timeout(Duration::from_secs(30)).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(10), "{e}");
        assert!(e.to_string().contains("rank 2"), "{e}");
        assert!(a.synchronize().is_err());
        // Healthy again (the errors were taken by the synchronisations): records clear it.
        a.record(&ev).unwrap();
        b.wait_event(&ev).unwrap();
        b.synchronize_timeout(Duration::from_secs(10)).unwrap();
    }

    const RSS_OPS_VAR: &str = "MSCCLPP_HOST_STREAM_RSS_OPS";

    fn rss_bytes() -> u64 {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        pages * 4096
    }

    /// Runs `rss_probe` in a process of its own (the other tests of this binary allocate in
    /// parallel and would move the figure), with `ops` operations.
    fn probe_in_child(ops: u64) {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "stream::tests::rss_probe",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(RSS_OPS_VAR, ops.to_string())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{text}");
        assert!(
            text.contains("rss_probe: done"),
            "the probe did not run:\n{text}"
        );
        eprintln!("{text}");
    }

    #[test]
    fn a_million_operations_keep_rss_flat() {
        probe_in_child(1_000_000);
    }

    #[test]
    #[ignore = "10^8 operations take minutes; run with --ignored (docs/faults.md)"]
    fn a_hundred_million_operations_keep_rss_flat() {
        probe_in_child(100_000_000);
    }

    /// Enqueues `MSCCLPP_HOST_STREAM_RSS_OPS` one-word fills without waiting and checks that
    /// the resident set stays within a bound independent of the count.
    #[test]
    #[ignore = "run in a process of its own by a_million_operations_keep_rss_flat"]
    fn rss_probe() {
        let Some(ops) = std::env::var(RSS_OPS_VAR)
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
        else {
            return;
        };
        let dev = HostBackend::new().open_device(0).unwrap();
        let buf = dev.alloc(8, MemoryKind::Device).unwrap();
        let s = HostStream::new().unwrap();
        for i in 0..4 * super::QUEUE_DEPTH {
            s.fill(&buf.full(), i as u8).unwrap();
        }
        s.synchronize().unwrap();
        let base = rss_bytes();
        // A worker that falls behind (a kernel waiting for a slow peer): without a bound the
        // producer queues everything it can in the meantime.
        s.submit(std::sync::Arc::new(|| {
            std::thread::sleep(Duration::from_millis(300));
            Ok(())
        }))
        .unwrap();
        let mut peak = base;
        let t = Instant::now();
        let step = (ops / 10).max(1);
        for i in 0..ops {
            s.fill(&buf.full(), i as u8).unwrap();
            if i % step == step - 1 {
                let r = rss_bytes();
                peak = peak.max(r);
                println!(
                    "rss_probe: {:>11} ops  {:>7.1} s  rss {:>7} KiB (+{} KiB)",
                    i + 1,
                    t.elapsed().as_secs_f64(),
                    r / 1024,
                    r.saturating_sub(base) / 1024
                );
            }
        }
        s.synchronize().unwrap();
        // The queue holds at most QUEUE_DEPTH small jobs; allocator slack on top of that.
        const BOUND: u64 = 16 << 20;
        let growth = peak.saturating_sub(base);
        assert!(
            growth < BOUND,
            "rss grew by {growth} bytes over {ops} operations (bound {BOUND})"
        );
        println!("rss_probe: done, {ops} ops, growth {} KiB", growth / 1024);
    }
}
