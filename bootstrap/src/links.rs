//! Connections between ranks, opened on first use: [`Bootstrap::link`] gives the open
//! connection to a peer or dials it (a Hello, answered by an Ack; of two ranks dialling each
//! other at once the lower rank's connection is kept, see `reactor::handshake`). The
//! accepting side lives in the event loop.

use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::failure::lost;
use super::protocol::{CROSSED, FrameKind, Hello, HelloRole, encode_hello, write_frame};
use super::reactor::conn::Conn;
use super::rendezvous::{read_reply, root_turned_us_away};
use super::state::{Link, LinkStats, Shared};

impl Bootstrap {
    /// How many connections this rank's bootstrap holds (shared by all its split views).
    pub fn link_stats(&self) -> LinkStats {
        let st = self.shared().lock();
        LinkStats {
            open: st
                .links
                .values()
                .filter(|l| matches!(l, Link::Up(_)))
                .count(),
            opened: st.opened,
        }
    }

    /// The open connection to bootstrap rank `peer`, dialling it if there is none.
    pub(super) fn link(&self, peer: usize, deadline: Instant) -> Result<Arc<Conn>> {
        let sh = self.shared();
        let mut st = sh.lock();
        loop {
            if let Some(reason) = st.dead.get(&peer) {
                return Err(lost(peer, reason));
            }
            match st.links.get(&peer) {
                Some(Link::Up(w)) => return Ok(Arc::clone(w)),
                Some(Link::Dialling) => {
                    let (g, more) = sh.wait(st, deadline);
                    st = g;
                    if !more {
                        return Err(Error::Timeout {
                            waiting_for: format!("a connection with rank {peer}"),
                            after: self.cfg.timeout,
                        });
                    }
                }
                None => break,
            }
        }
        st.links.insert(peer, Link::Dialling);
        drop(st);
        let dialled = dial(sh, peer, deadline);
        let mut st = sh.lock();
        match dialled {
            Ok(Some(stream)) => {
                if let Some(Link::Up(w)) = st.links.get(&peer) {
                    // Cannot happen under the crossing rule; keep the registered one.
                    return Ok(Arc::clone(w));
                }
                let conn = sh.reactor.as_ref().ok_or_else(|| {
                    Error::Internal("a bootstrap of one rank dialled a peer".into())
                });
                let conn = conn.and_then(|r| {
                    Conn::new(peer, sh.table[peer], r.token(), stream, sh.max_payload())
                        .map(|c| (r, c))
                });
                let (r, w) = match conn {
                    Ok(x) => x,
                    Err(e) => {
                        st.links.remove(&peer);
                        sh.notify(st);
                        return Err(e);
                    }
                };
                st.links.insert(peer, Link::Up(Arc::clone(&w)));
                st.conns.insert(w.token, Arc::clone(&w));
                st.opened += 1;
                sh.notify(st);
                if let Err(e) = r.add_conn(&w, sh, false) {
                    w.shutdown();
                    sh.mark_dead(peer, e.to_string());
                    return Err(e);
                }
                tracing::debug!(peer, "bootstrap connection up (dialled)");
                Ok(w)
            }
            Ok(None) => {
                // Crossed: the peer's own dial is (or will be) accepted here.
                loop {
                    if let Some(Link::Up(w)) = st.links.get(&peer) {
                        return Ok(Arc::clone(w));
                    }
                    if let Some(reason) = st.dead.get(&peer) {
                        return Err(lost(peer, reason));
                    }
                    let (g, more) = sh.wait(st, deadline);
                    st = g;
                    if !more {
                        return Err(Error::Timeout {
                            waiting_for: format!(
                                "rank {peer}'s connection (both ranks dialled at once)"
                            ),
                            after: self.cfg.timeout,
                        });
                    }
                }
            }
            Err(e) => {
                match st.links.get(&peer) {
                    // The peer's own dial was accepted meanwhile.
                    Some(Link::Up(w)) => return Ok(Arc::clone(w)),
                    Some(Link::Dialling) => {
                        st.links.remove(&peer);
                    }
                    None => {}
                }
                sh.notify(st);
                Err(e)
            }
        }
    }
}

/// Dials bootstrap rank `peer`: `Ok(Some)` once it acknowledged, `Ok(None)` when it refused
/// because it is dialling us at the same time (its connection wins, see `Reactor::finish_handshake`).
fn dial(sh: &Shared, peer: usize, deadline: Instant) -> Result<Option<TcpStream>> {
    dial_attempt(sh, peer, deadline, DIAL_RETRIES)
}

/// Dials again after a connection the peer's listener closed without an answer: a listener
/// that still accepts is alive (a dead rank's refuses at once, which is final), and CI saw one
/// such close of a healthy peer under load (`garbage_to_a_rank_listener_is_refused`) turn into
/// a rank reported dead.
const DIAL_RETRIES: u32 = 3;

fn dial_attempt(
    sh: &Shared,
    peer: usize,
    deadline: Instant,
    retries: u32,
) -> Result<Option<TcpStream>> {
    let addr = sh.table[peer];
    let mut s = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                waiting_for: format!("connecting to rank {peer} at {addr}"),
                after: sh.cfg.timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
            Ok(s) => break s,
            // Every rank listens before it joins the root, so after the rendezvous a refusal
            // means the peer is gone.
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                let reason = format!("its listener at {addr} refused the connection ({e})");
                sh.mark_dead(peer, reason.clone());
                return Err(lost(peer, &reason));
            }
            Err(e) => {
                tracing::trace!(%addr, error = %e, "bootstrap dial failed; retrying");
                std::thread::sleep(Duration::from_millis(20).min(left));
            }
        }
    };
    let hello = Hello {
        role: HelloRole::Peer,
        secret: sh.secret,
        rank: sh.rank,
        nranks: sh.nranks,
        listen: sh.listen,
    };
    if let Err(e) = write_frame(&mut s, FrameKind::Hello, 0, &encode_hello(&hello)) {
        let reason = format!("sending the hello to {addr}: {e}");
        sh.mark_dead(peer, reason.clone());
        return Err(lost(peer, &reason));
    }
    let reply = read_reply(
        &mut s,
        deadline,
        sh.cfg.timeout,
        0,
        &format!("rank {peer}'s acknowledgement"),
    );
    match reply {
        Ok((FrameKind::Ack, _)) => Ok(Some(s)),
        Ok((kind, _)) => Err(Error::malformed(
            "bootstrap handshake",
            format!("rank {peer} answered the hello with a {kind:?} frame"),
        )),
        Err(Error::Remote { message, .. }) if message.contains(CROSSED) => Ok(None),
        // The connection ended without an answer: the peer is gone (or going) — unless its
        // listener takes a new connection, or its own dial reached us meanwhile.
        Err(e) if root_turned_us_away(&e) && retries > 0 && Instant::now() < deadline => {
            if matches!(sh.lock().links.get(&peer), Some(Link::Up(_))) {
                return Ok(None);
            }
            tracing::debug!(peer, error = %e, "bootstrap hello closed without an answer; dialling again");
            std::thread::sleep(Duration::from_millis(20));
            dial_attempt(sh, peer, deadline, retries - 1)
        }
        Err(e) if root_turned_us_away(&e) => {
            let reason = format!("no acknowledgement: {e}");
            sh.mark_dead(peer, reason.clone());
            Err(lost(peer, &reason))
        }
        Err(Error::Remote { message, .. }) => Err(Error::Remote {
            rank: peer,
            message,
        }),
        Err(e) => Err(e),
    }
}
