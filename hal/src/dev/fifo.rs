//! The proxy FIFO: a power-of-two ring of 16-byte triggers in host-mapped memory through which
//! device code asks the host proxy to move data (port channels).
//!
//! Protocol (the same in the `.cuh` mirror):
//! - the device claims position `p` with an atomic add on `head`, waits until the slot is free
//!   (`p - tail < size`), writes `fst` and then publishes `snd` with a release store whose top
//!   bit is the lap parity of `p` (`1` on even laps, `0` on odd ones), so a zeroed ring reads as
//!   empty and a slot left from the previous lap is never mistaken for a new trigger;
//! - the proxy consumes strictly in order: at position `t` it acquire-loads `snd` of slot
//!   `t % size` until the parity is that of `t`'s lap, reads `fst`, handles the trigger, then
//!   release-stores `tail = t + 1`;
//! - `sync(p)` on the device waits until `tail > p`, i.e. the proxy has handled the trigger
//!   (a `SYNC` trigger makes the proxy flush its connection before advancing the tail).

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{atomic_u64, spin_until};
use crate::error::{Error, Result};

/// Kinds of work a trigger asks for; combined as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TriggerType;

impl TriggerType {
    /// Copy `size` bytes from the source memory to the destination memory.
    pub const DATA: u64 = 1;
    /// Signal the peer's semaphore (after the data, if both are set).
    pub const FLAG: u64 = 2;
    /// Flush the connection before acknowledging (the device waits for it).
    pub const SYNC: u64 = 4;
}

/// One 16-byte request from device to proxy.
///
/// `fst`: bits 0–31 size, 32–63 source offset. `snd`: bits 0–31 destination offset, 32–40
/// source memory id, 41–49 destination memory id, 50–52 [`TriggerType`] bits, 53–62 semaphore
/// (channel) id, 63 lap parity. Offsets and sizes are therefore below 4 GiB, memory ids below
/// 512 and semaphore ids below 1024, as in MSCCL++.
#[repr(C, align(16))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProxyTrigger {
    /// Size and source offset.
    pub fst: u64,
    /// Destination offset, memory ids, type, semaphore id and parity.
    pub snd: u64,
}

/// Largest memory id a trigger can carry.
pub const MAX_MEMORY_ID: u32 = (1 << 9) - 1;
/// Largest semaphore id a trigger can carry.
pub const MAX_SEMAPHORE_ID: u32 = (1 << 10) - 1;
const PARITY: u64 = 1 << 63;

impl ProxyTrigger {
    /// Builds a trigger, checking every field fits.
    pub fn new(
        kind: u64,
        dst_mem: u32,
        dst_off: u64,
        src_mem: u32,
        src_off: u64,
        size: u64,
        semaphore_id: u32,
    ) -> Result<Self> {
        let fits32 = |v: u64, what: &str| {
            if v > u64::from(u32::MAX) {
                Err(Error::invalid(format!(
                    "port channel {what} {v} does not fit the trigger's 32 bits"
                )))
            } else {
                Ok(v)
            }
        };
        let (size, src_off, dst_off) = (
            fits32(size, "size")?,
            fits32(src_off, "source offset")?,
            fits32(dst_off, "destination offset")?,
        );
        if dst_mem > MAX_MEMORY_ID || src_mem > MAX_MEMORY_ID {
            return Err(Error::invalid(format!(
                "memory ids {src_mem}/{dst_mem}: a trigger carries ids up to {MAX_MEMORY_ID}"
            )));
        }
        if semaphore_id > MAX_SEMAPHORE_ID {
            return Err(Error::invalid(format!(
                "semaphore id {semaphore_id}: a trigger carries ids up to {MAX_SEMAPHORE_ID}"
            )));
        }
        if kind == 0 || kind > 7 {
            return Err(Error::invalid(format!("trigger type bits {kind:#b}")));
        }
        Ok(ProxyTrigger {
            fst: size | (src_off << 32),
            snd: dst_off
                | (u64::from(src_mem) << 32)
                | (u64::from(dst_mem) << 41)
                | (kind << 50)
                | (u64::from(semaphore_id) << 53),
        })
    }

    /// Bytes to move.
    pub fn size(&self) -> u64 {
        self.fst & 0xffff_ffff
    }
    /// Offset in the source memory.
    pub fn src_offset(&self) -> u64 {
        self.fst >> 32
    }
    /// Offset in the destination memory.
    pub fn dst_offset(&self) -> u64 {
        self.snd & 0xffff_ffff
    }
    /// Source memory id.
    pub fn src_memory(&self) -> u32 {
        ((self.snd >> 32) & 0x1ff) as u32
    }
    /// Destination memory id.
    pub fn dst_memory(&self) -> u32 {
        ((self.snd >> 41) & 0x1ff) as u32
    }
    /// [`TriggerType`] bits.
    pub fn kind(&self) -> u64 {
        (self.snd >> 50) & 0x7
    }
    /// Semaphore (channel) id.
    pub fn semaphore_id(&self) -> u32 {
        ((self.snd >> 53) & 0x3ff) as u32
    }

