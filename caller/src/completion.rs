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
//! Off unless asked for (`MSCCLPP_COMPLETION=1`, or `MSCCLPP_STATUS`, whose command prints it):
//! the store is one more stream operation per call. Calls captured into a graph store nothing
//! (a replay would write the number of the capture, older than calls issued since).

use std::sync::Arc;

use mscclpp_hal::{DeviceBuffer, DynStream, MemoryKind, Result};

use mscclpp_comm::Communicator;

/// One communicator's completion word.
#[derive(Debug)]
pub(crate) struct Completion {
    word: DeviceBuffer,
    host: *const u64,
}

// SAFETY: `host` points into `word`'s host-mapped allocation, which lives as long as `self`;
// it is only read (volatile) on the host and written by the device, a single aligned word.
unsafe impl Send for Completion {}
// SAFETY: as above: shared reads of one aligned word.
unsafe impl Sync for Completion {}

impl Completion {
    /// Whether this process asked for completion records.
    pub(crate) fn wanted() -> Result<bool> {
        Ok(mscclpp_hal::env::flag("MSCCLPP_COMPLETION")?
            .unwrap_or_else(|| mscclpp_hal::env::get("MSCCLPP_STATUS").is_some()))
    }

    /// A word for `comm`'s calls (zero: none finished), and the bootstrap told to read it for
    /// its surveys.
    pub(crate) fn attach(comm: &Communicator) -> Result<Arc<Completion>> {
        let word = comm
            .device()
            .alloc(std::mem::size_of::<u64>(), MemoryKind::HostMapped)?;
        let host = word.host_ptr().ok_or_else(|| {
            mscclpp_hal::Error::Internal("host-mapped memory without a host address".into())
        })? as *const u64;
        // SAFETY: `host` is the start of an 8-byte host-mapped allocation (aligned: allocations
        // are at least 8-aligned), nothing else writes it yet.
        unsafe { std::ptr::write_volatile(host as *mut u64, 0) };
        let c = Arc::new(Completion { word, host });
        let reader = c.clone();
        comm.bootstrap()
            .set_completed(Box::new(move || reader.completed()));
        Ok(c)
    }

    /// Queues the store of `seq` behind what `stream` holds now (nothing while it captures).
    pub(crate) fn mark(&self, stream: &DynStream, seq: u64) -> Result<()> {
        if stream.is_capturing()? {
            return Ok(());
        }
        stream.write_value64(&self.word.full(), seq)
    }

    /// The highest sequence number a stream has stored.
    pub(crate) fn completed(&self) -> u64 {
        // SAFETY: `host` is valid for the life of `self` (see the type); a volatile read of an
        // aligned word the device stores whole.
        unsafe { std::ptr::read_volatile(self.host) }
    }
}
