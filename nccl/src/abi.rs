//! NCCL 2.x ABI: the types and constants of NCCL's public `nccl.h` (2.28's, as PyTorch 2.11
//! sees them, and the versioned structs of 2.32's). Enums are C `int`s; handles are opaque pointers.

use std::ffi::{c_int, c_void};

/// The NCCL version this library reports through `ncclGetVersion` and the `NCCL_DEBUG` banner:
/// 2.32.6, the newest release whose every host call (`nccl.h` and `nccl_device/host.h` of PyPI's
/// `nvidia-nccl-cu13==2.32.6`) this library exports — served, or refused naming the call where
/// it cannot serve it (`NCCL_VERSION_CODE` = major * 10000 + minor * 100 + patch from 2.9 on).
/// Clients gate features on this number (DeepEP asks for >= 2.30.4 at run time, PyTorch turns
/// on `ncclCommSplit`, non-blocking init and `ncclAlltoAll` by it): reporting an older version
/// than the API served would switch off paths that work.
pub const NCCL_VERSION_CODE: c_int = 23206;
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

/// `ncclConfig_t` as NCCL 2.32's `nccl.h` lays it out (`ncclConfig_v23100`: 2.28's fields, then
/// the nine 2.29–2.31 appended). NCCL only ever appends fields, so a caller built against an
/// older header passes a prefix of this (its `size` says how much) and one built against a newer
/// header a longer struct whose tail this library does not read. The fields after
/// `nvlink_centric_sched` are read only so that the struct is whole; none of them changes what
/// this library does (they tune NCCL's graph, RMA, CFT and NVLS machinery, which it has not).
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
    /// How CUDA graphs use the communicator (2.29).
    pub graph_usage_mode: c_int,
    /// Contexts of one-sided operations (2.29).
    pub num_rma_ctx: c_int,
    /// Most point-to-point peers.
    pub max_p2p_peers: c_int,
    /// Stream ordering of captured graphs.
    pub graph_stream_ordering: c_int,
    /// Implicit launch order.
    pub launch_order_implicit: c_int,
    /// Signals of one-sided operations.
    pub num_rma_sig: c_int,
    /// Set up one-sided operations at init.
    pub rma_eager_init: c_int,
    /// `ncclHostCftMode_t` (2.31).
    pub host_cft_mode: c_int,
    /// `ncclNvlsHostMode_t` (2.31).
    pub nvls_host_mode: c_int,
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
        graph_usage_mode: NCCL_CONFIG_UNDEF_INT,
        num_rma_ctx: NCCL_CONFIG_UNDEF_INT,
        max_p2p_peers: NCCL_CONFIG_UNDEF_INT,
        graph_stream_ordering: NCCL_CONFIG_UNDEF_INT,
        launch_order_implicit: NCCL_CONFIG_UNDEF_INT,
        num_rma_sig: NCCL_CONFIG_UNDEF_INT,
        rma_eager_init: NCCL_CONFIG_UNDEF_INT,
        host_cft_mode: NCCL_CONFIG_UNDEF_INT,
        nvls_host_mode: NCCL_CONFIG_UNDEF_INT,
    };
}

/// `NCCL_API_MAGIC`: the magic of NCCL's versioned structs (`ncclCollConfig_t`,
/// `ncclEncryptionConfig_t`; the same value as [`NCCL_CONFIG_MAGIC`]).
pub const NCCL_API_MAGIC: u32 = 0xcafe_beef;
/// `NCCL_CTA_POLICY_EFFICIENCY`.
pub const NCCL_CTA_POLICY_EFFICIENCY: c_int = 0x01;
/// `NCCL_CTA_POLICY_ZERO`: no CTAs (copy-engine collectives).
pub const NCCL_CTA_POLICY_ZERO: c_int = 0x02;
/// `sizeof(ncclCollConfig_v23100)`: NCCL 2.31's struct (up to `userProfilerTag`), the smallest
/// one NCCL accepts.
pub const COLL_CONFIG_MIN_SIZE: usize =
    std::mem::offset_of!(NcclCollConfig, launch_completion_event);

/// `ncclConfigExt_t` (NCCL 2.31): one vendor option of a per-call config's `ext` list.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclConfigExt {
    /// The next option, or NULL.
    pub next: *mut NcclConfigExt,
    /// `key.vendorId`: the vendor's own non-zero id (below 2^24).
    pub vendor_id: c_int,
    /// `key.optionId`: the option within the vendor's.
    pub option_id: c_int,
    /// `val`: a union of `int`, `const char*` and `void*` (pointer-sized).
    pub val: *mut c_void,
}

/// `ncclCollConfig_t` as NCCL 2.32's `nccl.h` lays it out (`ncclCollConfig_v23200`): the
/// per-call configuration of the `nccl*Config` collectives. Append-only like `ncclConfig_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclCollConfig {
    /// `sizeof(ncclCollConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// Vendor options, or NULL.
    pub ext: *mut NcclConfigExt,
    /// Fewest CTAs.
    pub min_ctas: c_int,
    /// Most CTAs.
    pub max_ctas: c_int,
    /// CTAs of NVLS kernels.
    pub nvls_ctas: c_int,
    /// Thread-block cluster size.
    pub cga_cluster_size: c_int,
    /// Which algorithm(s) the call may use; NULL or "" = automatic.
    pub alg_selection: *const std::ffi::c_char,
    /// 1 (default): a selection that cannot be honoured is an error; 0: automatic instead.
    pub force_alg_selection: c_int,
    /// `NCCL_CTA_POLICY_*` bits; unset: the communicator's.
    pub cta_policy: c_int,
    /// An opaque tag for profiler plugins.
    pub user_profiler_tag: u64,
    /// A `cudaEvent_t` recorded when the collective's kernel has been launched (2.32).
    pub launch_completion_event: *mut c_void,
}

