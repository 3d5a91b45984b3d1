//! The shared-memory segment of a view's barrier on one host: its layout (an arrival
//! counter, the release and "ready" words, one slot per local rank, the first dead rank), its
//! creation and mapping under `/dev/shm`, and the atomics and futex wake-ups over it; and the
//! per-view state the barrier keeps ([`ShmState`]). The barrier itself is in `shm`.

use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use rustix::fs::{Mode, OFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::thread::futex;

const MAGIC: u64 = u64::from_le_bytes(*b"MSCLBAR1");
const VERSION: u32 = 1;

// Byte offsets in the segment; each word that ranks write in the barrier on a line of its own.
const OFF_MAGIC: usize = 0; // u64, written last by the creator
const OFF_KEY: usize = 8; // u64: the hash the name came from
const OFF_NLOCAL: usize = 16; // u32
const OFF_VERSION: usize = 20; // u32
const OFF_MAPPED: usize = 24; // u32: ranks that mapped it so far
const OFF_ARRIVE: usize = 64; // u32: arrivals at the current barrier
const OFF_GEN: usize = 128; // u32: generation | flags; the release
const OFF_READY: usize = 192; // u32: generation | flags; "every local rank arrived", for the leader
const OFF_FAILED: usize = 256; // u32: bootstrap rank + 1 of a rank found dead, 0 if none
const OFF_SLOTS: usize = 320; // per local rank: [arrived generation u32, left u32]

/// Generation bits of the `gen` and `ready` words (barriers counted modulo 2^30).
pub(super) const GEN_MASK: u32 = (1 << 30) - 1;
/// Set on both words when a rank drops its view: waiters look at who left.
pub(super) const LEFT: u32 = 1 << 30;
/// Set on both words when a dead rank was written into `failed`.
pub(super) const FAILED: u32 = 1 << 31;

/// Which word a waiter sleeps on.
#[derive(Clone, Copy)]
pub(super) enum Word {
    Gen,
    Ready,
}

/// One mapping of a host's segment.
pub(crate) struct Segment {
    base: NonNull<u8>,
    len: usize,
    pub(super) nlocal: usize,
    /// This rank's index among the host's ranks.
    pub(super) me: usize,
}

// SAFETY: the segment owns its mapping until drop, and every access to the shared bytes is
// atomic (other processes write them concurrently); the pointer itself is never changed.
unsafe impl Send for Segment {}
// SAFETY: as above: `&Segment` only hands out atomics inside the mapping.
unsafe impl Sync for Segment {}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.len)
            .field("nlocal", &self.nlocal)
            .field("me", &self.me)
            .finish_non_exhaustive()
    }
}

fn io_err(e: rustix::io::Errno) -> std::io::Error {
    std::io::Error::from_raw_os_error(e.raw_os_error())
}

impl Segment {
    /// Bytes a segment for `nlocal` ranks takes (whole pages).
    fn bytes(nlocal: usize) -> usize {
        (OFF_SLOTS + 8 * nlocal).div_ceil(4096) * 4096
    }

