//! Element types and reduction operators of collectives, with the codes kernels receive.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Element types collectives move and reduce. The discriminant is the code in kernel arguments.
///
/// The 8-bit floats are OCP FP8 as NVIDIA names them: `F8E4M3` is E4M3FN (bias 7, no
/// infinities, NaN = S.1111.111, largest 448) and `F8E5M2` is IEEE-like (bias 15, infinities,
/// largest finite 57344). Conversions from `f32` round to nearest even and saturate to the
/// largest finite value (NVIDIA's `__NV_SATFINITE`, what NCCL's fp8 reductions use); NaN stays
/// NaN.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit IEEE float.
    F32 = 0,
    /// 16-bit IEEE float.
    F16 = 1,
    /// bfloat16.
    BF16 = 2,
    /// 32-bit signed integer.
    I32 = 3,
    /// 32-bit unsigned integer.
    U32 = 4,
    /// 64-bit IEEE float.
    F64 = 5,
    /// 64-bit signed integer.
    I64 = 6,
    /// 64-bit unsigned integer.
    U64 = 7,
    /// 8-bit signed integer.
    I8 = 8,
    /// 8-bit unsigned integer.
    U8 = 9,
    /// 8-bit float E4M3 (E4M3FN).
    F8E4M3 = 10,
    /// 8-bit float E5M2.
    F8E5M2 = 11,
}

/// Converts an FP8 value (`bits`, low 8 bits) to `f32` (exact): E4M3 when `e4m3`, else E5M2.
pub fn fp8_to_f32(bits: u8, e4m3: bool) -> f32 {
    let (man_bits, bias) = if e4m3 { (3u32, 7i32) } else { (2, 15) };
    let sign = if bits & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = u32::from(bits & 0x7f) >> man_bits;
    let man = u32::from(bits) & ((1 << man_bits) - 1);
    if e4m3 && bits & 0x7f == 0x7f {
        return f32::NAN;
    }
    if !e4m3 && exp == 31 {
        return if man == 0 {
            sign * f32::INFINITY
        } else {
            f32::NAN
        };
    }
    let v = if exp == 0 {
        man as f32 * 2f32.powi(1 - bias - man_bits as i32)
    } else {
        (1.0 + man as f32 / (1 << man_bits) as f32) * 2f32.powi(exp as i32 - bias)
    };
    sign * v
}

