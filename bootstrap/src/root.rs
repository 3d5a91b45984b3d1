//! The rendezvous root, and the authenticated accept loop it shares with the mesh.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::config::BootstrapConfig;
use super::hello::{HELLO_LIMIT, MAX_PENDING_HELLOS, Pending, refuse};
use super::protocol::{
    ErrorCode, FrameKind, Hello, HelloRole, SECRET_BYTES, encode_table, secrets_equal, write_frame,
};
use super::unique_id::{UniqueId, random_secret};

/// Connections accepted per pass of the loop, so that pending Hellos are read between bursts.
const ACCEPTS_PER_PASS: usize = 64;

/// How often the accept loop looks for new connections and Hello bytes when idle.
const POLL: Duration = Duration::from_millis(2);

/// What an accept loop will let in.
pub(crate) struct Expect<'a> {
    pub role: HelloRole,
    pub secret: &'a [u8; SECRET_BYTES],
    pub nranks: usize,
    /// The ranks that must connect, each exactly once.
    pub ranks: Range<usize>,
    /// Who is accepting, for messages ("the bootstrap root", "rank 3").
    pub who: String,
    /// How long one connection may take to deliver its whole Hello ([`HELLO_LIMIT`]).
    pub hello_limit: Duration,
}

/// The result of an accept loop: the connections accepted (index = rank) and, if the loop
/// ended early, why.
pub(crate) struct Accepted {
    pub conns: Vec<Option<(TcpStream, Hello)>>,
    pub error: Option<Error>,
}

/// Accepts connections until every rank in `expect.ranks` has presented a valid Hello.
///
/// One thread reads every Hello, non-blocking: a client that connects and stays silent, or
/// sends a byte now and then, delays nobody and is closed `expect.hello_limit` after it connected;
/// at most [`MAX_PENDING_HELLOS`] handshakes are open at once (past that, the oldest is closed). Refused connections get an Error
/// frame naming the reason and are closed; the loop keeps waiting for the legitimate ranks.
pub(crate) fn accept_ranks(
    listener: &TcpListener,
    expect: &Expect<'_>,
    deadline: Instant,
    timeout: Duration,
    stop: &AtomicBool,
) -> Accepted {
    let mut conns: Vec<Option<(TcpStream, Hello)>> = (0..expect.nranks).map(|_| None).collect();
    let mut missing = expect.ranks.len();
    let finish = |conns, error| Accepted { conns, error };
    if missing == 0 {
        return finish(conns, None);
    }
    if let Err(e) = listener.set_nonblocking(true) {
        return finish(
            conns,
            Some(Error::io("making the bootstrap listener non-blocking", e)),
        );
    }
    let mut pending: Vec<Pending> = Vec::new();
    loop {
        let mut busy = false;
        let mut done: Vec<(TcpStream, SocketAddr, Result<Hello>)> = Vec::new();
        for _ in 0..ACCEPTS_PER_PASS {
            let (stream, from) = match listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::debug!(error = %e, who = %expect.who, "bootstrap accept failed");
                    break;
                }
            };
            busy = true;
            if let Err(e) = stream.set_nonblocking(true) {
                tracing::debug!(%from, error = %e, who = %expect.who, "bootstrap connection dropped");
                continue;
            }
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), expect.hello_limit);
            let mut p = Pending::new(stream, from, limit);
            match p.poll() {
                Some(hello) => done.push((p.stream, p.from, hello)),
                None if pending.len() < MAX_PENDING_HELLOS => pending.push(p),
                None => {
                    // The oldest handshake gives way, not the newest: a legitimate rank sends
                    // its hello right after connecting, but it may not have arrived when the
                    // connection is accepted (closing the newest dropped such a rank behind a
                    // flood of silent connections, seen in CI under load).
                    if let Some(oldest) = (0..pending.len()).min_by_key(|&i| pending[i].deadline) {
                        let old = pending.swap_remove(oldest);
                        tracing::debug!(
                            from = %old.from,
                            who = %expect.who,
                            pending = pending.len() + 1,
                            "bootstrap connection closed: too many handshakes in progress, the oldest gives way"
                        );
                    }
                    pending.push(p);
                }
            }
        }
        let now = Instant::now();
        let mut i = 0;
        while i < pending.len() {
            let p = &mut pending[i];
            let before = p.received();
            let verdict = match p.poll() {
                Some(h) => Some(h),
                None if now >= p.deadline => Some(Err(p.timed_out())),
                None => None,
            };
            busy |= p.received() != before;
            match verdict {
                Some(h) => {
                    let p = pending.swap_remove(i);
                    done.push((p.stream, p.from, h));
                }
                None => i += 1,
            }
        }
        for (stream, from, hello) in done {
            let verdict = hello.and_then(|h| validate(&h, expect, &conns).map(|()| h));
            let verdict = verdict.and_then(|h| {
                stream
                    .set_nonblocking(false)
                    .map_err(|e| Error::io(format!("configuring the connection from {from}"), e))
                    .map(|()| h)
            });
            match verdict {
                Ok(h) => {
                    tracing::debug!(rank = h.rank, %from, who = %expect.who, "bootstrap rank accepted");
                    let r = h.rank;
                    conns[r] = Some((stream, h));
                    missing -= 1;
                }
                Err(e) => {
                    tracing::warn!(%from, who = %expect.who, error = %e, "bootstrap connection refused");
                    let code = if matches!(e, Error::Timeout { .. }) {
                        ErrorCode::Timeout
                    } else {
                        ErrorCode::Refused
                    };
                    refuse(stream, code, &format!("refused by {}: {e}", expect.who));
                }
            }
        }
        if missing == 0 {
            return finish(conns, None);
        }
        if stop.load(Ordering::Acquire) {
            let e = Error::Internal(format!("{} stopped before every rank joined", expect.who));
            return finish(conns, Some(e));
        }
        if Instant::now() >= deadline {
            let absent: Vec<usize> = expect
                .ranks
                .clone()
                .filter(|&r| conns[r].is_none())
                .collect();
            let e = Error::Timeout {
                waiting_for: format!("ranks {absent:?} to connect to {}", expect.who),
                after: timeout,
            };
            return finish(conns, Some(e));
        }
        if !busy {
            std::thread::sleep(POLL);
        }
    }
}

