//! Point-to-point messages: [`Bootstrap::send`] and [`Bootstrap::recv`] under user tags, and
//! the two primitives every collective is built from, `send_raw` (any tag, to a rank of the
//! view) and `wait_all` (one message from each of several peers, failing at once when one of
//! them is lost). Also the checks of ranks and tags, and the translation of errors into the
//! view's numbering.

use std::sync::Arc;
use std::time::Instant;

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::config::name_timeout_var;
use super::failure::lost;
use super::protocol::RESERVED_TAG_BIT;
use super::reactor::conn::{Conn, SendError, data_frame};
use super::reactor::waiter::Waiter;
use super::state::Link;

impl Bootstrap {
    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed to the kernel
    /// (the connection to `peer` is opened first if this is the first message between them).
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        check_user_tag(tag)?;
        self.send_raw(peer, tag, data)
    }

    /// Receives the oldest message from `peer` under `tag`, waiting up to the deadline.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        check_user_tag(tag)?;
        self.check_peer(peer)?;
        let mut got = self
            .wait_all(&[peer], tag, "recv")
            .map_err(name_timeout_var)?;
        got.pop()
            .ok_or_else(|| Error::Internal("recv: wait returned no message".into()))
    }

    pub(super) fn recv_one(&self, peer: usize, tag: u64, op: &str) -> Result<Vec<u8>> {
        let mut got = self.wait_all(&[peer], tag, op)?;
        got.pop()
            .ok_or_else(|| Error::Internal(format!("{op}: wait returned no message")))
    }

    pub(super) fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::invalid(format!(
                "rank {peer} is out of range: this bootstrap has {} ranks",
                self.nranks
            )));
        }
        Ok(())
    }

    /// The view rank of bootstrap rank `r`, for errors (the bootstrap rank if not a member).
    pub(super) fn view_rank(&self, r: usize) -> usize {
        if self.comm_id == 0 {
            return r;
        }
        self.members.iter().position(|&m| m == r).unwrap_or(r)
    }

    pub(super) fn translate(&self, e: Error) -> Error {
        match e {
            Error::Remote { rank, message } if rank != usize::MAX => Error::Remote {
                rank: self.view_rank(rank),
                message,
            },
            other => name_timeout_var(other),
        }
    }

    pub(super) fn send_raw(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        if data.len() > self.cfg.max_frame_bytes {
            return Err(Error::invalid(format!(
                "bootstrap message of {} bytes exceeds max_frame_bytes = {}",
                data.len(),
                self.cfg.max_frame_bytes
            )));
        }
        tracing::trace!(
            rank = self.rank,
            peer,
            tag,
            bytes = data.len(),
            "bootstrap send"
        );
        let sh = self.shared();
        let target = self.members[peer];
        if target == sh.rank {
            // To ourselves: straight into the queue.
            let mut st = sh.lock();
            st.queues
                .entry((self.comm_id, target, tag))
                .or_default()
                .push_back(data.to_vec());
            sh.notify(st);
            return Ok(());
        }
        let deadline = Instant::now() + self.cfg.timeout;
        let writer = self.link(target, deadline).map_err(|e| self.translate(e))?;
        let r = sh
            .reactor
            .as_ref()
            .ok_or_else(|| Error::Internal("a bootstrap of one rank sent to a peer".into()))?;
        let frame = data_frame(self.comm_id, tag, data);
        match writer.send(r, frame, deadline, self.cfg.timeout) {
            Ok(()) => Ok(()),
            Err(e) => {
                // A partly written frame leaves the stream unusable either way.
                writer.shutdown();
                match e {
                    SendError::Stalled => {
                        sh.mark_dead(
                            target,
                            format!("a send timed out after {:?}", self.cfg.timeout),
                        );
                        Err(Error::Timeout {
                            waiting_for: format!(
                                "rank {peer} to accept a {} byte message (tag {tag:#x})",
                                data.len()
                            ),
                            after: self.cfg.timeout,
                        })
                    }
                    SendError::Broken(why) => {
                        let reason = format!("send failed: {why}");
                        sh.mark_dead(target, reason.clone());
                        Err(lost(peer, &reason))
                    }
                }
            }
        }
    }

    /// Waits for one message under `tag` from each of `peers` (ranks of this view); returns
    /// them in that order. Opens the connections to them first, so that a peer that died is
    /// noticed. Fails as soon as a peer still owing a message is dead, or reported that it
    /// failed because another rank was lost, naming the rank that died first.
    ///
    /// Reads the connections of the peers it waits on itself when it can (see `reactor`): the
    /// message then wakes this thread alone. Else (another thread of the process polls, or a
    /// connection is not open yet) it waits for the event loop on the condition variable.
    pub(super) fn wait_all(&self, peers: &[usize], tag: u64, op: &str) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.cfg.timeout;
        let sh = self.shared();
        let targets: Vec<usize> = peers.iter().map(|&p| self.members[p]).collect();
        let mut got: Vec<Option<Vec<u8>>> = vec![None; peers.len()];
        let mut linked = vec![false; peers.len()];
        let mut waiter = Waiter::new(&**sh, sh.reactor.as_deref());
        // Set when taking the connections failed: wait on the condition variable this once.
        let mut no_poll = false;
        loop {
            let mut st = sh.lock();
            for (i, &p) in targets.iter().enumerate() {
                if got[i].is_none()
                    && let Some(q) = st.queues.get_mut(&(self.comm_id, p, tag))
                {
                    got[i] = q.pop_front();
                    if q.is_empty() {
                        st.queues.remove(&(self.comm_id, p, tag));
                    }
                }
            }
            let missing: Vec<usize> = targets
                .iter()
                .zip(&got)
                .filter(|(_, g)| g.is_none())
                .map(|(&p, _)| p)
                .collect();
            if missing.is_empty() {
                return Ok(got.into_iter().flatten().collect());
            }
            // Only peers still owing a message count: one that finished the collective and left
            // (a clean exit after the last barrier) is not an error. Among those, name the one
            // that died first, the cause when others only followed it.
            // A peer that reported another rank's loss before its connection ended (it failed
            // and left) is named by the rank it reported.
            if let Some(&p) = st.dead_order.iter().find(|p| missing.contains(p))
                && !st.reported.contains_key(&p)
            {
                let reason = st.dead.get(&p).cloned().unwrap_or_default();
                return Err(self.translate(lost(p, &format!("{reason} (during {op})"))));
            }
            // Only a loss of a member of this view: a view shrunk past a dead rank goes on
            // while its members still carry their reports of that rank.
            if let Some((k, why)) = missing
                .iter()
                .find_map(|p| st.reported.get(p).filter(|(k, _)| self.members.contains(k)))
            {
                return Err(self.translate(lost(*k, &format!("{why} (during {op})"))));
            }
            // A member of this view known dead (learned from any connection, not only those
            // of this operation) fails every operation still waiting: the peers it waits on
            // may be waiting, directly or not, on the dead rank.
            if let Some(f) = st.failures.iter().find(|f| self.members.contains(&f.rank)) {
                return Err(self.translate(lost(f.rank, &format!("{} (during {op})", f.how))));
            }
            // The first time round, make sure a connection with each missing peer exists (or
            // is being made by the other side): a peer that died before ever connecting is
            // then noticed when its listener refuses us.
            if let Some(i) = (0..peers.len()).find(|&i| got[i].is_none() && !linked[i]) {
                drop(st);
                linked[i] = true;
                // A peer found dead is reported above on the next pass; any other failure to
                // connect (a refusal, a timeout) is final.
                if targets[i] != sh.rank
                    && let Err(e) = self.link(targets[i], deadline)
                    && !sh.lock().dead.contains_key(&targets[i])
                {
                    return Err(self.translate(e));
                }
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = missing.iter().map(|&p| self.view_rank(p)).collect();
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "{op}: a message with tag {tag:#x} from rank(s) {missing:?}"
                    ),
                    after: self.cfg.timeout,
                });
            }
            let conns: Option<Vec<Arc<Conn>>> = if no_poll || missing.contains(&sh.rank) {
                None
            } else {
                missing
                    .iter()
                    .map(|p| match st.links.get(p) {
                        Some(Link::Up(c)) => Some(Arc::clone(c)),
                        _ => None,
                    })
                    .collect()
            };
            no_poll = false;
            if let Some(conns) = conns {
                drop(st);
                if waiter.owns_all(&conns) {
                    waiter.poll(deadline);
                } else if !waiter.take(&conns) {
                    no_poll = true;
                }
                // Looked at again before any wait: what the loop filed before this thread
                // took the connections is in the queues now.
                continue;
            }
            if waiter.holds() {
                // Given back before waiting (and without the state lock, which comes after a
                // connection's in the lock order), then looked at again.
                drop(st);
                waiter.release();
                continue;
            }
            drop(sh.wait(st, deadline));
        }
    }
}

fn check_user_tag(tag: u64) -> Result<()> {
    if tag & RESERVED_TAG_BIT != 0 {
        return Err(Error::invalid(format!(
            "tag {tag:#x} is in the reserved collective tag space (top bit set)"
        )));
    }
    Ok(())
}
