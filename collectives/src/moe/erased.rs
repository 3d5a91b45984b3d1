//! [`AnyMoe`]: an expert-parallel exchange as one trait object over whatever backend it runs on,
//! for the front ends that pick the backend at run time (Python, the C library). A call comes
//! in with the run-time stream; [`Api::stream_of`] turns it into the backend's once, and the call
//! runs on [`Moe<A>`] with the backend's types.

use mscclpp_hal::{Api, BufferSlice, DynStream, Result};

use super::{
    Combine, Dispatch, ExpertMajor, ExpertMajorIn, Halves, LayoutOut, Moe, MoeConfig, Received,
};

/// The operations of [`Moe`] on the run-time stream type.
pub trait AnyMoe: Send + Sync + std::fmt::Debug {
    /// The backend it runs on ([`Api::NAME`]).
    fn backend(&self) -> &'static str;
    /// See [`Moe::config`].
    fn config(&self) -> &MoeConfig;
    /// See [`Moe::local_experts`].
    fn local_experts(&self) -> usize;
    /// See [`Moe::handle_bytes`].
    fn handle_bytes(&self) -> usize;
    /// See [`Moe::handle_positions_at`].
    fn handle_positions_at(&self) -> usize;
    /// See [`Moe::slots_bytes`].
    fn slots_bytes(&self) -> usize;
    /// See [`Moe::expert_major`].
    fn expert_major(&self) -> Result<()>;
    /// See [`Moe::layout`].
    ///
    /// # Safety
    /// As [`Moe::layout`].
    unsafe fn layout(
        &self,
        topk_idx: &BufferSlice,
        tokens: usize,
        out: &LayoutOut,
        stream: &DynStream,
    ) -> Result<()>;
    /// See [`Moe::dispatch`].
    ///
    /// # Safety
    /// As [`Moe::dispatch`].
    unsafe fn dispatch(&self, d: &Dispatch, stream: &DynStream) -> Result<()>;
    /// See [`Moe::combine`].
    ///
    /// # Safety
    /// As [`Moe::combine`].
    unsafe fn combine(&self, c: &Combine, stream: &DynStream) -> Result<()>;
    /// See [`Moe::dispatch_with`].
    ///
    /// # Safety
    /// As [`Moe::dispatch_with`].
    unsafe fn dispatch_with(
        &self,
        d: &Dispatch,
        halves: Halves,
        em: Option<&ExpertMajor>,
        stream: &DynStream,
    ) -> Result<()>;
    /// See [`Moe::combine_with`].
    ///
    /// # Safety
    /// As [`Moe::combine_with`].
    unsafe fn combine_with(
        &self,
        c: &Combine,
        halves: Halves,
        em: Option<&ExpertMajorIn>,
        stream: &DynStream,
    ) -> Result<()>;
    /// See [`Moe::read_handle`].
    fn read_handle(&self, handle: &BufferSlice, stream: &DynStream) -> Result<Received>;
}

impl<A: Api> AnyMoe for Moe<A> {
    fn backend(&self) -> &'static str {
        A::NAME
    }

    fn config(&self) -> &MoeConfig {
        Moe::config(self)
    }

    fn local_experts(&self) -> usize {
        Moe::local_experts(self)
    }

    fn handle_bytes(&self) -> usize {
        Moe::handle_bytes(self)
    }

    fn handle_positions_at(&self) -> usize {
        Moe::handle_positions_at(self)
    }

    fn slots_bytes(&self) -> usize {
        Moe::slots_bytes(self)
    }

    fn expert_major(&self) -> Result<()> {
        Moe::expert_major(self)
    }

    unsafe fn layout(
        &self,
        topk_idx: &BufferSlice,
        tokens: usize,
        out: &LayoutOut,
        stream: &DynStream,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Moe::layout(self, topk_idx, tokens, out, A::stream_of(stream)?) }
    }

    unsafe fn dispatch(&self, d: &Dispatch, stream: &DynStream) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Moe::dispatch(self, d, A::stream_of(stream)?) }
    }

    unsafe fn combine(&self, c: &Combine, stream: &DynStream) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Moe::combine(self, c, A::stream_of(stream)?) }
    }

    unsafe fn dispatch_with(
        &self,
        d: &Dispatch,
        halves: Halves,
        em: Option<&ExpertMajor>,
        stream: &DynStream,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Moe::dispatch_with(self, d, halves, em, A::stream_of(stream)?) }
    }

    unsafe fn combine_with(
        &self,
        c: &Combine,
        halves: Halves,
        em: Option<&ExpertMajorIn>,
        stream: &DynStream,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { Moe::combine_with(self, c, halves, em, A::stream_of(stream)?) }
    }

    fn read_handle(&self, handle: &BufferSlice, stream: &DynStream) -> Result<Received> {
        Moe::read_handle(self, handle, A::stream_of(stream)?)
    }
}
