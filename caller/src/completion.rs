//! The completion record: the last call this rank's streams *finished*, as distinct from the
//! last one it issued (the hang diagnosis of issue 46). A rank whose host issued call #7 while
//! its GPU is still inside #5 is told apart from one that never issued #6.
//!
//! Each noted call is followed, on its own stream, by a store of its sequence number into one
//! host-mapped word ([`Stream::write_value64`], ordered after the call's work): the word holds
//! the highest number whose stream got that far. The bootstrap's event loop reads the word when
//! a peer surveys this rank, so the answer needs nothing of this rank's program. Streams run
//! apart, so a call on one stream may finish before an earlier one on another: the word then
//! holds the later number (NCCL's RAS has no completion at all; ours says "through" the number
//! for a single stream, which is how every client we know issues its calls).
//!
//! Off unless asked for (`MSCCLPP_COMPLETION=1`, or `MSCCLPP_STATUS`, whose command prints it,
//! or `MSCCLPP_WATCHDOG_SECONDS`, which reads it): the store is one more stream operation per
//! call.
//!
//! The watchdog ([`Completion::stalled`]): a call issued whose stream has not finished anything
//! for `MSCCLPP_WATCHDOG_SECONDS` is a stall; the front end asks when it is polled for errors
//! (NCCL's `ncclCommGetAsyncError`, which PyTorch's watchdog polls), and one survey names the
//! ranks behind, so the error a GPU job gets names the laggard long before a kernel's own
//! deadline. Calls captured into a graph store nothing (a replay would write the number of the
//! capture, older than calls issued since) and are not outstanding for the watchdog; the stall
//! clock starts when a call is marked behind streams that had finished everything (an idle
//! communicator is not stalled), and a word that moves at all (even back: another stream's
//! older call finishing late) restarts it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mscclpp_hal::{DeviceBuffer, DynStream, MemoryKind, Result};

use mscclpp_comm::Communicator;

/// One communicator's completion word.
#[derive(Debug)]
pub(crate) struct Completion {
    word: DeviceBuffer,
    host: *const u64,
    /// The highest number marked (a call whose stream will store it).
    marked: AtomicU64,
    /// The word as last read (what surveys get once the process has begun to exit).
    last: AtomicU64,
    /// `MSCCLPP_WATCHDOG_SECONDS`, read once at creation.
    watchdog: Option<Duration>,
    stall: Mutex<Stall>,
}

/// What the watchdog saw last.
#[derive(Debug)]
struct Stall {
    /// The completed number, and since when it has stood.
    done: u64,
    since: Instant,
    /// The stall reported (at `done`), and what the survey said.
    reported: Option<(u64, Option<String>)>,
}

// SAFETY: `host` points into `word`'s host-mapped allocation, which lives as long as `self`;
// it is only read (volatile) on the host and written by the device, a single aligned word.
unsafe impl Send for Completion {}
// SAFETY: as above: shared reads of one aligned word.
unsafe impl Sync for Completion {}

impl Completion {
    /// Whether this process asked for completion records.
    pub(crate) fn wanted() -> Result<bool> {
        Ok(
            mscclpp_hal::env::flag("MSCCLPP_COMPLETION")?.unwrap_or_else(|| {
                mscclpp_hal::env::get("MSCCLPP_STATUS").is_some()
                    || mscclpp_hal::env::get("MSCCLPP_WATCHDOG_SECONDS").is_some()
            }),
        )
    }

