//! A communicator's symmetric space: one reserved range of `lsaSize` slots at a fixed stride (a
//! multiple of 4 GiB, as NCCL's device headers require), where every symmetric memory of every
//! rank of the LSA team is mapped at the same offset of the rank's slot. The device headers'
//! arithmetic (`lsaFlatBase + lsaIndex * stride4G << 32 + offset`) then lands in the right
//! rank's memory. Registrations are collective: every rank makes the same calls in the same
//! order, so each takes the same offset.

use std::os::fd::AsFd;
use std::sync::{Arc, Mutex};

use mscclpp::comm::Communicator;
use mscclpp::hal::{AddressSpace, DeviceBuffer, MemoryKind, Stream};
use mscclpp::transports::{RegisteredMemory, Transport, TransportFlags};

use super::layout::{
    PEER_DELTA_INVALID, TABLE_BYTES, TABLE_ENTRIES, WIN_ALIGNMENT, WINDOW_RECORD_BYTES,
    WindowRecord, table_bytes,
};
use crate::error::{Failure, Res};

/// 4 GiB: the unit of the stride between slots.
const G4: usize = 1 << 32;

/// The LSA team of `rank` given every rank's host: the ranks of its host when every host holds
/// the same number of consecutive ranks (NCCL's rule: LSA teams are runs of consecutive world
/// ranks of one size), else the rank alone.
pub fn lsa_team(hosts: &[u32], rank: usize) -> Vec<usize> {
    let n = hosts.len();
    let mut runs = Vec::new();
    let mut start = 0;
    for r in 1..=n {
        if r == n || hosts[r] != hosts[start] {
            runs.push((start, r - start));
            start = r;
        }
    }
    let size = runs.first().map_or(1, |&(_, l)| l);
    let mut seen = std::collections::HashSet::new();
    let regular = runs
        .iter()
        .all(|&(s, l)| l == size && seen.insert(hosts[s]));
    if regular {
        let first = rank - rank % size;
        (first..first + size).collect()
    } else {
        vec![rank]
    }
}

/// A symmetric memory mapped for every member of the team.
#[derive(Debug)]
pub struct Mapped {
    /// Its offset in each slot.
    pub offset: usize,
    /// Each member's length (team order), as mapped.
    pub lens: Vec<usize>,
    /// The window record on the device.
    pub record: DeviceBuffer,
    /// What the record holds.
    pub values: WindowRecord,
    /// The window table entry's range (the caller's address and size).
    pub entry: (u64, u64),
    /// Every rank's window, as mapped here (address, bytes), where every rank of the
    /// communicator is in the LSA team and placed its window at the same offset of its
    /// allocation (what lets the collectives read the peers' windows in place).
    pub peers: Option<Vec<(u64, u64)>>,
}

/// A registration for the transport between hosts, or why there is none.
pub type Registration = Result<Arc<RegisteredMemory>, String>;

/// A symmetric memory as GIN names it (by its handle): where it sits in the slots, and, where
/// the communicator spans hosts, every rank's registration for the transport between them.
#[derive(Debug, Clone)]
pub struct Region {
    /// The GIN handle.
    pub handle: u64,
    /// Its offset in each slot.
    pub offset: usize,
    /// Each LSA member's length (team order).
    pub lens: Vec<usize>,
    /// This rank's registration for [`Space::remote`] (`Err`: why it has none).
    pub local: Registration,
    /// Every rank's registration as this rank reaches it (world order; `Err` for the LSA team,
    /// which needs none, and for ranks whose registration failed, saying why).
    pub peers: Vec<Registration>,
}

/// The symmetric space of one communicator.
#[derive(Debug)]
pub struct Space {
    comm: Arc<Communicator>,
    /// World ranks of the LSA team, in order.
    pub team: Vec<usize>,
    /// This rank's index in it.
    pub lsa_rank: usize,
    /// Bytes between slots.
    pub stride: usize,
    gran: usize,
    range: Box<dyn AddressSpace>,
    stream: Arc<dyn Stream>,
    /// The next free offset in the slots (the same on every rank).
    next: Mutex<usize>,
    /// `lsaPeerDelta4G` on the device.
    peer_delta: DeviceBuffer,
    tables: Mutex<Tables>,
    /// Every mapped memory, by its GIN handle.
    regions: Mutex<Vec<Region>>,
    /// The transport to the ranks of other hosts (`None` where the LSA team is every rank).
    pub remote: Option<Transport>,
}

#[derive(Debug, Default)]
struct Tables {
    /// (base, size, record) of every window, in registration order.
    entries: Vec<(u64, u64, u64)>,
    /// The device tables, chained.
    bufs: Vec<DeviceBuffer>,
}

