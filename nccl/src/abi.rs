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
/// `NCCL_CONFIG_UNDEF_INT` (`INT_MIN`): a config field left to the library.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;
/// `NCCL_SHRINK_DEFAULT`: shrink a quiescent parent.
pub const NCCL_SHRINK_DEFAULT: c_int = 0;
/// `NCCL_SHRINK_ABORT`: end the parent's outstanding operations first, then shrink.
pub const NCCL_SHRINK_ABORT: c_int = 1;

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

/// `ncclConfig_t` as NCCL 2.28's `nccl.h` lays it out (`ncclConfig_v22800`). NCCL only ever
/// appends fields, so a caller built against an older header passes a prefix of this (its
/// `size` says how much) and one built against a newer header a longer struct whose tail this
/// library does not read.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfig {
    /// `sizeof(ncclConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_CONFIG_MAGIC`].
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// 0: non-blocking calls (`ncclInProgress`); 1: blocking (NCCL 2.14).
    pub blocking: c_int,
    /// CUDA thread-block cluster size (2.17).
    pub cga_cluster_size: c_int,
    /// Fewest CTAs a kernel uses (2.17).
    pub min_ctas: c_int,
    /// Most CTAs a kernel uses (2.17).
    pub max_ctas: c_int,
    /// Network plugin name (2.17).
    pub net_name: *const std::ffi::c_char,
    /// Share the parent's resources in `ncclCommSplit` (2.18).
    pub split_share: c_int,
    /// Traffic class of network operations.
    pub traffic_class: c_int,
    /// Name of the communicator, for logs.
    pub comm_name: *const std::ffi::c_char,
    /// Use CollNet.
    pub collnet_enable: c_int,
    /// `NCCL_CTA_POLICY_*`.
    pub cta_policy: c_int,
    /// Share the parent's resources in `ncclCommShrink`.
    pub shrink_share: c_int,
    /// CTAs of NVLS kernels.
    pub nvls_ctas: c_int,
    /// Channels per network peer.
    pub n_channels_per_net_peer: c_int,
    /// NVLink-centric scheduling.
    pub nvlink_centric_sched: c_int,
}

impl NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER` of this library's version.
    pub const INITIALIZER: NcclConfig = NcclConfig {
        size: std::mem::size_of::<NcclConfig>(),
        magic: NCCL_CONFIG_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        blocking: NCCL_CONFIG_UNDEF_INT,
        cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
        min_ctas: NCCL_CONFIG_UNDEF_INT,
        max_ctas: NCCL_CONFIG_UNDEF_INT,
        net_name: std::ptr::null(),
        split_share: NCCL_CONFIG_UNDEF_INT,
        traffic_class: NCCL_CONFIG_UNDEF_INT,
        comm_name: std::ptr::null(),
        collnet_enable: NCCL_CONFIG_UNDEF_INT,
        cta_policy: NCCL_CONFIG_UNDEF_INT,
        shrink_share: NCCL_CONFIG_UNDEF_INT,
        nvls_ctas: NCCL_CONFIG_UNDEF_INT,
        n_channels_per_net_peer: NCCL_CONFIG_UNDEF_INT,
        nvlink_centric_sched: NCCL_CONFIG_UNDEF_INT,
    };
}

/// `ncclComm_t`.
pub type NcclComm = *mut c_void;
/// `cudaStream_t` (a `CUstream`; NULL is the legacy default stream).
pub type CudaStream = *mut c_void;
/// `ncclWindow_t`.
pub type NcclWindow = *mut c_void;

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// The offsets of NCCL 2.28's `ncclConfig_t` on LP64 (what `offsetof` gives for its header).
    #[test]
    fn config_layout_is_nccl_2_28s() {
        assert_eq!(std::mem::size_of::<NcclConfig>(), 80);
        assert_eq!(offset_of!(NcclConfig, blocking), 16);
        assert_eq!(offset_of!(NcclConfig, net_name), 32);
        assert_eq!(offset_of!(NcclConfig, split_share), 40);
        assert_eq!(offset_of!(NcclConfig, comm_name), 48);
        assert_eq!(offset_of!(NcclConfig, shrink_share), 64);
        assert_eq!(offset_of!(NcclConfig, nvlink_centric_sched), 76);
    }
}
