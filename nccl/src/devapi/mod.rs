//! NCCL's device API (`nccl_device.h`, since NCCL 2.28): the host side of it, so that kernels
//! clients compile against NCCL's headers run on this library. What a kernel reads is laid out
//! here at the client's version ([`layout`]): a symmetric window is memory of `ncclMemAlloc`
//! (shareable: a file descriptor per allocation) mapped by every rank of the LSA team into one
//! range at a fixed stride ([`space`]); `ncclDevCommCreate` places the resources (LSA barriers,
//! the client's own) in one zeroed symmetric buffer and writes the `ncclDevComm` ([`devcomm`]).
//!
//! Served: LSA (load/store access to every rank of the host through symmetric windows, LSA
//! barriers, the window table, peer pointers) and GIN of the proxy type ([`gin`]), to the
//! ranks of other hosts through the transport between them ([`hosts`]). Refused, naming the
//! field: multimem (NVLink multicast: never created on the lent machines), CFT.

pub mod devcomm;
pub mod gin;
pub mod hosts;
pub mod layout;
pub mod space;

use std::sync::{Arc, Mutex};

use mscclpp::comm::Communicator;

use crate::error::Res;
use space::Space;

/// A communicator's device-API state: its symmetric space (made by the first symmetric call,
/// collectively) and its device communicators.
#[derive(Debug, Default)]
pub struct State {
    space: Mutex<Option<Arc<Space>>>,
    devcomms: Mutex<Vec<(u64, devcomm::DevComm)>>,
}

impl State {
    /// The symmetric space, made on first use (a collective call: only from collective calls).
    pub fn space(&self, comm: &Arc<Communicator>) -> Res<Arc<Space>> {
        let mut s = self.space.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(s) = &*s {
            return Ok(s.clone());
        }
        let made = Arc::new(Space::new(comm.clone())?);
        *s = Some(made.clone());
        Ok(made)
    }

    /// Keeps a device communicator until [`State::forget`].
    pub fn keep(&self, d: devcomm::DevComm) -> u64 {
        let key = d.resources.as_ref().map_or(0, |(m, _)| m.record.ptr().0);
        self.devcomms
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((key, d));
        key
    }

    /// Takes back the device communicator whose resource window is `key`.
    pub fn forget(&self, key: u64) -> Option<devcomm::DevComm> {
        let mut d = self.devcomms.lock().unwrap_or_else(|p| p.into_inner());
        let i = d.iter().position(|(k, _)| *k == key)?;
        Some(d.swap_remove(i).1)
    }
}

/// The LSA team of `rank` in a communicator whose ranks sit on `hosts` (see
/// [`space::lsa_team`]): `(lsaSize, lsaRank)`.
pub fn lsa_of(hosts: &[u32], rank: usize) -> (usize, usize) {
    let team = space::lsa_team(hosts, rank);
    (
        team.len(),
        team.iter().position(|&r| r == rank).unwrap_or(0),
    )
}
