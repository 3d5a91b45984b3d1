//! A minimal FFI over rdma-core's libibverbs, opened at run time.
//!
//! Why not the `ibverbs` / `ibverbs-sys` crates: `ibverbs-sys` (0.3, rdma-core 55) declares
//! `links = "ibverbs"`, and its build script builds the vendored rdma-core with cmake, runs
//! bindgen (libclang) over its headers and emits `rustc-link-lib=ibverbs`; `ibverbs` depends on
//! it. A binary built with them has libibverbs as a load-time dependency and does not start on
//! a machine without rdma-core, and every build needs cmake, a C toolchain and libclang. The design's first principle is that one binary starts
//! everywhere (NCCL and MSCCL++ both `dlopen` libibverbs), so the few calls used here are
//! declared by hand and resolved with `libloading`.
//!
//! Layouts are written from rdma-core's `include/infiniband/verbs.h` (x86_64 / aarch64 LP64),
//! with only the fields used; the offset tests below pin every offset derived from the header.
//! `ibv_post_send`, `ibv_post_recv` and `ibv_poll_cq` are `static inline` in verbs.h: they call
//! through the context's `ops` table (`qp->context->ops.post_send(...)`), as done here.

use std::ffi::{CStr, c_char, c_int, c_void};

use libloading::Library;
use mscclpp_hal::{Error, Result};

/// Names tried, in order, when opening libibverbs.
pub(crate) const LIBRARY_NAMES: [&str; 2] = ["libibverbs.so.1", "libibverbs.so"];

pub(crate) const IBV_PORT_ACTIVE: u32 = 4;
pub(crate) const IBV_LINK_LAYER_ETHERNET: u8 = 2;

pub(crate) const IBV_QPT_RC: u32 = 2;
pub(crate) const IBV_QPS_INIT: u32 = 1;
pub(crate) const IBV_QPS_RTR: u32 = 2;
pub(crate) const IBV_QPS_RTS: u32 = 3;

pub(crate) const IBV_QP_STATE: c_int = 1;
pub(crate) const IBV_QP_ACCESS_FLAGS: c_int = 1 << 3;
pub(crate) const IBV_QP_PKEY_INDEX: c_int = 1 << 4;
pub(crate) const IBV_QP_PORT: c_int = 1 << 5;
pub(crate) const IBV_QP_AV: c_int = 1 << 7;
pub(crate) const IBV_QP_PATH_MTU: c_int = 1 << 8;
pub(crate) const IBV_QP_TIMEOUT: c_int = 1 << 9;
pub(crate) const IBV_QP_RETRY_CNT: c_int = 1 << 10;
pub(crate) const IBV_QP_RNR_RETRY: c_int = 1 << 11;
pub(crate) const IBV_QP_RQ_PSN: c_int = 1 << 12;
pub(crate) const IBV_QP_MAX_QP_RD_ATOMIC: c_int = 1 << 13;
pub(crate) const IBV_QP_MIN_RNR_TIMER: c_int = 1 << 15;
pub(crate) const IBV_QP_SQ_PSN: c_int = 1 << 16;
pub(crate) const IBV_QP_MAX_DEST_RD_ATOMIC: c_int = 1 << 17;
pub(crate) const IBV_QP_DEST_QPN: c_int = 1 << 20;

pub(crate) const IBV_ACCESS_LOCAL_WRITE: c_int = 1;
pub(crate) const IBV_ACCESS_REMOTE_WRITE: c_int = 1 << 1;
pub(crate) const IBV_ACCESS_REMOTE_READ: c_int = 1 << 2;
pub(crate) const IBV_ACCESS_REMOTE_ATOMIC: c_int = 1 << 3;

pub(crate) const IBV_WR_RDMA_WRITE: u32 = 0;
pub(crate) const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
pub(crate) const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
pub(crate) const IBV_SEND_SIGNALED: u32 = 1 << 1;

pub(crate) const IBV_WC_WITH_IMM: u32 = 1 << 1;

