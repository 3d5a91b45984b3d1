//! The C API's type codes onto the HAL's: `ncclDataType_t` and `ncclRedOp_t`.

use std::ffi::c_int;

use mscclpp::hal::{DataType, ReduceOp};

use crate::error::{Failure, Res};

/// Element size and HAL type of an `ncclDataType_t` (every NCCL 2.28 type has one).
pub fn dtype_info(code: c_int) -> Res<(usize, Option<DataType>)> {
    use crate::abi::dtype as d;
    let t = match code {
        d::INT8 => DataType::I8,
        d::UINT8 => DataType::U8,
        d::INT32 => DataType::I32,
        d::UINT32 => DataType::U32,
        d::INT64 => DataType::I64,
        d::UINT64 => DataType::U64,
        d::FLOAT16 => DataType::F16,
        d::FLOAT32 => DataType::F32,
        d::FLOAT64 => DataType::F64,
        d::BFLOAT16 => DataType::BF16,
        d::FLOAT8E4M3 => DataType::F8E4M3,
        d::FLOAT8E5M2 => DataType::F8E5M2,
        other => {
            return Err(Failure::argument(format!(
                "unknown ncclDataType_t {other} (this library knows 0..=11: int8 ... float8e5m2)"
            )));
        }
    };
    Ok((t.size(), Some(t)))
}

/// The HAL operator of an `ncclRedOp_t` (`None`: a user-created operator, served by fallback).
pub fn op_info(code: c_int) -> Res<Option<ReduceOp>> {
    use crate::abi::redop as r;
    Ok(match code {
        r::SUM => Some(ReduceOp::Sum),
        r::PROD => Some(ReduceOp::Prod),
        r::MAX => Some(ReduceOp::Max),
        r::MIN => Some(ReduceOp::Min),
        r::AVG => Some(ReduceOp::Avg),
        c if c >= r::NUM_OPS => None,
        other => return Err(Failure::argument(format!("invalid ncclRedOp_t {other}"))),
    })
}
