//! What each rank last asked of its communicators, and how a peer learns it without that rank's
//! program taking part (the hang diagnosis of issue 46): the front end notes every collective
//! it issues ([`Bootstrap::note_call`]); a rank that waits too long asks its peers
//! ([`Bootstrap::survey`]), and each peer's event loop answers from its record — so a rank that
//! is alive but never calls still says what it did last and how long ago.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use mscclpp_base::wire::{Reader, Writer};
use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::protocol::FrameKind;
use super::reactor::conn::frame;

/// Queue key of the answers to surveys (no view has this id).
pub(super) const SURVEY_COMM: u64 = u64::MAX;

/// A rank's last call, as it answers a survey.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Progress {
    /// Calls noted so far (the last one's sequence number; 0: none).
    pub calls: u64,
    /// The last call's operation (e.g. `ncclAllReduce`).
    pub op: String,
    /// Its bytes.
    pub bytes: u64,
    /// How long before the answer it was issued.
    pub ago: Duration,
    /// The highest call number this rank's streams have finished (`None`: the front end keeps
    /// no completion record: [`Bootstrap::set_completed`]).
    pub completed: Option<u64>,
    /// Calls noted per operation, by name (sorted).
    pub counts: Vec<(String, u64)>,
    /// What the front end says about this rank's view ([`Bootstrap::set_card`]; empty when it
    /// said nothing): opaque here.
    pub card: Vec<u8>,
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.calls == 0 {
            return write!(f, "no call yet");
        }
        write!(
            f,
            "call #{} {} of {} bytes, issued {:.1} s ago",
            self.calls,
            self.op,
            self.bytes,
            self.ago.as_secs_f64()
        )?;
        match self.completed {
            None => Ok(()),
            Some(0) => write!(f, ", none completed"),
            Some(c) if c >= self.calls => write!(f, ", completed"),
            Some(c) => write!(f, ", completed through #{c}"),
        }
    }
}

/// This rank's records, one per view (communicator) it notes calls on.
#[derive(Debug, Default)]
pub(super) struct Record {
    inner: Mutex<std::collections::HashMap<u64, Last>>,
}

/// Reads a view's completion record (the front end's: e.g. a word its streams store each
/// call's number into). Called on the event loop's thread when a peer asks: it must not block.
pub type CompletedFn = Box<dyn Fn() -> u64 + Send + Sync>;

struct Last {
    calls: u64,
    op: String,
    bytes: u64,
    at: Instant,
    counts: std::collections::BTreeMap<String, u64>,
    card: Vec<u8>,
    completed: Option<CompletedFn>,
}

impl std::fmt::Debug for Last {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Last")
            .field("calls", &self.calls)
            .field("op", &self.op)
            .field("completed", &self.completed.as_ref().map(|read| read()))
            .finish_non_exhaustive()
    }
}

impl Last {
    fn new() -> Self {
        Last {
            calls: 0,
            op: String::new(),
            bytes: 0,
            at: Instant::now(),
            counts: Default::default(),
            card: Vec::new(),
            completed: None,
        }
    }
}

impl Record {
    /// One lock; no allocation when the operation is the view's last one (the common case).
    fn note(&self, view: u64, op: &str, bytes: u64) -> u64 {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let last = g.entry(view).or_insert_with(Last::new);
        last.calls += 1;
        if last.op != op {
            op.clone_into(&mut last.op);
        }
        last.bytes = bytes;
        last.at = Instant::now();
        // No allocation once an operation has been seen.
        match last.counts.get_mut(op) {
            Some(c) => *c += 1,
            None => {
                last.counts.insert(op.to_owned(), 1);
            }
        }
        last.calls
    }

    fn set_card(&self, view: u64, card: &[u8]) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let last = g.entry(view).or_insert_with(Last::new);
        card.clone_into(&mut last.card);
    }

    fn set_completed(&self, view: u64, read: CompletedFn) {
        let mut g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.entry(view).or_insert_with(Last::new).completed = Some(read);
    }

    /// View `view`'s record.
    pub(super) fn now(&self, view: u64) -> Progress {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match g.get(&view) {
            None => Progress::default(),
            Some(last) => Progress {
                calls: last.calls,
                op: last.op.clone(),
                bytes: last.bytes,
                ago: last.at.elapsed(),
                completed: last.completed.as_ref().map(|read| read()),
                counts: last.counts.iter().map(|(k, v)| (k.clone(), *v)).collect(),
                card: last.card.clone(),
            },
        }
    }
}

/// A survey's payload: the view asked about.
pub(super) fn encode_view(view: u64) -> [u8; 8] {
    view.to_le_bytes()
}

/// The view a survey asks about (`None`: malformed).
pub(super) fn decode_view(payload: &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(payload.try_into().ok()?))
}

