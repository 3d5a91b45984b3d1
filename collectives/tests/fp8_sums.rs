//! Issue 41: the library's FP8 sums against a reference that rounds as the hardware does,
//! written independently of `mscclpp_hal`'s conversions: values decoded from the bit layout,
//! exact sums in `f64` (two FP8 values span at most 33 bits), rounded to the nearest FP8 value,
//! ties to the even pattern, saturating at the largest finite value (NVIDIA's
//! `__NV_SATFINITE`, what NCCL's FP8 reductions and our kernels use) — after every addition,
//! in rank order, as every host kernel (`reduce_ranks`, the LL receive loop) and the GPU kernels
//! add. (An `f32` or `f16` intermediate, as the GPUs take, gives the same bits: both hold at least
//! 2p+2 bits of an FP8 significand of p bits, so rounding twice equals rounding once.)
//!
//! 1. Every pair of finite values of both formats: `DataType::combine_elem` (the element
//!    function of the host kernels) equals the reference, bit for bit.
//! 2. All-reduce and reduce-scatter on the host backend, ranks as threads, every algorithm the
//!    host serves for them, 2 to 8 ranks, random finite inputs over the whole range (so sums
//!    round, cancel and saturate): every output byte equals the reference.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use mscclpp_collectives::{AlgorithmId, CollectiveCall, CollectiveKind, Collectives};
use mscclpp_comm::Communicator;
use mscclpp_comm::bootstrap::{Bootstrap, BootstrapConfig, BootstrapRoot};
use mscclpp_hal::{Backend, DataType, MemoryKind, ReduceOp};

/// The format: (mantissa bits, exponent bias, whether the all-ones exponent is Inf/NaN).
fn layout(dtype: DataType) -> (u32, i32, bool) {
    match dtype {
        DataType::F8E4M3 => (3, 7, false),
        DataType::F8E5M2 => (2, 15, true),
        other => panic!("{other} is not FP8"),
    }
}

/// The value of `bits`, `None` for NaN and infinities (the inputs leave them out).
fn decode(dtype: DataType, bits: u8) -> Option<f64> {
    let (m, bias, ieee) = layout(dtype);
    let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = u32::from(bits & 0x7f) >> m;
    let man = u32::from(bits) & ((1 << m) - 1);
    let top = (1 << (7 - m)) - 1;
    if ieee && exp == top {
        return None;
    }
    if !ieee && exp == top && man == (1 << m) - 1 {
        return None; // E4M3FN: S.1111.111 is NaN, the rest of the top binade is finite
    }
    let v = if exp == 0 {
        f64::from(man) * 2f64.powi(1 - bias - m as i32)
    } else {
        (1.0 + f64::from(man) / f64::from(1u32 << m)) * 2f64.powi(exp as i32 - bias)
    };
    Some(sign * v)
}

/// The non-negative finite values, ascending, with their patterns.
fn positives(dtype: DataType) -> Vec<(f64, u8)> {
    let mut v: Vec<(f64, u8)> = (0u8..0x80)
        .filter_map(|b| decode(dtype, b).map(|x| (x, b)))
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// `x` rounded to the nearest FP8 value, ties to the even pattern, saturating; the sign of a
/// zero kept (as IEEE addition gives it).
fn round(table: &[(f64, u8)], x: f64) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let (max, max_bits) = table[table.len() - 1];
    if a >= max {
        return sign | max_bits;
    }
    // The last value <= a and the next one.
    let k = table.partition_point(|&(v, _)| v <= a) - 1;
    let (lo, lo_bits) = table[k];
    let (hi, hi_bits) = table[k + 1];
    let bits = if a - lo < hi - a {
        lo_bits
    } else if a - lo > hi - a {
        hi_bits
    } else if lo_bits & 1 == 0 {
        lo_bits
    } else {
        hi_bits
    };
    sign | bits
}

/// Rank-order sum of one element, rounding after each addition.
fn reference_sum(dtype: DataType, table: &[(f64, u8)], parts: &[u8]) -> u8 {
    let mut acc = parts[0];
    for &p in &parts[1..] {
        let (a, b) = (decode(dtype, acc), decode(dtype, p));
        let (Some(a), Some(b)) = (a, b) else {
            panic!("an input or a partial sum is not finite: {acc:#x} + {p:#x}");
        };
        acc = round(table, a + b);
    }
    acc
}

const FP8: [DataType; 2] = [DataType::F8E4M3, DataType::F8E5M2];

