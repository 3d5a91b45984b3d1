//! The host backend's LL kernels (`mscclpp_collective_ll_*`, one implementation for all of
//! them): every collective through LL packets in the ranks' scratch buffers, exactly as
//! `hal::collective` specifies (and as the CUDA/HIP kernels do).
//!
//! One worker does everything on the host: the rounds are a sequence of packet writes into the
//! peers' slots and spinning packet reads from this rank's own slots.

use std::time::Duration;

use half::{bf16, f16};
use mscclpp_hal::collective::MAX_RANKS;
use mscclpp_hal::dev::{DEFAULT_WAIT, LL16Packet};
use mscclpp_hal::{
    CollectiveKind, DataType, Error, KernelArgs, LaunchConfig, LlCollectiveArgs, ReduceOp, Result,
};

use crate::collectives_direct::{load, store};

/// Combines two 8-byte words lane by lane.
pub fn combine_word(a: u64, b: u64, dtype: DataType, op: ReduceOp) -> u64 {
    macro_rules! lanes {
        ($t:ty, $n:expr, $from:expr, $to:expr, $comb:expr) => {{
            let (ab, bb) = (a.to_le_bytes(), b.to_le_bytes());
            let mut out = [0u8; 8];
            let w = 8 / $n;
            for i in 0..$n {
                let x: $t = $from(&ab[i * w..(i + 1) * w]);
                let y: $t = $from(&bb[i * w..(i + 1) * w]);
                let r: $t = $comb(x, y);
                out[i * w..(i + 1) * w].copy_from_slice(&$to(r));
            }
            u64::from_le_bytes(out)
        }};
    }
    fn float_op(x: f32, y: f32, op: ReduceOp) -> f32 {
        match op {
            ReduceOp::Sum | ReduceOp::Avg => x + y,
            ReduceOp::Prod => x * y,
            ReduceOp::Min => x.min(y),
            ReduceOp::Max => x.max(y),
        }
    }
    match dtype {
        DataType::F32 => lanes!(
            f32,
            2,
            |s: &[u8]| f32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            |v: f32| v.to_le_bytes(),
            |x, y| float_op(x, y, op)
        ),
        DataType::F16 => lanes!(
            f16,
            4,
            |s: &[u8]| f16::from_le_bytes([s[0], s[1]]),
            |v: f16| v.to_le_bytes(),
            |x: f16, y: f16| f16::from_f32(float_op(x.to_f32(), y.to_f32(), op))
        ),
        DataType::BF16 => lanes!(
            bf16,
            4,
            |s: &[u8]| bf16::from_le_bytes([s[0], s[1]]),
            |v: bf16| v.to_le_bytes(),
            |x: bf16, y: bf16| bf16::from_f32(float_op(x.to_f32(), y.to_f32(), op))
        ),
        DataType::I32 => lanes!(
            i32,
            2,
            |s: &[u8]| i32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            |v: i32| v.to_le_bytes(),
            |x: i32, y: i32| match op {
                ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            }
        ),
        DataType::U32 => lanes!(
            u32,
            2,
            |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]),
            |v: u32| v.to_le_bytes(),
            |x: u32, y: u32| match op {
                ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
                ReduceOp::Prod => x.wrapping_mul(y),
                ReduceOp::Min => x.min(y),
                ReduceOp::Max => x.max(y),
            }
        ),
    }
}

/// Divides every lane of a word by `n` (the end of `Avg`).
pub fn divide_word(a: u64, dtype: DataType, n: u32) -> u64 {
    let b = a.to_le_bytes();
    let mut out = [0u8; 8];
    match dtype {
        DataType::F32 => {
            for i in 0..2 {
                let v = f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                out[4 * i..4 * i + 4].copy_from_slice(&(v / n as f32).to_le_bytes());
            }
        }
        DataType::F16 => {
            for i in 0..4 {
                let v = f16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32() / n as f32;
                out[2 * i..2 * i + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        DataType::BF16 => {
            for i in 0..4 {
                let v = bf16::from_le_bytes([b[2 * i], b[2 * i + 1]]).to_f32() / n as f32;
                out[2 * i..2 * i + 2].copy_from_slice(&bf16::from_f32(v).to_le_bytes());
            }
        }
        DataType::I32 => {
            for i in 0..2 {
                let v = i32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                out[4 * i..4 * i + 4].copy_from_slice(&(v / n as i32).to_le_bytes());
            }
        }
        DataType::U32 => {
            for i in 0..2 {
                let v = u32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]]);
                out[4 * i..4 * i + 4].copy_from_slice(&(v / n).to_le_bytes());
            }
        }
    }
    u64::from_le_bytes(out)
}

