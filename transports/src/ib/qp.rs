//! RC queue pairs: creation (RESET→INIT with the endpoint), the address exchanged through the
//! bootstrap inside the endpoint ([`QpInfo`]), and INIT→RTR→RTS once the peer's is known.

use std::sync::Arc;

use mscclpp_hal::wire::{Reader, Writer};
use mscclpp_hal::{Error, Result};

use super::device::IbDevice;
use super::ffi;
use super::verbs::{Handle, RtrParams, Transition};

/// What a peer needs to reach a QP: its number, its first PSN and its port's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpInfo {
    /// QP number.
    pub qpn: u32,
    /// First packet sequence number it sends.
    pub psn: u32,
    /// LID of its port (InfiniBand).
    pub lid: u16,
    /// GID of its port (RoCE, routed IB).
    pub gid: [u8; 16],
    /// Active MTU enum of its port.
    pub mtu: u8,
    /// Whether its port is RoCE (addressed by GID).
    pub roce: bool,
    /// Whether it takes atomics (false in no-atomic mode).
    pub atomics: bool,
}

impl QpInfo {
    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u32(self.qpn)
            .u32(self.psn)
            .u16(self.lid)
            .raw(&self.gid)
            .u8(self.mtu)
            .u8(u8::from(self.roce) | (u8::from(self.atomics) << 1));
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<QpInfo> {
        let qpn = r.u32()?;
        let psn = r.u32()?;
        let lid = r.u16()?;
        let gid = r.array::<16>()?;
        let mtu = r.u8()?;
        let flags = r.u8()?;
        if qpn == 0 || qpn >= 1 << 24 || psn >= 1 << 24 || !(1..=5).contains(&mtu) || flags > 3 {
            return Err(Error::malformed(
                "endpoint",
                format!("IB QP info: QPN {qpn}, PSN {psn}, MTU code {mtu}, flags {flags}"),
            ));
        }
        Ok(QpInfo {
            qpn,
            psn,
            lid,
            gid,
            mtu,
            roce: flags & 1 != 0,
            atomics: flags & 2 != 0,
        })
    }
}

/// An RC QP with its send CQ and receive CQ.
pub(crate) struct Qp {
    pub(crate) dev: Arc<IbDevice>,
    pub(crate) qp: Handle,
    pub(crate) send_cq: Handle,
    pub(crate) recv_cq: Handle,
    pub(crate) gid_index: u8,
    pub(crate) info: QpInfo,
}

impl std::fmt::Debug for Qp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qp")
            .field("device", &self.dev.name)
            .field("qpn", &self.info.qpn)
            .finish()
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        let v = &self.dev.verbs;
        v.destroy_qp(self.qp);
        v.destroy_cq(self.send_cq);
        v.destroy_cq(self.recv_cq);
    }
}

/// Access a QP grants its peer: writes always, atomics unless in no-atomic mode.
pub(crate) fn remote_access(atomics: bool) -> i32 {
    let base = ffi::IBV_ACCESS_REMOTE_WRITE | ffi::IBV_ACCESS_LOCAL_WRITE;
    if atomics {
        base | ffi::IBV_ACCESS_REMOTE_READ | ffi::IBV_ACCESS_REMOTE_ATOMIC
    } else {
        base
    }
}

impl Qp {
    /// Creates a QP in INIT on `dev`'s port.
    pub(crate) fn create(
        dev: &Arc<IbDevice>,
        gid_index: u8,
        cq_size: u32,
        max_send_wr: u32,
        max_recv_wr: u32,
        atomics: bool,
        psn: u32,
    ) -> Result<Qp> {
        let v = &dev.verbs;
        let gid = dev.gid(gid_index)?;
        let send_cq = v.create_cq(dev.ctx, cq_size)?;
        let recv_cq = match v.create_cq(dev.ctx, max_recv_wr.max(1)) {
            Ok(c) => c,
            Err(e) => {
                v.destroy_cq(send_cq);
                return Err(e);
            }
        };
        let (qp, qpn) = match v.create_qp(dev.pd, send_cq, recv_cq, max_send_wr, max_recv_wr) {
            Ok(q) => q,
            Err(e) => {
                v.destroy_cq(send_cq);
                v.destroy_cq(recv_cq);
                return Err(e);
            }
        };
        let qp = Qp {
            dev: dev.clone(),
            qp,
            send_cq,
            recv_cq,
            gid_index,
            info: QpInfo {
                qpn,
                psn: psn & 0xff_ffff,
                lid: dev.lid,
                gid,
                mtu: dev.mtu.clamp(1, 5) as u8,
                roce: dev.roce,
                atomics,
            },
        };
        v.modify_qp(
            qp.qp,
            Transition::Init {
                port: dev.port,
                access: remote_access(atomics),
            },
        )?;
        Ok(qp)
    }

    /// INIT→RTR→RTS towards `remote` (rank `peer`).
    pub(crate) fn connect(&self, remote: &QpInfo, peer: usize) -> Result<()> {
        if remote.roce != self.info.roce {
            return Err(Error::invalid(format!(
                "rank {peer}'s IB port is {} and this rank's is {}: both ends of an IB connection must be on the same kind of fabric",
                if remote.roce { "RoCE" } else { "InfiniBand" },
                if self.info.roce { "RoCE" } else { "InfiniBand" }
            )));
        }
        if remote.atomics != self.info.atomics {
            return Err(Error::invalid(format!(
                "rank {peer} asked for IB {} mode and this rank for {}: set ib_no_atomic alike on both",
                if remote.atomics {
                    "atomic"
                } else {
                    "no-atomic"
                },
                if self.info.atomics {
                    "atomic"
                } else {
                    "no-atomic"
                }
            )));
        }
        let v = &self.dev.verbs;
        let ctx = |e: Error| {
            super::error::within(e, || {
                format!(
                    "connecting QP {} to rank {peer}'s QP {}",
                    self.info.qpn, remote.qpn
                )
            })
        };
        v.modify_qp(
            self.qp,
            Transition::Rtr(RtrParams {
                port: self.dev.port,
                gid_index: self.gid_index,
                mtu: u32::from(remote.mtu.min(self.info.mtu)),
                dest_qpn: remote.qpn,
                rq_psn: remote.psn,
                dlid: remote.lid,
                dgid: remote.gid,
                global: remote.roce,
                atomics: self.info.atomics,
            }),
        )
        .map_err(ctx)?;
        v.modify_qp(
            self.qp,
            Transition::Rts {
                sq_psn: self.info.psn,
                atomics: self.info.atomics,
            },
        )
        .map_err(ctx)
    }
}
