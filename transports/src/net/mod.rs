//! Net: a connection through an NCCL net plugin (`NCCL_NET_PLUGIN`: aws-ofi-nccl on EFA, the
//! plugins of InfiniBand/RoCE vendors and clouds), device `n` of it as transport `Net<n>`.
//!
//! Set-up runs over the connection's TCP link (the one every endpoint has): each side starts
//! listening on the plugin's device, sends its listen handle over the link, and then connects to
//! the peer's handle while accepting the peer's connection, both non-blocking as NCCL's, until
//! each side has a send comm and a receive comm. The link stays open as the connection's
//! liveness: its end ends the connection.
//!
//! Data: the Ethernet transport's frame protocol (`crate::ethernet`: writes in chunks, token
//! updates ordered behind them, flushes acknowledged by the receiver once everything before has
//! landed) runs over a [`pipe::NetPipe`], a byte stream made of the plugin's `isend`/`irecv` of
//! host memory registered with `regMr` (`NCCL_PTR_HOST`, which every plugin takes); completions
//! come through `test`. A failed request ends the connection naming the peer and the plugin's
//! error. Device memory moves through the HAL into those host buffers, as Ethernet's does; the
//! plugin's `NCCL_PTR_CUDA` support (GPUDirect) is reported but not used yet.

mod abi;
pub(crate) mod pipe;
pub mod plugin;

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result};

use crate::ethernet::{EthernetConnection, Pipes};
use crate::link;
use crate::offer::{Endpoint, LocalEndpoint};
use crate::transport::Transport;

pub use plugin::{NetProperties, Plugin};

/// Checks, at endpoint creation, that the plugin loads and has device `dev`.
pub(crate) fn prepare(dev: u8) -> Result<Arc<Plugin>> {
    let p = plugin::plugin()?;
    let n = p.devices()?;
    if usize::from(dev) >= n {
        return Err(Error::unavailable(
            format!("net device {dev} (transport Net{dev})"),
            format!(
                "the NCCL net plugin {} ({}) has {n} device(s)",
                p.name, p.path
            ),
        ));
    }
    Ok(p)
}

/// Joins `local` and `remote` over device `dev` of the plugin (see the module doc).
pub(crate) fn connect(
    local: LocalEndpoint,
    remote: &Endpoint,
    dev: u8,
) -> Result<EthernetConnection> {
    let p = prepare(dev)?;
    let (me, peer) = (local.endpoint.rank, remote.rank);
    let deadline = Instant::now() + local.cfg.connect_timeout;
    let mut link = link::establish(&local, remote)?;
    let io = |what: &str, e: std::io::Error| {
        Error::io(format!("{what} of the Net{dev} connection {me}->{peer}"), e)
    };
    let (mine, listen) = p.listen(usize::from(dev))?;
    let mut theirs = [0u8; plugin::HANDLE_BYTES];
    let exchanged = link
        .set_read_timeout(Some(local.cfg.connect_timeout))
        .and_then(|()| link.write_all(&mine))
        .and_then(|()| link.read_exact(&mut theirs))
        .and_then(|()| link.set_read_timeout(None));
    if let Err(e) = exchanged {
        let _ = p.close_listen(listen);
        return Err(io("exchanging the plugin's listen handles", e));
    }
    // Both sides connect and accept at once: NCCL's calls are non-blocking and each completes
    // only as the other side makes progress.
    let (mut send, mut recv) = (None, None);
    let joined = loop {
        if send.is_none() {
            match p.try_connect(usize::from(dev), &mut theirs) {
                Ok(c) => send = c,
                Err(e) => break Err(e),
            }
        }
        if recv.is_none() {
            match p.try_accept(&listen) {
                Ok(c) => recv = c,
                Err(e) => break Err(e),
            }
        }
        if send.is_some() && recv.is_some() {
            break Ok(());
        }
        if Instant::now() > deadline {
            break Err(Error::Timeout {
                waiting_for: format!(
                    "rank {me} and rank {peer} to connect through the net plugin {} (device {dev}): {} {}",
                    p.name,
                    if send.is_none() {
                        "connect pending;"
                    } else {
                        ""
                    },
                    if recv.is_none() { "accept pending" } else { "" },
                ),
                after: local.cfg.connect_timeout,
            });
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    if let Err(e) = p.close_listen(listen) {
        tracing::debug!("closing the plugin's listen comm: {e}");
    }
    if let Err(e) = joined {
        if let Some(c) = send {
            let _ = p.close_send(c);
        }
        if let Some(c) = recv {
            let _ = p.close_recv(c);
        }
        return Err(
            e.with_context(|| format!("connecting rank {me} and rank {peer} over Net{dev}"))
        );
    }
    let (Some(send), Some(recv)) = (send, recv) else {
        return Err(Error::Internal(
            "net connect ended without both comms".into(),
        ));
    };
    let shared = pipe::NetShared::new(p.clone(), send, recv, me, peer, local.cfg.io_timeout);
    let read = pipe::NetPipe::reader(&shared)?;
    let write = pipe::NetPipe::writer(&shared)?;
    // The link's end (the peer exited or closed the connection) ends the pipes, which ends the
    // receiver with the peer named, once what the peer sent before has had time to arrive.
    let watch = link
        .try_clone()
        .map_err(|e| io("cloning the link socket", e))?;
    let sh = shared.clone();
    std::thread::Builder::new()
        .name(format!("mscclpp-net-watch-{me}-{peer}"))
        .spawn(move || {
            let mut watch = watch;
            let mut b = [0u8; 64];
            let _ = watch.read(&mut b);
            sh.peer_closed();
        })
        .map_err(|e| io("spawning the link watcher", e))?;
    let control = pipe::NetPipe::control(&shared, link);
    let describe = format!(
        "{} device {dev} ({}, ncclNet v{})",
        p.name, p.path, p.version
    );
    let pipes = Pipes {
        read: Box::new(read),
        write: Box::new(write),
        control: Box::new(control),
        describe,
    };
    EthernetConnection::over(local, remote, pipes, Transport::Net(dev))
}

#[cfg(test)]
mod tests;
