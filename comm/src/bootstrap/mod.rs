//! TCP bootstrap: rendezvous of `nranks` processes and small out-of-band messages between them.
//!
//! # How ranks meet
//!
//! 1. A *root* listens on a known address. Every rank binds its own listener, connects to the
//!    root and sends a Hello (the bootstrap secret, its rank, `nranks`, and its listen address).
//!    The root refuses — with an Error frame naming the reason — connections with a wrong
//!    secret, a different `nranks`, an out-of-range or duplicate rank, or bytes that do not
//!    decode, and keeps waiting for the legitimate ranks. Once all have joined it sends each one
//!    the table of listen addresses, closes every connection and exits. The root keeps at most
//!    `root::MAX_PENDING_HELLOS` handshakes open and closes any connection beyond that at once;
//!    a rank turned away so (its connection ends before any answer) tries again after a random
//!    pause, within the one bootstrap deadline.
//! 2. No connection between ranks exists yet. A connection is opened the first time two ranks
//!    exchange a message (either may dial; the dialler sends a Hello, the acceptor validates it
//!    as the root does and answers with an Ack). When both dial each other at once, the lower
//!    rank's connection is kept and the other is refused as Crossed.
//! 3. Collectives follow a [`Schedule`]: by default binomial-tree barrier, Bruck all-gather and
//!    binomial broadcast, whose peers are `rank ± 2^k`, so a rank holds at most
//!    `2 ceil(log2 N)` connections for its collectives, plus one per peer it sends to itself.
//!    The host identities (who shares this rank's host) are all-gathered at init.
//! 4. One event loop per process (`reactor`: one thread and one epoll set for every bootstrap of
//!    the process, non-blocking sockets) accepts connections, runs their handshakes and files
//!    incoming messages under `(view, peer, tag)`; an operation waiting for messages reads the
//!    connections it waits on itself, so that a message wakes one thread. A connection that
//!    ends marks its peer dead, and every current and future operation involving that peer
//!    fails at once with `Error::Remote`. A rank whose collective fails because a peer died
//!    tells the peers of its schedule, so that every rank waiting on it fails naming the dead
//!    rank too, rather than timing out.
//! 5. [`Bootstrap::split`] and [`Bootstrap::shrink`] make views over the same connections (no
//!    new root): each view's messages carry its id.
//! 6. The barrier of a view whose ranks share hosts runs in shared memory within each host (one
//!    segment per view and host, set up by the view's first barrier; a futex wakes the waiters)
//!    and over TCP between one rank per host only (`shm`; [`BootstrapConfig::shared_memory`]).
//!
//! # Who runs the root
//!
//! * [`UniqueId::new`] / [`UniqueId::with_root`] bind the root's listener and park it in the
//!   creating process; the first [`Bootstrap::new`] in that process with that id (whatever
//!   its rank) runs the root on a background thread for the duration of the rendezvous.
//! * A process that creates the id but is not a rank (a launcher that passes the id, as hex,
//!   to its children) uses [`BootstrapRoot::start`], which runs the root at once and owns it.
//! * [`Bootstrap::from_addr`] (`"[ifname:]ip:port"`) and [`Bootstrap::from_env`]: rank 0 binds
//!   the given address and runs the root. The secret then comes from
//!   `MSCCLPP_BOOTSTRAP_SECRET`, or a fixed project string when that is unset: this mode only
//!   keeps out peers of *other* bootstraps, not someone who knows the string, so it is weaker
//!   than a [`UniqueId`], whose secret is 16 random bytes.
//!
//! # Deadlines and failures
//!
//! Every wait is bounded by [`BootstrapConfig::timeout`]: the whole rendezvous, and each
//! operation separately. A missed deadline is `Error::Timeout` naming the ranks and the
//! operation; a peer whose connection ended is `Error::Remote { rank, .. }` with
//! "connection lost". Collectives (`all_gather`, `barrier`, `broadcast`) use a reserved tag
//! space (tags with the top bit set) and must be called in the same order on every rank.

mod launch_env;
pub mod protocol;
mod reactor;
mod root;
mod shm;
mod unique_id;

#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

pub use launch_env::{
    LaunchInfo, detect as detect_launch, detect_optional as detect_launch_optional,
};
pub use root::BootstrapRoot;
pub use unique_id::{UNIQUE_ID_BYTES, UniqueId, default_root_ip};

use protocol::{
    ErrorCode, FrameKind, Hello, HelloRole, decode_error, decode_table, encode_hello, from_io,
    read_frame, write_frame,
};
use reactor::{Conn, Reactor, SendError, Waiter};

/// Tags with this bit set belong to collectives; user tags must leave it clear.
pub const RESERVED_TAG_BIT: u64 = 1 << 63;

/// The fixed string `ip:port` bootstraps derive their secret from when
/// `MSCCLPP_BOOTSTRAP_SECRET` is unset.
const DEFAULT_SECRET_STRING: &str = "mscclpp-rs bootstrap v1 (set MSCCLPP_BOOTSTRAP_SECRET)";

/// Settings of a bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapConfig {
    /// Deadline of the rendezvous and of each operation.
    pub timeout: Duration,
    /// Largest message a peer may send; larger frames are refused before any allocation.
    pub max_frame_bytes: usize,
    /// The collectives' schedule (`MSCCLPP_BOOTSTRAP_SCHEDULE`: `log` or `ring`).
    pub schedule: Schedule,
    /// Ranks of a view that share a host meet in shared memory for the barrier, with TCP
    /// between hosts only (`MSCCLPP_BOOTSTRAP_SHM`, default on). A view uses it only when
    /// every member allows it and every host could set it up; else it keeps the TCP barrier.
    pub shared_memory: bool,
}

impl Default for BootstrapConfig {
    /// 60 s and 1 GiB, without looking at the environment (see [`BootstrapConfig::from_env`]).
    fn default() -> Self {
        BootstrapConfig {
            timeout: Duration::from_secs(60),
            max_frame_bytes: 1 << 30,
            schedule: Schedule::Log,
            shared_memory: true,
        }
    }
}

impl BootstrapConfig {
    /// The defaults, with `MSCCLPP_BOOTSTRAP_TIMEOUT` (seconds), `MSCCLPP_BOOTSTRAP_SCHEDULE`
    /// and `MSCCLPP_BOOTSTRAP_SHM` (`0` keeps every barrier on TCP) applied when set.
    ///
    /// Also checks `MSCCLPP_SOCKET_IFNAME` when it is set, so that a name that does not exist
    /// fails every process that joins a bootstrap (a launching parent, its ranks, launched
    /// ranks) rather than only the ones that happen to listen through it.
    pub fn from_env() -> Result<Self> {
        if mscclpp_hal::env::get("MSCCLPP_SOCKET_IFNAME").is_some() {
            mscclpp_hal::net::local_ip()?;
        }
        let mut c = Self::default();
        if let Some(t) = checked_timeout(mscclpp_hal::env::seconds(TIMEOUT_VAR)?)? {
            c.timeout = t;
        }
        if let Some(s) = mscclpp_hal::env::get("MSCCLPP_BOOTSTRAP_SCHEDULE") {
            c.schedule = s.parse()?;
        }
        if let Some(f) = mscclpp_hal::env::flag("MSCCLPP_BOOTSTRAP_SHM")? {
            c.shared_memory = f;
        }
        Ok(c)
    }
}

