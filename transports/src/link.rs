//! The TCP link under every connection: establishing it (lower rank connects, higher rank
//! accepts, a versioned hello carrying both ranks and the acceptor's nonce) and the shared
//! health of a connection (dead or alive, flushes acknowledged, bytes in flight).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{Error, Result};

use crate::offer::{Endpoint, LocalEndpoint};
use crate::transport::Transport;

const HELLO_MAGIC: [u8; 4] = *b"MSHL";
const REPLY_MAGIC: [u8; 4] = *b"MSHR";
const VERSION: u16 = 1;
/// Largest hello or reply accepted (both are far smaller).
const MAX_HANDSHAKE: usize = 1024;
/// Longest refusal reason sent.
const MAX_REASON: usize = 512;
/// How long an accepted socket may take to say hello before it is dropped as a stray.
const HELLO_WAIT: Duration = Duration::from_secs(5);

/// Establishes the TCP link of a connection between `local` and `remote`.
pub(crate) fn establish(local: &LocalEndpoint, remote: &Endpoint) -> Result<TcpStream> {
    let deadline = Instant::now() + local.cfg.connect_timeout;
    let me = &local.endpoint;
    let sock = if me.rank < remote.rank {
        dial(me, remote, deadline, local.cfg.connect_timeout)?
    } else {
        accept(local, remote, deadline)?
    };
    sock.set_read_timeout(None)
        .and_then(|_| sock.set_write_timeout(None))
        .and_then(|_| sock.set_nodelay(true))
        .map_err(|e| Error::io("configuring a connection's socket", e))?;
    Ok(sock)
}

fn hello(transport: Transport, from: usize, to: usize, nonce: &[u8; 16]) -> Vec<u8> {
    let mut w = Writer::new(HELLO_MAGIC, VERSION);
    w.u8(transport.code().unwrap_or(u8::MAX))
        .u32(from as u32)
        .u32(to as u32)
        .raw(nonce);
    w.finish()
}

fn reply(refusal: Option<&str>) -> Vec<u8> {
    let mut w = Writer::new(REPLY_MAGIC, VERSION);
    match refusal {
        None => w.u8(1).str(""),
        Some(r) => w.u8(0).str(truncate(r, MAX_REASON)),
    };
    w.finish()
}

/// At most `max` bytes of `s`, cut at a character boundary.
pub(crate) fn truncate(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

fn send_msg(sock: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    let mut out = Vec::with_capacity(4 + msg.len());
    out.extend_from_slice(&(msg.len() as u32).to_le_bytes());
    out.extend_from_slice(msg);
    sock.write_all(&out)
}

fn recv_msg(sock: &mut TcpStream, what: &'static str) -> Result<Vec<u8>> {
    let mut len = [0u8; 4];
    sock.read_exact(&mut len)
        .map_err(|e| Error::io(format!("reading a {what}"), e))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_HANDSHAKE {
        return Err(Error::malformed(
            what,
            format!("{len} bytes, the limit is {MAX_HANDSHAKE}"),
        ));
    }
    let mut buf = vec![0u8; len];
    sock.read_exact(&mut buf)
        .map_err(|e| Error::io(format!("reading a {what}"), e))?;
    Ok(buf)
}

fn dial(
    me: &Endpoint,
    remote: &Endpoint,
    deadline: Instant,
    timeout: Duration,
) -> Result<TcpStream> {
    let peer = remote.rank;
    let timed_out = || Error::Timeout {
        waiting_for: format!(
            "rank {} to connect to rank {peer}'s {} endpoint at {}",
            me.rank, remote.transport, remote.addr
        ),
        after: timeout,
    };
    let mut last_err = None;
    let mut sock = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(match last_err {
                Some(e) => Error::Remote {
                    rank: peer,
                    message: format!(
                        "rank {} could not connect to its {} endpoint at {}: {e}",
                        me.rank, remote.transport, remote.addr
                    ),
                },
                None => timed_out(),
            });
        }
        match TcpStream::connect_timeout(&remote.addr, left) {
            Ok(s) => break s,
            Err(e) => {
                last_err = Some(e);
                std::thread::sleep(Duration::from_millis(10).min(left));
            }
        }
    };
    let left = deadline.saturating_duration_since(Instant::now());
    sock.set_read_timeout(Some(left.max(Duration::from_millis(1))))
        .map_err(|e| Error::io("setting a handshake timeout", e))?;
    send_msg(
        &mut sock,
        &hello(remote.transport, me.rank, peer, &remote.nonce),
    )
    .map_err(|e| Error::Remote {
        rank: peer,
        message: format!("sending the hello to {}: {e}", remote.addr),
    })?;
    let r = recv_msg(&mut sock, "connection reply").map_err(|e| Error::Remote {
        rank: peer,
        message: format!("no reply to rank {}'s hello: {e}", me.rank),
    })?;
    let mut rd = Reader::open("connection reply", &r, REPLY_MAGIC, VERSION, VERSION)?;
    let ok = rd.u8()?;
    let reason = rd.str("reason", MAX_REASON)?.to_owned();
    rd.finish()?;
    if ok != 1 {
        return Err(Error::Remote {
            rank: peer,
            message: format!("refused rank {}'s connection: {reason}", me.rank),
        });
    }
    Ok(sock)
}

