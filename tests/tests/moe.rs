//! Expert-parallel layout, dispatch and combine (`mscclpp::collectives::moe`) against a CPU
//! reference, ranks as separate processes: random routings (with -1 entries and experts nobody
//! picks), one token, every token to one rank, a rank with no tokens, FP8 rows with scales,
//! combines in f32, f16 and bf16, every case run twice (the sequences), two dispatches before
//! their combines, a dispatch and combine captured in a graph and replayed with new data; outputs
//! poisoned first and the rows past those received checked untouched. Bad input: an expert index
//! out of range (an error on that rank, the entry dropped, no hang elsewhere) and outputs too
//! small for what arrives. 2, 3, 4 and 8 ranks on the host backend; 2 ranks on a GPU where there
//! is one. Runs with `cargo test -p mscclpp-conformance --test moe`.

use std::sync::Arc;
use std::time::Duration;

use half::{bf16, f16};
use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::collectives::DataType;
use mscclpp::collectives::moe::{
    AnyMoe, Combine, Dispatch, ExpertMajor, ExpertMajorIn, ExpertScales, Fp8Cast, Halves,
    LayoutOut, MoeConfig,
};
use mscclpp::comm::Communicator;
use mscclpp::hal::{BackendKind, DeviceBuffer, MemoryKind};
use mscclpp::typed;
use mscclpp_conformance::multiproc;
use mscclpp_conformance::rng::Rng;

const UID_VAR: &str = "MSCCLPP_TEST_UID";
const BACKEND_VAR: &str = "MSCCLPP_TEST_BACKEND";
/// Comma-separated simulated host of each rank (unset: every rank on this host).
const HOSTS_VAR: &str = "MSCCLPP_TEST_MOE_HOSTS";
const POISON: u8 = 0xA5;

type R<T> = Result<T, String>;

fn e(x: impl std::fmt::Display) -> String {
    x.to_string()
}

/// How a case routes tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Route {
    /// Distinct random experts, one in eight entries -1.
    Random,
    /// Every token's experts on rank 0.
    OneRank,
}

#[derive(Debug, Clone, Copy)]
struct Case {
    name: &'static str,
    /// Experts per rank (the exchange is set up for this times the ranks).
    local: usize,
    topk: usize,
    hidden: usize,
    /// Tokens of rank r: `tokens[r % 4]`.
    tokens: [usize; 4],
    route: Route,
    /// The combine's element type; FP8: the dispatch sends one byte per channel with scales.
    dtype: DataType,
    fp8: bool,
}

const MAX_TOKENS: usize = 48;
const MAX_HIDDEN: usize = 256;

fn cases() -> Vec<Case> {
    let c = |name, local, topk, hidden, tokens, route, dtype, fp8| Case {
        name,
        local,
        topk,
        hidden,
        tokens,
        route,
        dtype,
        fp8,
    };
    vec![
        c(
            "random bf16",
            8,
            8,
            256,
            [40, 33, 48, 17],
            Route::Random,
            DataType::BF16,
            false,
        ),
        c(
            "random f32, top-1",
            2,
            1,
            96,
            [21, 48, 5, 30],
            Route::Random,
            DataType::F32,
            false,
        ),
        c(
            "one token",
            4,
            4,
            64,
            [1, 1, 1, 1],
            Route::Random,
            DataType::F16,
            false,
        ),
        c(
            "a rank without tokens",
            4,
            3,
            72,
            [12, 0, 9, 4],
            Route::Random,
            DataType::BF16,
            false,
        ),
        c(
            "every token to rank 0",
            4,
            2,
            128,
            [30, 25, 48, 1],
            Route::OneRank,
            DataType::BF16,
            false,
        ),
        c(
            "empty experts",
            32,
            2,
            40,
            [6, 3, 2, 5],
            Route::Random,
            DataType::F32,
            false,
        ),
        c(
            "fp8 with scales",
            8,
            8,
            256,
            [33, 48, 20, 7],
            Route::Random,
            DataType::BF16,
            true,
        ),
    ]
}

/// One rank's routing and data of a case (every rank can make every rank's).
struct Input {
    tokens: usize,
    idx: Vec<i64>,
    weights: Vec<f32>,
    x: Vec<u8>,
    scales: Vec<u8>,
}

fn row_bytes(c: &Case) -> usize {
    if c.fp8 {
        c.hidden
    } else {
        c.hidden * c.dtype.size()
    }
}

fn scale_bytes(c: &Case) -> usize {
    if c.fp8 { c.hidden.div_ceil(128) * 4 } else { 0 }
}

fn input(c: &Case, salt: u64, rank: usize, n: usize) -> Input {
    let mut rng = Rng::new(0x0e0e_0000 ^ (salt << 16) ^ rank as u64);
    let tokens = c.tokens[rank % 4];
    let (local, experts) = (c.local, c.local * n);
    let mut idx = Vec::with_capacity(tokens * c.topk);
    for _ in 0..tokens {
        let mut picked: Vec<i64> = Vec::new();
        for _ in 0..c.topk {
            let pool = match c.route {
                Route::Random => experts,
                Route::OneRank => local,
            };
            if picked.len() >= pool || (c.route == Route::Random && rng.below(8) == 0) {
                picked.push(-1);
                continue;
            }
            loop {
                let x = rng.below(pool as u64) as i64;
                if !picked.contains(&x) {
                    picked.push(x);
                    break;
                }
            }
        }
        idx.extend(picked);
    }
    let weights = (0..tokens * c.topk)
        .map(|_| (1 + rng.below(1000)) as f32 / 1024.0)
        .collect();
    Input {
        tokens,
        idx,
        weights,
        x: rng.bytes(tokens * row_bytes(c)),
        scales: rng.bytes(tokens * scale_bytes(c)),
    }
}

/// The combine's input on rank `d` for the row of token `t` of source `s`: small multiples of a
/// quarter, so that every sum of 8 of them is exact in each element type.
fn expert_value(d: usize, s: usize, t: usize, el: usize) -> f32 {
    ((d * 7 + s * 3 + t + el) % 17) as f32 * 0.25 - 2.0
}

fn encode(dtype: DataType, v: f32, out: &mut Vec<u8>) {
    match dtype {
        DataType::F16 => out.extend_from_slice(&f16::from_f32(v).to_le_bytes()),
        DataType::BF16 => out.extend_from_slice(&bf16::from_f32(v).to_le_bytes()),
        _ => out.extend_from_slice(&v.to_le_bytes()),
    }
}

/// What a rank should receive: (source, token) in order.
fn expected_rows(c: &Case, inputs: &[Input], me: usize) -> Vec<(usize, usize)> {
    let local = c.local as i64;
    let mut rows = Vec::new();
    for (s, inp) in inputs.iter().enumerate() {
        for t in 0..inp.tokens {
            let k = &inp.idx[t * c.topk..(t + 1) * c.topk];
            if k.iter().any(|&x| x >= 0 && x / local == me as i64) {
                rows.push((s, t));
            }
        }
    }
    rows
}

fn buf(device: &Arc<dyn mscclpp::hal::Device>, bytes: usize) -> R<DeviceBuffer> {
    device.alloc(bytes.max(16), MemoryKind::Device).map_err(e)
}

