//! One order for every launch of a communicator, whatever stream it comes on.
//!
//! The algorithms keep state on the device between calls (LL flags and scratch halves, the
//! point-to-point rounds): two calls of one communicator must never run at the same time, or
//! they read each other's packets and wait for flags that never come. Calls on one stream are
//! ordered by the stream; calls on different streams are not, and callers do use several:
//! PyTorch issues FSDP2's all-gathers and reduce-scatters of one process group on different
//! streams. NCCL orders all work of a communicator, so its users rely on it; so do we.
//!
//! After each launch an event is recorded on its stream; a launch on another stream first makes
//! that stream wait for the event. Consecutive calls on one stream only record (no wait).
//! Captures are left alone: an event recorded outside a capture cannot be waited on inside it,
//! and a captured launch runs when its graph is replayed, in the order the user gives the
//! replays.

use std::sync::{Arc, Mutex};

use mscclpp_hal::{Api, DeviceApi, Result, StreamApi};

/// The last launch of a communicator: its stream and the event recorded behind it.
#[derive(Debug)]
pub(crate) struct LaunchOrder<A: Api> {
    last: Mutex<Last<A>>,
}

impl<A: Api> Default for LaunchOrder<A> {
    fn default() -> Self {
        LaunchOrder {
            last: Mutex::new(Last {
                stream: None,
                event: None,
            }),
        }
    }
}

#[derive(Debug)]
struct Last<A: Api> {
    /// Identity of the stream of the last eager launch (see [`stream_key`]).
    stream: Option<usize>,
    event: Option<Arc<A::Event>>,
}

/// The vendor handle where there is one (the C library wraps the same `cudaStream_t` in a new
/// object each call), else the stream object's address.
fn stream_key<S: StreamApi>(stream: &S) -> usize {
    match stream.native_handle() {
        Some(h) => h as usize,
        None => stream as *const S as *const () as usize,
    }
}

impl<A: Api> LaunchOrder<A> {
    /// Runs `launch` (which enqueues on `stream`) after every earlier launch of this
    /// communicator, on whatever stream they were.
    pub(crate) fn run<T>(
        &self,
        device: &A::Device,
        stream: &A::Stream,
        launch: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        if stream.is_capturing()? {
            return launch();
        }
        let key = stream_key(stream);
        // Held across the launch: launches of one communicator from several threads are
        // ordered as they take the lock.
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(prev), Some(ev)) = (last.stream, &last.event)
            && prev != key
        {
            stream.wait_event(ev)?;
        }
        let out = launch()?;
        let ev = match &last.event {
            Some(ev) => ev.clone(),
            None => {
                let ev = device.create_ordering_event()?;
                last.event = Some(ev.clone());
                ev
            }
        };
        stream.record(&ev)?;
        last.stream = Some(key);
        Ok(out)
    }
}
