//! TCP bootstrap: rendezvous of `nranks` processes and small out-of-band messages between them.
//!
//! # How ranks meet
//!
//! 1. A *root* listens on a known address. Every rank connects to it and sends a Hello (the
//!    bootstrap secret, its rank, `nranks`, and the address of its own listener). The root
//!    refuses — with an Error frame naming the reason — connections with a wrong secret, a
//!    different `nranks`, an out-of-range or duplicate rank, or bytes that do not decode, and
//!    keeps waiting for the legitimate ranks. Once all have joined it sends each one the table
//!    of listen addresses and exits.
//! 2. Each rank connects to every higher rank (sending a Hello the acceptor validates the same
//!    way, answered by an Ack) and accepts every lower one: a full mesh of TCP connections.
//! 3. One reader thread per connection files incoming messages under `(peer, tag)`; waits
//!    take them from there. A connection that ends marks its peer dead, and every current and
//!    future operation involving that peer fails at once with `Error::Remote`.
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
mod root;
mod unique_id;

#[cfg(test)]
mod tests;

use std::collections::{HashMap, VecDeque};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
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
}

impl Default for BootstrapConfig {
    /// 60 s and 1 GiB, without looking at the environment (see [`BootstrapConfig::from_env`]).
    fn default() -> Self {
        BootstrapConfig {
            timeout: Duration::from_secs(60),
            max_frame_bytes: 1 << 30,
        }
    }
}

impl BootstrapConfig {
    /// The defaults, with `MSCCLPP_BOOTSTRAP_TIMEOUT` (seconds) applied when set.
    ///
    /// Also checks `MSCCLPP_SOCKET_IFNAME` when it is set, so that a name that does not exist
    /// fails every process that joins a bootstrap (a launching parent, its ranks, launched
    /// ranks) rather than only the ones that happen to listen through it.
    pub fn from_env() -> Result<Self> {
        if mscclpp_hal::env::get("MSCCLPP_SOCKET_IFNAME").is_some() {
            mscclpp_hal::net::local_ip()?;
        }
        let mut c = Self::default();
        if let Some(t) = mscclpp_hal::env::seconds("MSCCLPP_BOOTSTRAP_TIMEOUT")? {
            c.timeout = t;
        }
        Ok(c)
    }
}

/// A connected group of ranks that can exchange small messages; see the [module
/// docs](self). `Send + Sync`: operations may be called from several threads.
pub struct Bootstrap {
    rank: usize,
    nranks: usize,
    local_rank: Option<usize>,
    cfg: BootstrapConfig,
    shared: Arc<Shared>,
    readers: Vec<JoinHandle<()>>,
    coll_seq: AtomicU64,
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bootstrap")
            .field("rank", &self.rank)
            .field("nranks", &self.nranks)
            .field("local_rank", &self.local_rank)
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

struct Shared {
    state: Mutex<State>,
    cv: Condvar,
    /// Write halves, index = peer; `None` for this rank.
    writers: Vec<Option<Mutex<TcpStream>>>,
    closing: AtomicBool,
}

struct State {
    queues: HashMap<(usize, u64), VecDeque<Vec<u8>>>,
    /// Why each peer's connection ended, if it did.
    dead: Vec<Option<String>>,
    /// Dead peers in the order their connections ended: a collective names the first, which is
    /// the cause when the others only followed it.
    dead_order: Vec<usize>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // State stays consistent across a panicking holder: every update is a single insert.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn mark_dead(&self, peer: usize, reason: String) {
        let mut st = self.lock();
        if let Some(slot) = st.dead.get_mut(peer)
            && slot.is_none()
        {
            *slot = Some(reason);
            st.dead_order.push(peer);
        }
        drop(st);
        self.cv.notify_all();
    }
}

