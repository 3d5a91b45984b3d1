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
//!    `hello::MAX_PENDING_HELLOS` handshakes open and closes any connection beyond that at once;
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
//!
//! # Where each part lives
//!
//! * This file: the [`Bootstrap`] type (a view: rank, size, members, hosts) and its
//!   construction (`new`, `from_addr`, `from_env`: rendezvous, start, the host identities).
//! * `config`: [`BootstrapConfig`], its environment variables, the [`Schedule`] and the
//!   deadline and secret checks.
//! * `rendezvous`: joining through the root; `root`: running it; `unique_id`: the id that
//!   names it; `launch_env`: what a launcher's environment says.
//! * `state`: what a rank's views, the event loop and the operations share (connections,
//!   filed messages, dead peers, handlers), and its closing.
//! * `reactor`: the process's event loop (`reactor/mod.rs`), the inbound handshake
//!   (`handshake`), one connection's write queue and frame reader (`conn`), the side an
//!   operation takes to read its own connections (`waiter`), and what the loop needs of a
//!   rank (`endpoint`: the `Endpoint` trait).
//! * `inbound`: that trait for `state`: a checked Hello kept or refused (the crossing rule),
//!   frames filed into the state, an ended connection's peer marked dead.
//! * `links`: a connection to a peer on first use (dialling); `p2p`: `send`/`recv` and the
//!   primitives the collectives use (`send_raw`, `wait_all`).
//! * `collectives`: all-gather, barrier and broadcast over TCP; `shm`: the barrier in shared
//!   memory within a host (`shm/segment.rs`: the segment itself).
//! * `split`: [`Bootstrap::split`], [`Bootstrap::shrink`] and the views they make.
//! * `failure`: [`PeerFailure`] and its handlers (`failure/mod.rs`), recording and flooding a
//!   death (`record`), a view's failure API and a failed collective's report (`view`).
//! * `protocol`: every byte on the wire.
//!
//! The modules depend one way: the parts that add operations to [`Bootstrap`] (`links`,
//! `p2p`, `collectives`, `split`, `shm`, `failure::view`) use this file and the lower parts;
//! this file uses only `config`, `failure`, `state`, `reactor`, `rendezvous`, `root`,
//! `unique_id`, `launch_env`, `protocol` and `shm::segment`. The event loop (`reactor`) is
//! below `state`: it uses only `protocol`, `hello` and `failure`'s handler types, and knows a
//! rank as an `Endpoint`; `state` holds the loop and its connections, and `inbound` (above
//! both) implements the trait for `state`, filing what the loop reads into it.

pub mod protocol;

mod cancel;
mod collectives;
mod config;
mod failure;
mod fds;
mod hello;
mod inbound;
mod launch_env;
mod links;
mod p2p;
mod progress;
mod reactor;
mod rendezvous;
mod root;
mod shm;
mod split;
mod state;
mod status;
mod successor;
mod unique_id;

#[cfg(test)]
mod shm_tests;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use mscclpp_base::{Error, Result};

pub use cancel::Cancel;
pub use config::{BootstrapConfig, Schedule, schedule_peers};
pub use failure::PeerFailure;
pub use launch_env::{
    LaunchInfo, detect as detect_launch, detect_optional as detect_launch_optional,
};
pub use progress::{CompletedFn, Progress};
pub use protocol::RESERVED_TAG_BIT;
pub use root::BootstrapRoot;
pub use state::LinkStats;
pub use status::{StatusServer, ask_status, report as status_report};
pub use unique_id::{UNIQUE_ID_BYTES, UniqueId, default_root_ip};

use config::{env_secret, name_timeout_var};
use rendezvous::rendezvous;
use shm::segment::ShmState;
use state::{Core, Shared, State};

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
    /// Shrinks made so far, by excluded set: a shrink's view id counts only the earlier shrinks
    /// of the same set, which every remaining rank made too (the excluded ranks do not call
    /// `ncclCommShrink`, so no counter they share could stay in step).
    shrinks: Mutex<HashMap<Vec<u64>, u64>>,
    /// How this view's barrier runs (shared memory within hosts, or TCP); held through a
    /// barrier, so that one rank's barriers on a view never overlap.
    shm: Mutex<ShmState>,
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

impl Bootstrap {
    /// Joins the bootstrap identified by `uid` as `rank` of `nranks`.
    ///
    /// If this process created `uid` with [`UniqueId::new`]/[`UniqueId::with_root`] and has not
    /// used it yet, this call also runs the root.
    pub fn new(uid: &UniqueId, rank: usize, nranks: usize, cfg: BootstrapConfig) -> Result<Self> {
        check_rank(rank, nranks)?;
        let root = match uid.take_parked_listener() {
            Some(l) => {
                // A root of this process's own id: it may take the place of an earlier one.
                successor::started(*uid, nranks);
                Some(BootstrapRoot::spawn(
                    l,
                    *uid.secret(),
                    nranks,
                    cfg.clone(),
                    true,
                )?)
            }
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
            // Not kept once done: a later bootstrap at the same fixed address binds it again.
            Some(BootstrapRoot::spawn(
                listener,
                *uid.secret(),
                nranks,
                cfg.clone(),
                false,
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
        let info = launch_env::detect(&|k| mscclpp_base::env::get(k))?;
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
        let result = rendezvous(uid, rank, nranks, &cfg, deadline, root_prebound);
        // The join is over (or failed): a later cancel touches nothing, and views do not
        // inherit the token.
        if let Some(c) = &cfg.cancel {
            c.forget();
        }
        let cfg = BootstrapConfig {
            cancel: None,
            ..cfg
        };
        let (listener, table, joined) = match (result, root) {
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
        let b = Self::start(
            &joined,
            rank,
            nranks,
            local_rank,
            cfg.clone(),
            listener,
            table,
        )?;
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
                open_surveys: Default::default(),
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
            progress: progress::Record::default(),
            surveys: std::sync::atomic::AtomicU64::new(0),
        });
        if let Some(r) = &shared.reactor {
            r.add_listener(&shared)?;
        }
        Ok(Bootstrap {
            rank,
            nranks,
            local_rank,
            cfg,
            core: Arc::new(Core {
                shared,
                _member: successor::Member::new(*uid.secret()),
            }),
            comm_id: 0,
            members: (0..nranks).collect::<Vec<_>>().into(),
            hosts: vec![0; nranks].into(),
            host_cores: vec![1].into(),
            crowded: true,
            coll_seq: AtomicU64::new(0),
            split_seq: AtomicU64::new(0),
            shrinks: Mutex::new(HashMap::new()),
            shm: Mutex::new(ShmState::Untried),
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
}

/// This rank's host identity; tests give ranks that are threads of one process hosts of their
/// own.
fn local_host_id() -> String {
    #[cfg(test)]
    if let Some(h) = shm_tests::host_override() {
        return h;
    }
    mscclpp_base::env::host_id()
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

fn unspecified_like(a: &SocketAddr) -> std::net::IpAddr {
    if a.is_ipv4() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
    } else {
        std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
    }
}