/// The buffers of one dispatch and combine of a case on this rank.
struct Bufs {
    x: DeviceBuffer,
    idx: DeviceBuffer,
    w: DeviceBuffer,
    sc: DeviceBuffer,
    out_x: DeviceBuffer,
    out_idx: DeviceBuffer,
    out_w: DeviceBuffer,
    out_sc: DeviceBuffer,
    out_src: DeviceBuffer,
    handle: DeviceBuffer,
    cx: DeviceBuffer,
    cw: DeviceBuffer,
    comb: DeviceBuffer,
    comb_w: DeviceBuffer,
    capacity: usize,
}

struct Rank {
    rank: usize,
    n: usize,
    device: Arc<dyn mscclpp::hal::Device>,
    stream: Arc<mscclpp::hal::DynStream>,
    comm: Arc<Communicator>,
    /// The exchange of the current case's expert count.
    moe: Box<dyn AnyMoe>,
}

impl Rank {
    /// Sets up the exchange for `c` (a collective call) unless the current one serves it.
    fn exchange_for(&mut self, c: &Case) -> R<()> {
        let want = config(c.local * self.n, c.topk);
        if *self.moe.config() != want {
            self.moe = typed::expert_exchange(&self.comm, want).map_err(e)?;
        }
        Ok(())
    }

    fn bufs(&self, c: &Case, capacity: usize) -> R<Bufs> {
        let (k, rb, sb) = (c.topk, row_bytes(c), scale_bytes(c));
        let cb = c.hidden * c.dtype.size();
        let d = &self.device;
        Ok(Bufs {
            x: buf(d, MAX_TOKENS * rb)?,
            idx: buf(d, MAX_TOKENS * k * 8)?,
            w: buf(d, MAX_TOKENS * k * 4)?,
            sc: buf(d, MAX_TOKENS * sb)?,
            out_x: buf(d, capacity * rb)?,
            out_idx: buf(d, capacity * k * 8)?,
            out_w: buf(d, capacity * k * 4)?,
            out_sc: buf(d, capacity * sb)?,
            out_src: buf(d, capacity * 4)?,
            handle: buf(d, self.moe.handle_bytes())?,
            cx: buf(d, capacity * cb)?,
            cw: buf(d, capacity * k * 4)?,
            comb: buf(d, MAX_TOKENS * cb)?,
            comb_w: buf(d, MAX_TOKENS * k * 4)?,
            capacity,
        })
    }

    fn write(&self, b: &DeviceBuffer, data: &[u8]) -> R<()> {
        if data.is_empty() {
            return Ok(());
        }
        self.stream
            .write_from_host(&b.slice(..data.len()).map_err(e)?, data)
            .map_err(e)
    }