fn lost(peer: usize, reason: &str) -> Error {
    Error::Remote {
        rank: peer,
        message: format!("connection lost: {reason}"),
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
            Some(l) => Some(BootstrapRoot::spawn(l, *uid.secret(), nranks, cfg.clone())?),
            None => None,
        };
        Self::establish(uid, rank, nranks, cfg, root, None)
    }

    /// Joins the bootstrap whose root is `"[ifname:]ip:port"`; rank 0 binds that address and
    /// runs the root. `ifname`, if given, must exist (it is checked in `/sys/class/net`); the
    /// address used is the given ip. The secret comes from `MSCCLPP_BOOTSTRAP_SECRET`, else
    /// from a fixed string (see the module docs on why this is weaker than a [`UniqueId`]).
    pub fn from_addr(addr: &str, rank: usize, nranks: usize, cfg: BootstrapConfig) -> Result<Self> {
        let secret = mscclpp_hal::env::get("MSCCLPP_BOOTSTRAP_SECRET");
        let secret = secret.as_deref().unwrap_or(DEFAULT_SECRET_STRING);
        Self::from_addr_with_secret(addr, secret, rank, nranks, cfg, None)
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
        Self::establish(&uid, rank, nranks, cfg, root, local_rank)
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
        let secret = mscclpp_hal::env::get("MSCCLPP_BOOTSTRAP_SECRET");
        let secret = secret.as_deref().unwrap_or(DEFAULT_SECRET_STRING);
        Self::from_addr_with_secret(
            &root,
            secret,
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
    ) -> Result<Self> {
        let span = tracing::info_span!("bootstrap", rank, nranks, root = %uid.root_addr());
        let _g = span.enter();
        let result = Self::rendezvous(uid, rank, nranks, &cfg, local_rank);
        match (result, root) {
            (Ok(b), Some(root)) => {
                // Every rank has the table (each one is in our mesh), so the root is done or
                // finishing its last writes.
                if let Err(e) = root.wait() {
                    tracing::warn!(error = %e, "bootstrap root ended with an error after the mesh formed");
                }
                Ok(b)
            }
            (Ok(b), None) => Ok(b),
            (Err(e), Some(root)) => {
                // The root's own error names the missing ranks; prefer it to ours. When we timed
                // out, the root (started just before us, with the same deadline) is at its own
                // deadline too: let it finish, so that its error says who is missing, instead of
                // stopping it first (which races with that deadline). Any other failure of ours
                // stops it at once.
                if !matches!(e, Error::Timeout { .. }) {
                    root.stop();
                }
                match root.wait() {
                    Err(re @ Error::Timeout { .. }) => Err(re),
                    _ => Err(e),
                }
            }
            (Err(e), None) => Err(e),
        }
    }

    fn rendezvous(
        uid: &UniqueId,
        rank: usize,
        nranks: usize,
        cfg: &BootstrapConfig,
        local_rank: Option<usize>,
    ) -> Result<Self> {
        let deadline = Instant::now() + cfg.timeout;
        let root_addr = uid.root_addr();
        let mut to_root = connect_retry(root_addr, deadline, cfg.timeout, "the bootstrap root")?;
        // Listen on the address this host reaches the root from: it is routable from there.
        let local_ip = to_root
            .local_addr()
            .map_err(|e| Error::io("reading the local address of the root connection", e))?
            .ip();
        let listener = TcpListener::bind(SocketAddr::new(local_ip, 0)).map_err(|e| {
            Error::io(
                format!("binding this rank's bootstrap listener on {local_ip}"),
                e,
            )
        })?;
        let listen = listener
            .local_addr()
            .map_err(|e| Error::io("reading this rank's listen address", e))?;
        let hello = Hello {
            role: HelloRole::Root,
            secret: *uid.secret(),
            rank,
            nranks,
            listen,
        };
        write_frame(&mut to_root, FrameKind::Hello, 0, &encode_hello(&hello)).map_err(|e| {
            Error::io(
                format!("sending the hello to the bootstrap root at {root_addr}"),
                e,
            )
        })?;
        tracing::debug!(%listen, "registered with the bootstrap root");
        let table_max = 64 + nranks.saturating_mul(24);
        let table = match read_reply(
            &mut to_root,
            deadline,
            cfg.timeout,
            table_max,
            "the bootstrap root's address table",
        )? {
            (FrameKind::Table, payload) => decode_table(&payload, nranks)?,
            (kind, _) => {
                return Err(Error::malformed(
                    "bootstrap handshake",
                    format!("the root sent a {kind:?} frame where the address table was expected"),
                ));
            }
        };
        drop(to_root);

        let conns = form_mesh(&listener, &table, uid, rank, nranks, cfg, deadline)?;
        drop(listener);
        tracing::info!("bootstrap mesh formed");
        Self::start(rank, nranks, local_rank, cfg.clone(), conns)
    }

    fn start(
        rank: usize,
        nranks: usize,
        local_rank: Option<usize>,
        cfg: BootstrapConfig,
        conns: Vec<Option<TcpStream>>,
    ) -> Result<Self> {
        let mut writers = Vec::with_capacity(nranks);
        let mut readers_streams = Vec::new();
        for (peer, c) in conns.into_iter().enumerate() {
            match c {
                None => writers.push(None),
                Some(s) => {
                    let conf = s
                        .set_read_timeout(None)
                        .and_then(|()| s.set_write_timeout(Some(cfg.timeout)))
                        .and_then(|()| s.set_nodelay(true))
                        .and_then(|()| s.try_clone());
                    let r = conf.map_err(|e| {
                        Error::io(format!("configuring the connection to rank {peer}"), e)
                    })?;
                    readers_streams.push((peer, r));
                    writers.push(Some(Mutex::new(s)));
                }
            }
        }
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                queues: HashMap::new(),
                dead: vec![None; nranks],
                dead_order: Vec::new(),
            }),
            cv: Condvar::new(),
            writers,
            closing: AtomicBool::new(false),
        });
        let mut b = Bootstrap {
            rank,
            nranks,
            local_rank,
            cfg,
            shared,
            readers: Vec::new(),
            coll_seq: AtomicU64::new(0),
        };
        for (peer, stream) in readers_streams {
            let shared = Arc::clone(&b.shared);
            let max = b.cfg.max_frame_bytes;
            let t = std::thread::Builder::new()
                .name(format!("mscclpp-bootstrap-r{rank}-p{peer}"))
                .spawn(move || reader_loop(&shared, peer, stream, max))
                .map_err(|e| Error::io("starting a bootstrap reader thread", e))?;
            // On error above, Drop of `b` shuts down and joins the readers started so far.
            b.readers.push(t);
        }
        Ok(b)
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

    /// Sends `data` to `peer` under `tag`. Returns once the bytes are handed to the kernel.
    pub fn send(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        check_user_tag(tag)?;
        self.send_raw(peer, tag, data)
    }

    /// Receives the oldest message from `peer` under `tag`, waiting up to the deadline.
    pub fn recv(&self, peer: usize, tag: u64) -> Result<Vec<u8>> {
        check_user_tag(tag)?;
        self.check_peer(peer)?;
        let mut got = self.wait_all(&[peer], tag, "recv")?;
        got.pop()
            .ok_or_else(|| Error::Internal("recv: wait returned no message".into()))
    }

    /// Gathers every rank's `data` (lengths may differ); the result is indexed by rank.
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.gather_impl(data, 1, "all_gather")
    }

    /// Returns once every rank has entered the barrier.
    pub fn barrier(&self) -> Result<()> {
        self.gather_impl(&[], 2, "barrier").map(|_| ())
    }

    /// Returns `root`'s `data` on every rank (`data` is ignored on the others).
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(root)?;
        let tag = self.next_coll_tag(3);
        tracing::debug!(
            rank = self.rank,
            root,
            bytes = data.len(),
            "bootstrap broadcast"
        );
        if root == self.rank {
            for peer in (0..self.nranks).filter(|&p| p != self.rank) {
                self.send_raw(peer, tag, data)?;
            }
            Ok(data.to_vec())
        } else {
            let mut got = self.wait_all(&[root], tag, "broadcast")?;
            got.pop()
                .ok_or_else(|| Error::Internal("broadcast: wait returned no message".into()))
        }
    }

    fn gather_impl(&self, data: &[u8], op: u64, name: &str) -> Result<Vec<Vec<u8>>> {
        let tag = self.next_coll_tag(op);
        tracing::debug!(
            rank = self.rank,
            bytes = data.len(),
            op = name,
            "bootstrap collective"
        );
        let peers: Vec<usize> = (0..self.nranks).filter(|&p| p != self.rank).collect();
        for &peer in &peers {
            self.send_raw(peer, tag, data)?;
        }
        let got = self.wait_all(&peers, tag, name)?;
        let mut out = Vec::with_capacity(self.nranks);
        let mut it = got.into_iter();
        for r in 0..self.nranks {
            if r == self.rank {
                out.push(data.to_vec());
            } else {
                out.push(it.next().unwrap_or_default());
            }
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

    fn send_raw(&self, peer: usize, tag: u64, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        if data.len() > self.cfg.max_frame_bytes {
            return Err(Error::invalid(format!(
                "bootstrap message of {} bytes exceeds max_frame_bytes = {}",
                data.len(),
                self.cfg.max_frame_bytes
            )));
        }
        tracing::debug!(
            rank = self.rank,
            peer,
            tag,
            bytes = data.len(),
            "bootstrap send"
        );
        let Some(Some(writer)) = self.shared.writers.get(peer) else {
            // To ourselves: straight into the queue.
            let mut st = self.shared.lock();
            st.queues
                .entry((peer, tag))
                .or_default()
                .push_back(data.to_vec());
            drop(st);
            self.shared.cv.notify_all();
            return Ok(());
        };
        if let Some(reason) = &self.shared.lock().dead[peer] {
            return Err(lost(peer, reason));
        }
        let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
        match write_frame(&mut *w, FrameKind::Data, tag, data) {
            Ok(()) => Ok(()),
            Err(e) => {
                // A partly written frame leaves the stream unusable either way.
                let _ = w.shutdown(std::net::Shutdown::Both);
                drop(w);
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) {
                    self.shared.mark_dead(
                        peer,
                        format!("a send timed out after {:?}", self.cfg.timeout),
                    );
                    Err(Error::Timeout {
                        waiting_for: format!(
                            "rank {peer} to accept a {} byte message (tag {tag:#x})",
                            data.len()
                        ),
                        after: self.cfg.timeout,
                    })
                } else {
                    let reason = format!("send failed: {e}");
                    self.shared.mark_dead(peer, reason.clone());
                    Err(lost(peer, &reason))
                }
            }
        }
    }

    /// Waits for one message under `tag` from each of `peers`; returns them in that order.
    /// Fails as soon as a peer still owing a message is dead, naming the first to have died.
    fn wait_all(&self, peers: &[usize], tag: u64, op: &str) -> Result<Vec<Vec<u8>>> {
        let deadline = Instant::now() + self.cfg.timeout;
        let mut got: Vec<Option<Vec<u8>>> = vec![None; peers.len()];
        let mut st = self.shared.lock();
        loop {
            for (i, &p) in peers.iter().enumerate() {
                if got[i].is_none()
                    && let Some(q) = st.queues.get_mut(&(p, tag))
                {
                    got[i] = q.pop_front();
                    if q.is_empty() {
                        st.queues.remove(&(p, tag));
                    }
                }
            }
            let missing: Vec<usize> = peers
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
            if let Some(&p) = st.dead_order.iter().find(|p| missing.contains(p)) {
                let reason = st.dead[p].clone().unwrap_or_default();
                return Err(lost(p, &format!("{reason} (during {op})")));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::Timeout {
                    waiting_for: format!(
                        "{op}: a message with tag {tag:#x} from rank(s) {missing:?}"
                    ),
                    after: self.cfg.timeout,
                });
            }
            st = self
                .shared
                .cv
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Release);
        for w in self.shared.writers.iter().flatten() {
            let w = w.lock().unwrap_or_else(|p| p.into_inner());
            let _ = w.shutdown(std::net::Shutdown::Both);
        }
        for t in self.readers.drain(..) {
            let _ = t.join();
        }
    }
}

