//! The host kernel of `mscclpp_collective_read_allreduce`: all-reduce by reading every peer's
//! input where it lies (a registered window or the peer's staging area), exactly as `spec.md`
//! specifies and as `kernels/collectives/direct.cu` does.
//!
//! One worker runs the grid's blocks one after the other (block `b` synchronises only with block
//! `b` of the peers, which run their blocks in the same order). The host has no registers to
//! run out of, so a block may own any number of units; a block's results wait in a buffer until
//! every peer has finished reading, as the GPU threads' wait in registers.

use std::sync::atomic::{Ordering, fence};

use mscclpp_hal::dev::{DEFAULT_WAIT, LL16Packet};
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, ReduceOp, Result};

use super::args::{MAX_WINDOWS, ReadCollectiveArgs, WINDOW_TABLE_BYTES, split_read_key};
use crate::algorithms::base::MAX_RANKS;
use crate::algorithms::host_common::{
    check_grid_and_scratch, check_ranks, copy, reduce_ranks, word,
};

fn check(a: &ReadCollectiveArgs, blocks: u64) -> Result<(DataType, ReduceOp)> {
    let dtype = DataType::from_code(a.dtype)?;
    let op = ReduceOp::from_code(a.op)?;
    check_ranks("read all-reduce", a.rank, a.nranks)?;
    check_grid_and_scratch(
        "read all-reduce",
        blocks,
        a.max_blocks,
        a.scratch,
        &a.peer_scratch,
        a.rank,
        a.nranks,
    )?;
    if a.table == 0 || a.table % 8 != 0 {
        return Err(Error::invalid("read all-reduce without a window table"));
    }
    let bytes = a.count.checked_mul(dtype.size() as u64);
    if bytes.is_none_or(|b| b > isize::MAX as u64) {
        return Err(Error::invalid(format!(
            "read all-reduce of {} {dtype} elements overflows",
            a.count
        )));
    }
    let (window, offset) = split_read_key(a.in_key);
    if window == 0 && (offset != 0 || bytes.is_none_or(|b| b > a.staging_bytes)) {
        return Err(Error::invalid(format!(
            "read all-reduce of {} {dtype} elements staged in {} bytes at offset {offset}",
            a.count, a.staging_bytes
        )));
    }
    Ok((dtype, op))
}

/// Rank `p`'s input (`bytes`) as mapped here, for the key it sent.
fn source(a: &ReadCollectiveArgs, p: usize, key: u64, bytes: u64) -> Result<u64> {
    let (window, offset) = split_read_key(key);
    if window >= MAX_WINDOWS {
        return Err(Error::Remote {
            rank: p,
            message: format!("sent read key {key:#x}: window {window} is out of range"),
        });
    }
    let entry = (window * MAX_RANKS + p) as u64 * 8;
    debug_assert!(entry < WINDOW_TABLE_BYTES as u64);
    let base = word(a.table, entry).load(Ordering::Acquire);
    if base == 0 {
        return Err(Error::Remote {
            rank: p,
            message: format!("named window {window}, which is not registered here"),
        });
    }
    let len =
        word(a.table, ((MAX_WINDOWS + window) * MAX_RANKS + p) as u64 * 8).load(Ordering::Acquire);
    if offset > len || bytes > len - offset {
        return Err(Error::Remote {
            rank: p,
            message: format!(
                "named {bytes} bytes at offset {offset} of window {window}, which has {len}: do the ranks pass the same count?"
            ),
        });
    }
    Ok(base + offset)
}

/// The host kernel.
pub fn collective_read_allreduce(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = ReadCollectiveArgs::from_bytes(args)?;
    let blocks = cfg.num_blocks();
    let (dtype, op) = check(&a, blocks)?;
    let (rank, n) = (a.rank as usize, a.nranks as usize);
    let peers = || (1..n).map(move |q| (rank + q) % n);
    // Checked in `check`.
    let bytes = a.count.saturating_mul(dtype.size() as u64);
    let units = bytes.div_ceil(16);
    let per = units.div_ceil(blocks);
    let staging = a.scratch + ReadCollectiveArgs::staging_offset(a.max_blocks);
    let staged = split_read_key(a.in_key).0 == 0;
    let mut results = Vec::new();
    for b in 0..blocks {
        let seq = word(a.scratch, 8 * b);
        let q = seq.load(Ordering::Acquire) + 1;
        let flag = q as u32;
        // This block's bytes.
        let lo = (b * per * 16).min(bytes);
        let hi = ((b + 1) * per * 16).min(bytes);
        if staged {
            // SAFETY: `lo..hi` lies inside the input (`count` elements, the launcher's contract)
            // and inside the staging area (checked: `bytes <= staging_bytes`).
            unsafe { copy(staging + lo, a.input + lo, hi - lo) };
            fence(Ordering::SeqCst);
        }
        let start = |dst: u64, src: usize| {
            dst + ReadCollectiveArgs::start_offset(a.max_blocks, b, src as u64)
        };
        let done = |dst: u64, src: usize| {
            dst + ReadCollectiveArgs::done_offset(a.max_blocks, b, src as u64)
        };
        let mut srcs = [0u64; MAX_RANKS];
        srcs[rank] = a.input;
        for p in peers() {
            // SAFETY: packet slots of the peers' scratch (laid out for `max_blocks`, `b` below it).
            unsafe { LL16Packet::write(start(a.peer_scratch[p], rank), a.in_key, flag) };
        }
        for p in peers() {
            // SAFETY: a packet slot of the own scratch.
            let key = unsafe { LL16Packet::read(start(a.scratch, p), flag, DEFAULT_WAIT)? };
            srcs[p] = source(&a, p, key, bytes)?;
        }
        fence(Ordering::SeqCst);
        // The reduction, in rank order.
        results.clear();
        // SAFETY: `lo..hi` lies inside every rank's input (the same count on every rank, the
        // launcher's contract) as mapped here.
        unsafe {
            reduce_ranks(
                n,
                hi - lo,
                dtype,
                op,
                |p| srcs[p] + lo,
                |_, w, nb| {
                    results.extend_from_slice(&w.to_le_bytes()[..nb as usize]);
                },
            )
        };
        // Every read of this rank's input is over once every peer says so.
        fence(Ordering::SeqCst);
        for p in peers() {
            // SAFETY: as for the start packets.
            unsafe { LL16Packet::write(done(a.peer_scratch[p], rank), 0, flag) };
        }
        for p in peers() {
            // SAFETY: as for the start packets.
            unsafe { LL16Packet::read(done(a.scratch, p), flag, DEFAULT_WAIT)? };
        }
        fence(Ordering::SeqCst);
        // SAFETY: `lo..hi` of the output (`count` elements, the launcher's contract).
        unsafe { copy(a.output + lo, results.as_ptr() as u64, hi - lo) };
        seq.store(q, Ordering::Release);
    }
    Ok(())
}
