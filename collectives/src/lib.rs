//! # mscclpp-collectives — collectives written once against the HAL
//!
//! Allreduce, allgather, reduce-scatter, broadcast and all-to-all, each algorithm declaring the
//! collective, sizes, rank counts and capabilities it targets and the kernel ids it launches.
//! Nothing here names a vendor. The algorithms arrive with the collectives issue; this crate
//! holds the place in the dependency order `collectives → comm → transports → hal`.
#![deny(unsafe_op_in_unsafe_fn)]