    /// The watchdog's bound (`MSCCLPP_WATCHDOG_SECONDS`; `None`: no watchdog).
    pub(crate) fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// A word for `comm`'s calls (zero: none finished), and the bootstrap told to read it for
    /// its surveys.
    pub(crate) fn attach(comm: &Communicator) -> Result<Arc<Completion>> {
        // A malformed value is refused here, at creation, not at every poll.
        let watchdog = mscclpp_hal::env::seconds("MSCCLPP_WATCHDOG_SECONDS")?;
        let word = comm
            .device()
            .alloc(std::mem::size_of::<u64>(), MemoryKind::HostMapped)?;
        let host = word.host_ptr().ok_or_else(|| {
            mscclpp_hal::Error::Internal("host-mapped memory without a host address".into())
        })? as *const u64;
        // SAFETY: `host` is the start of an 8-byte host-mapped allocation (aligned: allocations
        // are at least 8-aligned), nothing else writes it yet.
        unsafe { std::ptr::write_volatile(host as *mut u64, 0) };
        let c = Arc::new(Completion {
            word,
            host,
            marked: AtomicU64::new(0),
            last: AtomicU64::new(0),
            watchdog,
            stall: Mutex::new(Stall {
                done: 0,
                since: Instant::now(),
                reported: None,
            }),
        });
        let reader = c.clone();
        comm.bootstrap()
            .set_completed(Box::new(move || reader.completed()));
        Ok(c)
    }

    /// Call `seq` is about to be enqueued on `stream`: outstanding for the watchdog from now
    /// (a host backend's call runs inside its enqueue); `false` while `stream` captures (the
    /// call is not counted, and nothing is stored for it).
    pub(crate) fn issue(&self, stream: &DynStream, seq: u64) -> Result<bool> {
        if stream.is_capturing()? {
            return Ok(false);
        }
        let before = self.marked.swap(seq, Ordering::AcqRel);
        if self.completed() >= before {
            // The streams had finished everything: the stall clock starts with this call.
            let mut st = self.stall.lock().unwrap_or_else(|p| p.into_inner());
            st.since = Instant::now();
            st.reported = None;
        }
        Ok(true)
    }

    /// Call `seq` failed to enqueue: not outstanding (unless a later call was issued since).
    pub(crate) fn withdraw(&self, seq: u64) {
        let _ = self.marked.compare_exchange(
            seq,
            seq.saturating_sub(1),
            Ordering::AcqRel,
            Ordering::Relaxed,
        );
    }

    /// Queues the store of `seq` behind what `stream` holds now (its call enqueued).
    pub(crate) fn mark(&self, stream: &DynStream, seq: u64) -> Result<()> {
        stream.write_value64(&self.word.full(), seq)
    }

    /// Whether the calls marked so far have been stuck for `after`: nothing finished for that
    /// long while a call is outstanding. The first time a stall is seen (per completed number),
    /// `survey` says who is behind (`None`: nobody); the answer is kept for later polls. `None`
    /// while the streams keep up.
    pub(crate) fn stalled(
        &self,
        after: Duration,
        survey: impl FnOnce() -> Option<String>,
    ) -> Option<(u64, Duration, Option<String>)> {
        let done = self.completed();
        let marked = self.marked.load(Ordering::Acquire);
        let mut st = self.stall.lock().unwrap_or_else(|p| p.into_inner());
        if done != st.done || done >= marked {
            st.done = done;
            st.since = Instant::now();
            st.reported = None;
            return None;
        }
        let stuck = st.since.elapsed();
        if stuck < after {
            return None;
        }
        if let Some((at, why)) = &st.reported
            && *at == done
        {
            return Some((done, stuck, why.clone()));
        }
        // The survey waits on the peers: not under the lock another poll would queue on.
        drop(st);
        let why = survey();
        let mut st = self.stall.lock().unwrap_or_else(|p| p.into_inner());
        st.reported = Some((done, why.clone()));
        Some((done, stuck, why))
    }

    /// The highest sequence number a stream has stored (the last one read, once the process
    /// has begun to exit: the runtime may have freed the word).
    pub(crate) fn completed(&self) -> u64 {
        let Some(_inside) = mscclpp_hal::exit::enter() else {
            return self.last.load(Ordering::Relaxed);
        };
        // SAFETY: `host` is valid for the life of `self` (see the type), and the runtime has not
        // begun its teardown (the exit gate); a volatile read of an aligned word the device
        // stores whole.
        let v = unsafe { std::ptr::read_volatile(self.host) };
        self.last.store(v, Ordering::Relaxed);
        v
    }
}
