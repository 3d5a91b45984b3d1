//! Scratch buffers that every peer maps, and the mapping of peers' buffers.

use crate::algorithms::base::MAX_RANKS;
use mscclpp_comm::Communicator;
use mscclpp_hal::{BufferSlice, Device, DeviceBuffer, Error, MemoryKind, Result};
use mscclpp_transports::{RegisteredMemory, Transport, TransportFlags};

/// A buffer of this rank that every peer maps, and the peers' buffers mapped here, for up to `N`
/// ranks (the size of the kernels' peer arrays: the collectives' `MAX_RANKS` by default).
#[derive(Debug)]
pub(crate) struct PeerMaps<const N: usize = MAX_RANKS> {
    /// Kept alive: the mappings of the peers' buffers.
    pub peers: Vec<RegisteredMemory>,
    /// Every rank's buffer as seen here (this rank's own at index `rank`), and its length.
    pub bases: [u64; N],
    pub lens: [u64; N],
}

/// Registers `slice` (this rank's `what`) and maps every peer's (a collective call).
pub(crate) fn map_peers<const N: usize>(
    comm: &Communicator,
    slice: &BufferSlice,
    what: &str,
) -> Result<PeerMaps<N>> {
    let (rank, n) = (comm.rank(), comm.nranks());
    if n > N {
        return Err(Error::invalid(format!(
            "{what} for {n} ranks: at most {N} are mapped"
        )));
    }
    let mine = comm.register_memory(slice, TransportFlags::single(Transport::CudaIpc))?;
    let mut maps = PeerMaps {
        peers: Vec::with_capacity(n - 1),
        bases: [0; N],
        lens: [0; N],
    };
    maps.bases[rank] = slice.ptr().0;
    maps.lens[rank] = slice.len() as u64;
    for p in (0..n).filter(|&p| p != rank) {
        let theirs = comm.exchange_memory(&mine, p)?;
        let view = theirs.mapped_slice().ok_or_else(|| {
            Error::invalid(format!(
                "rank {p}'s {what} is not mapped on rank {rank}: collectives need every rank on one host (CudaIpc)"
            ))
        })?;
        maps.bases[p] = view.ptr().0;
        maps.lens[p] = view.len() as u64;
        maps.peers.push(theirs);
    }
    Ok(maps)
}

/// A scratch buffer of this rank, zeroed, and every rank's scratch mapped here.
#[derive(Debug)]
pub(crate) struct Scratch<const N: usize = MAX_RANKS> {
    _buffer: DeviceBuffer,
    _peers: Vec<RegisteredMemory>,
    /// Every rank's scratch (this rank's own at index `rank`).
    pub addrs: [u64; N],
}

impl<const N: usize> Scratch<N> {
    /// Allocates, zeroes and registers a scratch buffer of `bytes` and maps every peer's (a
    /// collective call; `bytes` must be the same on every rank).
    pub fn exchange(comm: &Communicator, bytes: u64, what: &str) -> Result<Scratch<N>> {
        // Zeroed before anyone can see it: flags and packets of 0 never match.
        let buffer = zeroed(&**comm.device(), bytes, MemoryKind::Device, what)?;
        let maps = map_peers(comm, &buffer.full(), what)?;
        if let Some(p) = (0..comm.nranks()).find(|&p| maps.lens[p] != bytes) {
            return Err(Error::Remote {
                rank: p,
                message: format!("{what} of {} bytes, expected {bytes}", maps.lens[p]),
            });
        }
        Ok(Scratch {
            _buffer: buffer,
            _peers: maps.peers,
            addrs: maps.bases,
        })
    }
}

/// A buffer of `bytes` (this rank's `what`) of `kind`, zeroed before it is returned.
pub(crate) fn zeroed(
    device: &dyn Device,
    bytes: u64,
    kind: MemoryKind,
    what: &str,
) -> Result<DeviceBuffer> {
    let len = usize::try_from(bytes)
        .map_err(|_| Error::invalid(format!("{what} of {bytes} bytes does not fit this host")))?;
    let buffer = device.alloc(len, kind)?;
    let stream = device.create_stream()?;
    stream.fill(&buffer.full(), 0)?;
    stream.synchronize()?;
    Ok(buffer)
}
