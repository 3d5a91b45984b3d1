//! The C layouts of NCCL's net plugin ABI, `ncclNet_v6` … `v12` (NCCL's
//! `src/include/plugin/net/net_vN.h`), as this binding reads them: each version's table of
//! function pointers and its properties struct. Only the fields up to the last one this binding
//! calls are declared; the plugin's static table is longer, never shorter.
//!
//! What changed between versions, and so what [`super::plugin`] has to tell apart:
//! - v6: the base (`connect`/`accept` without a device comm; `int` sizes).
//! - v7: `connect`/`accept` return a device-offload handle; properties gain the device type.
//! - v8: `regMr` takes a `size_t`; properties gain `regIsGlobal`.
//! - v9: `isend`/`irecv` take `size_t` sizes; properties gain virtual devices and size limits.
//! - v10: `init` takes a profiler callback, `connect` a config, `isend`/`irecv` profiler handles.
//! - v11: `init` returns a context that `listen`, `connect` and `finalize` take; properties gain
//!   `maxMultiRequestSize`. v12: the same table; virtual devices hold 8 NICs, properties gain the
//!   rail and plane ids.

use std::ffi::{c_char, c_int, c_ulong, c_void};

pub(crate) type NcclResult = c_int;
pub(crate) const NCCL_SUCCESS: NcclResult = 0;
pub(crate) type Ptr = *mut c_void;

/// `ncclDebugLogger_t` (variadic: the format's arguments follow `fmt`).
pub(crate) type Logger =
    unsafe extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char, ...);

/// `ncclNetProperties_v6_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV6 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
}

/// `ncclNetProperties_v7_t`: v6 and the offload device type.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV7 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetProperties_v8_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// `ncclNetVDeviceProps_vN_t`: `N` NICs behind one virtual device (4 up to v11, 8 in v12).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct VDeviceProps<const N: usize> {
    pub ndevs: c_int,
    pub devs: [c_int; N],
}

/// `ncclNetProperties_v9_t` (v10's is the same).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<4>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// `ncclNetProperties_v11_t`: v9 and `maxMultiRequestSize`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV11 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<4>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
}

/// `ncclNetProperties_v12_t`: 8 NICs per virtual device, and the rail and plane ids.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct PropsV12 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps<8>,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
    pub max_multi_request_size: c_int,
    pub rail_id: i16,
    pub plane_id: i16,
}

type RegMrDmaBuf =
    Option<unsafe extern "C" fn(Ptr, Ptr, usize, c_int, u64, c_int, *mut Ptr) -> NcclResult>;
type IflushInt = Option<
    unsafe extern "C" fn(Ptr, c_int, *mut Ptr, *mut c_int, *mut Ptr, *mut Ptr) -> NcclResult,
>;
type IrecvInt = unsafe extern "C" fn(
    Ptr,
    c_int,
    *mut Ptr,
    *mut c_int,
    *mut c_int,
    *mut Ptr,
    *mut Ptr,
) -> NcclResult;
type IrecvSize = unsafe extern "C" fn(
    Ptr,
    c_int,
    *mut Ptr,
    *mut usize,
    *mut c_int,
    *mut Ptr,
    *mut Ptr,
) -> NcclResult;
type IrecvProf = unsafe extern "C" fn(
    Ptr,
    c_int,
    *mut Ptr,
    *mut usize,
    *mut c_int,
    *mut Ptr,
    *mut Ptr,
    *mut Ptr,
) -> NcclResult;

