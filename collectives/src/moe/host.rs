//! The host kernels of the expert-parallel exchange: the protocol of `spec.md`, as
//! `kernels/collectives/moe.cu` runs it, with one worker doing every block's first phase (all
//! sends) before any block's second (all receives). A block's first phase waits only for the
//! previous call's acknowledgements, which the peers' previous calls give without waiting for
//! this one, so the order cannot deadlock.

use std::sync::atomic::Ordering;

use half::{bf16, f16};
use mscclpp_hal::dev::{DEFAULT_WAIT, spin_until};
use mscclpp_hal::dtype::f32_to_fp8;
use mscclpp_hal::{DataType, Error, KernelArgs, LaunchConfig, Result};

use super::args::{
    EM_CAST_FP8, EM_ON, EM_ROUND_SCALE, EM_UE8M0, HALF_RECEIVE, HALF_SEND, MOE_MAX_RANKS, MoeArgs,
    MoeLayoutArgs, STATUS_CAPACITY, STATUS_COMBINE_MISSING, STATUS_EXPERT_RANGE, STATUS_ROW_SIZE,
    combine_region, dispatch_region, handle_experts, handle_positions, handle_status,
    handle_tokens, hdr,
};
use crate::algorithms::host_common::{check_ranks_up_to, copy, word};

/// Reads a plain value of type `T` at `addr`.
///
/// # Safety
/// `addr` must hold a readable, initialised `T` (any alignment).
unsafe fn get<T: Copy>(addr: u64) -> T {
    // SAFETY: caller's contract.
    unsafe { std::ptr::read_unaligned(addr as *const T) }
}

/// Writes `v` at `addr`.
///
/// # Safety
/// `addr..addr + size_of::<T>()` must be writable.
unsafe fn put<T: Copy>(addr: u64, v: T) {
    // SAFETY: caller's contract.
    unsafe { std::ptr::write_unaligned(addr as *mut T, v) }
}

fn wait_ge(addr: u64, off: u64, seq: u64, what: impl Fn() -> String) -> Result<()> {
    let w = word(addr, off);
    spin_until(DEFAULT_WAIT, what, || w.load(Ordering::Acquire) >= seq)
}

/// `mscclpp::moe::layout`.
pub fn layout(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = MoeLayoutArgs::from_bytes(args)?;
    if a.nranks == 0 || a.num_experts == 0 || a.num_experts % a.nranks != 0 {
        return Err(Error::invalid(format!(
            "expert layout of {} experts over {} ranks: a positive multiple of the ranks is needed",
            a.num_experts, a.nranks
        )));
    }
    let (n, e, k) = (
        u64::from(a.nranks),
        i64::from(a.num_experts),
        u64::from(a.topk),
    );
    let local = e / n as i64;
    for t in 0..a.tokens {
        for j in 0..k {
            // SAFETY: the launcher checked `topk_idx` holds `tokens * topk` i64 and the outputs
            // their sizes (Moe::layout).
            let x: i64 = unsafe { get(a.topk_idx + 8 * (t * k + j)) };
            if x == -1 {
                continue;
            }
            if !(0..e).contains(&x) {
                // SAFETY: as above.
                unsafe { put(a.status, STATUS_EXPERT_RANGE) };
                continue;
            }
            let d = (x / local) as u64;
            // SAFETY: as above; x < num_experts, d < nranks.
            unsafe {
                let pe = a.per_expert + 4 * x as u64;
                put(pe, get::<i32>(pe) + 1);
                put(a.in_rank + t * n + d, 1u8);
            }
        }
        for d in 0..n {
            // SAFETY: as above.
            unsafe {
                if get::<u8>(a.in_rank + t * n + d) != 0 {
                    let pr = a.per_rank + 4 * d;
                    put(pr, get::<i32>(pr) + 1);
                }
            }
        }
    }
    Ok(())
}