/// `struct ibv_port_attr`, up to `port_cap_flags2`, with room behind it: newer rdma-core
/// appends fields (`active_speed_ex`) and the exported `ibv_query_port` writes the compat size.
#[repr(C)]
#[derive(Default)]
pub(crate) struct PortAttr {
    pub state: u32,
    pub max_mtu: u32,
    pub active_mtu: u32,
    pub gid_tbl_len: c_int,
    pub port_cap_flags: u32,
    pub max_msg_sz: u32,
    pub bad_pkey_cntr: u32,
    pub qkey_viol_cntr: u32,
    pub pkey_tbl_len: u16,
    pub lid: u16,
    pub sm_lid: u16,
    pub lmc: u8,
    pub max_vl_num: u8,
    pub sm_sl: u8,
    pub subnet_timeout: u8,
    pub init_type_reply: u8,
    pub active_width: u8,
    pub active_speed: u8,
    pub phys_state: u8,
    pub link_layer: u8,
    pub flags: u8,
    pub port_cap_flags2: u16,
    pub _reserved: [u32; 16],
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct QpCap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
pub(crate) struct QpInitAttr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut c_void,
    pub recv_cq: *mut c_void,
    pub srq: *mut c_void,
    pub cap: QpCap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_global_route`. Aligned to 8 because its `union ibv_gid` holds two `__be64`:
/// that makes `ibv_ah_attr` 8-aligned and `ibv_qp_attr` 144 bytes, not 140.
#[repr(C, align(8))]
#[derive(Default, Clone, Copy)]
pub(crate) struct GlobalRoute {
    pub dgid: [u8; 16],
    pub flow_label: u32,
    pub sgid_index: u8,
    pub hop_limit: u8,
    pub traffic_class: u8,
}

/// `struct ibv_ah_attr`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct AhAttr {
    pub grh: GlobalRoute,
    pub dlid: u16,
    pub sl: u8,
    pub src_path_bits: u8,
    pub static_rate: u8,
    pub is_global: u8,
    pub port_num: u8,
}

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct QpAttr {
    pub qp_state: u32,
    pub cur_qp_state: u32,
    pub path_mtu: u32,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub cap: QpCap,
    pub ah_attr: AhAttr,
    pub alt_ah_attr: AhAttr,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub sq_draining: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

/// `struct ibv_send_wr` with the `wr` union as its `atomic` member (the largest; `rdma` is its
/// prefix: `remote_addr` first, `rkey` at +24 for atomics, +8 for RDMA) and the trailing unions
/// as padding.
#[repr(C)]
pub(crate) struct SendWr {
    pub wr_id: u64,
    pub next: *mut SendWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// Network byte order.
    pub imm_data: u32,
    /// `wr.rdma.remote_addr` / `wr.atomic.remote_addr`.
    pub remote_addr: u64,
    /// `wr.rdma.rkey` (low half) / `wr.atomic.compare_add`.
    pub rdma_rkey_or_compare_add: u64,
    /// `wr.atomic.swap`.
    pub swap: u64,
    /// `wr.atomic.rkey`.
    pub atomic_rkey: u32,
    pub _pad: u32,
    /// `qp_type` union and the `bind_mw`/`tso` union.
    pub _tail: [u64; 7],
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub(crate) struct RecvWr {
    pub wr_id: u64,
    pub next: *mut RecvWr,
    pub sg_list: *mut Sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Default, Clone, Copy)]
pub(crate) struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    pub imm_data: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

/// Byte offsets into structures only ever reached through pointers.
pub(crate) mod off {
    /// `ibv_context.ops`: after the `device` pointer.
    pub const CONTEXT_OPS: usize = 8;
    /// Slots of `struct ibv_context_ops` (pointer-sized each).
    pub const OPS_POLL_CQ: usize = 11;
    pub const OPS_POST_SEND: usize = 25;
    pub const OPS_POST_RECV: usize = 26;
    /// `ibv_qp.qp_num`: after six pointers and `handle`.
    pub const QP_NUM: usize = 52;
    /// `ibv_mr.lkey` / `rkey`: after four pointer-sized fields and `handle`.
    pub const MR_LKEY: usize = 36;
    pub const MR_RKEY: usize = 40;
    /// `ibv_qp.context` and `ibv_cq.context` are their first field.
    pub const CONTEXT_OF: usize = 0;
}

type PostSendFn = unsafe extern "C" fn(*mut c_void, *mut SendWr, *mut *mut SendWr) -> c_int;
type PostRecvFn = unsafe extern "C" fn(*mut c_void, *mut RecvWr, *mut *mut RecvWr) -> c_int;
type PollCqFn = unsafe extern "C" fn(*mut c_void, c_int, *mut Wc) -> c_int;

/// The exported functions used, resolved once.
pub(crate) struct Lib {
    pub path: &'static str,
    pub get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub get_device_name: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    pub open_device: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub close_device: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub query_port: unsafe extern "C" fn(*mut c_void, u8, *mut PortAttr) -> c_int,
    pub query_gid: unsafe extern "C" fn(*mut c_void, u8, c_int, *mut [u8; 16]) -> c_int,
    pub alloc_pd: unsafe extern "C" fn(*mut c_void) -> *mut c_void,
    pub dealloc_pd: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_cq:
        unsafe extern "C" fn(*mut c_void, c_int, *mut c_void, *mut c_void, c_int) -> *mut c_void,
    pub destroy_cq: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub create_qp: unsafe extern "C" fn(*mut c_void, *mut QpInitAttr) -> *mut c_void,
    pub modify_qp: unsafe extern "C" fn(*mut c_void, *mut QpAttr, c_int) -> c_int,
    pub destroy_qp: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub reg_mr: unsafe extern "C" fn(*mut c_void, *mut c_void, usize, c_int) -> *mut c_void,
    pub dereg_mr: unsafe extern "C" fn(*mut c_void) -> c_int,
    pub wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
    // Keeps the symbols above valid.
    _lib: Library,
}

impl Lib {
    /// Opens libibverbs; the error names every path tried.
    pub(crate) fn open() -> std::result::Result<Lib, String> {
        let mut tried = Vec::new();
        for name in LIBRARY_NAMES {
            // SAFETY: loading libibverbs runs its constructors, which only register providers;
            // this is what every verbs user (NCCL, MSCCL++) does.
            match unsafe { Library::new(name) } {
                Ok(lib) => return Self::resolve(lib, name).map_err(|e| e.to_string()),
                Err(e) => tried.push(format!("{name}: {}", mscclpp_hal::error::chain(&e))),
            }
        }
        Err(format!(
            "libibverbs could not be loaded (tried {}); install rdma-core (libibverbs1)",
            tried.join("; ")
        ))
    }

    fn resolve(lib: Library, path: &'static str) -> Result<Lib> {
        macro_rules! sym {
            ($name:literal) => {{
                // SAFETY: the symbol's type is the prototype declared in verbs.h for it; the
                // pointer stays valid while `_lib` is held by the returned `Lib`.
                let s = unsafe { lib.get(concat!($name, "\0").as_bytes()) };
                *s.map_err(|e| {
                    Error::unavailable(
                        format!("{} in {path}", $name),
                        format!("the symbol is missing: {e}"),
                    )
                })?
            }};
        }
        Ok(Lib {
            path,
            get_device_list: sym!("ibv_get_device_list"),
            free_device_list: sym!("ibv_free_device_list"),
            get_device_name: sym!("ibv_get_device_name"),
            open_device: sym!("ibv_open_device"),
            close_device: sym!("ibv_close_device"),
            query_port: sym!("ibv_query_port"),
            query_gid: sym!("ibv_query_gid"),
            alloc_pd: sym!("ibv_alloc_pd"),
            dealloc_pd: sym!("ibv_dealloc_pd"),
            create_cq: sym!("ibv_create_cq"),
            destroy_cq: sym!("ibv_destroy_cq"),
            create_qp: sym!("ibv_create_qp"),
            modify_qp: sym!("ibv_modify_qp"),
            destroy_qp: sym!("ibv_destroy_qp"),
            reg_mr: sym!("ibv_reg_mr"),
            dereg_mr: sym!("ibv_dereg_mr"),
            wc_status_str: sym!("ibv_wc_status_str"),
            _lib: lib,
        })
    }
}

/// Reads the `ops` slot `slot` of the context `obj` belongs to (`obj` is an `ibv_qp*` or
/// `ibv_cq*`, whose first field is the context pointer).
///
/// # Safety
/// `obj` must be a live `ibv_qp` or `ibv_cq` made by libibverbs.
unsafe fn op(obj: *mut c_void, slot: usize) -> *const c_void {
    // SAFETY: per the caller, `obj` starts with its `ibv_context*`, and the context holds the
    // ops table at `CONTEXT_OPS`, one pointer per slot.
    unsafe {
        let ctx = *(obj.cast::<u8>().add(off::CONTEXT_OF) as *const *const u8);
        *(ctx.add(off::CONTEXT_OPS + slot * 8) as *const *const c_void)
    }
}

/// `ibv_post_send` as verbs.h's inline wrapper does it.
///
/// # Safety
/// `qp` is a live QP; `wr` and its scatter list are valid for the call.
pub(crate) unsafe fn post_send(qp: *mut c_void, wr: *mut SendWr) -> c_int {
    let mut bad: *mut SendWr = std::ptr::null_mut();
    // SAFETY: slot 25 of a context's ops table is `post_send`, with this prototype.
    unsafe {
        let f: PostSendFn = std::mem::transmute(op(qp, off::OPS_POST_SEND));
        f(qp, wr, &mut bad)
    }
}

/// `ibv_post_recv` as verbs.h's inline wrapper does it.
///
/// # Safety
/// `qp` is a live QP; `wr` and its scatter list are valid for the call.
pub(crate) unsafe fn post_recv(qp: *mut c_void, wr: *mut RecvWr) -> c_int {
    let mut bad: *mut RecvWr = std::ptr::null_mut();
    // SAFETY: slot 26 of a context's ops table is `post_recv`, with this prototype.
    unsafe {
        let f: PostRecvFn = std::mem::transmute(op(qp, off::OPS_POST_RECV));
        f(qp, wr, &mut bad)
    }
}

/// `ibv_poll_cq` as verbs.h's inline wrapper does it.
///
/// # Safety
/// `cq` is a live CQ; `wc` has room for `n` entries.
pub(crate) unsafe fn poll_cq(cq: *mut c_void, n: c_int, wc: *mut Wc) -> c_int {
    // SAFETY: slot 11 of a context's ops table is `poll_cq`, with this prototype.
    unsafe {
        let f: PollCqFn = std::mem::transmute(op(cq, off::OPS_POLL_CQ));
        f(cq, n, wc)
    }
}

/// A C string from the library, owned.
///
/// # Safety
/// `p` is null or a NUL-terminated string valid for the call.
pub(crate) unsafe fn string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: per the caller.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    /// Sizes and offsets derived from verbs.h for LP64; a wrong one would corrupt the
    /// library's memory, so each is pinned. The values were checked against rdma-core 44's
    /// headers by compiling `offsetof`/`sizeof` of the same fields (including the ops slots:
    /// `poll_cq` 11, `post_send` 25, `post_recv` 26, and `ibv_qp.qp_num` 52, `ibv_mr.lkey` 36).
    #[test]
    fn layouts_match_verbs_h() {
        assert_eq!(offset_of!(PortAttr, lid), 34);
        assert_eq!(offset_of!(PortAttr, link_layer), 46);
        assert_eq!(offset_of!(PortAttr, port_cap_flags2), 48);
        assert!(size_of::<PortAttr>() >= 56);
        assert_eq!(size_of::<QpCap>(), 20);
        assert_eq!(offset_of!(QpInitAttr, cap), 32);
        assert_eq!(offset_of!(QpInitAttr, qp_type), 52);
        assert_eq!(size_of::<QpInitAttr>(), 64);
        assert_eq!(size_of::<GlobalRoute>(), 24);
        assert_eq!(offset_of!(AhAttr, dlid), 24);
        assert_eq!(offset_of!(AhAttr, is_global), 29);
        assert_eq!(offset_of!(AhAttr, port_num), 30);
        assert_eq!(size_of::<AhAttr>(), 32);
        assert_eq!(offset_of!(QpAttr, qp_access_flags), 32);
        assert_eq!(offset_of!(QpAttr, cap), 36);
        assert_eq!(offset_of!(QpAttr, ah_attr), 56);
        assert_eq!(offset_of!(QpAttr, pkey_index), 120);
        assert_eq!(offset_of!(QpAttr, max_rd_atomic), 126);
        assert_eq!(offset_of!(QpAttr, port_num), 129);
        assert_eq!(offset_of!(QpAttr, rnr_retry), 132);
        assert_eq!(offset_of!(QpAttr, rate_limit), 136);
        assert_eq!(size_of::<QpAttr>(), 144);
        assert_eq!(std::mem::align_of::<QpAttr>(), 8);
        assert_eq!(size_of::<Sge>(), 16);
        assert_eq!(offset_of!(SendWr, opcode), 28);
        assert_eq!(offset_of!(SendWr, imm_data), 36);
        assert_eq!(offset_of!(SendWr, remote_addr), 40);
        assert_eq!(offset_of!(SendWr, rdma_rkey_or_compare_add), 48);
        assert_eq!(offset_of!(SendWr, atomic_rkey), 64);
        assert_eq!(size_of::<SendWr>(), 128);
        assert_eq!(size_of::<RecvWr>(), 32);
        assert_eq!(offset_of!(Wc, status), 8);
        assert_eq!(offset_of!(Wc, imm_data), 24);
        assert_eq!(offset_of!(Wc, qp_num), 28);
        assert_eq!(offset_of!(Wc, wc_flags), 36);
        assert_eq!(size_of::<Wc>(), 48);
        assert_eq!(size_of::<*const c_void>(), 8);
    }
}
