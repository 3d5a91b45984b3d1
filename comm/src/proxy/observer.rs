//! What a proxy service tells an observer of its work (a profiler: NCCL's proxy events).
//!
//! The service knows triggers, not the calls that pushed them: the algorithm that launches a
//! kernel whose triggers this service carries says, at the launch and on the launching thread,
//! how many triggers the launch pushes and which transfers they make
//! ([`ProxyObserver::enqueued`]). The FIFO carries triggers in push order and one
//! communicator's launches run in launch order, so an observer can give each trigger to its
//! launch by counting.

use std::fmt;

/// The transfers one launch makes through a proxy service, per peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProxyOpInfo {
    /// The peer in the numbering the observer's user knows (e.g. the communicator's rank).
    pub peer: usize,
    /// The peer as the service's connection names it ([`ProxyObserver::trigger_start`]'s).
    pub conn_peer: usize,
    /// Data triggers to this peer (steps): each a put of at most `step_bytes`.
    pub steps: u32,
    /// Bytes of the largest step.
    pub step_bytes: u64,
}

/// Receives a proxy service's events. `trigger_*` and `busy` run on the proxy thread between
/// triggers (the hot path: they must be quick and must not block on the launching thread);
/// `enqueued` runs on the thread that launches.
pub trait ProxyObserver: Send + Sync + fmt::Debug {
    /// A launch will push `triggers` triggers, making the transfers `ops`.
    fn enqueued(&self, triggers: u64, ops: &[ProxyOpInfo]);
    /// The launch last said [`enqueued`](Self::enqueued) failed: it pushes nothing.
    fn withdrawn(&self);
    /// A launch was captured into a graph: its replays will push triggers no launch announces,
    /// so counting can no longer tell whose a trigger is.
    fn captured(&self);
    /// The observer now watches a (new) service (a communicator's collectives made again):
    /// nothing counted before will come.
    fn attached(&self);
    /// The proxy takes up a trigger to `conn_peer` moving `bytes` (0: a signal or flush only).
    fn trigger_start(&self, conn_peer: usize, bytes: u64);
    /// That trigger is carried out (`ok`: without error).
    fn trigger_done(&self, conn_peer: usize, bytes: u64, ok: bool);
    /// The proxy thread took up work after an empty FIFO (`true`), or found it empty again.
    fn busy(&self, busy: bool);
}