    fn read(&self, b: &DeviceBuffer, len: usize) -> R<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.stream
            .read_to_host(&mut v, &b.slice(..len).map_err(e)?)
            .map_err(e)?;
        Ok(v)
    }

    /// Writes this rank's inputs and poisons every output.
    fn load(&self, inp: &Input, b: &Bufs) -> R<()> {
        self.write(&b.x, &inp.x)?;
        let idx: Vec<u8> = inp.idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(&b.idx, &idx)?;
        let w: Vec<u8> = inp.weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(&b.w, &w)?;
        self.write(&b.sc, &inp.scales)?;
        for o in [
            &b.out_x, &b.out_idx, &b.out_w, &b.out_sc, &b.out_src, &b.comb, &b.comb_w,
        ] {
            self.stream.fill(&o.full(), POISON).map_err(e)?;
        }
        Ok(())
    }

    fn dispatch_args<'a>(
        &self,
        c: &Case,
        tokens: usize,
        b: &'a Bufs,
        s: &'a Slices,
    ) -> Dispatch<'a> {
        Dispatch {
            tokens,
            x: &s.x,
            row_bytes: row_bytes(c),
            topk_idx: &s.idx,
            topk_weights: Some(&s.w),
            scales: c.fp8.then_some((&s.sc, scale_bytes(c))),
            capacity: b.capacity,
            out_x: &s.out_x,
            out_idx: &s.out_idx,
            out_weights: Some(&s.out_w),
            out_scales: c.fp8.then_some(&s.out_sc),
            out_src: &s.out_src,
            handle: &s.handle,
        }
    }

    fn combine_args<'a>(&self, c: &Case, tokens: usize, rows: usize, s: &'a Slices) -> Combine<'a> {
        Combine {
            tokens,
            x: &s.cx,
            rows,
            dtype: c.dtype,
            hidden: c.hidden,
            topk_weights: Some(&s.cw),
            handle: &s.handle,
            out_x: &s.comb,
            out_weights: Some(&s.comb_w),
        }
    }

    /// The combine's inputs from what was received: expert values and the received weights.
    fn combine_inputs(&self, c: &Case, b: &Bufs, rows: &[(usize, usize)]) -> R<()> {
        let mut cx = Vec::new();
        for &(s, t) in rows {
            for el in 0..c.hidden {
                encode(c.dtype, expert_value(self.rank, s, t, el), &mut cx);
            }
        }
        self.write(&b.cx, &cx)?;
        let got_w = self.read(&b.out_w, b.out_w.len())?;
        self.write(&b.cw, &got_w[..rows.len() * c.topk * 4])
    }

    /// Checks the dispatch's outputs and counts.
    fn check_dispatch(
        &self,
        c: &Case,
        inputs: &[Input],
        b: &Bufs,
        what: &str,
    ) -> R<Vec<(usize, usize)>> {
        let (k, rb, sb, n, me) = (c.topk, row_bytes(c), scale_bytes(c), self.n, self.rank);
        let local = c.local;
        let rows = expected_rows(c, inputs, me);
        let got = self
            .moe
            .read_handle(&b.handle.full(), &*self.stream)
            .map_err(|x| format!("{what}: {x}"))?;
        let per_source: Vec<usize> = (0..n)
            .map(|s| rows.iter().filter(|r| r.0 == s).count())
            .collect();
        if got.per_source != per_source {
            return Err(format!(
                "{what}: rows from each source {:?}, expected {per_source:?}",
                got.per_source
            ));
        }
        let mut per_expert = vec![0usize; local];
        let out_x = self.read(&b.out_x, b.out_x.len())?;
        let out_idx = self.read(&b.out_idx, b.out_idx.len())?;
        let out_w = self.read(&b.out_w, b.out_w.len())?;
        let out_sc = self.read(&b.out_sc, b.out_sc.len())?;
        let out_src = self.read(&b.out_src, b.out_src.len())?;
        for (i, &(s, t)) in rows.iter().enumerate() {
            let inp = &inputs[s];
            if out_x[i * rb..(i + 1) * rb] != inp.x[t * rb..(t + 1) * rb] {
                return Err(format!("{what}: row {i} (token {t} of rank {s}) differs"));
            }
            if c.fp8 && out_sc[i * sb..(i + 1) * sb] != inp.scales[t * sb..(t + 1) * sb] {
                return Err(format!(
                    "{what}: scales of row {i} (token {t} of rank {s}) differ"
                ));
            }
            let src = i32::from_le_bytes(out_src[4 * i..4 * i + 4].try_into().unwrap());
            if src != t as i32 {
                return Err(format!("{what}: row {i} says token {src}, expected {t}"));
            }
            for q in 0..k {
                let x = inp.idx[t * k + q];
                let mine = x >= 0 && x as usize / local == me;
                let want_idx = if mine { x - (me * local) as i64 } else { -1 };
                let want_w = if mine { inp.weights[t * k + q] } else { 0.0 };
                let o = 8 * (i * k + q);
                let gi = i64::from_le_bytes(out_idx[o..o + 8].try_into().unwrap());
                let o = 4 * (i * k + q);
                let gw = f32::from_le_bytes(out_w[o..o + 4].try_into().unwrap());
                if gi != want_idx || gw.to_bits() != want_w.to_bits() {
                    return Err(format!(
                        "{what}: row {i} expert {q}: ({gi}, {gw}), expected ({want_idx}, {want_w})"
                    ));
                }
                if mine {
                    per_expert[want_idx as usize] += 1;
                }
            }
        }
        if got.per_expert != per_expert {
            return Err(format!(
                "{what}: rows per local expert {:?}, expected {per_expert:?}",
                got.per_expert
            ));
        }
        // Nothing written past the rows received.
        let r = rows.len();
        if out_x[r * rb..].iter().any(|&v| v != POISON)
            || out_src[4 * r..].iter().any(|&v| v != POISON)
        {
            return Err(format!("{what}: bytes written past the {r} rows received"));
        }
        Ok(rows)
    }

    fn check_combine(&self, c: &Case, inputs: &[Input], b: &Bufs, what: &str) -> R<()> {
        self.check_combine_with(c, inputs, b, what, |_| true, true)
    }

    /// `sent_weights(d)`: whether rank `d` combined with weights (zeros came from the others);
    /// `check_weights`: whether this rank asked for the summed weights.
    fn check_combine_with(
        &self,
        c: &Case,
        inputs: &[Input],
        b: &Bufs,
        what: &str,
        sent_weights: impl Fn(usize) -> bool,
        check_weights: bool,
    ) -> R<()> {
        let (k, n, me) = (c.topk, self.n, self.rank);
        let local = c.local as i64;
        let inp = &inputs[me];
        let size = c.dtype.size();
        let comb = self.read(&b.comb, b.comb.len())?;
        let comb_w = self.read(&b.comb_w, b.comb_w.len())?;
        for t in 0..inp.tokens {
            let ks = &inp.idx[t * k..(t + 1) * k];
            let ranks: Vec<usize> = (0..n)
                .filter(|&d| ks.iter().any(|&x| x >= 0 && x / local == d as i64))
                .collect();
            let mut want = Vec::new();
            for el in 0..c.hidden {
                // The value each rank sent, rounded to the element type, summed in f32 in rank
                // order, rounded once.
                let mut acc = 0f32;
                for &d in &ranks {
                    let mut one = Vec::new();
                    encode(c.dtype, expert_value(d, me, t, el), &mut one);
                    acc += match c.dtype {
                        DataType::F16 => f16::from_le_bytes([one[0], one[1]]).to_f32(),
                        DataType::BF16 => bf16::from_le_bytes([one[0], one[1]]).to_f32(),
                        _ => f32::from_le_bytes(one[..4].try_into().unwrap()),
                    };
                }
                encode(c.dtype, acc, &mut want);
            }
            let row = c.hidden * size;
            if comb[t * row..(t + 1) * row] != want[..] {
                return Err(format!(
                    "{what}: token {t} (sent to ranks {ranks:?}) combined wrong"
                ));
            }
            for (q, &x) in ks.iter().enumerate().filter(|_| check_weights) {
                let w = if x >= 0 && sent_weights((x / local) as usize) {
                    inp.weights[t * k + q]
                } else {
                    0.0
                };
                let o = 4 * (t * k + q);
                let g = f32::from_le_bytes(comb_w[o..o + 4].try_into().unwrap());
                if g.to_bits() != w.to_bits() {
                    return Err(format!("{what}: token {t} weight {q}: {g}, expected {w}"));
                }
            }
        }
        let end = inp.tokens * c.hidden * size;
        if comb[end..].iter().any(|&v| v != POISON) {
            return Err(format!(
                "{what}: bytes combined past this rank's {} tokens",
                inp.tokens
            ));
        }
        Ok(())
    }

    fn check_layout(&self, c: &Case, inp: &Input) -> R<()> {
        let (n, k) = (self.n, c.topk);
        let d = &self.device;
        let (idx, pr, pe, ir, st) = (
            buf(d, MAX_TOKENS * k * 8)?,
            buf(d, 4 * n)?,
            buf(d, 4 * c.local * n)?,
            buf(d, MAX_TOKENS * n)?,
            buf(d, 4)?,
        );
        let bytes: Vec<u8> = inp.idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(&idx, &bytes)?;
        let out = LayoutOut {
            per_rank: &pr.full(),
            per_expert: &pe.full(),
            in_rank: &ir.full(),
            status: &st.full(),
        };
        // SAFETY: the buffers live until the synchronous reads below.
        unsafe {
            self.moe
                .layout(&idx.full(), inp.tokens, &out, &*self.stream)
        }
        .map_err(e)?;
        let i32s = |v: Vec<u8>| -> Vec<i32> {
            v.chunks(4)
                .map(|w| i32::from_le_bytes(w.try_into().unwrap()))
                .collect()
        };
        let local = c.local as i64;
        let mut want_pr = vec![0i32; n];
        let mut want_pe = vec![0i32; c.local * n];
        let mut want_ir = vec![0u8; MAX_TOKENS * n];
        for t in 0..inp.tokens {
            for &x in &inp.idx[t * k..(t + 1) * k] {
                if x >= 0 {
                    want_pe[x as usize] += 1;
                    want_ir[t * n + (x / local) as usize] = 1;
                }
            }
            for r in 0..n {
                want_pr[r] += i32::from(want_ir[t * n + r]);
            }
        }
        let got_ir = self.read(&ir, MAX_TOKENS * n)?;
        if i32s(self.read(&pr, 4 * n)?) != want_pr
            || i32s(self.read(&pe, 4 * c.local * n)?) != want_pe
            || got_ir[..inp.tokens * n] != want_ir[..inp.tokens * n]
            || i32s(self.read(&st, 4)?) != [0]
        {
            return Err(format!("layout of {} differs from the reference", c.name));
        }
        Ok(())
    }

    fn sync(&self, what: &str) -> R<()> {
        self.stream
            .synchronize_timeout(Duration::from_secs(120))
            .map_err(|x| format!("{what}: {x}"))
    }
}

/// Slices of [`Bufs`] (the descriptors borrow them).
struct Slices {
    x: mscclpp::hal::BufferSlice,
    idx: mscclpp::hal::BufferSlice,
    w: mscclpp::hal::BufferSlice,
    sc: mscclpp::hal::BufferSlice,
    out_x: mscclpp::hal::BufferSlice,
    out_idx: mscclpp::hal::BufferSlice,
    out_w: mscclpp::hal::BufferSlice,
    out_sc: mscclpp::hal::BufferSlice,
    out_src: mscclpp::hal::BufferSlice,
    handle: mscclpp::hal::BufferSlice,
    cx: mscclpp::hal::BufferSlice,
    cw: mscclpp::hal::BufferSlice,
    comb: mscclpp::hal::BufferSlice,
    comb_w: mscclpp::hal::BufferSlice,
}

impl Bufs {
    fn slices(&self) -> Slices {
        Slices {
            x: self.x.full(),
            idx: self.idx.full(),
            w: self.w.full(),
            sc: self.sc.full(),
            out_x: self.out_x.full(),
            out_idx: self.out_idx.full(),
            out_w: self.out_w.full(),
            out_sc: self.out_sc.full(),
            out_src: self.out_src.full(),
            handle: self.handle.full(),
            cx: self.cx.full(),
            cw: self.cw.full(),
            comb: self.comb.full(),
            comb_w: self.comb_w.full(),
        }
    }
}

