//! # mscclpp-executor — runs MSCCL++ execution plans
//!
//! MSCCL++ users write collectives in its Python DSL (`mscclpp.language`), which emits a JSON
//! execution plan. This crate reads such plans ([`plan`]), lays each rank's part out as a
//! device-visible flattened plan ([`flat`]), and runs it with one interpreter kernel
//! ([`kernel`]) over the same channels as the library's collectives ([`Executor`]).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod executor;
pub mod flat;
pub mod kernel;
#[cfg(test)]
mod layout;
pub mod plan;
#[cfg(feature = "testgen")]
pub mod testgen;

pub use executor::Executor;
pub use plan::{BufferType, ChannelType, OpKind, Plan, Protocol};
