//! The barrier in shared memory among the ranks of a view that share a host (issue 20).
//!
//! A message barrier wakes each rank about twice (its arrival reaches a parent, the release
//! reaches it back), and with a thousand ranks on a few cores the wake-ups over loopback TCP,
//! not the depth of the tree, set the time. Ranks of one host instead meet in one small
//! shared-memory segment: an arrival counter and a generation word. The last rank to arrive
//! publishes the next generation and wakes every waiter with one futex call, so each rank
//! sleeps and wakes at most once per barrier and no byte goes through a socket. Between hosts
//! one rank per host (its *leader*, the lowest rank of the view there) runs the TCP barrier
//! (tree or ring, as the schedule says) over the leaders only, once its host's ranks arrived.
//!
//! # Set-up
//!
//! Lazily, in the view's first barrier (so that split and shrink stay free of messages, and a
//! view that never calls barrier pays nothing), collectively:
//! 1. every host's leader creates the segment: a file under `/dev/shm` (mode 0600, created
//!    exclusively, never followed through a link) whose name hashes the bootstrap's secret,
//!    its address table, the view's id and members and the host's identity — so network
//!    namespaces with their own `MSCCLPP_HOSTID` never meet in one file although `/dev/shm`
//!    is shared, and two jobs never share a name;
//! 2. an AND over the view (`and_all`): every leader created its segment and no rank opted
//!    out (`BootstrapConfig::shared_memory`, `MSCCLPP_BOOTSTRAP_SHM=0`);
//! 3. the other ranks open and map it (the owner, size and header are checked first);
//! 4. a second AND: every rank mapped it. The leader then unlinks the name (the last rank to
//!    map it already has), so nothing is left in `/dev/shm` once set-up is over, even if a rank
//!    crashes later.
//!
//! Either AND false (no `/dev/shm`, a file that exists, another container's `/dev/shm`, an
//! opt-out): the whole view keeps the TCP barrier, logged at debug. Each AND is itself a full
//! barrier, so the first call is complete when set-up ends. A view with at most one rank per
//! host skips all this without a message.
//!
//! # Failures and deadlines
//!
//! Waiters sleep on a futex with a short slice and, between slices, check the deadline and
//! what this process knows of dead ranks. A rank's death reaches the waiters at once: whoever
//! learns it in the process (the event loop, when the dead rank's connection closes, or a Lost
//! report) also writes the dead rank into the segment of every view it belongs to and wakes its
//! futex words ([`Shared::post_failure`]), so every local waiter fails naming it. A rank that
//! drops its view marks itself as gone, and waiters for it fail naming it. The words that
//! waiters sleep on carry flag bits for both events, so a post can never slip between a
//! waiter's check and its sleep. A deadline missed names the ranks of this host that did not
//! arrive, or the host's leader when the other hosts are late.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};
use rustix::thread::futex;

use super::Bootstrap;
use super::collectives::{tree_children, tree_parent};
use super::config::Schedule;
use super::failure::lost;
use super::state::Shared;
use segment::{FAILED, GEN_MASK, LEFT, Segment, SharedBarrier, ShmState, Word};

pub(super) mod segment;

/// Longest single futex sleep: between slices a waiter checks the deadline and this process's
/// knowledge of dead ranks (posts to the segment wake it before that).
const SLICE: Duration = Duration::from_millis(200);

fn timespec(d: Duration) -> futex::Timespec {
    futex::Timespec::try_from(d).unwrap_or(futex::Timespec {
        tv_sec: i64::MAX / 2,
        tv_nsec: 0,
    })
}

impl Shared {
    /// Writes `peer`'s death into the segment of every view of this process it belongs to,
    /// waking the ranks that wait there (those of other processes too).
    pub(super) fn post_failure(&self, peer: usize) {
        let mut segs = self.segments.lock().unwrap_or_else(|p| p.into_inner());
        segs.retain(|(w, _)| w.strong_count() > 0);
        for (w, members) in segs.iter() {
            if members.contains(&peer)
                && let Some(s) = w.upgrade()
            {
                s.post_failure(peer);
            }
        }
    }
}

