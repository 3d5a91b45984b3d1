//! The host kernel of `mscclpp_collective_direct`: every collective by plain copies into the
//! peers' scratch and per-block flag words, exactly as `spec.md` specifies and as
//! `kernels/collectives/direct.cu` does.
//!
//! One worker does everything: it runs the grid's blocks one after the other (blocks are
//! independent in this algorithm: block `b` synchronises only with block `b` of the peers, which
//! run their blocks in the same order), each block's iterations as the protocol orders them.

use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp_hal::dev::{DEFAULT_WAIT, spin_until};
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, ReduceOp, Result};

use super::args::DirectCollectiveArgs;
use crate::CollectiveKind;
use crate::algorithms::host_common::{
    check_grid_and_scratch, check_ranks, copy, reduce_ranks, store, word,
};

fn check(a: &DirectCollectiveArgs, blocks: u64) -> Result<(CollectiveKind, DataType, ReduceOp)> {
    let kind = CollectiveKind::from_code(a.kind)?;
    let dtype = DataType::from_code(a.dtype)?;
    let op = ReduceOp::from_code(a.op)?;
    if kind == CollectiveKind::Broadcast && a.root >= a.nranks {
        return Err(Error::invalid(format!(
            "broadcast from root {} of {} ranks",
            a.root, a.nranks
        )));
    }
    check_ranks("direct collective", a.rank, a.nranks)?;
    if a.chunk_bytes == 0
        || a.chunk_bytes % 16 != 0
        || a.slot_bytes % 16 != 0
        || a.chunk_bytes > a.slot_bytes
    {
        return Err(Error::invalid(format!(
            "direct collective with chunk {} and slot {} bytes: multiples of 16, 16 <= chunk <= slot needed",
            a.chunk_bytes, a.slot_bytes
        )));
    }
    check_grid_and_scratch(
        "direct collective",
        blocks,
        a.max_blocks,
        a.scratch,
        &a.peer_scratch,
        a.rank,
        a.nranks,
    )?;
    Ok((kind, dtype, op))
}

/// Waits until the word is at least `seq`.
fn wait_ge(w: &AtomicU64, seq: u64, what: impl Fn() -> String) -> Result<()> {
    spin_until(DEFAULT_WAIT, what, || w.load(Ordering::Acquire) >= seq)
}

/// One block's view of a call.
struct Call<'a> {
    a: &'a DirectCollectiveArgs,
    dtype: DataType,
    op: ReduceOp,
    rank: usize,
    n: usize,
    block: u64,
    blocks: u64,
    /// Bytes of a rank block (`count * size`).
    bytes: u64,
}