/// The variable that sets every bootstrap wait's deadline.
pub(crate) const TIMEOUT_VAR: &str = "MSCCLPP_BOOTSTRAP_TIMEOUT";

/// The shortest deadline [`TIMEOUT_VAR`] may set: below it no connection, let alone a
/// rendezvous, can finish (a value in seconds is easily given in the wrong unit).
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// A [`TIMEOUT_VAR`] value, refused below [`MIN_TIMEOUT`].
pub(crate) fn checked_timeout(t: Option<Duration>) -> Result<Option<Duration>> {
    match t {
        Some(t) if t < MIN_TIMEOUT => Err(Error::invalid(format!(
            "{TIMEOUT_VAR}={}: a deadline of {t:?} is too short for any bootstrap wait; \
             expected at least {} seconds (1 ms; the value is in seconds, default 60)",
            t.as_secs_f64(),
            MIN_TIMEOUT.as_secs_f64()
        ))),
        t => Ok(t),
    }
}

/// A bootstrap timeout that says which variable sets the deadline that passed.
pub(crate) fn name_timeout_var(e: Error) -> Error {
    match e {
        Error::Timeout { waiting_for, after } if !waiting_for.contains(TIMEOUT_VAR) => {
            Error::Timeout {
                waiting_for: format!("{waiting_for} (the bootstrap deadline: {TIMEOUT_VAR})"),
                after,
            }
        }
        e => e,
    }
}

/// `MSCCLPP_BOOTSTRAP_SECRET` (`raw`: its value when set): a value that is set but blank is
/// refused rather than read as unset, which would silently mean the public default secret.
pub(crate) fn secret_setting(raw: Option<&str>) -> Result<Option<&str>> {
    match raw.map(str::trim) {
        None => Ok(None),
        Some("") => Err(Error::invalid(
            "MSCCLPP_BOOTSTRAP_SECRET is set but empty: that would mean the public default \
             secret; set a non-empty secret (the same on every rank) or unset the variable",
        )),
        Some(s) => Ok(Some(s)),
    }
}

/// The secret of address-based bootstraps: `MSCCLPP_BOOTSTRAP_SECRET`, else the fixed string.
fn env_secret() -> Result<String> {
    let raw = std::env::var("MSCCLPP_BOOTSTRAP_SECRET").ok();
    Ok(secret_setting(raw.as_deref())?
        .unwrap_or(DEFAULT_SECRET_STRING)
        .to_owned())
}

/// Which message schedules the collectives use; this also decides which peers a rank ever
/// connects to (connections are opened on first use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Binomial-tree barrier and broadcast, Bruck all-gather: `ceil(log2 N)` rounds,
    /// with the peers `rank ± 2^k` — at most `2 ceil(log2 N)` connections per rank.
    #[default]
    Log,
    /// Ring all-gather and barrier, chain broadcast: `N - 1` rounds, two connections per rank.
    /// For very many ranks in one process, where every connection costs two descriptors.
    Ring,
}

impl std::str::FromStr for Schedule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "log" | "" => Ok(Schedule::Log),
            "ring" => Ok(Schedule::Ring),
            other => Err(Error::invalid(format!(
                "bootstrap schedule {other:?}: expected \"log\" or \"ring\""
            ))),
        }
    }
}

/// The peers a rank exchanges collective messages with under `schedule` (sorted, without
/// `rank` itself): the only connections the collectives ever open.
pub fn schedule_peers(schedule: Schedule, rank: usize, nranks: usize) -> Vec<usize> {
    let mut v = Vec::new();
    if nranks > 1 {
        match schedule {
            Schedule::Ring => {
                v.push((rank + 1) % nranks);
                v.push((rank + nranks - 1) % nranks);
            }
            Schedule::Log => {
                let mut d = 1;
                while d < nranks {
                    v.push((rank + d) % nranks);
                    v.push((rank + nranks - d) % nranks);
                    d <<= 1;
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v.retain(|&p| p != rank);
    v
}

/// A connected group of ranks that can exchange small messages; see the [module
/// docs](self). `Send + Sync`: operations may be called from several threads.
pub struct Bootstrap {
    /// This view's rank and size (a split or shrunk view numbers its members from 0).
    rank: usize,
    nranks: usize,
    local_rank: Option<usize>,
    cfg: BootstrapConfig,
    core: Arc<Core>,
    /// Keeps this view's messages apart from those of other views over the same connections.
    comm_id: u64,
    /// View rank -> rank of the connections' bootstrap.
    members: Arc<[usize]>,
    /// View rank -> index of its host (ranks with equal indices share a host).
    hosts: Arc<[u32]>,
    /// Host index -> its cores (the fewest any of its ranks reported).
    host_cores: Arc<[u32]>,
    /// More ranks of this view on some host than it has cores (or not known yet): the
    /// all-gather then takes the tree, which wakes each rank fewer times. The same on every
    /// rank of the view.
    crowded: bool,
    coll_seq: AtomicU64,
    split_seq: AtomicU64,
    /// How this view's barrier runs (shared memory within hosts, or TCP); held through a
    /// barrier, so that one rank's barriers on a view never overlap.
    shm: Mutex<shm::ShmState>,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("local_rank", &self.local_rank)
            .field("cfg", &self.cfg)
            .field("comm_id", &self.comm_id)
            .finish_non_exhaustive()
    }
}

/// Owns the connections of a bootstrap and every view of it; dropping the last view closes
/// them.
struct Core {
    shared: Arc<Shared>,
}

struct Shared {
    rank: usize,
    nranks: usize,
    secret: [u8; protocol::SECRET_BYTES],
    /// Listen address of every rank, from the root.
    table: Vec<SocketAddr>,
    listen: SocketAddr,
    /// This rank's listener (non-blocking, in the event loop's set while `nranks > 1`).
    listener: TcpListener,
    /// The listener's token in the event loop.
    listen_token: u64,
    /// The process's event loop; `None` for a bootstrap of one rank, which has no peers.
    reactor: Option<Arc<Reactor>>,
    cfg: BootstrapConfig,
    state: Mutex<State>,
    cv: Condvar,
    closing: AtomicBool,
    /// Inbound handshakes in progress (bounded by `root::MAX_PENDING_HELLOS`).
    handshakes: AtomicUsize,
    /// Held while a failure is forwarded (see [`Shared::peer_failed`]).
    forwarding: Mutex<()>,
    /// This rank's host identity (`MSCCLPP_HOSTID`, else the boot id, else the host name).
    host_id: String,
    /// The shared-memory barrier segments of this rank's views, with each view's members
    /// (bootstrap ranks): a death is written into those it concerns.
    segments: Mutex<Vec<shm::Registered>>,
}

/// A connection to one peer.
enum Link {
    /// Being dialled by this rank.
    Dialling,
    /// Open.
    Up(Arc<Conn>),
}

struct State {
    /// Messages by (communicator id, peer, tag).
    queues: HashMap<(u64, usize, u64), VecDeque<Vec<u8>>>,
    /// Open or opening connections; absent: none yet. Sparse: a rank talks to few peers.
    links: HashMap<usize, Link>,
    /// Why each peer's connection ended (or the peer was reported lost), if it did.
    dead: HashMap<usize, String>,
    /// Dead peers in the order their connections ended: a collective names the first, which is
    /// the cause when the others only followed it.
    dead_order: Vec<usize>,
    /// Peers that reported an operation failed because of another rank: (that rank, why).
    reported: HashMap<usize, (usize, String)>,
    /// Every connection in the event loop, by token (open links, and any not yet seen to end).
    conns: HashMap<u64, Arc<Conn>>,
    /// Threads waiting on `Shared::cv`: a change wakes them only when there are some.
    cv_waiters: usize,
    /// Connections opened so far (either direction).
    opened: usize,
    /// Ranks known to have died (not merely left in order), first learned first, with how.
    failures: Vec<PeerFailure>,
    /// Failure handlers ([`Bootstrap::on_failure`]) by id.
    handlers: Vec<(u64, FailureHandler)>,
    next_handler: u64,
}

/// A handler of peer failures; it receives failures in the numbering of the bootstrap's
/// connections (the root view's ranks), translated by the view that registered it.
type FailureHandler = Arc<dyn Fn(&PeerFailure) + Send + Sync>;

/// Handlers to call, with the failure, once no lock is held.
type Deferred = (Vec<FailureHandler>, PeerFailure);

/// Calls failure handlers. A handler that panics is reported and the others still run: they
/// run on the event loop every bootstrap of the process depends on.
fn run_handlers(deferred: Vec<Deferred>) {
    for (handlers, failure) in deferred {
        for h in handlers {
            let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| h(&failure)));
            if called.is_err() {
                tracing::error!(%failure, "a bootstrap failure handler panicked");
            }
        }
    }
}

/// A rank found dead: its connection ended without a goodbye, or a peer reported it lost.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFailure {
    /// The dead rank (in the numbering of the view that reports it).
    pub rank: usize,
    /// Its bootstrap listen address.
    pub addr: SocketAddr,
    /// When this rank learned of it.
    pub at: Instant,
    /// How this rank learned of it, e.g. "its bootstrap connection closed: …" or
    /// "reported by rank 3: …".
    pub how: String,
}

