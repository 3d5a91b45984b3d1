//! Memory registration for IB: host memory by its address; device memory by its device
//! address, which the HCA reaches through peer memory (nvidia-peermem, amdgpu's peer-memory
//! client). dma-buf registration (`ibv_reg_dmabuf_mr`) needs a dma-buf fd from the GPU backend,
//! and the HAL exports none yet: where peer memory is missing too, the error says both.

use std::sync::Arc;

use mscclpp_hal::{BackendKind, BufferSlice, Error, MemoryKind, Result};

use super::device::IbDevice;
use super::qp::remote_access;
use super::verbs::MrKeys;

/// A registered region; deregistered when dropped.
pub(crate) struct IbMr {
    pub(crate) dev: Arc<IbDevice>,
    pub(crate) keys: MrKeys,
    /// The address registered (what a peer writes to).
    pub(crate) addr: u64,
    pub(crate) len: usize,
}

impl std::fmt::Debug for IbMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbMr")
            .field("device", &self.dev.name)
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("rkey", &self.keys.rkey)
            .finish()
    }
}

impl Drop for IbMr {
    fn drop(&mut self) {
        self.dev.verbs.dereg_mr(self.keys.handle);
    }
}

/// Whether the HCA should be given the host address of `slice` (host memory) rather than its
/// device address (GPU memory through peer memory).
fn host_visible(slice: &BufferSlice) -> Option<u64> {
    let host = slice.host_ptr()? as u64;
    let b = slice.buffer();
    (b.backend() == BackendKind::Host || b.kind() == MemoryKind::HostMapped).then_some(host)
}

/// Registers `slice` with `dev`, for writes and (unless `atomics` is false) atomics by peers.
pub(crate) fn register(dev: &Arc<IbDevice>, slice: &BufferSlice, atomics: bool) -> Result<IbMr> {
    let access = remote_access(atomics);
    let len = slice.len();
    let (addr, kind) = match host_visible(slice) {
        Some(a) => (a, "host"),
        None => (slice.ptr().0, "device"),
    };
    let keys = dev.verbs.reg_mr(dev.pd, addr, len, access).map_err(|e| {
        if kind == "host" {
            super::error::within(e, || format!("registering {len} bytes of host memory with IB{} ({})", dev.index, dev.name))
        } else {
            Error::unavailable(
                format!("registering {len} bytes of device memory with IB{} ({})", dev.index, dev.name),
                format!(
                    "neither dma-buf (the GPU backend exports no dma-buf fd) nor peer memory worked: ibv_reg_mr on the device address failed ({e}); load nvidia-peermem (NVIDIA) or use a kernel with the amdgpu peer-memory client (AMD)"
                ),
            )
        }
    })?;
    Ok(IbMr {
        dev: dev.clone(),
        keys,
        addr,
        len,
    })
}
