//! The accepting side of a connection between ranks: a connection accepted by a rank's
//! listener is a handshake until its Hello has arrived (bounded by `hello::HELLO_LIMIT` and the
//! bootstrap deadline, at most `hello::MAX_PENDING_HELLOS` at once); the Hello is then checked
//! as the root checks it (secret, role, size, rank), and either refused with a report here or
//! handed to the rank ([`Endpoint::admit`]), which acknowledges it and adds it to the loop as a
//! `Conn`, or refuses it (a crossed or duplicate dial, see `inbound`). The dialling side is
//! `links`.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mscclpp_base::{Error, Result};
use rustix::event::epoll;

use super::super::hello::{self, Pending};
use super::super::protocol::{self, ErrorCode, HelloRole};
use super::endpoint::Endpoint;
use super::{Handshake, Reactor};

impl Reactor {
    pub(super) fn accepted(
        &self,
        ep: &Arc<dyn Endpoint>,
        stream: TcpStream,
        from: SocketAddr,
        hs: &mut HashMap<u64, Handshake>,
    ) {
        if ep.closing() {
            return;
        }
        if ep.handshakes().load(Ordering::Acquire) >= hello::MAX_PENDING_HELLOS {
            tracing::debug!(%from, rank = ep.rank(), "bootstrap connection closed at once: too many handshakes in progress");
            return;
        }
        if let Err(e) = stream.set_nonblocking(true) {
            tracing::debug!(%from, error = %e, "bootstrap connection dropped");
            return;
        }
        let limit = hello::HELLO_LIMIT.min(ep.timeout());
        let mut p = Pending::new(stream, from, limit);
        let token = self.token();
        match p.poll() {
            Some(result) => self.finish_handshake(Arc::clone(ep), token, p, result, false),
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
                ep.handshakes().fetch_add(1, Ordering::AcqRel);
                hs.insert(
                    token,
                    Handshake {
                        pending: p,
                        ep: Arc::downgrade(ep),
                    },
                );
            }
        }
    }

    /// Checks a dialling peer's Hello, then either refuses it or hands it to the rank, which
    /// keeps the connection or refuses it in turn ([`Endpoint::admit`]).
    pub(super) fn finish_handshake(
        &self,
        ep: Arc<dyn Endpoint>,
        token: u64,
        p: Pending,
        hello: Result<protocol::Hello>,
        in_set: bool,
    ) {
        let from = p.from;
        let stream = p.stream;
        let (rank, nranks) = (ep.rank(), ep.nranks());
        let hello = hello.and_then(|h| {
            let refuse = |why: String| Err(Error::invalid(why));
            if !protocol::secrets_equal(&h.secret, ep.secret()) {
                return refuse("wrong secret: the peer belongs to a different bootstrap".into());
            }
            if h.role != HelloRole::Peer {
                return refuse(format!("a {:?} hello sent to a Peer listener", h.role));
            }
            if h.nranks != nranks {
                return refuse(format!(
                    "rank {} says nranks = {}, this bootstrap has {}",
                    h.rank, h.nranks, nranks
                ));
            }
            if h.rank >= nranks || h.rank == rank {
                return refuse(format!(
                    "rank {} is not expected here (a peer of rank {} of {})",
                    h.rank, rank, nranks
                ));
            }
            Ok(h)
        });
        let h = match hello {
            Ok(h) => h,
            Err(e) => {
                let who = format!("rank {rank}");
                tracing::warn!(%from, who = %who, error = %e, "bootstrap connection refused");
                let code = if matches!(e, Error::Timeout { .. }) {
                    ErrorCode::Timeout
                } else {
                    ErrorCode::Refused
                };
                if in_set {
                    self.unset(&stream);
                }
                hello::refuse(stream, code, &format!("refused by {who}: {e}"));
                return;
            }
        };
        Endpoint::admit(ep, self, h.rank, from, token, stream, in_set);
    }
}