impl std::fmt::Display for PeerFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "rank {} ({}) died ({})", self.rank, self.addr, self.how)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // State stays consistent across a panicking holder: every update is a single insert.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the threads waiting on the condition variable, if any (decided under the lock).
    fn notify(&self, st: MutexGuard<'_, State>) {
        let waiting = st.cv_waiters > 0;
        drop(st);
        if waiting {
            self.cv.notify_all();
        }
    }

    /// As [`Shared::notify`], for a change that fails operations (a death, a report): the
    /// thread polling its own connections is woken too.
    fn notify_failure(&self, st: MutexGuard<'_, State>) {
        self.notify(st);
        if let Some(r) = &self.reactor {
            r.wake_poller();
        }
    }

    /// The largest payload a peer may send (a message and its view id).
    fn max_payload(&self) -> usize {
        self.cfg.max_frame_bytes + protocol::COMM_ID_BYTES
    }

    fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = self.lock();
        if let std::collections::hash_map::Entry::Vacant(e) = st.dead.entry(peer) {
            e.insert(reason);
            st.dead_order.push(peer);
        }
        // A link that ended is not used again; a dead peer is never redialled.
        st.links.remove(&peer);
        self.notify_failure(st);
    }

    /// Records that `peer` (a rank of the connections' numbering) died, learned `how`; the
    /// first time for that rank, forwards a Lost frame over every standing connection (so the
    /// news floods the job: the connections the init all-gather left form a connected graph
    /// even without any one rank) and returns the failure handlers to call (by the caller,
    /// once it holds no lock).
    fn peer_failed(self: &Arc<Self>, peer: usize, how: String) -> Option<Deferred> {
        if self.closing.load(Ordering::Acquire) || peer == self.rank || peer >= self.nranks {
            return None;
        }
        // Held until the news is forwarded: closing the bootstrap (which says goodbye to every
        // peer) waits for it, so no peer sees this rank's orderly exit before the failure.
        let _fwd = self.forwarding.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.lock();
        if st.failures.iter().any(|f| f.rank == peer) {
            return None;
        }
        let failure = PeerFailure {
            rank: peer,
            addr: self.table[peer],
            at: Instant::now(),
            how,
        };
        st.failures.push(failure.clone());
        let handlers: Vec<FailureHandler> =
            st.handlers.iter().map(|(_, h)| Arc::clone(h)).collect();
        let conns: Vec<(usize, Arc<Conn>)> = st
            .links
            .iter()
            .filter_map(|(&p, l)| match l {
                Link::Up(c) if p != peer && !st.dead.contains_key(&p) => Some((p, Arc::clone(c))),
                _ => None,
            })
            .collect();
        self.notify_failure(st);
        // Ranks of this host waiting in a shared-memory barrier learn it at once.
        self.post_failure(peer);
        tracing::warn!(rank = self.rank, dead = peer, how = %failure.how, "bootstrap peer failed");
        // Forwarded before the handlers run: a handler may end this rank's work, and the rank
        // may then exit before the news went on. Queued without waiting; what the kernel does
        // not take at once the event loop writes.
        if let Some(r) = &self.reactor {
            let frame = reactor::frame(
                FrameKind::Lost,
                0,
                &protocol::encode_lost(peer, &failure.how),
            );
            for (_, c) in conns {
                let _ = c.send_nowait(r, frame.clone());
            }
        }
        Some((handlers, failure))
    }

    fn wait<'a>(
        &self,
        mut st: MutexGuard<'a, State>,
        deadline: Instant,
    ) -> (MutexGuard<'a, State>, bool) {
        let now = Instant::now();
        if now >= deadline {
            return (st, false);
        }
        st.cv_waiters += 1;
        let mut st = self
            .cv
            .wait_timeout(st, deadline - now)
            .unwrap_or_else(|p| p.into_inner())
            .0;
        st.cv_waiters -= 1;
        (st, true)
    }
}

