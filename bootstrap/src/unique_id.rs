//! [`UniqueId`]: the root's address and the bootstrap secret, in 128 bytes.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

use mscclpp_base::wire::{Reader, Writer};
use mscclpp_base::{Error, Result};

use super::protocol::{SECRET_BYTES, get_addr, put_addr};

/// Size of an encoded [`UniqueId`]; equal to NCCL's `NCCL_UNIQUE_ID_BYTES` so that one can be
/// carried inside an `ncclUniqueId`.
pub const UNIQUE_ID_BYTES: usize = 128;

const UID_MAGIC: [u8; 4] = *b"MSID";
const UID_VERSION: u16 = 1;
/// magic 4 + version 2 + family 1 + ip 16 + port 2 + secret 16.
const UID_USED: usize = 41;
const UID_PAD: usize = UNIQUE_ID_BYTES - UID_USED;

/// Identifies one bootstrap: the root's listen address and a random secret every rank must
/// present.
///
/// Encoded as exactly [`UNIQUE_ID_BYTES`] bytes (a `wire` message padded with zeros), or as
/// 256 hex digits through `Display`/`FromStr`, e.g. to pass it to child processes in an
/// environment variable.
///
/// [`UniqueId::new`] and [`UniqueId::with_root`] also bind the root's listening socket and
/// park it in this process; the first [`Bootstrap::new`](super::Bootstrap::new) in the same
/// process with this id takes it and runs the root. A process that creates the id but is not
/// itself a rank (a launcher) should use [`BootstrapRoot::start`](super::BootstrapRoot::start)
/// instead, which runs the root right away and owns it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    root: SocketAddr,
    secret: [u8; SECRET_BYTES],
}

/// Root listeners bound by [`UniqueId::new`]/[`UniqueId::with_root`], waiting for a
/// `Bootstrap::new` in this process to run the root on them. Keyed by the id's secret.
fn parked() -> &'static Mutex<HashMap<[u8; SECRET_BYTES], TcpListener>> {
    static PARKED: OnceLock<Mutex<HashMap<[u8; SECRET_BYTES], TcpListener>>> = OnceLock::new();
    PARKED.get_or_init(|| Mutex::new(HashMap::new()))
}

impl UniqueId {
    /// Creates an id with a fresh secret and binds the root's listener on this host's address
    /// (see [`default_root_ip`]) and an ephemeral port.
    pub fn new() -> Result<Self> {
        let ip = default_root_ip()?;
        Self::with_root(SocketAddr::new(ip, 0))
    }

    /// Creates an id with a fresh secret and binds the root's listener on `addr` (port 0 picks
    /// an ephemeral port). The listener is parked in this process until a
    /// [`Bootstrap::new`](super::Bootstrap::new) here takes it.
    pub fn with_root(addr: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .map_err(|e| Error::io(format!("binding the bootstrap root on {addr}"), e))?;
        let root = listener
            .local_addr()
            .map_err(|e| Error::io("reading the bootstrap root's address", e))?;
        let id = UniqueId {
            root,
            secret: random_secret()?,
        };
        lock_parked().insert(id.secret, listener);
        tracing::debug!(%root, "bootstrap root listener bound");
        Ok(id)
    }

    /// An id from its parts, binding nothing: the root must be run by someone else.
    pub(crate) fn from_parts(root: SocketAddr, secret: [u8; SECRET_BYTES]) -> Self {
        UniqueId { root, secret }
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        self.root
    }

    pub(crate) fn secret(&self) -> &[u8; SECRET_BYTES] {
        &self.secret
    }

    /// Closes the root listener this process parked for this id, if it still waits (an id
    /// that will not be used: ranks that try it are refused at once rather than waiting).
    pub fn release_root(&self) {
        drop(lock_parked().remove(&self.secret));
    }

    /// Takes the root listener parked by this process for this id, if there is one.
    pub(crate) fn take_parked_listener(&self) -> Option<TcpListener> {
        lock_parked().remove(&self.secret)
    }

    /// The 128-byte encoding.
    pub fn to_bytes(&self) -> [u8; UNIQUE_ID_BYTES] {
        let mut w = Writer::new(UID_MAGIC, UID_VERSION);
        put_addr(&mut w, &self.root);
        w.raw(&self.secret);
        let v = w.finish();
        let mut out = [0u8; UNIQUE_ID_BYTES];
        let n = v.len().min(UNIQUE_ID_BYTES);
        out[..n].copy_from_slice(&v[..n]);
        out
    }

    /// Decodes the 128-byte encoding; rejects a wrong length, magic, version or padding.
    pub fn from_bytes(buf: &[u8]) -> Result<Self> {
        const WHAT: &str = "bootstrap unique id";
        if buf.len() != UNIQUE_ID_BYTES {
            return Err(Error::malformed(
                WHAT,
                format!("expected {UNIQUE_ID_BYTES} bytes, found {}", buf.len()),
            ));
        }
        let mut r = Reader::open(WHAT, buf, UID_MAGIC, UID_VERSION, UID_VERSION)?;
        let root = get_addr(&mut r, WHAT)?;
        let secret = r.array::<SECRET_BYTES>()?;
        let pad = r.array::<UID_PAD>()?;
        r.finish()?;
        if pad.iter().any(|&b| b != 0) {
            return Err(Error::malformed(WHAT, "non-zero padding"));
        }
        Ok(UniqueId { root, secret })
    }
}

