//! What the host kernels of every algorithm share: lane-wise arithmetic on 8-byte words (the
//! unit the host kernels move and reduce), raw loads, stores and copies at device addresses,
//! the reduction in rank order, and the argument checks every collective kernel makes.
//!
//! Device addresses in kernel arguments are addresses of this process's mappings (the host
//! backend's device memory is shared memory mapped here); the `unsafe` functions take the
//! launcher's word (`Stream::launch_raw`'s contract) that the ranges are live.

use std::sync::atomic::AtomicU64;

use half::{bf16, f16};
use mscclpp_hal::{DataType, Error, ReduceOp, Result};

use super::base::MAX_RANKS;

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
        // 64- and 8-bit types: element by element (FP8 rounds back after every operation, as
        // the kernels do).
        _ => {
            let (ab, bb) = (a.to_le_bytes(), b.to_le_bytes());
            let mut out = [0u8; 8];
            let s = dtype.size();
            for i in (0..8).step_by(s) {
                dtype.combine_elem(&ab[i..i + s], &bb[i..i + s], op, &mut out[i..i + s]);
            }
            u64::from_le_bytes(out)
        }
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
        _ => {
            let s = dtype.size();
            for i in (0..8).step_by(s) {
                dtype.divide_elem(&b[i..i + s], n, &mut out[i..i + s]);
            }
        }
    }
    u64::from_le_bytes(out)
}

/// Refuses a rank outside `nranks`, or a rank count outside 2..=[`MAX_RANKS`] (every collective
/// kernel's first check; `what` names the kernel).
pub(crate) fn check_ranks(what: &str, rank: u32, nranks: u32) -> Result<()> {
    check_ranks_up_to(what, rank, nranks, MAX_RANKS)
}

/// As [`check_ranks`] for a kernel that serves up to `max` ranks.
pub(crate) fn check_ranks_up_to(what: &str, rank: u32, nranks: u32, max: usize) -> Result<()> {
    if !(2..=max).contains(&(nranks as usize)) || rank >= nranks {
        return Err(Error::invalid(format!(
            "{what} with rank {rank} of {nranks} ranks (2..={max} ranks supported)"
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

/// The atomic word at `scratch + off`.
pub(crate) fn word<'a>(scratch: u64, off: u64) -> &'a AtomicU64 {
    // SAFETY: every flag/counter offset of the layout is 8-aligned inside a scratch buffer that
    // the launcher vouched for (`scratch_bytes`), and those words are only accessed atomically.
    unsafe { mscclpp_hal::dev::atomic_u64_at(scratch + off) }
}

/// Copies `len` bytes (non-overlapping or identical ranges).
///
/// # Safety
/// Both ranges must be valid for `len` bytes.
pub(crate) unsafe fn copy(dst: u64, src: u64, len: u64) {
    if dst != src && len > 0 {
        // SAFETY: caller's contract; distinct ranges of distinct buffers (user buffer vs scratch,
        // or the disjoint pieces of the protocol).
        unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, len as usize) };
    }
}

/// Reads up to 8 bytes at `addr` into a zero-padded word.
///
/// # Safety
/// `addr..addr + len` must be readable.
pub(crate) unsafe fn load(addr: u64, len: u64) -> u64 {
    let mut w = [0u8; 8];
    // SAFETY: caller's contract; at most 8 bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(addr as *const u8, w.as_mut_ptr(), len.min(8) as usize)
    };
    u64::from_le_bytes(w)
}

/// Writes the first `len` bytes of `w` at `addr`.
///
/// # Safety
/// `addr..addr + len` must be writable.
pub(crate) unsafe fn store(addr: u64, w: u64, len: u64) {
    let b = w.to_le_bytes();
    // SAFETY: caller's contract; at most 8 bytes.
    unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), addr as *mut u8, len.min(8) as usize) };
}

/// The reduction, in rank order, of `len` bytes of each of `n` ranks (rank `p`'s at `src(p)`),
/// 8 bytes at a time, `Avg` divided at the end: `sink(at, word, nb)` receives the `nb` bytes at
/// offset `at` of the result (after every rank's bytes there were read).
///
/// # Safety
/// `src(p)..src(p) + len` must be readable for every `p < n`.
pub(crate) unsafe fn reduce_ranks(
    n: usize,
    len: u64,
    dtype: DataType,
    op: ReduceOp,
    src: impl Fn(usize) -> u64,
    mut sink: impl FnMut(u64, u64, u64),
) {
    let mut at = 0;
    while at < len {
        let nb = (len - at).min(8);
        let mut acc = 0u64;
        for p in 0..n {
            // SAFETY: `at + nb <= len` (caller's contract).
            let v = unsafe { load(src(p) + at, nb) };
            acc = if p == 0 {
                v
            } else {
                combine_word(acc, v, dtype, op)
            };
        }
        if op == ReduceOp::Avg {
            acc = divide_word(acc, dtype, n as u32);
        }
        sink(at, acc, nb);
        at += nb;
    }
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
