//! Completions: polling a CQ and turning a failed work completion into an error that names the
//! peer rank.

use mscclpp_hal::{Error, Result};

use super::qp::Qp;
use super::verbs::Completion;

/// `IBV_WC_WR_FLUSH_ERR`: work flushed after an earlier error broke the QP.
const WR_FLUSH_ERR: u32 = 5;

/// Polls `qp`'s send CQ once: the number of successful completions, or the first failure as
/// [`Error::Remote`] naming `peer`.
pub(crate) fn poll_send(
    qp: &Qp,
    peer: usize,
    max: usize,
    buf: &mut Vec<Completion>,
) -> Result<u64> {
    buf.clear();
    let n = qp.dev.verbs.poll_cq(qp.send_cq, max, buf)?;
    let mut ok = 0;
    for c in &buf[..n] {
        if c.status != 0 {
            return Err(completion_error(qp, peer, c));
        }
        ok += 1;
    }
    Ok(ok)
}

/// The error for a failed completion: the peer rank, the device, the QP and the status.
pub(crate) fn completion_error(qp: &Qp, peer: usize, c: &Completion) -> Error {
    let dev = &qp.dev;
    let hint = match c.status {
        WR_FLUSH_ERR => "an earlier request on this QP failed",
        10 => "the peer refused the access (memory key or range wrong, or memory deregistered)",
        12 | 13 => "the peer stopped answering (dead process, or link down)",
        4 | 8 => "the local memory key or range is wrong",
        _ => "see the status",
    };
    Error::Remote {
        rank: peer,
        message: format!(
            "IB work completion failed on IB{} ({} port {}) QP {} to rank {peer}: {} (status {}, vendor error {:#x}, request {}); {hint}",
            dev.index,
            dev.name,
            dev.port,
            qp.info.qpn,
            dev.verbs.status_str(c.status),
            c.status,
            c.vendor_err,
            c.wr_id
        ),
    }
}
