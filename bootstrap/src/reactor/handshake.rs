//! The accepting side of a connection between ranks: a connection accepted by a rank's
//! listener is a handshake until its Hello has arrived (bounded by `hello::HELLO_LIMIT` and the
//! bootstrap deadline, at most `hello::MAX_PENDING_HELLOS` at once); the Hello is then checked
//! as the root checks it, and the connection either acknowledged and added to the loop as a
//! [`Conn`], or refused with a report. The dialling side is `links`.

use std::collections::HashMap;
use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mscclpp_base::{Error, Result};
use rustix::event::epoll;

use super::super::hello::{self, Pending};
use super::super::protocol::{self, CROSSED, ErrorCode, FrameKind, HelloRole};
use super::super::state::{Link, Shared};
use super::conn::{Conn, frame};
use super::{Handshake, Reactor};

impl Reactor {
    pub(super) fn accepted(
        &self,
        sh: &Arc<Shared>,
        stream: TcpStream,
        from: SocketAddr,
        hs: &mut HashMap<u64, Handshake>,
    ) {
        if sh.closing.load(Ordering::Acquire) {
            return;
        }
        if sh.handshakes.load(Ordering::Acquire) >= hello::MAX_PENDING_HELLOS {
            tracing::debug!(%from, rank = sh.rank, "bootstrap connection closed at once: too many handshakes in progress");
            return;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!(%from, error = %e, "bootstrap connection dropped");
            return;
        }
        let limit = hello::HELLO_LIMIT.min(sh.cfg.timeout);
        let mut p = Pending::new(stream, from, limit);
        let token = self.token();
        match p.poll() {
            Some(result) => self.finish_handshake(sh, token, p, result, false),
            None => {
                if let Err(e) = epoll::add(
                    &self.ep,
                    &p.stream,
                    epoll::EventData::new_u64(token),
                    epoll::EventFlags::IN,
                ) {
                    tracing::debug!(%from, error = %e, "bootstrap connection dropped");
                    return;
                }
                sh.handshakes.fetch_add(1, Ordering::AcqRel);
                hs.insert(
                    token,
                    Handshake {
                        pending: p,
                        shared: Arc::downgrade(sh),
                    },
                );
            }
        }
    }

    /// Checks a dialling peer's Hello, then either acknowledges it and adds the connection, or
    /// refuses it. Of two ranks dialling each other at once, the lower rank's connection is
    /// kept: a higher rank's dial is refused as Crossed while this rank has its own connection
    /// with it open or opening.
    pub(super) fn finish_handshake(
        &self,
        sh: &Arc<Shared>,
        token: u64,
        p: Pending,
        hello: Result<protocol::Hello>,
        in_set: bool,
    ) {
        let who = format!("rank {}", sh.rank);
        let from = p.from;
        let stream = p.stream;
        let hello = hello.and_then(|h| {
            let refuse = |why: String| Err(Error::invalid(why));
            if !protocol::secrets_equal(&h.secret, &sh.secret) {
                return refuse("wrong secret: the peer belongs to a different bootstrap".into());
            }
            if h.role != HelloRole::Peer {
                return refuse(format!("a {:?} hello sent to a Peer listener", h.role));
            }
            if h.nranks != sh.nranks {
                return refuse(format!(
                    "rank {} says nranks = {}, this bootstrap has {}",
                    h.rank, h.nranks, sh.nranks
                ));
            }
            if h.rank >= sh.nranks || h.rank == sh.rank {
                return refuse(format!(
                    "rank {} is not expected here (a peer of rank {} of {})",
                    h.rank, sh.rank, sh.nranks
                ));
            }
            Ok(h)
        });
        let unset = |s: &TcpStream| {
            if in_set {
                let _ = epoll::delete(&self.ep, s);
            }
        };
        let h = match hello {
            Ok(h) => h,
            Err(e) => {
                tracing::warn!(%from, who = %who, error = %e, "bootstrap connection refused");
                let code = if matches!(e, Error::Timeout { .. }) {
                    ErrorCode::Timeout
                } else {
                    ErrorCode::Refused
                };
                unset(&stream);
                hello::refuse(stream, code, &format!("refused by {who}: {e}"));
                return;
            }
        };
        let peer = h.rank;
        let mut st = sh.lock();
        if sh.closing.load(Ordering::Acquire) {
            drop(st);
            unset(&stream);
            return;
        }
        let verdict = match st.links.get(&peer) {
            None if st.dead.contains_key(&peer) => {
                Err(format!("rank {peer}'s connection already ended"))
            }
            None => Ok(()),
            Some(Link::Dialling) if peer < sh.rank => Ok(()),
            Some(_) if peer > sh.rank => Err(CROSSED.to_string()),
            Some(_) => Err(format!("rank {peer} is already connected (duplicate rank)")),
        };
        if let Err(why) = verdict {
            drop(st);
            unset(&stream);
            if why == CROSSED {
                // Its whole Hello has been read, so closing right after the report sends no
                // reset; answered here rather than by the bounded refusal threads, which may
                // close without a report when busy, and the dialler must learn why. A report
                // of a hundred bytes fits the empty send buffer of a new connection.
                let payload =
                    protocol::encode_error(ErrorCode::Crossed, &format!("refused by {who}: {why}"));
                let _ = (&stream).write_all(&frame(FrameKind::Error, 0, &payload));
            } else {
                hello::refuse(
                    stream,
                    ErrorCode::Refused,
                    &format!("refused by {who}: {why}"),
                );
            }
            return;
        }
        let c = match Conn::new(peer, from, token, stream, sh.max_payload()) {
            Ok(c) => c,
            Err(e) => {
                drop(st);
                tracing::warn!(%from, error = %e, "bootstrap connection dropped");
                return;
            }
        };
        // The Ack goes first: the connection is published (and so written by others) only
        // once it is queued.
        if let Err(e) = c.send_nowait(self, frame(FrameKind::Ack, 0, &[])) {
            drop(st);
            unset(&c.stream);
            sh.mark_dead(peer, format!("acknowledging its hello failed: {e}"));
            return;
        }
        st.links.insert(peer, Link::Up(Arc::clone(&c)));
        st.conns.insert(token, Arc::clone(&c));
        st.opened += 1;
        sh.notify(st);
        if let Err(e) = self.add_conn(&c, sh, in_set) {
            tracing::warn!(peer, error = %e, "bootstrap connection dropped");
            c.shutdown();
            sh.mark_dead(peer, e.to_string());
            return;
        }
        tracing::debug!(peer, "bootstrap connection up (accepted)");
    }
}
