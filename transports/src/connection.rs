//! The closed set [`AnyConnection`] the proxy dispatches over, the table of what each transport
//! does to make an endpoint and to join two ([`TransportOps`]), and [`connect`], which picks the
//! transport for a pair of ranks. The [`Connection`] trait it dispatches is [`crate::ops`]'s.
//!
//! This is the one place that names every transport: making an endpoint (`endpoint.rs`) and
//! connecting pick a transport's steps from the table, and the transports themselves read
//! endpoints (`offer.rs`) without depending on the code that chose them.

use std::sync::Arc;
// `Duration` and `RegisteredMemory` appear in the trait's signatures, which `enum_dispatch`
// repeats in the impl it writes here.
use std::time::Duration;

use enum_dispatch::enum_dispatch;
use mscclpp_hal::{Error, Result};

use crate::context::TransportContext;
use crate::cuda_ipc::CudaIpcConnection;
use crate::ethernet::EthernetConnection;
use crate::ib::IbConnection;
use crate::ib::qp::Qp;
use crate::memory::RegisteredMemory;
use crate::offer::{Endpoint, EndpointConfig, LocalEndpoint};
use crate::ops::Connection;
use crate::transport::Transport;

/// Every connection kind this build has, dispatched without a virtual call in the proxy's hot
/// loop.
#[enum_dispatch(Connection)]
#[derive(Debug)]
pub enum AnyConnection {
    /// Device IPC on one host.
    CudaIpc(CudaIpcConnection),
    /// TCP.
    Ethernet(EthernetConnection),
    /// RDMA through an HCA.
    Ib(IbConnection),
}

/// Connects this rank's `local` endpoint with a peer's `remote` one. Both ranks call it with
/// each other's endpoints (exchanged through the bootstrap); the lower rank dials, the higher
/// accepts. Refused, naming both ranks and what each offered, when the transports differ, when
/// CudaIpc is asked between two hosts, or when the transport is not built.
pub fn connect(local: LocalEndpoint, remote: &Endpoint) -> Result<AnyConnection> {
    select(local.endpoint(), remote)?;
    let (me, peer) = (local.endpoint.rank, remote.rank);
    let started = std::time::Instant::now();
    let (ops, n) = TransportOps::of(remote.transport);
    let conn = (ops.connect)(local, remote, n)?;
    tracing::debug!(
        rank = me,
        peer,
        transport = %remote.transport,
        elapsed = ?started.elapsed(),
        "connected"
    );
    Ok(conn)
}

/// Whether `local` and `remote` can be connected; the error names both ranks.
pub(crate) fn select(local: &Endpoint, remote: &Endpoint) -> Result<()> {
    let (a, b) = (local.rank, remote.rank);
    if a == b {
        return Err(Error::invalid(format!(
            "rank {a} asked for a connection to itself: connections join two different ranks"
        )));
    }
    for ep in [local, remote] {
        if let Err(e) = ep.transport.built() {
            return Err(Error::unavailable(
                format!(
                    "a {} connection between rank {a} and rank {b}",
                    ep.transport
                ),
                format!("rank {} offered {}: {e}", ep.rank, ep.transport),
            ));
        }
    }
    if local.transport != remote.transport {
        return Err(Error::invalid(format!(
            "cannot connect rank {a} and rank {b}: rank {a} offered {}, rank {b} offered {}",
            local.transport, remote.transport
        )));
    }
    (TransportOps::of(local.transport).0.can_connect)(local, remote)
}

/// What one transport does to make an endpoint and to join two; a row of the table
/// [`TransportOps::of`] picks from. `n` is the transport's device (IBn, Netn; 0 for the others).
pub(crate) struct TransportOps {
    /// Refuses a pair of endpoints of this transport that it cannot join, after the checks
    /// every transport shares ([`select`]); the error names both ranks.
    pub can_connect: fn(local: &Endpoint, remote: &Endpoint) -> Result<()>,
    /// Runs, while the endpoint is made, what must exist before any peer sees it; the QP an IB
    /// endpoint carries.
    pub prepare: fn(ctx: &Arc<TransportContext>, cfg: &EndpointConfig, n: u8) -> Result<Option<Qp>>,
    /// Joins `local` and `remote`, which [`select`] accepted.
    pub connect: fn(local: LocalEndpoint, remote: &Endpoint, n: u8) -> Result<AnyConnection>,
}

