//! Streams (in-order queues of device work) and events (markers in a stream).

use std::fmt;
use std::time::Duration;

use crate::error::Result;
use crate::kernel::{Kernel, KernelArgs, LaunchConfig};
use crate::memory::BufferSlice;

/// The stream a call comes in on when the backend is chosen at run time: `dyn Stream + 'static`
/// (what an `Arc<dyn Stream>` holds). A bare `&dyn Stream` parameter is `&'a (dyn Stream + 'a)`,
/// too short to be turned back into a backend's own stream ([`crate::Api::stream_of`]).
pub type DynStream = dyn Stream;

/// An in-order queue of device work.
///
/// Operations return once enqueued unless documented otherwise. An operation that fails while
/// running makes the stream's next [`Stream::synchronize`] return that error (errors are
/// sticky, as on GPUs).
pub trait Stream: Send + Sync + fmt::Debug {
    /// Copies `src` into `dst`; the lengths must be equal. Either may be an imported mapping
    /// of another process's memory.
    fn copy(&self, dst: &BufferSlice, src: &BufferSlice) -> Result<()>;

    /// Sets every byte of `dst` to `value`.
    fn fill(&self, dst: &BufferSlice, value: u8) -> Result<()>;

    /// Stores `value` into the 8 bytes of `dst` (8-byte aligned) as one atomic store that is
    /// ordered after all earlier work on the stream (`cuStreamWriteValue64` on CUDA): how a
    /// token or flag is published behind the data it guards.
    fn write_value64(&self, dst: &BufferSlice, value: u64) -> Result<()>;

    /// Makes later work on this stream wait until the 8-byte word at `flag` (8-byte aligned)
    /// satisfies `cmp` against `value` (`cuStreamWaitValue64`, `hipStreamWaitValue64`): how a
    /// stream waits for a flag another process's stream publishes with
    /// [`Stream::write_value64`], with no kernel. Capturable in a graph where the backend
    /// captures. The host backend's wait polls the launching thread's abort word and ends with
    /// a timeout error after [`crate::dev::DEFAULT_WAIT`]; a GPU's waits as long as the stream
    /// does (its deadline is the caller's [`Stream::synchronize_timeout`]).
    fn wait_value64(&self, flag: &BufferSlice, value: u64, cmp: WaitCmp) -> Result<()> {
        let _ = (flag, value, cmp);
        Err(crate::Error::unavailable(
            "stream wait on a value",
            "this backend's streams cannot wait on a memory word",
        ))
    }

    /// Copies host bytes into `dst` (lengths equal); returns once the copy has completed.
    fn write_from_host(&self, dst: &BufferSlice, src: &[u8]) -> Result<()>;

    /// Copies `src` into host bytes (lengths equal); returns once the copy has completed.
    fn read_to_host(&self, dst: &mut [u8], src: &BufferSlice) -> Result<()>;

    /// Enqueues a kernel with raw argument bytes (the bytes of one `#[repr(C)]` struct).
    ///
    /// # Safety
    /// Device addresses inside `args` must refer to memory that stays allocated until the
    /// kernel has run and that the kernel may access as it is written to. On the host backend a
    /// kernel dereferences them in this process.
    unsafe fn launch_raw(&self, kernel: &dyn Kernel, cfg: LaunchConfig, args: &[u8]) -> Result<()>;

    /// Marks `event` as reached once all work enqueued so far has completed.
    fn record(&self, event: &dyn Event) -> Result<()>;

    /// Makes later work on this stream wait until `event` (as last recorded) is reached.
    fn wait_event(&self, event: &dyn Event) -> Result<()>;

    /// Waits until all enqueued work has completed, at most `timeout`; returns the first error
    /// any of it raised.
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()>;

    /// Waits until all enqueued work has completed (deadline: one hour, far beyond any
    /// legitimate wait; use [`Stream::synchronize_timeout`] to choose).
    fn synchronize(&self) -> Result<()> {
        self.synchronize_timeout(Duration::from_secs(3600))
    }

    /// Starts capturing: work enqueued on this stream from now on is recorded into a graph
    /// instead of running (CUDA graphs; the host backend records its operations). Blocking
    /// operations (`write_from_host`, `read_to_host`, `synchronize*`) are errors while capturing.
    fn begin_capture(&self) -> Result<()> {
        Err(crate::Error::unavailable(
            "graph capture",
            "this backend does not capture streams into graphs",
        ))
    }

