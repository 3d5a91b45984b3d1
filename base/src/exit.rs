//! Process exit while communicators are still alive.
//!
//! Clients do not always destroy their communicators: nccl-tests with `-p 1` creates them on
//! threads and exits with them live, and a crashed or interrupted job exits from anywhere. At
//! `exit()` the vendor runtimes tear themselves down (their `atexit` handlers and library
//! destructors free every allocation of their contexts, host-mapped memory included), while the
//! library's background threads — the bootstrap's event loop, proxies, copy-engine release passes —
//! keep running until the process is gone. One of them touching device-visible memory after the
//! teardown is a segmentation fault in a process that had finished its work; the usual trigger is
//! a peer that exited first: the event loop learns its death and stores it into the
//! communicator's abort word.
//!
//! [`install`] registers an `atexit` handler the first time a communicator is made. `atexit`
//! handlers run in reverse order of registration, and the vendor runtime registered its own when
//! the process first used it (before any communicator could open a device), so this one runs
//! first: it closes the gate and waits for the threads inside it ([`enter`]) to leave. From then
//! on background work that would touch device memory skips it; nothing is left to observe it.

use std::sync::Once;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

static EXITING: AtomicBool = AtomicBool::new(false);
static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: Once = Once::new();

/// How long the exit handler waits for the threads inside the gate: their work is a store or a
/// few driver calls; a thread stuck longer than this is left behind rather than delaying exit.
const DRAIN: Duration = Duration::from_millis(500);

/// A thread inside the gate: device memory stays mapped until it is dropped.
#[derive(Debug)]
pub struct ExitGuard(());

impl Drop for ExitGuard {
    fn drop(&mut self) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters the gate: `None` once the process has begun to exit (skip the work that touches
/// device-visible memory), else a guard that holds the exit handler back while it lives. For
/// background threads; keep the guard for one short piece of work, never across a wait.
pub fn enter() -> Option<ExitGuard> {
    // SeqCst on both sides (increment then read the flag here; set the flag then read the count
    // in the handler): one of the two always sees the other.
    ACTIVE.fetch_add(1, Ordering::SeqCst);
    if EXITING.load(Ordering::SeqCst) {
        ACTIVE.fetch_sub(1, Ordering::SeqCst);
        return None;
    }
    Some(ExitGuard(()))
}

/// Whether the process has begun to exit: a cheap check for hot loops (a proxy's poll), which
/// then stop. Such a loop's single iteration is far shorter than the handler's grace period.
pub fn exiting() -> bool {
    EXITING.load(Ordering::Relaxed)
}

/// Registers the exit handler (once per process; later calls do nothing). Call it after the
/// vendor runtime was first used, so that the handler runs before the runtime's teardown.
pub fn install() {
    INSTALLED.call_once(|| {
        // SAFETY: `on_exit` is a plain `extern "C" fn()` with static lifetime that never
        // unwinds; registering it has no other precondition.
        let rc = unsafe { atexit(on_exit) };
        if rc != 0 {
            tracing::warn!(
                "atexit refused the library's exit handler: a communicator left alive at exit may crash the process"
            );
        }
    });
}

// SAFETY: `atexit` is C's, with this signature; the C library is always linked.
unsafe extern "C" {
    fn atexit(f: extern "C" fn()) -> std::ffi::c_int;
}

extern "C" fn on_exit() {
    close_gate(DRAIN);
}

/// Closes the gate and waits (up to `drain`) for every thread inside it to leave, then a little
/// longer for the hot loops that only check [`exiting`] between iterations.
fn close_gate(drain: Duration) {
    EXITING.store(true, Ordering::SeqCst);
    let deadline = Instant::now() + drain;
    while ACTIVE.load(Ordering::SeqCst) != 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_micros(200));
    }
    std::thread::sleep(Duration::from_millis(2));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The gate in one process's life: open, entered, then closed with a thread inside — the
    /// close waits for it to leave, and afterwards no one enters. (The statics are the
    /// process's: this is the only test that closes the gate.)
    #[test]
    fn closing_waits_for_the_thread_inside_and_then_refuses() {
        assert!(!exiting());
        let g = enter().expect("the gate is open before exit");
        let left = std::sync::Arc::new(AtomicBool::new(false));
        let l2 = left.clone();
        let holder = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            l2.store(true, Ordering::SeqCst);
            drop(g);
        });
        close_gate(Duration::from_secs(5));
        assert!(
            left.load(Ordering::SeqCst),
            "the gate closed while a thread was still inside"
        );
        assert!(exiting());
        assert!(enter().is_none(), "entered after the gate closed");
        holder.join().expect("holder thread");
    }
}
