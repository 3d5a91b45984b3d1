//! The algorithms, one folder each, behind one [`Algorithm`] trait, and the list of their kernel
//! modules ([`MODULES`]).
//!
//! An algorithm says which calls it serves here ([`Algorithm::fits`]: its collectives, its
//! sizes, and what it was set up with on this communicator), plans the grid of one call
//! ([`Algorithm::plan`]) and launches its kernel ([`Algorithm::launch`]). Which of the fitting
//! ones serves a call is the policy's choice. Each folder is the home of everything that
//! belongs to its algorithm: its protocol spec (`spec.md`, its module documentation), argument
//! struct (`args.rs`), set-up and planner (`mod.rs`), host kernel (`host.rs`) and the
//! [`KernelModule`] of its device source (`module.rs`). Two sources serve the five algorithms:
//! `kernels/collectives/ll.cuh` (LL, the short LL kernels, LL128; modules in `ll/module.rs`) and
//! `kernels/collectives/direct.cuh` (direct and read; `direct/module.rs`), each compiled as two
//! modules: the base element types' (`ll.cu`, `direct.cu`: f32, f16, bf16, i32, u32), loaded
//! when an algorithm is set up, and the wide types' (`ll_wide.cu`, `direct_wide.cu`: f64, i64,
//! u64, i8, u8, FP8), loaded — compiled, on a GPU — at the first call of such a type
//! ([`LazyKernel`]), so that a process that never uses them never compiles them and the base
//! kernels keep their code and registers. What the host kernels share is in `host_common.rs`.
//!
//! What they all build on — the trait, the plan of a call, the limits, the headers and the lazily
//! loaded kernels — is in `base.rs`, and the names of the algorithms in `id.rs`: both use no
//! algorithm, so this file, which names every algorithm's modules, is used by none of them.
//!
//! [`Algorithm`]: base::Algorithm
//! [`Algorithm::fits`]: base::Algorithm::fits
//! [`Algorithm::plan`]: base::Algorithm::plan
//! [`Algorithm::launch`]: base::Algorithm::launch
//! [`LazyKernel`]: base::LazyKernel

use mscclpp_hal::KernelModule;

pub(crate) mod base;
pub(crate) mod ce;
pub(crate) mod direct;
pub(crate) mod hier;
pub(crate) mod host_common;
pub(crate) mod id;
#[cfg(test)]
mod layout;
pub(crate) mod ll;
pub(crate) mod ll128;
pub(crate) mod ll_short;
pub(crate) mod p2p;
pub(crate) mod read;

/// Every kernel module of the collectives: what the kernel compile tests compile for every
/// target.
pub static MODULES: &[&KernelModule] = &[
    &ll::module::MODULE,
    &ll::module::WIDE_MODULE,
    &direct::module::MODULE,
    &direct::module::WIDE_MODULE,
    &p2p::MODULE,
    &crate::scale::SCALE_MODULE,
    &hier::MODULE,
    &ce::reduce::MODULE,
    &crate::moe::MODULE,
];
