//! The host kernel of `mscclpp_hier_xchg`: the rounds of `spec.md`, one worker.

use std::sync::atomic::Ordering;

use mscclpp_hal::dev::{DEFAULT_WAIT, PortChannelDeviceHandle};
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, ReduceOp, Result};

use super::args::{HierArgs, MAX_HOSTS};
use crate::algorithms::host_common::{copy, reduce_ranks, store, word};

fn check(a: &HierArgs) -> Result<(DataType, ReduceOp)> {
    let n = a.nranks as usize;
    if !(2..=MAX_HOSTS).contains(&n) || a.rank >= a.nranks {
        return Err(Error::invalid(format!(
            "inter-host exchange with rank {} of {} (2..={MAX_HOSTS} hosts supported)",
            a.rank, a.nranks
        )));
    }
    if a.chans == 0 || a.send == 0 || a.recv == 0 || a.slot_bytes == 0 || a.slot_bytes % 8 != 0 {
        return Err(Error::invalid(
            "inter-host exchange without channels or scratch slots (a multiple of 8 bytes)",
        ));
    }
    if a.reduce > 1 || (a.reduce == 1 && (a.dst[0] == 0 || a.src[a.rank as usize] == 0)) {
        return Err(Error::invalid(format!(
            "inter-host exchange: reduce flag {} without its source and destination",
            a.reduce
        )));
    }
    Ok((DataType::from_code(a.dtype)?, ReduceOp::from_code(a.op)?))
}

/// The port channel to rail peer `p`.
///
/// # Safety
/// `a.chans` must hold `a.nranks` handles (the launcher's word).
unsafe fn channel(a: &HierArgs, p: usize) -> PortChannelDeviceHandle {
    let at = a.chans + (p * std::mem::size_of::<PortChannelDeviceHandle>()) as u64;
    // SAFETY: caller's contract; the array is plain old data, read without alignment demands.
    unsafe { std::ptr::read_unaligned(at as *const PortChannelDeviceHandle) }
}

/// `mscclpp_hier_xchg`.
pub(crate) fn hier_xchg(_cfg: &LaunchConfig, bytes: &[u8]) -> Result<()> {
    let a = HierArgs::from_bytes(bytes)?;
    let (dtype, op) = check(&a)?;
    let (n, me) = (a.nranks as usize, a.rank as usize);
    let peers = || (0..n).filter(move |&p| p != me);
    // The launcher vouched for the channel array, the scratch slots (`nranks * slot_bytes`
    // each) and every non-zero `src`/`dst` range of `bytes` (`Stream::launch_raw`'s contract);
    // rounds keep within them. Every "see above" below refers to this.
    let chans: Vec<PortChannelDeviceHandle> = (0..n)
        .map(|p| {
            // SAFETY: see above.
            unsafe { channel(&a, p) }
        })
        .collect();
    // Rounds are numbered across calls (the counter in device memory, advanced here): round
    // `k` uses half `k % 2` of every slot, and its waits consume the peer's acknowledgement of
    // round `k - 1` and then its data of round `k` (spec.md).
    let counter = word(a.counter, 0);
    let first = counter.load(Ordering::Acquire);
    let half = a.slot_bytes / 2;
    let mut off = 0;
    let mut k = first;
    while off < a.bytes {
        let len = (a.bytes - off).min(half);
        let h = (k % 2) * half;
        for p in peers() {
            if a.src[p] != 0 {
                let slot = a.send + p as u64 * a.slot_bytes + h;
                // SAFETY: see above.
                unsafe {
                    copy(slot, a.src[p] + off, len);
                    chans[p].put_with_signal(
                        me as u64 * a.slot_bytes + h,
                        p as u64 * a.slot_bytes + h,
                        len,
                        DEFAULT_WAIT,
                    )?;
                }
            } else {
                // SAFETY: see above.
                unsafe { chans[p].signal(DEFAULT_WAIT)? };
            }
        }
        let recv = |p: usize| a.recv + p as u64 * a.slot_bytes + h;
        for p in peers() {
            // SAFETY: see above.
            unsafe {
                if k > 0 {
                    chans[p].wait(DEFAULT_WAIT)?;
                }
                chans[p].wait(DEFAULT_WAIT)?;
            }
            if a.reduce == 0 && a.dst[p] != 0 {
                // SAFETY: see above.
                unsafe { copy(a.dst[p] + off, recv(p), len) };
            }
        }
        if a.reduce == 1 {
            let src = |p: usize| if p == me { a.src[me] + off } else { recv(p) };
            let out = a.dst[0] + off;
            // SAFETY: see above; every word is read before its result is stored (in place).
            unsafe {
                reduce_ranks(n, len, dtype, op, src, |at, w, nb| store(out + at, w, nb));
            }
        } else if a.src[me] != 0 && a.dst[me] != 0 {
            // SAFETY: see above (identical ranges are left alone).
            unsafe { copy(a.dst[me] + off, a.src[me] + off, len) };
        }
        // This rank has read the peers' half: they may write it again two rounds on.
        for p in peers() {
            // SAFETY: see above.
            unsafe { chans[p].signal(DEFAULT_WAIT)? };
        }
        off += len;
        k += 1;
    }
    counter.store(k, Ordering::Release);
    Ok(())
}