fn lost(peer: usize, reason: &str) -> Error {
    Error::Remote {
        rank: peer,
        message: format!("connection lost: {reason}"),
    }
}

/// A bootstrap's connection count, for the scale benchmark and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkStats {
    /// Connections open now.
    pub open: usize,
    /// Connections opened since the rendezvous (either direction).
    pub opened: usize,
}

impl Bootstrap {
    /// Joins the bootstrap identified by `uid` as `rank` of `nranks`.
    ///
    /// If this process created `uid` with [`UniqueId::new`]/[`UniqueId::with_root`] and has not
    /// used it yet, this call also runs the root.
    pub fn new(uid: &UniqueId, rank: usize, nranks: usize, cfg: BootstrapConfig) -> Result<Self> {
        check_rank(rank, nranks)?;
        let root = match uid.take_parked_listener() {
            Some(l) => Some(BootstrapRoot::spawn(l, *uid.secret(), nranks, cfg.clone())?),
            None => None,
        };
        // A UniqueId's root listens from the moment the id exists: a refused connection means
        // its rendezvous is over (or its process is gone), never that it is not up yet.
        Self::establish(uid, rank, nranks, cfg, root, None, true)
    }

    /// Joins the bootstrap whose root is `"[ifname:]ip:port"`; rank 0 binds that address and
    /// runs the root. `ifname`, if given, must exist (it is checked in `/sys/class/net`); the
    /// address used is the given ip. The secret comes from `MSCCLPP_BOOTSTRAP_SECRET`, else
    /// from a fixed string (see the module docs on why this is weaker than a [`UniqueId`]).
    pub fn from_addr(addr: &str, rank: usize, nranks: usize, cfg: BootstrapConfig) -> Result<Self> {
        let secret = env_secret()?;
        Self::from_addr_with_secret(addr, &secret, rank, nranks, cfg, None)
    }

    pub(crate) fn from_addr_with_secret(
        addr: &str,
        secret: &str,
        rank: usize,
        nranks: usize,
        cfg: BootstrapConfig,
        local_rank: Option<usize>,
    ) -> Result<Self> {
        check_rank(rank, nranks)?;
        let spec = unique_id::parse_root_spec(addr)?;
        if spec.addr.port() == 0 {
            return Err(Error::invalid(format!(
                "bootstrap address {addr:?}: port 0 cannot be found by the other ranks; give a fixed port"
            )));
        }
        let uid = UniqueId::from_parts(spec.addr, unique_id::derive_secret(secret));
        let root = if rank == 0 {
            let listener = match TcpListener::bind(spec.addr) {
                Ok(l) => l,
                // The name may resolve to an address this host only reaches through NAT or a
                // proxy; listening on every interface at that port still lets the ranks in.
                Err(e) if e.kind() == std::io::ErrorKind::AddrNotAvailable => {
                    let any = SocketAddr::new(unspecified_like(&spec.addr), spec.addr.port());
                    tracing::warn!(addr = %spec.addr, %any, "cannot bind the bootstrap root address; using the wildcard");
                    TcpListener::bind(any)
                        .map_err(|e| Error::io(format!("binding the bootstrap root on {any}"), e))?
                }
                Err(e) => {
                    return Err(Error::io(
                        format!("binding the bootstrap root on {}", spec.addr),
                        e,
                    ));
                }
            };
            Some(BootstrapRoot::spawn(
                listener,
                *uid.secret(),
                nranks,
                cfg.clone(),
            )?)
        } else {
            None
        };
        Self::establish(&uid, rank, nranks, cfg, root, local_rank, false)
    }

    /// Joins the bootstrap described by the launcher's environment (see [`detect_launch`]):
    /// rank and size from torchrun, Open MPI, PMI or Slurm; the root from
    /// `MSCCLPP_MASTER_ADDR`/`MSCCLPP_MASTER_PORT`, else `MASTER_ADDR` and `MASTER_PORT + 1`
    /// (torchrun's TCPStore already holds `MASTER_PORT`).
    pub fn from_env(cfg: BootstrapConfig) -> Result<Self> {
        let info = launch_env::detect(&|k| mscclpp_hal::env::get(k))?;
        let root = info.root.ok_or_else(|| {
            Error::invalid(format!(
                "{} launch (rank {} of {}) but no bootstrap root address: set MSCCLPP_MASTER_ADDR \
                 and MSCCLPP_MASTER_PORT (or MASTER_ADDR and MASTER_PORT)",
                info.source, info.rank, info.world_size
            ))
        })?;
        let secret = env_secret()?;
        Self::from_addr_with_secret(
            &root,
            &secret,
            info.rank,
            info.world_size,
            cfg,
            info.local_rank,
        )
    }

    fn establish(
        uid: &UniqueId,
        rank: usize,
        nranks: usize,
        cfg: BootstrapConfig,
        root: Option<BootstrapRoot>,
        local_rank: Option<usize>,
        root_prebound: bool,
    ) -> Result<Self> {
        Self::establish_within(uid, rank, nranks, cfg, root, local_rank, root_prebound)
            .map_err(name_timeout_var)
    }

    fn establish_within(
        uid: &UniqueId,
        rank: usize,
        nranks: usize,
        cfg: BootstrapConfig,
        root: Option<BootstrapRoot>,
        local_rank: Option<usize>,
        root_prebound: bool,
    ) -> Result<Self> {
        let span = tracing::info_span!("bootstrap", rank, nranks, root = %uid.root_addr());
        let _g = span.enter();
        let deadline = Instant::now() + cfg.timeout;
        let result = Self::rendezvous(uid, rank, nranks, &cfg, deadline, root_prebound);
        let (listener, table) = match (result, root) {
            (Ok(t), Some(root)) => {
                // We have the table, so the root is sending its last ones.
                if let Err(e) = root.wait() {
                    tracing::warn!(error = %e, "bootstrap root ended with an error after we joined");
                }
                t
            }
            (Ok(t), None) => t,
            (Err(e), Some(root)) => {
                // The root's own error names the missing ranks; prefer it to ours. When we timed
                // out, the root (started just before us, with the same deadline) is at its own
                // deadline too: let it finish, so that its error says who is missing, instead of
                // stopping it first (which races with that deadline). Any other failure of ours
                // stops it at once.
                if !matches!(e, Error::Timeout { .. }) {
                    root.stop();
                }
                return match root.wait() {
                    Err(re @ Error::Timeout { .. }) => Err(re),
                    _ => Err(e),
                };
            }
            (Err(e), None) => return Err(e),
        };
        let b = Self::start(uid, rank, nranks, local_rank, cfg.clone(), listener, table)?;
        // Host identities, gathered along the collective schedule (this also opens the
        // connections every later collective uses).
        // Under what is left of the one bootstrap deadline, not a fresh one.
        // This host's cores go with its identity: whether a view is crowded (which decides its
        // all-gather algorithm) must come out the same on every rank, whatever host it is on.
        let cores = std::thread::available_parallelism().map_or(1, |c| c.get()) as u32;
        let mut me = cores.to_le_bytes().to_vec();
        me.extend_from_slice(b.shared().host_id.as_bytes());
        let left = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let b = Bootstrap {
            cfg: BootstrapConfig {
                timeout: left,
                ..b.cfg.clone()
            },
            ..b
        };
        let ids = b.all_gather(&me)?;
        let b = Bootstrap { cfg, ..b };
        let mut seen: HashMap<Vec<u8>, u32> = HashMap::new();
        let mut hosts = Vec::with_capacity(nranks);
        let mut host_cores: Vec<u32> = Vec::new();
        for (r, id) in ids.into_iter().enumerate() {
            let (c, name) = id
                .split_first_chunk::<4>()
                .map(|(c, name)| (u32::from_le_bytes(*c).max(1), name.to_vec()))
                .ok_or_else(|| {
                    Error::malformed(
                        "bootstrap host identity",
                        format!("rank {r} sent {} bytes, expected at least 4", id.len()),
                    )
                })?;
            let n = seen.len() as u32;
            let h = *seen.entry(name).or_insert(n);
            if h == n {
                host_cores.push(c);
            }
            host_cores[h as usize] = host_cores[h as usize].min(c);
            hosts.push(h);
        }
        let b = Bootstrap {
            hosts: hosts.into(),
            host_cores: host_cores.into(),
            ..b
        };
        Ok(Bootstrap {
            crowded: b.is_crowded(),
            ..b
        })
    }

