//! # mscclpp-perf — the benchmark tool's library half
//!
//! What the `mscclpp-perf` binary and the channel examples (`perf/examples/`) share, kept out of
//! the `mscclpp` facade so that a user of the library does not carry benchmark kernels or a
//! process launcher:
//!
//! - [`bench_kernels`]: the channel benchmark and example kernels (memory-channel put,
//!   port-channel put, ping-pong), a [`mscclpp::hal::KernelModule`] with host versions;
//! - [`bench_compute`]: the GEMM-like compute load of `mscclpp-perf overlap`;
//! - [`launch`]: how ranks come to be — from mpirun/torchrun/srun, or spawned by the program
//!   itself when run standalone.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod bench_compute;
pub mod bench_kernels;
pub mod launch;