fn config(num_experts: usize, topk: usize) -> MoeConfig {
    MoeConfig {
        num_experts,
        topk,
        max_tokens: MAX_TOKENS,
        max_row_bytes: MAX_HIDDEN * 4,
        max_scale_bytes: MAX_HIDDEN.div_ceil(128) * 4,
    }
}

fn setup() -> R<Rank> {
    let (rank, n) = multiproc::rank_and_size();
    if let Ok(hosts) = std::env::var(HOSTS_VAR) {
        let host = hosts
            .split(',')
            .nth(rank)
            .ok_or_else(|| format!("{HOSTS_VAR}={hosts} names no host for rank {rank}"))?;
        // SAFETY: the child's first act, before any thread of its own is started.
        unsafe { std::env::set_var("MSCCLPP_HOSTID", format!("moe-test-host-{host}")) };
    }
    let (comm, device, _) = multiproc::rank_communicator(UID_VAR, BACKEND_VAR, false)?;
    let stream = device.create_stream().map_err(e)?;
    let moe = typed::expert_exchange(&comm, config(8 * n, 8)).map_err(e)?;
    Ok(Rank {
        rank,
        n,
        device,
        stream,
        comm,
        moe,
    })
}

/// One rank: every case twice, two dispatches before their combines, a captured graph, then the
/// bad inputs.
fn role_moe() -> R<()> {
    let mut r = setup()?;
    let (n, me) = (r.n, r.rank);
    let mut calls = 0;
    for (ci, c) in cases().iter().enumerate() {
        r.exchange_for(c)?;
        let inputs: Vec<Input> = (0..n).map(|s| input(c, ci as u64, s, n)).collect();
        r.check_layout(c, &inputs[me])
            .map_err(|x| format!("{}: {x}", c.name))?;
        for round in 0..2 {
            // The worst case first, then outputs of exactly the rows that arrive.
            let capacity = match round {
                0 => n * MAX_TOKENS,
                _ => expected_rows(c, &inputs, me).len(),
            };
            let b = r.bufs(c, capacity)?;
            let s = b.slices();
            let what = format!("{} (call {round}, {capacity} rows of output)", c.name);
            r.load(&inputs[me], &b)?;
            // SAFETY: the buffers live until the synchronisations below.
            unsafe {
                r.moe
                    .dispatch(&r.dispatch_args(c, inputs[me].tokens, &b, &s), &*r.stream)
            }
            .map_err(|x| format!("{what}: dispatch: {x}"))?;
            r.sync(&what)?;
            let rows = r.check_dispatch(c, &inputs, &b, &what)?;
            r.combine_inputs(c, &b, &rows)?;
            // SAFETY: as above.
            unsafe {
                r.moe.combine(
                    &r.combine_args(c, inputs[me].tokens, rows.len(), &s),
                    &*r.stream,
                )
            }
            .map_err(|x| format!("{what}: combine: {x}"))?;
            r.sync(&what)?;
            r.check_combine(c, &inputs, &b, &what)?;
            calls += 2;
        }
    }
    calls += expert_major(&mut r)?;
    calls += expert_major_cast(&mut r)?;
    calls += two_in_flight(&r)?;
    calls += weights_from_even_ranks(&r)?;
    calls += captured(&r)?;
    calls += bad_inputs(&r)?;
    multiproc::report("calls", calls);
    Ok(())
}

/// The expert-major combine's input at rank `d` for local expert `e`'s slot holding token `t` of
/// source `s`: small multiples of a quarter.
fn em_value(d: usize, e: usize, s: usize, t: usize, el: usize) -> f32 {
    ((d * 5 + e * 3 + s * 7 + t + el) % 13) as f32 * 0.25 - 1.5
}

fn round_to(dtype: DataType, x: f32) -> f32 {
    match dtype {
        DataType::F16 => f16::from_f32(x).to_f32(),
        DataType::BF16 => bf16::from_f32(x).to_f32(),
        _ => x,
    }
}

/// The expert-major ("low-latency") form against a CPU reference, every case: the dispatch lays
/// each (token, local expert) entry out per expert (sources in rank order, tokens in order: the
/// rows, source tokens, ranges, counts, the stats added to, the scales at column-major strides),
/// nothing past the counts written; the combine weighs each expert's output by the source's
/// weight and sums (at each rank in f32 over the top-k, rounded; then over the ranks in f32,
/// rounded). Odd cases run each call as a send launch and a later receive launch (DeepEP's hook).
/// Across hosts the form is refused, naming why.
/// One rank's expert-major outputs (`rb` bytes a row; all but the stats and slots poisoned),
/// and an empty buffer for the flat outputs the form leaves unused.
struct EmBufs {
    ex: DeviceBuffer,
    src: DeviceBuffer,
    range: DeviceBuffer,
    count: DeviceBuffer,
    stats: DeviceBuffer,
    slots: DeviceBuffer,
    handle: DeviceBuffer,
    esc: DeviceBuffer,
    empty: DeviceBuffer,
}

/// Slices of [`EmBufs`] (the descriptors borrow them).
struct EmSlices {
    ex: mscclpp::hal::BufferSlice,
    src: mscclpp::hal::BufferSlice,
    range: mscclpp::hal::BufferSlice,
    count: mscclpp::hal::BufferSlice,
    stats: mscclpp::hal::BufferSlice,
    slots: mscclpp::hal::BufferSlice,
    handle: mscclpp::hal::BufferSlice,
    esc: mscclpp::hal::BufferSlice,
    none: mscclpp::hal::BufferSlice,
}

impl EmBufs {
    fn new(r: &Rank, rb: usize, local: usize, cap: usize, blocks: usize) -> R<Self> {
        let d = &r.device;
        let b = EmBufs {
            ex: buf(d, local * cap * rb)?,
            src: buf(d, local * cap * 4)?,
            range: buf(d, local * r.n * 8)?,
            count: buf(d, local * 4)?,
            stats: buf(d, local * 4)?,
            slots: buf(d, r.moe.slots_bytes())?,
            handle: buf(d, r.moe.handle_bytes())?,
            esc: buf(d, local * blocks * cap * 4)?,
            empty: buf(d, 16)?,
        };
        for o in [&b.ex, &b.src, &b.range, &b.count, &b.esc] {
            r.stream.fill(&o.full(), POISON).map_err(e)?;
        }
        Ok(b)
    }

    fn slices(&self) -> R<EmSlices> {
        Ok(EmSlices {
            ex: self.ex.full(),
            src: self.src.full(),
            range: self.range.full(),
            count: self.count.full(),
            stats: self.stats.full(),
            slots: self.slots.full(),
            handle: self.handle.full(),
            esc: self.esc.full(),
            none: self.empty.slice(..0).map_err(e)?,
        })
    }
}

impl EmSlices {
    /// The outputs of a dispatch of `cap` slots an expert; f32 scales column-major per expert,
    /// as DeepEP hands them out ((e, slot, b) at e * blocks * cap + b * cap + slot), where
    /// `scales`.
    fn outputs(
        &self,
        cap: usize,
        blocks: usize,
        scales: bool,
        stats: bool,
        cast: Option<Fp8Cast>,
    ) -> ExpertMajor<'_> {
        ExpertMajor {
            capacity: cap,
            x: &self.ex,
            scales: scales.then_some(ExpertScales {
                buf: &self.esc,
                strides: [(blocks * cap) as u64, 1, cap as u64],
                ue8m0: false,
            }),
            src: &self.src,
            range: &self.range,
            count: &self.count,
            stats: stats.then_some(&self.stats),
            slots: &self.slots,
            cast,
        }
    }
}

