//! `mscclpp-perf moe`: expert-parallel dispatch and combine (`mscclpp::collectives::moe`) of
//! random top-k routings, per token count: the time of each call and the bytes a rank received
//! per second, the slowest rank's time. Rows are bf16 hidden states; every rank's routing and
//! rows are made from seeds, so each rank checks what it received against what the others sent.
//! Where the ranks share a host, the expert-major ("low-latency", DeepEP's decode layout) form
//! of the same routing too: its dispatch (entries laid out per local expert) and its combine
//! (each expert's output weighted and summed), each entry counted against the routing.

use std::sync::Arc;

use mscclpp::collectives::DataType;
use mscclpp::collectives::moe::{
    Combine, Dispatch, ExpertMajor, ExpertMajorIn, Halves, LayoutOut, MoeConfig,
};
use mscclpp::comm::Communicator;
use mscclpp::hal::{Error, MemoryKind, Result};

use crate::args::Args;
use crate::nccl::{Nccl, Part};
use crate::p2p::pattern;

/// The shape measured.
#[derive(Debug, Clone)]
pub struct Shape {
    pub hidden: usize,
    pub experts: usize,
    pub topk: usize,
    pub tokens: Vec<usize>,
}

/// Distinct random experts for each token of `rank` (a seeded xorshift: every rank can make
/// every rank's routing).
fn routing(rank: usize, tokens: usize, s: &Shape) -> Vec<i64> {
    let mut x = (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (tokens as u64) << 20;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut idx = Vec::with_capacity(tokens * s.topk);
    for _ in 0..tokens {
        let mut picked: Vec<i64> = Vec::with_capacity(s.topk);
        while picked.len() < s.topk {
            let e = (next() % s.experts as u64) as i64;
            if !picked.contains(&e) {
                picked.push(e);
            }
        }
        idx.extend(picked);
    }
    idx
}

fn bytes_of<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// NCCL for `--baseline nccl`, where every rank could open it; else why not (the real NCCL
/// refuses ranks that share a GPU), said by rank 0, and the benchmark goes on without it.
fn open_baseline(comm: &Communicator, stream: &dyn mscclpp::hal::Stream) -> Result<Option<Nccl>> {
    let opened = Nccl::for_communicator(comm, stream);
    let why = opened.as_ref().err().map(|e| e.to_string());
    let all = comm
        .bootstrap()
        .all_gather(why.as_deref().unwrap_or("").as_bytes())?;
    let failed: Vec<String> = all
        .iter()
        .enumerate()
        .filter(|(_, m)| !m.is_empty())
        .map(|(r, m)| format!("rank {r}: {}", String::from_utf8_lossy(m)))
        .collect();
    if failed.is_empty() {
        return opened.map(Some);
    }
    if comm.rank() == 0 {
        println!("# NCCL baseline: not run ({})", failed.join("; "));
    }
    Ok(None)
}

/// Parts of the given sizes laid end to end.
fn packed(sizes: impl Iterator<Item = usize>) -> Vec<Part> {
    let mut at = 0u64;
    sizes
        .map(|bytes| {
            let p = Part { at, bytes };
            at += bytes as u64;
            p
        })
        .collect()
}

/// The rows each rank sends each rank (`[from][to]`): its tokens with an expert there.
fn rows_between(routings: &[Vec<i64>], s: &Shape, n: usize) -> Vec<Vec<usize>> {
    let local = (s.experts / n) as i64;
    routings
        .iter()
        .map(|r| {
            (0..n)
                .map(|d| {
                    r.chunks(s.topk)
                        .filter(|ks| ks.iter().any(|&e| e >= 0 && e / local == d as i64))
                        .count()
                })
                .collect()
        })
        .collect()
}

/// Runs the benchmark on this rank; rank 0 prints. Returns the wrong rows over all ranks.
pub fn run(args: &Args, comm: Arc<Communicator>, s: &Shape) -> Result<u64> {
    let (rank, n) = (comm.rank(), comm.nranks());
    let boot = comm.bootstrap().clone();
    let device = comm.device().clone();
    let stream = device.create_stream()?;
    let (ev0, ev1, ev2) = (
        device.create_event()?,
        device.create_event()?,
        device.create_event()?,
    );
    let max_t = *s
        .tokens
        .iter()
        .max()
        .ok_or_else(|| Error::invalid("no token counts"))?;
    let row = s.hidden * 2;
    let moe = mscclpp::typed::expert_exchange(
        &comm,
        MoeConfig {
            num_experts: s.experts,
            topk: s.topk,
            max_tokens: max_t,
            max_row_bytes: row,
            max_scale_bytes: 0,
        },
    )?;
    let cap = n * max_t;
    let alloc = |b: usize| device.alloc(b.max(16), MemoryKind::Device);
    let (x, idx, w) = (
        alloc(max_t * row)?,
        alloc(max_t * s.topk * 8)?,
        alloc(max_t * s.topk * 4)?,
    );
    let (out_x, out_idx, out_w, out_src) = (
        alloc(cap * row)?,
        alloc(cap * s.topk * 8)?,
        alloc(cap * s.topk * 4)?,
        alloc(cap * 4)?,
    );
    let handle = alloc(moe.handle_bytes())?;
    let (comb, comb_w) = (alloc(max_t * row)?, alloc(max_t * s.topk * 4)?);
    // The expert-major form's outputs: every local expert holds `n max_t` slots (DeepEP's
    // `[local, ranks x max tokens, hidden]`).
    let local = s.experts / n;
    let em = match moe.expert_major() {
        Ok(()) => Some((
            alloc(local * cap * row)?,
            alloc(local * cap * 4)?,
            alloc(local * n * 8)?,
            alloc(local * 4)?,
            alloc(moe.slots_bytes())?,
            alloc(moe.handle_bytes())?,
            alloc(max_t * row)?,
        )),
        Err(_) => None,
    };
    let empty = alloc(16)?;
    let nccl = match args.baseline {
        Some(_) => open_baseline(&comm, &*stream)?,
        None => None,
    };
    // NCCL's all-to-all of the same rows: what it receives (by source), then sends back.
    let (nccl_there, nccl_back) = match nccl {
        Some(_) => (Some(alloc(cap * row)?), Some(alloc(cap * row)?)),
        None => (None, None),
    };
    let (per_rank, per_expert, in_rank, status) = (
        alloc(4 * n)?,
        alloc(4 * s.experts)?,
        alloc(max_t * n)?,
        alloc(4)?,
    );
    if rank == 0 {
        println!(
            "# mscclpp-perf moe: {n} ranks on the {} backend ({}), hidden {} (bf16), top-{} of {} experts, {} iterations after {} warm-up",
            device.info().backend,
            device.info().name,
            s.hidden,
            s.topk,
            s.experts,
            args.iters,
            args.warmup
        );
        println!(
            "# rows: token rows each rank received (mean); us: microseconds per call, the slowest rank's; GB/s: received bytes (rows x {row}) per second; wrong: rows that differ from what was sent",
        );
        if em.is_some() {
            println!(
                "# ll_dispatch_us, ll_combine_us: the expert-major (low-latency) form, the slowest rank's; its wrong: entries per local expert that differ from the routing's"
            );
        }
        if let Some(nc) = &nccl {
            println!(
                "# nccl_us: NCCL {}'s all-to-all of the same rows (a group of ncclSend/ncclRecv per peer, as PyTorch's all_to_all_single with split sizes), there and back, the slowest rank's; GB/s as ours",
                nc.version
            );
        }
        let extra = if nccl.is_some() {
            format!(
                " {:>11} {:>9} {:>11} {:>9}",
                "nccl_us", "GB/s", "back_us", "GB/s"
            )
        } else {
            String::new()
        };
        let extra = if em.is_some() {
            format!("{extra} {:>14} {:>13}", "ll_dispatch_us", "ll_combine_us")
        } else {
            extra
        };
        println!(
            "# {:>7} {:>9} {:>11} {:>9} {:>11} {:>9} {:>7}{extra}",
            "tokens", "rows", "dispatch_us", "GB/s", "combine_us", "GB/s", "wrong"
        );
    }
    let mut wrong_total = 0u64;
    for &t in &s.tokens {
        let routings: Vec<Vec<i64>> = (0..n).map(|r| routing(r, t, s)).collect();
        let mine = pattern(rank, t, t * row);
        stream.write_from_host(&x.slice(..t * row)?, &mine)?;
        stream.write_from_host(
            &idx.slice(..t * s.topk * 8)?,
            &bytes_of(&routings[rank], i64::to_le_bytes),
        )?;
        let weights: Vec<f32> = (0..t * s.topk).map(|i| (i % 7) as f32 / 8.0).collect();
        stream.write_from_host(
            &w.slice(..t * s.topk * 4)?,
            &bytes_of(&weights, f32::to_le_bytes),
        )?;
        let (sx, sidx, sw) = (x.full(), idx.full(), w.full());
        let (so, soi, sow, sos, sh) = (
            out_x.full(),
            out_idx.full(),
            out_w.full(),
            out_src.full(),
            handle.full(),
        );
        let (sc, scw) = (comb.full(), comb_w.full());
        let d = Dispatch {
            tokens: t,
            x: &sx,
            row_bytes: row,
            topk_idx: &sidx,
            topk_weights: Some(&sw),
            scales: None,
            capacity: cap,
            out_x: &so,
            out_idx: &soi,
            out_weights: Some(&sow),
            out_scales: None,
            out_src: &sos,
            handle: &sh,
        };
        let layout = LayoutOut {
            per_rank: &per_rank.full(),
            per_expert: &per_expert.full(),
            in_rank: &in_rank.full(),
            status: &status.full(),
        };
        // SAFETY: every buffer lives until the end of this function, after the last
        // synchronisation.
        unsafe { moe.layout(&sidx, t, &layout, &*stream)? };
        // SAFETY: as above.
        unsafe { moe.dispatch(&d, &*stream)? };
        stream.synchronize()?;
        let got = moe.read_handle(&sh, &*stream)?;
        let rows = got.rows();
        let c = Combine {
            tokens: t,
            x: &so,
            rows,
            dtype: DataType::BF16,
            hidden: s.hidden,
            topk_weights: Some(&sow),
            handle: &sh,
            out_x: &sc,
            out_weights: Some(&scw),
        };
        for _ in 0..args.warmup {
            // SAFETY: as above.
            unsafe {
                moe.dispatch(&d, &*stream)?;
                moe.combine(&c, &*stream)?;
            }
        }
        stream.synchronize()?;
        boot.barrier()?;
        stream.record(&*ev0)?;
        for _ in 0..args.iters {
            // SAFETY: as above.
            unsafe { moe.dispatch(&d, &*stream)? };
        }
        stream.record(&*ev1)?;
        for _ in 0..args.iters {
            // SAFETY: as above.
            unsafe { moe.combine(&c, &*stream)? };
        }
        stream.record(&*ev2)?;
        stream.synchronize()?;
        let (dms, cms) = (ev1.elapsed_ms_since(&*ev0)?, ev2.elapsed_ms_since(&*ev1)?);
        // What arrived: by source, in token order, the tokens with an expert here.
        let mut wrong = 0u64;
        if args.check != 0 {
            let local = (s.experts / n) as i64;
            let mut got_x = vec![0u8; rows * row];
            stream.read_to_host(&mut got_x, &out_x.slice(..rows * row)?)?;
            let mut i = 0usize;
            for (src, r) in routings.iter().enumerate() {
                let sent = pattern(src, t, t * row);
                for tok in 0..t {
                    let ks = &r[tok * s.topk..(tok + 1) * s.topk];
                    if !ks.iter().any(|&e| e / local == rank as i64) {
                        continue;
                    }
                    if i >= rows
                        || got_x[i * row..(i + 1) * row] != sent[tok * row..(tok + 1) * row]
                    {
                        wrong += 1;
                    }
                    i += 1;
                }
            }
            wrong += rows.abs_diff(i) as u64;
        }
        // NCCL's all-to-all of the same rows, there and back, on the same stream.
        let (mut tms, mut bms) = (0f64, 0f64);
        if let (Some(nc), Some(there), Some(back)) = (&nccl, &nccl_there, &nccl_back) {
            let between = rows_between(&routings, s, n);
            // Sends come from the input's first rows (the packing is not NCCL's); receives
            // land by source.
            let sends: Vec<Part> = (0..n)
                .map(|d| Part {
                    at: 0,
                    bytes: between[rank][d] * row,
                })
                .collect();
            let recvs = packed((0..n).map(|src| between[src][rank] * row));
            let h = stream.native_handle().unwrap_or(0);
            let (tp, bp) = (there.full().ptr().0, back.full().ptr().0);
            let back_sends = recvs.clone();
            let back_recvs = packed(sends.iter().map(|p| p.bytes));
            for _ in 0..args.warmup {
                nc.all_to_all_v(x.full().ptr().0, &sends, tp, &recvs, h)?;
                nc.all_to_all_v(tp, &back_sends, bp, &back_recvs, h)?;
            }
            stream.synchronize()?;
            boot.barrier()?;
            stream.record(&*ev0)?;
            for _ in 0..args.iters {
                nc.all_to_all_v(x.full().ptr().0, &sends, tp, &recvs, h)?;
            }
            stream.record(&*ev1)?;
            for _ in 0..args.iters {
                nc.all_to_all_v(tp, &back_sends, bp, &back_recvs, h)?;
            }
            stream.record(&*ev2)?;
            stream.synchronize()?;
            (tms, bms) = (ev1.elapsed_ms_since(&*ev0)?, ev2.elapsed_ms_since(&*ev1)?);
            // What NCCL delivered is checked as ours was: each source's rows, in order.
            if args.check != 0 {
                let total: usize = recvs.iter().map(|p| p.bytes).sum();
                let mut got = vec![0u8; total];
                stream.read_to_host(&mut got, &there.slice(..total)?)?;
                let mut off = 0usize;
                for (src, p) in recvs.iter().enumerate() {
                    let sent = pattern(src, t, t * row);
                    let rows = p.bytes / row;
                    wrong += (0..rows)
                        .filter(|&i| {
                            got[off + i * row..off + (i + 1) * row] != sent[i * row..(i + 1) * row]
                        })
                        .count() as u64;
                    off += p.bytes;
                }
            }
        }
        // The expert-major form of the same routing, on the same stream.
        let (mut lms, mut lcms) = (0f64, 0f64);
        if let Some((ex, esrc, erange, ecount, eslots, ehandle, eout)) = &em {
            let (sex, ssrc, sra, sco, ssl, seh, seo, se) = (
                ex.full(),
                esrc.full(),
                erange.full(),
                ecount.full(),
                eslots.full(),
                ehandle.full(),
                eout.full(),
                empty.slice(..0)?,
            );
            let d = Dispatch::expert_major(t, &sx, row, &sidx, None, &seh, &se);
            let out = ExpertMajor {
                capacity: cap,
                x: &sex,
                scales: None,
                src: &ssrc,
                range: &sra,
                count: &sco,
                stats: None,
                slots: &ssl,
                cast: None,
            };
            // The experts' outputs: the received rows themselves.
            let c = Combine {
                tokens: t,
                x: &sex,
                rows: local * cap,
                dtype: DataType::BF16,
                hidden: s.hidden,
                topk_weights: None,
                handle: &seh,
                out_x: &seo,
                out_weights: None,
            };
            let input = ExpertMajorIn {
                capacity: cap,
                slots: &ssl,
                topk_weights: &sw,
            };
            for _ in 0..args.warmup.max(1) {
                // SAFETY: as above.
                unsafe {
                    moe.dispatch_with(&d, Halves::Both, Some(&out), &*stream)?;
                    moe.combine_with(&c, Halves::Both, Some(&input), &*stream)?;
                }
            }
            stream.synchronize()?;
            boot.barrier()?;
            stream.record(&*ev0)?;
            for _ in 0..args.iters {
                // SAFETY: as above.
                unsafe { moe.dispatch_with(&d, Halves::Both, Some(&out), &*stream)? };
            }
            stream.record(&*ev1)?;
            for _ in 0..args.iters {
                // SAFETY: as above.
                unsafe { moe.combine_with(&c, Halves::Both, Some(&input), &*stream)? };
            }
            stream.record(&*ev2)?;
            stream.synchronize()?;
            (lms, lcms) = (ev1.elapsed_ms_since(&*ev0)?, ev2.elapsed_ms_since(&*ev1)?);
            if args.check != 0 {
                let mut got = vec![0u8; 4 * local];
                stream.read_to_host(&mut got, &ecount.slice(..4 * local)?)?;
                for e in 0..local {
                    let want = (rank * local + e) as i64;
                    let entries = routings.iter().flatten().filter(|&&x| x == want).count();
                    let have = i32::from_le_bytes([
                        got[4 * e],
                        got[4 * e + 1],
                        got[4 * e + 2],
                        got[4 * e + 3],
                    ]);
                    wrong += u64::from(have != entries as i32);
                }
            }
        }
        let mut msg = Vec::with_capacity(64);
        for v in [dms, cms, tms, bms, lms, lcms] {
            msg.extend_from_slice(&v.to_le_bytes());
        }
        msg.extend_from_slice(&(rows as u64).to_le_bytes());
        msg.extend_from_slice(&wrong.to_le_bytes());
        let all = boot.all_gather(&msg)?;
        let (mut dmax, mut cmax, mut rows_sum, mut wrong_sum) = (0f64, 0f64, 0u64, 0u64);
        let (mut tmax, mut bmax, mut lmax, mut lcmax) = (0f64, 0f64, 0f64, 0f64);
        for m in &all {
            let word = |i: usize| -> Result<[u8; 8]> {
                m.get(8 * i..8 * i + 8)
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| Error::malformed("moe result", format!("{} bytes", m.len())))
            };
            dmax = dmax.max(f64::from_le_bytes(word(0)?));
            cmax = cmax.max(f64::from_le_bytes(word(1)?));
            tmax = tmax.max(f64::from_le_bytes(word(2)?));
            bmax = bmax.max(f64::from_le_bytes(word(3)?));
            lmax = lmax.max(f64::from_le_bytes(word(4)?));
            lcmax = lcmax.max(f64::from_le_bytes(word(5)?));
            rows_sum += u64::from_le_bytes(word(6)?);
            wrong_sum += u64::from_le_bytes(word(7)?);
        }
        wrong_total += wrong_sum;
        let rows_mean = rows_sum as f64 / n as f64;
        let (dus, cus) = (
            dmax * 1e3 / args.iters as f64,
            cmax * 1e3 / args.iters as f64,
        );
        let gbps = |us: f64| rows_mean * row as f64 / us / 1e3;
        if rank == 0 {
            let wrong = if args.check != 0 {
                wrong_sum.to_string()
            } else {
                "-".into()
            };
            let extra = if nccl.is_some() {
                let (tus, bus) = (
                    tmax * 1e3 / args.iters as f64,
                    bmax * 1e3 / args.iters as f64,
                );
                format!(
                    " {tus:>11.1} {:>9.2} {bus:>11.1} {:>9.2}",
                    gbps(tus),
                    gbps(bus)
                )
            } else {
                String::new()
            };
            let extra = if em.is_some() {
                let us = |ms: f64| ms * 1e3 / args.iters as f64;
                format!("{extra} {:>14.1} {:>13.1}", us(lmax), us(lcmax))
            } else {
                extra
            };
            println!(
                "  {t:>7} {rows_mean:>9.1} {dus:>11.1} {:>9.2} {cus:>11.1} {:>9.2} {wrong:>7}{extra}",
                gbps(dus),
                gbps(cus)
            );
        }
    }
    if rank == 0 {
        println!("# wrong rows in all: {wrong_total}");
    }
    Ok(wrong_total)
}
