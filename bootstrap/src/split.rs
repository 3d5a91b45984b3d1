//! Views over one bootstrap's connections: [`Bootstrap::split`] (by color, ordered by key;
//! one all-gather) and [`Bootstrap::shrink`] (without given ranks, e.g. dead ones; no message
//! at all). A view numbers its members from 0, and its messages carry an id derived from its
//! parent's and its members, so views never read each other's messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp_base::{Error, Result};

use super::Bootstrap;
use super::shm::segment::ShmState;

impl Bootstrap {
    /// A view of the ranks that pass the same `color` (`None`: this rank joins no view and
    /// gets `None`), ordered by `key` then by rank. Collective over this bootstrap; reuses
    /// its connections (no new root, no new listener): a view's messages carry its own id.
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Bootstrap>> {
        let seq = self.split_seq.fetch_add(1, Ordering::Relaxed);
        let mut mine = [0u8; 9];
        mine[0] = u8::from(color.is_some());
        mine[1..5].copy_from_slice(&color.unwrap_or(0).to_le_bytes());
        mine[5..9].copy_from_slice(&key.to_le_bytes());
        let all = self.all_gather(&mine)?;
        let mut entries = Vec::with_capacity(self.nranks);
        for (r, e) in all.iter().enumerate() {
            let e: &[u8; 9] = e.as_slice().try_into().map_err(|_| {
                Error::malformed(
                    "bootstrap split",
                    format!("rank {r} sent {} bytes, expected 9", e.len()),
                )
            })?;
            if e[0] > 1 {
                return Err(Error::malformed(
                    "bootstrap split",
                    format!("rank {r} sent color flag {}", e[0]),
                ));
            }
            let c = u32::from_le_bytes([e[1], e[2], e[3], e[4]]);
            let k = u32::from_le_bytes([e[5], e[6], e[7], e[8]]);
            entries.push((e[0] == 1, c, k, r));
        }
        let Some(color) = color else {
            return Ok(None);
        };
        let mut group: Vec<(u32, usize)> = entries
            .iter()
            .filter(|e| e.0 && e.1 == color)
            .map(|e| (e.2, e.3))
            .collect();
        group.sort_unstable();
        let ranks: Vec<usize> = group.into_iter().map(|(_, r)| r).collect();
        Ok(Some(self.view(&ranks, &[1, seq, u64::from(color)])))
    }

    /// A view without the ranks in `exclude` (ranks of this bootstrap, e.g. dead ones), which
    /// every remaining rank must pass identically. Needs no message, so it works when the
    /// excluded ranks are gone; returns `None` on an excluded rank.
    pub fn shrink(&self, exclude: &[usize]) -> Result<Option<Bootstrap>> {
        for &r in exclude {
            self.check_peer(r)?;
        }
        if exclude.contains(&self.rank) {
            return Ok(None);
        }
        let ranks: Vec<usize> = (0..self.nranks).filter(|r| !exclude.contains(r)).collect();
        let mut ex: Vec<u64> = exclude.iter().map(|&r| r as u64).collect();
        ex.sort_unstable();
        ex.dedup();
        // Not the split counter: the excluded ranks make no call, so it would leave them a step
        // behind the others, and the next split's view ids would differ between ranks.
        let seq = {
            let mut s = self.shrinks.lock().unwrap_or_else(|p| p.into_inner());
            let n = s.entry(ex.clone()).or_insert(0);
            *n += 1;
            *n - 1
        };
        let mut salt = vec![2, seq];
        salt.extend(ex);
        Ok(Some(self.view(&ranks, &salt)))
    }

    /// The view of `ranks` (ranks of this view, in the new order) whose id derives from this
    /// view's id and `salt` (the same on every member).
    fn view(&self, ranks: &[usize], salt: &[u64]) -> Bootstrap {
        use std::hash::{Hash, Hasher};
        // SipHash with fixed keys: the same id in every process of the same build.
        let mut h = std::collections::hash_map::DefaultHasher::new();
        self.comm_id.hash(&mut h);
        salt.hash(&mut h);
        ranks.hash(&mut h);
        // Zero is the root view's id.
        let comm_id = h.finish().max(1);
        let rank = ranks.iter().position(|&r| r == self.rank).unwrap_or(0);
        let v = Bootstrap {
            rank,
            nranks: ranks.len(),
            local_rank: None,
            cfg: self.cfg.clone(),
            core: Arc::clone(&self.core),
            comm_id,
            members: ranks
                .iter()
                .map(|&r| self.members[r])
                .collect::<Vec<_>>()
                .into(),
            hosts: ranks
                .iter()
                .map(|&r| self.hosts[r])
                .collect::<Vec<_>>()
                .into(),
            host_cores: Arc::clone(&self.host_cores),
            crowded: true,
            coll_seq: AtomicU64::new(0),
            split_seq: AtomicU64::new(0),
            shrinks: Mutex::new(std::collections::HashMap::new()),
            shm: Mutex::new(ShmState::Untried),
        };
        Bootstrap {
            crowded: v.is_crowded(),
            ..v
        }
    }
}