fn expert_major(r: &mut Rank) -> R<usize> {
    let (n, me) = (r.n, r.rank);
    if std::env::var(HOSTS_VAR).is_ok() {
        let c = &cases()[0];
        r.exchange_for(c)?;
        return match r.moe.expert_major() {
            Err(x) if x.to_string().contains("spans hosts") => Ok(0),
            other => Err(format!("expert-major form across hosts: {other:?}")),
        };
    }
    let mut calls = 0;
    for (ci, c) in cases().iter().enumerate() {
        r.exchange_for(c)?;
        let (k, local, rb, sb) = (c.topk, c.local, row_bytes(c), scale_bytes(c));
        let inputs: Vec<Input> = (0..n).map(|s| input(c, 500 + ci as u64, s, n)).collect();
        let inp = &inputs[me];
        let halves: &[Halves] = if ci % 2 == 1 {
            &[Halves::Send, Halves::Receive]
        } else {
            &[Halves::Both]
        };
        let what = format!("expert-major {}", c.name);
        let cap = n * MAX_TOKENS;
        let blocks = sb / 4;
        let d = &r.device;
        let (x, idx, sc) = (
            buf(d, MAX_TOKENS * rb)?,
            buf(d, MAX_TOKENS * k * 8)?,
            buf(d, MAX_TOKENS * sb)?,
        );
        r.write(&x, &inp.x)?;
        let idx_bytes: Vec<u8> = inp.idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        r.write(&idx, &idx_bytes)?;
        r.write(&sc, &inp.scales)?;
        let eb = EmBufs::new(r, rb, local, cap, blocks)?;
        // The stats start at 1 per expert: the call adds to them.
        let ones: Vec<u8> = (0..local).flat_map(|_| 1i32.to_le_bytes()).collect();
        r.write(&eb.stats, &ones)?;
        let (sx, si, ssc, es) = (x.full(), idx.full(), sc.full(), eb.slices()?);
        let disp = Dispatch::expert_major(
            inp.tokens,
            &sx,
            rb,
            &si,
            c.fp8.then_some((&ssc, sb)),
            &es.handle,
            &es.none,
        );
        let em = es.outputs(cap, blocks, c.fp8, true, None);
        for &h in halves {
            // SAFETY: the buffers live until the synchronisation below.
            unsafe { r.moe.dispatch_with(&disp, h, Some(&em), &*r.stream) }
                .map_err(|x| format!("{what}: dispatch ({h:?}): {x}"))?;
        }
        r.sync(&what)?;
        calls += 1;
        // The reference: per local expert, its entries in source order, then token order.
        let mut entries: Vec<Vec<(usize, usize)>> = vec![Vec::new(); local];
        let mut ranges = vec![(0usize, 0usize); local * n];
        for (s, si) in inputs.iter().enumerate() {
            for (e, list) in entries.iter_mut().enumerate() {
                let begin = list.len();
                for t in 0..si.tokens {
                    let want = (me * local + e) as i64;
                    if si.idx[t * k..(t + 1) * k].contains(&want) {
                        list.push((s, t));
                    }
                }
                ranges[e * n + s] = (begin, list.len() - begin);
            }
        }
        let (gx, gsrc, gra, gco, gst, gsc) = (
            r.read(&eb.ex, local * cap * rb)?,
            r.read(&eb.src, local * cap * 4)?,
            r.read(&eb.range, local * n * 8)?,
            r.read(&eb.count, local * 4)?,
            r.read(&eb.stats, local * 4)?,
            r.read(&eb.esc, local * blocks * cap * 4)?,
        );
        let i32_at =
            |v: &[u8], i: usize| i32::from_le_bytes(v[4 * i..4 * i + 4].try_into().unwrap());
        for (e, list) in entries.iter().enumerate() {
            if i32_at(&gco, e) != list.len() as i32 || i32_at(&gst, e) != 1 + list.len() as i32 {
                return Err(format!(
                    "{what}: expert {e}: count {} and stats {}, expected {} and {}",
                    i32_at(&gco, e),
                    i32_at(&gst, e),
                    list.len(),
                    1 + list.len()
                ));
            }
            for s in 0..n {
                let o = 8 * (e * n + s);
                let got = i64::from_le_bytes(gra[o..o + 8].try_into().unwrap());
                let (b, c_) = ranges[e * n + s];
                if got != ((b as i64) << 32 | c_ as i64) {
                    return Err(format!(
                        "{what}: expert {e}, source {s}: range {got:#x}, expected ({b}, {c_})"
                    ));
                }
            }
            for (slot, &(s, t)) in list.iter().enumerate() {
                let at = e * cap + slot;
                if gx[at * rb..(at + 1) * rb] != inputs[s].x[t * rb..(t + 1) * rb]
                    || i32_at(&gsrc, at) != t as i32
                {
                    return Err(format!(
                        "{what}: expert {e} slot {slot} (token {t} of rank {s}) differs"
                    ));
                }
                for bl in 0..blocks {
                    let g = &gsc[4 * (e * blocks * cap + bl * cap + slot)..][..4];
                    if g != &inputs[s].scales[t * sb + 4 * bl..][..4] {
                        return Err(format!(
                            "{what}: expert {e} slot {slot} scale block {bl} differs"
                        ));
                    }
                }
            }
            let past = list.len();
            if gx[(e * cap + past) * rb..(e + 1) * cap * rb]
                .iter()
                .any(|&v| v != POISON)
                || gsrc[4 * (e * cap + past)..4 * (e + 1) * cap]
                    .iter()
                    .any(|&v| v != POISON)
            {
                return Err(format!(
                    "{what}: expert {e}: bytes written past its {past} entries"
                ));
            }
        }
        // The combine: every expert's output at its slots, weighed by the source's weights.
        let mut cx = Vec::new();
        for (e, list) in entries.iter().enumerate() {
            for slot in 0..cap {
                let (s, t) = list.get(slot).copied().unwrap_or((0, 0));
                for el in 0..c.hidden {
                    encode(c.dtype, em_value(me, e, s, t, el), &mut cx);
                }
            }
        }
        let cb = c.hidden * c.dtype.size();
        let (cxb, w, out) = (
            buf(d, local * cap * cb)?,
            buf(d, MAX_TOKENS * k * 4)?,
            buf(d, MAX_TOKENS * cb)?,
        );
        r.write(&cxb, &cx)?;
        let wb: Vec<u8> = inp.weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        r.write(&w, &wb)?;
        r.stream.fill(&out.full(), POISON).map_err(e)?;
        let (scx, sw, sout) = (cxb.full(), w.full(), out.full());
        let comb = Combine {
            tokens: inp.tokens,
            x: &scx,
            rows: local * cap,
            dtype: c.dtype,
            hidden: c.hidden,
            topk_weights: None,
            handle: &es.handle,
            out_x: &sout,
            out_weights: None,
        };
        let emi = ExpertMajorIn {
            capacity: cap,
            slots: &es.slots,
            topk_weights: &sw,
        };
        for &h in halves {
            // SAFETY: the buffers live until the synchronisation below.
            unsafe { r.moe.combine_with(&comb, h, Some(&emi), &*r.stream) }
                .map_err(|x| format!("{what}: combine ({h:?}): {x}"))?;
        }
        r.sync(&what)?;
        calls += 1;
        let got = r.read(&out, inp.tokens * cb)?;
        let mut want = Vec::new();
        for t in 0..inp.tokens {
            let ids = &inp.idx[t * k..(t + 1) * k];
            for el in 0..c.hidden {
                let mut total = 0f32;
                for dd in 0..n {
                    let mut part = 0f32;
                    let mut any = false;
                    for (q, &x) in ids.iter().enumerate() {
                        if x < 0 || x as usize / local != dd {
                            continue;
                        }
                        any = true;
                        let ee = x as usize - dd * local;
                        let v = round_to(c.dtype, em_value(dd, ee, me, t, el));
                        part = inp.weights[t * k + q].mul_add(v, part);
                    }
                    if any {
                        total += round_to(c.dtype, part);
                    }
                }
                encode(c.dtype, total, &mut want);
            }
        }
        if got != want {
            let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(0) / c.dtype.size();
            return Err(format!(
                "{what}: combined token {} element {} differs",
                at / c.hidden,
                at % c.hidden
            ));
        }
        if ci + 1 == cases().len() {
            // The order of halves, refused before anything runs where it is broken (every
            // rank makes the same calls, so the ones that run stay collective).
            let refused = |r: mscclpp::Result<()>, words: &str| match r {
                Err(x) if x.to_string().contains(words) => Ok(()),
                other => Err(format!(
                    "{what}: expected a refusal naming {words:?}: {other:?}"
                )),
            };
            // The buffers live until the synchronisation after these calls.
            let dispatch = |h: Halves| {
                // SAFETY: as said above.
                unsafe { r.moe.dispatch_with(&disp, h, Some(&em), &*r.stream) }
            };
            let combine = |c: &Combine| {
                // SAFETY: as said above.
                unsafe { r.moe.combine_with(c, Halves::Both, Some(&emi), &*r.stream) }
            };
            refused(dispatch(Halves::Receive), "without its send half")?;
            dispatch(Halves::Send).map_err(|x| format!("{what}: {x}"))?;
            refused(dispatch(Halves::Send), "previous one's receive half")?;
            refused(combine(&comb), "a dispatch's receive half")?;
            dispatch(Halves::Receive).map_err(|x| format!("{what}: {x}"))?;
            // A combine through a handle that is not the last dispatch's.
            let other = buf(d, r.moe.handle_bytes())?;
            let so = other.full();
            refused(
                combine(&Combine {
                    handle: &so,
                    ..comb
                }),
                "the last dispatch",
            )?;
            r.sync(&what)?;
            calls += 2;
        }
    }
    Ok(calls)
}

