//! LL ("low-latency") packets: data and a flag written together, so that a reader knows the
//! data has arrived by seeing the flag — no separate signal, one memory round trip.
//!
//! An [`LL16Packet`] carries 8 bytes of data in 16 bytes (two 4-byte halves, each with its own
//! copy of the flag); an [`LL8Packet`] carries 4 bytes in 8. GPUs write a packet with one
//! vector store; the host backend writes each 8-byte `{data, flag}` pair as one atomic store,
//! so every half is self-validating exactly as on a GPU.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{atomic_u64, spin_until};
use crate::error::{Error, Result};

/// 16-byte packet: two 4-byte data words, each followed by the flag.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LL16Packet {
    /// Low data word.
    pub data1: u32,
    /// Flag of the low word.
    pub flag1: u32,
    /// High data word.
    pub data2: u32,
    /// Flag of the high word.
    pub flag2: u32,
}

/// 8-byte packet: one 4-byte data word and the flag.
#[repr(C, align(8))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LL8Packet {
    /// Data word.
    pub data: u32,
    /// Flag.
    pub flag: u32,
}

fn pair(data: u32, flag: u32) -> u64 {
    u64::from(data) | (u64::from(flag) << 32)
}

impl LL16Packet {
    /// Bytes of data one packet carries.
    pub const DATA_BYTES: usize = 8;

    /// Writes `value` with `flag` into the packet at `addr`.
    ///
    /// # Safety
    /// `addr` must be a live, 16-byte aligned packet slot accessed only through these functions.
    pub unsafe fn write(addr: u64, value: u64, flag: u32) {
        // SAFETY: caller's contract; both halves are aligned 8-byte words inside the slot.
        let (lo, hi) = unsafe { (atomic_u64(addr), atomic_u64(addr + 8)) };
        lo.store(pair(value as u32, flag), Ordering::Relaxed);
        hi.store(pair((value >> 32) as u32, flag), Ordering::Relaxed);
    }

    /// Reads the packet at `addr` once both halves carry `flag`; at most `timeout`.
    ///
    /// # Safety
    /// As for [`Self::write`].
    pub unsafe fn read(addr: u64, flag: u32, timeout: Duration) -> Result<u64> {
        // SAFETY: caller's contract.
        let (lo, hi) = unsafe { (atomic_u64(addr), atomic_u64(addr + 8)) };
        let (mut a, mut b) = (0u64, 0u64);
        spin_until(
            timeout,
            || format!("LL16 packet at {addr:#x} to carry flag {flag}"),
            || {
                a = lo.load(Ordering::Relaxed);
                b = hi.load(Ordering::Relaxed);
                (a >> 32) as u32 == flag && (b >> 32) as u32 == flag
            },
        )?;
        Ok((a & 0xffff_ffff) | (b << 32))
    }
}

impl LL8Packet {
    /// Bytes of data one packet carries.
    pub const DATA_BYTES: usize = 4;

    /// Writes `value` with `flag` into the packet at `addr`.
    ///
    /// # Safety
    /// `addr` must be a live, 8-byte aligned packet slot accessed only through these functions.
    pub unsafe fn write(addr: u64, value: u32, flag: u32) {
        // SAFETY: caller's contract.
        unsafe { atomic_u64(addr) }.store(pair(value, flag), Ordering::Relaxed);
    }

    /// Reads the packet at `addr` once it carries `flag`; at most `timeout`.
    ///
    /// # Safety
    /// As for [`Self::write`].
    pub unsafe fn read(addr: u64, flag: u32, timeout: Duration) -> Result<u32> {
        // SAFETY: caller's contract.
        let w = unsafe { atomic_u64(addr) };
        let mut v = 0u64;
        spin_until(
            timeout,
            || format!("LL8 packet at {addr:#x} to carry flag {flag}"),
            || {
                v = w.load(Ordering::Relaxed);
                (v >> 32) as u32 == flag
            },
        )?;
        Ok(v as u32)
    }
}

/// Which packet format a packet copy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PacketKind {
    /// [`LL16Packet`]: 8 data bytes per 16-byte packet.
    LL16,
    /// [`LL8Packet`]: 4 data bytes per 8-byte packet.
    LL8,
}