impl Call<'_> {
    fn peers(&self) -> impl Iterator<Item = usize> + '_ {
        (1..self.n).map(move |q| (self.rank + q) % self.n)
    }

    fn signal(&self, phase: u64, buffer: u64, seq: u64) {
        let off = self
            .a
            .flag_offset(phase, buffer, self.block, self.rank as u64);
        for p in self.peers() {
            word(self.a.peer_scratch[p], off).store(seq, Ordering::Release);
        }
    }

    fn wait(&self, phase: u64, buffer: u64, seq: u64) -> Result<()> {
        for p in self.peers() {
            let off = self.a.flag_offset(phase, buffer, self.block, p as u64);
            wait_ge(word(self.a.scratch, off), seq, || {
                format!(
                    "direct collective: rank {}'s signal {seq} (phase {phase}, block {}) on rank {}",
                    p, self.block, self.rank
                )
            })?;
        }
        Ok(())
    }

    /// The reduction, in rank order, of `len` bytes: own data at `own`, the others' in this
    /// rank's phase-0 slots of `buffer`; into `out` and, when `fwd` is given, into that
    /// slot offset of every peer.
    ///
    /// # Safety
    /// `own` and `out` must be valid for `len` bytes (the same address or disjoint).
    unsafe fn reduce(&self, own: u64, buffer: u64, out: u64, fwd: Option<u64>, len: u64) {
        let src = |p: usize| {
            if p == self.rank {
                own
            } else {
                self.a.scratch + self.a.slot_offset(0, buffer, self.block, p as u64)
            }
        };
        let sink = |at: u64, acc: u64, nb: u64| {
            // SAFETY: within the output (caller's contract).
            unsafe { store(out + at, acc, nb) };
            if let Some(off) = fwd {
                for p in self.peers() {
                    // SAFETY: within the peer's slot.
                    unsafe { store(self.a.peer_scratch[p] + off + at, acc, nb) };
                }
            }
        };
        // SAFETY: `len` bytes of the own data (caller's contract) and of each slot (`len <= chunk
        // <= slot_bytes`).
        unsafe { reduce_ranks(self.n, len, self.dtype, self.op, src, sink) };
    }

    /// All-reduce step `s`: offset, bytes, piece size.
    fn ar_step(&self, s: u64) -> (u64, u64, u64) {
        let step = self.n as u64 * self.a.chunk_bytes;
        let off = s * step;
        let len = step.min(self.bytes - off);
        let piece = (len.div_ceil(self.n as u64).div_ceil(16) * 16).min(self.a.chunk_bytes);
        (off, len, piece)
    }

    fn piece_bytes(len: u64, piece: u64, j: usize) -> u64 {
        let start = j as u64 * piece;
        if start >= len {
            0
        } else {
            piece.min(len - start)
        }
    }

    fn ar_push(&self, s: u64, seq: u64) {
        let (off, len, piece) = self.ar_step(s);
        let h = DirectCollectiveArgs::buffer_of(seq);
        let slot = self.a.slot_offset(0, h, self.block, self.rank as u64);
        for p in self.peers() {
            let b = Self::piece_bytes(len, piece, p);
            // SAFETY: piece `p` of the step, inside the input; the peer's slot holds `chunk`.
            unsafe {
                copy(
                    self.a.peer_scratch[p] + slot,
                    self.a.input + off + p as u64 * piece,
                    b,
                )
            };
        }
        self.signal(0, h, seq);
    }

    fn all_reduce(&self, base: u64, iters: u64) -> Result<()> {
        for k in 0..iters {
            let s = self.block + k * self.blocks;
            let seq = base + 1 + k;
            let h = DirectCollectiveArgs::buffer_of(seq);
            let (off, len, piece) = self.ar_step(s);
            if k == 0 {
                self.ar_push(s, seq);
            }
            self.wait(0, h, seq)?;
            let own = off + self.rank as u64 * piece;
            let fwd = self.a.slot_offset(1, h, self.block, self.rank as u64);
            let b = Self::piece_bytes(len, piece, self.rank);
            // SAFETY: the own piece of the input and of the output (equal in place).
            unsafe { self.reduce(self.a.input + own, h, self.a.output + own, Some(fwd), b) };
            self.signal(1, h, seq);
            if k + 1 < iters {
                self.ar_push(s + self.blocks, seq + 1);
            }
            self.wait(1, h, seq)?;
            for p in self.peers() {
                let slot = self.a.scratch + self.a.slot_offset(1, h, self.block, p as u64);
                let b = Self::piece_bytes(len, piece, p);
                // SAFETY: piece `p` of the output; this rank's phase-1 slot of `p`.
                unsafe { copy(self.a.output + off + p as u64 * piece, slot, b) };
            }
        }
        Ok(())
    }

    fn step(&self, k: u64) -> (u64, u64) {
        let off = (self.block + k * self.blocks) * self.a.chunk_bytes;
        (off, self.a.chunk_bytes.min(self.bytes - off))
    }

    /// Step `k` of the one-phase kinds: its push (and the own part of the output), then the
    /// signal — which every rank gives, even one that sent nothing (see `spec.md`).
    fn one_phase_push(&self, kind: CollectiveKind, k: u64, seq: u64) {
        let h = DirectCollectiveArgs::buffer_of(seq);
        let (off, len) = self.step(k);
        let slot = self.a.slot_offset(0, h, self.block, self.rank as u64);
        let root = self.rank as u32 == self.a.root;
        match kind {
            CollectiveKind::AllGather | CollectiveKind::Broadcast
                if kind == CollectiveKind::AllGather || root =>
            {
                for p in self.peers() {
                    // SAFETY: the step of the input; the peer's slot holds `chunk`.
                    unsafe { copy(self.a.peer_scratch[p] + slot, self.a.input + off, len) };
                }
                let own_out = if kind == CollectiveKind::AllGather {
                    self.a.output + self.rank as u64 * self.bytes
                } else {
                    self.a.output
                };
                // SAFETY: the own output block (the input itself in place: then no copy).
                unsafe { copy(own_out + off, self.a.input + off, len) };
            }
            CollectiveKind::ReduceScatter | CollectiveKind::AllToAll => {
                for p in self.peers() {
                    let src = self.a.input + p as u64 * self.bytes + off;
                    // SAFETY: the step of input block `p`; the peer's slot holds `chunk`.
                    unsafe { copy(self.a.peer_scratch[p] + slot, src, len) };
                }
                if kind == CollectiveKind::AllToAll {
                    let own = self.rank as u64 * self.bytes + off;
                    // SAFETY: the step of input and output block `rank` (the same range in place:
                    // then no copy).
                    unsafe { copy(self.a.output + own, self.a.input + own, len) };
                }
            }
            _ => {}
        }
        self.signal(0, h, seq);
    }

    /// All-gather, reduce-scatter, broadcast and all-to-all: the next step is pushed before this
    /// one is consumed (three buffers make that safe).
    fn one_phase(&self, kind: CollectiveKind, base: u64, iters: u64) -> Result<()> {
        for k in 0..iters {
            let seq = base + 1 + k;
            let h = DirectCollectiveArgs::buffer_of(seq);
            if k == 0 {
                self.one_phase_push(kind, k, seq);
            }
            self.wait(0, h, seq)?;
            if k + 1 < iters {
                self.one_phase_push(kind, k + 1, seq + 1);
            }
            let (off, len) = self.step(k);
            let slot_of =
                |p: usize| self.a.scratch + self.a.slot_offset(0, h, self.block, p as u64);
            match kind {
                CollectiveKind::ReduceScatter => {
                    let own = self.a.input + self.rank as u64 * self.bytes + off;
                    // SAFETY: the step of input block `rank` and of the output (equal in place).
                    unsafe { self.reduce(own, h, self.a.output + off, None, len) };
                }
                CollectiveKind::Broadcast => {
                    if self.rank as u32 != self.a.root {
                        let src = slot_of(self.a.root as usize);
                        // SAFETY: the step of the output; this rank's slot of the root.
                        unsafe { copy(self.a.output + off, src, len) };
                    }
                }
                _ => {
                    for p in self.peers() {
                        // SAFETY: output block `p`; this rank's slot of `p`.
                        unsafe {
                            copy(self.a.output + p as u64 * self.bytes + off, slot_of(p), len)
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// The host kernel.
pub fn collective_direct(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = DirectCollectiveArgs::from_bytes(args)?;
    let blocks = cfg.num_blocks();
    let (kind, dtype, op) = check(&a, blocks)?;
    let n = a.nranks as u64;
    let bytes = a.count * dtype.size() as u64;
    let step = match kind {
        CollectiveKind::AllReduce => n * a.chunk_bytes,
        _ => a.chunk_bytes,
    };
    let steps = bytes.div_ceil(step);
    for block in 0..blocks.min(steps) {
        let iters = (steps - block - 1) / blocks + 1;
        let seq = word(a.scratch, 8 * block);
        let base = seq.load(Ordering::Acquire);
        let call = Call {
            a: &a,
            dtype,
            op,
            rank: a.rank as usize,
            n: a.nranks as usize,
            block,
            blocks,
            bytes,
        };
        match kind {
            CollectiveKind::AllReduce => call.all_reduce(base, iters)?,
            _ => call.one_phase(kind, base, iters)?,
        }
        seq.store(base + iters, Ordering::Release);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algorithms::base::MAX_RANKS;
    use crate::algorithms::host_common::{combine_word, divide_word};
    use mscclpp_hal::{Backend, DeviceBuffer, MemoryKind};
    use mscclpp_host::HostBackend;

    const MAX_BLOCKS: u32 = 4;
    const SLOT: u64 = 64;
    const GUARD: usize = 40;
    const POISON: u8 = 0xA5;

    #[derive(Debug, Clone, Copy)]
    struct Case {
        kind: CollectiveKind,
        dtype: DataType,
        op: ReduceOp,
        count: u64,
        chunk: u64,
        blocks: u32,
        in_place: bool,
        /// Byte offset of the user buffers (a multiple of the element size).
        offset: usize,
        /// Broadcast's root.
        root: u32,
    }

    fn splitmix(mut x: u64) -> u64 {
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        x ^ (x >> 31)
    }

    /// `elems` random small values of `dtype`.
    fn data(seed: u64, elems: u64, dtype: DataType) -> Vec<u8> {
        let mut v = Vec::new();
        for i in 0..elems {
            let r = splitmix(seed.wrapping_mul(1_000_003).wrapping_add(i));
            let f = ((r % 9) as f32 - 4.0) * 0.5;
            match dtype {
                DataType::F32 => v.extend_from_slice(&f.to_le_bytes()),
                DataType::F16 => v.extend_from_slice(&half::f16::from_f32(f).to_le_bytes()),
                DataType::BF16 => v.extend_from_slice(&half::bf16::from_f32(f).to_le_bytes()),
                DataType::I32 => v.extend_from_slice(&((r % 201) as i32 - 100).to_le_bytes()),
                DataType::U32 => v.extend_from_slice(&((r % 1000) as u32).to_le_bytes()),
                DataType::I64 => v.extend_from_slice(&((r % 201) as i64 - 100).to_le_bytes()),
                DataType::U64 => v.extend_from_slice(&(r % 1000).to_le_bytes()),
                DataType::I8 => v.push(((r % 41) as i8 - 20) as u8),
                DataType::U8 => v.push((r % 40) as u8),
                DataType::F64 | DataType::F8E4M3 | DataType::F8E5M2 => {
                    dtype.encode_f64(f64::from(f), &mut v)
                }
            }
        }
        v
    }

    /// Element-wise reduction in rank order (each element alone in a zero-padded word).
    fn reduce_ref(parts: &[&[u8]], dtype: DataType, op: ReduceOp) -> Vec<u8> {
        let es = dtype.size();
        let n = parts.len();
        let mut out = Vec::with_capacity(parts[0].len());
        for e in (0..parts[0].len()).step_by(es) {
            let w = |p: &[u8]| {
                let mut b = [0u8; 8];
                b[..es].copy_from_slice(&p[e..e + es]);
                u64::from_le_bytes(b)
            };
            let mut acc = w(parts[0]);
            for p in &parts[1..] {
                acc = combine_word(acc, w(p), dtype, op);
            }
            if op == ReduceOp::Avg {
                acc = divide_word(acc, dtype, n as u32);
            }
            out.extend_from_slice(&acc.to_le_bytes()[..es]);
        }
        out
    }

    /// Per rank: the buffer (16-aligned storage), the input and output offsets in it, the
    /// expected bytes at the output offset, and the output range's length.
    struct Bufs {
        buf: Vec<u128>,
        input: usize,
        output: usize,
        expect: Vec<u8>,
    }

    fn bytes_of(v: &mut [u128]) -> &mut [u8] {
        // SAFETY: u128 storage viewed as bytes.
        unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 16) }
    }

    fn setup(c: &Case, seed: u64, n: usize) -> Vec<Bufs> {
        let es = c.dtype.size() as u64;
        let b = (c.count * es) as usize;
        let (in_elems, _) = c.kind.buffer_elements(c.count, n as u64);
        let inputs: Vec<Vec<u8>> = (0..n)
            .map(|r| data(seed * 31 + r as u64, in_elems, c.dtype))
            .collect();
        let expect: Vec<Vec<u8>> = (0..n)
            .map(|r| match c.kind {
                CollectiveKind::AllReduce => {
                    let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[..]).collect();
                    reduce_ref(&parts, c.dtype, c.op)
                }
                CollectiveKind::ReduceScatter => {
                    let parts: Vec<&[u8]> = inputs.iter().map(|v| &v[r * b..(r + 1) * b]).collect();
                    reduce_ref(&parts, c.dtype, c.op)
                }
                CollectiveKind::Broadcast => inputs[c.root as usize].clone(),
                CollectiveKind::AllToAll => inputs
                    .iter()
                    .flat_map(|v| v[r * b..(r + 1) * b].to_vec())
                    .collect(),
                CollectiveKind::AllGather => inputs.concat(),
            })
            .collect();
        (0..n)
            .map(|r| {
                let input = &inputs[r];
                let out_len = expect[r].len();
                let ilen = input.len();
                let total = c.offset + GUARD + ilen + out_len + GUARD;
                let mut buf = vec![0u128; total.div_ceil(16) + 1];
                bytes_of(&mut buf).fill(POISON);
                let (i0, o0) = if !c.in_place {
                    (c.offset, c.offset + ilen + GUARD)
                } else {
                    match c.kind {
                        CollectiveKind::AllReduce
                        | CollectiveKind::Broadcast
                        | CollectiveKind::AllToAll => (c.offset, c.offset),
                        CollectiveKind::AllGather => (c.offset + r * b, c.offset),
                        _ => (c.offset, c.offset + r * b),
                    }
                };
                bytes_of(&mut buf)[i0..i0 + ilen].copy_from_slice(input);
                Bufs {
                    buf,
                    input: i0,
                    output: o0,
                    expect: expect[r].clone(),
                }
            })
            .collect()
    }

    fn check_out(c: &Case, r: usize, n: usize, bufs: &mut Bufs) {
        let (o0, len) = (bufs.output, bufs.expect.len());
        let bytes = bytes_of(&mut bufs.buf);
        assert!(
            bytes[o0..o0 + len] == bufs.expect[..],
            "{c:?} rank {r} of {n}: wrong output"
        );
        // Past the end: untouched (except reduce-scatter in place, where the input's other
        // blocks follow the output).
        if !(c.in_place && c.kind == CollectiveKind::ReduceScatter) {
            assert!(
                bytes[o0 + len..].iter().all(|&x| x == POISON),
                "{c:?} rank {r} of {n}: bytes past the output written"
            );
        }
        if !c.in_place {
            assert!(
                bytes[o0 - GUARD..o0].iter().all(|&x| x == POISON),
                "{c:?} rank {r} of {n}: bytes before the output written"
            );
        }
        assert!(
            bytes[..c.offset].iter().all(|&x| x == POISON),
            "{c:?} rank {r} of {n}: bytes before the buffer written"
        );
    }

    fn scratch(dev: &dyn mscclpp_hal::Device, n: u32) -> DeviceBuffer {
        let bytes = DirectCollectiveArgs::scratch_bytes(SLOT, n, MAX_BLOCKS) as usize;
        let s = dev.alloc(bytes, MemoryKind::Device).unwrap();
        // SAFETY: the whole allocation, host memory of this process.
        unsafe { std::ptr::write_bytes(s.ptr().0 as *mut u8, 0, bytes) };
        s
    }

    /// Runs `cases` back to back on `n` ranks (threads), then checks every output.
    fn run(n: usize, cases: &[Case]) {
        let dev = HostBackend::new().open_device(0).unwrap();
        let scratches: Vec<DeviceBuffer> = (0..n).map(|_| scratch(&*dev, n as u32)).collect();
        let mut peer_scratch = [0u64; MAX_RANKS];
        for (r, s) in scratches.iter().enumerate() {
            peer_scratch[r] = s.ptr().0;
        }
        let mut all: Vec<Vec<Bufs>> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| setup(c, i as u64 + 1, n))
            .collect();
        // Per rank, per case: the argument struct.
        let args: Vec<Vec<(DirectCollectiveArgs, u32)>> = (0..n)
            .map(|r| {
                cases
                    .iter()
                    .zip(all.iter_mut())
                    .map(|(c, bufs)| {
                        let base = bytes_of(&mut bufs[r].buf).as_mut_ptr() as u64;
                        let a = DirectCollectiveArgs {
                            input: base + bufs[r].input as u64,
                            output: base + bufs[r].output as u64,
                            count: c.count,
                            scratch: peer_scratch[r],
                            slot_bytes: SLOT,
                            chunk_bytes: c.chunk,
                            peer_scratch,
                            kind: c.kind as u32,
                            dtype: c.dtype as u32,
                            op: c.op as u32,
                            rank: r as u32,
                            nranks: n as u32,
                            root: c.root,
                            max_blocks: MAX_BLOCKS,
                            _pad: 0,
                            abort: 0,
                        };
                        (a, c.blocks)
                    })
                    .collect()
            })
            .collect();
        std::thread::scope(|s| {
            for per_rank in &args {
                s.spawn(move || {
                    for (a, blocks) in per_rank {
                        collective_direct(&LaunchConfig::linear(*blocks, 1), a.as_bytes()).unwrap();
                    }
                });
            }
        });
        for (c, bufs) in cases.iter().zip(all.iter_mut()) {
            for (r, b) in bufs.iter_mut().enumerate() {
                check_out(c, r, n, b);
            }
        }
    }

    fn matrix(n: usize) -> Vec<Case> {
        let dtypes = DataType::ALL;
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Min,
            ReduceOp::Max,
            ReduceOp::Avg,
        ];
        // (count, chunk, blocks, in place, offset in elements)
        let shapes: [(u64, u64, u32, bool, usize); 7] = [
            (1, 16, 1, false, 0),
            (7, 16, 2, true, 1),
            (33, 48, 3, false, 3),
            (101, 16, 4, true, 0),
            (257, 64, 3, false, 1),
            (1000, 32, 4, true, 2),
            (0, 16, 1, false, 0),
        ];
        let mut cases = Vec::new();
        let mut i = 0usize;
        for kind in CollectiveKind::ALL {
            for dtype in dtypes {
                for op in ops {
                    if !kind.reduces() && op != ReduceOp::Sum {
                        continue;
                    }
                    for &(count, chunk, blocks, in_place, off) in &shapes {
                        // Vary the shape with the rank count and the case index.
                        let count = count + (i % 3) as u64 * (n as u64 - 1);
                        i += 1;
                        cases.push(Case {
                            kind,
                            dtype,
                            op,
                            count,
                            chunk,
                            blocks,
                            in_place,
                            offset: off * dtype.size(),
                            root: (i % n) as u32,
                        });
                    }
                }
            }
        }
        cases
    }

    #[test]
    fn every_kind_dtype_op_and_shape_on_2_3_4_ranks() {
        for n in [2, 3, 4] {
            let cases = matrix(n);
            // Back to back in batches: the sequences continue across calls, kinds and grids.
            for batch in cases.chunks(40) {
                run(n, batch);
            }
        }
    }

    #[test]
    fn eight_ranks_every_kind_many_steps() {
        let cases: Vec<Case> = [DataType::BF16, DataType::F32, DataType::I32]
            .into_iter()
            .flat_map(|dtype| {
                CollectiveKind::ALL.into_iter().map(move |kind| Case {
                    kind,
                    dtype,
                    op: ReduceOp::Sum,
                    count: 1999,
                    chunk: 32,
                    blocks: 3,
                    in_place: false,
                    offset: 0,
                    root: 5,
                })
            })
            .collect();
        run(8, &cases);
    }

    #[test]
    fn plan_is_within_bounds() {
        for bytes in [0u64, 1, 16, 4095, 1 << 20, 1 << 30] {
            for kind in [CollectiveKind::AllReduce, CollectiveKind::AllGather] {
                let (g, c) = DirectCollectiveArgs::plan(kind, bytes, 2, 65536, 132);
                assert!((1..=132).contains(&g) && c % 16 == 0 && (16..=65536).contains(&c));
            }
        }
        assert_eq!(
            DirectCollectiveArgs::plan(CollectiveKind::AllReduce, 1 << 30, 2, 65536, 128),
            (128, 65536)
        );
    }

    #[test]
    fn rejects_bad_roots_and_grids() {
        let a = DirectCollectiveArgs {
            input: 0,
            output: 0,
            count: 0,
            scratch: 128,
            slot_bytes: 64,
            chunk_bytes: 64,
            peer_scratch: [128, 256, 0, 0, 0, 0, 0, 0],
            kind: CollectiveKind::Broadcast as u32,
            dtype: 0,
            op: 0,
            rank: 0,
            nranks: 2,
            root: 2,
            max_blocks: 2,
            _pad: 0,
            abort: 0,
        };
        assert!(collective_direct(&LaunchConfig::linear(1, 1), a.as_bytes()).is_err());
        let b = DirectCollectiveArgs {
            kind: CollectiveKind::AllReduce as u32,
            ..a
        };
        assert!(collective_direct(&LaunchConfig::linear(3, 1), b.as_bytes()).is_err());
    }
}
