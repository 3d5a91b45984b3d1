//! Switch channels: reduce and broadcast through multicast memory. On NVLink SHARP one
//! multicast address does it in hardware; on the host backend's emulation the handle lists every
//! member's buffer and the operations visit them one by one, with the same results.

pub use crate::dtype::ReduceOp;
use crate::error::{Error, Result};

/// What device code holds of a switch channel.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SwitchChannelDeviceHandle {
    /// This member's own buffer.
    pub device_ptr: u64,
    /// Hardware multicast address, or 0 under emulation.
    pub mc_ptr: u64,
    /// Address of an array of `num_members` member addresses (emulation), or 0.
    pub member_ptrs: u64,
    /// Bytes of each member's buffer.
    pub buffer_size: u64,
    /// Number of members.
    pub num_members: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

/// Element types a switch channel can reduce on the host.
pub trait Reducible: Copy + PartialOrd + 'static {
    /// `a op b`.
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! reducible {
    ($($t:ty => $add:ident, $mul:ident);* $(;)?) => {$(
        impl Reducible for $t {
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    // Avg combines as a sum; the caller divides by the member count.
                    ReduceOp::Sum | ReduceOp::Avg => a.$add(b),
                    ReduceOp::Prod => a.$mul(b),
                    ReduceOp::Min => if b < a { b } else { a },
                    ReduceOp::Max => if b > a { b } else { a },
                }
            }
        }
    )*};
}

trait FloatArith {
    fn fadd(self, b: Self) -> Self;
    fn fmul(self, b: Self) -> Self;
}
impl FloatArith for f32 {
    fn fadd(self, b: Self) -> Self {
        self + b
    }
    fn fmul(self, b: Self) -> Self {
        self * b
    }
}
impl FloatArith for f64 {
    fn fadd(self, b: Self) -> Self {
        self + b
    }
    fn fmul(self, b: Self) -> Self {
        self * b
    }
}

reducible! {
    f32 => fadd, fmul;
    f64 => fadd, fmul;
    i32 => wrapping_add, wrapping_mul;
    u32 => wrapping_add, wrapping_mul;
    i64 => wrapping_add, wrapping_mul;
    u64 => wrapping_add, wrapping_mul;
}

impl SwitchChannelDeviceHandle {
    fn members(&self) -> Result<Vec<u64>> {
        if self.member_ptrs == 0 {
            return Err(Error::unavailable(
                "switch channel on the host",
                "the handle has no emulated member list (hardware multicast cannot be driven from the CPU)",
            ));
        }
        // SAFETY: a handle with `member_ptrs` set points at `num_members` addresses for as long
        // as the channel lives (the communication layer keeps the array alive).
        Ok((0..self.num_members as usize)
            .map(|i| unsafe { std::ptr::read_volatile((self.member_ptrs as *const u64).add(i)) })
            .collect())
    }

    fn check(&self, offset: u64, count: usize, size: usize) -> Result<()> {
        let end = (count as u64)
            .checked_mul(size as u64)
            .and_then(|b| b.checked_add(offset));
        match end {
            Some(e) if e <= self.buffer_size && offset % size as u64 == 0 => Ok(()),
            _ => Err(Error::invalid(format!(
                "switch channel access of {count} elements of {size} bytes at offset {offset} outside a {}-byte buffer (or misaligned)",
                self.buffer_size
            ))),
        }
    }

    /// Reads `out.len()` elements at `offset` of every member and combines them with `op`.
    ///
    /// # Safety
    /// Every member buffer must be live for the call.
    pub unsafe fn reduce<T: Reducible>(
        &self,
        offset: u64,
        op: ReduceOp,
        out: &mut [T],
    ) -> Result<()> {
        self.check(offset, out.len(), std::mem::size_of::<T>())?;
        let members = self.members()?;
        for (i, o) in out.iter_mut().enumerate() {
            let mut acc: Option<T> = None;
            for &m in &members {
                // SAFETY: bounds and alignment checked above; member live (caller's contract).
                let v = unsafe { ((m + offset) as *const T).add(i).read_volatile() };
                acc = Some(match acc {
                    None => v,
                    Some(a) => T::combine(a, v, op),
                });
            }
            if let Some(a) = acc {
                *o = a;
            }
        }
        Ok(())
    }

    /// Stores `values` at `offset` in every member.
    ///
    /// # Safety
    /// As for [`Self::reduce`].
    pub unsafe fn broadcast<T: Copy>(&self, offset: u64, values: &[T]) -> Result<()> {
        self.check(offset, values.len(), std::mem::size_of::<T>())?;
        for m in self.members()? {
            for (i, v) in values.iter().enumerate() {
                // SAFETY: bounds and alignment checked above; member live (caller's contract).
                unsafe { ((m + offset) as *mut T).add(i).write_volatile(*v) };
            }
        }
        Ok(())
    }
}
