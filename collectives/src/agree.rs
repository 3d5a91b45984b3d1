//! The agreement of settings across ranks, which every algorithm's set-up and the windows use.

use mscclpp_comm::Communicator;
use mscclpp_hal::{Error, Result};

/// Checks that every rank has the same `value` of `what`: kernels whose blocks wait for the
/// peers' blocks need the same algorithms and grids everywhere, and a difference would hang them.
/// Every rank gets the error, which names a rank that differs.
pub(crate) fn agree(comm: &Communicator, what: &str, value: String) -> Result<()> {
    let all = comm.bootstrap().all_gather(value.as_bytes())?;
    match all.iter().position(|v| v.as_slice() != value.as_bytes()) {
        None => Ok(()),
        Some(p) => Err(Error::invalid(format!(
            "{what} differ between ranks: rank {} has {value}, rank {p} has {}; every rank must run with the same environment and the same GPU model",
            comm.rank(),
            String::from_utf8_lossy(&all[p])
        ))),
    }
}
