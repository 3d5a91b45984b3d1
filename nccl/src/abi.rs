//! NCCL 2.x ABI: the types and constants of NCCL's public `nccl.h`, as PyTorch 2.11 (NCCL
//! 2.28) sees them. Enums are C `int`s; handles are opaque pointers.

use std::ffi::{c_int, c_void};

/// The NCCL version this library reports through `ncclGetVersion`: 2.28.3, the `nccl.h` PyTorch
/// 2.11 is built against (`NCCL_VERSION_CODE` = major * 10000 + minor * 100 + patch). PyTorch
/// switches features on by version (`ncclCommSplit`, `ncclCommInitRankConfig`, non-blocking
/// init, `ncclAlltoAll` from 2.28); reporting what it was built for keeps it on the paths every
/// one of our 38 exports answers.
pub const NCCL_VERSION_CODE: c_int = 22803;
/// `NCCL_UNIQUE_ID_BYTES`.
pub const NCCL_UNIQUE_ID_BYTES: usize = 128;
/// `NCCL_CONFIG_INITIALIZER`'s magic.
pub const NCCL_CONFIG_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_SPLIT_NOCOLOR`.
pub const NCCL_SPLIT_NOCOLOR: c_int = -1;

/// `ncclResult_t`.
pub type NcclResult = c_int;
/// `ncclSuccess`.
pub const NCCL_SUCCESS: NcclResult = 0;
/// `ncclUnhandledCudaError`.
pub const NCCL_UNHANDLED_CUDA_ERROR: NcclResult = 1;
/// `ncclSystemError`.
pub const NCCL_SYSTEM_ERROR: NcclResult = 2;
/// `ncclInternalError`.
pub const NCCL_INTERNAL_ERROR: NcclResult = 3;
/// `ncclInvalidArgument`.
pub const NCCL_INVALID_ARGUMENT: NcclResult = 4;
/// `ncclInvalidUsage`.
pub const NCCL_INVALID_USAGE: NcclResult = 5;
/// `ncclRemoteError`.
pub const NCCL_REMOTE_ERROR: NcclResult = 6;
/// `ncclInProgress`.
pub const NCCL_IN_PROGRESS: NcclResult = 7;

/// `ncclDataType_t` codes.
pub mod dtype {
    use std::ffi::c_int;
    /// `ncclInt8` (= `ncclChar`).
    pub const INT8: c_int = 0;
    /// `ncclUint8`.
    pub const UINT8: c_int = 1;
    /// `ncclInt32` (= `ncclInt`).
    pub const INT32: c_int = 2;
    /// `ncclUint32`.
    pub const UINT32: c_int = 3;
    /// `ncclInt64`.
    pub const INT64: c_int = 4;
    /// `ncclUint64`.
    pub const UINT64: c_int = 5;
    /// `ncclFloat16` (= `ncclHalf`).
    pub const FLOAT16: c_int = 6;
    /// `ncclFloat32` (= `ncclFloat`).
    pub const FLOAT32: c_int = 7;
    /// `ncclFloat64` (= `ncclDouble`).
    pub const FLOAT64: c_int = 8;
    /// `ncclBfloat16`.
    pub const BFLOAT16: c_int = 9;
    /// `ncclFloat8e4m3` (NCCL 2.24+).
    pub const FLOAT8E4M3: c_int = 10;
    /// `ncclFloat8e5m2` (NCCL 2.24+).
    pub const FLOAT8E5M2: c_int = 11;
}

/// `ncclRedOp_t` codes; operators made by `ncclRedOpCreatePreMulSum` are `>= ncclNumOps`.
pub mod redop {
    use std::ffi::c_int;
    /// `ncclSum`.
    pub const SUM: c_int = 0;
    /// `ncclProd`.
    pub const PROD: c_int = 1;
    /// `ncclMax`.
    pub const MAX: c_int = 2;
    /// `ncclMin`.
    pub const MIN: c_int = 3;
    /// `ncclAvg`.
    pub const AVG: c_int = 4;
    /// `ncclNumOps`: the first code of user-created operators.
    pub const NUM_OPS: c_int = 5;
}

/// `ncclUniqueId`: 128 opaque bytes, passed by value (the real NCCL's binding's type, so that
/// ids pass between the two unchanged).
pub use mscclpp_nccl_real::UniqueId as NcclUniqueId;

/// The header every `ncclConfig_t` starts with (`size_t size; unsigned magic; unsigned
/// version;`). This library reads only these fields and ignores the rest (blocking, CTA
/// counts, names...), so any later layout of the struct is accepted.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfigHeader {
    /// `sizeof(ncclConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_CONFIG_MAGIC`].
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
}

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `cudaStream_t` (a `CUstream`; NULL is the legacy default stream).
pub type CudaStream = *mut c_void;
/// `ncclWindow_t`.
pub type NcclWindow = *mut c_void;