/// Converts `x` to FP8 (E4M3 when `e4m3`, else E5M2): round to nearest even, saturating to the
/// largest finite value (infinities too); NaN gives NaN. The same bits as the kernels'
/// `floatToFp8` (kernels/include/mscclpp/numeric.cuh).
pub fn f32_to_fp8(x: f32, e4m3: bool) -> u8 {
    let (man, bias, max): (u32, i32, u32) = if e4m3 { (3, 7, 0x7e) } else { (2, 15, 0x7b) };
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = bits & 0x7fff_ffff;
    if a > 0x7f80_0000 {
        return sign | 0x7f;
    }
    if a < 0x0080_0000 {
        return sign; // zero or an f32 subnormal: far below the smallest FP8 subnormal
    }
    let e = (a >> 23) as i32 - 127;
    if e >= 1 - bias {
        let m = a & 0x7f_ffff;
        let drop = 23 - man;
        let q = m >> drop;
        let r = m & ((1 << drop) - 1);
        let half = 1 << (drop - 1);
        let mut v = (((e + bias) as u32) << man) | q;
        if r > half || (r == half && q & 1 == 1) {
            v += 1;
        }
        return sign | v.min(max) as u8;
    }
    // An FP8 subnormal: round(significand >> s).
    let m = (a & 0x7f_ffff) | 0x80_0000;
    let s = (24 - bias - man as i32 - e) as u32;
    if s >= 25 {
        return sign;
    }
    let q = m >> s;
    let r = m & ((1 << s) - 1);
    let half = 1 << (s - 1);
    let v = if r > half || (r == half && q & 1 == 1) {
        q + 1
    } else {
        q
    };
    sign | v as u8
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 12] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::U32,
        DataType::F64,
        DataType::I64,
        DataType::U64,
        DataType::I8,
        DataType::U8,
        DataType::F8E4M3,
        DataType::F8E5M2,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::BF16 => 2,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
            DataType::I8 | DataType::U8 | DataType::F8E4M3 | DataType::F8E5M2 => 1,
        }
    }

    /// Whether the type is a floating-point one.
    pub fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32
                | DataType::F16
                | DataType::BF16
                | DataType::F64
                | DataType::F8E4M3
                | DataType::F8E5M2
        )
    }

    /// The name used on command lines and in tables (nccl-tests' names).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::F64 => "double",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::F8E4M3 => "f8e4m3",
            DataType::F8E5M2 => "f8e5m2",
        }
    }

    /// The type of a kernel-argument code.
    pub fn from_code(code: u32) -> Result<Self> {
        DataType::ALL
            .into_iter()
            .find(|d| *d as u32 == code)
            .ok_or_else(|| Error::invalid(format!("unknown data type code {code}")))
    }

    /// The element at the start of `b` (little-endian, at least [`DataType::size`] bytes) as an
    /// `f64` (exact for every type but 64-bit integers beyond 2^53).
    pub fn decode_f64(self, b: &[u8]) -> f64 {
        let w = |n: usize| {
            let mut x = [0u8; 8];
            x[..n].copy_from_slice(&b[..n]);
            u64::from_le_bytes(x)
        };
        match self {
            DataType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::BF16 => f64::from(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::F64 => f64::from_bits(w(8)),
            DataType::I64 => w(8) as i64 as f64,
            DataType::U64 => w(8) as f64,
            DataType::I8 => f64::from(b[0] as i8),
            DataType::U8 => f64::from(b[0]),
            DataType::F8E4M3 => f64::from(fp8_to_f32(b[0], true)),
            DataType::F8E5M2 => f64::from(fp8_to_f32(b[0], false)),
        }
    }

    /// Appends `v` as one little-endian element (rounded to nearest for the float types — FP8
    /// through `f32`, saturating — truncated and saturated for the integer types).
    pub fn encode_f64(self, v: f64, out: &mut Vec<u8>) {
        match self {
            DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DataType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DataType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            DataType::F64 => out.extend_from_slice(&v.to_le_bytes()),
            DataType::I64 => out.extend_from_slice(&(v as i64).to_le_bytes()),
            DataType::U64 => out.extend_from_slice(&(v as u64).to_le_bytes()),
            DataType::I8 => out.push(v as i8 as u8),
            DataType::U8 => out.push(v as u8),
            DataType::F8E4M3 => out.push(f32_to_fp8(v as f32, true)),
            DataType::F8E5M2 => out.push(f32_to_fp8(v as f32, false)),
        }
    }

    /// `a op b` for one element of each (little-endian, [`DataType::size`] bytes), written to
    /// `out`: integers wrap, 16- and 8-bit floats are computed in `f32` and rounded back (as
    /// NCCL does), `Avg` is the sum here (see [`DataType::divide_elem`]).
    pub fn combine_elem(self, a: &[u8], b: &[u8], op: ReduceOp, out: &mut [u8]) {
        fn fop<T: PartialOrd + std::ops::Add<Output = T> + std::ops::Mul<Output = T> + Copy>(
            x: T,
            y: T,
            op: ReduceOp,
            min: fn(T, T) -> T,
            max: fn(T, T) -> T,
        ) -> T {
            match op {
                ReduceOp::Sum | ReduceOp::Avg => x + y,
                ReduceOp::Prod => x * y,
                ReduceOp::Min => min(x, y),
                ReduceOp::Max => max(x, y),
            }
        }
        macro_rules! int {
            ($t:ty) => {{
                const N: usize = size_of::<$t>();
                let x = <$t>::from_le_bytes(a[..N].try_into().unwrap_or([0; N]));
                let y = <$t>::from_le_bytes(b[..N].try_into().unwrap_or([0; N]));
                let r = match op {
                    ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
                    ReduceOp::Prod => x.wrapping_mul(y),
                    ReduceOp::Min => x.min(y),
                    ReduceOp::Max => x.max(y),
                };
                out[..N].copy_from_slice(&r.to_le_bytes());
            }};
        }
        let f32op = |x: f32, y: f32| fop(x, y, op, f32::min, f32::max);
        match self {
            DataType::F32 => {
                let r = f32op(
                    f32::from_le_bytes([a[0], a[1], a[2], a[3]]),
                    f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
                );
                out[..4].copy_from_slice(&r.to_le_bytes());
            }
            DataType::F64 => {
                let x = f64::from_le_bytes(a[..8].try_into().unwrap_or([0; 8]));
                let y = f64::from_le_bytes(b[..8].try_into().unwrap_or([0; 8]));
                out[..8].copy_from_slice(&fop(x, y, op, f64::min, f64::max).to_le_bytes());
            }
            DataType::F16 => {
                let r = f32op(
                    half::f16::from_le_bytes([a[0], a[1]]).to_f32(),
                    half::f16::from_le_bytes([b[0], b[1]]).to_f32(),
                );
                out[..2].copy_from_slice(&half::f16::from_f32(r).to_le_bytes());
            }
            DataType::BF16 => {
                let r = f32op(
                    half::bf16::from_le_bytes([a[0], a[1]]).to_f32(),
                    half::bf16::from_le_bytes([b[0], b[1]]).to_f32(),
                );
                out[..2].copy_from_slice(&half::bf16::from_f32(r).to_le_bytes());
            }
            DataType::F8E4M3 | DataType::F8E5M2 => {
                let e4 = self == DataType::F8E4M3;
                let r = f32op(fp8_to_f32(a[0], e4), fp8_to_f32(b[0], e4));
                out[0] = f32_to_fp8(r, e4);
            }
            DataType::I32 => int!(i32),
            DataType::U32 => int!(u32),
            DataType::I64 => int!(i64),
            DataType::U64 => int!(u64),
            DataType::I8 => int!(i8),
            DataType::U8 => int!(u8),
        }
    }

    /// `a / n` for one element (the end of `Avg`): floats divide in their accumulation
    /// precision (`f64` for F64, else `f32`) and round back; integers truncate.
    pub fn divide_elem(self, a: &[u8], n: u32, out: &mut [u8]) {
        macro_rules! int {
            ($t:ty) => {{
                const N: usize = size_of::<$t>();
                let x = <$t>::from_le_bytes(a[..N].try_into().unwrap_or([0; N]));
                out[..N].copy_from_slice(&(x / (n as $t)).to_le_bytes());
            }};
        }
        let nf = n as f32;
        match self {
            DataType::F32 => {
                let x = f32::from_le_bytes([a[0], a[1], a[2], a[3]]);
                out[..4].copy_from_slice(&(x / nf).to_le_bytes());
            }
            DataType::F64 => {
                let x = f64::from_le_bytes(a[..8].try_into().unwrap_or([0; 8]));
                out[..8].copy_from_slice(&(x / f64::from(n)).to_le_bytes());
            }
            DataType::F16 => {
                let x = half::f16::from_le_bytes([a[0], a[1]]).to_f32() / nf;
                out[..2].copy_from_slice(&half::f16::from_f32(x).to_le_bytes());
            }
            DataType::BF16 => {
                let x = half::bf16::from_le_bytes([a[0], a[1]]).to_f32() / nf;
                out[..2].copy_from_slice(&half::bf16::from_f32(x).to_le_bytes());
            }
            DataType::F8E4M3 | DataType::F8E5M2 => {
                let e4 = self == DataType::F8E4M3;
                out[0] = f32_to_fp8(fp8_to_f32(a[0], e4) / nf, e4);
            }
            DataType::I32 => int!(i32),
            DataType::U32 => int!(u32),
            DataType::I64 => int!(i64),
            DataType::U64 => int!(u64),
            DataType::I8 => int!(i8),
            DataType::U8 => int!(u8),
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DataType {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "float" | "f32" | "float32" => Ok(DataType::F32),
            "half" | "f16" | "float16" => Ok(DataType::F16),
            "bfloat16" | "bf16" => Ok(DataType::BF16),
            "int32" | "i32" | "int" => Ok(DataType::I32),
            "uint32" | "u32" => Ok(DataType::U32),
            "double" | "f64" | "float64" => Ok(DataType::F64),
            "int64" | "i64" => Ok(DataType::I64),
            "uint64" | "u64" => Ok(DataType::U64),
            "int8" | "i8" | "char" => Ok(DataType::I8),
            "uint8" | "u8" => Ok(DataType::U8),
            "f8e4m3" | "fp8e4m3" | "float8e4m3" | "e4m3" => Ok(DataType::F8E4M3),
            "f8e5m2" | "fp8e5m2" | "float8e5m2" | "e5m2" => Ok(DataType::F8E5M2),
            _ => Err(Error::invalid(format!(
                "unknown data type {s:?}: expected float, half, bfloat16, int32, uint32, double, int64, uint64, int8, uint8, f8e4m3 or f8e5m2"
            ))),
        }
    }
}

/// Reduction operators. The discriminant is the code in kernel arguments.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum = 0,
    /// Product.
    Prod = 1,
    /// Minimum.
    Min = 2,
    /// Maximum.
    Max = 3,
    /// Sum divided by the number of ranks (integer division for integer types).
    Avg = 4,
}