/// Every rank's `words` (the same count on every rank): a collective call over the
/// communicator; a rank that sent another count fails the call naming it.
fn gather_words(comm: &Communicator, words: &[u64]) -> Res<Vec<Vec<u64>>> {
    let card: Vec<u8> = words.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = comm.bootstrap().all_gather(&card)?;
    all.iter()
        .enumerate()
        .map(|(r, b)| {
            if b.len() != card.len() {
                return Err(Failure::internal(format!(
                    "symmetric memory: rank {r} sent {} bytes, {} expected",
                    b.len(),
                    card.len()
                )));
            }
            Ok(b.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect())
        })
        .collect()
}

impl Space {
    /// Makes the space of `comm` (collective: every rank at once).
    pub fn new(comm: Arc<Communicator>) -> Res<Space> {
        let boot = comm.bootstrap().clone();
        let (rank, n) = (comm.rank(), comm.nranks());
        let device = comm.device().clone();
        let sh = device.shareable();
        let mem = if sh.is_some() {
            device.info().total_memory
        } else {
            0
        };
        let gran_here = sh.as_ref().map_or(0, |s| s.granularity() as u64);
        let cards = gather_words(&comm, &[mem, gran_here])?;
        let mems: Vec<u64> = cards.iter().map(|w| w[0]).collect();
        // The coarsest granularity of any rank: windows take the same span everywhere.
        let gran_all = cards.iter().map(|w| w[1]).max().unwrap_or(0) as usize;
        let without: Vec<usize> = (0..n).filter(|&r| mems[r] == 0).collect();
        let Some(sh) = sh.filter(|_| without.is_empty()) else {
            return Err(Failure::usage(format!(
                "symmetric memory (NCCL's device API): ranks {without:?} have no shareable memory (the {} backend of rank {rank} {})",
                device.info().backend,
                if sh.is_some() { "has it" } else { "has none" }
            )));
        };
        let team = lsa_team(boot.hosts(), rank);
        let lsa_rank = team.iter().position(|&r| r == rank).unwrap_or(0);
        // Every rank's memory, not only the team's: the slots' layout (offsets, and the GIN
        // handles derived from them) must be the same on every host.
        let biggest = mems.iter().copied().max().unwrap_or(0) as usize;
        let stride = biggest.max(1).div_ceil(G4).max(1) * G4;
        let gran = gran_all.max(sh.granularity());
        let range = sh.reserve(stride * team.len())?;
        let stream = device.create_stream()?;
        let stride4g = (stride / G4) as i32;
        let deltas: Vec<u8> = (0..n)
            .map(|p| match team.iter().position(|&r| r == p) {
                Some(i) => i as i32 * stride4g,
                None => PEER_DELTA_INVALID,
            })
            .flat_map(i32::to_le_bytes)
            .collect();
        let peer_delta = device.alloc(deltas.len(), MemoryKind::Device)?;
        stream.write_from_host(&peer_delta.full(), &deltas)?;
        stream.synchronize()?;
        // The ranks of other hosts are reached through the transport the hierarchical
        // collectives pick (collective: every rank of a communicator that spans hosts).
        let remote = if team.len() < n {
            let probe = device.alloc(4096, MemoryKind::Device)?;
            Some(mscclpp::comm::inter_host_transport(&comm, &probe.full())?)
        } else {
            None
        };
        tracing::info!(
            target: crate::debug::INIT,
            "rank {rank}: symmetric space of {} slots of {} GiB (LSA team {team:?})",
            team.len(),
            stride >> 30
        );
        Ok(Space {
            comm,
            team,
            lsa_rank,
            stride,
            gran,
            range,
            stream,
            next: Mutex::new(0),
            peer_delta,
            tables: Mutex::new(Tables::default()),
            regions: Mutex::new(Vec::new()),
            remote,
        })
    }

    /// The communicator.
    pub fn communicator(&self) -> &Arc<Communicator> {
        &self.comm
    }

    /// The address of byte `offset` of LSA member `member`'s slot.
    pub fn flat(&self, member: usize, offset: usize) -> u64 {
        self.range.base().0 + (member * self.stride + offset) as u64
    }

    /// The GIN handle of the memory mapped at `offset` of the slots: the same on every rank
    /// (registrations are collective and take the same offsets), non-zero, below 2^63.
    fn gin_handle(offset: usize) -> u64 {
        (offset >> 12) as u64 + 1
    }

    /// The memory a GIN handle names.
    pub fn gin_region(&self, handle: u64) -> Option<Region> {
        let r = self.regions.lock().unwrap_or_else(|p| p.into_inner());
        r.iter().find(|e| e.handle == handle).cloned()
    }

    /// World rank `rank`'s index in the LSA team, if it is in it.
    pub fn member(&self, rank: usize) -> Option<usize> {
        self.team.iter().position(|&r| r == rank)
    }

