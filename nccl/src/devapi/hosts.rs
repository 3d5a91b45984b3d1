//! GIN between hosts: what a proxy needs to serve descriptors whose peer is on another host,
//! through the transport the hierarchical collectives pick there (IB, an NCCL net plugin or
//! Ethernet), using only what every transport's connection does: one-sided writes into the
//! peer's registered memory and 64-bit stores ordered behind them.
//!
//! - A put is a write from this rank's registration of the window into the peer's.
//! - A signal cannot be a write (several ranks add to one signal), so it travels as a
//!   *record* into the peer's *inbox*: one ring per sending rank, its tail stored after the
//!   record (and after every earlier put of the connection, so the data lands first). The
//!   peer's proxy drains its inbox and adds locally, as it adds for its own host's ranks.
//! - A get is a record asking the peer's proxy to write the bytes back; it stores how many
//!   gets of ours it served after the data, and the descriptor finishes once that count is
//!   reached.
//! - The inbox's consumer gives credit back (how many records of each sender it took) the same
//!   way, so that a sender never overwrites a record not yet taken; a proxy waiting for credit
//!   or for a get drains its own inbox meanwhile, so two proxies never wait on each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp::hal::{DeviceBuffer, MemoryKind};
use mscclpp::transports::{
    AnyConnection, Connection, EndpointConfig, RegisteredMemory, TransportFlags,
};

use super::space::Space;
use crate::error::{Failure, Res};

/// Records in each sender's ring of an inbox.
pub const RING: usize = 1024;
/// Bytes of a record.
const RECORD: usize = 64;
/// Records (and inline values) staged before the connections are flushed and the staging
/// reused.
const STAGE: usize = 4096;

/// What a record asks of the peer's proxy.
pub mod kind {
    /// Add `value` to signal `id` of context `ctx`.
    pub const SIGNAL: u64 = 1;
    /// Add `value` to the u64 at (`offset`, `handle`) of the peer's copy.
    pub const VA_SIGNAL: u64 = 2;
    /// Write `size` bytes of the peer's (`offset`, `handle`) into the sender's
    /// (`dst_offset`, `dst_handle`).
    pub const GET: u64 = 3;
}

/// One record, as its eight words travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Record {
    /// [`kind`].
    pub kind: u64,
    /// Context (signals).
    pub ctx: u32,
    /// Signal id.
    pub id: u32,
    /// What to add; for a get, the bytes.
    pub value: u64,
    /// (offset, handle) of the peer's memory (VA signal, get source).
    pub at: (u64, u64),
    /// (offset, handle) of the sender's memory (get destination).
    pub back: (u64, u64),
}

impl Record {
    fn words(&self) -> [u64; 8] {
        [
            self.kind | u64::from(self.ctx) << 8 | u64::from(self.id) << 32,
            self.value,
            self.at.0,
            self.at.1,
            self.back.0,
            self.back.1,
            0,
            0,
        ]
    }

    fn from_words(w: &[u64; 8]) -> Record {
        Record {
            kind: w[0] & 0xff,
            ctx: ((w[0] >> 8) & 0xff_ffff) as u32,
            id: (w[0] >> 32) as u32,
            value: w[1],
            at: (w[2], w[3]),
            back: (w[4], w[5]),
        }
    }
}

/// This rank's links to the ranks of other hosts, for one device communicator's proxy.
pub struct Hosts {
    rank: usize,
    /// The connection to each rank of another host (world order).
    conns: Vec<Option<Arc<AnyConnection>>>,
    /// Each such rank's inbox and acknowledgements, as registered there.
    inbox_at: Vec<Option<RegisteredMemory>>,
    acks_at: Vec<Option<RegisteredMemory>>,
    /// This rank's inbox: `n` tails, then `n` rings of [`RING`] records.
    inbox: *mut u64,
    /// What the ranks of other hosts acknowledge here: per rank, records of ours taken, gets of
    /// ours served.
    acks: *mut u64,
    stage: *mut u64,
    stage_mem: RegisteredMemory,
    staged: usize,
    /// Records sent to each rank, taken from each, and credit last given for them.
    sent: Vec<u64>,
    taken: Vec<u64>,
    credited: Vec<u64>,
    /// Gets asked of each rank; gets of each rank served here.
    asked: Vec<u64>,
    served: Vec<u64>,
    /// Connections written since their last flush.
    dirty: Vec<bool>,
    deadline: Duration,
    // The registrations' memory, and the registrations the peers write through.
    _keep: (
        RegisteredMemory,
        RegisteredMemory,
        DeviceBuffer,
        DeviceBuffer,
        DeviceBuffer,
    ),
}