fn check(a: &MoeArgs, blocks: u64) -> Result<()> {
    check_ranks_up_to("expert-parallel exchange", a.rank, a.nranks, MOE_MAX_RANKS)?;
    let n = a.nranks as usize;
    if blocks != u64::from(a.nranks) {
        return Err(Error::invalid(format!(
            "expert-parallel exchange of {blocks} blocks for {} ranks",
            a.nranks
        )));
    }
    if a.peer_buffer[..n].contains(&0)
        || a.peer_dispatch[..n].contains(&0)
        || a.peer_combine[..n].contains(&0)
        || a.buffer != a.peer_buffer[a.rank as usize]
    {
        return Err(Error::invalid(
            "expert-parallel exchange without its buffer",
        ));
    }
    if a.tokens > a.max_tokens || a.num_experts % a.nranks != 0 || a.num_experts == 0 {
        return Err(Error::invalid(format!(
            "expert-parallel exchange of {} tokens (at most {}), {} experts over {} ranks",
            a.tokens, a.max_tokens, a.num_experts, a.nranks
        )));
    }
    Ok(())
}

/// One call's view: the sequence of this call and the handle's pieces.
struct View<'a> {
    a: &'a MoeArgs,
    n: u64,
    k: u64,
    local: u64,
}

impl View<'_> {
    fn handle(&self, at: u64) -> u64 {
        self.a.handle + 4 * at
    }
    fn position(&self, t: u64, d: u64) -> u64 {
        self.handle(handle_positions(self.n, self.local) + t * self.n + d)
    }
    /// Adds a status bit to the handle.
    fn fail(&self, bit: i32) {
        let at = self.handle(handle_status(self.n));
        // SAFETY: the launcher sized the handle (Moe::handle_bytes).
        unsafe { put(at, get::<i32>(at) | bit) };
    }
    /// The next sequence of the call's word at `off`.
    fn next_seq(&self, off: u64) -> u64 {
        word(self.a.buffer, off).load(Ordering::Relaxed) + 1
    }
    fn store_seq(&self, off: u64, seq: u64) {
        word(self.a.buffer, off).store(seq, Ordering::Relaxed);
    }
}

