//! Element types and reduction operators of collectives, with the codes kernels receive.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// Element types collectives move and reduce. The discriminant is the code in kernel arguments.
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
}

impl DataType {
    /// Every type.
    pub const ALL: [DataType; 5] = [
        DataType::F32,
        DataType::F16,
        DataType::BF16,
        DataType::I32,
        DataType::U32,
    ];

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F16 | DataType::BF16 => 2,
        }
    }

    /// The name used on command lines and in tables (nccl-tests' names).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F16 => "half",
            DataType::BF16 => "bfloat16",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
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
    /// `f64` (exact for every type).
    pub fn decode_f64(self, b: &[u8]) -> f64 {
        match self {
            DataType::F32 => f64::from(f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::F16 => f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::BF16 => f64::from(half::bf16::from_le_bytes([b[0], b[1]]).to_f32()),
            DataType::I32 => f64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])),
            DataType::U32 => f64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        }
    }

    /// Appends `v` as one little-endian element (rounded to nearest for the float types,
    /// truncated and saturated for the integer types).
    pub fn encode_f64(self, v: f64, out: &mut Vec<u8>) {
        match self {
            DataType::F32 => out.extend_from_slice(&(v as f32).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&half::f16::from_f64(v).to_le_bytes()),
            DataType::BF16 => out.extend_from_slice(&half::bf16::from_f64(v).to_le_bytes()),
            DataType::I32 => out.extend_from_slice(&(v as i32).to_le_bytes()),
            DataType::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
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
            _ => Err(Error::invalid(format!(
                "unknown data type {s:?}: expected float, half, bfloat16, int32 or uint32"
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
            for v in [0.0, 1.0, 3.0, 100.0, 2048.0] {
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
}