impl ReduceOp {
    /// Every operator.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// The name used on command lines and in tables (nccl-tests' names).
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// The operator of a kernel-argument code.
    pub fn from_code(code: u32) -> Result<Self> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| *o as u32 == code)
            .ok_or_else(|| Error::invalid(format!("unknown reduction operator code {code}")))
    }
}

impl fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReduceOp {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ReduceOp::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| {
                Error::invalid(format!(
                    "unknown reduction operator {s:?}: expected sum, prod, min, max or avg"
                ))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_round_trip_through_f64() {
        for dtype in DataType::ALL {
            let big = if dtype.size() == 1 { 96.0 } else { 2048.0 };
            for v in [0.0, 1.0, 3.0, 100.0f64.min(big), big] {
                let mut b = Vec::new();
                dtype.encode_f64(v, &mut b);
                assert_eq!(b.len(), dtype.size(), "{dtype}");
                assert_eq!(dtype.decode_f64(&b), v, "{dtype} {v}");
            }
        }
        let mut b = Vec::new();
        DataType::BF16.encode_f64(1.0 + 1.0 / 512.0, &mut b);
        assert_eq!(
            DataType::BF16.decode_f64(&b),
            1.0,
            "bf16 keeps 8 significant bits"
        );
        b.clear();
        DataType::I32.encode_f64(-7.0, &mut b);
        assert_eq!(b, (-7i32).to_le_bytes());
    }