/// `mscclpp::moe::dispatch`.
pub fn dispatch(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = MoeArgs::from_bytes(args)?;
    check(&a, cfg.num_blocks())?;
    let v = View {
        a: &a,
        n: u64::from(a.nranks),
        k: u64::from(a.topk),
        local: u64::from(a.num_experts / a.nranks),
    };
    let (r, n, k, local) = (u64::from(a.rank), v.n, v.k, v.local);
    let seq = v.next_seq(hdr::dispatch_seq());
    let shape = a.payload_bytes | a.scale_bytes << 32;
    // Phase 1: to every destination, its tokens' rows in token order.
    for d in (0..n).filter(|_| a.phases & HALF_SEND != 0) {
        wait_ge(a.buffer, hdr::dispatch_ack(d), seq - 1, || {
            format!("rank {d} to read this rank's previous dispatch")
        })?;
        let region = a.peer_dispatch[d as usize];
        let mut j = 0u64;
        for t in 0..a.tokens {
            let mut member = false;
            for i in 0..k {
                // SAFETY: the launcher checked the inputs' sizes (Moe::dispatch).
                let x: i64 = unsafe { get(a.topk_idx + 8 * (t * k + i)) };
                if x < -1 || x >= i64::from(a.num_experts) {
                    v.fail(STATUS_EXPERT_RANGE);
                } else if x >= 0 && x as u64 / local == d {
                    member = true;
                }
            }
            let pos = if member { j as i32 } else { -1 };
            // SAFETY: the handle holds max_tokens * nranks positions; t < tokens <= max_tokens.
            unsafe { put(v.position(t, d), pos) };
            if !member {
                continue;
            }
            let row = region + j * a.row_bytes;
            // SAFETY: the row lies in rank d's region for this rank (j < tokens <= max_tokens);
            // the inputs were checked by the launcher.
            unsafe {
                if a.em_flags & EM_CAST_FP8 != 0 {
                    cast_fp8(&a, row, t);
                } else {
                    copy(row, a.x + t * a.payload_bytes, a.payload_bytes);
                    if a.scales != 0 {
                        copy(
                            row + a.scales_at,
                            a.scales + t * a.scale_bytes,
                            a.scale_bytes,
                        );
                    }
                }
                put(row + a.meta_at, t as i32);
                for i in 0..k {
                    let x: i64 = get(a.topk_idx + 8 * (t * k + i));
                    let mine = x >= 0 && x < i64::from(a.num_experts) && x as u64 / local == d;
                    let w: f32 = if mine && a.topk_weights != 0 {
                        get(a.topk_weights + 4 * (t * k + i))
                    } else {
                        0.0
                    };
                    let le = if mine {
                        (x as u64 - d * local) as i32
                    } else {
                        -1
                    };
                    put(row + a.meta_at + 4 + 4 * i, le);
                    put(row + a.meta_at + 4 + 4 * (k + i), w);
                }
            }
            j += 1;
        }
        let peer = a.peer_buffer[d as usize];
        word(peer, hdr::dispatch_count(r)).store(j, Ordering::Relaxed);
        word(peer, hdr::dispatch_shape(r)).store(shape, Ordering::Relaxed);
        word(peer, hdr::dispatch_flag(r)).store(seq, Ordering::Release);
    }
    if a.phases & HALF_SEND != 0 {
        // SAFETY: the handle holds the token word.
        unsafe { put(v.handle(handle_tokens(n)), a.tokens as i32) };
    }
    if a.phases & HALF_RECEIVE == 0 {
        return Ok(());
    }
    // Phase 2: every source's rows, sources in rank order.
    let em = a.em_flags & EM_ON != 0;
    // Expert-major: each local expert's next slot.
    let mut next = vec![0u64; if em { local as usize } else { 0 }];
    let mut prefix = 0u64;
    for s in 0..n {
        wait_ge(a.buffer, hdr::dispatch_flag(s), seq, || {
            format!("rank {s}'s dispatch rows")
        })?;
        let mut c = word(a.buffer, hdr::dispatch_count(s)).load(Ordering::Relaxed);
        if c != 0 && word(a.buffer, hdr::dispatch_shape(s)).load(Ordering::Relaxed) != shape {
            // Rows of another size than this rank's outputs: none of them is taken.
            v.fail(STATUS_ROW_SIZE);
            c = 0;
        }
        let region = a.buffer + dispatch_region(a.row_bytes, a.max_tokens, s);
        // SAFETY: the handle holds nranks counts.
        unsafe { put(v.handle(s), c as i32) };
        if em {
            // SAFETY: rows j < c of source s's region; the launcher checked the expert-major
            // outputs (Moe::expert_major_args).
            unsafe { expert_major(&v, s, c, prefix, region, &mut next) };
        }
        for j in (0..c).filter(|_| !em) {
            let i = prefix + j;
            if i >= a.out_capacity {
                v.fail(STATUS_CAPACITY);
                break;
            }
            let row = region + j * a.row_bytes;
            // SAFETY: row j < c <= max_tokens of source s's region; the outputs hold
            // out_capacity rows (checked by the launcher).
            unsafe {
                copy(a.out_x + i * a.payload_bytes, row, a.payload_bytes);
                if a.out_scales != 0 {
                    copy(
                        a.out_scales + i * a.scale_bytes,
                        row + a.scales_at,
                        a.scale_bytes,
                    );
                }
                put(a.out_src + 4 * i, get::<i32>(row + a.meta_at));
                for q in 0..k {
                    let le: i32 = get(row + a.meta_at + 4 + 4 * q);
                    let w: f32 = get(row + a.meta_at + 4 + 4 * (k + q));
                    put(a.out_idx + 8 * (i * k + q), i64::from(le));
                    if a.out_weights != 0 {
                        put(a.out_weights + 4 * (i * k + q), w);
                    }
                    if le >= 0 {
                        let pe = v.handle(handle_experts(n) + le as u64);
                        put(pe, get::<i32>(pe) + 1);
                    }
                }
            }
        }
        prefix += c;
    }
    // Every source's rows and count read: each may write its next dispatch here.
    word(a.buffer, hdr::dispatch_done()).fetch_add(n, Ordering::Relaxed);
    for s in 0..n {
        word(a.peer_buffer[s as usize], hdr::dispatch_ack(r)).store(seq, Ordering::Release);
    }
    v.store_seq(hdr::dispatch_seq(), seq);
    Ok(())
}