/// The expert-major dispatch casting bf16 rows to E4M3 in its send half (DeepEP's `use_fp8`,
/// with and without `round_scale`): every slot's bytes and scale against a CPU reference of the
/// cast (per 128 channels: the largest magnitude, at least 1e-4, over 448; a power of two up where
/// rounded; each channel divided by it and rounded to nearest even E4M3).
fn expert_major_cast(r: &mut Rank) -> R<usize> {
    if std::env::var(HOSTS_VAR).is_ok() {
        return Ok(0);
    }
    let (n, me) = (r.n, r.rank);
    let c = &cases()[6];
    r.exchange_for(c)?;
    let (k, local, hidden) = (c.topk, c.local, c.hidden);
    let blocks = hidden / 128;
    let cap = n * MAX_TOKENS;
    let d = &r.device;
    let mut calls = 0;
    for round in [false, true] {
        let what = format!("expert-major FP8 cast (round_scale {round})");
        let inputs: Vec<Input> = (0..n).map(|s| input(c, 600, s, n)).collect();
        // bf16 rows of every magnitude a block can have, one block of zeros (the 1e-4 floor).
        let xs: Vec<Vec<f32>> = (0..n)
            .map(|s| {
                let mut rng = Rng::new(0xfa57 ^ s as u64);
                (0..inputs[s].tokens * hidden)
                    .map(|i| {
                        if i % hidden < 128 && i / hidden == 0 {
                            0.0
                        } else {
                            let v = (rng.below(4000) as f32 - 2000.0) / 64.0;
                            bf16::from_f32(v * (1 << (i % 7)) as f32).to_f32()
                        }
                    })
                    .collect()
            })
            .collect();
        let inp = &inputs[me];
        let (x, idx) = (
            buf(d, MAX_TOKENS * hidden * 2)?,
            buf(d, MAX_TOKENS * k * 8)?,
        );
        let xb: Vec<u8> = xs[me]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        r.write(&x, &xb)?;
        let ib: Vec<u8> = inp.idx.iter().flat_map(|v| v.to_le_bytes()).collect();
        r.write(&idx, &ib)?;
        let eb = EmBufs::new(r, hidden, local, cap, blocks)?;
        let (sx, si, es) = (x.full(), idx.full(), eb.slices()?);
        let disp = Dispatch::expert_major(inp.tokens, &sx, hidden, &si, None, &es.handle, &es.none);
        let em = es.outputs(
            cap,
            blocks,
            true,
            false,
            Some(Fp8Cast { round_scale: round }),
        );
        // SAFETY: the buffers live until the synchronisation below.
        unsafe {
            r.moe
                .dispatch_with(&disp, Halves::Both, Some(&em), &*r.stream)
        }
        .map_err(|x| format!("{what}: {x}"))?;
        r.sync(&what)?;
        calls += 1;
        let (gx, gsc) = (
            r.read(&eb.ex, local * cap * hidden)?,
            r.read(&eb.esc, local * blocks * cap * 4)?,
        );
        for e in 0..local {
            let want = (me * local + e) as i64;
            let mut slot = 0;
            for (s, si) in inputs.iter().enumerate() {
                for t in 0..si.tokens {
                    if !si.idx[t * k..(t + 1) * k].contains(&want) {
                        continue;
                    }
                    for b in 0..blocks {
                        let v = &xs[s][t * hidden + b * 128..][..128];
                        let m = v.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-4);
                        let mut scale = m / 448.0;
                        if round {
                            scale = 2f32.powi(scale.log2().ceil() as i32);
                            // log2 may round to the power on either side.
                            if scale / 2.0 >= m / 448.0 {
                                scale /= 2.0;
                            } else if scale < m / 448.0 {
                                scale *= 2.0;
                            }
                        }
                        let at = 4 * (e * blocks * cap + b * cap + slot);
                        let got = f32::from_le_bytes(gsc[at..at + 4].try_into().unwrap());
                        if got.to_bits() != scale.to_bits() {
                            return Err(format!(
                                "{what}: expert {e} slot {slot} block {b}: scale {got}, expected {scale}"
                            ));
                        }
                        for (i, x) in v.iter().enumerate() {
                            let w = mscclpp::hal::dtype::f32_to_fp8(x / scale, true);
                            let g = gx[(e * cap + slot) * hidden + b * 128 + i];
                            if g != w {
                                return Err(format!(
                                    "{what}: expert {e} slot {slot} channel {}: {g:#x}, expected {w:#x}",
                                    b * 128 + i
                                ));
                            }
                        }
                    }
                    slot += 1;
                }
            }
        }
    }
    Ok(calls)
}

