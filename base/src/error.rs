//! Typed errors shared by every layer of mscclpp-rs.
//!
//! Each error belongs to a [`ErrorClass`] so that callers (and the C library, which maps
//! classes onto NCCL result codes) can tell the user's mistake from the system's and ours.
//! Messages name what was expected and what was found.

use std::time::Duration;

/// Who is to blame for an error, coarsely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorClass {
    /// The caller passed something wrong (bad size, bad rank, bad handle, bad config).
    InvalidUsage,
    /// The operating system, driver or network failed.
    System,
    /// A peer misbehaved: died, refused us, or sent bytes that do not decode.
    Remote,
    /// A wait ran past its deadline.
    Timeout,
    /// What was asked for is not present on this machine (library, device, feature).
    Unavailable,
    /// A bug in mscclpp-rs.
    Internal,
}

/// The error type of every fallible mscclpp-rs call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The caller passed something wrong.
    #[error("invalid usage: {0}")]
    InvalidUsage(String),

    /// A backend, library, device or capability is not present.
    #[error("{what} not available: {reason}")]
    Unavailable {
        /// What was looked for (`"cuda backend"`, `"multicast"`, ...).
        what: String,
        /// Why it is absent, with the paths or versions that were tried.
        reason: String,
    },

    /// An operating-system call failed.
    #[error("{context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A vendor driver or runtime call returned an error code.
    #[error("{backend} call {call} failed with code {code}: {message}")]
    Driver {
        /// `"cuda"` or `"rocm"`.
        backend: &'static str,
        /// The API function.
        call: &'static str,
        /// The raw status code.
        code: i64,
        /// The vendor's description of the code, if it gave one.
        message: String,
    },

    /// A wait did not finish in time.
    #[error("timed out after {after:?} waiting for {waiting_for}")]
    Timeout {
        /// What the wait was for, naming ranks where there are some.
        waiting_for: String,
        /// The deadline that passed.
        after: Duration,
    },

    /// A peer failed, refused us or went away.
    #[error("{}: {message}", describe_rank(*rank))]
    Remote {
        /// The peer's rank (or `usize::MAX` when it is not known yet).
        rank: usize,
        /// What happened.
        message: String,
    },

    /// Bytes that crossed a process boundary did not decode.
    #[error("malformed {what}: {why}")]
    Malformed {
        /// Which encoding (`"bootstrap frame"`, `"IPC handle"`, ...).
        what: &'static str,
        /// What was wrong with it.
        why: String,
    },

    /// A bug in mscclpp-rs; please report it.
    #[error("internal error: {0}")]
    Internal(String),
}

impl Error {
    /// The class this error belongs to.
    pub fn class(&self) -> ErrorClass {
        match self {
            Error::InvalidUsage(_) => ErrorClass::InvalidUsage,
            Error::Unavailable { .. } => ErrorClass::Unavailable,
            Error::Io { .. } | Error::Driver { .. } => ErrorClass::System,
            Error::Timeout { .. } => ErrorClass::Timeout,
            Error::Remote { .. } | Error::Malformed { .. } => ErrorClass::Remote,
            Error::Internal(_) => ErrorClass::Internal,
        }
    }

    /// Appends `context` (what was being done) to the message of a driver error; other errors
    /// pass through unchanged.
    pub fn with_context(self, context: impl FnOnce() -> String) -> Self {
        match self {
            Error::Driver {
                backend,
                call,
                code,
                message,
            } => Error::Driver {
                backend,
                call,
                code,
                message: format!("{message} ({})", context()),
            },
            other => other,
        }
    }

    /// Shorthand for [`Error::InvalidUsage`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::InvalidUsage(msg.into())
    }

    /// Shorthand for [`Error::Unavailable`].
    pub fn unavailable(what: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Unavailable {
            what: what.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            context: context.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Malformed`].
    pub fn malformed(what: &'static str, why: impl Into<String>) -> Self {
        Error::Malformed {
            what,
            why: why.into(),
        }
    }
}

fn describe_rank(rank: usize) -> String {
    if rank == usize::MAX {
        "peer of unknown rank".to_owned()
    } else {
        format!("rank {rank}")
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// An error and its chain of sources on one line (`outer: inner: innermost`), for errors of
/// other libraries whose `Display` leaves the cause out.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn context_is_appended_to_driver_errors_only() {
        let e = Error::Driver {
            backend: "cuda",
            call: "cuMemAlloc_v2",
            code: 2,
            message: "out of memory".into(),
        }
        .with_context(|| "allocating 64 bytes".into());
        assert_eq!(
            e.to_string(),
            "cuda call cuMemAlloc_v2 failed with code 2: out of memory (allocating 64 bytes)"
        );
        let e = Error::invalid("bad").with_context(|| unreachable!("not asked for"));
        assert_eq!(e.to_string(), Error::invalid("bad").to_string());
    }
}