/// Token `t`'s bf16 row cast as the send half's `moeCastFp8` (moe.cu) does: per 128 channels the
/// scale is the largest magnitude (at least 1e-4) over 448, a power of two up where
/// [`EM_ROUND_SCALE`]; the E4M3 bytes are the row's payload, the f32 scales its scales.
///
/// # Safety
/// `x` holds the token's `payload_bytes` bf16 channels; `row` is a row of the buffer.
unsafe fn cast_fp8(a: &MoeArgs, row: u64, t: u64) {
    let hidden = a.payload_bytes;
    let src = a.x + t * hidden * 2;
    let mut v = [0f32; 128];
    for b in 0..hidden / 128 {
        for (i, x) in v.iter_mut().enumerate() {
            // SAFETY: caller's contract.
            *x = bf16::from_bits(unsafe { get(src + 2 * (b * 128 + i as u64)) }).to_f32();
        }
        let m = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-4);
        let mut scale = m / 448.0;
        if a.em_flags & EM_ROUND_SCALE != 0 && scale.to_bits() & 0x7f_ffff != 0 {
            scale = f32::from_bits((scale.to_bits() & 0x7f80_0000) + 0x80_0000);
        }
        for (i, x) in v.iter().enumerate() {
            // SAFETY: caller's contract.
            unsafe { put(row + b * 128 + i as u64, f32_to_fp8(x / scale, true)) };
        }
        // SAFETY: caller's contract (the scales follow the payload).
        unsafe { put(row + a.scales_at + 4 * b, scale) };
    }
}

/// The expert-major receive of source `s`'s `c` rows (at `region`; `prefix` rows before them):
/// as `moeExpertMajor` in moe.cu, every (row, top-k entry) with a local expert takes that
/// expert's next slot (`next`, carried across the sources in rank order).
///
/// # Safety
/// `region` holds `c` rows; the expert-major outputs hold what `Moe::expert_major_args` checked.
unsafe fn expert_major(v: &View, s: u64, c: u64, prefix: u64, region: u64, next: &mut [u64]) {
    let (a, n, k) = (v.a, v.n, v.k);
    let cap = a.em_capacity;
    let begin = next.to_vec();
    for j in 0..c {
        let row = region + j * a.row_bytes;
        // SAFETY: caller's contract (the row's meta lies inside it).
        let tok: i32 = unsafe { get(row + a.meta_at) };
        for q in 0..k {
            // SAFETY: as above; the slot table holds nranks * max_tokens rows of topk.
            let le: i32 = unsafe { get(row + a.meta_at + 4 + 4 * q) };
            let at_slot = a.em_slots + 4 * ((prefix + j) * k + q);
            if le < 0 || le as u64 >= v.local {
                // SAFETY: as above.
                unsafe { put(at_slot, -1i32) };
                continue;
            }
            let e = le as u64;
            let slot = next[e as usize];
            next[e as usize] += 1;
            if slot >= cap {
                v.fail(STATUS_CAPACITY);
                // SAFETY: as above.
                unsafe { put(at_slot, -1i32) };
                continue;
            }
            let at = e * cap + slot;
            // SAFETY: at < local * capacity rows of em_x and em_src (checked by the launcher).
            unsafe {
                put(at_slot, slot as i32);
                copy(a.em_x + at * a.payload_bytes, row, a.payload_bytes);
                put(a.em_src + 4 * at, tok);
                if a.em_scales != 0 {
                    em_scales(a, row + a.scales_at, e, slot);
                }
            }
        }
    }
    for (e, (&b, &end)) in begin.iter().zip(next.iter()).enumerate() {
        let (b, end) = (b.min(cap), end.min(cap));
        let got = end - b;
        let e = e as u64;
        // SAFETY: range holds [local, nranks] i64, count and stats [local] i32, the handle its
        // per-expert counts (checked by the launcher).
        unsafe {
            put(a.em_range + 8 * (e * n + s), ((b << 32) | got) as i64);
            if got != 0 {
                for at in [a.em_count + 4 * e, v.handle(handle_experts(n) + e)]
                    .into_iter()
                    .chain((a.em_stats != 0).then_some(a.em_stats + 4 * e))
                {
                    put(at, get::<i32>(at) + got as i32);
                }
            }
        }
    }
}

