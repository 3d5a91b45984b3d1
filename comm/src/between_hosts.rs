//! The transport between hosts: which of IB, an NCCL net plugin or Ethernet every path that
//! crosses hosts takes (the hierarchical collectives' port channels, the executor's port
//! channels across hosts, the NCCL device API's GIN proxy), chosen alike by all of them.

use std::str::FromStr;

use mscclpp_hal::{BufferSlice, Error, Result};
use mscclpp_transports::{Endpoint, EndpointConfig, Transport, TransportFlags};

use crate::Communicator;

/// The transport between hosts: `MSCCLPP_HIER_TRANSPORT` when set, else IB0 where this build
/// and this machine have it and it can register `probe` (device memory needs peer memory or
/// dma-buf), else an NCCL net plugin faster than TCP, else Ethernet — the same on every rank of
/// the rail (Ethernet unless all can use IB). Collective over `rail`: one all-gather, which also
/// agrees the override (a variable set on some ranks only, as per-node environments do, fails
/// every rank alike instead of sending them down different exchanges).
pub fn inter_host_transport(rail: &Communicator, probe: &BufferSlice) -> Result<Transport> {
    let forced = mscclpp_hal::env::get("MSCCLPP_HIER_TRANSPORT").unwrap_or_default();
    let ib = Transport::Ib(0);
    let net = Transport::Net(0);
    // Probed only without an override: [IB here, Net faster here, the override's bytes...].
    let (here, net_here) = if forced.is_empty() {
        let here = ib.built().is_ok()
            && Endpoint::new(rail.context(), EndpointConfig::new(ib)).is_ok()
            && rail
                .register_memory(probe, TransportFlags::single(ib))
                .inspect_err(|e| tracing::info!("IB0 cannot register the rail's scratch: {e}"))
                .is_ok();
        (here, !here && net_is_faster(rail.rank()))
    } else {
        (false, false)
    };
    let mut card = vec![u8::from(here), u8::from(net_here)];
    card.extend_from_slice(forced.as_bytes());
    let all = rail.bootstrap().all_gather(&card)?;
    if let Some((r, v)) = all
        .iter()
        .enumerate()
        .find(|(_, v)| v.get(2..) != Some(forced.as_bytes()))
    {
        return Err(Error::invalid(format!(
            "MSCCLPP_HIER_TRANSPORT differs between ranks: rank {} has {forced:?}, rank {r} has {:?} (set it alike on every rank, or on none)",
            rail.rank(),
            String::from_utf8_lossy(v.get(2..).unwrap_or_default())
        )));
    }
    if !forced.is_empty() {
        let t = Transport::from_str(&forced).map_err(|e| {
            Error::invalid(format!(
                "MSCCLPP_HIER_TRANSPORT={forced:?} is malformed: {e}"
            ))
        })?;
        if t == Transport::CudaIpc {
            return Err(Error::invalid(
                "MSCCLPP_HIER_TRANSPORT=CudaIpc: hosts cannot share memory; use Ethernet, IB0..IB7 or Net0..Net5",
            ));
        }
        return Ok(t);
    }
    Ok(if all.iter().all(|v| v.first() == Some(&1)) {
        ib
    } else if all.iter().all(|v| v.get(1) == Some(&1)) {
        tracing::info!(
            "between hosts: Net0 (an NCCL net plugin reporting more bandwidth than TCP on every rank; MSCCLPP_HIER_TRANSPORT overrides)"
        );
        net
    } else {
        Transport::Ethernet
    })
}

/// Whether an NCCL net plugin loads here and its device 0 reports more bandwidth than the
/// fastest NIC the kernel lists (`/sys/class/net/*/speed`; unknown counts as none), saying why
/// at info level.
fn net_is_faster(rank: usize) -> bool {
    let plugin = match mscclpp_transports::net::plugin::plugin() {
        Ok(p) => p,
        Err(e) => {
            tracing::debug!(rank, "no NCCL net plugin for the hosts' traffic: {e}");
            return false;
        }
    };
    let props = match plugin.properties(0) {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(
                rank,
                "NCCL net plugin {} has no usable device 0: {e}",
                plugin.name
            );
            return false;
        }
    };
    let tcp = tcp_speed_mbps().unwrap_or(0);
    let faster = props.speed_mbps > tcp;
    tracing::info!(
        rank,
        plugin = %plugin.name,
        device = %props.name,
        plugin_mbps = props.speed_mbps,
        tcp_mbps = tcp,
        "NCCL net plugin {} for the hosts' traffic",
        if faster { "preferred" } else { "not preferred (TCP is as fast)" }
    );
    faster
}

/// The fastest speed (Mbit/s) a non-loopback interface reports in `/sys/class/net`.
fn tcp_speed_mbps() -> Option<i32> {
    let dir = std::fs::read_dir("/sys/class/net").ok()?;
    dir.filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "lo")
        .filter_map(|e| std::fs::read_to_string(e.path().join("speed")).ok())
        .filter_map(|s| s.trim().parse::<i32>().ok())
        .max()
}
