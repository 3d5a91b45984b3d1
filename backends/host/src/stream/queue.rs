//! A host stream's core: the bounded queue of jobs, the worker thread that runs them in order,
//! and how work reaches the queue (directly, or into a capture while one is open). The
//! operations the stream offers are built on this in the parent module.
//!
//! A stream's queue is bounded, as a GPU's launch queue is: a producer that runs ahead of the
//! worker by [`QUEUE_DEPTH`] operations blocks until one finishes, and gives up with
//! `Error::Timeout` after [`QUEUE_WAIT`]. Without the bound a loop of launches grows memory
//! without limit whenever the worker falls behind (a slow peer, a dead one).

use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

use super::event::relay;

/// Operations a stream holds before its producer blocks (CUDA's launch queue is about as deep).
pub const QUEUE_DEPTH: usize = 1024;

/// How long a producer waits for room in a full queue. The worker's own waits (kernels waiting
/// for a peer, events) end on their deadlines, so a full queue that stays full this long means
/// a job that never returns.
pub const QUEUE_WAIT: Duration = Duration::from_secs(3600);

/// One enqueued operation. `Fn` (not `FnOnce`) so that a captured graph can replay it.
pub(super) type Job = Arc<dyn Fn() -> Result<()> + Send + Sync>;

/// What a job does instead when it is skipped behind an earlier error (an event record: the
/// event is reached, failed, so that a stream waiting for it does not wait forever).
pub(super) type OnSkip = Arc<dyn Fn(&Error) + Send + Sync>;

/// A job in a stream's queue.
struct Queued {
    job: Job,
    on_skip: Option<OnSkip>,
}

/// Progress of a stream, shared with its worker.
#[derive(Default)]
pub(super) struct Progress {
    pub(super) enqueued: u64,
    pub(super) completed: u64,
    /// The first error since the last synchronize; later jobs are skipped while it is pending,
    /// since they usually depend on the failed one.
    pub(super) error: Option<Error>,
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
pub(super) struct Shared {
    progress: Mutex<Progress>,
    /// Signalled when a job completes (room in the queue, synchronize).
    pub(super) changed: Condvar,
    /// Signalled when a job is queued or the stream closes (the worker).
    queued: Condvar,
}

impl Shared {
    pub(super) fn lock(&self) -> MutexGuard<'_, Progress> {
        // A job that panicked is caught in the worker, so poisoning only means a panic inside
        // this module's own short critical sections; the counters are still consistent.
        self.progress.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// An in-order stream executed by a worker thread.
pub struct HostStream {
    pub(super) shared: Arc<Shared>,
    /// While capturing: the operations recorded so far.
    pub(super) capture: Mutex<Option<Vec<Job>>>,
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

    pub(super) fn capturing(&self) -> bool {
        self.capture
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    pub(super) fn refuse_while_capturing(&self, what: &str) -> Result<()> {
        if self.capturing() {
            return Err(Error::invalid(format!(
                "{what} while the stream is capturing a graph; end the capture first"
            )));
        }
        Ok(())
    }

    pub(super) fn submit(&self, job: Job) -> Result<()> {
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
    pub(super) fn enqueue_with(&self, job: Job, on_skip: Option<OnSkip>) -> Result<()> {
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
    pub(super) fn run_and_wait<T: Send + 'static>(
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