/// The entries every version from v6 to v10 shares after `getProperties` … `deregMr` differ.
macro_rules! net_table {
    (
        $(#[$doc:meta])* $name:ident {
            init: $init:ty, props: $props:ty, listen: $listen:ty, connect: $connect:ty,
            accept: $accept:ty, reg_mr: $reg:ty, isend: $isend:ty, irecv: $irecv:ty
            $(, tail { $($tail:ident: $tail_ty:ty),* })?
        }
    ) => {
        $(#[$doc])*
        #[repr(C)]
        pub(crate) struct $name {
            pub name: *const c_char,
            pub init: $init,
            pub devices: unsafe extern "C" fn(*mut c_int) -> NcclResult,
            pub get_properties: unsafe extern "C" fn(c_int, *mut $props) -> NcclResult,
            pub listen: $listen,
            pub connect: $connect,
            pub accept: $accept,
            pub reg_mr: $reg,
            pub reg_mr_dma_buf: RegMrDmaBuf,
            pub dereg_mr: unsafe extern "C" fn(Ptr, Ptr) -> NcclResult,
            pub isend: $isend,
            pub irecv: $irecv,
            pub iflush: IflushInt,
            pub test: unsafe extern "C" fn(Ptr, *mut c_int, *mut c_int) -> NcclResult,
            pub close_send: unsafe extern "C" fn(Ptr) -> NcclResult,
            pub close_recv: unsafe extern "C" fn(Ptr) -> NcclResult,
            pub close_listen: unsafe extern "C" fn(Ptr) -> NcclResult,
            $($(pub $tail: $tail_ty,)*)?
        }
    };
}

type InitLog = unsafe extern "C" fn(Option<Logger>) -> NcclResult;
type ListenDev = unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> NcclResult;
type AcceptDev = unsafe extern "C" fn(Ptr, *mut Ptr, *mut Ptr) -> NcclResult;
type RegMrInt = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, *mut Ptr) -> NcclResult;
type RegMrSize = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, *mut Ptr) -> NcclResult;
type IsendInt = unsafe extern "C" fn(Ptr, Ptr, c_int, c_int, Ptr, *mut Ptr) -> NcclResult;
type IsendSize = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, *mut Ptr) -> NcclResult;
type IsendProf = unsafe extern "C" fn(Ptr, Ptr, usize, c_int, Ptr, Ptr, *mut Ptr) -> NcclResult;
type Opt<F> = Option<F>;

net_table!(
    /// `ncclNet_v6_t`.
    NetV6 {
        init: InitLog, props: PropsV6, listen: ListenDev,
        connect: unsafe extern "C" fn(c_int, Ptr, *mut Ptr) -> NcclResult,
        accept: unsafe extern "C" fn(Ptr, *mut Ptr) -> NcclResult,
        reg_mr: RegMrInt, isend: IsendInt, irecv: IrecvInt
    }
);

net_table!(
    /// `ncclNet_v7_t`: device comms out of `connect`/`accept`.
    NetV7 {
        init: InitLog, props: PropsV7, listen: ListenDev,
        connect: unsafe extern "C" fn(c_int, Ptr, *mut Ptr, *mut Ptr) -> NcclResult,
        accept: AcceptDev, reg_mr: RegMrInt, isend: IsendInt, irecv: IrecvInt
    }
);

net_table!(
    /// `ncclNet_v8_t`: `regMr` of `size_t` bytes.
    NetV8 {
        init: InitLog, props: PropsV8, listen: ListenDev,
        connect: unsafe extern "C" fn(c_int, Ptr, *mut Ptr, *mut Ptr) -> NcclResult,
        accept: AcceptDev, reg_mr: RegMrSize, isend: IsendInt, irecv: IrecvInt
    }
);

net_table!(
    /// `ncclNet_v9_t`: sizes become `size_t`.
    NetV9 {
        init: InitLog, props: PropsV9, listen: ListenDev,
        connect: unsafe extern "C" fn(c_int, Ptr, *mut Ptr, *mut Ptr) -> NcclResult,
        accept: AcceptDev, reg_mr: RegMrSize, isend: IsendSize, irecv: IrecvSize
    }
);

/// `ncclNetCommConfig_v10_t` (v11's and v12's are the same).
#[repr(C)]
pub(crate) struct CommConfig {
    pub traffic_class: c_int,
}

/// `NCCL_NET_TRAFFIC_CLASS_UNDEF`.
pub(crate) const TRAFFIC_CLASS_UNDEF: c_int = -1;

net_table!(
    /// `ncclNet_v10_t`: `init` takes a profiler callback, `connect` a config, `isend`/`irecv` a
    /// profiler handle.
    NetV10 {
        init: unsafe extern "C" fn(Option<Logger>, Ptr) -> NcclResult,
        props: PropsV9, listen: ListenDev,
        connect: unsafe extern "C" fn(c_int, *mut CommConfig, Ptr, *mut Ptr, *mut Ptr) -> NcclResult,
        accept: AcceptDev, reg_mr: RegMrSize, isend: IsendProf, irecv: IrecvProf
    }
);

