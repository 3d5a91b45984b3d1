//! CudaIpc: writes by the copy engine into the peer's memory mapped through the HAL's IPC
//! handles, on a stream the connection owns.
//!
//! The data never touches the TCP link; the link only tells the connection that the peer is
//! gone (a dead peer's mapped memory stays writable, so nothing else would).

use std::fmt;

use std::sync::Arc;
use std::time::{Duration, Instant};

use mscclpp_hal::{Error, Result, Stream};

use crate::link::{self, Health};
use crate::memory::RegisteredMemory;
use crate::offer::{Endpoint, LocalEndpoint};
use crate::ops::{Connection, check_dst, check_token, check_write};
use crate::transport::Transport;

/// A CudaIpc connection (see the module documentation).
pub struct CudaIpcConnection {
    local_rank: usize,
    remote_rank: usize,
    stream: Arc<dyn Stream>,
    health: Arc<Health>,
    /// Marks `health` dead when the link ends; dropped last (shuts the link).
    _watcher: link::Watcher,
}

impl fmt::Debug for CudaIpcConnection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaIpcConnection")
            .field("local_rank", &self.local_rank)
            .field("remote_rank", &self.remote_rank)
            .field("dead", &self.health.lock().dead)
            .finish()
    }
}

impl CudaIpcConnection {
    pub(crate) fn connect(local: LocalEndpoint, remote: &Endpoint) -> Result<Self> {
        let sock = link::establish(&local, remote)?;
        let (me, peer) = (local.endpoint.rank, remote.rank);
        let stream = local.ctx.device().create_stream()?;
        let health = Arc::new(Health::new(peer));
        let watcher = link::Watcher::start(sock, Transport::CudaIpc, (me, peer), health.clone())?;
        Ok(CudaIpcConnection {
            local_rank: me,
            remote_rank: peer,
            stream,
            health,
            _watcher: watcher,
        })
    }

    fn mapped(&self, dst: &RegisteredMemory) -> Result<mscclpp_hal::BufferSlice> {
        check_dst(self.remote_rank, dst)?;
        dst.mapped_slice().ok_or_else(|| {
            Error::invalid(format!(
                "destination memory of rank {} is not mapped here: it was registered for {}, not CudaIpc, or on another host",
                dst.rank(),
                dst.transports()
            ))
        })
    }
}

impl Connection for CudaIpcConnection {
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Result<()> {
        self.health.check()?;
        let mapped = self.mapped(dst)?;
        let src = check_write(
            self.local_rank,
            self.remote_rank,
            dst,
            dst_off,
            src,
            src_off,
            len,
        )?;
        if len == 0 {
            return Ok(());
        }
        let dst = mapped.slice(dst_off as usize..(dst_off + len) as usize)?;
        self.stream.copy(&dst, &src)
    }

    fn update_and_sync(&self, dst: &RegisteredMemory, dst_off: u64, new_value: u64) -> Result<()> {
        self.health.check()?;
        let mapped = self.mapped(dst)?;
        check_token(dst, dst_off)?;
        let token = mapped.slice(dst_off as usize..dst_off as usize + 8)?;
        self.stream.write_value64(&token, new_value)
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        self.health.check()?;
        self.stream.synchronize_timeout(timeout)?;
        // The copies may have gone into the memory of a peer that died meanwhile.
        self.health.check()?;
        tracing::debug!(
            rank = self.local_rank,
            peer = self.remote_rank,
            elapsed = ?started.elapsed(),
            "CudaIpc flush"
        );
        Ok(())
    }

    fn transport(&self) -> Transport {
        Transport::CudaIpc
    }

    fn local_rank(&self) -> usize {
        self.local_rank
    }

    fn remote_rank(&self) -> usize {
        self.remote_rank
    }
}
