//! [`Verbs`]: the verbs calls the IB transport makes, as a table the layers above call through.
//! [`RealVerbs`] is libibverbs (through [`super::ffi`]); the unit tests implement the same table
//! with an in-process loopback (`FakeVerbs`), so that everything above the calls runs in CI.

use std::ffi::{CString, c_int, c_void};
use std::sync::{Arc, OnceLock};

use mscclpp_hal::{Error, Result};

use super::ffi::{self, Lib};

/// An object of the verbs library (context, PD, CQ, QP, MR): a pointer for [`RealVerbs`], an
/// index for the fake.
pub(crate) type Handle = usize;

/// What a port reports.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct PortInfo {
    pub state: u32,
    pub lid: u16,
    pub link_layer: u8,
    pub active_mtu: u32,
    pub gid_tbl_len: i32,
}

/// A registered memory region.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MrKeys {
    pub handle: Handle,
    pub lkey: u32,
    pub rkey: u32,
}

/// The remote side's address as the RTR transition needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RtrParams {
    pub port: u8,
    pub gid_index: u8,
    pub mtu: u32,
    pub dest_qpn: u32,
    pub rq_psn: u32,
    pub dlid: u16,
    pub dgid: [u8; 16],
    /// RoCE, or a GID-routed IB fabric.
    pub global: bool,
    pub atomics: bool,
}

/// A QP state change.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Transition {
    Init { port: u8, access: i32 },
    Rtr(RtrParams),
    Rts { sq_psn: u32, atomics: bool },
}

/// The one-sided operations the connection posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendOp {
    /// RDMA write of `len` bytes.
    Write,
    /// RDMA write with immediate data (host order here; network order on the wire).
    WriteImm(u32),
    /// 64-bit atomic fetch-and-add of `add`; the old value lands at the local address.
    FetchAdd(u64),
}

/// One signaled send work request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SendRequest {
    pub wr_id: u64,
    pub op: SendOp,
    pub local_addr: u64,
    pub len: u32,
    pub lkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
}

/// One work completion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Completion {
    pub wr_id: u64,
    pub status: u32,
    pub vendor_err: u32,
    pub qp_num: u32,
    pub imm: Option<u32>,
}

/// The verbs table.
pub(crate) trait Verbs: Send + Sync + 'static {
    /// Where the library came from (for messages).
    fn origin(&self) -> String;
    fn device_names(&self) -> Result<Vec<String>>;
    fn open(&self, name: &str) -> Result<Handle>;
    fn close(&self, ctx: Handle);
    fn query_port(&self, ctx: Handle, port: u8) -> Result<PortInfo>;
    fn query_gid(&self, ctx: Handle, port: u8, index: u8) -> Result<[u8; 16]>;
    fn alloc_pd(&self, ctx: Handle) -> Result<Handle>;
    fn dealloc_pd(&self, pd: Handle);
    fn create_cq(&self, ctx: Handle, depth: u32) -> Result<Handle>;
    fn destroy_cq(&self, cq: Handle);
    /// An RC QP; returns it and its number.
    fn create_qp(
        &self,
        pd: Handle,
        send_cq: Handle,
        recv_cq: Handle,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<(Handle, u32)>;
    fn modify_qp(&self, qp: Handle, t: Transition) -> Result<()>;
    fn destroy_qp(&self, qp: Handle);
    /// Registers `len` bytes at `addr` (a host address, or a device address where the driver
    /// takes peer memory).
    fn reg_mr(&self, pd: Handle, addr: u64, len: usize, access: i32) -> Result<MrKeys>;
    fn dereg_mr(&self, mr: Handle);
    fn post_send(&self, qp: Handle, wr: &SendRequest) -> Result<()>;
    /// A zero-length receive (for writes with immediate data).
    fn post_recv(&self, qp: Handle, wr_id: u64) -> Result<()>;
    /// Up to `max` completions appended to `out`; returns how many.
    fn poll_cq(&self, cq: Handle, max: usize, out: &mut Vec<Completion>) -> Result<usize>;
    /// A completion status's name.
    fn status_str(&self, status: u32) -> String;
}

/// libibverbs, opened at run time.
pub(crate) struct RealVerbs {
    lib: Lib,
}

