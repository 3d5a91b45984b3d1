//! The collectives over TCP: [`Bootstrap::all_gather`], [`Bootstrap::barrier`] and
//! [`Bootstrap::broadcast`], under the view's [`Schedule`]: binomial trees and Bruck's
//! all-gather (`log`), or a ring and a chain (`ring`). A crowded view (more ranks on a host
//! than it has cores) gathers along the tree, which wakes each rank fewer times. The barrier
//! of a view whose ranks share hosts runs in shared memory within each host (`shm`), with this
//! TCP barrier between one rank per host.
//!
//! Collectives take their tags from the reserved space (top bit set): operation in bits
//! 56..63, the view's sequence number below, so every rank must call them in the same order.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::config::Schedule;
use super::protocol::RESERVED_TAG_BIT;

impl Bootstrap {
    /// Gathers every rank's `data` (lengths may differ); the result is indexed by rank.
    pub fn all_gather(&self, data: &[u8]) -> Result<Vec<Vec<u8>>> {
        let tag = self.next_coll_tag(1);
        self.coll(tag, "all_gather", || match self.cfg.schedule {
            Schedule::Log if self.crowded => self.tree_all_gather(data, tag),
            Schedule::Log => self.bruck_all_gather(data, tag),
            Schedule::Ring => self.ring_all_gather(data, tag),
        })
    }

    /// Returns once every rank has entered the barrier. Ranks that share a host meet in shared
    /// memory when the view could set it up in its first barrier (see
    /// [`BootstrapConfig::shared_memory`]), with TCP between hosts only; else over TCP.
    pub fn barrier(&self) -> Result<()> {
        let mut state = self.shm.lock().unwrap_or_else(|p| p.into_inner());
        // Drawn under the lock: two threads' barriers on one view take their tags in the order
        // they run.
        let tag = self.next_coll_tag(2);
        self.coll(tag, "barrier", || self.barrier_impl(&mut state, tag))
    }

    /// Returns `root`'s `data` on every rank (`data` is ignored on the others).
    pub fn broadcast(&self, root: usize, data: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(root)?;
        let tag = self.next_coll_tag(3);
        let n = self.nranks;
        let v = (self.rank + n - root) % n;
        self.coll(tag, "broadcast", || {
            let msg = match self.cfg.schedule {
                Schedule::Log => {
                    // Binomial tree over ranks relative to the root: v receives from v minus
                    // its highest bit, then sends to v + 2^k for every 2^k above v.
                    let msg = if v == 0 {
                        data.to_vec()
                    } else {
                        let high = 1usize << (usize::BITS - 1 - v.leading_zeros());
                        let parent = (v - high + root) % n;
                        self.recv_one(parent, tag, "broadcast")?
                    };
                    let mut d = if v == 0 {
                        1
                    } else {
                        (1usize << (usize::BITS - 1 - v.leading_zeros())) << 1
                    };
                    while v + d < n {
                        self.send_raw((v + d + root) % n, tag, &msg)?;
                        d <<= 1;
                    }
                    msg
                }
                Schedule::Ring => {
                    let msg = if v == 0 {
                        data.to_vec()
                    } else {
                        self.recv_one((self.rank + n - 1) % n, tag, "broadcast")?
                    };
                    if v + 1 < n {
                        self.send_raw((self.rank + 1) % n, tag, &msg)?;
                    }
                    msg
                }
            };
            Ok(msg)
        })
    }

    pub(super) fn is_crowded(&self) -> bool {
        let mut per_host: HashMap<u32, u32> = HashMap::new();
        for &h in self.hosts.iter() {
            *per_host.entry(h).or_default() += 1;
        }
        per_host
            .iter()
            .any(|(&h, &n)| n > self.host_cores.get(h as usize).copied().unwrap_or(1))
    }

    pub(super) fn tcp_barrier(&self, tag: u64) -> Result<()> {
        match self.cfg.schedule {
            Schedule::Log => {
                // Binomial tree rooted at rank 0: arrivals go up, the release comes down. Each
                // rank wakes a handful of times per barrier, where a dissemination barrier wakes
                // every rank log2 N times: with many more ranks than cores the total work, not
                // the depth, sets the time.
                let children = tree_children(self.rank, self.nranks);
                if !children.is_empty() {
                    self.wait_all(&children, tag, "barrier")?;
                }
                if self.rank != 0 {
                    let parent = tree_parent(self.rank);
                    self.send_raw(parent, tag, &[])?;
                    self.recv_one(parent, tag, "barrier")?;
                }
                for c in children {
                    self.send_raw(c, tag, &[])?;
                }
                Ok(())
            }
            Schedule::Ring => self.ring_all_gather(&[], tag).map(|_| ()),
        }
    }

