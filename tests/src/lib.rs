//! # mscclpp-conformance — suites written once, stamped out per backend
//!
//! - [`harness`]: turns a list of cases into one trial per case per backend; absent backends
//!   show their cases as ignored with the reason.
//! - [`hal_suite`]: the HAL conformance cases, and [`kernels`]: the kernel module they launch.
//! - [`multiproc`]: tests that spawn ranks as real processes by re-executing the test binary.
//! - [`rng`]: reproducible random test data.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod devcode;
pub mod hal_suite;
pub mod harness;
pub mod kernels;
pub mod multiproc;
pub mod net_fixture;
pub mod netns;
pub mod reference;
pub mod rng;
