//! The bookkeeping of [`crate::GpuStream`]: the list of what a stream keeps alive for its
//! enqueued work, deadline-polled waits, and staged host copies.
//!
//! **Buffer lifetime on streams.** Every operation that names a buffer keeps a clone of it in
//! the stream's [`KeepAlive`] list, tagged with the operation's sequence number; a successful
//! wait releases the entries it covers ([`KeepAlive::release`]), and once the list grows past
//! [`KEEP_CHECK_THRESHOLD`] an enqueue asks the backend whether the stream has gone idle (then
//! everything is released). So a buffer dropped by its user while a copy is queued is freed
//! only after the copy ran.
//!
//! **Waits with deadlines.** GPU runtimes have no timed wait: [`poll_until`] polls a query
//! (yielding, then sleeping with a growing interval) until it is reached or the deadline passes.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

/// Keep-alive entries beyond which an enqueue checks whether the stream has gone idle.
pub const KEEP_CHECK_THRESHOLD: usize = 512;

/// The sequence numbers of a stream's operations and what each still needs until it has run.
#[derive(Debug)]
pub struct KeepAlive<K> {
    /// Sequence number of the last enqueued operation.
    seq: u64,
    /// What enqueued operations still need, by sequence number (ascending).
    keep: VecDeque<(u64, K)>,
}

impl<K> Default for KeepAlive<K> {
    fn default() -> Self {
        KeepAlive {
            seq: 0,
            keep: VecDeque::new(),
        }
    }
}

impl<K> KeepAlive<K> {
    /// Sequence number of the last enqueued operation (0 before the first).
    pub fn seq(&self) -> u64 {
        self.seq
    }

    /// Counts one enqueued operation that needs `items` until it has run. Past
    /// [`KEEP_CHECK_THRESHOLD`] entries, `is_idle` is asked whether the stream has run all of
    /// its work (the caller enqueues under the same lock, so an idle stream has run every
    /// operation counted here); if so, every entry is released.
    pub fn enqueued(&mut self, items: impl IntoIterator<Item = K>, is_idle: impl FnOnce() -> bool) {
        self.seq += 1;
        let seq = self.seq;
        self.keep.extend(items.into_iter().map(|k| (seq, k)));
        if self.keep.len() > KEEP_CHECK_THRESHOLD && is_idle() {
            self.keep.clear();
        }
    }

    /// Counts one enqueued operation whose needs the caller looks after itself.
    pub fn enqueued_untracked(&mut self) {
        self.seq += 1;
    }

    /// Releases the entries of operations up to `seq` (which have run).
    pub fn release(&mut self, seq: u64) {
        while self.keep.front().is_some_and(|(s, _)| *s <= seq) {
            self.keep.pop_front();
        }
    }

    /// Whether nothing is kept alive.
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
    }

    /// Takes every entry out (to be leaked when the work may still be running).
    pub fn take(&mut self) -> VecDeque<(u64, K)> {
        std::mem::take(&mut self.keep)
    }

    /// Takes out what the operations after `seq` need (work captured into a graph, which never
    /// ran on the stream and now belongs to the graph).
    pub fn take_after(&mut self, seq: u64) -> Vec<K> {
        let split = self
            .keep
            .iter()
            .position(|(s, _)| *s > seq)
            .unwrap_or(self.keep.len());
        self.keep.drain(split..).map(|(_, k)| k).collect()
    }
}

/// Polls `done` until it returns true or `timeout` passes (an [`Error::Timeout`] naming
/// `what()`); an error of `done` ends the wait.
pub fn poll_until(
    timeout: Duration,
    what: impl Fn() -> String,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let start = Instant::now();
    let mut spins = 0u32;
    let mut nap = Duration::from_micros(10);
    loop {
        if done()? {
            return Ok(());
        }
        if start.elapsed() >= timeout {
            return Err(Error::Timeout {
                waiting_for: what(),
                after: timeout,
            });
        }
        if spins < 200 {
            spins += 1;
            std::thread::yield_now();
        } else {
            std::thread::sleep(nap);
            nap = (nap * 2).min(Duration::from_millis(1));
        }
    }
}

/// Checks that a copy (`what`: "copy", "host write", "host read") of `src` bytes has a
/// destination of the same length.
pub fn check_copy_len(what: &str, src: usize, dst: usize) -> Result<()> {
    if dst != src {
        return Err(Error::invalid(format!(
            "{what} of {src} bytes into a destination of {dst} bytes"
        )));
    }
    Ok(())
}