/// A row's scales at (expert `e`, `slot`): f32 each, or packed UE8M0 (moeEmScales in moe.cu).
///
/// # Safety
/// `sc` holds the row's scales; `em_scales` what the strides reach (checked by the launcher).
unsafe fn em_scales(a: &MoeArgs, sc: u64, e: u64, slot: u64) {
    let blocks = a.scale_bytes / 4;
    let [s0, s1, s2] = a.em_scale_strides;
    let base = e * s0 + slot * s1;
    // SAFETY: caller's contract.
    unsafe {
        if a.em_flags & EM_UE8M0 != 0 {
            for g in 0..blocks / 4 {
                let mut w = 0u32;
                for i in 0..4 {
                    w |= ((get::<u32>(sc + 4 * (4 * g + i)) >> 23) & 0xFF) << (8 * i);
                }
                put(a.em_scales + 4 * (base + g * s2), w);
            }
        } else {
            for b in 0..blocks {
                put(a.em_scales + 4 * (base + b * s2), get::<u32>(sc + 4 * b));
            }
        }
    }
}

fn to_f32(dtype: DataType, p: u64) -> f32 {
    // SAFETY: the caller reads an element of `dtype` inside a row it owns.
    unsafe {
        match dtype {
            DataType::F16 => f16::from_bits(get(p)).to_f32(),
            DataType::BF16 => bf16::from_bits(get(p)).to_f32(),
            _ => get::<f32>(p),
        }
    }
}

fn from_f32(dtype: DataType, p: u64, x: f32) {
    // SAFETY: the caller writes an element of `dtype` inside the output it owns.
    unsafe {
        match dtype {
            DataType::F16 => put(p, f16::from_f32(x).to_bits()),
            DataType::BF16 => put(p, bf16::from_f32(x).to_bits()),
            _ => put(p, x),
        }
    }
}

/// The expert-major combine row for received row `j` of source `s` (`i` among all rows): the
/// sum over its top-k entries with a slot of the weight the source wrote into the row times the
/// expert's output there (f32, fused, top-k order; moeWeightedRow in moe.cu), rounded once.
///
/// # Safety
/// `out` is a combine row; `x` holds `[local, em_capacity]` rows (checked by the launcher).
unsafe fn weighted_row(v: &View, dtype: DataType, s: u64, j: u64, i: u64, out: u64) {
    let (a, k) = (v.a, v.k);
    let drow = a.buffer + dispatch_region(a.row_bytes, a.max_tokens, s) + j * a.row_bytes;
    let size = dtype.size() as u64;
    let mut acc = vec![0f32; (a.payload_bytes / size) as usize];
    for q in 0..k {
        // SAFETY: the row's meta and the slot table's row i lie inside them.
        let (le, w, slot) = unsafe {
            (
                get::<i32>(drow + a.meta_at + 4 + 4 * q),
                get::<f32>(drow + a.meta_at + 4 + 4 * (k + q)),
                get::<i32>(a.em_slots + 4 * (i * k + q)),
            )
        };
        if slot < 0 || slot as u64 >= a.em_capacity || le < 0 || le as u64 >= v.local {
            continue;
        }
        let src = a.x + (le as u64 * a.em_capacity + slot as u64) * a.payload_bytes;
        for (e, x) in acc.iter_mut().enumerate() {
            *x = w.mul_add(to_f32(dtype, src + e as u64 * size), *x);
        }
    }
    for (e, x) in acc.iter().enumerate() {
        from_f32(dtype, out + e as u64 * size, *x);
    }
}

