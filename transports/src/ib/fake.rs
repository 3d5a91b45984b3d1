//! `FakeVerbs`: a FAKE verbs table for the unit tests — an in-process loopback fabric, not an
//! HCA. QPs are entries in a table joined by QP number, MRs are byte ranges of this process's
//! memory checked by key, an RDMA write or atomic is applied to the target bytes at post time,
//! and completions are queued into the CQs. It implements the same [`Verbs`] table as
//! libibverbs, so everything above the verbs calls (device choice, QP set-up, registration,
//! put/signal/flush, completion errors) runs in CI without an HCA.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mscclpp_hal::{Error, Result};

use super::ffi::{IBV_ACCESS_REMOTE_ATOMIC, IBV_ACCESS_REMOTE_WRITE, IBV_PORT_ACTIVE};
use super::verbs::{Completion, Handle, MrKeys, PortInfo, SendOp, SendRequest, Transition, Verbs};

const LOC_PROT_ERR: u32 = 4;
const WR_FLUSH_ERR: u32 = 5;
const REM_ACCESS_ERR: u32 = 10;
const RETRY_EXC_ERR: u32 = 12;
const RNR_RETRY_EXC_ERR: u32 = 13;

struct FakeQp {
    qpn: u32,
    state: u32,
    send_cq: Handle,
    recv_cq: Handle,
    dest_qpn: u32,
    recvs: VecDeque<u64>,
    broken: bool,
}

struct FakeMr {
    addr: u64,
    len: u64,
    lkey: u32,
    rkey: u32,
    access: i32,
}

#[derive(Default)]
struct Fabric {
    next: usize,
    ctxs: HashSet<Handle>,
    pds: HashSet<Handle>,
    cqs: HashMap<Handle, VecDeque<Completion>>,
    qps: HashMap<Handle, FakeQp>,
    mrs: HashMap<Handle, FakeMr>,
    /// QPs whose "process" died: requests to them time out.
    dead_qpns: HashSet<u32>,
    fail_reg_mr: bool,
}

impl Fabric {
    fn handle(&mut self) -> Handle {
        self.next += 1;
        self.next
    }
}

/// The fake (see the module documentation).
pub(crate) struct FakeVerbs {
    devices: Vec<String>,
    port_state: u32,
    fabric: Mutex<Fabric>,
}

impl FakeVerbs {
    /// A fabric whose hosts all see the devices `names`, every port ACTIVE.
    pub(crate) fn with_devices(names: &[&str]) -> Arc<FakeVerbs> {
        Self::with_port_state(names, IBV_PORT_ACTIVE)
    }

    /// As [`FakeVerbs::with_devices`], every port in `state`.
    pub(crate) fn with_port_state(names: &[&str], state: u32) -> Arc<FakeVerbs> {
        Arc::new(FakeVerbs {
            devices: names.iter().map(|s| s.to_string()).collect(),
            port_state: state,
            fabric: Mutex::new(Fabric::default()),
        })
    }

    fn fab(&self) -> MutexGuard<'_, Fabric> {
        self.fabric.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes QP `qpn` vanish as if its process died: requests to it fail with retry exceeded.
    pub(crate) fn kill_qp(&self, qpn: u32) {
        self.fab().dead_qpns.insert(qpn);
    }

    /// Makes every later registration fail.
    pub(crate) fn fail_registrations(&self) {
        self.fab().fail_reg_mr = true;
    }

    /// Objects still alive: contexts, PDs, CQs, QPs, MRs (to check that teardown releases all).
    pub(crate) fn live(&self) -> [usize; 5] {
        let f = self.fab();
        [
            f.ctxs.len(),
            f.pds.len(),
            f.cqs.len(),
            f.qps.len(),
            f.mrs.len(),
        ]
    }

    /// Receives posted on QP `qpn` and not yet consumed.
    pub(crate) fn posted_recvs(&self, qpn: u32) -> usize {
        let f = self.fab();
        f.qps
            .values()
            .find(|q| q.qpn == qpn)
            .map_or(0, |q| q.recvs.len())
    }
}

fn einval(what: &str) -> Error {
    Error::io(
        format!("fake {what}"),
        std::io::Error::from_raw_os_error(22),
    )
}

/// Finds the MR with `key` (lkey or rkey per `remote`) covering `addr..addr+len`.
fn find_mr(f: &Fabric, key: u32, remote: bool, addr: u64, len: u64) -> Option<&FakeMr> {
    f.mrs.values().find(|m| {
        (if remote { m.rkey } else { m.lkey }) == key
            && addr >= m.addr
            && addr.checked_add(len).is_some_and(|e| e <= m.addr + m.len)
    })
}