/// `init` of v11 and v12: `(ctx out, commId, config, logger, profiler)`.
type InitCtx =
    unsafe extern "C" fn(*mut Ptr, u64, *mut CommConfig, Option<Logger>, Ptr) -> NcclResult;
type ListenCtx = unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr) -> NcclResult;
type ConnectCtx = unsafe extern "C" fn(Ptr, c_int, Ptr, *mut Ptr, *mut Ptr) -> NcclResult;

net_table!(
    /// `ncclNet_v11_t`: a context from `init` for `listen`, `connect` and `finalize`.
    NetV11 {
        init: InitCtx, props: PropsV11, listen: ListenCtx, connect: ConnectCtx,
        accept: AcceptDev, reg_mr: RegMrSize, isend: IsendProf, irecv: IrecvProf,
        tail {
            get_device_mr: Opt<unsafe extern "C" fn(Ptr, Ptr, *mut Ptr) -> NcclResult>,
            irecv_consumed: Opt<unsafe extern "C" fn(Ptr, c_int, Ptr) -> NcclResult>,
            make_v_device: Opt<unsafe extern "C" fn(*mut c_int, Ptr) -> NcclResult>,
            finalize: Opt<unsafe extern "C" fn(Ptr) -> NcclResult>
        }
    }
);

net_table!(
    /// `ncclNet_v12_t`: v11's table over v12's properties.
    NetV12 {
        init: InitCtx, props: PropsV12, listen: ListenCtx, connect: ConnectCtx,
        accept: AcceptDev, reg_mr: RegMrSize, isend: IsendProf, irecv: IrecvProf,
        tail {
            get_device_mr: Opt<unsafe extern "C" fn(Ptr, Ptr, *mut Ptr) -> NcclResult>,
            irecv_consumed: Opt<unsafe extern "C" fn(Ptr, c_int, Ptr) -> NcclResult>,
            make_v_device: Opt<unsafe extern "C" fn(*mut c_int, Ptr) -> NcclResult>,
            finalize: Opt<unsafe extern "C" fn(Ptr) -> NcclResult>
        }
    }
);

/// The table of the version the plugin exports (the newest of those this binding knows).
pub(crate) enum Table {
    V6(&'static NetV6),
    V7(&'static NetV7),
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
    V12(&'static NetV12),
}

/// The symbols looked up, newest first, with their versions.
pub(crate) const SYMBOLS: [(&[u8], u32); 7] = [
    (b"ncclNetPlugin_v12\0", 12),
    (b"ncclNetPlugin_v11\0", 11),
    (b"ncclNetPlugin_v10\0", 10),
    (b"ncclNetPlugin_v9\0", 9),
    (b"ncclNetPlugin_v8\0", 8),
    (b"ncclNetPlugin_v7\0", 7),
    (b"ncclNetPlugin_v6\0", 6),
];

/// `$e` on the table of whichever version the plugin exports (for the calls whose arguments
/// are the same in every version).
macro_rules! each {
    ($table:expr, $t:ident => $e:expr) => {
        match $table {
            $crate::net::abi::Table::V6($t) => $e,
            $crate::net::abi::Table::V7($t) => $e,
            $crate::net::abi::Table::V8($t) => $e,
            $crate::net::abi::Table::V9($t) => $e,
            $crate::net::abi::Table::V10($t) => $e,
            $crate::net::abi::Table::V11($t) => $e,
            $crate::net::abi::Table::V12($t) => $e,
        }
    };
}
pub(crate) use each;

impl Table {
    /// The table of `version` at `sym`.
    ///
    /// # Safety
    /// `sym` is the address of the plugin's static table of that version's layout, alive as
    /// long as the library stays loaded.
    pub(crate) unsafe fn at(version: u32, sym: *const c_void) -> Option<Table> {
        // SAFETY: forwarded contract: the symbol is that version's table.
        unsafe {
            Some(match version {
                6 => Table::V6(&*sym.cast()),
                7 => Table::V7(&*sym.cast()),
                8 => Table::V8(&*sym.cast()),
                9 => Table::V9(&*sym.cast()),
                10 => Table::V10(&*sym.cast()),
                11 => Table::V11(&*sym.cast()),
                12 => Table::V12(&*sym.cast()),
                _ => return None,
            })
        }
    }

    pub(crate) fn name(&self) -> *const c_char {
        each!(self, t => t.name)
    }
}