    /// Registers `alloc` for the transport between hosts and learns every rank's registration
    /// (collective; nothing where one host holds every rank). A rank whose registration fails
    /// keeps its window for LSA: its GIN peers learn why it has none, and a put naming it
    /// stops their proxy saying so.
    fn register_remote(&self, alloc: &DeviceBuffer) -> Res<(Registration, Vec<Registration>)> {
        let n = self.comm.nranks();
        let Some(t) = self.remote else {
            let none = || Err("one host holds every rank".to_string());
            return Ok((none(), (0..n).map(|_| none()).collect()));
        };
        let mine = self
            .comm
            .register_memory(&alloc.full(), TransportFlags::single(t))
            .map(Arc::new)
            .map_err(|e| format!("rank {} cannot register it for {t}: {e}", self.comm.rank()));
        let card = match &mine {
            Ok(m) => m.to_bytes(),
            Err(e) => {
                tracing::warn!("symmetric memory for GIN between hosts: {e}");
                Vec::new()
            }
        };
        let all = self.comm.bootstrap().all_gather(&card)?;
        let ctx = self.comm.context();
        let peers = all
            .iter()
            .enumerate()
            .map(|(r, b)| {
                if self.member(r).is_some() {
                    Err(format!("rank {r} is in the LSA team"))
                } else if b.is_empty() {
                    Err(format!("rank {r} could not register it for {t}"))
                } else {
                    RegisteredMemory::from_bytes(ctx, b)
                        .map(Arc::new)
                        .map_err(|e| format!("rank {r}'s registration for {t}: {e}"))
                }
            })
            .collect();
        Ok((mine, peers))
    }

    /// `stride4G`.
    pub fn stride4g(&self) -> u32 {
        (self.stride / G4) as u32
    }

    /// The first window table on the device (`windowTable`), made on first use.
    pub fn table(&self) -> Res<u64> {
        let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
        if t.bufs.is_empty() {
            self.write_tables(&mut t)?;
        }
        Ok(t.bufs[0].ptr().0)
    }

    fn write_tables(&self, t: &mut Tables) -> Res<()> {
        let need = t.entries.len().div_ceil(TABLE_ENTRIES).max(1);
        while t.bufs.len() < need {
            t.bufs
                .push(self.comm.device().alloc(TABLE_BYTES, MemoryKind::Device)?);
        }
        for (i, buf) in t.bufs.iter().enumerate() {
            let from = (i * TABLE_ENTRIES).min(t.entries.len());
            let to = ((i + 1) * TABLE_ENTRIES).min(t.entries.len());
            let next = t.bufs.get(i + 1).map_or(0, |b| b.ptr().0);
            self.stream
                .write_from_host(&buf.full(), &table_bytes(&t.entries[from..to], next))?;
        }
        self.stream.synchronize()?;
        Ok(())
    }

