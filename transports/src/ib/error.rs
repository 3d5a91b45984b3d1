//! How the IB layers word their errors: [`within`] puts what was being done in front of a
//! verbs error. A module of its own because the device, QP and memory layers all use it and
//! `ib/mod.rs` uses them: kept there, each layer would depend on the module that depends on it.

use mscclpp_hal::Error;

/// `e` with `what` (what was being done) in front of its message, keeping its class.
pub(crate) fn within(e: Error, what: impl FnOnce() -> String) -> Error {
    match e {
        Error::Io { context, source } => Error::Io {
            context: format!("{}: {context}", what()),
            source,
        },
        Error::InvalidUsage(m) => Error::InvalidUsage(format!("{}: {m}", what())),
        Error::Unavailable { what: w, reason } => Error::Unavailable {
            what: format!("{} ({w})", what()),
            reason,
        },
        other => other.with_context(what),
    }
}