/// Reads a one-byte AND message.
fn decode_flag(m: &[u8], from: usize) -> Result<bool> {
    match m {
        [0] => Ok(false),
        [1] => Ok(true),
        _ => Err(Error::malformed(
            "bootstrap barrier message",
            format!(
                "from rank {from}: {} bytes {:02x?}, expected one byte 0 or 1",
                m.len(),
                &m[..m.len().min(8)]
            ),
        )),
    }
}

impl Bootstrap {
    /// The barrier: in shared memory among the ranks of each host when the view could set it
    /// up, else the TCP schedule.
    pub(super) fn barrier_impl(&self, state: &mut ShmState, tag: u64) -> Result<()> {
        if matches!(state, ShmState::Untried) {
            let (next, done) = match self.shm_setup(tag) {
                Ok(x) => x,
                Err(e) => {
                    // The ranks may now disagree on how to meet; an error already tells the
                    // caller, and later barriers fail or time out rather than hang.
                    *state = ShmState::Off;
                    return Err(e);
                }
            };
            *state = next;
            if done {
                return Ok(());
            }
        }
        match state {
            ShmState::On(sb) => self.shm_barrier(sb, tag),
            _ => self.tcp_barrier(tag),
        }
    }

    /// Whether this view's barrier runs in shared memory (decided by its first barrier;
    /// `false` before that).
    pub fn barrier_in_shared_memory(&self) -> bool {
        matches!(
            *self.shm.lock().unwrap_or_else(|p| p.into_inner()),
            ShmState::On(_)
        )
    }

    /// The segment's path for this view on this host: a hash of what makes it unique (the
    /// bootstrap's secret and address table, the view, the host identity), unguessable
    /// without the secret.
    pub(super) fn segment_path(&self, locals: &[usize]) -> (PathBuf, u64) {
        use std::hash::{Hash, Hasher};
        let sh = self.shared();
        let mut h = std::collections::hash_map::DefaultHasher::new();
        sh.secret.hash(&mut h);
        sh.table.hash(&mut h);
        self.comm_id.hash(&mut h);
        self.members.hash(&mut h);
        sh.host_id.hash(&mut h);
        locals.hash(&mut h);
        let key = h.finish();
        (
            PathBuf::from(format!("/dev/shm/mscclpp-bs-{key:016x}")),
            key,
        )
    }

