//! CPU reference of the collectives, on raw little-endian bytes, and the comparison with
//! tolerances per type (floats are reduced in a different order by the kernels).

use mscclpp::collectives::CollectiveKind;
use mscclpp::hal::{DataType, ReduceOp};

use crate::rng::Rng;

/// Random elements that keep every reduction of up to 8 ranks finite and exact enough: floats in
/// [0.5, 1.5) (products stay small), signed integers in [-50, 50), unsigned ones in [0, 100)
/// (8-bit sums and products wrap, as the kernels' do).
pub fn random_input(dtype: DataType, elems: usize, rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::with_capacity(elems * dtype.size());
    for _ in 0..elems {
        let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        let x = 0.5 + u;
        let signed = rng.below(100) as i64 - 50;
        let unsigned = rng.below(100);
        match dtype {
            DataType::I32 | DataType::I64 | DataType::I8 => {
                dtype.encode_f64(signed as f64, &mut out)
            }
            DataType::U32 | DataType::U64 | DataType::U8 => {
                dtype.encode_f64(unsigned as f64, &mut out)
            }
            _ => dtype.encode_f64(x, &mut out),
        }
    }
    out
}

fn reduce_elem(dtype: DataType, op: ReduceOp, elems: &[&[u8]]) -> Vec<u8> {
    let n = elems.len();
    match dtype {
        // 64- and 8-bit types: in rank order as the kernels combine them (integers wrap; f64 in
        // f64; FP8 in f32, rounded back after every operation).
        DataType::F64
        | DataType::I64
        | DataType::U64
        | DataType::I8
        | DataType::U8
        | DataType::F8E4M3
        | DataType::F8E5M2 => {
            let s = dtype.size();
            let mut acc = elems[0][..s].to_vec();
            let mut next = vec![0u8; s];
            for e in &elems[1..] {
                dtype.combine_elem(&acc, e, op, &mut next);
                acc.copy_from_slice(&next);
            }
            if op == ReduceOp::Avg {
                dtype.divide_elem(&acc, n as u32, &mut next);
                acc.copy_from_slice(&next);
            }
            acc
        }
        DataType::I32 | DataType::U32 => {
            let vals: Vec<u64> = elems
                .iter()
                .map(|b| u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect();
            let signed = dtype == DataType::I32;
            let as_i = |v: u64| v as u32 as i32;
            let r: u32 = match op {
                ReduceOp::Sum | ReduceOp::Avg => {
                    vals.iter().fold(0u32, |a, v| a.wrapping_add(*v as u32))
                }
                ReduceOp::Prod => vals.iter().fold(1u32, |a, v| a.wrapping_mul(*v as u32)),
                ReduceOp::Min if signed => vals.iter().map(|v| as_i(*v)).min().unwrap_or(0) as u32,
                ReduceOp::Max if signed => vals.iter().map(|v| as_i(*v)).max().unwrap_or(0) as u32,
                ReduceOp::Min => vals.iter().map(|v| *v as u32).min().unwrap_or(0),
                ReduceOp::Max => vals.iter().map(|v| *v as u32).max().unwrap_or(0),
            };
            let r = if op == ReduceOp::Avg {
                if signed {
                    (r as i32 / n as i32) as u32
                } else {
                    r / n as u32
                }
            } else {
                r
            };
            r.to_le_bytes().to_vec()
        }
        _ => {
            let vals: Vec<f64> = elems.iter().map(|b| dtype.decode_f64(b)).collect();
            let r = match op {
                ReduceOp::Sum => vals.iter().sum(),
                ReduceOp::Avg => vals.iter().sum::<f64>() / n as f64,
                ReduceOp::Prod => vals.iter().product(),
                ReduceOp::Min => vals.iter().copied().fold(f64::INFINITY, f64::min),
                ReduceOp::Max => vals.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            };
            let mut out = Vec::with_capacity(dtype.size());
            dtype.encode_f64(r, &mut out);
            out
        }
    }
}

/// The expected output of `rank` given every rank's input (bytes).
pub fn expected(
    kind: CollectiveKind,
    dtype: DataType,
    op: ReduceOp,
    inputs: &[Vec<u8>],
    rank: usize,
    count: usize,
    root: usize,
) -> Vec<u8> {
    let s = dtype.size();
    let block = count * s;
    let n = inputs.len();
    let reduce_block = |b: usize| -> Vec<u8> {
        let mut out = Vec::with_capacity(block);
        for e in 0..count {
            let elems: Vec<&[u8]> = inputs
                .iter()
                .map(|i| &i[b * block + e * s..b * block + (e + 1) * s])
                .collect();
            out.extend(reduce_elem(dtype, op, &elems));
        }
        out
    };
    match kind {
        CollectiveKind::AllReduce => reduce_block(0),
        CollectiveKind::ReduceScatter => reduce_block(rank),
        CollectiveKind::AllGather => inputs.iter().flat_map(|i| i[..block].to_vec()).collect(),
        CollectiveKind::Broadcast => inputs[root][..block].to_vec(),
        CollectiveKind::AllToAll => (0..n)
            .flat_map(|p| inputs[p][rank * block..(rank + 1) * block].to_vec())
            .collect(),
    }
}

/// Elements of `got` that differ from `want` beyond the type's tolerance.
pub fn count_wrong(dtype: DataType, op: ReduceOp, got: &[u8], want: &[u8]) -> usize {
    let s = dtype.size();
    // Products and averages of 8 values in 16-bit floats round several times.
    let tol = match dtype {
        DataType::F32 => 1e-5,
        DataType::F16 => 4e-3,
        DataType::BF16 => 3e-2,
        DataType::F64 => 1e-12,
        // Half a unit in the last place: the reference rounds as the kernels do.
        DataType::F8E4M3 => 7e-2,
        DataType::F8E5M2 => 13e-2,
        _ => 0.0,
    } * if op == ReduceOp::Prod { 4.0 } else { 1.0 };
    got.chunks(s)
        .zip(want.chunks(s))
        .filter(|(g, w)| {
            if tol == 0.0 {
                g != w
            } else {
                let (a, b) = (dtype.decode_f64(g), dtype.decode_f64(w));
                // NaN (incomparable) counts as wrong.
                let limit = tol * b.abs().max(1e-3);
                (a - b)
                    .abs()
                    .partial_cmp(&limit)
                    .is_none_or(|o| o == std::cmp::Ordering::Greater)
            }
        })
        .count()
}