/// Two dispatches (different routings), then their combines in the same order.
fn two_in_flight(r: &Rank) -> R<usize> {
    let n = r.n;
    let cs = cases();
    // Both with 8 experts a rank and top-8: the exchange of the last case.
    let (a, b) = (&cs[0], &cs[6]);
    let ia: Vec<Input> = (0..n).map(|s| input(a, 100, s, n)).collect();
    let ib: Vec<Input> = (0..n).map(|s| input(b, 101, s, n)).collect();
    let (ba, bb) = (r.bufs(a, n * MAX_TOKENS)?, r.bufs(b, n * MAX_TOKENS)?);
    let (sa, sb) = (ba.slices(), bb.slices());
    r.load(&ia[r.rank], &ba)?;
    r.load(&ib[r.rank], &bb)?;
    // SAFETY: the buffers live until the synchronisations below.
    unsafe {
        r.moe
            .dispatch(&r.dispatch_args(a, ia[r.rank].tokens, &ba, &sa), &*r.stream)
            .map_err(e)?;
        r.moe
            .dispatch(&r.dispatch_args(b, ib[r.rank].tokens, &bb, &sb), &*r.stream)
            .map_err(e)?;
    }
    r.sync("two dispatches")?;
    let rows_a = r.check_dispatch(a, &ia, &ba, "first of two dispatches")?;
    let rows_b = r.check_dispatch(b, &ib, &bb, "second of two dispatches")?;
    r.combine_inputs(a, &ba, &rows_a)?;
    r.combine_inputs(b, &bb, &rows_b)?;
    // SAFETY: as above.
    unsafe {
        r.moe
            .combine(
                &r.combine_args(a, ia[r.rank].tokens, rows_a.len(), &sa),
                &*r.stream,
            )
            .map_err(e)?;
        r.moe
            .combine(
                &r.combine_args(b, ib[r.rank].tokens, rows_b.len(), &sb),
                &*r.stream,
            )
            .map_err(e)?;
    }
    r.sync("two combines")?;
    r.check_combine(a, &ia, &ba, "first of two combines")?;
    r.check_combine(b, &ib, &bb, "second of two combines")?;
    Ok(4)
}

/// A dispatch, a combine with weights, then another of the same handle where odd ranks send
/// none: the even ranks' summed weights hold those of the experts on even ranks and zeros for
/// the others', never the first combine's.
fn weights_from_even_ranks(r: &Rank) -> R<usize> {
    let n = r.n;
    let c = &cases()[0];
    let what = "a combine with weights from the even ranks only";
    let inputs: Vec<Input> = (0..n).map(|s| input(c, 102, s, n)).collect();
    let b = r.bufs(c, n * MAX_TOKENS)?;
    let s = b.slices();
    r.load(&inputs[r.rank], &b)?;
    // SAFETY: the buffers live until the synchronisations below.
    unsafe {
        r.moe.dispatch(
            &r.dispatch_args(c, inputs[r.rank].tokens, &b, &s),
            &*r.stream,
        )
    }
    .map_err(|x| format!("{what}: dispatch: {x}"))?;
    r.sync(what)?;
    let rows = r.check_dispatch(c, &inputs, &b, what)?;
    r.combine_inputs(c, &b, &rows)?;
    // First a combine with weights from every rank: the rows the next one overwrites hold
    // weights at the columns of the odd ranks' experts.
    let all = r.combine_args(c, inputs[r.rank].tokens, rows.len(), &s);
    // SAFETY: as above.
    unsafe { r.moe.combine(&all, &*r.stream) }.map_err(|x| format!("{what}: {x}"))?;
    r.sync(what)?;
    r.check_combine(c, &inputs, &b, what)?;
    let weighted = r.rank % 2 == 0;
    let mut args = r.combine_args(c, inputs[r.rank].tokens, rows.len(), &s);
    if !weighted {
        args.topk_weights = None;
        args.out_weights = None;
    }
    // SAFETY: as above.
    unsafe { r.moe.combine(&args, &*r.stream) }.map_err(|x| format!("{what}: {x}"))?;
    r.sync(what)?;
    r.check_combine_with(c, &inputs, &b, what, |d| d % 2 == 0, weighted)?;
    Ok(3)
}

/// A dispatch captured once and replayed twice with new routings and data written into the same
/// buffers (the token counts are the graph's); after each replay the combine, captured too.
/// The combine's inputs are made on the host from what arrived, so it is a graph of its own.
fn captured(r: &Rank) -> R<usize> {
    let n = r.n;
    let c = &cases()[0];
    let b = r.bufs(c, n * MAX_TOKENS)?;
    let s = b.slices();
    let first: Vec<Input> = (0..n).map(|q| input(c, 200, q, n)).collect();
    let tokens = first[r.rank].tokens;
    if r.stream.begin_capture().is_err() {
        eprintln!(
            "rank {}: graph capture unavailable on this backend: skipped",
            r.rank
        );
        return Ok(0);
    }
    // SAFETY: the buffers outlive the graphs' replays below.
    let d = unsafe {
        r.moe
            .dispatch(&r.dispatch_args(c, tokens, &b, &s), &*r.stream)
    };
    let dispatch = r.stream.end_capture().map_err(e)?;
    d.map_err(|x| format!("captured dispatch: {x}"))?;
    let mut replays = 0;
    for replay in 0..2 {
        // Same token counts (the graph's), new routing and data.
        let inputs: Vec<Input> = (0..n).map(|q| input(c, 201 + replay, q, n)).collect();
        let what = format!("captured dispatch, replay {replay}");
        r.load(&inputs[r.rank], &b)?;
        dispatch.launch(&*r.stream).map_err(e)?;
        r.sync(&what)?;
        let rows = r.check_dispatch(c, &inputs, &b, &what)?;
        r.combine_inputs(c, &b, &rows)?;
        r.stream.begin_capture().map_err(e)?;
        // SAFETY: as above.
        let cr = unsafe {
            r.moe
                .combine(&r.combine_args(c, tokens, rows.len(), &s), &*r.stream)
        };
        let combine = r.stream.end_capture().map_err(e)?;
        cr.map_err(|x| format!("captured combine: {x}"))?;
        combine.launch(&*r.stream).map_err(e)?;
        r.sync("captured combine")?;
        r.check_combine(
            c,
            &inputs,
            &b,
            &format!("captured combine, replay {replay}"),
        )?;
        replays += 2;
    }
    Ok(replays)
}