    /// Sets the shared-memory barrier up (see the module docs). Returns the state and whether
    /// messages were exchanged (each exchange is a full barrier).
    fn shm_setup(&self, tag: u64) -> Result<(ShmState, bool)> {
        let n = self.nranks;
        let mut seen = std::collections::HashSet::new();
        let leaders: Vec<usize> = (0..n).filter(|&r| seen.insert(self.hosts[r])).collect();
        if leaders.len() == n {
            return Ok((ShmState::Off, false));
        }
        let locals = self.host_peers();
        let alone = locals.len() < 2;
        let leader = locals.first() == Some(&self.rank);
        let me = locals.iter().position(|&r| r == self.rank).unwrap_or(0);
        let (path, key) = self.segment_path(&locals);
        let want = self.cfg.shared_memory;
        let created = if want && !alone && leader {
            match Segment::create(&path, key, locals.len()) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!(rank = self.rank, path = %path.display(), error = %e,
                        "bootstrap: cannot create the shared-memory barrier; the view keeps the TCP barrier");
                    None
                }
            }
        } else {
            None
        };
        let unlink = || {
            if !alone {
                let _ = rustix::fs::unlink(&path);
            }
        };
        let ok = want && (alone || !leader || created.is_some());
        let all = self.and_all(ok, tag).inspect_err(|_| unlink())?;
        if !all {
            drop(created);
            unlink();
            tracing::debug!(
                rank = self.rank,
                "bootstrap: a rank opted out of or could not set up the shared-memory barrier; \
                 the view keeps the TCP barrier"
            );
            return Ok((ShmState::Off, true));
        }
        let seg = if alone {
            None
        } else if leader {
            created
        } else {
            match Segment::open(&path, key, locals.len(), me) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::debug!(rank = self.rank, path = %path.display(), error = %e,
                        "bootstrap: cannot map this host's shared-memory barrier; the view keeps the TCP barrier");
                    None
                }
            }
        };
        let ok = alone || seg.is_some();
        let tag2 = self.next_coll_tag(2);
        let all = self.and_all(ok, tag2).inspect_err(|_| unlink())?;
        // Every rank of the host has mapped it or given up: the name has served.
        if leader {
            unlink();
        }
        if !all {
            tracing::debug!(
                rank = self.rank,
                "bootstrap: a rank could not map its host's shared-memory barrier; the view \
                 keeps the TCP barrier"
            );
            return Ok((ShmState::Off, true));
        }
        let seg = seg.map(Arc::new);
        if let Some(s) = &seg {
            let mut segs = self
                .shared()
                .segments
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            segs.retain(|(w, _)| w.strong_count() > 0);
            segs.push((Arc::downgrade(s), Arc::clone(&self.members)));
        }
        tracing::debug!(
            rank = self.rank,
            hosts = leaders.len(),
            local = locals.len(),
            "bootstrap: barrier in shared memory"
        );
        let lead = leaders.iter().position(|&r| r == self.rank);
        Ok((
            ShmState::On(SharedBarrier {
                seg,
                locals,
                leaders,
                lead,
                seq: 0,
            }),
            true,
        ))
    }

    /// AND of every rank's `flag`, known to all; a full barrier.
    fn and_all(&self, flag: bool, tag: u64) -> Result<bool> {
        let all: Vec<usize> = (0..self.nranks).collect();
        self.group_and(&all, self.rank, flag, tag)
    }

    /// AND of `flag` over `group` (view ranks, the same list on every member, this rank at
    /// `group[me]`): up and down the binomial tree of the group's indices, or round its ring
    /// (running AND forwarded `len - 1` times) under the ring schedule.
    fn group_and(&self, group: &[usize], me: usize, flag: bool, tag: u64) -> Result<bool> {
        const OP: &str = "barrier";
        let n = group.len();
        let mut all = flag;
        match self.cfg.schedule {
            Schedule::Log => {
                let children: Vec<usize> =
                    tree_children(me, n).into_iter().map(|c| group[c]).collect();
                if !children.is_empty() {
                    let got = self.wait_all(&children, tag, OP)?;
                    for (&c, m) in children.iter().zip(&got) {
                        all &= decode_flag(m, c)?;
                    }
                }
                if me != 0 {
                    let parent = group[tree_parent(me)];
                    self.send_raw(parent, tag, &[u8::from(all)])?;
                    all = decode_flag(&self.recv_one(parent, tag, OP)?, parent)?;
                }
                for c in children {
                    self.send_raw(c, tag, &[u8::from(all)])?;
                }
            }
            Schedule::Ring => {
                let next = group[(me + 1) % n];
                let prev = group[(me + n - 1) % n];
                for _ in 1..n {
                    self.send_raw(next, tag, &[u8::from(all)])?;
                    all &= decode_flag(&self.recv_one(prev, tag, OP)?, prev)?;
                }
            }
        }
        Ok(all)
    }

    /// The barrier between hosts: one rank per host, over TCP.
    fn leaders_barrier(&self, sb: &SharedBarrier, tag: u64) -> Result<()> {
        match sb.lead {
            Some(i) if sb.leaders.len() > 1 => {
                self.group_and(&sb.leaders, i, true, tag).map(|_| ())
            }
            _ => Ok(()),
        }
    }

    fn shm_barrier(&self, sb: &mut SharedBarrier, tag: u64) -> Result<()> {
        self.shm_known_failure(sb)?;
        let Some(seg) = sb.seg.clone() else {
            return self.leaders_barrier(sb, tag);
        };
        let deadline = Instant::now() + self.cfg.timeout;
        let cur = sb.seq;
        let g = seg.word(Word::Gen).load(Ordering::Acquire) & GEN_MASK;
        if g != cur {
            // This rank gave up waiting for the previous release (a timeout); it must come
            // before this barrier's arrivals are counted.
            if g != cur.wrapping_sub(1) & GEN_MASK {
                return Err(Error::Internal(format!(
                    "shared-memory barrier out of step: generation {g}, rank {} expected {cur}",
                    self.rank
                )));
            }
            self.shm_wait(sb, &seg, Word::Gen, cur, cur, deadline)?;
        }
        let target = cur.wrapping_add(1) & GEN_MASK;
        seg.slot(seg.me).store(target, Ordering::Release);
        let n = seg.arrive().fetch_add(1, Ordering::AcqRel) + 1;
        sb.seq = target;
        let last = n as usize == seg.nlocal;
        if sb.leaders.len() == 1 {
            if last {
                // Reset before the release: the next barrier's arrivals follow it.
                seg.arrive().store(0, Ordering::Relaxed);
                seg.release(Word::Gen, target);
                return Ok(());
            }
            return self.shm_wait(sb, &seg, Word::Gen, target, target, deadline);
        }
        if sb.lead.is_some() {
            if !last {
                self.shm_wait(sb, &seg, Word::Ready, target, target, deadline)?;
            }
            seg.arrive().store(0, Ordering::Relaxed);
            if let Err(e) = self.leaders_barrier(sb, tag) {
                // The host's other ranks wait for this one: they fail naming the same rank.
                if let Error::Remote { rank, .. } = &e
                    && *rank < self.nranks
                {
                    seg.post_failure(self.members[*rank]);
                }
                return Err(e);
            }
            seg.release(Word::Gen, target);
            return Ok(());
        }
        if last {
            seg.release(Word::Ready, target);
        }
        self.shm_wait(sb, &seg, Word::Gen, target, target, deadline)
    }

    /// A dead member of this view, as this process or the segment knows it.
    fn shm_known_failure(&self, sb: &SharedBarrier) -> Result<()> {
        let posted = sb
            .seg
            .as_ref()
            .map(|s| s.failed().load(Ordering::Acquire))
            .unwrap_or(0);
        let st = self.shared().lock();
        if let Some(f) = st.failures.iter().find(|f| self.members.contains(&f.rank)) {
            return Err(self.translate(lost(f.rank, &format!("{} (during barrier)", f.how))));
        }
        drop(st);
        if posted != 0 {
            let k = posted as usize - 1;
            return Err(self.translate(lost(
                k,
                "found dead by another rank of this host (during barrier)",
            )));
        }
        Ok(())
    }

    /// Sleeps on `w` until its generation is `want`, failing at once when a member of the view
    /// is known dead or a local rank that has not arrived at `arrival` left, and at the deadline.
    fn shm_wait(
        &self,
        sb: &SharedBarrier,
        seg: &Segment,
        w: Word,
        want: u32,
        arrival: u32,
        deadline: Instant,
    ) -> Result<()> {
        let word = seg.word(w);
        loop {
            let v = word.load(Ordering::Acquire);
            if v & GEN_MASK == want {
                return Ok(());
            }
            if v & FAILED != 0 {
                self.shm_known_failure(sb)?;
            }
            let missing = || {
                (0..seg.nlocal)
                    .filter(|&i| seg.slot(i).load(Ordering::Acquire) != arrival)
                    .collect::<Vec<usize>>()
            };
            if v & LEFT != 0
                && let Some(i) = missing()
                    .into_iter()
                    .find(|&i| seg.left(i).load(Ordering::Acquire) != 0)
            {
                return Err(lost(
                    sb.locals[i],
                    "it closed its bootstrap view (an orderly exit) before arriving (during barrier)",
                ));
            }
            let now = Instant::now();
            if now >= deadline {
                let missing: Vec<usize> = missing().into_iter().map(|i| sb.locals[i]).collect();
                let waiting_for = if missing.is_empty() {
                    format!(
                        "barrier: the release from rank {} (this host's leader), which waits for \
                         the other hosts",
                        sb.locals[0]
                    )
                } else {
                    format!("barrier: rank(s) {missing:?} of this host to arrive (shared memory)")
                };
                return Err(Error::Timeout {
                    waiting_for,
                    after: self.cfg.timeout,
                });
            }
            let slice = (deadline - now).min(SLICE);
            // EAGAIN (the word changed), EINTR and ETIMEDOUT all mean: look again.
            let _ = futex::wait(word, futex::Flags::empty(), v, Some(&timespec(slice)));
            if v & FAILED == 0 && Instant::now() >= now + slice {
                // A whole slice without news: what this process learned by other ways counts.
                self.shm_known_failure(sb)?;
            }
        }
    }
}
