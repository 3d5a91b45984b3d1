//! A rank's side of the rendezvous: joining through the root (Hello, then the address table,
//! retrying when the root turns it away), and the blocking exchanges a handshake needs
//! (connecting with retries, reading the answer to a Hello), which dialling a peer reuses.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::config::BootstrapConfig;
use super::protocol::{
    self, ErrorCode, FrameKind, Hello, HelloRole, decode_error, decode_table, encode_hello,
    from_io, read_frame, write_frame,
};
use super::unique_id::UniqueId;

/// Successor ids followed in one rendezvous; more means roots sending a rank in circles.
const MAX_MOVES: u32 = 4;

/// Registers with the root and receives the table of listen addresses. The root closes a
/// connection at once when too many handshakes are in progress; a rank whose connection
/// ends before any answer tries again after a random pause, until the deadline. With
/// `root_prebound` (a [`UniqueId`]'s root, listening since the id was made) a refused
/// connection is final: the id is stale. A finished root that was replaced answers with the id
/// of its successor (`successor`), which the rank then joins: the id returned is the one
/// joined.
pub(super) fn rendezvous(
    uid: &UniqueId,
    rank: usize,
    nranks: usize,
    cfg: &BootstrapConfig,
    deadline: Instant,
    root_prebound: bool,
) -> Result<(TcpListener, Vec<SocketAddr>, UniqueId)> {
    let mut uid = *uid;
    let mut moves = 0;
    let mut listener: Option<(TcpListener, SocketAddr)> = None;
    let mut attempt: u32 = 0;
    let cancel = cfg.cancel.clone().unwrap_or_default();
    loop {
        // Only this pass's connection is kept for a cancel: an earlier one is closed.
        cancel.forget();
        let root_addr = uid.root_addr();
        let mut to_root = connect_retry(
            root_addr,
            deadline,
            cfg.timeout,
            "the bootstrap root",
            root_prebound,
            &cancel,
        )?;
        // A cancel shuts it down, ending the wait for the table.
        if cfg.cancel.is_some() {
            cancel.watch(&to_root);
        }
        if listener.is_none() {
            // Listen on the address this host reaches the root from: it is routable
            // from there.
            let local_ip = to_root
                .local_addr()
                .map_err(|e| Error::io("reading the local address of the root connection", e))?
                .ip();
            let l = TcpListener::bind(SocketAddr::new(local_ip, 0)).map_err(|e| {
                Error::io(
                    format!("binding this rank's bootstrap listener on {local_ip}"),
                    e,
                )
            })?;
            let a = l
                .local_addr()
                .map_err(|e| Error::io("reading this rank's listen address", e))?;
            listener = Some((l, a));
        }
        let listen = listener.as_ref().map(|l| l.1).unwrap_or(root_addr);
        let hello = Hello {
            role: HelloRole::Root,
            secret: *uid.secret(),
            rank,
            nranks,
            listen,
        };
        let table_max = 64 + nranks.saturating_mul(24);
        let reply = write_frame(&mut to_root, FrameKind::Hello, 0, &encode_hello(&hello))
            .map_err(|e| {
                Error::io(
                    format!("sending the hello to the bootstrap root at {root_addr}"),
                    e,
                )
            })
            .and_then(|()| {
                read_reply(
                    &mut to_root,
                    deadline,
                    cfg.timeout,
                    table_max,
                    "the bootstrap root's address table",
                )
            });
        match reply {
            Err(_) if cancel.is_cancelled() => {
                return Err(super::cancel::cancelled(&format!(
                    "waiting for the bootstrap root at {root_addr}"
                )));
            }
            Ok((FrameKind::Table, payload)) => {
                let table = decode_table(&payload, nranks)?;
                tracing::debug!(%listen, attempt, "joined through the bootstrap root");
                let (l, _) = listener.ok_or_else(|| {
                    Error::Internal("bootstrap listener missing after the rendezvous".into())
                })?;
                return Ok((l, table, uid));
            }
            Ok((FrameKind::Moved, payload)) if moves < MAX_MOVES => {
                let next = UniqueId::from_bytes(&payload)?;
                tracing::info!(
                    stale = %root_addr,
                    successor = %next.root_addr(),
                    "the unique id's rendezvous is over; joining the one that replaced it"
                );
                uid = next;
                moves += 1;
            }
            Ok((kind, _)) => {
                return Err(Error::malformed(
                    "bootstrap handshake",
                    format!("the root sent a {kind:?} frame where the address table was expected"),
                ));
            }
            Err(e) if root_turned_us_away(&e) && Instant::now() < deadline => {
                attempt += 1;
                let pause = jitter(rank, attempt);
                tracing::debug!(attempt, ?pause, error = %e, "the bootstrap root turned us away; retrying");
                std::thread::sleep(pause.min(deadline.saturating_duration_since(Instant::now())));
                cancel.check("joining through the bootstrap root")?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// Whether a failed exchange means the other side closed the connection before answering (the
/// root does so when too many handshakes are in progress; a peer, when it exits), rather than
/// answered with a refusal.
pub(super) fn root_turned_us_away(e: &Error) -> bool {
    match e {
        Error::Remote { rank, message } => {
            *rank == usize::MAX && message.contains("closed the connection")
        }
        Error::Io { source, .. } => matches!(
            source.kind(),
            std::io::ErrorKind::ConnectionReset
                | std::io::ErrorKind::BrokenPipe
                | std::io::ErrorKind::ConnectionAborted
        ),
        _ => false,
    }
}

/// A random pause before retrying the root: growing with the attempt, spread so that ranks
/// turned away together do not return together.
fn jitter(rank: usize, attempt: u32) -> Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64);
    let mut x =
        (rank as u64 ^ nanos ^ (u64::from(attempt) << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x ^= x >> 29;
    let cap_ms = (10u64 << attempt.min(6)).min(500);
    Duration::from_millis(5 + x % cap_ms)
}

/// Connects to `addr`, retrying while it is not listening yet, until `deadline`; with
/// `refused_is_final`, a refused connection ends it at once (the root listened before its id
/// could be handed out, so it is gone, not late). `cancel` is checked between attempts (each
/// at most 1 s).
fn connect_retry(
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
    what: &str,
    refused_is_final: bool,
    cancel: &super::Cancel,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    loop {
        cancel.check(&format!("connecting to {what} at {addr}"))?;
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                waiting_for: format!("connecting to {what} at {addr}"),
                after: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(1))) {
            Ok(s) => return Ok(s),
            Err(e) if refused_is_final && e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(Error::invalid(format!(
                    "{what} at {addr} refused the connection ({e}): the unique id's rendezvous is over \
                     (an id of an earlier communicator, e.g. read from a store that outlived it) or the \
                     process that made it has exited"
                )));
            }
            Err(e) => {
                tracing::trace!(%addr, error = %e, "bootstrap connect failed; retrying");
                std::thread::sleep(backoff.min(deadline.saturating_duration_since(Instant::now())));
                backoff = (backoff * 2).min(Duration::from_millis(200));
            }
        }
    }
}

/// Reads the answer to a Hello: any frame but Error is returned; Error becomes a typed error.
pub(super) fn read_reply(
    s: &mut TcpStream,
    deadline: Instant,
    timeout: Duration,
    max: usize,
    what: &str,
) -> Result<(FrameKind, Vec<u8>)> {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    s.set_read_timeout(Some(left))
        .map_err(|e| Error::io("setting a bootstrap read timeout", e))?;
    let peer = s
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let (h, payload) =
        read_frame(s, max.max(protocol::HANDSHAKE_MAX_BYTES)).map_err(|e| match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => Error::Timeout {
                waiting_for: format!("{what} from {peer}"),
                after: timeout,
            },
            std::io::ErrorKind::UnexpectedEof => Error::Remote {
                rank: usize::MAX,
                message: format!(
                    "{peer} {} while we waited for {what}",
                    protocol::describe_read_error(&e)
                ),
            },
            _ => from_io(e, format!("reading {what} from {peer}")),
        })?;
    if h.kind == FrameKind::Error {
        let (code, msg) = decode_error(&payload)?;
        return Err(match code {
            ErrorCode::Timeout => Error::Timeout {
                waiting_for: format!("{what}: {msg}"),
                after: timeout,
            },
            _ => Error::Remote {
                rank: usize::MAX,
                message: format!("{peer}: {msg}"),
            },
        });
    }
    Ok((h.kind, payload))
}
