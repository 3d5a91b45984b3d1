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
//! Algorithms (see [`mscclpp_hal::collective`]):
//! - **LL packets** (data and flag written together into the peers' scratch buffers; no separate
//!   signalling): every collective at every size, in rounds when a message exceeds a slot; chosen
//!   for small messages.
//! - **Direct**: plain 16-byte stores into the peers' scratch, pipelined in chunks with per-block
//!   flags, the next chunk pushed while this one is consumed; every collective (all-reduce as
//!   reduce-scatter then all-gather); chosen from 2 MiB per rank block (broadcast 512 KiB,
//!   all-to-all 1 MiB).
//!
//! - **LL128 lines** (all-reduce of one round): the LL scheme with 120 data bytes and one flag
//!   word per 128-byte line, written and read by eight threads at once; chosen for 256 KiB to
//!   1.875 MiB on devices whose `Capabilities::ll128` says such lines arrive whole (NVIDIA
//!   over NVLink; the host), and on GPUs only for two ranks on their own devices (the measured
//!   case; 4 ranks on 2 GPUs once saw a torn line).
//! - **Read** (all-reduce only): every rank reads the peers' inputs where they lie and reduces
//!   locally — in place in buffers registered with [`Collectives::register`] (the IPC mappings
//!   are made once, at registration), else from a staging copy. Ranks may differ in whether
//!   their input is registered: each tells the others in the call. Served only when forced
//!   (`MSCCLPP_ALGO_ALLREDUCE=read`): on 2 x H200 it did not beat LL or direct at any size.
//!
//! `MSCCLPP_ALGO_<COLLECTIVE>=auto|ll|direct` (and `ll128`, `read` for all-reduce; e.g.
//! `MSCCLPP_ALGO_ALLREDUCE=ll`) overrides the choice per collective. Registration is optional:
//! LL and direct move data through the communicator's own scratch, so calls may use any
//! buffers, different on every call.

mod context;

pub use context::{Algorithm, Collectives, DEFAULT_SLOT_BYTES, Window};
pub use mscclpp_hal::{CollectiveKind, DataType, KernelId, ReduceOp};