    /// Registers with the root and receives the table of listen addresses. The root closes a
    /// connection at once when too many handshakes are in progress; a rank whose connection
    /// ends before any answer tries again after a random pause, until the deadline. With
    /// `root_prebound` (a [`UniqueId`]'s root, listening since the id was made) a refused
    /// connection is final: the id is stale.
    fn rendezvous(
        uid: &UniqueId,
        rank: usize,
        nranks: usize,
        cfg: &BootstrapConfig,
        deadline: Instant,
        root_prebound: bool,
    ) -> Result<(TcpListener, Vec<SocketAddr>)> {
        let root_addr = uid.root_addr();
        let mut listener: Option<(TcpListener, SocketAddr)> = None;
        let mut attempt: u32 = 0;
        loop {
            let mut to_root = connect_retry(
                root_addr,
                deadline,
                cfg.timeout,
                "the bootstrap root",
                root_prebound,
            )?;
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
                Ok((FrameKind::Table, payload)) => {
                    let table = decode_table(&payload, nranks)?;
                    tracing::debug!(%listen, attempt, "joined through the bootstrap root");
                    let (l, _) = listener.ok_or_else(|| {
                        Error::Internal("bootstrap listener missing after the rendezvous".into())
                    })?;
                    return Ok((l, table));
                }
                Ok((kind, _)) => {
                    return Err(Error::malformed(
                        "bootstrap handshake",
                        format!(
                            "the root sent a {kind:?} frame where the address table was expected"
                        ),
                    ));
                }
                Err(e) if root_turned_us_away(&e) && Instant::now() < deadline => {
                    attempt += 1;
                    let pause = jitter(rank, attempt);
                    tracing::debug!(attempt, ?pause, error = %e, "the bootstrap root turned us away; retrying");
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn start(
        uid: &UniqueId,
        rank: usize,
        nranks: usize,
        local_rank: Option<usize>,
        cfg: BootstrapConfig,
        listener: TcpListener,
        table: Vec<SocketAddr>,
    ) -> Result<Self> {
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("reading this rank's listen address", e))?;
        let reactor = if nranks > 1 {
            Some(reactor::reactor()?)
        } else {
            None
        };
        let listen_token = reactor.as_ref().map_or(0, |r| r.token());
        let shared = Arc::new(Shared {
            rank,
            nranks,
            secret: *uid.secret(),
            table,
            listen,
            listener,
            listen_token,
            reactor,
            cfg: cfg.clone(),
            state: Mutex::new(State {
                queues: HashMap::new(),
                links: HashMap::new(),
                dead: HashMap::new(),
                dead_order: Vec::new(),
                reported: HashMap::new(),
                conns: HashMap::new(),
                cv_waiters: 0,
                opened: 0,
                failures: Vec::new(),
                handlers: Vec::new(),
                next_handler: 0,
            }),
            cv: Condvar::new(),
            closing: AtomicBool::new(false),
            handshakes: AtomicUsize::new(0),
            forwarding: Mutex::new(()),
            host_id: local_host_id(),
            segments: Mutex::new(Vec::new()),
        });
        if let Some(r) = &shared.reactor {
            r.add_listener(&shared)?;
        }
        Ok(Bootstrap {
            rank,
            nranks,
            local_rank,
            cfg,
            core: Arc::new(Core { shared }),
            comm_id: 0,
            members: (0..nranks).collect::<Vec<_>>().into(),
            hosts: vec![0; nranks].into(),
            host_cores: vec![1].into(),
            crowded: true,
            coll_seq: AtomicU64::new(0),
            split_seq: AtomicU64::new(0),
            shm: Mutex::new(shm::ShmState::Untried),
        })
    }

    fn shared(&self) -> &Arc<Shared> {
        &self.core.shared
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The number of ranks.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// The rank within this node, when the launcher said (only [`Bootstrap::from_env`]).
    pub fn local_rank(&self) -> Option<usize> {
        self.local_rank
    }

    /// The deadline of each operation.
    pub fn timeout(&self) -> Duration {
        self.cfg.timeout
    }

    /// The host of each rank, as small integers learned at init: ranks with the same number
    /// share a host (`MSCCLPP_HOSTID`, else the boot id, else the host name).
    pub fn hosts(&self) -> &[u32] {
        &self.hosts
    }

    /// The ranks on this rank's host, in rank order (this rank included).
    pub fn host_peers(&self) -> Vec<usize> {
        let me = self.hosts[self.rank];
        (0..self.nranks).filter(|&r| self.hosts[r] == me).collect()
    }

    /// This rank's position among the ranks of its host (learned at init, whatever the
    /// launcher said).
    pub fn host_rank(&self) -> usize {
        let me = self.hosts[self.rank];
        self.hosts[..self.rank].iter().filter(|&&h| h == me).count()
    }

    /// This rank's listen address (peers dial it on first use).
    pub fn listen_addr(&self) -> SocketAddr {
        self.shared().listen
    }

    /// The schedule the collectives use.
    pub fn schedule(&self) -> Schedule {
        self.cfg.schedule
    }

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

    /// Translates a failure in the connections' numbering into this view's; `None` when the
    /// dead rank is not a member of this view.
    fn in_view(&self, f: &PeerFailure) -> Option<PeerFailure> {
        let rank = self.members.iter().position(|&m| m == f.rank)?;
        Some(PeerFailure { rank, ..f.clone() })
    }

    /// The first rank of this view found dead — its bootstrap connection ended without a
    /// goodbye, or a peer reported it lost — whether or not any operation waited on it.
    pub fn failure(&self) -> Option<PeerFailure> {
        let st = self.shared().lock();
        st.failures.iter().find_map(|f| self.in_view(f))
    }

    /// Calls `handler` for every rank of this view found dead from now on (and at once for
    /// those already found), on the thread that learned it (the process's bootstrap event
    /// loop, or a thread waiting in an operation of this bootstrap): it must not block, and
    /// must not wait for a lock its operations' callers may hold. Returns an id for
    /// [`Bootstrap::remove_failure_handler`].
    pub fn on_failure(&self, handler: Box<dyn Fn(&PeerFailure) + Send + Sync>) -> u64 {
        let members = Arc::clone(&self.members);
        let wrapped: FailureHandler = Arc::new(move |f: &PeerFailure| {
            if let Some(rank) = members.iter().position(|&m| m == f.rank) {
                handler(&PeerFailure { rank, ..f.clone() });
            }
        });
        let mut st = self.shared().lock();
        let id = st.next_handler;
        st.next_handler += 1;
        st.handlers.push((id, Arc::clone(&wrapped)));
        let past = st.failures.clone();
        drop(st);
        for f in &past {
            wrapped(f);
        }
        id
    }

    /// Unregisters a handler of [`Bootstrap::on_failure`]; an unknown id is ignored.
    pub fn remove_failure_handler(&self, id: u64) {
        self.shared().lock().handlers.retain(|(h, _)| *h != id);
    }

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

    /// Gathers every rank's `data` (lengths may differ); the result is indexed by rank.
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let tag = self.next_coll_tag(1);
        self.coll(tag, "all_gather", || match self.cfg.schedule {
            Schedule::Log if self.crowded => self.tree_all_gather(data, tag),
            Schedule::Log => self.bruck_all_gather(data, tag),
            Schedule::Ring => self.ring_all_gather(data, tag),
        })
    }

    /// Returns once every rank has entered the barrier. Ranks that share a host meet in shared
    /// memory when the view could set it up in its first barrier (see
    /// [`BootstrapConfig::shared_memory`]), with TCP between hosts only; else over TCP.
    pub fn barrier(&self) -> Result<()> {
        let mut state = self.shm.lock().unwrap_or_else(|p| p.into_inner());
        // Drawn under the lock: two threads' barriers on one view take their tags in the order
        // they run.
        let tag = self.next_coll_tag(2);
        self.coll(tag, "barrier", || self.barrier_impl(&mut state, tag))
    }

    /// Returns `root`'s `data` on every rank (`data` is ignored on the others).
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(root)?;
        let tag = self.next_coll_tag(3);
        let n = self.nranks;
        let v = (self.rank + n - root) % n;
        self.coll(tag, "broadcast", || {
            let msg = match self.cfg.schedule {
                Schedule::Log => {
                    // Binomial tree over ranks relative to the root: v receives from v minus
                    // its highest bit, then sends to v + 2^k for every 2^k above v.
                    let msg = if v == 0 {
                        data.to_vec()
                    } else {
                        let high = 1usize << (usize::BITS - 1 - v.leading_zeros());
                        let parent = (v - high + root) % n;
                        self.recv_one(parent, tag, "broadcast")?
                    };
                    let mut d = if v == 0 {
                        1
                    } else {
                        (1usize << (usize::BITS - 1 - v.leading_zeros())) << 1
                    };
                    while v + d < n {
                        self.send_raw((v + d + root) % n, tag, &msg)?;
                        d <<= 1;
                    }
                    msg
                }
                Schedule::Ring => {
                    let msg = if v == 0 {
                        data.to_vec()
                    } else {
                        self.recv_one((self.rank + n - 1) % n, tag, "broadcast")?
                    };
                    if v + 1 < n {
                        self.send_raw((self.rank + 1) % n, tag, &msg)?;
                    }
                    msg
                }
            };
            Ok(msg)
        })
    }

    /// A view of the ranks that pass the same `color` (`None`: this rank joins no view and
    /// gets `None`), ordered by `key` then by rank. Collective over this bootstrap; reuses
    /// its connections (no new root, no new listener): a view's messages carry its own id.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Bootstrap>> {
        let seq = self.split_seq.fetch_add(1, Ordering::Relaxed);
        let mut mine = [0u8; 9];
        mine[0] = u8::from(color.is_some());
        mine[1..5].copy_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine[5..9].copy_from_slice(&key.to_le_bytes());
        let all = self.all_gather(&mine)?;
        let mut entries = Vec::with_capacity(self.nranks);
        for (r, e) in all.iter().enumerate() {
            let e: &[u8; 9] = e.as_slice().try_into().map_err(|_| {
                Error::malformed(
                    "bootstrap split",
                    format!("rank {r} sent {} bytes, expected 9", e.len()),
                )
            })?;
            if e[0] > 1 {
                return Err(Error::malformed(
                    "bootstrap split",
                    format!("rank {r} sent color flag {}", e[0]),
                ));
            }
            let c = u32::from_le_bytes([e[1], e[2], e[3], e[4]]);
            let k = u32::from_le_bytes([e[5], e[6], e[7], e[8]]);
            entries.push((e[0] == 1, c, k, r));
        }
        let Some(color) = color else {
            return Ok(None);
        };
        let mut group: Vec<(u32, usize)> = entries
            .iter()
            .filter(|e| e.0 && e.1 == color)
            .map(|e| (e.2, e.3))
            .collect();
        group.sort_unstable();
        let ranks: Vec<usize> = group.into_iter().map(|(_, r)| r).collect();
        Ok(Some(self.view(&ranks, &[1, seq, u64::from(color)])))
    }

