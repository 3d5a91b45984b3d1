//! What ends a copy-engine call whose peer died: a stream's wait on a memory word cannot poll
//! the communicator's abort word as the kernels' waits do, so when the communicator fails, this
//! rank's own flags (the only words its streams wait on) are set to a value every wait accepts,
//! from a stream of their own that no collective ever blocks. The waits' clears copy the
//! release word instead of writing 0, so that once it is set a clear can no longer undo the
//! release: every later wait of the call, of the calls queued behind it and of graph replays
//! passes at once. The calls then complete with garbage and the communicator reports the
//! failure (the next call is refused naming the dead rank, as after the kernels give up).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mscclpp_hal::{BufferSlice, Result, Stream, StreamApi, WaitCmp};

use super::super::base::MAX_RANKS;
use super::{BUFFERS, DATA, DONE, READY};

/// Byte offset of the release word in a rank's CE scratch: 0 while the communicator lives,
/// [`RELEASED`] once it failed. Every clear of a flag copies it.
pub(super) const RELEASE: usize = 512;
// Between the `done` words and the data.
const _: () = assert!(RELEASE >= DONE + 8 * BUFFERS * MAX_RANKS && RELEASE + 8 <= DATA);

/// What a released flag and the release word hold: every wait (`>= 1`, compared cyclically as
/// the vendors do) accepts it, and so does any mix of its halves with 0 or 1 (a clear that
/// tore against the release still leaves a non-zero word below 2^63).
pub(super) const RELEASED: u64 = 0x4000_0001_4000_0001;

/// Delays of the release passes after the first: a clear that had read the release word just
/// before it was set may still store 0 after the first pass (a copy in flight); the later
/// passes set that flag again, and by then every clear copies the set word.
const REPASS: [Duration; 3] = [
    Duration::from_millis(2),
    Duration::from_millis(20),
    Duration::from_millis(200),
];

/// The wait of a flag in this rank's scratch, then its clear (a copy of the release word, which
/// is 0 while the communicator lives).
pub(super) fn take<S: StreamApi>(
    stream: &S,
    scratch: &BufferSlice,
    flag: &BufferSlice,
) -> Result<()> {
    stream.wait_value64(flag, 1, WaitCmp::Geq)?;
    stream.copy(flag, &release_word(scratch)?)
}

fn release_word(scratch: &BufferSlice) -> Result<BufferSlice> {
    scratch.slice(RELEASE..RELEASE + 8)
}

/// This rank's release: its scratch, the stream that writes it and the ranks whose flags it
/// sets.
#[derive(Debug)]
pub(super) struct Release {
    stream: Arc<dyn Stream>,
    scratch: BufferSlice,
    rank: usize,
    nranks: usize,
    started: AtomicBool,
}

impl Release {
    pub(super) fn new(
        stream: Arc<dyn Stream>,
        scratch: BufferSlice,
        rank: usize,
        nranks: usize,
    ) -> Arc<Release> {
        Arc::new(Release {
            stream,
            scratch,
            rank,
            nranks,
            started: AtomicBool::new(false),
        })
    }

