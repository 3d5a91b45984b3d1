//! What arrives from the event loop, filed into a rank's state: the loop (`reactor`) is the
//! lower layer and knows a rank only as an [`Endpoint`]; this is that trait for the state
//! ([`Shared`]). A peer's checked Hello is kept or refused here (the crossing rule), a message
//! is filed under `(view, peer, tag)`, a Lost report recorded and forwarded, a survey answered,
//! and a connection that ended marks its peer dead.
//!
//! Lock order, the loop's (see `reactor`): a connection's `rx` (held by the loop around
//! [`Endpoint::frame`] and [`Endpoint::ended`]), then `forwarding` (taken by
//! [`Shared::peer_failed`]), then `state`, then a connection's `tx` (an Ack, a survey's
//! answer, forwarded news). [`Endpoint::admit`] is called with none of them held. Failure
//! handlers go to `deferred`: the loop runs them once it holds no lock.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use super::failure::Deferred;
use super::hello;
use super::progress;
use super::protocol::{self, CROSSED, ErrorCode, FrameKind, SECRET_BYTES};
use super::reactor::Reactor;
use super::reactor::conn::{Conn, frame};
use super::reactor::endpoint::Endpoint;
use super::state::{Link, Shared};

impl Endpoint for Shared {
    fn listener(&self) -> &TcpListener {
        &self.listener
    }

    fn listen_token(&self) -> u64 {
        self.listen_token
    }

    fn rank(&self) -> usize {
        self.rank
    }

    fn nranks(&self) -> usize {
        self.nranks
    }

    fn secret(&self) -> &[u8; SECRET_BYTES] {
        &self.secret
    }

    fn closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    fn handshakes(&self) -> &AtomicUsize {
        &self.handshakes
    }

    fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// Acknowledges a dialling peer and adds the connection, or refuses it. Of two ranks
    /// dialling each other at once, the lower rank's connection is kept: a higher rank's dial
    /// is refused as Crossed while this rank has its own connection with it open or opening.
    fn admit(
        self: Arc<Self>,
        r: &Reactor,
        peer: usize,
        from: SocketAddr,
        token: u64,
        stream: TcpStream,
        in_set: bool,
    ) {
        // A connection not kept leaves the loop's set before it is closed.
        let unset = |s: &TcpStream| {
            if in_set {
                r.unset(s);
            }
        };
        let mut st = self.lock();
        if self.closing.load(Ordering::Acquire) {
            drop(st);
            unset(&stream);
            return;
        }
        let verdict = match st.links.get(&peer) {
            None if st.dead.contains_key(&peer) => {
                Err(format!("rank {peer}'s connection already ended"))
            }
            None => Ok(()),
            Some(Link::Dialling) if peer < self.rank => Ok(()),
            Some(_) if peer > self.rank => Err(CROSSED.to_string()),
            Some(_) => Err(format!("rank {peer} is already connected (duplicate rank)")),
        };
        if let Err(why) = verdict {
            drop(st);
            unset(&stream);
            let who = format!("rank {}", self.rank);
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
        let c = match Conn::new(peer, from, token, stream, self.max_payload()) {
            Ok(c) => c,
            Err(e) => {
                drop(st);
                tracing::warn!(%from, error = %e, "bootstrap connection dropped");
                return;
            }
        };
        // The Ack goes first: the connection is published (and so written by others) only
        // once it is queued.
        if let Err(e) = c.send_nowait(r, frame(FrameKind::Ack, 0, &[])) {
            drop(st);
            if in_set {
                r.unset_conn(&c);
            }
            self.mark_dead(peer, format!("acknowledging its hello failed: {e}"));
            return;
        }
        st.links.insert(peer, Link::Up(Arc::clone(&c)));
        st.conns.insert(token, Arc::clone(&c));
        st.opened += 1;
        self.notify(st);
        if let Err(e) = r.add_conn(&c, &self, in_set) {
            tracing::warn!(peer, error = %e, "bootstrap connection dropped");
            c.shutdown();
            self.mark_dead(peer, e.to_string());
            return;
        }
        tracing::debug!(peer, "bootstrap connection up (accepted)");
    }

    /// Files a frame: a message under `(view, peer, tag)`, a Lost report as a failure (the
    /// news forwarded), a survey answered at once, a survey's answer for the survey that
    /// waits for it. The payload moves into the queue as it came (no copy).
    fn frame(
        &self,
        c: &Conn,
        r: &Reactor,
        kind: FrameKind,
        tag: u64,
        payload: Vec<u8>,
        deferred: &mut Vec<Deferred>,
    ) -> Result<(), String> {
        let peer = c.peer;
        match kind {
            FrameKind::Data => {
                let (comm, msg) = protocol::decode_data(payload).map_err(|e| e.to_string())?;
                let mut st = self.lock();
                st.queues
                    .entry((comm, peer, tag))
                    .or_default()
                    .push_back(msg);
                self.notify(st);
            }
            FrameKind::Lost => {
                let (k, msg) =
                    protocol::decode_lost(&payload, self.nranks).map_err(|e| e.to_string())?;
                // Forwarded first: a wait woken by the report may end this rank before the
                // news went on.
                deferred.extend(self.peer_failed(k, format!("reported by rank {peer}: {msg}")));
                let mut st = self.lock();
                st.reported
                    .entry(peer)
                    .or_insert((k, format!("{msg} (reported by rank {peer})")));
                self.notify_failure(st);
            }
            FrameKind::Status => {
                // Answered here, by whichever thread reads this connection: the program of
                // this rank need not take part (see `progress`). The payload names the view.
                let Some(view) = progress::decode_view(&payload) else {
                    return Err(format!("a survey of {} bytes (8 expected)", payload.len()));
                };
                let answer = progress::encode(&self.progress.now(view));
                if let Err(why) = c.send_nowait(r, frame(FrameKind::StatusReply, tag, &answer)) {
                    tracing::debug!(peer, %why, "could not answer a survey");
                }
            }
            FrameKind::StatusReply => {
                let mut st = self.lock();
                if !st.open_surveys.contains(&tag) {
                    // Late, or never asked for: nobody will take it.
                    return Ok(());
                }
                st.queues
                    .entry((progress::SURVEY_COMM, peer, tag))
                    .or_default()
                    .push_back(payload);
                self.notify(st);
            }
            kind => return Err(format!("unexpected {kind:?} frame after setup")),
        }
        Ok(())
    }

    fn ended(&self, c: &Conn, reason: String, graceful: bool, deferred: &mut Vec<Deferred>) {
        self.lock().conns.remove(&c.token);
        if !self.closing.load(Ordering::Acquire) {
            tracing::debug!(peer = c.peer, %reason, "bootstrap connection ended");
        }
        if !graceful {
            deferred.extend(
                self.peer_failed(c.peer, format!("its bootstrap connection closed: {reason}")),
            );
        }
        self.mark_dead(c.peer, reason);
    }
}