impl TransportOps {
    /// The row of `transport` and its device number.
    pub(crate) fn of(transport: Transport) -> (&'static TransportOps, u8) {
        match transport {
            Transport::CudaIpc => (&CUDA_IPC, 0),
            Transport::Ethernet => (&ETHERNET, 0),
            Transport::Ib(n) => (&IB, n),
            Transport::Net(n) => (&NET, n),
        }
    }
}

static CUDA_IPC: TransportOps = TransportOps {
    can_connect: one_host,
    prepare: |_, _, _| Ok(None),
    connect: |local, remote, _| Ok(CudaIpcConnection::connect(local, remote)?.into()),
};

static ETHERNET: TransportOps = TransportOps {
    can_connect: |_, _| Ok(()),
    prepare: |_, _, _| Ok(None),
    connect: |local, remote, _| Ok(EthernetConnection::connect(local, remote)?.into()),
};

static IB: TransportOps = TransportOps {
    can_connect: |_, _| Ok(()),
    prepare: |ctx, cfg, n| Ok(Some(crate::ib::prepare(ctx, cfg, n)?)),
    connect: |local, remote, _| Ok(IbConnection::connect(local, remote)?.into()),
};

static NET: TransportOps = TransportOps {
    can_connect: |_, _| Ok(()),
    // The plugin loads (or says why not) before any peer waits on this endpoint.
    prepare: |_, _, n| {
        crate::net::prepare(n)?;
        Ok(None)
    },
    // The Ethernet protocol over the plugin's comms: one connection type for both.
    connect: |local, remote, n| Ok(crate::net::connect(local, remote, n)?.into()),
};

/// CudaIpc maps the peer's memory: both ranks must be on one host.
fn one_host(local: &Endpoint, remote: &Endpoint) -> Result<()> {
    let (a, b) = (local.rank, remote.rank);
    if local.host_id != remote.host_id {
        return Err(Error::invalid(format!(
            "cannot connect rank {a} and rank {b} over CudaIpc: rank {a} is on host {:?}, rank {b} on host {:?}; CudaIpc needs one host (use Ethernet or IB between hosts)",
            local.host_id, remote.host_id
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(rank: usize, transport: Transport, host: &str) -> Endpoint {
        Endpoint {
            transport,
            rank,
            host_id: host.into(),
            device: 0,
            addr: "127.0.0.1:9".parse().unwrap(),
            nonce: [0; 16],
            ib: None,
        }
    }

    #[test]
    fn selection_errors_name_both_ranks() {
        let e = select(
            &ep(2, Transport::Ethernet, "h"),
            &ep(5, Transport::CudaIpc, "h"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 2 offered Ethernet") && e.contains("rank 5 offered CudaIpc"),
            "{e}"
        );
        let e = select(
            &ep(2, Transport::CudaIpc, "a"),
            &ep(5, Transport::CudaIpc, "b"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 2 is on host \"a\"") && e.contains("rank 5 on host \"b\""),
            "{e}"
        );
        let e = select(
            &ep(2, Transport::Ethernet, "h"),
            &ep(5, Transport::Ib(1), "h"),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("rank 2") && e.contains("rank 5 offered IB1"),
            "{e}"
        );
        assert!(
            select(
                &ep(3, Transport::Ethernet, "h"),
                &ep(3, Transport::Ethernet, "h")
            )
            .is_err()
        );
        assert!(
            select(
                &ep(0, Transport::Ethernet, "a"),
                &ep(1, Transport::Ethernet, "b")
            )
            .is_ok()
        );
    }
}