    /// Releases every wait of this rank, now and in a few passes after (on a thread of its
    /// own: the caller is the thread that learned the failure, which must not block). Once.
    pub(super) fn start(self: &Arc<Self>) {
        if self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Err(e) = self.pass() {
            tracing::warn!(error = %e, "copy-engine release failed");
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("mscclpp-ce-release".into())
            .spawn(move || {
                for d in REPASS {
                    std::thread::sleep(d);
                    if let Err(e) = me.pass() {
                        tracing::warn!(error = %e, "copy-engine release failed");
                        return;
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "no thread for the copy-engine release passes");
        }
    }

    /// One pass: the release word first (clears from now on keep flags released), then every
    /// flag a stream of this rank may wait on.
    fn pass(&self) -> Result<()> {
        // At process exit the scratch may be freed already, and no wait is left to release.
        let Some(_live) = mscclpp_hal::exit::enter() else {
            return Ok(());
        };
        let s = &*self.stream;
        // Nor after the application reset the device (nccl-tests' cudaDeviceReset before exit,
        // its communicators never destroyed): the stream is freed driver state.
        if s.device_lost() {
            tracing::debug!("copy-engine release skipped: the device was reset");
            return Ok(());
        }
        s.write_value64(&release_word(&self.scratch)?, RELEASED)?;
        for at in [READY, DONE] {
            for b in 0..BUFFERS {
                for p in (0..self.nranks.min(MAX_RANKS)).filter(|&p| p != self.rank) {
                    s.write_value64(&super::flag(&self.scratch, at, b, p)?, RELEASED)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use mscclpp_hal::{Backend, Device, ErrorClass, MemoryKind};

    use super::*;

    /// A stream waiting on flags no peer will ever set (rank 1 is gone), taking one flag twice as
    /// a call of several chunks does: it stays blocked until the release, then passes every
    /// wait, and so do waits enqueued after it (a graph replayed after the failure). Runs with no
    /// abort scope, so the host backend's waits cannot end on the abort word: only the release
    /// ends them.
    #[test]
    fn the_release_ends_every_wait_of_the_scratch_and_later_ones() {
        let backend = mscclpp_host::HostBackend::new();
        let device: Arc<dyn Device> = backend.open_device(0).expect("host device");
        let scratch = device
            .alloc(DATA + 4096, MemoryKind::Device)
            .expect("scratch");
        let scratch = scratch.full();
        let stream = device.create_stream().expect("stream");
        stream.fill(&scratch, 0).expect("fill");
        // The same stream as the host backend's own type, which the algorithm's steps take.
        let own = <mscclpp_host::Host as mscclpp_hal::Api>::stream_of(&*stream).expect("host");
        let waits = [
            (READY, 0),
            (READY, 1),
            (READY, 0),
            (DONE, 0),
            (DONE, 1),
            (DONE, 1),
        ];
        for (at, b) in waits {
            take(
                own,
                &scratch,
                &super::super::flag(&scratch, at, b, 1).unwrap(),
            )
            .expect("take");
        }
        let e = stream
            .synchronize_timeout(Duration::from_millis(200))
            .expect_err("the waits must block before the release");
        assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
        let release = Release::new(
            device.create_stream().expect("stream"),
            scratch.clone(),
            0,
            2,
        );
        let t = Instant::now();
        release.start();
        stream
            .synchronize_timeout(Duration::from_secs(10))
            .expect("released");
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
        // A clear copied the release word: the flag stays released for the next wait.
        let mut word = [0u8; 8];
        stream
            .read_to_host(
                &mut word,
                &super::super::flag(&scratch, READY, 0, 1).unwrap(),
            )
            .unwrap();
        assert_eq!(u64::from_le_bytes(word), RELEASED);
        for (at, b) in waits {
            take(
                own,
                &scratch,
                &super::super::flag(&scratch, at, b, 1).unwrap(),
            )
            .expect("take");
        }
        stream
            .synchronize_timeout(Duration::from_secs(10))
            .expect("waits after the release pass");
        // Rank 0's own column is never written (no rank waits on itself).
        stream
            .read_to_host(
                &mut word,
                &super::super::flag(&scratch, READY, 0, 0).unwrap(),
            )
            .unwrap();
        assert_eq!(u64::from_le_bytes(word), 0);
        release.start(); // Once only: a second failure report changes nothing.
    }

    #[test]
    fn the_released_value_passes_the_waits_and_so_do_its_torn_halves() {
        let halves = [0u64, 1, RELEASED];
        for hi in halves {
            for lo in halves {
                let w = (hi & !0xffff_ffff) | (lo & 0xffff_ffff);
                if hi == RELEASED || lo == RELEASED {
                    assert!(WaitCmp::Geq.holds(w, 1), "{w:#x}");
                }
            }
        }
        assert!(!WaitCmp::Geq.holds(0, 1));
    }
}
