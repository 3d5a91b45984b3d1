//! The host kernel of the LL module's LL and short entry points (`mscclpp_collective_ll_*`, one
//! implementation for all of them): every collective through LL packets in the ranks' scratch
//! buffers, exactly as `spec.md` (and `ll_short/spec.md`) specifies and as
//! `kernels/collectives/ll.cu` does.
//!
//! One worker does everything on the host: the rounds are a sequence of packet writes into the
//! peers' slots and spinning packet reads from this rank's own slots.

use std::time::Duration;

use mscclpp_hal::dev::{DEFAULT_WAIT, LL16Packet};
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, ReduceOp, Result};

use super::args::LlCollectiveArgs;
use crate::CollectiveKind;
use crate::algorithms::host_common::{check_ranks, combine_word, divide_word, load, store};

/// The checks every LL kernel (LL packets and LL128 lines) makes of its arguments.
pub(crate) fn check(a: &LlCollectiveArgs) -> Result<(CollectiveKind, DataType, ReduceOp)> {
    let kind = CollectiveKind::from_code(a.kind)?;
    let dtype = DataType::from_code(a.dtype)?;
    let op = ReduceOp::from_code(a.op)?;
    let n = a.nranks as usize;
    check_ranks("collective", a.rank, a.nranks)?;
    if a.root >= a.nranks {
        return Err(Error::invalid(format!(
            "collective with root {} of {} ranks",
            a.root, a.nranks
        )));
    }
    if a.slot_bytes < 16 || a.slot_bytes % 16 != 0 {
        return Err(Error::invalid(format!(
            "collective slot of {} bytes: a positive multiple of 16 is needed",
            a.slot_bytes
        )));
    }
    if a.peer_scratch[..n].contains(&0) || a.flag == 0 || a.flag % 8 != 0 {
        return Err(Error::invalid("collective without scratch or flag memory"));
    }
    Ok((kind, dtype, op))
}

/// The host kernel.
pub fn collective_ll(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = LlCollectiveArgs::from_bytes(args)?;
    let (kind, dtype, op) = check(&a)?;
    // SAFETY: the flag word is 8-aligned (checked) device memory the launcher vouched for.
    let flag = unsafe { mscclpp_hal::dev::atomic_u64_at(a.flag) };
    let base = flag.load(std::sync::atomic::Ordering::Acquire);
    let (rank, n) = (a.rank as usize, a.nranks as usize);
    let size = dtype.size() as u64;
    let block = a.count * size; // bytes per rank block
    let round = a.round_bytes();
    let rounds = block.div_ceil(round);
    let timeout: Duration = DEFAULT_WAIT;

    // Own contribution straight from input to output.
    let own = |src: u64, dst: u64| {
        // SAFETY: both ranges are `block` bytes of the launcher's buffers; they may alias only
        // for in-place calls, where they are equal (copy is then a no-op move).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, block as usize) }
    };
    match kind {
        CollectiveKind::AllGather => own(a.input, a.output + rank as u64 * block),
        CollectiveKind::AllToAll => own(
            a.input + rank as u64 * block,
            a.output + rank as u64 * block,
        ),
        CollectiveKind::Broadcast if rank == a.root as usize => own(a.input, a.output),
        _ => {}
    }

    for k in 0..rounds {
        let f = base + 1 + k;
        let off = k * round;
        let len = round.min(block - off);
        let words = len.div_ceil(8);
        // Send.
        for j in (0..n).filter(|&j| j != rank) {
            let src = match kind {
                CollectiveKind::AllReduce | CollectiveKind::AllGather => a.input + off,
                CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
                    a.input + j as u64 * block + off
                }
                CollectiveKind::Broadcast => {
                    if rank != a.root as usize {
                        break;
                    }
                    a.input + off
                }
            };
            let slot = a.slot(j, rank, f);
            for w in 0..words {
                let bytes = (len - w * 8).min(8);
                // SAFETY: within the input block (len bytes from `src`) and the peer's slot
                // (`words * 16 <= slot_bytes`); slot addresses are 16-aligned.
                unsafe { LL16Packet::write(slot + w * 16, load(src + w * 8, bytes), f as u32) };
            }
        }
        // Receive.
        match kind {
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter => {
                let mine = match kind {
                    CollectiveKind::AllReduce => a.input + off,
                    _ => a.input + rank as u64 * block + off,
                };
                for w in 0..words {
                    let bytes = (len - w * 8).min(8);
                    // SAFETY: within this rank's input block.
                    let own = unsafe { load(mine + w * 8, bytes) };
                    // In rank order, as the GPU kernels: every rank computes the same bits (FP8
                    // rounds after every operation).
                    let mut acc = 0;
                    for p in 0..n {
                        let v = if p == rank {
                            own
                        } else {
                            // SAFETY: this rank's own slot for `p`, 16-aligned, inside the scratch.
                            unsafe {
                                LL16Packet::read(a.slot(rank, p, f) + w * 16, f as u32, timeout)?
                            }
                        };
                        acc = if p == 0 {
                            v
                        } else {
                            combine_word(acc, v, dtype, op)
                        };
                    }
                    if op == ReduceOp::Avg {
                        acc = divide_word(acc, dtype, a.nranks);
                    }
                    // SAFETY: within the output (count elements).
                    unsafe { store(a.output + off + w * 8, acc, bytes) };
                }
            }
            CollectiveKind::Broadcast if rank == a.root as usize => {
                // The acknowledgements of this round (see ll/spec.md).
                for p in (0..n).filter(|&p| p != rank) {
                    // SAFETY: this rank's own slot for `p`, 16-aligned, inside the scratch.
                    unsafe { LL16Packet::read(a.slot(rank, p, f), f as u32, timeout)? };
                }
            }
            CollectiveKind::AllGather | CollectiveKind::AllToAll | CollectiveKind::Broadcast => {
                for p in (0..n).filter(|&p| p != rank) {
                    if kind == CollectiveKind::Broadcast && p != a.root as usize {
                        continue;
                    }
                    let dst = match kind {
                        CollectiveKind::Broadcast => a.output + off,
                        _ => a.output + p as u64 * block + off,
                    };
                    for w in 0..words {
                        let bytes = (len - w * 8).min(8);
                        // SAFETY: as above.
                        let v = unsafe {
                            LL16Packet::read(a.slot(rank, p, f) + w * 16, f as u32, timeout)?
                        };
                        // SAFETY: within output block `p`.
                        unsafe { store(dst + w * 8, v, bytes) };
                    }
                }
                if kind == CollectiveKind::Broadcast {
                    // Acknowledgements to every peer, then those of every other non-root (see
                    // spec.md).
                    for p in (0..n).filter(|&p| p != rank) {
                        // SAFETY: word 0 of this rank's slot in `p`'s scratch, 16-aligned.
                        unsafe { LL16Packet::write(a.slot(p, rank, f), 0, f as u32) };
                    }
                    for p in (0..n).filter(|&p| p != rank && p != a.root as usize) {
                        // SAFETY: this rank's own slot for `p`, 16-aligned, inside the scratch.
                        unsafe { LL16Packet::read(a.slot(rank, p, f), f as u32, timeout)? };
                    }
                }
            }
        }
    }
    flag.store(base + rounds, std::sync::atomic::Ordering::Release);
    Ok(())
}