const MAGIC: [u8; 4] = *b"MSPG";
/// Version 3 added the completion record; a version-2 answer (an older build) has none.
const VERSION: u16 = 3;
/// Most operations an answer counts.
const MAX_COUNTS: usize = 64;
/// The largest card a front end may set.
pub(crate) const MAX_CARD: usize = 1024;
/// Longest operation name an answer carries.
const MAX_OP: usize = 256;

/// The answer's payload.
pub(super) fn encode(p: &Progress) -> Vec<u8> {
    // Version 2 where no completion record is kept: a rank of an older build reads it.
    let version = if p.completed.is_some() { VERSION } else { 2 };
    let mut w = Writer::new(MAGIC, version);
    w.u64(p.calls);
    w.u64(p.bytes);
    w.u64(p.ago.as_millis().min(u128::from(u64::MAX)) as u64);
    let mut end = p.op.len().min(MAX_OP);
    while !p.op.is_char_boundary(end) {
        end -= 1;
    }
    let op = &p.op[..end];
    w.bytes(op.as_bytes());
    let counts = &p.counts[..p.counts.len().min(MAX_COUNTS)];
    w.u64(counts.len() as u64);
    for (name, n) in counts {
        let mut end = name.len().min(MAX_OP);
        while !name.is_char_boundary(end) {
            end -= 1;
        }
        w.bytes(&name.as_bytes()[..end]);
        w.u64(*n);
    }
    w.bytes(&p.card[..p.card.len().min(MAX_CARD)]);
    // Whether a record is kept, then its number (0 where none is kept, or none finished yet).
    if version >= 3 {
        w.u64(u64::from(p.completed.is_some()));
        w.u64(p.completed.unwrap_or(0));
    }
    w.finish()
}

fn decode(buf: &[u8]) -> Result<Progress> {
    let mut r = Reader::open("survey answer", buf, MAGIC, 2, VERSION)?;
    let calls = r.u64()?;
    let bytes = r.u64()?;
    let ago = Duration::from_millis(r.u64()?);
    let op = r.str("op", MAX_OP)?.to_owned();
    let n = r.usize_at_most("counts", MAX_COUNTS)?;
    let mut counts = Vec::with_capacity(n);
    for _ in 0..n {
        let name = r.str("count's operation", MAX_OP)?.to_owned();
        counts.push((name, r.u64()?));
    }
    let card = r.bytes("card", MAX_CARD)?.to_vec();
    let completed = if r.version() >= 3 {
        let kept = r.u64()? != 0;
        let n = r.u64()?;
        kept.then_some(n)
    } else {
        None
    };
    r.finish()?;
    Ok(Progress {
        calls,
        op,
        bytes,
        ago,
        completed,
        counts,
        card,
    })
}

impl Bootstrap {
    /// Notes that this rank issued `op` over `bytes` (what a survey of its peers reports);
    /// returns its sequence number. Cheap: one lock, no message.
    pub fn note_call(&self, op: &str, bytes: u64) -> u64 {
        self.shared().progress.note(self.comm_id, op, bytes)
    }

    /// Sets what a survey of this view reports beside this rank's calls (at most
    /// [`MAX_CARD`] bytes; more is cut): a front end's description of its communicator (its
    /// process, device, state), opaque to the bootstrap.
    pub fn set_card(&self, card: &[u8]) {
        self.shared()
            .progress
            .set_card(self.comm_id, &card[..card.len().min(MAX_CARD)]);
    }

    /// Keeps a completion record for this view: surveys of this rank report `read()` as the
    /// highest call number its streams have finished (see [`Progress::completed`]). `read` runs
    /// on the event loop's thread and must not block.
    pub fn set_completed(&self, read: CompletedFn) {
        self.shared().progress.set_completed(self.comm_id, read);
    }

    /// This rank's own record of this view.
    pub fn progress(&self) -> Progress {
        self.shared().progress.now(self.comm_id)
    }

