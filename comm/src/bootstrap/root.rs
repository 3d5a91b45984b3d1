//! The rendezvous root, and the authenticated accept loop it shares with the mesh.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

use super::BootstrapConfig;
use super::protocol::{
    ErrorCode, FrameKind, HANDSHAKE_MAX_BYTES, Hello, HelloRole, SECRET_BYTES, decode_hello,
    encode_error, encode_table, from_io, read_frame, secrets_equal, write_frame,
};
use super::unique_id::{UniqueId, random_secret};

/// How long an accepted but not yet authenticated connection may take to send its Hello.
/// Legitimate ranks send it right after connecting; the bound keeps a silent client from
/// holding a handshake thread for the whole bootstrap deadline.
const HELLO_READ_LIMIT: Duration = Duration::from_secs(10);

/// How often the accept loop looks for new connections and finished handshakes.
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
}

/// The result of an accept loop: the connections accepted (index = rank) and, if the loop
/// ended early, why.
pub(crate) struct Accepted {
    pub conns: Vec<Option<(TcpStream, Hello)>>,
    pub error: Option<Error>,
}

/// Accepts connections until every rank in `expect.ranks` has presented a valid Hello.
///
/// Each connection's Hello is read on its own short-lived thread, so a client that connects
/// and stays silent (or sends garbage) delays nobody. Refused connections get an Error frame
/// naming the reason and are closed; the loop keeps waiting for the legitimate ranks.
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
    let (tx, rx) = mpsc::channel::<(TcpStream, SocketAddr, Result<Hello>)>();
    loop {
        match listener.accept() {
            Ok((stream, from)) => spawn_hello_reader(stream, from, deadline, tx.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::debug!(error = %e, who = %expect.who, "bootstrap accept failed"),
        }
        while let Ok((stream, from, hello)) = rx.try_recv() {
            let verdict = hello.and_then(|h| validate(&h, expect, &conns).map(|()| h));
            match verdict {
                Ok(h) => {
                    tracing::debug!(rank = h.rank, %from, who = %expect.who, "bootstrap rank accepted");
                    let r = h.rank;
                    conns[r] = Some((stream, h));
                    missing -= 1;
                }
                Err(e) => {
                    tracing::warn!(%from, who = %expect.who, error = %e, "bootstrap connection refused");
                    refuse(
                        stream,
                        ErrorCode::Refused,
                        &format!("refused by {}: {e}", expect.who),
                    );
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
        std::thread::sleep(POLL);
    }
}

fn spawn_hello_reader(
    mut stream: TcpStream,
    from: SocketAddr,
    deadline: Instant,
    tx: mpsc::Sender<(TcpStream, SocketAddr, Result<Hello>)>,
) {
    // Detached on purpose: it ends within HELLO_READ_LIMIT whatever the client does.
    let spawned = std::thread::Builder::new()
        .name("mscclpp-bootstrap-hello".into())
        .spawn(move || {
            let limit = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(1), HELLO_READ_LIMIT);
            let hello = (|| {
                stream
                    .set_nonblocking(false)
                    .and_then(|()| stream.set_read_timeout(Some(limit)))
                    .map_err(|e| Error::io("configuring a bootstrap connection", e))?;
                let (h, payload) = read_frame(&mut stream, HANDSHAKE_MAX_BYTES)
                    .map_err(|e| from_io(e, format!("reading the hello from {from}")))?;
                if h.kind != FrameKind::Hello {
                    return Err(Error::malformed(
                        "bootstrap handshake",
                        format!("expected a Hello frame, found {:?}", h.kind),
                    ));
                }
                decode_hello(&payload)
            })();
            let _ = tx.send((stream, from, hello));
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, %from, "could not start a bootstrap handshake thread");
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

/// Sends an Error frame (best effort, briefly) and closes the connection.
///
/// Runs on its own detached thread: closing a socket that still holds unread input makes the
/// kernel send a reset, which can destroy the Error frame before the client reads it, so the
/// client's leftover bytes are drained first (bounded in time and size).
pub(crate) fn refuse(mut stream: TcpStream, code: ErrorCode, msg: &str) {
    let payload = encode_error(code, msg);
    let spawned = std::thread::Builder::new()
        .name("mscclpp-bootstrap-refuse".into())
        .spawn(move || {
            let _ = stream.set_nonblocking(false);
            let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = write_frame(&mut stream, FrameKind::Error, 0, &payload);
            let _ = stream.shutdown(std::net::Shutdown::Write);
            let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
            let _ = std::io::copy(
                &mut std::io::Read::take(&mut stream, 1 << 16),
                &mut std::io::sink(),
            );
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start a bootstrap refusal thread");
    }
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
        let root = Self::spawn(listener, secret, nranks, cfg.clone())?;
        Ok((root, UniqueId::from_parts(bound, secret)))
    }

    pub(crate) fn spawn(
        listener: TcpListener,
        secret: [u8; SECRET_BYTES],
        nranks: usize,
        cfg: BootstrapConfig,
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
            .spawn(move || run_root(&listener, &secret, nranks, &cfg, &stop2))
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
