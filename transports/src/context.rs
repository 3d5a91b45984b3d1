//! [`TransportContext`]: what every connection and registered memory of one rank shares.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mscclpp_hal::{BufferSlice, Device, Result};

use crate::ib::device::{HCA_DEVICES, IbDevice, no_device};
use crate::ib::verbs::{self, Verbs};

/// One per rank and communicator, shared (`Arc`) by its endpoints, connections and registered
/// memories.
///
/// Besides the rank's identity it holds the registry of local memories registered for
/// Ethernet: an Ethernet receiver lands incoming writes only into memory found here, by the id
/// the sender names, so a peer can reach nothing this rank did not register.
pub struct TransportContext {
    rank: usize,
    device: Arc<dyn Device>,
    host_id: String,
    ethernet: Mutex<HashMap<u64, BufferSlice>>,
    // Ids are never reused, so a peer holding the id of memory that was since deregistered
    // gets "unknown memory" rather than landing in whatever took its place.
    next_id: AtomicU64,
    /// IB devices opened by this rank, by IB number: connections and registrations of one IBn
    /// share its protection domain.
    ib: Mutex<HashMap<u8, Arc<IbDevice>>>,
    /// The verbs table: libibverbs unless a test put its fake here.
    ib_verbs: Mutex<Option<Arc<dyn Verbs>>>,
}

impl fmt::Debug for TransportContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransportContext")
            .field("rank", &self.rank)
            .field("device", &self.device.info().name)
            .field("host_id", &self.host_id)
            .field("ethernet_memories", &self.registry().len())
            .finish()
    }
}

impl TransportContext {
    /// The context of `rank`, on `device`, with this host's id
    /// ([`mscclpp_hal::env::host_id`], which honours `MSCCLPP_HOSTID`).
    pub fn new(rank: usize, device: Arc<dyn Device>) -> Arc<Self> {
        Self::with_host_id(rank, device, mscclpp_hal::env::host_id())
    }

    /// As [`TransportContext::new`] with an explicit host id (ranks with equal ids are taken to
    /// share memory).
    pub fn with_host_id(rank: usize, device: Arc<dyn Device>, host_id: String) -> Arc<Self> {
        Arc::new(TransportContext {
            rank,
            device,
            host_id,
            ethernet: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            ib: Mutex::new(HashMap::new()),
            ib_verbs: Mutex::new(None),
        })
    }

    /// This rank's number.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The device this rank uses.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.device
    }

    /// This host's identity.
    pub fn host_id(&self) -> &str {
        &self.host_id
    }

    fn registry(&self) -> MutexGuard<'_, HashMap<u64, BufferSlice>> {
        // The map is only inserted into and removed from under the lock, so a poisoned lock
        // (a panic elsewhere while holding it) still guards a consistent map.
        self.ethernet.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `slice` a landing place for Ethernet writes; returns its id.
    pub(crate) fn register_ethernet(&self, slice: BufferSlice) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.registry().insert(id, slice);
        id
    }

    /// Removes a landing place (when its registered memory is dropped).
    pub(crate) fn deregister_ethernet(&self, id: u64) {
        self.registry().remove(&id);
    }

    /// The memory registered under `id`, if any.
    pub(crate) fn ethernet_memory(&self, id: u64) -> Option<BufferSlice> {
        self.registry().get(&id).cloned()
    }

    /// Uses `v` instead of libibverbs for this context's IB devices (the unit tests' fake).
    #[cfg(test)]
    pub(crate) fn use_verbs(&self, v: Arc<dyn Verbs>) {
        *self.ib_verbs.lock().unwrap_or_else(|p| p.into_inner()) = Some(v);
    }

    /// The device IBn means, opened on first use: `no RDMA device found (…)` when there is none
    /// (libibverbs missing, no device, or fewer devices than n+1).
    pub(crate) fn ib_device(&self, n: u8) -> Result<Arc<IbDevice>> {
        // Held across the open, so that two threads asking for IBn open it once.
        let mut devs = self.ib.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(d) = devs.get(&n) {
            return Ok(d.clone());
        }
        let chosen = self
            .ib_verbs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let v = match chosen {
            Some(v) => v,
            None => verbs::real().map_err(|why| no_device(n, why))?,
        };
        let hca = mscclpp_hal::env::get(HCA_DEVICES);
        let d = IbDevice::open(v, n, hca.as_deref())?;
        devs.insert(n, d.clone());
        Ok(d)
    }
}