    /// Bruck's all-gather: in round k a rank sends the blocks it has (its own and the next
    /// 2^k - 1 ranks') to `rank - 2^k` and receives as many from `rank + 2^k`.
    pub(super) fn bruck_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let mut blocks: Vec<Vec<u8>> = vec![data.to_vec()];
        let mut d = 1;
        while blocks.len() < n {
            let cnt = d.min(n - blocks.len());
            let to = (self.rank + n - d) % n;
            let from = (self.rank + d) % n;
            self.send_raw(to, tag, &pack_blocks(&blocks[..cnt]))?;
            let got = self.recv_one(from, tag, "all_gather")?;
            blocks.extend(unpack_blocks(&got, cnt, from)?);
            d <<= 1;
        }
        // blocks[i] is rank (rank + i)'s.
        blocks.rotate_right(self.rank);
        Ok(blocks)
    }

    /// Tree all-gather: blocks go up the binomial tree (each subtree's blocks are contiguous
    /// ranks), the whole set comes down it. Two messages per rank where Bruck's algorithm sends
    /// `log2 N`: fewer wake-ups when the ranks outnumber the cores.
    pub(super) fn tree_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let children = tree_children(self.rank, n);
        let mut blocks = vec![data.to_vec()];
        if !children.is_empty() {
            let got = self.wait_all(&children, tag, "all_gather")?;
            for (&c, m) in children.iter().zip(&got) {
                blocks.extend(unpack_blocks(m, tree_size(c, n), c)?);
            }
        }
        if self.rank != 0 {
            let parent = tree_parent(self.rank);
            self.send_raw(parent, tag, &pack_blocks(&blocks))?;
            let all = self.recv_one(parent, tag, "all_gather")?;
            blocks = unpack_blocks(&all, n, parent)?;
        }
        if !children.is_empty() {
            let all = pack_blocks(&blocks);
            // Largest subtree first: it has the longest way to go.
            for &c in children.iter().rev() {
                self.send_raw(c, tag, &all)?;
            }
        }
        Ok(blocks)
    }

    /// Ring all-gather: N - 1 steps, each forwarding to the next rank the block received in
    /// the previous step.
    pub(super) fn ring_all_gather(&self, data: &[u8], tag: u64) -> Result<Vec<Vec<u8>>> {
        let n = self.nranks;
        let next = (self.rank + 1) % n;
        let prev = (self.rank + n - 1) % n;
        let mut out: Vec<Vec<u8>> = vec![Vec::new(); n];
        out[self.rank] = data.to_vec();
        for step in 0..n.saturating_sub(1) {
            let send_idx = (self.rank + n - step) % n;
            self.send_raw(next, tag, &out[send_idx])?;
            let recv_idx = (self.rank + n - step - 1) % n;
            out[recv_idx] = self.recv_one(prev, tag, "all_gather")?;
        }
        Ok(out)
    }

    /// A collective's tag: reserved bit, operation in bits 56..63, sequence number below.
    pub(super) fn next_coll_tag(&self, op: u64) -> u64 {
        let seq = self.coll_seq.fetch_add(1, Ordering::Relaxed) & ((1 << 56) - 1);
        RESERVED_TAG_BIT | (op << 56) | seq
    }
}

/// The parent of `v` (> 0) in the binomial tree rooted at 0: `v` without its lowest set bit.
/// The subtree of `v` is then the contiguous ranks `v .. v + lowbit(v)`.
pub(super) fn tree_parent(v: usize) -> usize {
    v & (v - 1)
}

/// The children of `v` in the binomial tree of `n` ranks rooted at 0: `v + 2^k` for every
/// `2^k` below `v`'s lowest set bit (every `2^k` for the root), in increasing order.
pub(super) fn tree_children(v: usize, n: usize) -> Vec<usize> {
    let low = if v == 0 {
        usize::MAX
    } else {
        v & v.wrapping_neg()
    };
    let mut out = Vec::new();
    let mut d = 1;
    while d < low && v + d < n {
        out.push(v + d);
        d <<= 1;
    }
    out
}

/// The size of `v`'s subtree in the binomial tree of `n` ranks.
pub(super) fn tree_size(v: usize, n: usize) -> usize {
    if v == 0 {
        n
    } else {
        (v & v.wrapping_neg()).min(n - v)
    }
}

/// Encodes all-gather blocks: count, then each block's length and bytes.
pub(super) fn pack_blocks(blocks: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = blocks.iter().map(|b| 8 + b.len()).sum();
    let mut v = Vec::with_capacity(4 + total);
    v.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for b in blocks {
        v.extend_from_slice(&(b.len() as u64).to_le_bytes());
        v.extend_from_slice(b);
    }
    v
}

/// Decodes exactly `want` blocks from `from`'s all-gather message, checking every length
/// against the bytes present before taking them.
pub(super) fn unpack_blocks(buf: &[u8], want: usize, from: usize) -> Result<Vec<Vec<u8>>> {
    let bad = |why: String| {
        Error::malformed(
            "bootstrap all-gather message",
            format!("from rank {from}: {why}"),
        )
    };
    let count = buf
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or_else(|| bad("shorter than its block count".into()))? as usize;
    if count != want {
        return Err(bad(format!("{count} blocks, expected {want}")));
    }
    let mut out = Vec::with_capacity(want);
    let mut at = 4;
    for i in 0..want {
        let len = buf
            .get(at..at + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| bad(format!("cut short in block {i}'s length")))?;
        at += 8;
        let end = usize::try_from(len)
            .ok()
            .and_then(|l| at.checked_add(l))
            .filter(|&e| e <= buf.len())
            .ok_or_else(|| {
                bad(format!(
                    "block {i} declares {len} bytes, {} remain",
                    buf.len() - at
                ))
            })?;
        out.push(buf[at..end].to_vec());
        at = end;
    }
    if at != buf.len() {
        return Err(bad(format!(
            "{} bytes after the last block",
            buf.len() - at
        )));
    }
    Ok(out)
}
