//! The [`Connection`] trait every transport's connection implements, and the argument checks
//! the implementations share. The leaf of the connection modules: the CudaIpc and Ethernet
//! connections implement the trait, and the dispatching enum imports those implementations.

use std::time::Duration;

use enum_dispatch::enum_dispatch;
use mscclpp_hal::{BufferSlice, Error, Result};

use crate::memory::{RegisteredMemory, check_range};
use crate::transport::Transport;

/// A connection from this rank to one peer, MSCCL++-style: one-sided writes into the peer's
/// registered memory, token updates ordered behind them, and flushes.
///
/// Operations of one connection are ordered: the peer observes a write or update only after
/// every earlier one of the same connection. Errors after the peer died are
/// [`Error::Remote`] naming it.
#[enum_dispatch]
pub trait Connection: Send + Sync {
    /// Writes `len` bytes of local `src` (from `src_off`) into the peer's `dst` (from
    /// `dst_off`). Returns once the bytes are on their way; [`Connection::flush`] waits for them
    /// to land. The source may be reused when this returns on Ethernet (it is read before
    /// returning); on CudaIpc and IB only after a flush, as on a GPU.
    fn write(
        &self,
        dst: &RegisteredMemory,
        dst_off: u64,
        src: &RegisteredMemory,
        src_off: u64,
        len: u64,
    ) -> Result<()>;

    /// Stores the 64-bit `new_value` at `dst + dst_off` (8-byte aligned) so that the peer sees
    /// it only after every earlier write of this connection: how a semaphore is signalled
    /// through the proxy.
    fn update_and_sync(&self, dst: &RegisteredMemory, dst_off: u64, new_value: u64) -> Result<()>;

    /// Returns once every earlier write and update has landed in the peer's memory;
    /// [`Error::Timeout`] past `timeout`, [`Error::Remote`] if the peer died.
    fn flush(&self, timeout: Duration) -> Result<()>;

    /// The transport used.
    fn transport(&self) -> Transport;

    /// This rank.
    fn local_rank(&self) -> usize;

    /// The peer's rank.
    fn remote_rank(&self) -> usize;
}

/// The ranges a write touches, checked: the peer's destination and the local source.
pub(crate) fn check_write(
    local_rank: usize,
    remote_rank: usize,
    dst: &RegisteredMemory,
    dst_off: u64,
    src: &RegisteredMemory,
    src_off: u64,
    len: u64,
) -> Result<BufferSlice> {
    check_dst(remote_rank, dst)?;
    let Some(src_slice) = src.local_slice() else {
        return Err(Error::invalid(format!(
            "write source must be memory rank {local_rank} registered itself; it is rank {}'s",
            src.rank()
        )));
    };
    check_range("write destination", dst_off, len, dst.len())?;
    check_range("write source", src_off, len, src.len())?;
    // Both ends were checked against registered lengths, which fit a usize locally.
    src_slice.slice(src_off as usize..(src_off + len) as usize)
}

/// Checks that `dst` is the peer's memory.
pub(crate) fn check_dst(remote_rank: usize, dst: &RegisteredMemory) -> Result<()> {
    if dst.is_local() || dst.rank() != remote_rank {
        return Err(Error::invalid(format!(
            "destination must be memory of rank {remote_rank} (this connection's peer) received with RegisteredMemory::from_bytes; it is {} memory of rank {}",
            if dst.is_local() { "local" } else { "remote" },
            dst.rank()
        )));
    }
    Ok(())
}

/// Checks a token update's place.
pub(crate) fn check_token(dst: &RegisteredMemory, dst_off: u64) -> Result<()> {
    if dst_off % 8 != 0 {
        return Err(Error::invalid(format!(
            "update_and_sync offset {dst_off} is not 8-byte aligned"
        )));
    }
    check_range("update_and_sync destination", dst_off, 8, dst.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::host_ctx;

    #[test]
    fn token_place_is_checked() {
        let ctx = host_ctx(0);
        let buf = ctx
            .device()
            .alloc(16, mscclpp_hal::MemoryKind::Device)
            .unwrap();
        let m = RegisteredMemory::register(&ctx, &buf.full(), Transport::Ethernet.into()).unwrap();
        assert!(check_token(&m, 8).is_ok());
        assert!(
            check_token(&m, 4)
                .unwrap_err()
                .to_string()
                .contains("aligned")
        );
        assert!(
            check_token(&m, 16)
                .unwrap_err()
                .to_string()
                .contains("16 bytes")
        );
        // a local memory is not a destination
        let e = check_dst(1, &m).unwrap_err().to_string();
        assert!(e.contains("rank 1") && e.contains("local"), "{e}");
    }
}