/// Rank 0 routes one entry to an expert that does not exist; rank 1 gives outputs of one row.
/// Both get errors from their handles; nobody hangs; a normal case afterwards is served.
fn bad_inputs(r: &Rank) -> R<usize> {
    let (n, me) = (r.n, r.rank);
    let c = &cases()[0];
    let mut inputs: Vec<Input> = (0..n).map(|q| input(c, 300, q, n)).collect();
    let experts = c.local * n;
    inputs[0].idx[0] = experts as i64; // one past the last expert
    let capacity = if me == 1 { 1 } else { n * MAX_TOKENS };
    let b = r.bufs(c, capacity)?;
    let s = b.slices();
    r.load(&inputs[me], &b)?;
    // SAFETY: the buffers live until the synchronisation below.
    unsafe {
        r.moe
            .dispatch(&r.dispatch_args(c, inputs[me].tokens, &b, &s), &*r.stream)
    }
    .map_err(e)?;
    r.sync("dispatch with bad input")?;
    let got = r.moe.read_handle(&b.handle.full(), &*r.stream);
    match (me, &got) {
        (0, Err(x))
            if x.to_string()
                .contains(&format!("expert index outside -1..{experts}")) => {}
        (1, Err(x)) if x.to_string().contains("received") => {}
        (0 | 1, other) => return Err(format!("rank {me}: bad input gave {other:?}")),
        (_, Err(x)) => return Err(format!("rank {me}: {x}")),
        (_, Ok(_)) => {}
    }
    // The dropped entry is not received anywhere: with it set to -1, the others see exactly
    // what the reference says.
    let mut fixed = inputs;
    fixed[0].idx[0] = -1;
    if me >= 2 {
        r.check_dispatch(c, &fixed, &b, "dispatch beside bad input")?;
    }
    // Everyone still combines (rank 1 with what fit), and nobody waits forever.
    let rows = if me == 1 {
        1
    } else {
        expected_rows(c, &fixed, me).len()
    };
    let cx = vec![0u8; rows * c.hidden * c.dtype.size()];
    r.write(&b.cx, &cx)?;
    r.write(&b.cw, &vec![0u8; rows * c.topk * 4])?;
    // SAFETY: as above.
    unsafe {
        r.moe
            .combine(&r.combine_args(c, fixed[me].tokens, rows, &s), &*r.stream)
    }
    .map_err(e)?;
    r.sync("combine after bad input")?;
    // Rank 1 sent back only the row that fit: every other source of a row past it is told
    // that its combine summed without some rows.
    let to1 = expected_rows(c, &fixed, 1);
    let short = to1[1..].iter().any(|&(s, _)| s == me);
    let after = r.moe.read_handle(&b.handle.full(), &*r.stream);
    match (&after, me, short) {
        (Err(x), _, true) if x.to_string().contains("combine found rows missing") => {}
        (_, _, true) => return Err(format!("rank {me}: a short combine gave {after:?}")),
        (Err(x), 1, _) if x.to_string().contains("received") => {}
        (Err(x), 0, false) if x.to_string().contains("expert index outside") => {}
        (Ok(_), 2.., false) => {}
        _ => return Err(format!("rank {me}: after the combine: {after:?}")),
    }
    // Rows of another size on rank 1: each rank that got rows from a rank of another width
    // drops them and says so (rank 1 from everyone, the others from rank 1).
    let inputs: Vec<Input> = (0..n).map(|q| input(c, 301, q, n)).collect();
    let b = r.bufs(c, n * MAX_TOKENS)?;
    let s = b.slices();
    r.load(&inputs[me], &b)?;
    let narrow = row_bytes(c) - 16;
    let d = Dispatch {
        row_bytes: if me == 1 { narrow } else { row_bytes(c) },
        ..r.dispatch_args(c, inputs[me].tokens, &b, &s)
    };
    // SAFETY: the buffers live until the synchronisation below.
    unsafe { r.moe.dispatch(&d, &*r.stream) }.map_err(e)?;
    r.sync("dispatch of two widths")?;
    let got = r.moe.read_handle(&b.handle.full(), &*r.stream);
    let from_other_width = expected_rows(c, &inputs, me)
        .iter()
        .any(|&(src, _)| (src == 1) != (me == 1));
    match (&got, from_other_width) {
        (Err(x), true) if x.to_string().contains("another size") => {}
        (Ok(_), false) => {}
        _ => return Err(format!("rank {me}: two widths gave {got:?}")),
    }
    // Refused before anything is enqueued: more tokens than set up for, a foreign dtype.
    let too_many = Dispatch {
        tokens: MAX_TOKENS + 1,
        ..r.dispatch_args(c, 0, &b, &s)
    };
    // SAFETY: refused before any launch.
    let x = unsafe { r.moe.dispatch(&too_many, &*r.stream) }.unwrap_err();
    if !x.to_string().contains("49 tokens in one call") {
        return Err(format!("too many tokens: {x}"));
    }
    let int_combine = Combine {
        dtype: DataType::I32,
        ..r.combine_args(c, 1, 1, &s)
    };
    // SAFETY: refused before any launch.
    let x = unsafe { r.moe.combine(&int_combine, &*r.stream) }.unwrap_err();
    if !x.to_string().contains("f32, f16 and bf16") {
        return Err(format!("int combine: {x}"));
    }
    Ok(3)
}

/// `n` ranks of `kind`; with `hosts` (comma-separated), rank `r` on the simulated host
/// `hosts[r]` (the peers of other hosts over Ethernet).
fn run(kind: BackendKind, n: usize, hosts: Option<&str>) -> Result<(), Failed> {
    let mut env = vec![
        (BACKEND_VAR.to_string(), kind.to_string()),
        ("MSCCLPP_HOST_WAIT_SECONDS".to_string(), "60".to_string()),
    ];
    if let Some(h) = hosts {
        env.push((HOSTS_VAR.to_string(), h.to_string()));
        env.push(("MSCCLPP_HIER_TRANSPORT".to_string(), "Ethernet".to_string()));
    }
    let outs = multiproc::spawn_with_root("moe", n, UID_VAR, &env, Duration::from_secs(300))?;
    let on = hosts.map(|h| format!(" on hosts {h}")).unwrap_or_default();
    eprintln!(
        "    {n} ranks{on}: {} calls checked per rank",
        outs[0].reports()["calls"]
    );
    Ok(())
}

fn main() {
    multiproc::run_child(|role| match role {
        "moe" => role_moe(),
        other => Err(format!("unknown role {other}")),
    });
    let args = libtest_mimic::Arguments::from_args();
    let mut trials: Vec<Trial> = [2, 3, 4, 8]
        .into_iter()
        .map(|n| {
            Trial::test(format!("moe::host::{n}_ranks"), move || {
                run(BackendKind::Host, n, None)
            })
        })
        .collect();
    // Ranks on simulated hosts (`MSCCLPP_HOSTID`): peers of another host through the relay
    // (Ethernet here), those of the same host mapped; hosts by blocks and interleaved.
    // 16 ranks as two hosts of 8, as DeepEP's internode layout has them (more than the
    // collectives' 8: the exchange serves up to `MOE_MAX_RANKS`).
    for (n, hosts) in [
        (2, "0,1"),
        (4, "0,0,1,1"),
        (3, "0,1,0"),
        (16, "0,0,0,0,0,0,0,0,1,1,1,1,1,1,1,1"),
    ] {
        trials.push(Trial::test(
            format!(
                "moe::host::{n}_ranks_on_hosts_{}",
                if n > 8 {
                    "8x2".to_string()
                } else {
                    hosts.replace(',', "")
                }
            ),
            move || run(BackendKind::Host, n, Some(hosts)),
        ));
    }
    for kind in [BackendKind::Cuda, BackendKind::Rocm] {
        for (name, hosts) in [("2_ranks", None), ("2_ranks_on_hosts_01", Some("0,1"))] {
            trials.push(Trial::ignorable_test(
                format!("moe::{kind}::{name}"),
                move || {
                    if let Err(reason) = mscclpp::registry::probe(kind) {
                        return Ok(Completion::ignored_with(
                            mscclpp_conformance::harness::ignore_reason(reason),
                        ));
                    }
                    run(kind, 2, hosts).map(|()| Completion::Completed)
                },
            ));
        }
    }
    libtest_mimic::run(&args, trials).exit();
}
