//! Endpoints: one side's offer for a connection, exchanged between ranks before connecting.
//!
//! Every endpoint holds a bound TCP listener. For Ethernet it carries the data; for CudaIpc it
//! carries nothing but the connection's liveness, which is how a CudaIpc connection notices a
//! peer that died (the peer-mapped memory itself outlives its owner silently).

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{Error, Result};

use crate::context::TransportContext;
use crate::ib::QpInfo;
use crate::ib::qp::Qp;
use crate::memory::{MAX_HOST_ID, MAX_RANK};
use crate::transport::Transport;

const MAGIC: [u8; 4] = *b"MSEP";
const VERSION: u16 = 1;

/// Largest Ethernet write payload in one frame; larger writes are split.
pub const MAX_FRAME_PAYLOAD: usize = 16 << 20;

/// How a connection is to be made.
#[derive(Debug, Clone)]
pub struct EndpointConfig {
    /// The transport; both sides must offer the same one.
    pub transport: Transport,
    /// Ethernet: bytes read from the source and sent per frame (clamped to
    /// 4 KiB..=[`MAX_FRAME_PAYLOAD`]).
    pub max_write_chunk: usize,
    /// Ethernet: bytes queued for sending before `write` waits for the socket.
    pub max_in_flight: usize,
    /// How long establishing the connection (TCP connect, accept and hello) may take.
    pub connect_timeout: Duration,
    /// Ethernet: how long a `write` may wait for room to queue, a socket send may block, and
    /// the receiver may wait for its stream before answering a flush; past it the connection
    /// fails rather than hanging on a stalled peer. IB: how long a post may wait for room in
    /// the send queue.
    pub io_timeout: Duration,
    /// IB: entries of the send completion queue (at least `ib_max_send_wr`).
    pub ib_max_cq_size: u32,
    /// IB: completions taken per poll.
    pub ib_max_cq_poll_num: u32,
    /// IB: send requests in flight per connection.
    pub ib_max_send_wr: u32,
    /// IB: receives kept posted (no-atomic mode only).
    pub ib_max_recv_wr: u32,
    /// IB: the port's GID table entry used for addressing (RoCE: the RoCEv2 entry, often 3).
    pub ib_gid_index: u8,
    /// IB: signal by RDMA write with immediate data instead of atomic fetch-and-add (for HCAs
    /// or memory where RDMA atomics are unavailable). Both ends must agree.
    pub ib_no_atomic: bool,
}

impl EndpointConfig {
    /// Defaults for `transport`: 4 MiB chunks, 64 MiB in flight, 60 s to connect, 60 s for
    /// any one I/O wait.
    pub fn new(transport: Transport) -> Self {
        EndpointConfig {
            transport,
            max_write_chunk: 4 << 20,
            max_in_flight: 64 << 20,
            connect_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(60),
            ib_max_cq_size: 1024,
            ib_max_cq_poll_num: 16,
            ib_max_send_wr: 512,
            ib_max_recv_wr: 128,
            ib_gid_index: 0,
            ib_no_atomic: false,
        }
    }
}

/// One side's offer, as the other side sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The transport offered.
    pub transport: Transport,
    /// The offering rank.
    pub rank: usize,
    /// Its host id.
    pub host_id: String,
    /// Its device ordinal.
    pub device: usize,
    /// Its listener (data for Ethernet, liveness for CudaIpc).
    pub addr: SocketAddr,
    /// A random value the connecting side must present, so that a stray connection to the
    /// listener is refused.
    pub nonce: [u8; 16],
    /// IB: the address of the QP made for this connection.
    pub ib: Option<QpInfo>,
}

/// This rank's endpoint and the listener behind it; consumed by [`crate::connect`].
pub struct LocalEndpoint {
    pub(crate) ctx: Arc<TransportContext>,
    pub(crate) cfg: EndpointConfig,
    pub(crate) endpoint: Endpoint,
    pub(crate) listener: TcpListener,
    /// IB: the QP, in INIT, that [`crate::connect`] connects.
    pub(crate) ib: Option<Qp>,
}

