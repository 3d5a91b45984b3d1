//! Roots that outlive their rendezvous, so that a rank holding a stale unique id joins the
//! rendezvous that replaced it.
//!
//! PyTorch publishes rank 0's `ncclUniqueId` in its store under a key that repeats after
//! `destroy_process_group` (the group names and ProcessGroupNCCL's id counter restart), and
//! torchrun's store outlives the group. On re-initialisation a rank that reads the key before
//! rank 0 has written the new id gets the previous cycle's, whose root has stopped listening:
//! the init fails (the real NCCL's too), at random, on some cycle.
//!
//! So a root made by a [`UniqueId`](super::UniqueId) of this process keeps its listener once its
//! rendezvous is done ([`linger`]). When every bootstrap of that id in this process is gone
//! ([`Member`]) and a root of the same size starts here ([`started`]), that root is the id's
//! successor. A rank that then dials the old root with the old secret gets a `Moved` frame
//! carrying the successor's id and joins it. The rank proved the old secret, so it was a member
//! of the communicator the successor replaces. While the old communicator lives, or where two
//! roots of its size started since (two groups re-created at once: which one is meant cannot be
//! known), the rank is refused with a message saying so. With no successor yet it waits for one
//! up to the root's bootstrap deadline: rank 0 may still be destroying the old communicator or
//! making the new id.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::hello::{HELLO_LIMIT, Pending, refuse};
use super::protocol::{ErrorCode, FrameKind, Hello, SECRET_BYTES, secrets_equal, write_frame};
use super::unique_id::UniqueId;

/// Finished roots kept per process; the oldest goes first.
const MAX_LINGERING: usize = 8;

/// How long a finished root is kept once its communicator is gone and nobody dialled it.
const KEEP_UNUSED: Duration = Duration::from_secs(300);

/// Polling periods: fast while some stale rank may dial (a finished root whose communicator is
/// gone), slow otherwise (only strays to refuse).
const POLL_FAST: Duration = Duration::from_millis(5);
const POLL_SLOW: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Successor {
    None,
    One(UniqueId),
    Several,
}

struct Finished {
    secret: [u8; SECRET_BYTES],
    nranks: usize,
    listener: TcpListener,
    successor: Successor,
    /// When no bootstrap of the id was left in this process (`None` while one lives).
    orphaned_at: Option<Instant>,
    /// How long a rank with the old id may wait for a successor (the root's deadline).
    wait: Duration,
    hellos: Vec<Pending>,
    /// Ranks with a valid old Hello, waiting for a successor until their instant.
    waiting: Vec<(TcpStream, Hello, Instant)>,
}

#[derive(Default)]
struct Registry {
    /// Bootstraps alive in this process, by secret.
    live: HashMap<[u8; SECRET_BYTES], usize>,
    finished: Vec<Finished>,
    polling: bool,
}

fn registry() -> MutexGuard<'static, Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(Registry::default()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One bootstrap of an id alive in this process (held by its connections' core).
#[derive(Debug)]
pub(super) struct Member([u8; SECRET_BYTES]);

impl Member {
    pub(super) fn new(secret: [u8; SECRET_BYTES]) -> Member {
        let mut r = registry();
        *r.live.entry(secret).or_insert(0) += 1;
        // The root may finish (and linger) before the first of its ranks' bootstraps exists
        // here: it counted the id's communicator gone, which it is not.
        // A successor picked in that window was picked for a communicator that lives on.
        for f in r.finished.iter_mut().filter(|f| f.secret == secret) {
            if f.orphaned_at.take().is_some() {
                f.successor = Successor::None;
            }
        }
        Member(secret)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        let mut r = registry();
        let gone = match r.live.get_mut(&self.0) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            _ => true,
        };
        if gone {
            r.live.remove(&self.0);
            let now = Instant::now();
            for f in r.finished.iter_mut().filter(|f| f.secret == self.0) {
                f.orphaned_at.get_or_insert(now);
            }
        }
    }
}

/// Keeps a root's listener after its rendezvous succeeded (see the module docs).
pub(super) fn linger(
    listener: TcpListener,
    secret: [u8; SECRET_BYTES],
    nranks: usize,
    wait: Duration,
) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::debug!(error = %e, "a finished bootstrap root is not kept");
        return;
    }
    let mut r = registry();
    let orphaned_at = (!r.live.contains_key(&secret)).then(Instant::now);
    if r.finished.len() >= MAX_LINGERING {
        let oldest = r.finished.remove(0);
        drop_finished(oldest);
    }
    r.finished.push(Finished {
        secret,
        nranks,
        listener,
        successor: Successor::None,
        orphaned_at,
        wait,
        hellos: Vec::new(),
        waiting: Vec::new(),
    });
    if !r.polling {
        let spawned = std::thread::Builder::new()
            .name("mscclpp-bootstrap-successor".into())
            .spawn(serve);
        match spawned {
            Ok(_) => r.polling = true,
            Err(e) => tracing::debug!(error = %e, "no thread for finished bootstrap roots"),
        }
    }
}

