//! # mscclpp-transports — how bytes move between two ranks
//!
//! MSCCL++'s connection layer over the HAL:
//!
//! - [`Transport`] and [`TransportFlags`]: the transports by MSCCL++'s names (CudaIpc, IB0..IB7,
//!   Ethernet) and sets of them.
//! - [`TransportContext`]: one per rank and communicator; its identity (rank, device, host id)
//!   and the registry of memory an Ethernet peer may write into.
//! - [`RegisteredMemory`]: a local byte range made reachable by transports, and its descriptor,
//!   which a peer decodes (mapping it over IPC for CudaIpc on one host).
//! - [`Endpoint`] / [`LocalEndpoint`] / [`EndpointConfig`]: one side's offer for a connection,
//!   exchanged through the bootstrap; [`connect`] joins two and picks the transport.
//! - [`Connection`] (`write`, `update_and_sync`, `flush`) and [`AnyConnection`], the closed set
//!   the proxy dispatches over: [`CudaIpcConnection`] (copies into peer-mapped memory on a HAL
//!   stream) and [`EthernetConnection`] (TCP; the receiver lands data through the HAL).
//!
//! Every byte that crosses a process goes through [`mscclpp_hal::wire`]: descriptors,
//! endpoints, the connection hello and Ethernet frame headers are versioned and bounded, and
//! decoding garbage is an error. A peer that dies turns every later operation of its
//! connections, and any waiting flush, into [`mscclpp_hal::Error::Remote`] naming it.
//! [`IbConnection`] (IB0..IB7) opens libibverbs at run time; on a machine without an HCA,
//! asking for IBn fails at once with `no RDMA device found (…)`. [`net`] (Net0..Net5) runs the
//! Ethernet protocol over an NCCL net plugin opened at run time (`NCCL_NET_PLUGIN`).
#![deny(unsafe_op_in_unsafe_fn)]

// `ops` (the `Connection` trait) comes first: `enum_dispatch` must expand the trait before the
// enum that dispatches it (in `connection`), so that the dispatch code lands beside the enum.
mod ops;

mod connection;
mod context;
mod cuda_ipc;
mod endpoint;
mod ethernet;
mod flags;
mod ib;
mod link;
mod memory;
pub mod net;
mod offer;
mod transport;

pub use connection::{AnyConnection, connect};
pub use context::TransportContext;
pub use cuda_ipc::CudaIpcConnection;
pub use ethernet::EthernetConnection;
pub use flags::TransportFlags;
pub use ib::{IbConnection, QpInfo};
pub use memory::RegisteredMemory;
pub use offer::{Endpoint, EndpointConfig, LocalEndpoint, MAX_FRAME_PAYLOAD};
pub use ops::Connection;
pub use transport::{MAX_NET_DEVICES, Transport};

#[cfg(test)]
mod test_util {
    use std::sync::{Arc, OnceLock};

    use mscclpp_hal::{Backend, Device};

    use crate::context::TransportContext;

    /// Device 0 of the host backend, opened once for every unit test.
    pub(crate) fn host_device() -> Arc<dyn Device> {
        static DEV: OnceLock<Arc<dyn Device>> = OnceLock::new();
        DEV.get_or_init(|| {
            mscclpp_host::HostBackend::new()
                .open_device(0)
                .expect("the host backend always opens device 0")
        })
        .clone()
    }

    /// A context of `rank` on the host device.
    pub(crate) fn host_ctx(rank: usize) -> Arc<TransportContext> {
        TransportContext::new(rank, host_device())
    }
}

#[cfg(test)]
mod tests;
