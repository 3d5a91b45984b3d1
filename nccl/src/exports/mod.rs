//! NCCL 2.28's C API and this library's own exports, one module per part of `nccl.h`. The crate
//! root re-exports every function, so Rust callers keep the paths `mscclpp_nccl::ncclXxx`; a
//! `#[unsafe(no_mangle)]` function is the cdylib's symbol whichever module holds it. The exports
//! NCCL added later are in `exports_229`.

pub(crate) mod collectives;
mod comms;
mod groups;
mod memory;
mod registration;
mod user_ops;
mod version;

pub use collectives::*;
pub use comms::*;
pub use groups::*;
pub use memory::*;
pub use registration::*;
pub use user_ops::*;
pub use version::*;