/// Refuses a rank outside `nranks`, or a rank count outside 2..=[`MAX_RANKS`] (every collective
/// kernel's first check; `what` names the kernel).
pub(crate) fn check_ranks(what: &str, rank: u32, nranks: u32) -> Result<()> {
    if !(2..=MAX_RANKS).contains(&(nranks as usize)) || rank >= nranks {
        return Err(Error::invalid(format!(
            "{what} with rank {rank} of {nranks} ranks (2..={MAX_RANKS} ranks supported)"
        )));
    }
    Ok(())
}

/// Refuses a grid of no blocks or of more blocks than the scratch was laid out for, and a
/// scratch that is missing, not this rank's own or not 128-aligned (the direct and read kernels;
/// `what` names the kernel).
pub(crate) fn check_grid_and_scratch(
    what: &str,
    blocks: u64,
    max_blocks: u32,
    scratch: u64,
    peer_scratch: &[u64; MAX_RANKS],
    rank: u32,
    nranks: u32,
) -> Result<()> {
    if blocks == 0 || blocks > u64::from(max_blocks) {
        return Err(Error::invalid(format!(
            "{what} grid of {blocks} blocks for a scratch laid out for {max_blocks}"
        )));
    }
    if peer_scratch[..nranks as usize].contains(&0)
        || scratch != peer_scratch[rank as usize]
        || scratch % 128 != 0
    {
        return Err(Error::invalid(format!(
            "{what} without (128-aligned) scratch memory"
        )));
    }
    Ok(())
}

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
                    let mut acc = unsafe { load(mine + w * 8, bytes) };
                    for p in (0..n).filter(|&p| p != rank) {
                        // SAFETY: this rank's own slot for `p`, 16-aligned, inside the scratch.
                        let v = unsafe {
                            LL16Packet::read(a.slot(rank, p, f) + w * 16, f as u32, timeout)?
                        };
                        acc = combine_word(acc, v, dtype, op);
                    }
                    if op == ReduceOp::Avg {
                        acc = divide_word(acc, dtype, a.nranks);
                    }
                    // SAFETY: within the output (count elements).
                    unsafe { store(a.output + off + w * 8, acc, bytes) };
                }
            }
            CollectiveKind::Broadcast if rank == a.root as usize => {
                // The acknowledgements of this round (see hal::collective).
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
                    // hal::collective).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_ops_per_type() {
        let w = |a: f32, b: f32| u64::from(a.to_bits()) | (u64::from(b.to_bits()) << 32);
        assert_eq!(
            combine_word(w(1.5, -2.0), w(2.0, 3.0), DataType::F32, ReduceOp::Sum),
            w(3.5, 1.0)
        );
        assert_eq!(
            combine_word(w(1.5, -2.0), w(2.0, 3.0), DataType::F32, ReduceOp::Min),
            w(1.5, -2.0)
        );
        let i = |a: i32, b: i32| u64::from(a as u32) | (u64::from(b as u32) << 32);
        assert_eq!(
            combine_word(i(i32::MAX, -3), i(1, 5), DataType::I32, ReduceOp::Sum),
            i(i32::MIN, 2)
        );
        assert_eq!(divide_word(i(-7, 9), DataType::I32, 2), i(-3, 4));
        let h = |v: [f32; 4]| {
            let mut b = [0u8; 8];
            for (k, x) in v.iter().enumerate() {
                b[2 * k..2 * k + 2].copy_from_slice(&bf16::from_f32(*x).to_le_bytes());
            }
            u64::from_le_bytes(b)
        };
        assert_eq!(
            combine_word(
                h([1.0, 2.0, 3.0, 4.0]),
                h([1.0, 2.0, 3.0, 4.0]),
                DataType::BF16,
                ReduceOp::Prod
            ),
            h([1.0, 4.0, 9.0, 16.0])
        );
    }
}
