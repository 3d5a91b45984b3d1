//! Buffers registered with the collectives: the window table the read kernel looks addresses up
//! in (row 0 the staging area, rows 1.. registered buffers), kept the same on every rank.

use std::sync::Mutex;

use crate::algorithms::base::MAX_RANKS;
use crate::algorithms::read::args::{MAX_WINDOWS, WINDOW_TABLE_BYTES, read_key};
use mscclpp_comm::Communicator;
use mscclpp_hal::{BufferSlice, DeviceBuffer, DynStream, Error, MemoryKind, Result};
use mscclpp_transports::RegisteredMemory;

use crate::agree::agree;
use crate::scratch::map_peers;

/// A buffer registered with every rank's collectives (see [`crate::Collectives::register`]): its
/// index in the window tables, the same on every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window(usize);

impl Window {
    /// The index in the window tables (1 or more; 0 is the staging area).
    pub fn index(self) -> usize {
        self.0
    }
}

/// A registered buffer: kept alive, with the peers' buffers mapped here, until deregistered.
#[derive(Debug)]
struct Entry {
    slice: BufferSlice,
    _peers: Vec<RegisteredMemory>,
}

/// The window table in device memory and the registered buffers behind its rows.
#[derive(Debug)]
pub(crate) struct Windows {
    table: DeviceBuffer,
    entries: Mutex<Vec<Option<Entry>>>,
}

/// Writes window `w`'s row of a window table: every rank's address and length.
fn write_row(
    stream: &DynStream,
    table: &DeviceBuffer,
    w: usize,
    bases: &[u64; MAX_RANKS],
    lens: &[u64; MAX_RANKS],
) -> Result<()> {
    let row = 8 * MAX_RANKS;
    for (at, words) in [(w * row, bases), ((MAX_WINDOWS + w) * row, lens)] {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
        stream.write_from_host(&table.slice(at..at + row)?, &bytes)?;
    }
    Ok(())
}

impl Windows {
    /// A zeroed table whose window 0 is every rank's staging area (`bases`, `lens`).
    pub fn new(
        comm: &Communicator,
        bases: &[u64; MAX_RANKS],
        lens: &[u64; MAX_RANKS],
    ) -> Result<Windows> {
        let table = comm
            .device()
            .alloc(WINDOW_TABLE_BYTES, MemoryKind::Device)?;
        let stream = comm.device().create_stream()?;
        stream.fill(&table.full(), 0)?;
        write_row(&*stream, &table, 0, bases, lens)?;
        stream.synchronize()?;
        Ok(Windows {
            table,
            entries: Mutex::new(Vec::new()),
        })
    }

    /// The table's device address.
    pub fn table(&self) -> u64 {
        self.table.ptr().0
    }

    /// Registers `slice` on every rank (a collective call; see [`crate::Collectives::register`]).
    /// `mapped`: every rank's buffer as already mapped here (its address, its length), where the
    /// caller mapped them itself (a symmetric window); else the IPC mappings are made here.
    pub fn register(
        &self,
        comm: &Communicator,
        slice: &BufferSlice,
        mapped: Option<&[(u64, u64)]>,
    ) -> Result<Window> {
        let backend = comm.device().info().backend;
        if slice.buffer().backend() != backend {
            return Err(Error::invalid(format!(
                "register: the buffer belongs to the {} backend, the communicator to {backend}",
                slice.buffer().backend(),
            )));
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let index = match entries.iter().position(Option::is_none) {
            Some(i) => i + 1,
            None => entries.len() + 1,
        };
        // A rank that skipped a registration, or deregistered another, would read the wrong
        // buffer: all of them fail instead.
        agree(
            comm,
            "registered windows (every rank must register and deregister in the same order)",
            format!("window {index}"),
        )?;
        if index >= MAX_WINDOWS {
            return Err(Error::invalid(format!(
                "register: {} buffers are registered already, the most a communicator holds",
                MAX_WINDOWS - 1
            )));
        }
        let maps = match mapped {
            Some(m) if m.len() == comm.nranks() && m.len() <= MAX_RANKS => {
                let mut bases = [0u64; MAX_RANKS];
                let mut lens = [0u64; MAX_RANKS];
                for (r, &(b, l)) in m.iter().enumerate() {
                    bases[r] = b;
                    lens[r] = l;
                }
                bases[comm.rank()] = slice.ptr().0;
                lens[comm.rank()] = slice.len() as u64;
                crate::scratch::PeerMaps {
                    peers: Vec::new(),
                    bases,
                    lens,
                }
            }
            Some(m) => {
                return Err(Error::invalid(format!(
                    "register: {} mapped buffers for {} ranks",
                    m.len(),
                    comm.nranks()
                )));
            }
            None => map_peers(comm, slice, "registered buffer")?,
        };
        let stream = comm.device().create_stream()?;
        write_row(&*stream, &self.table, index, &maps.bases, &maps.lens)?;
        stream.synchronize()?;
        let entry = Entry {
            slice: slice.clone(),
            _peers: maps.peers,
        };
        if index > entries.len() {
            entries.push(Some(entry));
        } else {
            entries[index - 1] = Some(entry);
        }
        tracing::debug!(
            rank = comm.rank(),
            index,
            bytes = slice.len(),
            "buffer registered"
        );
        Ok(Window(index))
    }

    /// Deregisters `window` on every rank (a collective call).
    pub fn deregister(&self, comm: &Communicator, window: Window) -> Result<()> {
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let i = window.0;
        let known = i != 0 && entries.get(i - 1).is_some_and(Option::is_some);
        // All ranks fail alike, so none is left waiting for the others.
        agree(
            comm,
            "deregistered windows",
            if known {
                format!("window {i}")
            } else {
                format!("window {i}, which is not registered")
            },
        )
        .and_then(|()| {
            if known {
                Ok(())
            } else {
                Err(Error::invalid(format!(
                    "deregister: window {i} is not registered with this communicator"
                )))
            }
        })?;
        let stream = comm.device().create_stream()?;
        write_row(&*stream, &self.table, i, &[0; MAX_RANKS], &[0; MAX_RANKS])?;
        stream.synchronize()?;
        // No peer unmaps this buffer while another rank could still name it.
        comm.bootstrap().barrier()?;
        entries[i - 1] = None;
        Ok(())
    }

    /// Where the bytes `[ptr, ptr + bytes)` are, as a read key: in a registered window, or the
    /// staging area (window 0).
    pub fn key_of(&self, ptr: u64, bytes: u64) -> u64 {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        entries
            .iter()
            .enumerate()
            .filter_map(|(i, w)| w.as_ref().map(|w| (i + 1, w)))
            .find_map(|(i, w)| {
                let start = w.slice.ptr().0;
                let end = start + w.slice.len() as u64;
                (ptr >= start && ptr + bytes <= end)
                    .then(|| read_key(i, ptr - start))
                    .flatten()
            })
            .unwrap_or(0)
    }
}
