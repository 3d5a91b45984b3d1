//! # mscclpp-collectives — collectives written once against the HAL
//!
//! [`Collectives`] serves all-reduce, all-gather, reduce-scatter, broadcast and all-to-all for
//! the ranks of one node, on whatever backend the communicator's device belongs to: every
//! operation is one kernel, asked of the device by [`KernelId`] (the host backend runs a Rust
//! function, CUDA and HIP compile `kernels/{cuda,hip}/collectives.*`). Nothing here names a
//! vendor.
//!
//! Calls are enqueued on the caller's stream with no host synchronisation inside; the state the
//! kernels keep between calls (flags) lives in device memory and is advanced by the kernels, so
//! calls can be repeated and replayed.
//!
//! Algorithms: today one, the LL-packet algorithm of [`mscclpp_hal::collective`] (data and flag
//! written together into the peers' scratch buffers; no separate signalling), which serves every
//! collective at every size, in rounds when a message exceeds a scratch slot. The bandwidth path
//! for large messages (peer loads/stores of registered buffers) is still to come.

mod context;

pub use context::{Collectives, DEFAULT_SLOT_BYTES};
pub use mscclpp_hal::{CollectiveKind, DataType, KernelId, ReduceOp};