    /// Creates, sizes, maps and initialises the segment at `path` (as the host's leader).
    pub(super) fn create(path: &Path, key: u64, nlocal: usize) -> std::io::Result<Segment> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::RUSR | Mode::WUSR,
        )
        .map_err(io_err)?;
        let len = Self::bytes(nlocal);
        // Allocated, not only sized: a full /dev/shm is then this error, not a SIGBUS at the
        // first store into the mapping.
        let made = rustix::fs::fallocate(&fd, rustix::fs::FallocateFlags::empty(), 0, len as u64)
            .map_err(io_err)
            .and_then(|()| Self::map(&fd, len, nlocal, 0));
        let seg = match made {
            Ok(s) => s,
            Err(e) => {
                let _ = rustix::fs::unlink(path);
                return Err(e);
            }
        };
        // A fresh file reads as zeros: counters, generations and slots start at 0.
        seg.u64_at(OFF_KEY).store(key, Ordering::Relaxed);
        seg.u32_at(OFF_NLOCAL)
            .store(nlocal as u32, Ordering::Relaxed);
        seg.u32_at(OFF_VERSION).store(VERSION, Ordering::Relaxed);
        seg.u32_at(OFF_MAPPED).store(1, Ordering::Relaxed);
        seg.u64_at(OFF_MAGIC).store(MAGIC, Ordering::Release);
        Ok(seg)
    }

    /// Opens and maps the leader's segment at `path` as local rank `me`, after checking that
    /// it is this user's, of the expected size, and carries the expected header. The last rank
    /// to map it unlinks the name.
    pub(super) fn open(
        path: &Path,
        key: u64,
        nlocal: usize,
        me: usize,
    ) -> std::io::Result<Segment> {
        let bad = |why: String| std::io::Error::new(std::io::ErrorKind::InvalidData, why);
        let fd = rustix::fs::open(
            path,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(io_err)?;
        let st = rustix::fs::fstat(&fd).map_err(io_err)?;
        let uid = rustix::process::getuid().as_raw();
        if st.st_uid != uid {
            return Err(bad(format!("owned by uid {}, not {uid}", st.st_uid)));
        }
        let len = Self::bytes(nlocal);
        if u64::try_from(st.st_size).ok() != Some(len as u64) {
            return Err(bad(format!("{} bytes, expected {len}", st.st_size)));
        }
        let seg = Self::map(&fd, len, nlocal, me)?;
        let magic = seg.u64_at(OFF_MAGIC).load(Ordering::Acquire);
        let (k, n, v) = (
            seg.u64_at(OFF_KEY).load(Ordering::Relaxed),
            seg.u32_at(OFF_NLOCAL).load(Ordering::Relaxed),
            seg.u32_at(OFF_VERSION).load(Ordering::Relaxed),
        );
        if magic != MAGIC || k != key || n as usize != nlocal || v != VERSION {
            return Err(bad(format!(
                "header (magic {magic:#x}, key {k:#x}, {n} ranks, version {v}) is not the one \
                 expected (key {key:#x}, {nlocal} ranks, version {VERSION})"
            )));
        }
        if seg.u32_at(OFF_MAPPED).fetch_add(1, Ordering::AcqRel) + 1 == nlocal as u32 {
            let _ = rustix::fs::unlink(path);
        }
        Ok(seg)
    }

    fn map(
        fd: &std::os::fd::OwnedFd,
        len: usize,
        nlocal: usize,
        me: usize,
    ) -> std::io::Result<Segment> {
        // SAFETY: a new shared mapping of `len` bytes of a file that has `len` bytes (checked
        // or set by the caller); nothing else in this process aliases it, and it is unmapped
        // once, in `Drop`.
        let p = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(io_err)?;
        let base = NonNull::new(p.cast::<u8>())
            .ok_or_else(|| std::io::Error::other("mmap returned a null mapping"))?;
        Ok(Segment {
            base,
            len,
            nlocal,
            me,
        })
    }

    fn u32_at(&self, off: usize) -> &AtomicU32 {
        debug_assert!(off % 4 == 0 && off + 4 <= self.len);
        // SAFETY: `off` is 4-aligned and within the mapping (the offsets are constants and
        // slots below `nlocal`), the mapping is page-aligned and lives as long as `self`, and
        // every process accesses these bytes only atomically.
        unsafe { AtomicU32::from_ptr(self.base.as_ptr().add(off).cast::<u32>()) }
    }

    fn u64_at(&self, off: usize) -> &AtomicU64 {
        debug_assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: as in `u32_at`, with an 8-aligned offset.
        unsafe { AtomicU64::from_ptr(self.base.as_ptr().add(off).cast::<u64>()) }
    }

    pub(super) fn word(&self, w: Word) -> &AtomicU32 {
        match w {
            Word::Gen => self.u32_at(OFF_GEN),
            Word::Ready => self.u32_at(OFF_READY),
        }
    }

    pub(super) fn arrive(&self) -> &AtomicU32 {
        self.u32_at(OFF_ARRIVE)
    }

    pub(super) fn failed(&self) -> &AtomicU32 {
        self.u32_at(OFF_FAILED)
    }

    /// Local rank `i`'s last barrier arrived at (its generation + 1 there).
    pub(super) fn slot(&self, i: usize) -> &AtomicU32 {
        self.u32_at(OFF_SLOTS + 8 * i)
    }

    /// Non-zero once local rank `i` dropped its view.
    pub(super) fn left(&self, i: usize) -> &AtomicU32 {
        self.u32_at(OFF_SLOTS + 8 * i + 4)
    }

    fn wake(&self, w: Word) {
        // Shared (not private) futex: the waiters are other processes. i32::MAX: all of them.
        let _ = futex::wake(self.word(w), futex::Flags::empty(), i32::MAX as u32);
    }

    /// Publishes generation `g` on `w`, keeping its flags, and wakes its waiters.
    pub(super) fn release(&self, w: Word, g: u32) {
        let _ = self
            .word(w)
            .fetch_update(Ordering::Release, Ordering::Relaxed, |old| {
                Some((old & !GEN_MASK) | g)
            });
        self.wake(w);
    }

    /// Sets `flag` on both words and wakes everyone sleeping on either.
    fn raise(&self, flag: u32) {
        for w in [Word::Gen, Word::Ready] {
            self.word(w).fetch_or(flag, Ordering::AcqRel);
            self.wake(w);
        }
    }

    /// Records that bootstrap rank `peer` died (the first report stays) and wakes every waiter.
    pub(crate) fn post_failure(&self, peer: usize) {
        let _ =
            self.failed()
                .compare_exchange(0, peer as u32 + 1, Ordering::AcqRel, Ordering::Acquire);
        self.raise(FAILED);
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // This rank will never arrive again: ranks waiting for it must not wait to the deadline.
        self.left(self.me).store(1, Ordering::Release);
        self.raise(LEFT);
        // SAFETY: the mapping made in `map`, unmapped once; no reference into it outlives
        // `self` (every accessor borrows `self`).
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

/// A view's segment as the bootstrap knows it, with the view's members (bootstrap ranks).
pub(crate) type Registered = (std::sync::Weak<Segment>, Arc<[usize]>);

/// A view's barrier in shared memory, once set up.
#[derive(Debug)]
pub(crate) struct SharedBarrier {
    /// This host's segment; `None` when this rank is alone on its host (it then only takes part
    /// in the leaders' barrier).
    pub(super) seg: Option<Arc<Segment>>,
    /// View ranks of this host, in order; the first is the host's leader.
    pub(super) locals: Vec<usize>,
    /// One view rank per host (the lowest there), in view order.
    pub(super) leaders: Vec<usize>,
    /// This rank's index in `leaders`, if it leads its host.
    pub(super) lead: Option<usize>,
    /// Barriers this rank arrived at, modulo 2^30 (the generation it expects to find).
    pub(super) seq: u32,
}

/// How a view's barrier runs.
#[derive(Debug)]
pub(crate) enum ShmState {
    /// Not decided yet: the view's first barrier sets it up.
    Untried,
    /// The TCP barrier (opted out, not possible here, or one rank per host).
    Off,
    On(SharedBarrier),
}
