//! The real NCCL named by `MSCCLPP_NCCL_LIB_PATH`, for the operations this library does not
//! serve itself; the binding is `mscclpp-nccl-real`'s, shared with the benchmark. This library
//! still never forwards `ncclBcast` (it forwards `ncclBroadcast(buff, buff, ...)`), and every
//! export checks that a communicator handle is one of ours, so a stray call with a real handle
//! fails cleanly instead of crashing.

use std::sync::OnceLock;

pub use mscclpp_nccl_real::RealNccl;

use crate::abi::{NCCL_SUCCESS, NcclResult};
use crate::error::{Failure, Res};

/// The real NCCL's results as this library's: its own codes, with its last-error text.
pub trait RealResults {
    /// Turns a real NCCL result into ours.
    fn check(&self, call: &str, r: NcclResult) -> Res<()>;
    /// An entry point, or `ncclInvalidUsage` naming it when this NCCL lacks it.
    fn need<T: Copy>(&self, f: Option<T>, name: &str) -> Res<T>;
}

impl RealResults for RealNccl {
    fn check(&self, call: &str, r: NcclResult) -> Res<()> {
        if r == NCCL_SUCCESS {
            return Ok(());
        }
        Err(Failure {
            code: r,
            message: format!(
                "real NCCL ({}) {call} failed with {r}: {}",
                self.path,
                self.describe(r)
            ),
        })
    }

    fn need<T: Copy>(&self, f: Option<T>, name: &str) -> Res<T> {
        f.ok_or_else(|| {
            Failure::usage(format!(
                "the real NCCL at {} (version {}) has no {name}",
                self.path, self.version
            ))
        })
    }
}

/// The real NCCL named by `MSCCLPP_NCCL_LIB_PATH`, opened on first use: `Ok(None)` when the
/// variable is unset; the error when it is set but the library does not open (or is this one).
pub fn real() -> Res<Option<&'static RealNccl>> {
    static REAL: OnceLock<Res<Option<RealNccl>>> = OnceLock::new();
    REAL.get_or_init(|| match mscclpp_nccl_real::env_path() {
        None => Ok(None),
        Some(path) => {
            let purpose = format!("{}={path}", mscclpp_nccl_real::LIB_PATH_VAR);
            Ok(Some(RealNccl::open(&path, &purpose)?))
        }
    })
    .as_ref()
    .map(Option::as_ref)
    .map_err(Clone::clone)
}

/// What to say when an operation needs the real NCCL and there is none.
pub fn no_real(what: &str) -> Failure {
    Failure::usage(format!(
        "{what} is not served by mscclpp and no real NCCL is loaded for fallback: set MSCCLPP_NCCL_LIB_PATH to the path of libnccl.so.2"
    ))
}