    #[test]
    fn fp8_round_trips_every_value_and_rounds_to_nearest_even() {
        for e4 in [true, false] {
            for bits in 0..=255u8 {
                let f = fp8_to_f32(bits, e4);
                if f.is_nan() {
                    assert!(fp8_to_f32(f32_to_fp8(f, e4), e4).is_nan());
                } else if f.is_infinite() {
                    // Saturates to the largest finite value.
                    assert_eq!(f32_to_fp8(f, e4) & 0x7f, 0x7b, "{bits:#x}");
                } else {
                    assert_eq!(f32_to_fp8(f, e4), bits, "{bits:#x} = {f} (e4m3 {e4})");
                }
            }
        }
        // E4M3: 1.0625 lies halfway between 1 and 1.125: ties to even (1.0).
        assert_eq!(f32_to_fp8(1.0625, true), f32_to_fp8(1.0, true));
        assert_eq!(fp8_to_f32(f32_to_fp8(1.07, true), true), 1.125);
        assert_eq!(fp8_to_f32(f32_to_fp8(1000.0, true), true), 448.0);
        assert_eq!(fp8_to_f32(f32_to_fp8(-1e9, false), false), -57344.0);
        // The smallest subnormals: 2^-9 (E4M3) and 2^-16 (E5M2); half of them ties to zero.
        assert_eq!(fp8_to_f32(1, true), 2f32.powi(-9));
        assert_eq!(fp8_to_f32(1, false), 2f32.powi(-16));
        assert_eq!(f32_to_fp8(2f32.powi(-10), true), 0);
        assert_eq!(f32_to_fp8(1.5 * 2f32.powi(-10), true), 1);
    }

    #[test]
    fn element_ops_wrap_and_round() {
        let mut out = [0u8; 8];
        DataType::I8.combine_elem(&[100], &[100], ReduceOp::Sum, &mut out);
        assert_eq!(out[0] as i8, -56);
        DataType::U64.combine_elem(
            &u64::MAX.to_le_bytes(),
            &2u64.to_le_bytes(),
            ReduceOp::Sum,
            &mut out,
        );
        assert_eq!(u64::from_le_bytes(out), 1);
        DataType::I64.divide_elem(&(-7i64).to_le_bytes(), 2, &mut out);
        assert_eq!(i64::from_le_bytes(out), -3);
        let (a, b) = (f32_to_fp8(1.0, true), f32_to_fp8(0.125, true));
        DataType::F8E4M3.combine_elem(&[a], &[b], ReduceOp::Sum, &mut out);
        assert_eq!(fp8_to_f32(out[0], true), 1.125);
    }
}