impl Verbs for FakeVerbs {
    fn origin(&self) -> String {
        "FakeVerbs (in-process loopback)".into()
    }

    fn device_names(&self) -> Result<Vec<String>> {
        Ok(self.devices.clone())
    }

    fn open(&self, name: &str) -> Result<Handle> {
        if !self.devices.iter().any(|d| d == name) {
            return Err(einval("open of an unknown device"));
        }
        let mut f = self.fab();
        let h = f.handle();
        f.ctxs.insert(h);
        Ok(h)
    }

    fn close(&self, ctx: Handle) {
        self.fab().ctxs.remove(&ctx);
    }

    fn query_port(&self, ctx: Handle, port: u8) -> Result<PortInfo> {
        if port != 1 || !self.fab().ctxs.contains(&ctx) {
            return Err(einval("query_port"));
        }
        Ok(PortInfo {
            state: self.port_state,
            lid: 7,
            link_layer: 1,
            active_mtu: 5,
            gid_tbl_len: 4,
        })
    }

    fn query_gid(&self, _ctx: Handle, _port: u8, index: u8) -> Result<[u8; 16]> {
        Ok([index + 1; 16])
    }

    fn alloc_pd(&self, _ctx: Handle) -> Result<Handle> {
        let mut f = self.fab();
        let h = f.handle();
        f.pds.insert(h);
        Ok(h)
    }

    fn dealloc_pd(&self, pd: Handle) {
        self.fab().pds.remove(&pd);
    }

    fn create_cq(&self, _ctx: Handle, _depth: u32) -> Result<Handle> {
        let mut f = self.fab();
        let h = f.handle();
        f.cqs.insert(h, VecDeque::new());
        Ok(h)
    }

    fn destroy_cq(&self, cq: Handle) {
        self.fab().cqs.remove(&cq);
    }

    fn create_qp(
        &self,
        _pd: Handle,
        send_cq: Handle,
        recv_cq: Handle,
        _max_send_wr: u32,
        _max_recv_wr: u32,
    ) -> Result<(Handle, u32)> {
        let mut f = self.fab();
        let h = f.handle();
        let qpn = 0x100 + h as u32;
        f.qps.insert(
            h,
            FakeQp {
                qpn,
                state: 0,
                send_cq,
                recv_cq,
                dest_qpn: 0,
                recvs: VecDeque::new(),
                broken: false,
            },
        );
        Ok((h, qpn))
    }

    fn modify_qp(&self, qp: Handle, t: Transition) -> Result<()> {
        let mut f = self.fab();
        let q = f
            .qps
            .get_mut(&qp)
            .ok_or_else(|| einval("modify_qp of no QP"))?;
        match (q.state, t) {
            (0, Transition::Init { .. }) => q.state = 1,
            (1, Transition::Rtr(p)) => {
                q.dest_qpn = p.dest_qpn;
                q.state = 2;
            }
            (2, Transition::Rts { .. }) => q.state = 3,
            _ => return Err(einval("modify_qp out of order")),
        }
        Ok(())
    }

    fn destroy_qp(&self, qp: Handle) {
        self.fab().qps.remove(&qp);
    }

    fn reg_mr(&self, _pd: Handle, addr: u64, len: usize, access: i32) -> Result<MrKeys> {
        let mut f = self.fab();
        if f.fail_reg_mr {
            return Err(Error::io(
                "fake ibv_reg_mr",
                std::io::Error::from_raw_os_error(14),
            ));
        }
        let h = f.handle();
        let key = 0x1000 + h as u32;
        f.mrs.insert(
            h,
            FakeMr {
                addr,
                len: len as u64,
                lkey: key,
                rkey: key ^ 0xffff_0000,
                access,
            },
        );
        Ok(MrKeys {
            handle: h,
            lkey: key,
            rkey: key ^ 0xffff_0000,
        })
    }

    fn dereg_mr(&self, mr: Handle) {
        self.fab().mrs.remove(&mr);
    }