impl std::fmt::Debug for Hosts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosts")
            .field("rank", &self.rank)
            .field("sent", &self.sent)
            .field("taken", &self.taken)
            .finish_non_exhaustive()
    }
}

// SAFETY: the raw pointers name host-mapped allocations that `_keep` owns; only the proxy
// thread that owns this value reads and writes them from the host (the transports write the
// inbox and acknowledgements, each word by one peer).
unsafe impl Send for Hosts {}

/// Bytes of the tails at the start of an inbox.
fn tails(n: usize) -> usize {
    n * 8
}

impl Hosts {
    /// Connects to every rank of another host and exchanges inboxes (collective over the
    /// communicator; `None` where one host holds every rank).
    pub fn connect(space: &Space, deadline: Duration) -> Res<Option<Hosts>> {
        let Some(t) = space.remote else {
            return Ok(None);
        };
        let comm = space.communicator();
        let device = comm.device();
        let (rank, n) = (comm.rank(), comm.nranks());
        let host = |bytes: usize| -> Res<(DeviceBuffer, *mut u64)> {
            let b = device.alloc(bytes, MemoryKind::HostMapped)?;
            let p = b
                .host_ptr()
                .ok_or_else(|| Failure::internal("host-mapped memory without a host address"))?;
            // SAFETY: a fresh allocation of `bytes` bytes, host-accessible.
            unsafe { std::ptr::write_bytes(p, 0, bytes) };
            Ok((b, p.cast()))
        };
        let flags = TransportFlags::single(t);
        // This rank's side, made before the exchange; a failure is sent as an empty card, so
        // that every rank fails together naming it instead of waiting for it.
        let mine = (|| -> Res<_> {
            let (inbox_buf, inbox) = host(tails(n) + n * RING * RECORD)?;
            let (acks_buf, acks) = host(n * 16)?;
            let (stage_buf, stage) = host(STAGE * RECORD)?;
            let inbox_mem = comm.register_memory(&inbox_buf.full(), flags)?;
            let acks_mem = comm.register_memory(&acks_buf.full(), flags)?;
            let stage_mem = comm.register_memory(&stage_buf.full(), flags)?;
            Ok((
                (inbox_buf, inbox),
                (acks_buf, acks),
                (stage_buf, stage),
                (inbox_mem, acks_mem, stage_mem),
            ))
        })();
        let card = match &mine {
            Ok((_, _, _, (inbox_mem, acks_mem, _))) => {
                let (a, b) = (inbox_mem.to_bytes(), acks_mem.to_bytes());
                let mut card = (a.len() as u64).to_le_bytes().to_vec();
                card.extend_from_slice(&a);
                card.extend_from_slice(&b);
                card
            }
            Err(_) => Vec::new(),
        };
        let all = comm.bootstrap().all_gather(&card)?;
        let failed: Vec<usize> = (0..n).filter(|&r| all[r].is_empty()).collect();
        let (
            (inbox_buf, inbox),
            (acks_buf, acks),
            (stage_buf, stage),
            (inbox_mem, acks_mem, stage_mem),
        ) = match mine {
            Ok(m) if failed.is_empty() => m,
            mine => {
                let why = mine
                    .err()
                    .map_or_else(String::new, |e| format!(" (rank {rank}: {})", e.message));
                return Err(Failure::internal(format!(
                    "GIN between hosts over {t}: ranks {failed:?} could not make their inboxes{why}"
                )));
            }
        };
        let mut conns = vec![None; n];
        let (mut inbox_at, mut acks_at) = (Vec::new(), Vec::new());
        // Peers in ascending order on every rank: each pair's set-up steps meet.
        for (p, c) in all.iter().enumerate() {
            if space.member(p).is_some() {
                inbox_at.push(None);
                acks_at.push(None);
                continue;
            }
            let bad = || Failure::internal(format!("rank {p} sent a malformed GIN inbox"));
            let len = c
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(bad)? as usize;
            let (ia, ka) = (
                c.get(8..8 + len).ok_or_else(bad)?,
                c.get(8 + len..).ok_or_else(bad)?,
            );
            inbox_at.push(Some(RegisteredMemory::from_bytes(comm.context(), ia)?));
            acks_at.push(Some(RegisteredMemory::from_bytes(comm.context(), ka)?));
            let mut cfg = EndpointConfig::new(t);
            cfg.connect_timeout = comm.bootstrap().timeout();
            conns[p] = Some(comm.connect(p, cfg)?);
        }
        tracing::info!(
            target: crate::debug::INIT,
            "rank {rank}: GIN to {} ranks of other hosts over {t}",
            conns.iter().flatten().count()
        );
        Ok(Some(Hosts {
            rank,
            conns,
            inbox_at,
            acks_at,
            inbox,
            acks,
            stage,
            stage_mem,
            staged: 0,
            sent: vec![0; n],
            taken: vec![0; n],
            credited: vec![0; n],
            asked: vec![0; n],
            served: vec![0; n],
            dirty: vec![false; n],
            deadline,
            // Tuple fields drop in order: the registrations before their memory.
            _keep: (inbox_mem, acks_mem, inbox_buf, acks_buf, stage_buf),
        }))
    }

