//! The host kernel of `mscclpp_collective_ll128_allreduce`: all-reduce of one round in LL128
//! lines (120 data bytes and a flag word per 128), exactly as `spec.md` specifies and as
//! `kernels/collectives/ll.cu` does. The flag word is stored after the line's data
//! with release order and loaded before it with acquire order, which is what makes a line whole
//! here; the GPU kernels get the same from one 128-byte store and load per line.

use std::sync::atomic::Ordering;

use mscclpp_hal::dev::{DEFAULT_WAIT, spin_until};
use mscclpp_hal::{Error, KernelArgs, LaunchConfig, Result};

use crate::CollectiveKind;
use crate::algorithms::base::MAX_RANKS;
use crate::algorithms::host_common::{copy, reduce_ranks, store, word};
use crate::algorithms::ll::args::{LL128_LINE_BYTES, LL128_LINE_DATA_BYTES, LlCollectiveArgs};

/// The flag word of flag `f`: its low 32 bits in both halves.
fn flag_word(f: u64) -> u64 {
    let f = f & 0xffff_ffff;
    f | (f << 32)
}

/// The host kernel.
pub fn collective_ll128_allreduce(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = LlCollectiveArgs::from_bytes(args)?;
    let (kind, dtype, op) = crate::algorithms::ll::host::check(&a)?;
    let (rank, n) = (a.rank as usize, a.nranks as usize);
    if kind != CollectiveKind::AllReduce {
        return Err(Error::invalid(format!(
            "LL128 lines serve all-reduce only, not {}",
            kind.name()
        )));
    }
    let bytes = a
        .count
        .checked_mul(dtype.size() as u64)
        .filter(|b| *b <= a.ll128_round_bytes())
        .ok_or_else(|| {
            Error::invalid(format!(
                "LL128 all-reduce of {} {dtype} elements: more than one round of {} bytes",
                a.count,
                a.ll128_round_bytes()
            ))
        })?;
    if a.slot_bytes % LL128_LINE_BYTES != 0 {
        return Err(Error::invalid(format!(
            "LL128 all-reduce with a slot of {} bytes, not whole lines",
            a.slot_bytes
        )));
    }
    let counter = word(a.flag, 0);
    let base = counter.load(Ordering::Acquire);
    if bytes == 0 {
        return Ok(());
    }
    let f = base + 1;
    let fw = flag_word(f);
    // The LL128 halves follow the two LL halves (see `spec.md`).
    let half = (2 + f % 2) * MAX_RANKS as u64 * a.slot_bytes;
    let lines = bytes.div_ceil(LL128_LINE_DATA_BYTES);
    let line_of = |dst_scratch: u64, src: usize, line: u64| {
        dst_scratch + half + src as u64 * a.slot_bytes + line * LL128_LINE_BYTES
    };
    // Sends: the data of every line, then its flag word.
    for p in (1..n).map(|q| (rank + q) % n) {
        for l in 0..lines {
            let off = l * LL128_LINE_DATA_BYTES;
            let len = LL128_LINE_DATA_BYTES.min(bytes - off);
            let dst = line_of(a.peer_scratch[p], rank, l);
            // SAFETY: `len` bytes of the input (the launcher's contract) into the data part of a
            // line of the peer's slot (one round fits the slot: checked).
            unsafe { copy(dst, a.input + off, len) };
            word(dst, LL128_LINE_DATA_BYTES).store(fw, Ordering::Release);
        }
    }
    // Receives, reduced in rank order with the own input in place of a line, each word stored
    // once reduced (in place, every rank's bytes of a word are read before it is written, and
    // nothing reads them later).
    for l in 0..lines {
        let off = l * LL128_LINE_DATA_BYTES;
        let len = LL128_LINE_DATA_BYTES.min(bytes - off);
        for p in (0..n).filter(|&p| p != rank) {
            let w = word(line_of(a.scratch, p, l), LL128_LINE_DATA_BYTES);
            spin_until(
                DEFAULT_WAIT,
                || format!("LL128 line {l} of rank {p} (flag {f}) on rank {rank}"),
                || w.load(Ordering::Acquire) == fw,
            )?;
        }
        let src = |p: usize| {
            if p == rank {
                a.input + off
            } else {
                line_of(a.scratch, p, l)
            }
        };
        let sink = |at: u64, w: u64, nb: u64| {
            // SAFETY: within the output's `len` bytes at `off` (`count` elements, the launcher's
            // contract).
            unsafe { store(a.output + off + at, w, nb) };
        };
        // SAFETY: `len` bytes of the input at `off`, or of a line's data part.
        unsafe { reduce_ranks(n, len, dtype, op, src, sink) };
    }
    counter.store(base + 1, Ordering::Release);
    Ok(())
}