    /// The parity bit a trigger published at position `pos` of a ring of `size` carries.
    pub fn parity_for(pos: u64, size: u64) -> u64 {
        if (pos / size) % 2 == 0 { PARITY } else { 0 }
    }

    /// Whether a `snd` word read from the slot of position `pos` is the trigger of that position.
    pub fn is_published(snd: u64, pos: u64, size: u64) -> bool {
        snd & PARITY == Self::parity_for(pos, size)
    }

    /// The trigger without its parity bit.
    pub fn without_parity(self) -> Self {
        ProxyTrigger {
            fst: self.fst,
            snd: self.snd & !PARITY,
        }
    }
}

/// What device code holds of a FIFO.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FifoDeviceHandle {
    /// Address of `size` [`ProxyTrigger`] slots (host-mapped memory).
    pub triggers: u64,
    /// Address of the 64-bit count of claimed positions (device atomics).
    pub head: u64,
    /// Address of the 64-bit count of positions the proxy has handled (written by the proxy).
    pub tail: u64,
    /// Number of slots, a power of two.
    pub size: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

impl FifoDeviceHandle {
    /// Claims a position, waits for its slot to be free and publishes `trigger` there; returns
    /// the position (for [`Self::sync`]).
    ///
    /// A push that times out has claimed a position it never fills, so the proxy stops there:
    /// the FIFO is unusable afterwards (as on a GPU, where a push cannot give up). A timeout
    /// here means the proxy has stopped or is stuck; the error says so.
    ///
    /// # Safety
    /// The handle's addresses must be live and laid out as documented, accessed atomically.
    pub unsafe fn push(&self, trigger: ProxyTrigger, timeout: Duration) -> Result<u64> {
        let size = u64::from(self.size);
        if size == 0 || !size.is_power_of_two() {
            return Err(Error::invalid(format!(
                "FIFO of {size} slots: the size must be a power of two"
            )));
        }
        // SAFETY: caller's contract.
        let (head, tail) = unsafe { (atomic_u64(self.head), atomic_u64(self.tail)) };
        let pos = head.fetch_add(1, Ordering::Relaxed);
        spin_until(
            timeout,
            || {
                format!(
                    "a free FIFO slot for position {pos} (the proxy has handled {} positions of a \
                     {size}-slot ring; it has stopped or is stuck, and this FIFO is now unusable)",
                    tail.load(Ordering::Relaxed)
                )
            },
            || pos - tail.load(Ordering::Acquire) < size,
        )?;
        let slot = self.triggers + (pos % size) * 16;
        // SAFETY: `slot` is inside the ring (caller's contract) and 16-byte aligned; the slot is
        // ours until we publish: the proxy has moved past its previous use (checked above) and no
        // other producer holds position `pos`.
        unsafe {
            atomic_u64(slot).store(trigger.fst, Ordering::Relaxed);
            atomic_u64(slot + 8).store(
                trigger.without_parity().snd | ProxyTrigger::parity_for(pos, size),
                Ordering::Release,
            );
        }
        Ok(pos)
    }

    /// Waits until the proxy has handled position `pos`.
    ///
    /// # Safety
    /// As for [`Self::push`].
    pub unsafe fn sync(&self, pos: u64, timeout: Duration) -> Result<()> {
        // SAFETY: caller's contract.
        let tail = unsafe { atomic_u64(self.tail) };
        spin_until(
            timeout,
            || {
                format!(
                    "the proxy to handle FIFO position {pos} (it has handled {})",
                    tail.load(Ordering::Relaxed)
                )
            },
            || tail.load(Ordering::Acquire) > pos,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_are_checked() {
        let t = ProxyTrigger::new(
            TriggerType::DATA | TriggerType::FLAG,
            511,
            0xdead_beef,
            3,
            77,
            4096,
            1023,
        )
        .unwrap();
        assert_eq!(
            (
                t.kind(),
                t.dst_memory(),
                t.dst_offset(),
                t.src_memory(),
                t.src_offset(),
                t.size(),
                t.semaphore_id()
            ),
            (3, 511, 0xdead_beef, 3, 77, 4096, 1023)
        );
        assert!(ProxyTrigger::new(1, 0, 1 << 32, 0, 0, 1, 0).is_err());
        assert!(ProxyTrigger::new(1, 512, 0, 0, 0, 1, 0).is_err());
        assert!(ProxyTrigger::new(1, 0, 0, 0, 0, 1, 1024).is_err());
        assert!(ProxyTrigger::new(0, 0, 0, 0, 0, 1, 0).is_err());
        // Parity alternates by lap and a zeroed slot is never "published" on lap 0.
        assert!(!ProxyTrigger::is_published(0, 0, 8));
        assert!(ProxyTrigger::is_published(0, 8, 8));
        assert!(ProxyTrigger::is_published(PARITY, 16, 8));
    }
}