    /// Whether `peer` is reached through this (it is on another host).
    pub fn reaches(&self, peer: usize) -> bool {
        self.conns.get(peer).is_some_and(Option::is_some)
    }

    fn conn(&self, peer: usize) -> Res<&Arc<AnyConnection>> {
        self.conns
            .get(peer)
            .and_then(Option::as_ref)
            .ok_or_else(|| Failure::internal(format!("rank {peer} is not on another host")))
    }

    /// Writes `len` bytes of `src` (at `src_off`) into `peer`'s `dst` (at `dst_off`).
    pub fn put(
        &mut self,
        peer: usize,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Res<()> {
        self.conn(peer)?.write(dst, dst_off, src, src_off, len)?;
        self.dirty[peer] = true;
        Ok(())
    }

    /// Writes `bytes` (at most 8) into `peer`'s `dst` at `dst_off`.
    pub fn put_inline(
        &mut self,
        peer: usize,
        dst: &RegisteredMemory,
        dst_off: u64,
        bytes: &[u8],
    ) -> Res<()> {
        let at = self.stage_slot()?;
        // SAFETY: slot `at` of the staging (RECORD bytes), not in flight (flushed before reuse).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.stage.add(at * RECORD / 8).cast::<u8>(),
                bytes.len().min(8),
            )
        };
        let conn = Arc::clone(self.conn(peer)?);
        conn.write(
            dst,
            dst_off,
            &self.stage_mem,
            (at * RECORD) as u64,
            bytes.len() as u64,
        )?;
        self.dirty[peer] = true;
        Ok(())
    }

    /// Whether `peer`'s ring for this rank has room for a record.
    pub fn has_room(&self, peer: usize) -> bool {
        // SAFETY: word 2 * peer of the acknowledgements, written by `peer` only.
        let credit =
            unsafe { AtomicU64::from_ptr(self.acks.add(2 * peer)) }.load(Ordering::Acquire);
        self.sent[peer].wrapping_sub(credit) < RING as u64
    }

    /// Sends `r` into `peer`'s inbox (the caller saw [`Hosts::has_room`]); a get is counted as
    /// asked.
    pub fn send(&mut self, peer: usize, r: &Record) -> Res<()> {
        let n = self.conns.len();
        let at = self.stage_slot()?;
        let words = r.words();
        // SAFETY: slot `at` of the staging, as in `put_inline`.
        unsafe {
            std::ptr::copy_nonoverlapping(words.as_ptr(), self.stage.add(at * RECORD / 8), 8)
        };
        let inbox = self.inbox_at[peer]
            .as_ref()
            .ok_or_else(|| Failure::internal(format!("no inbox of rank {peer}")))?;
        let slot = self.sent[peer] as usize % RING;
        let off = tails(n) + (self.rank * RING + slot) * RECORD;
        let conn = Arc::clone(self.conn(peer)?);
        conn.write(
            inbox,
            off as u64,
            &self.stage_mem,
            (at * RECORD) as u64,
            RECORD as u64,
        )?;
        self.sent[peer] += 1;
        conn.update_and_sync(inbox, (self.rank * 8) as u64, self.sent[peer])?;
        if r.kind == kind::GET {
            self.asked[peer] += 1;
        }
        self.dirty[peer] = true;
        Ok(())
    }

    /// A staging slot not in flight: when every slot is used, the connections are flushed
    /// first.
    fn stage_slot(&mut self) -> Res<usize> {
        if self.staged == STAGE {
            self.flush()?;
        }
        self.staged += 1;
        Ok(self.staged - 1)
    }

    /// Waits until every write of this rank has landed; the staging is free again.
    pub fn flush(&mut self) -> Res<()> {
        for p in 0..self.conns.len() {
            if std::mem::take(&mut self.dirty[p]) {
                self.conn(p)?.flush(self.deadline)?;
            }
        }
        self.staged = 0;
        Ok(())
    }

    /// Whether every get asked of another host has been served.
    pub fn gets_done(&self) -> bool {
        (0..self.conns.len()).all(|p| {
            // SAFETY: word 2 * p + 1 of the acknowledgements, written by `p` only.
            let served =
                unsafe { AtomicU64::from_ptr(self.acks.add(2 * p + 1)) }.load(Ordering::Acquire);
            served >= self.asked[p]
        })
    }

    /// The records that arrived from the ranks of other hosts since the last call, each with
    /// its sender, in order per sender.
    pub fn arrived(&mut self) -> Vec<(usize, Record)> {
        let n = self.conns.len();
        let mut out = Vec::new();
        for s in 0..n {
            if self.conns[s].is_none() {
                continue;
            }
            // SAFETY: tail `s` of the inbox, stored by rank `s` after its records.
            let tail = unsafe { AtomicU64::from_ptr(self.inbox.add(s)) }.load(Ordering::Acquire);
            while self.taken[s] < tail {
                let slot = self.taken[s] as usize % RING;
                let mut w = [0u64; 8];
                // SAFETY: record `slot` of ring `s`, inside the inbox; its sender does not
                // overwrite it before this rank gives credit for it.
                unsafe {
                    let at = self.inbox.add((tails(n) + (s * RING + slot) * RECORD) / 8);
                    for (i, v) in w.iter_mut().enumerate() {
                        *v = std::ptr::read_volatile(at.add(i));
                    }
                }
                out.push((s, Record::from_words(&w)));
                self.taken[s] += 1;
            }
        }
        out
    }

    /// Serves `peer`'s get: writes `len` bytes of this rank's `src` (at `src_off`) into its
    /// `dst` (at `dst_off`), then stores how many of its gets were served.
    pub fn serve_get(
        &mut self,
        peer: usize,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Res<()> {
        if len > 0 {
            self.put(peer, dst, dst_off, src, src_off, len)?;
        }
        let conn = Arc::clone(self.conn(peer)?);
        self.served[peer] += 1;
        let acks = self.acks_at[peer]
            .as_ref()
            .ok_or_else(|| Failure::internal(format!("no acknowledgements of rank {peer}")))?;
        conn.update_and_sync(acks, (self.rank * 16 + 8) as u64, self.served[peer])?;
        self.dirty[peer] = true;
        Ok(())
    }

    /// Gives each sender credit for the records taken from it. A sender that is gone (its
    /// device communicator destroyed, at the end of a run, before this rank's) needs none: the
    /// failure is logged, not raised. Credit needs no flush (nothing is ordered behind it).
    pub fn give_credit(&mut self) -> Res<()> {
        for s in 0..self.conns.len() {
            if self.taken[s] != self.credited[s] {
                let acks = self.acks_at[s]
                    .as_ref()
                    .ok_or_else(|| Failure::internal(format!("no acknowledgements of rank {s}")))?;
                let conn = Arc::clone(self.conn(s)?);
                match conn.update_and_sync(acks, (self.rank * 16) as u64, self.taken[s]) {
                    Ok(()) => self.credited[s] = self.taken[s],
                    Err(e) => tracing::debug!(
                        "rank {}: GIN credit for rank {s} not given (it is gone?): {e}",
                        self.rank
                    ),
                }
            }
        }
        Ok(())
    }

    /// The deadline of any one wait.
    pub fn deadline(&self) -> Instant {
        Instant::now() + self.deadline
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let r = Record {
            kind: kind::GET,
            ctx: 31,
            id: 0xfff_fffe,
            value: u64::MAX - 3,
            at: (1 << 40, 7),
            back: (12, 1 << 62),
        };
        assert_eq!(Record::from_words(&r.words()), r);
    }
}