#[test]
fn every_pair_of_fp8_values_sums_as_the_hardware_rounds() {
    for dtype in FP8 {
        let table = positives(dtype);
        let finite: Vec<u8> = (0..=255u8)
            .filter(|&b| decode(dtype, b).is_some())
            .collect();
        let mut checked = 0usize;
        let mut rounded = 0usize;
        for &a in &finite {
            for &b in &finite {
                let mut got = [0u8];
                dtype.combine_elem(&[a], &[b], ReduceOp::Sum, &mut got);
                let want = reference_sum(dtype, &table, &[a, b]);
                assert_eq!(
                    got[0],
                    want,
                    "{dtype}: {a:#04x} ({:?}) + {b:#04x} ({:?})",
                    decode(dtype, a),
                    decode(dtype, b)
                );
                checked += 1;
                let exact = decode(dtype, a).unwrap_or(0.0) + decode(dtype, b).unwrap_or(0.0);
                rounded += usize::from(decode(dtype, want) != Some(exact));
            }
        }
        // The pairs include sums the format cannot hold (else the test proves nothing).
        assert!(
            rounded > checked / 4,
            "{dtype}: {rounded} of {checked} rounded"
        );
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Rank `r`'s random finite FP8 inputs: every pattern but NaN and the infinities.
fn inputs(dtype: DataType, seed: u64, r: usize, elems: usize) -> Vec<u8> {
    (0..elems)
        .map(|i| {
            let mut k = 0u64;
            loop {
                let b = splitmix(seed ^ ((r as u64) << 40) ^ ((i as u64) << 8) ^ k) as u8;
                if decode(dtype, b).is_some() {
                    return b;
                }
                k += 1;
            }
        })
        .collect()
}

/// The algorithms the host backend serves for all-reduce and reduce-scatter (`None`: the
/// automatic choice). `Read` is all-reduce only.
fn algorithms(kind: CollectiveKind) -> Vec<Option<AlgorithmId>> {
    let mut v = vec![
        None,
        Some(AlgorithmId::Ll),
        Some(AlgorithmId::LlShort),
        Some(AlgorithmId::Direct),
        Some(AlgorithmId::Ce),
    ];
    if kind == CollectiveKind::AllReduce {
        v.push(Some(AlgorithmId::Read));
    }
    v
}

/// One rank: every type, collective and algorithm; returns the mismatches it found, named.
fn rank(
    uid: &mscclpp_comm::bootstrap::UniqueId,
    r: usize,
    n: usize,
) -> Result<Vec<String>, String> {
    let e = |x: mscclpp_hal::Error| x.to_string();
    let boot = Arc::new(Bootstrap::new(uid, r, n, BootstrapConfig::default()).map_err(e)?);
    let device = mscclpp_host::HostBackend::new().open_device(r).map_err(e)?;
    let comm = Arc::new(Communicator::new(boot, device.clone()));
    let coll = Collectives::<mscclpp_host::Host>::new(comm).map_err(e)?;
    let stream = device.create_stream().map_err(e)?;
    // The collectives run on the host backend's own stream type.
    let own = <mscclpp_host::Host as mscclpp_hal::Api>::stream_of(&*stream).map_err(e)?;
    // Odd, several LL rounds of the default slot for the larger one.
    let count = 1001;
    let mut bad = Vec::new();
    for dtype in FP8 {
        let table = positives(dtype);
        for kind in [CollectiveKind::AllReduce, CollectiveKind::ReduceScatter] {
            let (in_e, out_e) = kind.buffer_elements(count as u64, n as u64);
            let (in_e, out_e) = (in_e as usize, out_e as usize);
            for (a, algo) in algorithms(kind).into_iter().enumerate() {
                let seed = 0xf8 ^ ((a as u64) << 16) ^ ((kind as u64) << 24);
                let all: Vec<Vec<u8>> = (0..n).map(|p| inputs(dtype, seed, p, in_e)).collect();
                let input = device.alloc(in_e, MemoryKind::Device).map_err(e)?;
                let output = device.alloc(out_e, MemoryKind::Device).map_err(e)?;
                stream.write_from_host(&input.full(), &all[r]).map_err(e)?;
                stream.fill(&output.full(), 0xA5).map_err(e)?;
                let (ins, outs) = (input.full(), output.full());
                let call = CollectiveCall::new(kind, &ins, &outs, count, dtype)
                    .op(ReduceOp::Sum)
                    .algorithm(algo);
                coll.run(&call, own)
                    .map_err(|x| format!("{kind:?} {algo:?}: {x}"))?;
                let mut got = vec![0u8; out_e];
                stream.read_to_host(&mut got, &output.full()).map_err(e)?;
                stream.synchronize().map_err(e)?;
                let first = if kind == CollectiveKind::AllReduce {
                    0
                } else {
                    r * count
                };
                let mut wrong = 0usize;
                for (j, g) in got.iter().enumerate() {
                    let parts: Vec<u8> = all.iter().map(|x| x[first + j]).collect();
                    if *g != reference_sum(dtype, &table, &parts) {
                        wrong += 1;
                    }
                }
                if wrong > 0 {
                    bad.push(format!(
                        "{dtype} {kind:?} {algo:?} on {n} ranks, rank {r}: {wrong} of {out_e} differ"
                    ));
                }
            }
        }
    }
    Ok(bad)
}

#[test]
fn fp8_all_reduce_and_reduce_scatter_match_the_reference_bit_for_bit() {
    for n in [2usize, 3, 4, 8] {
        let cfg = BootstrapConfig::default();
        let (_root, uid) =
            BootstrapRoot::start(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), n, &cfg)
                .expect("bootstrap root");
        let results: Vec<Result<Vec<String>, String>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..n)
                .map(|r| {
                    s.spawn({
                        let uid = &uid;
                        move || rank(uid, r, n)
                    })
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap_or_else(|_| Err("a rank panicked".into())))
                .collect()
        });
        let mut bad = Vec::new();
        for (r, res) in results.into_iter().enumerate() {
            match res {
                Ok(b) => bad.extend(b),
                Err(x) => bad.push(format!("rank {r} of {n}: {x}")),
            }
        }
        assert!(bad.is_empty(), "{}", bad.join("\n"));
    }
}