impl PacketKind {
    /// Data bytes per packet.
    pub fn data_bytes(self) -> usize {
        match self {
            PacketKind::LL16 => LL16Packet::DATA_BYTES,
            PacketKind::LL8 => LL8Packet::DATA_BYTES,
        }
    }

    /// Bytes of one packet.
    pub fn packet_bytes(self) -> usize {
        self.data_bytes() * 2
    }
}

/// The share of `n` items that thread `tid` of `nthreads` takes: a contiguous range.
pub fn thread_share(n: usize, tid: usize, nthreads: usize) -> std::ops::Range<usize> {
    let nthreads = nthreads.max(1);
    let per = n.div_ceil(nthreads);
    let start = (tid * per).min(n);
    start..(start + per).min(n)
}

fn check_packet_args(kind: PacketKind, bytes: usize, data: u64, packets: u64) -> Result<()> {
    if bytes % kind.data_bytes() != 0 {
        return Err(Error::invalid(format!(
            "{bytes} bytes is not a whole number of {kind:?} packets ({} data bytes each)",
            kind.data_bytes()
        )));
    }
    if data % kind.data_bytes() as u64 != 0 || packets % kind.packet_bytes() as u64 != 0 {
        return Err(Error::invalid(format!(
            "{kind:?} packet copy with misaligned addresses: data {data:#x}, packets {packets:#x}"
        )));
    }
    Ok(())
}

/// Writes `bytes` of data at `data` as packets carrying `flag` at `packets` (packet `i` holds
/// data bytes `i * data_bytes ..`); thread `tid` of `nthreads` writes its share.
///
/// # Safety
/// `data` must address `bytes` readable bytes and `packets` `bytes * 2` bytes of packet slots,
/// both live; packet slots are only accessed through packet functions meanwhile.
pub unsafe fn put_packets(
    kind: PacketKind,
    packets: u64,
    data: u64,
    bytes: usize,
    flag: u32,
    tid: usize,
    nthreads: usize,
) -> Result<()> {
    check_packet_args(kind, bytes, data, packets)?;
    let n = bytes / kind.data_bytes();
    for i in thread_share(n, tid, nthreads) {
        let src = data + (i * kind.data_bytes()) as u64;
        let slot = packets + (i * kind.packet_bytes()) as u64;
        // SAFETY: `i < n` keeps both addresses inside the ranges the caller vouched for;
        // alignment was checked above.
        unsafe {
            match kind {
                PacketKind::LL16 => {
                    LL16Packet::write(slot, std::ptr::read_volatile(src as *const u64), flag)
                }
                PacketKind::LL8 => {
                    LL8Packet::write(slot, std::ptr::read_volatile(src as *const u32), flag)
                }
            }
        }
    }
    Ok(())
}

/// Reads packets carrying `flag` at `packets` into `bytes` of data at `data`, waiting for each
/// (at most `timeout` per packet); thread `tid` of `nthreads` reads its share.
///
/// # Safety
/// As for [`put_packets`], with `data` writable.
#[allow(clippy::too_many_arguments)]
pub unsafe fn unpack_packets(
    kind: PacketKind,
    data: u64,
    packets: u64,
    bytes: usize,
    flag: u32,
    tid: usize,
    nthreads: usize,
    timeout: Duration,
) -> Result<()> {
    check_packet_args(kind, bytes, data, packets)?;
    let n = bytes / kind.data_bytes();
    for i in thread_share(n, tid, nthreads) {
        let dst = data + (i * kind.data_bytes()) as u64;
        let slot = packets + (i * kind.packet_bytes()) as u64;
        // SAFETY: `i < n` keeps both addresses inside the caller's ranges; alignment checked.
        unsafe {
            match kind {
                PacketKind::LL16 => std::ptr::write_volatile(
                    dst as *mut u64,
                    LL16Packet::read(slot, flag, timeout)?,
                ),
                PacketKind::LL8 => {
                    std::ptr::write_volatile(dst as *mut u32, LL8Packet::read(slot, flag, timeout)?)
                }
            }
        }
    }
    Ok(())
}