fn lock_parked() -> std::sync::MutexGuard<'static, HashMap<[u8; SECRET_BYTES], TcpListener>> {
    // A panic elsewhere while holding the lock leaves the map itself consistent.
    parked().lock().unwrap_or_else(|p| p.into_inner())
}

impl fmt::Debug for UniqueId {
    // The secret stays out of logs.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root)
            .field("secret", &"<hidden>")
            .finish()
    }
}

impl fmt::Display for UniqueId {
    /// 256 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.to_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl FromStr for UniqueId {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let s = s.trim();
        if s.len() != 2 * UNIQUE_ID_BYTES || !s.is_ascii() {
            return Err(Error::malformed(
                "bootstrap unique id",
                format!(
                    "expected {} hex digits, found {} characters",
                    2 * UNIQUE_ID_BYTES,
                    s.chars().count()
                ),
            ));
        }
        let mut buf = [0u8; UNIQUE_ID_BYTES];
        for (i, out) in buf.iter_mut().enumerate() {
            let pair = &s[2 * i..2 * i + 2];
            *out = u8::from_str_radix(pair, 16).map_err(|_| {
                Error::malformed(
                    "bootstrap unique id",
                    format!("{pair:?} at offset {} is not hex", 2 * i),
                )
            })?;
        }
        UniqueId::from_bytes(&buf)
    }
}

pub(crate) fn random_secret() -> Result<[u8; SECRET_BYTES]> {
    let mut s = [0u8; SECRET_BYTES];
    getrandom::fill(&mut s).map_err(|e| {
        Error::unavailable("operating-system random numbers", format!("getrandom: {e}"))
    })?;
    Ok(s)
}

/// Derives a 16-byte secret from a string (two FNV-1a-64 passes with different offsets).
///
/// Not cryptographic: it only turns `MSCCLPP_BOOTSTRAP_SECRET` (or the fixed project string)
/// into the secret field. Anyone who knows the string can join, which is why `ip:port`
/// bootstraps are weaker than [`UniqueId`]s with random secrets.
pub(crate) fn derive_secret(s: &str) -> [u8; SECRET_BYTES] {
    fn fnv(seed: u64, data: &[u8]) -> u64 {
        let mut h = seed;
        for &b in data {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
    let a = fnv(0xcbf2_9ce4_8422_2325, s.as_bytes());
    let b = fnv(0x6c62_272e_07bb_0142, s.as_bytes());
    let mut out = [0u8; SECRET_BYTES];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

/// A parsed `"[ifname:]host:port"` string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootSpec {
    pub ifname: Option<String>,
    pub addr: SocketAddr,
}

/// Parses `"[ifname:]host:port"`; host is an IPv4 address, a bracketed IPv6 address or a name
/// (resolved, IPv4 preferred). `ifname`, when given, must exist in `/sys/class/net`.
pub(crate) fn parse_root_spec(s: &str) -> Result<RootSpec> {
    let s = s.trim();
    let bad = |why: &str| {
        Error::invalid(format!(
            "bootstrap address {s:?}: {why}; expected \"[ifname:]ip:port\" (IPv6 as [addr]:port)"
        ))
    };
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(RootSpec { ifname: None, addr });
    }
    // An interface prefix is whatever precedes the first ':' when what follows still has a
    // port of its own.
    let (ifname, rest) = match s.split_once(':') {
        Some((head, tail)) if tail.contains(':') && !head.starts_with('[') => {
            (Some(head.to_owned()), tail)
        }
        _ => (None, s),
    };
    if let Some(name) = &ifname {
        mscclpp_base::net::check_interface(name)?;
    }
    let addr = match rest.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            let (host, port) = rest.rsplit_once(':').ok_or_else(|| bad("no port"))?;
            let port: u16 = port
                .parse()
                .map_err(|_| bad("the port is not a number in 0..=65535"))?;
            if host.is_empty() {
                return Err(bad("no host"));
            }
            let addrs: Vec<SocketAddr> = (host, port)
                .to_socket_addrs()
                .map_err(|e| Error::io(format!("resolving bootstrap host {host:?}"), e))?
                .collect();
            addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or_else(|| addrs.first())
                .copied()
                .ok_or_else(|| bad("the host name resolves to no address"))?
        }
    };
    Ok(RootSpec { ifname, addr })
}

/// The IP a root created by [`UniqueId::new`] listens on: [`mscclpp_base::net::local_ip`]
/// (`MSCCLPP_SOCKET_IFNAME`, else the default route's address, else 127.0.0.1).
pub fn default_root_ip() -> Result<IpAddr> {
    mscclpp_base::net::local_ip()
}
