//! Streams and events of the host backend: one worker thread per stream runs jobs in order.

use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::{BufferSlice, Error, Event, Graph, Kernel, LaunchConfig, Result, Stream};

use crate::kernels::HostKernel;

/// One enqueued operation. `Fn` (not `FnOnce`) so that a captured graph can replay it.
type Job = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// Progress of a stream, shared with its worker.
#[derive(Debug, Default)]
struct Progress {
    enqueued: u64,
    completed: u64,
    /// The first error since the last synchronize; later jobs are skipped while it is pending,
    /// since they usually depend on the failed one.
    error: Option<Error>,
}

#[derive(Debug, Default)]
struct Shared {
    progress: Mutex<Progress>,
    changed: Condvar,
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
    tx: Mutex<Option<mpsc::Sender<Job>>>,
    shared: Arc<Shared>,
    /// While capturing: the operations recorded so far.
    capture: Mutex<Option<Vec<Job>>>,
}

impl std::fmt::Debug for HostStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostStream")
            .field("progress", &self.shared.progress)
            .field("capturing", &self.capturing())
            .finish()
    }
}

impl HostStream {
    /// Starts the worker.
    pub fn new() -> Result<Self> {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared::default());
        let worker_shared = shared.clone();
        std::thread::Builder::new()
            .name("mscclpp-host-stream".into())
            .spawn(move || worker(rx, worker_shared))
            .map_err(|e| Error::io("spawning a host stream worker", e))?;
        Ok(HostStream {
            tx: Mutex::new(Some(tx)),
            shared,
            capture: Mutex::new(None),
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

    fn enqueue(&self, job: Job) -> Result<()> {
        let tx = self.tx.lock().unwrap_or_else(|p| p.into_inner());
        let tx = tx
            .as_ref()
            .ok_or_else(|| Error::Internal("host stream used after shutdown".into()))?;
        self.shared.lock().enqueued += 1;
        tx.send(job)
            .map_err(|_| Error::Internal("host stream worker has exited".into()))
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
        // Closing the channel lets the worker finish what is queued and exit; we do not join,
        // so that dropping a stream whose work waits on a dead peer cannot hang the caller.
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }
}

fn worker(rx: mpsc::Receiver<Job>, shared: Arc<Shared>) {
    while let Ok(job) = rx.recv() {
        let skip = shared.lock().error.is_some();
        let result = if skip {
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
        cfg.validate(crate::device::MAX_THREADS_PER_BLOCK)?;
        let (func, id, args) = (k.func, k.id, args.to_vec());
        self.submit(Arc::new(move || {
            tracing::trace!(kernel = %id, ?cfg, "host kernel");
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
        self.submit(Arc::new(move || {
            let mut s = ev.lock();
            if generation > s.reached {
                s.reached = generation;
                s.at = Some(Instant::now());
            }
            drop(s);
            ev.changed.notify_all();
            Ok(())
        }))
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
        Ok(())
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