    /// A view without the ranks in `exclude` (ranks of this bootstrap, e.g. dead ones), which
    /// every remaining rank must pass identically. Needs no message, so it works when the
    /// excluded ranks are gone; returns `None` on an excluded rank.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Option<Bootstrap>> {
        for &r in exclude {
            self.check_peer(r)?;
        }
        let seq = self.split_seq.fetch_add(1, Ordering::Relaxed);
        if exclude.contains(&self.rank) {
            return Ok(None);
        }
        let ranks: Vec<usize> = (0..self.nranks).filter(|r| !exclude.contains(r)).collect();
        let mut salt = vec![2, seq];
        let mut ex: Vec<u64> = exclude.iter().map(|&r| r as u64).collect();
        ex.sort_unstable();
        ex.dedup();
        salt.extend(ex);
        Ok(Some(self.view(&ranks, &salt)))
    }

    /// The view of `ranks` (ranks of this view, in the new order) whose id derives from this
    /// view's id and `salt` (the same on every member).
    fn view(&self, ranks: &[usize], salt: &[u64]) -> Bootstrap {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same id in every process of the same build.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.comm_id.hash(&mut h);
        salt.hash(&mut h);
        ranks.hash(&mut h);
        // Zero is the root view's id.
        let comm_id = h.finish().max(1);
        let rank = ranks.iter().position(|&r| r == self.rank).unwrap_or(0);
        let v = Bootstrap {
            rank,
            nranks: ranks.len(),
            local_rank: None,
            cfg: self.cfg.clone(),
            core: Arc::clone(&self.core),
            comm_id,
            members: ranks
                .iter()
                .map(|&r| self.members[r])
                .collect::<Vec<_>>()
                .into(),
            hosts: ranks
                .iter()
                .map(|&r| self.hosts[r])
                .collect::<Vec<_>>()
                .into(),
            host_cores: Arc::clone(&self.host_cores),
            crowded: true,
            coll_seq: AtomicU64::new(0),
            split_seq: AtomicU64::new(0),
            shm: Mutex::new(shm::ShmState::Untried),
        };
        Bootstrap {
            crowded: v.is_crowded(),
            ..v
        }
    }

    fn is_crowded(&self) -> bool {
        let mut per_host: HashMap<u32, u32> = HashMap::new();
        for &h in self.hosts.iter() {
            *per_host.entry(h).or_default() += 1;
        }
        per_host
            .iter()
            .any(|(&h, &n)| n > self.host_cores.get(h as usize).copied().unwrap_or(1))
    }

    /// Runs a collective; if it fails because a rank was lost, tells the peers of this rank's
    /// schedule, so that ranks waiting on this one fail naming that rank rather than time out.
    fn coll<T>(&self, tag: u64, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        tracing::debug!(rank = self.rank, tag, op = name, "bootstrap collective");
        let r = f();
        if let Err(Error::Remote { rank, message }) = &r
            && *rank < self.nranks
        {
            self.report_loss(self.members[*rank], message);
        }
        r.map_err(name_timeout_var)
    }

    fn report_loss(&self, lost_rank: usize, message: &str) {
        let Some(r) = &self.shared().reactor else {
            return;
        };
        let frame = reactor::frame(
            FrameKind::Lost,
            0,
            &protocol::encode_lost(lost_rank, message),
        );
        let deadline = Instant::now() + self.cfg.timeout.min(Duration::from_secs(2));
        for p in schedule_peers(self.cfg.schedule, self.rank, self.nranks) {
            let peer = self.members[p];
            if peer == lost_rank {
                continue;
            }
            if let Ok(c) = self.link(peer, deadline) {
                let _ = c.send_nowait(r, frame.clone());
            }
        }
    }

    fn recv_one(&self, peer: usize, tag: u64, op: &str) -> Result<Vec<u8>> {
        let mut got = self.wait_all(&[peer], tag, op)?;
        got.pop()
            .ok_or_else(|| Error::Internal(format!("{op}: wait returned no message")))
    }

    /// Bruck's all-gather: in round k a rank sends the blocks it has (its own and the next
    /// 2^k - 1 ranks') to `rank - 2^k` and receives as many from `rank + 2^k`.
    fn bruck_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let mut blocks: Vec<Vec<u8>> = vec![data.to_vec()];
        let mut d = 1;
        while blocks.len() < n {
            let cnt = d.min(n - blocks.len());
            let to = (self.rank + n - d) % n;
            let from = (self.rank + d) % n;
            self.send_raw(to, tag, &pack_blocks(&blocks[..cnt]))?;
            let got = self.recv_one(from, tag, "all_gather")?;
            blocks.extend(unpack_blocks(&got, cnt, from)?);
            d <<= 1;
        }
        // blocks[i] is rank (rank + i)'s.
        blocks.rotate_right(self.rank);
        Ok(blocks)
    }

    /// Tree all-gather: blocks go up the binomial tree (each subtree's blocks are contiguous
    /// ranks), the whole set comes down it. Two messages per rank where Bruck's algorithm sends
    /// `log2 N`: fewer wake-ups when the ranks outnumber the cores.
    fn tree_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let children = tree_children(self.rank, n);
        let mut blocks = vec![data.to_vec()];
        if !children.is_empty() {
            let got = self.wait_all(&children, tag, "all_gather")?;
            for (&c, m) in children.iter().zip(&got) {
                blocks.extend(unpack_blocks(m, tree_size(c, n), c)?);
            }
        }
        if self.rank != 0 {
            let parent = tree_parent(self.rank);
            self.send_raw(parent, tag, &pack_blocks(&blocks))?;
            let all = self.recv_one(parent, tag, "all_gather")?;
            blocks = unpack_blocks(&all, n, parent)?;
        }
        if !children.is_empty() {
            let all = pack_blocks(&blocks);
            // Largest subtree first: it has the longest way to go.
            for &c in children.iter().rev() {
                self.send_raw(c, tag, &all)?;
            }
        }
        Ok(blocks)
    }

    /// Ring all-gather: N - 1 steps, each forwarding to the next rank the block received in
    /// the previous step.
    fn ring_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let next = (self.rank + 1) % n;
        let prev = (self.rank + n - 1) % n;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        out[self.rank] = data.to_vec();
        for step in 0..n.saturating_sub(1) {
            let send_idx = (self.rank + n - step) % n;
            self.send_raw(next, tag, &out[send_idx])?;
            let recv_idx = (self.rank + n - step - 1) % n;
            out[recv_idx] = self.recv_one(prev, tag, "all_gather")?;
        }
        Ok(out)
    }

    /// A collective's tag: reserved bit, operation in bits 56..63, sequence number below.
    fn next_coll_tag(&self, op: u64) -> u64 {
        let seq = self.coll_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1);
        RESERVED_TAG_BIT | (op << 56) | seq
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks {
            return Err(Error::invalid(format!(
                "rank {peer} is out of range: this bootstrap has {} ranks",
                self.nranks
            )));
        }
        Ok(())
    }

    /// The view rank of bootstrap rank `r`, for errors (the bootstrap rank if not a member).
    fn view_rank(&self, r: usize) -> usize {
        if self.comm_id == 0 {
            return r;
        }
        self.members.iter().position(|&m| m == r).unwrap_or(r)
    }

    fn translate(&self, e: Error) -> Error {
        match e {
            Error::Remote { rank, message } if rank != usize::MAX => Error::Remote {
                rank: self.view_rank(rank),
                message,
            },
            other => name_timeout_var(other),
        }
    }

    /// The open connection to bootstrap rank `peer`, dialling it if there is none.
    fn link(&self, peer: usize, deadline: Instant) -> Result<Arc<Conn>> {
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

    fn send_raw(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
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
        let frame = reactor::data_frame(self.comm_id, tag, data);
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
    fn wait_all(&self, peers: &[usize], tag: u64, op: &str) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.cfg.timeout;
        let sh = self.shared();
        let targets: Vec<usize> = peers.iter().map(|&p| self.members[p]).collect();
        let mut got: Vec<Option<Vec<u8>>> = vec![None; peers.len()];
        let mut linked = vec![false; peers.len()];
        let mut waiter = Waiter::new(sh);
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

/// This rank's host identity; tests give ranks that are threads of one process hosts of their
/// own.
fn local_host_id() -> String {
    #[cfg(test)]
    if let Some(h) = shm_tests::host_override() {
        return h;
    }
    mscclpp_hal::env::host_id()
}

/// The parent of `v` (> 0) in the binomial tree rooted at 0: `v` without its lowest set bit.
/// The subtree of `v` is then the contiguous ranks `v .. v + lowbit(v)`.
fn tree_parent(v: usize) -> usize {
    v & (v - 1)
}

/// The children of `v` in the binomial tree of `n` ranks rooted at 0: `v + 2^k` for every
/// `2^k` below `v`'s lowest set bit (every `2^k` for the root), in increasing order.
fn tree_children(v: usize, n: usize) -> Vec<usize> {
    let low = if v == 0 {
        usize::MAX
    } else {
        v & v.wrapping_neg()
    };
    let mut out = Vec::new();
    let mut d = 1;
    while d < low && v + d < n {
        out.push(v + d);
        d <<= 1;
    }
    out
}

/// The size of `v`'s subtree in the binomial tree of `n` ranks.
fn tree_size(v: usize, n: usize) -> usize {
    if v == 0 {
        n
    } else {
        (v & v.wrapping_neg()).min(n - v)
    }
}

/// Dials bootstrap rank `peer`: `Ok(Some)` once it acknowledged, `Ok(None)` when it refused
/// because it is dialling us at the same time (its connection wins, see [`accept_hello`]).
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

/// The text of a Crossed refusal, recognised by the dialler.
const CROSSED: &str = "crossed dial: keeping the lower rank's connection";

impl Drop for Core {
    fn drop(&mut self) {
        let sh = &self.shared;
        let Some(r) = &sh.reactor else {
            return;
        };
        let fwd = sh.forwarding.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = sh.lock();
        sh.closing.store(true, Ordering::Release);
        st.handlers.clear();
        // The failures this rank knows of go before its goodbye on every link: a link opened
        // after the news was flooded has not carried it, and a peer that saw only the goodbye
        // in the middle of an operation would blame this rank's orderly exit instead of the
        // dead one (the chaos test caught 2 such survivors in 1 026).
        let news: Vec<Vec<u8>> = st
            .failures
            .iter()
            .map(|f| reactor::frame(FrameKind::Lost, 0, &protocol::encode_lost(f.rank, &f.how)))
            .collect();
        for l in st.links.values() {
            if let Link::Up(c) = l {
                for f in &news {
                    let _ = c.send_nowait(r, f.clone());
                }
                // Tells the peer this end is orderly, not a death.
                let _ = c.send_nowait(r, reactor::frame(FrameKind::Bye, 0, &[]));
            }
        }
        let conns: Vec<Arc<Conn>> = st.conns.drain().map(|(_, c)| c).collect();
        drop(st);
        drop(fwd);
        r.remove_listener(sh);
        // What the kernel did not take at once (a goodbye is a few bytes into an almost always
        // empty buffer) is written here, within the bootstrap's deadline, before the shutdown.
        let deadline = Instant::now() + sh.cfg.timeout;
        for c in &conns {
            c.flush_until(deadline);
            r.remove_conn(c);
            c.shutdown();
        }
    }
}

/// Encodes all-gather blocks: count, then each block's length and bytes.
fn pack_blocks(blocks: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = blocks.iter().map(|b| 8 + b.len()).sum();
    let mut v = Vec::with_capacity(4 + total);
    v.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in blocks {
        v.extend_from_slice(&(b.len() as u64).to_le_bytes());
        v.extend_from_slice(b);
    }
    v
}

/// Decodes exactly `want` blocks from `from`'s all-gather message, checking every length
/// against the bytes present before taking them.
fn unpack_blocks(buf: &[u8], want: usize, from: usize) -> Result<Vec<Vec<u8>>> {
    let bad = |why: String| {
        Error::malformed(
            "bootstrap all-gather message",
            format!("from rank {from}: {why}"),
        )
    };
    let count = buf
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad("shorter than its block count".into()))? as usize;
    if count != want {
        return Err(bad(format!("{count} blocks, expected {want}")));
    }
    let mut out = Vec::with_capacity(want);
    let mut at = 4;
    for i in 0..want {
        let len = buf
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| bad(format!("cut short in block {i}'s length")))?;
        at += 8;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| {
                bad(format!(
                    "block {i} declares {len} bytes, {} remain",
                    buf.len() - at
                ))
            })?;
        out.push(buf[at..end].to_vec());
        at = end;
    }
    if at != buf.len() {
        return Err(bad(format!(
            "{} bytes after the last block",
            buf.len() - at
        )));
    }
    Ok(out)
}