    /// Ends the capture started by [`Stream::begin_capture`] and returns the recorded work.
    fn end_capture(&self) -> Result<Box<dyn Graph>> {
        Err(crate::Error::unavailable(
            "graph capture",
            "this backend does not capture streams into graphs",
        ))
    }

    /// Whether work enqueued now would be recorded into a graph rather than run: a capture
    /// begun through [`Stream::begin_capture`] or, on GPUs, by another library on the same
    /// vendor stream (PyTorch's `torch.cuda.graph`).
    fn is_capturing(&self) -> Result<bool> {
        Ok(false)
    }

    /// Whether the device under this stream was reset by someone else (the application's
    /// `cudaDeviceReset` while our objects live, as nccl-tests does before exiting): work
    /// enqueued now would reach freed driver state. The library's own threads that act on a
    /// stream without a caller (the release after a peer's death) check it first and stand
    /// down. Never lost on the host backend.
    fn device_lost(&self) -> bool {
        false
    }

    /// The vendor's handle of the stream (`CUstream`, `hipStream_t`) as an integer, for vendor
    /// libraries used beside the HAL on the same stream (NCCL as a baseline or fallback);
    /// `None` on the host backend.
    fn native_handle(&self) -> Option<u64> {
        None
    }

    /// Records the caller's event `native` (`CUevent`, `hipEvent_t` as an integer) on this
    /// stream at this point of its order: what NCCL's `launchCompletionEvent` asks of a call.
    /// `Unavailable` on the host backend (no native events).
    ///
    /// # Safety
    /// `native` is a live event of the stream's device that outlives the recording.
    unsafe fn record_native_event(&self, native: u64) -> Result<()> {
        let _ = native;
        Err(crate::Error::unavailable(
            "recording a native event",
            "this backend has no native events",
        ))
    }

    /// Backend-specific access for downcasting.
    fn as_any(&self) -> &dyn std::any::Any;
}

impl dyn Stream {
    /// Enqueues a kernel with a typed argument struct.
    ///
    /// # Safety
    /// As for [`Stream::launch_raw`].
    pub unsafe fn launch<A: KernelArgs>(
        &self,
        kernel: &dyn Kernel,
        cfg: LaunchConfig,
        args: &A,
    ) -> Result<()> {
        // SAFETY: forwarded contract.
        unsafe { self.launch_raw(kernel, cfg, args.as_bytes()) }
    }
}

/// How [`Stream::wait_value64`] compares the word it polls with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WaitCmp {
    /// Until `word >= value` (the vendors compare cyclically: `(i64)(word - value) >= 0`, which
    /// is the same for counters far from wrapping).
    Geq,
    /// Until `word == value`.
    Eq,
}

impl WaitCmp {
    /// Whether `word` satisfies the comparison with `value` (as the GPUs evaluate it).
    pub fn holds(self, word: u64, value: u64) -> bool {
        match self {
            WaitCmp::Geq => (word.wrapping_sub(value) as i64) >= 0,
            WaitCmp::Eq => word == value,
        }
    }
}

/// A point in a stream that other streams and the host can wait for.
pub trait Event: Send + Sync + fmt::Debug {
    /// Whether the last recording has been reached (true if never recorded).
    fn query(&self) -> Result<bool>;

    /// Waits until the last recording has been reached, at most `timeout`.
    fn synchronize_timeout(&self, timeout: Duration) -> Result<()>;

    /// Milliseconds from `start` (recorded earlier) to this event; both must have been reached.
    fn elapsed_ms_since(&self, start: &dyn Event) -> Result<f64>;

    /// Backend-specific access for downcasting.
    fn as_any(&self) -> &dyn std::any::Any;
}

/// Work recorded from a stream, replayable as a whole (a CUDA graph).
///
/// Replays see the device memory as it is when they run: kernels that keep state in device
/// memory (flags, sequence numbers) advance it on every replay, which is what makes the library's
/// collectives correct under replay. A graph keeps alive every buffer its work uses.
pub trait Graph: Send + Sync + fmt::Debug {
    /// Enqueues one replay of the recorded work on `stream` (of the device it was captured on).
    fn launch(&self, stream: &dyn Stream) -> Result<()>;
}