fn validate(h: &Hello, expect: &Expect<'_>, conns: &[Option<(TcpStream, Hello)>]) -> Result<()> {
    let refuse = |why: String| Err(Error::invalid(why));
    if !secrets_equal(&h.secret, expect.secret) {
        return refuse("wrong secret: the peer belongs to a different bootstrap".into());
    }
    if h.role != expect.role {
        return refuse(format!(
            "a {:?} hello sent to a {:?} listener",
            h.role, expect.role
        ));
    }
    if h.nranks != expect.nranks {
        return refuse(format!(
            "rank {} says nranks = {}, this bootstrap has {}",
            h.rank, h.nranks, expect.nranks
        ));
    }
    if !expect.ranks.contains(&h.rank) {
        return refuse(format!(
            "rank {} is not expected here (expected ranks {:?})",
            h.rank, expect.ranks
        ));
    }
    if conns.get(h.rank).is_some_and(Option::is_some) {
        return refuse(format!(
            "rank {} has already joined (duplicate rank)",
            h.rank
        ));
    }
    Ok(())
}

/// A running bootstrap root: accepts every rank's Hello, then sends each the table of listen
/// addresses and exits.
///
/// Dropping it stops the root (if it is still waiting) and joins its thread. Use
/// [`BootstrapRoot::start`] in a process that is not itself a rank (a launcher passing the
/// [`UniqueId`] to its children); ranks that created the id with [`UniqueId::new`] get a root
/// run for them by [`Bootstrap::new`](super::Bootstrap::new).
#[derive(Debug)]
pub struct BootstrapRoot {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<()>>>,
}