/// A root of `nranks` ranks for `id` started in this process: it succeeds every finished root
/// of that size whose communicator is gone.
pub(super) fn started(id: UniqueId, nranks: usize) {
    let mut r = registry();
    let now = Instant::now();
    // Soon after the old communicator went: a re-initialisation, not a later, unrelated
    // communicator that happens to have the same size.
    for f in r.finished.iter_mut().filter(|f| {
        f.nranks == nranks
            && f.orphaned_at
                .is_some_and(|t| now.duration_since(t) <= f.wait)
    }) {
        f.successor = match f.successor {
            Successor::None => Successor::One(id),
            _ => Successor::Several,
        };
    }
}

fn drop_finished(f: Finished) {
    for (stream, _, _) in f.waiting {
        refuse(
            stream,
            ErrorCode::Refused,
            "the unique id's rendezvous is over, and this process keeps no more of its finished roots",
        );
    }
}

/// The thread serving finished roots; it ends when none is left.
fn serve() {
    loop {
        let fast = {
            let mut r = registry();
            let now = Instant::now();
            let (kept, gone): (Vec<Finished>, Vec<Finished>) =
                std::mem::take(&mut r.finished).into_iter().partition(|f| {
                    f.orphaned_at
                        .is_none_or(|t| now < t + KEEP_UNUSED.max(f.wait))
                        || !f.waiting.is_empty()
                        || !f.hellos.is_empty()
                });
            r.finished = kept;
            gone.into_iter().for_each(drop_finished);
            if r.finished.is_empty() {
                r.polling = false;
                return;
            }
            for f in &mut r.finished {
                pass(f, now);
            }
            r.finished
                .iter()
                .any(|f| f.orphaned_at.is_some() || !f.hellos.is_empty() || !f.waiting.is_empty())
        };
        std::thread::sleep(if fast { POLL_FAST } else { POLL_SLOW });
    }
}

fn pass(f: &mut Finished, now: Instant) {
    loop {
        match f.listener.accept() {
            Ok((stream, from)) => {
                if stream.set_nonblocking(true).is_ok() {
                    f.hellos.push(Pending::new(stream, from, HELLO_LIMIT));
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) => {
                tracing::debug!(error = %e, "accept on a finished bootstrap root failed");
                break;
            }
        }
    }
    let mut still = Vec::new();
    for mut p in std::mem::take(&mut f.hellos) {
        match p.poll() {
            None if now < p.deadline => still.push(p),
            None => {}
            Some(Err(e)) => {
                tracing::debug!(from = %p.from, error = %e, "a bad hello to a finished bootstrap root")
            }
            Some(Ok(h)) if !secrets_equal(&h.secret, &f.secret) => refuse(
                p.stream,
                ErrorCode::Refused,
                "wrong secret: the peer belongs to a different bootstrap",
            ),
            Some(Ok(h)) if h.nranks != f.nranks => refuse(
                p.stream,
                ErrorCode::Refused,
                &format!(
                    "rank {} says nranks = {}, the bootstrap of this unique id had {} (and its rendezvous is over)",
                    h.rank, h.nranks, f.nranks
                ),
            ),
            Some(Ok(h)) => {
                let until = now + f.wait;
                f.waiting.push((p.stream, h, until));
            }
        }
    }
    f.hellos = still;
    let mut waiting = Vec::new();
    for (stream, h, until) in std::mem::take(&mut f.waiting) {
        match f.successor {
            Successor::One(id) => moved(stream, &h, id),
            Successor::Several => refuse(
                stream,
                ErrorCode::Refused,
                &format!(
                    "the unique id's rendezvous is over, and several communicators of {} ranks were started in its place by the root's process: which one is meant cannot be told",
                    f.nranks
                ),
            ),
            // Rank 0 may still be destroying the old communicator or making the new id.
            Successor::None if now < until => waiting.push((stream, h, until)),
            Successor::None if f.orphaned_at.is_none() => refuse(
                stream,
                ErrorCode::Refused,
                &format!(
                    "the unique id's rendezvous is over and its communicator still lives in the root's process after {:?} (an id read from a store that outlived it?)",
                    f.wait
                ),
            ),
            Successor::None => refuse(
                stream,
                ErrorCode::Timeout,
                &format!(
                    "the unique id's rendezvous is over, and no communicator of {} ranks was started in its place by the root's process within {:?}",
                    f.nranks, f.wait
                ),
            ),
        }
    }
    f.waiting = waiting;
}

fn moved(mut stream: TcpStream, h: &Hello, id: UniqueId) {
    tracing::info!(
        rank = h.rank,
        nranks = h.nranks,
        successor = %id.root_addr(),
        "a rank dialled a finished bootstrap root with its id: sent to the root that replaced it"
    );
    let sent = stream
        .set_nonblocking(false)
        .and_then(|()| stream.set_write_timeout(Some(Duration::from_secs(1))))
        .and_then(|()| write_frame(&mut stream, FrameKind::Moved, 0, &id.to_bytes()));
    if let Err(e) = sent {
        tracing::debug!(error = %e, "could not send a rank to the successor root");
    }
}
