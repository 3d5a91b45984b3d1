//! The communicator: one rank's bootstrap, device and transport context, and the set-up
//! exchanges (registered memory, endpoints) that channels are built from.
//!
//! Set-up with a given peer is a conversation: both ranks must make the same set-up calls with
//! each other in the same order (as MSCCL++ programs do). Each call uses the next tag of a
//! per-peer sequence in the range `SETUP_TAG_BIT | n`, which user messages on the bootstrap must
//! leave alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp_hal::{BufferSlice, Device, Error, Result};
use mscclpp_transports::{
    AnyConnection, Endpoint, EndpointConfig, RegisteredMemory, TransportContext, TransportFlags,
};

use crate::bootstrap::Bootstrap;

/// Bootstrap tags with this bit set (and bit 63 clear) carry the communicator's set-up messages.
pub const SETUP_TAG_BIT: u64 = 1 << 62;

/// A rank's handle on the communication layer.
#[derive(Debug)]
pub struct Communicator {
    boot: Arc<Bootstrap>,
    ctx: Arc<TransportContext>,
    setup_seq: Mutex<HashMap<usize, u64>>,
}

impl Communicator {
    /// A communicator over an established bootstrap, using `device`.
    pub fn new(boot: Arc<Bootstrap>, device: Arc<dyn Device>) -> Self {
        let ctx = TransportContext::new(boot.rank(), device);
        Communicator {
            boot,
            ctx,
            setup_seq: Mutex::new(HashMap::new()),
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.boot.rank()
    }

    /// Number of ranks.
    pub fn nranks(&self) -> usize {
        self.boot.nranks()
    }

    /// The bootstrap.
    pub fn bootstrap(&self) -> &Arc<Bootstrap> {
        &self.boot
    }

    /// The device this rank uses.
    pub fn device(&self) -> &Arc<dyn Device> {
        self.ctx.device()
    }

    /// The transport context shared by this rank's connections and memories.
    pub fn context(&self) -> &Arc<TransportContext> {
        &self.ctx
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.nranks() || peer == self.rank() {
            return Err(Error::invalid(format!(
                "peer {peer} is not another rank of this communicator (rank {} of {})",
                self.rank(),
                self.nranks()
            )));
        }
        Ok(())
    }

    /// The tag of the next set-up message exchanged with `peer`.
    fn next_setup_tag(&self, peer: usize) -> u64 {
        let mut seq = self.setup_seq.lock().unwrap_or_else(|p| p.into_inner());
        let n = seq.entry(peer).or_insert(0);
        *n += 1;
        SETUP_TAG_BIT | *n
    }

    /// Sends `bytes` to `peer` and receives the peer's bytes of the same set-up step.
    pub fn exchange(&self, peer: usize, bytes: &[u8]) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        let tag = self.next_setup_tag(peer);
        self.boot.send(peer, tag, bytes)?;
        self.boot.recv(peer, tag)
    }

    /// Registers local memory for the given transports.
    pub fn register_memory(
        &self,
        slice: &BufferSlice,
        transports: TransportFlags,
    ) -> Result<RegisteredMemory> {
        RegisteredMemory::register(&self.ctx, slice, transports)
    }

    /// Sends a registered memory to `peer` and receives the one `peer` sends in the same step
    /// (mapped here where the transport maps memory).
    pub fn exchange_memory(&self, mem: &RegisteredMemory, peer: usize) -> Result<RegisteredMemory> {
        let bytes = self.exchange(peer, &mem.to_bytes())?;
        RegisteredMemory::from_bytes(&self.ctx, &bytes)
    }

    /// Connects to `peer` with the transport of `cfg` (both ranks call this with each other).
    pub fn connect(&self, peer: usize, cfg: EndpointConfig) -> Result<Arc<AnyConnection>> {
        self.check_peer(peer)?;
        let local = Endpoint::new(&self.ctx, cfg)?;
        let remote_bytes = self.exchange(peer, &local.endpoint().to_bytes())?;
        let remote = Endpoint::from_bytes(&remote_bytes)?;
        if remote.rank != peer {
            return Err(Error::Remote {
                rank: peer,
                message: format!("sent an endpoint of rank {}", remote.rank),
            });
        }
        Ok(Arc::new(mscclpp_transports::connect(local, &remote)?))
    }
}
