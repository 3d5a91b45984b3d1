//! [`AnyCollectives`]: a communicator's collectives as one trait object over whatever backend
//! they run on, for the front ends that pick the backend at run time (the C library, Python).
//!
//! A call comes in with the run-time stream; [`Api::stream_of`] turns it into the backend's own
//! stream once (one type check), and from there the call runs on [`Collectives<A>`] with the
//! backend's types down to the vendor's launch.

use std::sync::Arc;

use mscclpp_comm::Communicator;
use mscclpp_comm::proxy::ProxyObserver;
use mscclpp_hal::{Api, BufferSlice, DynStream, Result};

use crate::algorithms::id::AlgorithmId;
use crate::algorithms::p2p::P2pOp;
use crate::call::CollectiveCall;
use crate::collectives::Collectives;
use crate::kind::CollectiveKind;
use crate::window::Window;

/// The operations of [`Collectives`] the front ends use, on the run-time stream type (a named
/// collective is a [`CollectiveCall`] given to [`AnyCollectives::run`]).
pub trait AnyCollectives: Send + Sync + std::fmt::Debug {
    /// The backend the collectives run on ([`Api::NAME`]).
    fn backend(&self) -> &'static str;
    /// See [`Collectives::communicator`].
    fn communicator(&self) -> &Arc<Communicator>;
    /// See [`Collectives::run`].
    fn run(&self, call: &CollectiveCall, stream: &DynStream) -> Result<()>;
    /// See [`Collectives::send_recv`].
    fn send_recv(&self, ops: &[P2pOp], stream: &DynStream) -> Result<()>;
    /// See [`Collectives::ordered`]; `enqueue` runs once, unless the stream is refused first.
    fn ordered_dyn(
        &self,
        stream: &DynStream,
        enqueue: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()>;
    /// See [`Collectives::algorithm`].
    fn algorithm(&self, kind: CollectiveKind, block_bytes: u64) -> AlgorithmId;
    /// See [`Collectives::hosts`].
    fn hosts(&self) -> Option<(usize, usize)>;
    /// See [`Collectives::register`].
    fn register(&self, slice: &BufferSlice) -> Result<Window>;
    /// See [`Collectives::register_mapped`].
    fn register_mapped(&self, slice: &BufferSlice, mapped: &[(u64, u64)]) -> Result<Window>;
    /// See [`Collectives::deregister`].
    fn deregister(&self, window: Window) -> Result<()>;
    /// See [`Collectives::zero_copy_calls`].
    fn zero_copy_calls(&self) -> u64;
    /// See [`Collectives::use_short_kernels`].
    fn use_short_kernels(&self, on: bool);
    /// See [`Collectives::observe_proxy`].
    fn observe_proxy(&self, observer: Arc<dyn ProxyObserver>) -> Result<bool>;
}

impl dyn AnyCollectives + '_ {
    /// [`Collectives::ordered`] with a result of any type.
    pub fn ordered<T>(&self, stream: &DynStream, enqueue: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut enqueue = Some(enqueue);
        let mut out = None;
        self.ordered_dyn(stream, &mut || {
            let f = enqueue.take().ok_or_else(|| {
                mscclpp_hal::Error::Internal("an ordered enqueue ran twice".into())
            })?;
            out = Some(f()?);
            Ok(())
        })?;
        out.ok_or_else(|| mscclpp_hal::Error::Internal("an ordered enqueue did not run".into()))
    }
}

impl<A: Api> AnyCollectives for Collectives<A> {
    fn backend(&self) -> &'static str {
        A::NAME
    }

    fn communicator(&self) -> &Arc<Communicator> {
        Collectives::communicator(self)
    }

    fn run(&self, call: &CollectiveCall, stream: &DynStream) -> Result<()> {
        Collectives::run(self, call, A::stream_of(stream)?)
    }

    fn send_recv(&self, ops: &[P2pOp], stream: &DynStream) -> Result<()> {
        Collectives::send_recv(self, ops, A::stream_of(stream)?)
    }

    fn ordered_dyn(
        &self,
        stream: &DynStream,
        enqueue: &mut dyn FnMut() -> Result<()>,
    ) -> Result<()> {
        Collectives::ordered(self, A::stream_of(stream)?, enqueue)
    }

    fn algorithm(&self, kind: CollectiveKind, block_bytes: u64) -> AlgorithmId {
        Collectives::algorithm(self, kind, block_bytes)
    }

    fn hosts(&self) -> Option<(usize, usize)> {
        Collectives::hosts(self)
    }

    fn register(&self, slice: &BufferSlice) -> Result<Window> {
        Collectives::register(self, slice)
    }

    fn register_mapped(&self, slice: &BufferSlice, mapped: &[(u64, u64)]) -> Result<Window> {
        Collectives::register_mapped(self, slice, Some(mapped))
    }

    fn deregister(&self, window: Window) -> Result<()> {
        Collectives::deregister(self, window)
    }

    fn zero_copy_calls(&self) -> u64 {
        Collectives::zero_copy_calls(self)
    }

    fn use_short_kernels(&self, on: bool) {
        Collectives::use_short_kernels(self, on)
    }

    fn observe_proxy(&self, observer: Arc<dyn ProxyObserver>) -> Result<bool> {
        Collectives::observe_proxy(self, observer)
    }
}
