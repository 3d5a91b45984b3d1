//! # mscclpp-collectives — collectives written once against the HAL
//!
//! [`Collectives`] serves all-reduce, all-gather, reduce-scatter, broadcast and all-to-all for
//! the ranks of one node — and, through the hierarchical family (`algorithms/hier/`: the
//! single-host algorithms within each host, port channels between hosts), for communicators that
//! span hosts — on whatever backend the communicator's device belongs to: every
//! operation is one kernel of a [`KernelModule`] this crate owns ([`MODULES`]: the device
//! sources `kernels/collectives/{ll,direct}.cu`, which CUDA and HIP compile, and the Rust host
//! kernels the host backend runs). Nothing here names a vendor. Every caller describes a call
//! as a [`CollectiveCall`] and enqueues it with [`Collectives::run`].
//!
//! Calls are enqueued on the caller's stream with no host synchronisation inside; the state the
//! kernels keep between calls (flags) lives in device memory and is advanced by the kernels, so
//! calls can be repeated and replayed.
//!
//! Layout: `algorithms/<name>/` holds each algorithm (LL packets, the short LL kernels, LL128
//! lines, direct stores, remote reads: see [`AlgorithmId`]) with everything that belongs to it:
//! its protocol spec (`spec.md`), argument struct (`args.rs`, mirrored in
//! `kernels/collectives/args.cuh`), planner, host kernel (`host.rs`) and the module of its
//! device source (`module.rs`; the LL kernels share one, as do direct and read); `policy` chooses among them by
//! collective and size, overridable by `MSCCLPP_ALGO_<COLLECTIVE>=auto|ll|direct` (and `ll128`,
//! `read` for all-reduce); `scratch` holds the buffers every peer maps; `window` the buffers
//! registered with [`Collectives::register`]. Registration is optional: LL and direct move data
//! through the communicator's own scratch, so calls may use any buffers, different on every
//! call.

#![deny(unsafe_op_in_unsafe_fn)]

mod agree;
mod algorithms;
mod call;
mod collectives;
mod erased;
mod kind;
pub mod moe;
mod order;
mod policy;
mod scale;
mod scratch;
mod window;

pub use algorithms::MODULES;
pub use algorithms::base::MAX_RANKS;
pub use algorithms::id::AlgorithmId;
pub use algorithms::p2p::{P2pKind, P2pOp};
pub use call::CollectiveCall;
pub use collectives::{Collectives, DEFAULT_SLOT_BYTES, check_env};
pub use erased::AnyCollectives;
pub use kind::CollectiveKind;
pub use mscclpp_hal::{DataType, KernelId, KernelModule, ReduceOp};
pub use scale::{Factor, SCALE_MODULE, ScaleArgs, Scaler};
pub use window::Window;