fn accept(local: &LocalEndpoint, remote: &Endpoint, deadline: Instant) -> Result<TcpStream> {
    let me = &local.endpoint;
    // std's listener has no accept timeout: poll a non-blocking one (setup only, not a hot path).
    local
        .listener
        .set_nonblocking(true)
        .map_err(|e| Error::io("making a listener non-blocking", e))?;
    loop {
        match local.listener.accept() {
            Ok((mut sock, from)) => {
                let checked = sock
                    .set_nonblocking(false)
                    .and_then(|_| sock.set_read_timeout(Some(HELLO_WAIT)))
                    .map_err(|e| Error::io("configuring an accepted socket", e))
                    .and_then(|_| recv_msg(&mut sock, "connection hello"))
                    .and_then(|h| check_hello(&h, me, remote));
                match checked {
                    Ok(()) => {
                        send_msg(&mut sock, &reply(None)).map_err(|e| Error::Remote {
                            rank: remote.rank,
                            message: format!("answering its hello: {e}"),
                        })?;
                        return Ok(sock);
                    }
                    Err(e) => {
                        // A stray or stale connector: tell it why, keep waiting for the peer.
                        tracing::debug!(%from, rank = me.rank, "refused a connection: {e}");
                        let _ = send_msg(&mut sock, &reply(Some(&e.to_string())));
                        let _ = sock.shutdown(Shutdown::Both);
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Timeout {
                        waiting_for: format!(
                            "rank {} to connect to rank {}'s {} endpoint at {}",
                            remote.rank, me.rank, me.transport, me.addr
                        ),
                        after: local.cfg.connect_timeout,
                    });
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(Error::io(format!("accepting on {}", me.addr), e)),
        }
    }
}

fn check_hello(h: &[u8], me: &Endpoint, remote: &Endpoint) -> Result<()> {
    let mut r = Reader::open("connection hello", h, HELLO_MAGIC, VERSION, VERSION)?;
    let code = r.u8()?;
    let from = r.u32()? as usize;
    let to = r.u32()? as usize;
    let nonce = r.array::<16>()?;
    r.finish()?;
    if Transport::from_code(code) != Some(me.transport) {
        return Err(Error::invalid(format!(
            "hello for transport code {code}; this endpoint of rank {} is {}",
            me.rank, me.transport
        )));
    }
    if from != remote.rank || to != me.rank {
        return Err(Error::invalid(format!(
            "hello from rank {from} to rank {to}; this endpoint expects rank {} to rank {}",
            remote.rank, me.rank
        )));
    }
    if nonce != me.nonce {
        return Err(Error::invalid(format!(
            "hello from rank {from} presents the nonce of another endpoint of rank {}",
            me.rank
        )));
    }
    Ok(())
}

/// The health of one connection, shared by the caller and the connection's threads.
#[derive(Debug)]
pub(crate) struct Health {
    peer: usize,
    state: Mutex<HealthState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
pub(crate) struct HealthState {
    /// Why the connection is dead; every later operation returns it.
    pub dead: Option<String>,
    /// Highest flush sequence the peer has acknowledged.
    pub acked: u64,
    /// Bytes queued for sending and not yet written to the socket.
    pub in_flight: usize,
}

impl Health {
    pub(crate) fn new(peer: usize) -> Self {
        Health {
            peer,
            state: Mutex::new(HealthState::default()),
            changed: Condvar::new(),
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, HealthState> {
        // Only plain field updates happen under the lock: a poisoned state is still consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The error every operation returns once the connection is dead.
    pub(crate) fn error(&self, why: &str) -> Error {
        Error::Remote {
            rank: self.peer,
            message: why.to_owned(),
        }
    }

    /// `Err` if the connection is dead.
    pub(crate) fn check(&self) -> Result<()> {
        match &self.lock().dead {
            Some(why) => Err(self.error(why)),
            None => Ok(()),
        }
    }

    /// Marks the connection dead (the first reason wins) and wakes every waiter.
    pub(crate) fn mark_dead(&self, why: String) {
        let mut s = self.lock();
        if s.dead.is_none() {
            tracing::debug!(peer = self.peer, "connection dead: {why}");
            s.dead = Some(why);
        }
        drop(s);
        self.changed.notify_all();
    }

    /// Updates the state and wakes the waiters.
    pub(crate) fn update(&self, f: impl FnOnce(&mut HealthState)) {
        f(&mut self.lock());
        self.changed.notify_all();
    }

    /// Waits until `ready` holds or the connection is dead, at most until `deadline`;
    /// `None` on timeout.
    pub(crate) fn wait_until(
        &self,
        deadline: Instant,
        mut ready: impl FnMut(&mut HealthState) -> bool,
    ) -> Option<Result<()>> {
        let mut s = self.lock();
        loop {
            if let Some(why) = &s.dead {
                return Some(Err(self.error(why)));
            }
            if ready(&mut s) {
                return Some(Ok(()));
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            s = self
                .changed
                .wait_timeout(s, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The thread that watches a connection's link after its handshake: nothing is sent on it any
/// more, so any byte, EOF or error means the peer is gone, and `health` is marked dead. Owns
/// the link; dropping it shuts the socket (which ends the read, and tells the peer this side is
/// gone) and joins the thread.
#[derive(Debug)]
pub(crate) struct Watcher {
    sock: TcpStream,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watcher {
    /// Starts watching `sock`, the link of rank `me`'s connection to `peer` over `transport`.
    pub(crate) fn start(
        sock: TcpStream,
        transport: Transport,
        (me, peer): (usize, usize),
        health: std::sync::Arc<Health>,
    ) -> Result<Watcher> {
        let mut rd = sock
            .try_clone()
            .map_err(|e| Error::io(format!("cloning a {transport} link's socket"), e))?;
        let thread = std::thread::Builder::new()
            .name(format!("mscclpp-{transport}-watch-{me}-{peer}"))
            .spawn(move || {
                let mut b = [0u8; 64];
                let why = match rd.read(&mut b) {
                    Ok(0) => describe_end(peer, me, None),
                    Ok(n) => format!("rank {peer} sent {n} unexpected bytes on a {transport} link"),
                    Err(e) => describe_end(peer, me, Some(e)),
                };
                health.mark_dead(why);
            });
        match thread {
            Ok(t) => Ok(Watcher {
                sock,
                thread: Some(t),
            }),
            Err(e) => {
                let _ = sock.shutdown(Shutdown::Both);
                Err(Error::io(format!("spawning a {transport} link watcher"), e))
            }
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        let _ = self.sock.shutdown(Shutdown::Both);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Describes how a link ended, for the dead-connection error.
pub(crate) fn describe_end(peer: usize, local: usize, e: Option<std::io::Error>) -> String {
    match e {
        None => format!(
            "rank {peer} closed its connection to rank {local} (it exited, crashed or dropped the connection)"
        ),
        Some(e) => format!("the connection from rank {local} to rank {peer} failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("héllo", 2), "h");
        assert_eq!(truncate("abc", 10), "abc");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_hellos_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..64)) {
            let ep = Endpoint {
                transport: Transport::Ethernet,
                rank: 1,
                host_id: "h".into(),
                device: 0,
                addr: "127.0.0.1:9".parse().unwrap(),
                nonce: [3; 16],
                ib: None,
            };
            let _ = check_hello(&buf, &ep, &ep);
        }
    }
}