/// The process's libibverbs, opened on first use; the error says what was tried.
pub(crate) fn real() -> std::result::Result<Arc<dyn Verbs>, String> {
    static LIB: OnceLock<std::result::Result<Arc<RealVerbs>, String>> = OnceLock::new();
    LIB.get_or_init(|| Lib::open().map(|lib| Arc::new(RealVerbs { lib })))
        .clone()
        .map(|v| v as Arc<dyn Verbs>)
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn failed(what: String) -> Error {
    Error::io(what, errno())
}

fn ptr(h: Handle) -> *mut c_void {
    h as *mut c_void
}

impl Verbs for RealVerbs {
    fn origin(&self) -> String {
        self.lib.path.to_owned()
    }

    fn device_names(&self) -> Result<Vec<String>> {
        let mut n: c_int = 0;
        // SAFETY: `n` is a valid out-pointer; the list is freed below.
        let list = unsafe { (self.lib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(failed("ibv_get_device_list".into()));
        }
        let mut names = Vec::with_capacity(n.max(0) as usize);
        for i in 0..n.max(0) as usize {
            // SAFETY: the list holds `n` device pointers; each name is a C string owned by it.
            names.push(unsafe { ffi::string((self.lib.get_device_name)(*list.add(i))) });
        }
        // SAFETY: `list` came from ibv_get_device_list and is freed once.
        unsafe { (self.lib.free_device_list)(list) };
        Ok(names)
    }

    fn open(&self, name: &str) -> Result<Handle> {
        let mut n: c_int = 0;
        // SAFETY: as in `device_names`.
        let list = unsafe { (self.lib.get_device_list)(&mut n) };
        if list.is_null() {
            return Err(failed("ibv_get_device_list".into()));
        }
        let mut ctx = std::ptr::null_mut();
        let want = CString::new(name).map_err(|_| Error::invalid("an IB device name with NUL"))?;
        for i in 0..n.max(0) as usize {
            // SAFETY: as in `device_names`; opening a listed device before freeing the list is
            // what verbs requires.
            unsafe {
                let dev = *list.add(i);
                let dn = (self.lib.get_device_name)(dev);
                if !dn.is_null() && std::ffi::CStr::from_ptr(dn) == want.as_c_str() {
                    ctx = (self.lib.open_device)(dev);
                    break;
                }
            }
        }
        let err = errno();
        // SAFETY: freed once; the opened context stays valid after the list is freed.
        unsafe { (self.lib.free_device_list)(list) };
        if ctx.is_null() {
            return Err(Error::io(format!("ibv_open_device({name})"), err));
        }
        Ok(ctx as Handle)
    }

    fn close(&self, ctx: Handle) {
        // SAFETY: `ctx` came from `open` and every object made from it is gone.
        unsafe { (self.lib.close_device)(ptr(ctx)) };
    }

    fn query_port(&self, ctx: Handle, port: u8) -> Result<PortInfo> {
        let mut a = ffi::PortAttr::default();
        // SAFETY: `a` has room for the compat attribute struct and more.
        if unsafe { (self.lib.query_port)(ptr(ctx), port, &mut a) } != 0 {
            return Err(failed(format!("ibv_query_port(port {port})")));
        }
        Ok(PortInfo {
            state: a.state,
            lid: a.lid,
            link_layer: a.link_layer,
            active_mtu: a.active_mtu,
            gid_tbl_len: a.gid_tbl_len,
        })
    }

    fn query_gid(&self, ctx: Handle, port: u8, index: u8) -> Result<[u8; 16]> {
        let mut gid = [0u8; 16];
        // SAFETY: `gid` is a `union ibv_gid` (16 bytes).
        if unsafe { (self.lib.query_gid)(ptr(ctx), port, c_int::from(index), &mut gid) } != 0 {
            return Err(failed(format!("ibv_query_gid(port {port}, index {index})")));
        }
        Ok(gid)
    }

    fn alloc_pd(&self, ctx: Handle) -> Result<Handle> {
        // SAFETY: `ctx` is an open context.
        let pd = unsafe { (self.lib.alloc_pd)(ptr(ctx)) };
        if pd.is_null() {
            return Err(failed("ibv_alloc_pd".into()));
        }
        Ok(pd as Handle)
    }

    fn dealloc_pd(&self, pd: Handle) {
        // SAFETY: `pd` came from `alloc_pd`; its QPs and MRs are gone.
        unsafe { (self.lib.dealloc_pd)(ptr(pd)) };
    }

    fn create_cq(&self, ctx: Handle, depth: u32) -> Result<Handle> {
        let depth = c_int::try_from(depth).unwrap_or(c_int::MAX);
        // SAFETY: no completion channel, no context pointer.
        let cq = unsafe {
            (self.lib.create_cq)(
                ptr(ctx),
                depth,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        };
        if cq.is_null() {
            return Err(failed(format!("ibv_create_cq({depth} entries)")));
        }
        Ok(cq as Handle)
    }

    fn destroy_cq(&self, cq: Handle) {
        // SAFETY: `cq` came from `create_cq`; its QPs are gone.
        unsafe { (self.lib.destroy_cq)(ptr(cq)) };
    }

    fn create_qp(
        &self,
        pd: Handle,
        send_cq: Handle,
        recv_cq: Handle,
        max_send_wr: u32,
        max_recv_wr: u32,
    ) -> Result<(Handle, u32)> {
        let mut attr = ffi::QpInitAttr {
            qp_context: std::ptr::null_mut(),
            send_cq: ptr(send_cq),
            recv_cq: ptr(recv_cq),
            srq: std::ptr::null_mut(),
            cap: ffi::QpCap {
                max_send_wr,
                max_recv_wr,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::IBV_QPT_RC,
            sq_sig_all: 0,
        };
        // SAFETY: `attr` is a valid init attribute struct for the call.
        let qp = unsafe { (self.lib.create_qp)(ptr(pd), &mut attr) };
        if qp.is_null() {
            return Err(failed(format!(
                "ibv_create_qp(RC, {max_send_wr} send / {max_recv_wr} receive requests)"
            )));
        }
        // SAFETY: a live `ibv_qp`; `qp_num` is at its documented offset.
        let qpn = unsafe { *(qp.cast::<u8>().add(ffi::off::QP_NUM) as *const u32) };
        Ok((qp as Handle, qpn))
    }

    fn modify_qp(&self, qp: Handle, t: Transition) -> Result<()> {
        let mut a = ffi::QpAttr::default();
        let (mask, what) = match t {
            Transition::Init { port, access } => {
                a.qp_state = ffi::IBV_QPS_INIT;
                a.pkey_index = 0;
                a.port_num = port;
                a.qp_access_flags = access as u32;
                (
                    ffi::IBV_QP_STATE
                        | ffi::IBV_QP_PKEY_INDEX
                        | ffi::IBV_QP_PORT
                        | ffi::IBV_QP_ACCESS_FLAGS,
                    "INIT",
                )
            }
            Transition::Rtr(p) => {
                a.qp_state = ffi::IBV_QPS_RTR;
                a.path_mtu = p.mtu;
                a.dest_qp_num = p.dest_qpn;
                a.rq_psn = p.rq_psn;
                a.max_dest_rd_atomic = u8::from(p.atomics);
                a.min_rnr_timer = 12;
                a.ah_attr.dlid = p.dlid;
                a.ah_attr.port_num = p.port;
                if p.global {
                    a.ah_attr.is_global = 1;
                    a.ah_attr.grh.dgid = p.dgid;
                    a.ah_attr.grh.sgid_index = p.gid_index;
                    a.ah_attr.grh.hop_limit = 255;
                }
                (
                    ffi::IBV_QP_STATE
                        | ffi::IBV_QP_AV
                        | ffi::IBV_QP_PATH_MTU
                        | ffi::IBV_QP_DEST_QPN
                        | ffi::IBV_QP_RQ_PSN
                        | ffi::IBV_QP_MAX_DEST_RD_ATOMIC
                        | ffi::IBV_QP_MIN_RNR_TIMER,
                    "RTR",
                )
            }
            Transition::Rts { sq_psn, atomics } => {
                a.qp_state = ffi::IBV_QPS_RTS;
                a.timeout = 18;
                a.retry_cnt = 7;
                a.rnr_retry = 7;
                a.sq_psn = sq_psn;
                a.max_rd_atomic = u8::from(atomics);
                (
                    ffi::IBV_QP_STATE
                        | ffi::IBV_QP_TIMEOUT
                        | ffi::IBV_QP_RETRY_CNT
                        | ffi::IBV_QP_RNR_RETRY
                        | ffi::IBV_QP_SQ_PSN
                        | ffi::IBV_QP_MAX_QP_RD_ATOMIC,
                    "RTS",
                )
            }
        };
        // SAFETY: `a` is a valid attribute struct and `mask` names only fields set above.
        let rc = unsafe { (self.lib.modify_qp)(ptr(qp), &mut a, mask) };
        if rc != 0 {
            return Err(Error::io(
                format!("ibv_modify_qp to {what}"),
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    fn destroy_qp(&self, qp: Handle) {
        // SAFETY: `qp` came from `create_qp`.
        unsafe { (self.lib.destroy_qp)(ptr(qp)) };
    }

    fn reg_mr(&self, pd: Handle, addr: u64, len: usize, access: i32) -> Result<MrKeys> {
        // SAFETY: the caller keeps the `len` bytes at `addr` allocated while registered.
        let mr = unsafe { (self.lib.reg_mr)(ptr(pd), addr as *mut c_void, len, access) };
        if mr.is_null() {
            return Err(failed(format!("ibv_reg_mr({len} bytes at {addr:#x})")));
        }
        // SAFETY: a live `ibv_mr`; the keys are at their documented offsets.
        let (lkey, rkey) = unsafe {
            let b = mr.cast::<u8>();
            (
                *(b.add(ffi::off::MR_LKEY) as *const u32),
                *(b.add(ffi::off::MR_RKEY) as *const u32),
            )
        };
        Ok(MrKeys {
            handle: mr as Handle,
            lkey,
            rkey,
        })
    }

    fn dereg_mr(&self, mr: Handle) {
        // SAFETY: `mr` came from `reg_mr`.
        unsafe { (self.lib.dereg_mr)(ptr(mr)) };
    }

    fn post_send(&self, qp: Handle, r: &SendRequest) -> Result<()> {
        let mut sge = ffi::Sge {
            addr: r.local_addr,
            length: r.len,
            lkey: r.lkey,
        };
        let mut wr = ffi::SendWr {
            wr_id: r.wr_id,
            next: std::ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
            opcode: ffi::IBV_WR_RDMA_WRITE,
            send_flags: ffi::IBV_SEND_SIGNALED,
            imm_data: 0,
            remote_addr: r.remote_addr,
            rdma_rkey_or_compare_add: u64::from(r.rkey),
            swap: 0,
            atomic_rkey: 0,
            _pad: 0,
            _tail: [0; 7],
        };
        match r.op {
            SendOp::Write => {}
            SendOp::WriteImm(imm) => {
                wr.opcode = ffi::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.imm_data = imm.to_be();
            }
            SendOp::FetchAdd(add) => {
                wr.opcode = ffi::IBV_WR_ATOMIC_FETCH_AND_ADD;
                wr.rdma_rkey_or_compare_add = add;
                wr.atomic_rkey = r.rkey;
            }
        }
        if r.len == 0 {
            wr.num_sge = 0;
        }
        // SAFETY: `qp` is live; `wr` and `sge` outlive the call (the provider copies them).
        let rc = unsafe { ffi::post_send(ptr(qp), &mut wr) };
        if rc != 0 {
            return Err(Error::io(
                "ibv_post_send",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    fn post_recv(&self, qp: Handle, wr_id: u64) -> Result<()> {
        let mut wr = ffi::RecvWr {
            wr_id,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        // SAFETY: `qp` is live; a receive with no scatter list takes write-with-immediate.
        let rc = unsafe { ffi::post_recv(ptr(qp), &mut wr) };
        if rc != 0 {
            return Err(Error::io(
                "ibv_post_recv",
                std::io::Error::from_raw_os_error(rc),
            ));
        }
        Ok(())
    }

    fn poll_cq(&self, cq: Handle, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let mut wc = [ffi::Wc::default(); 16];
        let n = max.min(wc.len()) as c_int;
        // SAFETY: `cq` is live and `wc` has room for `n` entries.
        let got = unsafe { ffi::poll_cq(ptr(cq), n, wc.as_mut_ptr()) };
        if got < 0 {
            return Err(Error::io(
                "ibv_poll_cq",
                std::io::Error::from_raw_os_error(-got),
            ));
        }
        for w in &wc[..got as usize] {
            out.push(Completion {
                wr_id: w.wr_id,
                status: w.status,
                vendor_err: w.vendor_err,
                qp_num: w.qp_num,
                imm: (w.wc_flags & ffi::IBV_WC_WITH_IMM != 0).then(|| u32::from_be(w.imm_data)),
            });
        }
        Ok(got as usize)
    }

    fn status_str(&self, status: u32) -> String {
        // SAFETY: returns a static string for any value.
        unsafe { ffi::string((self.lib.wc_status_str)(status)) }
    }
}