fn reader_loop(shared: &Shared, peer: usize, mut stream: TcpStream, max: usize) {
    let addr = stream
        .peer_addr()
        .map_or_else(|_| "the peer".to_owned(), |a| a.to_string());
    let reason = loop {
        match read_frame(&mut stream, max) {
            Ok((h, payload)) if h.kind == FrameKind::Data => {
                let mut st = shared.lock();
                st.queues
                    .entry((peer, h.tag))
                    .or_default()
                    .push_back(payload);
                drop(st);
                shared.cv.notify_all();
            }
            Ok((h, payload)) if h.kind == FrameKind::Error => {
                break match decode_error(&payload) {
                    Ok((_, msg)) => format!("the peer reported: {msg}"),
                    Err(e) => format!("the peer sent an undecodable error report: {e}"),
                };
            }
            Ok((h, _)) => break format!("unexpected {:?} frame after setup", h.kind),
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                break format!("{addr} {}", protocol::describe_read_error(&e));
            }
            Err(e) => break from_io(e, format!("reading from {addr}")).to_string(),
        }
    };
    let _ = stream.shutdown(std::net::Shutdown::Both);
    if !shared.closing.load(Ordering::Acquire) {
        tracing::debug!(peer, %reason, "bootstrap connection ended");
    }
    shared.mark_dead(peer, reason);
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