/// `mscclpp::moe::combine`.
pub fn combine(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = MoeArgs::from_bytes(args)?;
    check(&a, cfg.num_blocks())?;
    let dtype = DataType::from_code(a.dtype)?;
    if !matches!(dtype, DataType::F32 | DataType::F16 | DataType::BF16) {
        return Err(Error::invalid(format!(
            "expert-parallel combine of {dtype}: f32, f16 and bf16 are summed"
        )));
    }
    let v = View {
        a: &a,
        n: u64::from(a.nranks),
        k: u64::from(a.topk),
        local: u64::from(a.num_experts / a.nranks),
    };
    let (r, n, k) = (u64::from(a.rank), v.n, v.k);
    let seq = v.next_seq(hdr::combine_seq());
    let em = a.em_flags & EM_ON != 0;
    // SAFETY: the handle holds the token word (written by the dispatch).
    let dispatched = u64::from(unsafe { get::<i32>(v.handle(handle_tokens(n))) }.max(0) as u32);
    if em && a.phases & HALF_SEND != 0 {
        // Expert-major: this rank's weights into the rows it dispatched to each rank, once that
        // rank has read them.
        let dseq = word(a.buffer, hdr::dispatch_seq()).load(Ordering::Relaxed);
        for d in 0..n {
            wait_ge(a.buffer, hdr::dispatch_ack(d), dseq, || {
                format!("rank {d} to read this rank's dispatch")
            })?;
            // Tokens past the call's have no weights given (the rows keep the dispatch's zeros).
            for t in 0..dispatched.min(a.tokens) {
                // SAFETY: the handle holds the dispatch's positions of t < tokens.
                let p: i32 = unsafe { get(v.position(t, d)) };
                if p < 0 || p as u64 >= a.max_tokens {
                    continue;
                }
                let w =
                    a.peer_dispatch[d as usize] + p as u64 * a.row_bytes + a.meta_at + 4 + 4 * k;
                // SAFETY: row p of this rank's region at d; em_weights holds tokens * topk f32
                // (checked by the launcher) and t < dispatched <= tokens of the dispatch.
                unsafe { copy(w, a.em_weights + 4 * t * k, 4 * k) };
            }
            word(a.peer_buffer[d as usize], hdr::weights_flag(r)).store(seq, Ordering::Release);
        }
    }
    // Phase 1: the rows received from each source go back to it, in the order they came.
    let mut prefix = 0u64;
    for s in (0..n).filter(|_| a.phases & HALF_SEND != 0) {
        if em {
            wait_ge(a.buffer, hdr::weights_flag(s), seq, || {
                format!("rank {s}'s combine weights")
            })?;
        }
        wait_ge(a.buffer, hdr::combine_ack(s), seq - 1, || {
            format!("rank {s} to read this rank's previous combine")
        })?;
        // SAFETY: the handle holds nranks counts (written by the dispatch).
        let c = u64::from(unsafe { get::<i32>(v.handle(s)) }.max(0) as u32);
        let region = a.peer_combine[s as usize];
        // Rows past `x`'s (a dispatch that overflowed its output) are not sent.
        let sent = c
            .min(a.max_tokens)
            .min(a.out_capacity.saturating_sub(prefix));
        for j in 0..sent {
            let (row, i) = (region + j * a.row_bytes, prefix + j);
            // SAFETY: rank s's region for this rank holds max_tokens rows; `x` (and the weights)
            // hold the dispatch's rows (checked by the launcher against the handle's counts).
            unsafe {
                if em {
                    weighted_row(&v, dtype, s, j, i, row);
                } else {
                    copy(row, a.x + i * a.payload_bytes, a.payload_bytes);
                }
                // Without weights, zeros: a peer that sums weights must not read a previous
                // call's.
                if a.topk_weights != 0 {
                    copy(
                        row + a.meta_at + 4 + 4 * k,
                        a.topk_weights + 4 * i * k,
                        4 * k,
                    );
                } else {
                    std::ptr::write_bytes(
                        (row + a.meta_at + 4 + 4 * k) as *mut u8,
                        0,
                        4 * k as usize,
                    );
                }
            }
        }
        prefix += c;
        let peer = a.peer_buffer[s as usize];
        word(peer, hdr::combine_count(r)).store(sent, Ordering::Relaxed);
        word(peer, hdr::combine_flag(r)).store(seq, Ordering::Release);
    }
    if a.phases & HALF_RECEIVE == 0 {
        return Ok(());
    }
    // Phase 2: every token, the sum of its rows from the ranks it went to (rank order, f32).
    for d in 0..n {
        wait_ge(a.buffer, hdr::combine_flag(d), seq, || {
            format!("rank {d}'s combine rows")
        })?;
    }
    let sent: Vec<u64> = (0..n)
        .map(|d| word(a.buffer, hdr::combine_count(d)).load(Ordering::Relaxed))
        .collect();
    let size = dtype.size() as u64;
    let elems = a.payload_bytes / size;
    let mut acc = vec![0f32; elems as usize];
    let mut wacc = vec![0f32; k as usize];
    for t in 0..a.tokens {
        acc.fill(0.0);
        wacc.fill(0.0);
        if t >= dispatched {
            // More tokens than the dispatch had: their positions are not this call's.
            v.fail(STATUS_COMBINE_MISSING);
        }
        for d in (0..n).filter(|_| t < dispatched) {
            // SAFETY: the handle holds the dispatch's positions of t < tokens.
            let p: i32 = unsafe { get(v.position(t, d)) };
            if p < 0 {
                continue;
            }
            if p as u64 >= sent[d as usize] {
                // Rank d did not send this row back: summed without it, and said.
                v.fail(STATUS_COMBINE_MISSING);
                continue;
            }
            let row =
                a.buffer + combine_region(a.row_bytes, a.max_tokens, n, d) + p as u64 * a.row_bytes;
            for (e, x) in acc.iter_mut().enumerate() {
                *x += to_f32(dtype, row + e as u64 * size);
            }
            for (q, w) in wacc.iter_mut().enumerate() {
                // SAFETY: the row's weights (its meta) lie inside it.
                *w += unsafe { get::<f32>(row + a.meta_at + 4 + 4 * (k + q as u64)) };
            }
        }
        for (e, x) in acc.iter().enumerate() {
            from_f32(dtype, a.out_x + (t * elems + e as u64) * size, *x);
        }
        if a.out_weights != 0 {
            for (q, w) in wacc.iter().enumerate() {
                // SAFETY: out_weights holds tokens * topk f32 (checked by the launcher).
                unsafe { put(a.out_weights + 4 * (t * k + q as u64), *w) };
            }
        }
    }
    word(a.buffer, hdr::combine_done()).fetch_add(n, Ordering::Relaxed);
    for d in 0..n {
        word(a.peer_buffer[d as usize], hdr::combine_ack(r)).store(seq, Ordering::Release);
    }
    v.store_seq(hdr::combine_seq(), seq);
    Ok(())
}