/// A blocking host-to-device copy of `src` on a GPU stream: `wait(what)` waits for the stream
/// (with the deadline of host copies), `enqueue(ptr, len)` enqueues the vendor's asynchronous
/// copy from `len` bytes at `ptr`.
///
/// Earlier work is waited for first (a copy from pageable memory could otherwise block inside
/// the runtime, without a deadline, until the stream is idle), and the copy reads an owned
/// staging copy, leaked if the wait fails, so that a timed-out wait never leaves the GPU
/// reading the caller's slice (or freed memory) after we have returned.
pub fn staged_host_write(
    src: &[u8],
    wait: impl Fn(&str) -> Result<()>,
    enqueue: impl FnOnce(*const u8, usize) -> Result<()>,
) -> Result<()> {
    wait("earlier work before a host write")?;
    let staging = src.to_vec();
    enqueue(staging.as_ptr(), staging.len())?;
    match wait("a host write") {
        Ok(()) => Ok(()),
        Err(e) => {
            // The copy may still be running and reading `staging`: leak it rather than free it
            // under the GPU.
            std::mem::forget(staging);
            Err(e)
        }
    }
}

/// A blocking device-to-host copy into `dst` on a GPU stream, as [`staged_host_write`]:
/// `enqueue(ptr, len)` enqueues the vendor's asynchronous copy into `len` bytes at `ptr` (an
/// owned staging buffer, leaked if the wait fails, copied into `dst` once the copy ran).
pub fn staged_host_read(
    dst: &mut [u8],
    wait: impl Fn(&str) -> Result<()>,
    enqueue: impl FnOnce(*mut u8, usize) -> Result<()>,
) -> Result<()> {
    wait("earlier work before a host read")?;
    let mut staging = vec![0u8; dst.len()];
    let len = staging.len();
    enqueue(staging.as_mut_ptr(), len)?;
    match wait("a host read") {
        Ok(()) => {
            dst.copy_from_slice(&staging);
            Ok(())
        }
        Err(e) => {
            // The copy may still be writing into `staging`: leak it.
            std::mem::forget(staging);
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_released_up_to_a_sequence_number() {
        let mut k = KeepAlive::default();
        k.enqueued(["a", "b"], || unreachable!());
        k.enqueued([], || unreachable!());
        k.enqueued(["c"], || unreachable!());
        assert_eq!(k.seq(), 3);
        k.release(2);
        assert!(!k.is_empty());
        k.enqueued_untracked();
        assert_eq!(k.seq(), 4);
        assert_eq!(k.take_after(2), vec!["c"]);
        assert!(k.is_empty());
    }

    #[test]
    fn an_idle_stream_past_the_threshold_releases_everything() {
        let mut k = KeepAlive::default();
        for i in 0..KEEP_CHECK_THRESHOLD {
            k.enqueued([i], || unreachable!());
        }
        k.enqueued([0], || false);
        assert_eq!(k.take().len(), KEEP_CHECK_THRESHOLD + 1);
        for i in 0..=KEEP_CHECK_THRESHOLD {
            k.enqueued([i], || true);
        }
        assert!(k.is_empty());
        assert_eq!(k.seq(), 2 * KEEP_CHECK_THRESHOLD as u64 + 2);
    }

    #[test]
    fn staged_copies_wait_before_and_after_and_copy_back() {
        let waits = std::cell::RefCell::new(Vec::new());
        let wait = |what: &str| {
            waits.borrow_mut().push(what.to_owned());
            Ok(())
        };
        staged_host_write(b"abc", wait, |ptr, len| {
            assert_eq!(len, 3);
            assert_ne!(ptr, b"abc".as_ptr());
            Ok(())
        })
        .unwrap();
        let mut out = [0u8; 2];
        staged_host_read(&mut out, wait, |ptr, len| {
            // SAFETY: the staging buffer has `len` writable bytes.
            unsafe { std::ptr::write_bytes(ptr, 7, len) };
            Ok(())
        })
        .unwrap();
        assert_eq!(out, [7, 7]);
        assert_eq!(waits.borrow().len(), 4);
        let e = staged_host_read(&mut out, |_| Ok(()), |_, _| Err(Error::invalid("x")));
        assert!(e.is_err());
        assert!(check_copy_len("host read", 3, 3).is_ok());
        let e = check_copy_len("copy", 3, 2).unwrap_err().to_string();
        assert!(
            e.contains("copy of 3 bytes into a destination of 2 bytes"),
            "{e}"
        );
    }

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