    /// Maps `alloc` (this rank's shareable allocation; `None` where this rank has none to give)
    /// into every team member's space, with its record for a window of `size` bytes at `off` in
    /// the allocation (`user`: the caller's address of it). Collective over every rank of the
    /// communicator. Where some rank has no such memory to give, every rank fails naming it if
    /// `required` (a window registered `NCCL_WIN_COLL_SYMMETRIC`), else every rank maps
    /// nothing (`Ok(None)`: a window of other memory has no device window, as with NCCL).
    pub fn map(
        &self,
        alloc: Option<&DeviceBuffer>,
        off: usize,
        size: usize,
        user: u64,
        flags: u32,
        required: bool,
    ) -> Res<Option<Mapped>> {
        let boot = self.comm.bootstrap();
        let (rank, n) = (self.comm.rank(), self.comm.nranks());
        let fd = match alloc {
            Some(a) if off % WIN_ALIGNMENT == 0 => self
                .comm
                .device()
                .shareable()
                .ok_or_else(|| Failure::internal("a symmetric space without shareable memory"))?
                .export(a)
                .map_err(|e| format!("{e}")),
            Some(_) => Err(format!(
                "the window starts {off} bytes into its ncclMemAlloc allocation, not at a multiple of {WIN_ALIGNMENT}"
            )),
            None => Err("its memory is not from ncclMemAlloc".into()),
        };
        let len = match (&fd, alloc) {
            (Ok(_), Some(a)) => a.len() as u64,
            _ => 0,
        };
        let all = gather_words(&self.comm, &[len, off as u64, size as u64])?;
        let lens: Vec<usize> = all.iter().map(|w| w[0] as usize).collect();
        let offs: Vec<u64> = all.iter().map(|w| w[1]).collect();
        let sizes: Vec<u64> = all.iter().map(|w| w[2]).collect();
        let missing: Vec<usize> = (0..n).filter(|&r| lens[r] == 0).collect();
        let fd = match fd {
            Ok(fd) if missing.is_empty() => fd,
            _ if !required => {
                tracing::debug!(
                    "rank {rank}: a window without NCCL_WIN_COLL_SYMMETRIC on ranks {missing:?} of other memory: no device window"
                );
                return Ok(None);
            }
            mine => {
                let why = mine
                    .err()
                    .map_or_else(String::new, |e| format!(" (rank {rank}: {e})"));
                return Err(Failure::argument(format!(
                    "a symmetric window needs memory of ncclMemAlloc on every rank, at a multiple of {WIN_ALIGNMENT} bytes into it: ranks {missing:?} passed other memory{why}"
                )));
            }
        };
        // Before anything is mapped, so that a failure leaves nothing behind.
        let (local, peers) = match alloc {
            Some(a) => self.register_remote(a)?,
            None => return Err(Failure::internal("a shared window without its allocation")),
        };
        // The largest of every rank's (not only the team's): each window then takes the same
        // offset on every host, so its GIN handle names it everywhere.
        let biggest = lens.iter().copied().max().unwrap_or(0);
        let span = biggest.next_multiple_of(self.gran);
        let offset = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            if *next + span > self.stride {
                return Err(Failure::usage(format!(
                    "symmetric memory: {span} more bytes do not fit the {} GiB each rank's slot has ({} in use)",
                    self.stride >> 30,
                    *next
                )));
            }
            let at = *next;
            *next += span;
            at
        };
        let fds = boot.exchange_fds(&self.team, fd.as_fd())?;
        let mut mapped: Vec<usize> = Vec::with_capacity(fds.len());
        let mut done = Ok(());
        for (i, f) in fds.iter().enumerate() {
            let at = i * self.stride + offset;
            match self.range.map(at, f.as_fd(), lens[self.team[i]]) {
                Ok(()) => mapped.push(at),
                Err(e) => {
                    done = Err(e);
                    break;
                }
            }
        }
        if let Err(e) = done {
            for (i, &at) in mapped.iter().enumerate() {
                let _ = self.range.unmap(at, lens[self.team[i]]);
            }
            return Err(e.into());
        }
        let values = WindowRecord {
            host_id: user,
            lsa_flat_base: self.range.base().0 + (offset + off) as u64,
            lsa_rank: self.lsa_rank as u32,
            world_rank: rank as u32,
            stride4g: self.stride4g(),
            mc_offset4k: ((offset + off) >> 12) as u32,
            gin_offset4k: (off >> 12) as u32,
            flags,
            peer_delta: self.peer_delta.ptr().0,
            gin_handle: Self::gin_handle(offset),
        };
        let record = self
            .comm
            .device()
            .alloc(WINDOW_RECORD_BYTES, MemoryKind::Device)?;
        self.stream
            .write_from_host(&record.full(), &values.bytes())?;
        let entry = (user, size as u64);
        {
            let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
            t.entries.push((entry.0, entry.1, record.ptr().0));
            self.write_tables(&mut t)?;
        }
        let lens_team: Vec<usize> = self.team.iter().map(|&r| lens[r]).collect();
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Region {
                handle: values.gin_handle,
                offset,
                lens: lens_team.clone(),
                local,
                peers,
            });
        let same = offs.iter().all(|&o| o == off as u64);
        let peers = (same && self.team.len() == n).then(|| {
            (0..n)
                .map(|r| (values.lsa_flat_base + (r * self.stride) as u64, sizes[r]))
                .collect()
        });
        Ok(Some(Mapped {
            offset,
            lens: lens_team,
            record,
            values,
            entry,
            peers,
        }))
    }

    /// Takes `m` out of the window table and this rank's space (its peers' memory stays theirs).
    pub fn unmap(&self, m: Mapped) -> Res<()> {
        {
            let mut t = self.tables.lock().unwrap_or_else(|p| p.into_inner());
            let rec = m.record.ptr().0;
            t.entries.retain(|e| e.2 != rec);
            self.write_tables(&mut t)?;
        }
        self.regions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|e| e.offset != m.offset);
        let mut first = Ok(());
        for (i, &len) in m.lens.iter().enumerate() {
            first = first.and(self.range.unmap(i * self.stride + m.offset, len));
        }
        first.map_err(Into::into)
    }

    /// The address of `offset` in LSA member `lsa`'s copy of `m`.
    pub fn lsa_pointer(&self, m: &Mapped, offset: u64, lsa: usize) -> Res<u64> {
        if lsa >= self.team.len() {
            return Err(Failure::argument(format!(
                "LSA rank {lsa} of a team of {}",
                self.team.len()
            )));
        }
        Ok(m.values.lsa_flat_base + (lsa * self.stride) as u64 + offset)
    }
}
