//! What an endpoint is: one side's offer for a connection ([`Endpoint`], its wire encoding, and
//! the [`EndpointConfig`] it was made with), and this rank's side of it ([`LocalEndpoint`]), as
//! every transport reads them when it connects.
//!
//! Every endpoint holds a bound TCP listener. For Ethernet it carries the data; for CudaIpc it
//! carries nothing but the connection's liveness, which is how a CudaIpc connection notices a
//! peer that died (the peer-mapped memory itself outlives its owner silently).
//!
//! Making an endpoint, which picks what its transport prepares, is `endpoint.rs`'s; this file
//! names no transport's code (only IB's QP types, which an IB endpoint carries), so that the
//! transports can use it without depending on what chooses among them.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{Error, Result};

use crate::context::TransportContext;
use crate::ib::qp::{Qp, QpInfo};
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