    fn post_send(&self, qp: Handle, wr: &SendRequest) -> Result<()> {
        let mut f = self.fab();
        let (qpn_dest, send_cq, state, broken) = match f.qps.get(&qp) {
            Some(q) => (q.dest_qpn, q.send_cq, q.state, q.broken),
            None => return Err(einval("post_send on no QP")),
        };
        if state != 3 {
            return Err(einval("post_send on a QP not in RTS"));
        }
        let status = if broken {
            WR_FLUSH_ERR
        } else {
            self.apply(&mut f, qpn_dest, wr)
        };
        if status != 0 {
            if let Some(q) = f.qps.get_mut(&qp) {
                q.broken = true;
            }
        }
        if let Some(cq) = f.cqs.get_mut(&send_cq) {
            cq.push_back(Completion {
                wr_id: wr.wr_id,
                status,
                vendor_err: 0,
                qp_num: 0,
                imm: None,
            });
        }
        Ok(())
    }

    fn post_recv(&self, qp: Handle, wr_id: u64) -> Result<()> {
        let mut f = self.fab();
        let q = f
            .qps
            .get_mut(&qp)
            .ok_or_else(|| einval("post_recv on no QP"))?;
        q.recvs.push_back(wr_id);
        Ok(())
    }

    fn poll_cq(&self, cq: Handle, max: usize, out: &mut Vec<Completion>) -> Result<usize> {
        let mut f = self.fab();
        let q = f
            .cqs
            .get_mut(&cq)
            .ok_or_else(|| einval("poll_cq on no CQ"))?;
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        Ok(n)
    }

    fn status_str(&self, status: u32) -> String {
        match status {
            0 => "success",
            LOC_PROT_ERR => "local protection error",
            WR_FLUSH_ERR => "Work Request Flushed Error",
            REM_ACCESS_ERR => "remote access error",
            RETRY_EXC_ERR => "transport retry counter exceeded",
            RNR_RETRY_EXC_ERR => "RNR retry counter exceeded",
            _ => "unknown",
        }
        .into()
    }
}

impl FakeVerbs {
    /// Carries out `wr` towards QP `dest`; the completion status.
    fn apply(&self, f: &mut Fabric, dest: u32, wr: &SendRequest) -> u32 {
        if f.dead_qpns.contains(&dest) {
            return RETRY_EXC_ERR;
        }
        let Some(dq) = f.qps.values().find(|q| q.qpn == dest && q.state >= 2) else {
            return RETRY_EXC_ERR;
        };
        let dest_recv_cq = dq.recv_cq;
        let len = u64::from(wr.len);
        let Some(_) = find_mr(f, wr.lkey, false, wr.local_addr, len) else {
            return LOC_PROT_ERR;
        };
        let Some(rmr) = find_mr(f, wr.rkey, true, wr.remote_addr, len) else {
            return REM_ACCESS_ERR;
        };
        let need = match wr.op {
            SendOp::FetchAdd(_) => IBV_ACCESS_REMOTE_ATOMIC,
            _ => IBV_ACCESS_REMOTE_WRITE,
        };
        if rmr.access & need == 0 {
            return REM_ACCESS_ERR;
        }
        match wr.op {
            SendOp::Write | SendOp::WriteImm(_) => {
                // SAFETY: both ranges lie inside memory registered (and so kept alive) by the
                // test's ranks, as checked above; they belong to different buffers.
                unsafe {
                    std::ptr::copy(
                        wr.local_addr as *const u8,
                        wr.remote_addr as *mut u8,
                        wr.len as usize,
                    )
                };
            }
            SendOp::FetchAdd(add) => {
                if wr.remote_addr % 8 != 0 || wr.len != 8 {
                    return REM_ACCESS_ERR;
                }
                // SAFETY: an aligned 8-byte location inside registered memory (checked above);
                // other threads touch it only atomically.
                let old = unsafe { AtomicU64::from_ptr(wr.remote_addr as *mut u64) }
                    .fetch_add(add, Ordering::AcqRel);
                // SAFETY: the local range is inside registered memory (checked above).
                unsafe { (wr.local_addr as *mut u64).write_unaligned(old) };
            }
        }
        if let SendOp::WriteImm(imm) = wr.op {
            let Some(dq) = f.qps.values_mut().find(|q| q.qpn == dest) else {
                return RETRY_EXC_ERR;
            };
            let Some(rid) = dq.recvs.pop_front() else {
                return RNR_RETRY_EXC_ERR;
            };
            if let Some(cq) = f.cqs.get_mut(&dest_recv_cq) {
                cq.push_back(Completion {
                    wr_id: rid,
                    status: 0,
                    vendor_err: 0,
                    qp_num: dest,
                    imm: Some(imm),
                });
            }
        }
        0
    }
}