    /// Asks every other rank of this view for its record of the view, waiting up to `timeout`
    /// for the answers; answers in rank order (this rank's own included), each `Err` saying why
    /// none came (dead, unreachable, no answer in time). Each peer's event loop answers,
    /// whatever its program is doing. A peer this rank has no connection to yet is dialled as
    /// any send dials it (within the bootstrap's own deadline, so that a dial is never given up
    /// half-way, which the peer would take for this rank's death); dialling stops once
    /// `timeout` has passed, and the peers not reached are named as not asked.
    pub fn survey(&self, timeout: Duration) -> Vec<std::result::Result<Progress, String>> {
        let sh = self.shared();
        let deadline = Instant::now() + timeout;
        let id = sh.next_survey();
        let mut out: Vec<std::result::Result<Progress, String>> =
            vec![Err("no answer".into()); self.nranks];
        let mut asked = vec![false; self.nranks];
        for (v, &target) in self.members.iter().enumerate() {
            if target == sh.rank {
                out[v] = Ok(self.progress());
                continue;
            }
            if Instant::now() >= deadline {
                out[v] = Err(format!(
                    "not asked: dialling the ranks before it took the survey's {:.1} s",
                    timeout.as_secs_f64()
                ));
                continue;
            }
            let sent =
                self.link(target, Instant::now() + self.cfg.timeout)
                    .and_then(|c| {
                        let r = sh.reactor.as_ref().ok_or_else(|| {
                            Error::Internal("a survey without an event loop".into())
                        })?;
                        c.send_nowait(r, frame(FrameKind::Status, id, &encode_view(self.comm_id)))
                            .map_err(|why| Error::Internal(format!("sending a survey: {why}")))
                    });
            match sent {
                Ok(()) => asked[v] = true,
                Err(e) => out[v] = Err(e.to_string()),
            }
        }
        let mut st = sh.lock();
        loop {
            for (v, &target) in self.members.iter().enumerate() {
                if !asked[v] {
                    continue;
                }
                if let Some(q) = st.queues.remove(&(SURVEY_COMM, target, id))
                    && let Some(b) = q.into_iter().next()
                {
                    asked[v] = false;
                    out[v] = decode(&b).map_err(|e| e.to_string());
                } else if let Some(why) = st.dead.get(&target) {
                    asked[v] = false;
                    out[v] = Err(format!("dead: {why}"));
                }
            }
            let now = Instant::now();
            if !asked.contains(&true) || now >= deadline {
                break;
            }
            st = sh.wait(st, deadline.min(now + Duration::from_millis(20))).0;
        }
        // Late answers are dropped on arrival from now on (the id is no longer open).
        sh.close_survey(id, &mut st);
        drop(st);
        for (v, a) in asked.iter().enumerate() {
            if *a {
                out[v] = Err(format!("no answer in {:.1} s", timeout.as_secs_f64()));
            }
        }
        out
    }

    /// One line naming the ranks behind this one (fewer calls noted), each with its last
    /// call; `None` when a survey finds none behind. For errors of calls that waited too long.
    pub fn laggards(&self, timeout: Duration) -> Option<String> {
        let me = self.progress().calls;
        let behind: Vec<String> = behind(&self.survey(timeout), me)
            .into_iter()
            .map(|(v, what)| format!("rank {v}: {what}"))
            .collect();
        (!behind.is_empty())
            .then(|| format!("behind this rank (call #{me}): {}", behind.join("; ")))
    }
}

/// The ranks of a survey's `answers` behind `than` calls, or that did not answer, each with
/// what it said (its last call, or why no answer came).
pub(super) fn behind(
    answers: &[std::result::Result<Progress, String>],
    than: u64,
) -> Vec<(usize, String)> {
    answers
        .iter()
        .enumerate()
        .filter_map(|(v, a)| match a {
            Ok(p) if p.calls < than => Some((v, p.to_string())),
            Ok(_) => None,
            Err(why) => Some((v, format!("no answer: {why}"))),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_round_trip() {
        let p = Progress {
            calls: 7,
            op: "ncclAllReduce".into(),
            bytes: 1 << 20,
            ago: Duration::from_millis(2500),
            completed: None,
            counts: vec![("allgather".into(), 2), ("allreduce".into(), 5)],
            card: b"front end".to_vec(),
        };
        assert_eq!(decode(&encode(&p)).unwrap(), p);
        assert!(decode(&encode(&p)[..10]).is_err());
        assert_eq!(
            p.to_string(),
            "call #7 ncclAllReduce of 1048576 bytes, issued 2.5 s ago"
        );
        // A completion record: kept with none finished, part of the calls, all of them.
        for (c, tail) in [
            (0, ", none completed"),
            (5, ", completed through #5"),
            (7, ", completed"),
        ] {
            let q = Progress {
                completed: Some(c),
                ..p.clone()
            };
            assert_eq!(decode(&encode(&q)).unwrap(), q);
            assert!(q.to_string().ends_with(tail), "{q}");
        }
    }

    #[test]
    fn a_version_2_answer_has_no_completion_record() {
        let mut w = Writer::new(MAGIC, 2);
        w.u64(3);
        w.u64(64);
        w.u64(1000);
        w.bytes(b"allreduce");
        w.u64(0);
        w.bytes(b"");
        let p = decode(&w.finish()).unwrap();
        assert_eq!((p.calls, p.completed), (3, None));
    }

    #[test]
    fn the_record_reads_the_source_at_each_answer() {
        let r = Record::default();
        r.note(9, "allreduce", 8);
        assert_eq!(r.now(9).completed, None);
        let done = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let d = done.clone();
        r.set_completed(
            9,
            Box::new(move || d.load(std::sync::atomic::Ordering::Relaxed)),
        );
        assert_eq!(r.now(9).completed, Some(0));
        done.store(1, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(r.now(9).completed, Some(1));
        assert_eq!(r.now(8).completed, None, "another view keeps none");
    }
}