impl NcclCollConfig {
    /// `NCCL_COLLCONFIG_INITIALIZER` of this library's version.
    pub const INITIALIZER: NcclCollConfig = NcclCollConfig {
        size: std::mem::size_of::<NcclCollConfig>(),
        magic: NCCL_API_MAGIC,
        version: NCCL_VERSION_CODE as u32,
        ext: std::ptr::null_mut(),
        min_ctas: NCCL_CONFIG_UNDEF_INT,
        max_ctas: NCCL_CONFIG_UNDEF_INT,
        nvls_ctas: NCCL_CONFIG_UNDEF_INT,
        cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
        alg_selection: std::ptr::null(),
        force_alg_selection: 1,
        cta_policy: NCCL_CONFIG_UNDEF_INT,
        user_profiler_tag: 0,
        launch_completion_event: std::ptr::null_mut(),
    };
}

/// `NCCL_ENCRYPTION_MODE_NONE`: plaintext sockets.
pub const NCCL_ENCRYPTION_MODE_NONE: c_int = 0;
/// `NCCL_ENCRYPTION_MODE_PSK`: TLS with a pre-shared key.
pub const NCCL_ENCRYPTION_MODE_PSK: c_int = 1;

/// `ncclEncryptionConfig_t` as NCCL 2.32's `nccl.h` lays it out (`ncclEncryptionConfig_v23200`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcclEncryptionConfig {
    /// `sizeof(ncclEncryptionConfig_t)` as the caller compiled it.
    pub size: usize,
    /// [`NCCL_API_MAGIC`].
    pub magic: u32,
    /// The caller's `NCCL_VERSION_CODE`.
    pub version: u32,
    /// `ncclEncryptionMode_t`.
    pub mode: c_int,
    /// The pre-shared key (a C string), for `NCCL_ENCRYPTION_MODE_PSK`.
    pub psk: *const std::ffi::c_char,
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

    /// The offsets of NCCL 2.32's `ncclConfig_t` (`ncclConfig_v23100`) on LP64 (what `offsetof`
    /// gives for its header); 2.28's struct ends after `nvlinkCentricSched` (80 bytes).
    #[test]
    fn config_layout_is_nccl_2_32s() {
        assert_eq!(std::mem::size_of::<NcclConfig>(), 120);
        assert_eq!(offset_of!(NcclConfig, graph_usage_mode), 80);
        assert_eq!(offset_of!(NcclConfig, host_cft_mode), 108);
        assert_eq!(offset_of!(NcclConfig, nvls_host_mode), 112);
        assert_eq!(offset_of!(NcclConfig, blocking), 16);
        assert_eq!(offset_of!(NcclConfig, net_name), 32);
        assert_eq!(offset_of!(NcclConfig, split_share), 40);
        assert_eq!(offset_of!(NcclConfig, comm_name), 48);
        assert_eq!(offset_of!(NcclConfig, shrink_share), 64);
        assert_eq!(offset_of!(NcclConfig, nvlink_centric_sched), 76);
    }

    /// `ncclCollConfig_t` (v23200), `ncclConfigExt_t` and `ncclEncryptionConfig_t` of NCCL
    /// 2.32's `nccl.h` on LP64.
    #[test]
    fn coll_config_layouts_are_nccl_2_32s() {
        assert_eq!(std::mem::size_of::<NcclCollConfig>(), 72);
        assert_eq!(offset_of!(NcclCollConfig, ext), 16);
        assert_eq!(offset_of!(NcclCollConfig, min_ctas), 24);
        assert_eq!(offset_of!(NcclCollConfig, cga_cluster_size), 36);
        assert_eq!(offset_of!(NcclCollConfig, alg_selection), 40);
        assert_eq!(offset_of!(NcclCollConfig, force_alg_selection), 48);
        assert_eq!(offset_of!(NcclCollConfig, cta_policy), 52);
        assert_eq!(offset_of!(NcclCollConfig, user_profiler_tag), 56);
        assert_eq!(offset_of!(NcclCollConfig, launch_completion_event), 64);
        assert_eq!(COLL_CONFIG_MIN_SIZE, 64);
        assert_eq!(std::mem::size_of::<NcclConfigExt>(), 24);
        assert_eq!(offset_of!(NcclConfigExt, vendor_id), 8);
        assert_eq!(offset_of!(NcclConfigExt, option_id), 12);
        assert_eq!(offset_of!(NcclConfigExt, val), 16);
        assert_eq!(std::mem::size_of::<NcclEncryptionConfig>(), 32);
        assert_eq!(offset_of!(NcclEncryptionConfig, mode), 16);
        assert_eq!(offset_of!(NcclEncryptionConfig, psk), 24);
    }
}