impl fmt::Debug for LocalEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LocalEndpoint")
            .field("endpoint", &self.endpoint)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl Endpoint {
    /// Creates this rank's endpoint for one connection, binding its listener on the address
    /// `MSCCLPP_SOCKET_IFNAME` names (`ip`, `ifname:ip`, `lo`), else the address of the default
    /// route, else 127.0.0.1.
    #[allow(clippy::new_ret_no_self)]
    pub fn new(ctx: &Arc<TransportContext>, cfg: EndpointConfig) -> Result<LocalEndpoint> {
        cfg.transport.built()?;
        let ip = mscclpp_hal::net::local_ip()?;
        let listener = TcpListener::bind(SocketAddr::new(ip, 0))
            .map_err(|e| Error::io(format!("binding a {} listener on {ip}", cfg.transport), e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("reading the listener's address", e))?;
        let ib = match cfg.transport {
            Transport::Ib(n) => Some(crate::ib::prepare(ctx, &cfg, n)?),
            // The plugin loads (or says why not) before any peer waits on this endpoint.
            Transport::Net(n) => {
                crate::net::prepare(n)?;
                None
            }
            _ => None,
        };
        let endpoint = Endpoint {
            transport: cfg.transport,
            rank: ctx.rank(),
            host_id: ctx.host_id().to_owned(),
            device: ctx.device().info().ordinal,
            addr,
            nonce: nonce(),
            ib: ib.as_ref().map(|q| q.info),
        };
        Ok(LocalEndpoint {
            ctx: ctx.clone(),
            cfg,
            endpoint,
            listener,
            ib,
        })
    }

    /// The encoding another rank decodes with [`Endpoint::from_bytes`].
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut w = Writer::new(MAGIC, VERSION);
        // `Transport::code` is `None` only for IB numbers above 7, which no endpoint holds
        // (`built()` refused them); 255 then decodes as an error rather than as a transport.
        w.u8(self.transport.code().unwrap_or(u8::MAX))
            .u32(self.rank as u32)
            .str(&self.host_id)
            .u32(self.device as u32);
        match self.addr.ip() {
            IpAddr::V4(a) => w.u8(4).raw(&a.octets()),
            IpAddr::V6(a) => w.u8(6).raw(&a.octets()),
        };
        w.u16(self.addr.port()).raw(&self.nonce);
        // Present exactly for IB endpoints; a decoder checks that.
        if let Some(q) = &self.ib {
            q.encode(&mut w);
        }
        w.finish()
    }

    /// Decodes a peer's endpoint.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        const WHAT: &str = "endpoint";
        let mut r = Reader::open(WHAT, bytes, MAGIC, VERSION, VERSION)?;
        let code = r.u8()?;
        let transport = Transport::from_code(code)
            .ok_or_else(|| Error::malformed(WHAT, format!("unknown transport code {code}")))?;
        let rank = r.u32()? as usize;
        if rank > MAX_RANK {
            return Err(Error::malformed(
                WHAT,
                format!("rank {rank} exceeds {MAX_RANK}"),
            ));
        }
        let host_id = r.str("host id", MAX_HOST_ID)?.to_owned();
        let device = r.u32()? as usize;
        let ip = match r.u8()? {
            4 => IpAddr::V4(Ipv4Addr::from(r.array::<4>()?)),
            6 => IpAddr::V6(Ipv6Addr::from(r.array::<16>()?)),
            f => return Err(Error::malformed(WHAT, format!("address family {f}"))),
        };
        let port = r.u16()?;
        let nonce = r.array::<16>()?;
        let ib = match transport {
            Transport::Ib(_) => Some(QpInfo::decode(&mut r)?),
            _ => None,
        };
        r.finish()?;
        Ok(Endpoint {
            transport,
            rank,
            host_id,
            device,
            addr: SocketAddr::new(ip, port),
            nonce,
            ib,
        })
    }
}

impl LocalEndpoint {
    /// The endpoint to send to the peer.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Shorthand for `self.endpoint().to_bytes()`.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.endpoint.to_bytes()
    }

    /// The configuration it was made with.
    pub fn config(&self) -> &EndpointConfig {
        &self.cfg
    }
}

/// 128 bits from the OS's random source, through the standard library's randomly keyed hasher
/// (the only OS randomness std exposes).
fn nonce() -> [u8; 16] {
    let mut out = [0u8; 16];
    for (i, half) in out.chunks_mut(8).enumerate() {
        let mut h = RandomState::new().build_hasher();
        h.write_usize(i);
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_ctx;
    use proptest::prelude::*;

    #[test]
    fn round_trip_v4_and_v6() {
        let ctx = host_ctx(3);
        let local = Endpoint::new(&ctx, EndpointConfig::new(Transport::Ethernet)).unwrap();
        let ep = local.endpoint().clone();
        assert_eq!(ep.rank, 3);
        assert_eq!(Endpoint::from_bytes(&local.to_bytes()).unwrap(), ep);
        let v6 = Endpoint {
            addr: "[::1]:4242".parse().unwrap(),
            transport: Transport::Ib(5),
            ib: Some(QpInfo {
                qpn: 0x1234,
                psn: 77,
                lid: 9,
                gid: [7; 16],
                mtu: 5,
                roce: true,
                atomics: false,
            }),
            ..ep
        };
        assert_eq!(Endpoint::from_bytes(&v6.to_bytes()).unwrap(), v6);
        assert_ne!(nonce(), nonce());
    }

    #[test]
    fn ib_endpoint_without_an_hca_says_so() {
        let ctx = host_ctx(0);
        ctx.use_verbs(crate::ib::fake::FakeVerbs::with_devices(&[]));
        let e = Endpoint::new(&ctx, EndpointConfig::new(Transport::Ib(0)))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("IB0") && e.contains("no RDMA device found ("),
            "{e}"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]
        #[test]
        fn arbitrary_bytes_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..96)) {
            let _ = Endpoint::from_bytes(&buf);
        }

        #[test]
        fn mutated_endpoints_never_panic(at in 0usize..80, x in 1u8..=255) {
            let ep = Endpoint {
                transport: Transport::Ethernet,
                rank: 1,
                host_id: "h".into(),
                device: 0,
                addr: "127.0.0.1:9".parse().unwrap(),
                nonce: [3; 16],
                ib: None,
            };
            let mut b = ep.to_bytes();
            let at = at % b.len();
            b[at] ^= x;
            let _ = Endpoint::from_bytes(&b);
        }
    }
}