/// Whether a failed exchange means the other side closed the connection before answering (the
/// root does so when too many handshakes are in progress; a peer, when it exits), rather than
/// answered with a refusal.
fn root_turned_us_away(e: &Error) -> bool {
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

fn check_rank(rank: usize, nranks: usize) -> Result<()> {
    if nranks == 0 || nranks > protocol::MAX_RANKS {
        return Err(Error::invalid(format!(
            "nranks = {nranks}: expected 1..={}",
            protocol::MAX_RANKS
        )));
    }
    if rank >= nranks {
        return Err(Error::invalid(format!(
            "rank {rank} is out of range for nranks = {nranks}"
        )));
    }
    Ok(())
}

fn check_user_tag(tag: u64) -> Result<()> {
    if tag & RESERVED_TAG_BIT != 0 {
        return Err(Error::invalid(format!(
            "tag {tag:#x} is in the reserved collective tag space (top bit set)"
        )));
    }
    Ok(())
}

fn unspecified_like(a: &SocketAddr) -> std::net::IpAddr {
    if a.is_ipv4() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    } else {
        std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    }
}

/// Connects to `addr`, retrying while it is not listening yet, until `deadline`; with
/// `refused_is_final`, a refused connection ends it at once (the root listened before its id
/// could be handed out, so it is gone, not late).
fn connect_retry(
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
    what: &str,
    refused_is_final: bool,
) -> Result<TcpStream> {
    let mut backoff = Duration::from_millis(5);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout {
                waiting_for: format!("connecting to {what} at {addr}"),
                after: timeout,
            });
        }
        match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
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
fn read_reply(
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