/// Connects to `addr`, retrying while it is not listening yet, until `deadline`.
fn connect_retry(
    addr: SocketAddr,
    deadline: Instant,
    timeout: Duration,
    what: &str,
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

/// Connects to every higher rank and accepts every lower one, concurrently.
fn form_mesh(
    listener: &TcpListener,
    table: &[SocketAddr],
    uid: &UniqueId,
    rank: usize,
    nranks: usize,
    cfg: &BootstrapConfig,
    deadline: Instant,
) -> Result<Vec<Option<TcpStream>>> {
    let span = tracing::debug_span!("bootstrap_mesh");
    let _g = span.enter();
    let stop = AtomicBool::new(false);
    let secret = uid.secret();
    let (accepted, connected) = std::thread::scope(|s| {
        let acceptor = s.spawn(|| {
            let expect = root::Expect {
                role: HelloRole::Peer,
                secret,
                nranks,
                ranks: 0..rank,
                who: format!("rank {rank}"),
                hello_limit: root::HELLO_LIMIT,
            };
            let acc = root::accept_ranks(listener, &expect, deadline, cfg.timeout, &stop);
            if let Some(e) = acc.error {
                return Err(e);
            }
            let mut out: Vec<Option<TcpStream>> = Vec::with_capacity(nranks);
            for c in acc.conns {
                out.push(match c {
                    None => None,
                    Some((mut stream, h)) => {
                        write_frame(&mut stream, FrameKind::Ack, 0, &[])
                            .map_err(|e| lost(h.rank, &format!("acknowledging its hello: {e}")))?;
                        Some(stream)
                    }
                });
            }
            Ok(out)
        });
        let mut connected: Vec<(usize, TcpStream)> = Vec::new();
        let mut conn_err = None;
        for (peer, &addr) in table.iter().enumerate().skip(rank + 1) {
            match connect_peer(addr, peer, uid, rank, nranks, cfg, deadline) {
                Ok(st) => connected.push((peer, st)),
                Err(e) => {
                    conn_err = Some(e);
                    stop.store(true, Ordering::Release);
                    break;
                }
            }
        }
        let accepted = acceptor
            .join()
            .unwrap_or_else(|_| Err(Error::Internal("bootstrap mesh acceptor panicked".into())));
        (accepted, conn_err.map_or(Ok(connected), Err))
    });
    let connected = connected?;
    let mut conns = accepted?;
    conns.resize_with(nranks, || None);
    for (peer, s) in connected {
        conns[peer] = Some(s);
    }
    Ok(conns)
}

fn connect_peer(
    addr: SocketAddr,
    peer: usize,
    uid: &UniqueId,
    rank: usize,
    nranks: usize,
    cfg: &BootstrapConfig,
    deadline: Instant,
) -> Result<TcpStream> {
    let mut s = connect_retry(addr, deadline, cfg.timeout, &format!("rank {peer}"))?;
    let hello = Hello {
        role: HelloRole::Peer,
        secret: *uid.secret(),
        rank,
        nranks,
        listen: s
            .local_addr()
            .map_err(|e| Error::io("reading a local address", e))?,
    };
    write_frame(&mut s, FrameKind::Hello, 0, &encode_hello(&hello))
        .map_err(|e| lost(peer, &format!("sending the hello: {e}")))?;
    match read_reply(
        &mut s,
        deadline,
        cfg.timeout,
        0,
        &format!("rank {peer}'s acknowledgement"),
    )
    .map_err(|e| match e {
        Error::Remote { message, .. } => Error::Remote {
            rank: peer,
            message,
        },
        other => other,
    })? {
        (FrameKind::Ack, _) => {
            tracing::debug!(peer, "bootstrap mesh connection up");
            Ok(s)
        }
        (kind, _) => Err(Error::malformed(
            "bootstrap handshake",
            format!("rank {peer} answered the hello with a {kind:?} frame"),
        )),
    }
}