impl BootstrapRoot {
    /// Binds the root on `addr` (port 0 picks one), starts it for `nranks` ranks with a fresh
    /// secret, and returns it with the id to hand to the ranks.
    pub fn start(
        addr: SocketAddr,
        nranks: usize,
        cfg: &BootstrapConfig,
    ) -> Result<(Self, UniqueId)> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("binding the bootstrap root on {addr}"), e))?;
        let bound = listener
            .local_addr()
            .map_err(|e| Error::io("reading the bootstrap root's address", e))?;
        let secret = random_secret()?;
        let root = Self::spawn(listener, secret, nranks, cfg.clone(), false)?;
        Ok((root, UniqueId::from_parts(bound, secret)))
    }

    /// Runs a root on `listener`; with `linger`, a root that succeeded keeps its listener for
    /// ranks that dial it late with its id ([`super::successor`]).
    pub(crate) fn spawn(
        listener: TcpListener,
        secret: [u8; SECRET_BYTES],
        nranks: usize,
        cfg: BootstrapConfig,
        linger: bool,
    ) -> Result<Self> {
        if nranks == 0 || nranks > super::protocol::MAX_RANKS {
            return Err(Error::invalid(format!(
                "nranks = {nranks}: expected 1..={}",
                super::protocol::MAX_RANKS
            )));
        }
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the bootstrap root's address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("mscclpp-bootstrap-root".into())
            .spawn(move || {
                let r = run_root(&listener, &secret, nranks, &cfg, &stop2);
                if r.is_ok() && linger {
                    super::successor::linger(listener, secret, nranks, cfg.timeout);
                }
                r
            })
            .map_err(|e| Error::io("starting the bootstrap root thread", e))?;
        Ok(BootstrapRoot {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address the root listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Asks the root to give up waiting for ranks (ranks already connected are told).
    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
    }

    /// Waits for the root to finish: `Ok` once every rank got the table, `Error::Timeout`
    /// naming the missing ranks if they did not all connect within the deadline.
    pub fn wait(mut self) -> Result<()> {
        self.join()
    }

    fn join(&mut self) -> Result<()> {
        match self.thread.take() {
            None => Ok(()),
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(Error::Internal("the bootstrap root thread panicked".into()))
            }),
        }
    }
}

impl Drop for BootstrapRoot {
    fn drop(&mut self) {
        self.stop();
        let _ = self.join();
    }
}

fn run_root(
    listener: &TcpListener,
    secret: &[u8; SECRET_BYTES],
    nranks: usize,
    cfg: &BootstrapConfig,
    stop: &AtomicBool,
) -> Result<()> {
    let addr = listener.local_addr().ok();
    let span = tracing::info_span!("bootstrap_root", ?addr, nranks);
    let _g = span.enter();
    tracing::info!("bootstrap root waiting for ranks");
    let expect = Expect {
        role: HelloRole::Root,
        secret,
        nranks,
        ranks: 0..nranks,
        who: "the bootstrap root".into(),
        hello_limit: HELLO_LIMIT,
    };
    let deadline = Instant::now() + cfg.timeout;
    let acc = accept_ranks(listener, &expect, deadline, cfg.timeout, stop);
    if let Some(e) = acc.error {
        let code = if matches!(e, Error::Timeout { .. }) {
            ErrorCode::Timeout
        } else {
            ErrorCode::Other
        };
        for (stream, _) in acc.conns.into_iter().flatten() {
            refuse(stream, code, &e.to_string());
        }
        tracing::warn!(error = %e, "bootstrap root failed");
        return Err(e);
    }
    let mut table = Vec::with_capacity(nranks);
    let mut streams = Vec::with_capacity(nranks);
    for (stream, hello) in acc.conns.into_iter().flatten() {
        table.push(hello.listen);
        streams.push(stream);
    }
    let payload = encode_table(&table);
    for (rank, mut s) in streams.into_iter().enumerate() {
        let sent = s
            .set_write_timeout(Some(cfg.timeout))
            .and_then(|()| write_frame(&mut s, FrameKind::Table, 0, &payload));
        if let Err(e) = sent {
            // That rank fails on its own deadline; the others can still go ahead.
            tracing::warn!(rank, error = %e, "bootstrap root could not send the table");
        }
    }
    tracing::info!("bootstrap root sent the address table to every rank");
    Ok(())
}
