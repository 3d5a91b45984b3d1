//! The vendor table: what a GPU runtime must offer for [`crate::GpuBackend`] to run on it.
//!
//! Every method is one raw call (or the few calls one vendor needs for one step, such as ROCm's
//! retry of an IPC flag value): no keep-alive, no waiting, no caching, no checks of HAL objects.
//! Errors come back already mapped to [`mscclpp_hal::Error::Driver`] with the vendor's name of
//! the call and of the code. What a vendor has or lacks is data ([`Vendor`], [`Features`]), so
//! the generic code decides once what to do without it.

use std::ffi::CStr;
use std::fmt::Debug;
use std::time::Duration;

use mscclpp_hal::{BackendKind, DeviceInfo, Error, LaunchConfig, Result};

/// Bytes of a vendor IPC memory handle (`CUipcMemHandle`, `hipIpcMemHandle_t`: both 64).
pub const IPC_HANDLE_SIZE: usize = 64;

/// A vendor IPC memory handle, as bytes.
pub type IpcBytes = [u8; IPC_HANDLE_SIZE];

/// A vendor's constants: names in messages, magics of what it writes, its device headers.
#[derive(Debug, Clone, Copy)]
pub struct Vendor {
    /// The backend.
    pub kind: BackendKind,
    /// Lower-case name in messages and errors (`"cuda"`).
    pub name: &'static str,
    /// The runtime's own name in messages (`"CUDA"`, `"HIP"`).
    pub runtime: &'static str,
    /// Magic of memory IPC payloads.
    pub ipc_magic: [u8; 4],
    /// What a malformed memory IPC payload is called in errors (`"cuda IPC handle"`).
    pub ipc_what: &'static str,
    /// The vendor's IPC mechanism in messages (`"CUDA IPC"`).
    pub ipc_mechanism: &'static str,
    /// The vendor call that exports memory, in messages (`"cuIpcGetMemHandle"`).
    pub ipc_export_call: &'static str,
    /// Magic of kernel cache entries (a code object of another vendor never matches).
    pub cache_magic: [u8; 4],
    /// The [`Image::kind`] values this vendor produces (an entry of another kind is unusable).
    pub image_kinds: &'static [u8],
    /// Separates this vendor's cache keys from every other's.
    pub cache_domain: &'static str,
    /// Directory under `MSCCLPP_CACHE_DIR`.
    pub cache_dir: &'static str,
    /// The run-time compiler in messages (`"NVRTC"`).
    pub compiler: &'static str,
    /// The vendor's `mscclpp/core.cuh` (the one device header that differs).
    pub core_header: &'static str,
    /// `Some(reason)` when the vendor's GPUs have no multicast memory at all.
    pub no_multicast: Option<&'static str>,
}

/// What the opened runtime offers beyond the calls every version has (probed at open).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// Streams can be captured into graphs ([`Runtime::stream_begin_capture`] and the graph
    /// calls exist).
    pub graph_capture: bool,
    /// A caller's stream can be wrapped ([`Runtime::stream_from_native`] is meaningful).
    pub borrowed_streams: bool,
    /// The multicast entry points exist (only their presence is reported: nothing calls them).
    pub multicast_symbols: bool,
}

/// A range of several mappings made by [`Runtime::vmm_map_pieces`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pieces {
    /// The range's address.
    pub ptr: u64,
    /// Bytes of each piece (the request rounded up to the granularity).
    pub piece: usize,
    /// The runtime's handle of each piece's physical memory, in address order.
    pub handles: Vec<u64>,
}

impl Pieces {
    /// Bytes of the whole range.
    pub fn len(&self) -> usize {
        self.piece * self.handles.len()
    }
    /// Whether the range is empty (never, for one the runtime made).
    pub fn is_empty(&self) -> bool {
        self.handles.is_empty()
    }
}

/// What a run-time compile produced, as the kernel cache stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Image {
    /// The vendor's image kind (stored in the cache entry; e.g. cubin or PTX).
    pub kind: u8,
    /// What [`Runtime::module_load`] takes.
    pub bytes: Vec<u8>,
}

/// A compile's image and the compiler's log.
#[derive(Debug, Clone)]
pub struct Compiled {
    /// The loadable image.
    pub image: Image,
    /// The compiler's log (warnings); empty when it had nothing to say.
    pub log: String,
    /// How long the compile took.
    pub elapsed: Duration,
}

/// The error every vendor returns from [`Runtime::event_elapsed_ms`] when one of the events has
/// not been recorded or not been reached (`detail`: the vendor's description of the code).
pub fn events_not_reached(detail: String) -> Error {
    Error::invalid(format!(
        "elapsed time asked of events that have not both been recorded and reached ({detail})"
    ))
}

/// The raw calls of one GPU runtime.
///
/// # Contract
/// - Calls marked `unsafe` take raw handles and addresses: the caller passes live handles
///   obtained from this runtime, in-bounds addresses, and has bound the owning context on the
///   calling thread with [`Runtime::bind`] (the generic code does so before each call).
/// - No call panics; a missing optional entry point is a [`Features`] flag, checked by the
///   generic code before the call that needs it.
pub trait Runtime: Send + Sync + Debug + Sized + 'static {
    /// What a device's resources belong to (a retained primary context on CUDA, the ordinal on
    /// ROCm).
    type Context: Copy + Debug;
    /// A stream handle.
    type Stream: Copy + Debug;
    /// An event handle.
    type Event: Copy + Debug;
    /// A loaded module.
    type Module: Copy + Debug;
    /// A kernel of a loaded module.
    type Function: Copy + Debug;
    /// A captured graph.
    type Graph: Copy + Debug;
    /// An instantiated graph.
    type GraphExec: Copy + Debug;

    /// The vendor's constants.
    const VENDOR: Vendor;

    /// What this runtime offers beyond the required calls.
    fn features(&self) -> Features;
    /// The runtime's version and library, for [`mscclpp_hal::Backend::describe`].
    fn describe(&self) -> String;

    // ----- devices -----

    /// Properties of every device (`caps.multicast` is filled by the generic code).
    fn device_infos(&self) -> Result<Vec<DeviceInfo>>;
    /// Whether device `i` can access device `j`'s memory.
    fn can_access_peer(&self, i: usize, j: usize) -> Result<bool>;
    /// The device current on the calling thread, where the runtime has that notion.
    fn current_device(&self) -> Result<Option<usize>>;
    /// Whether device `ordinal` supports multicast memory; asked only when the vendor has
    /// multicast, the environment allows it and [`Features::multicast_symbols`] holds.
    fn multicast_supported(&self, ordinal: usize) -> Result<bool> {
        let _ = ordinal;
        Ok(false)
    }
    /// Acquires what device `ordinal`'s resources belong to.
    fn retain_context(&self, ordinal: usize) -> Result<Self::Context>;
    /// Releases what [`Runtime::retain_context`] acquired.
    ///
    /// # Safety
    /// `ctx` came from `retain_context(ordinal)` and nothing uses it any more.
    unsafe fn release_context(&self, ordinal: usize, ctx: Self::Context) -> Result<()>;

    /// Whether `ctx`, retained, was torn down under us by a reset of the device (the
    /// application's `cudaDeviceReset` while resources of ours live): its streams and memory
    /// are then freed driver state that must not be touched. Never touches the context itself.
    /// `false` where the runtime cannot tell.
    fn context_lost(&self, _ctx: Self::Context) -> bool {
        false
    }
    /// Makes `ctx` current on the calling thread.
    ///
    /// # Safety
    /// `ctx` is live (retained and not released).
    unsafe fn bind(&self, ctx: Self::Context) -> Result<()>;

    // ----- memory -----

    /// Allocates device memory; `uncached` for flags and tokens (vendors without such memory
    /// allocate ordinary device memory).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn mem_alloc(&self, len: usize, uncached: bool) -> Result<u64>;
    /// Frees what [`Runtime::mem_alloc`] returned.
    ///
    /// # Safety
    /// See the trait's contract; `ptr` is freed once.
    unsafe fn mem_free(&self, ptr: u64) -> Result<()>;
    /// Allocates portable host memory mapped into the device.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn host_alloc_mapped(&self, len: usize) -> Result<*mut u8>;
    /// The device address of mapped host memory.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn host_device_pointer(&self, host: *mut u8) -> Result<u64>;
    /// Frees what [`Runtime::host_alloc_mapped`] returned.
    ///
    /// # Safety
    /// See the trait's contract; `host` is freed once.
    unsafe fn host_free(&self, host: *mut u8, len: usize) -> Result<()>;
    /// Base and size of the allocation that contains `ptr`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn mem_address_range(&self, ptr: u64) -> Result<(u64, usize)>;
    /// The IPC handle of the allocation whose base is `ptr`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn ipc_get_handle(&self, ptr: u64) -> Result<IpcBytes>;
    /// Maps another process's memory (with lazy peer access).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn ipc_open_handle(&self, handle: &IpcBytes) -> Result<u64>;
    /// Unmaps what [`Runtime::ipc_open_handle`] returned.
    ///
    /// # Safety
    /// See the trait's contract; `ptr` is closed once.
    unsafe fn ipc_close_handle(&self, ptr: u64) -> Result<()>;
    /// Reserves one address range and maps `count` fresh allocations of the device of
    /// `ordinal`, each `piece` bytes rounded up to the runtime's granularity, into it back to
    /// back, readable and writable by that device: what a virtual-memory allocator makes
    /// (PyTorch's expandable segments). `Unavailable` where the runtime has no such calls.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn vmm_map_pieces(&self, ordinal: usize, piece: usize, count: usize) -> Result<Pieces> {
        let _ = (ordinal, piece, count);
        Err(Error::unavailable(
            "a range of several mappings",
            format!(
                "the {} runtime in use has no virtual memory calls",
                Self::VENDOR.runtime
            ),
        ))
    }
    /// Unmaps and frees what [`Runtime::vmm_map_pieces`] returned.
    ///
    /// # Safety
    /// See the trait's contract; `pieces` is released once and nothing uses the range any more.
    unsafe fn vmm_unmap_pieces(&self, pieces: &Pieces) -> Result<()> {
        let _ = pieces;
        Ok(())
    }
    /// The granularity of shareable memory of the device of `ordinal` (sizes and map offsets
    /// are multiples of it); `Unavailable` where the runtime has no shareable memory, which the
    /// other `vmm_*shareable*`/`vmm_*map*` calls then are never asked for.
    fn vmm_shareable_granularity(&self, ordinal: usize) -> Result<usize> {
        let _ = ordinal;
        Err(Error::unavailable(
            "shareable memory (symmetric windows)",
            format!(
                "the {} runtime in use has no memory handles to share as file descriptors",
                Self::VENDOR.runtime
            ),
        ))
    }
    /// One allocation of at least `bytes` of the device of `ordinal`, mapped read-write in a
    /// range of its own, whose handle [`Runtime::vmm_export`] shares (a [`Pieces`] of one piece,
    /// released with [`Runtime::vmm_unmap_pieces`]).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn vmm_alloc_shareable(&self, ordinal: usize, bytes: usize) -> Result<Pieces> {
        let _ = bytes;
        Err(self
            .vmm_shareable_granularity(ordinal)
            .err()
            .unwrap_or_else(|| Error::Internal("vmm_alloc_shareable is not implemented".into())))
    }
    /// A file descriptor for the physical memory `handle` (of [`Runtime::vmm_alloc_shareable`]).
    ///
    /// # Safety
    /// See the trait's contract; `handle` is live.
    unsafe fn vmm_export(&self, handle: u64) -> Result<std::os::fd::OwnedFd> {
        let _ = handle;
        Err(Error::Internal("vmm_export is not implemented".into()))
    }
    /// Reserves `bytes` of address space aligned to `align`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn vmm_reserve(&self, bytes: usize, align: usize) -> Result<u64> {
        let _ = (bytes, align);
        Err(Error::Internal("vmm_reserve is not implemented".into()))
    }
    /// Releases a range of [`Runtime::vmm_reserve`].
    ///
    /// # Safety
    /// See the trait's contract; nothing is mapped in the range any more.
    unsafe fn vmm_free_reserve(&self, ptr: u64, bytes: usize) -> Result<()> {
        let _ = (ptr, bytes);
        Ok(())
    }
    /// Maps `bytes` of the memory behind `fd` (another process's [`Runtime::vmm_export`], or
    /// this one's) at `at`, read-write for the device of `ordinal`.
    ///
    /// # Safety
    /// See the trait's contract; `at..at + bytes` is reserved and unmapped.
    unsafe fn vmm_map_fd(
        &self,
        ordinal: usize,
        at: u64,
        fd: std::os::fd::BorrowedFd<'_>,
        bytes: usize,
    ) -> Result<()> {
        let _ = (ordinal, at, fd, bytes);
        Err(Error::Internal("vmm_map_fd is not implemented".into()))
    }
    /// Removes a mapping of [`Runtime::vmm_map_fd`].
    ///
    /// # Safety
    /// See the trait's contract; nothing uses the mapping any more.
    unsafe fn vmm_unmap(&self, at: u64, bytes: usize) -> Result<()> {
        let _ = (at, bytes);
        Ok(())
    }

    // ----- streams and events -----

    /// Creates a non-blocking stream.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_create(&self) -> Result<Self::Stream>;
    /// Destroys a stream (its pending work still completes).
    ///
    /// # Safety
    /// See the trait's contract; destroyed once.
    unsafe fn stream_destroy(&self, stream: Self::Stream) -> Result<()>;
    /// Whether the stream has run everything enqueued on it.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_query(&self, stream: Self::Stream) -> Result<bool>;
    /// The handle as an integer (for vendor libraries used beside the HAL).
    fn stream_to_native(stream: Self::Stream) -> u64;
    /// A handle from an integer of [`Runtime::stream_to_native`]'s form (0: the default stream).
    fn stream_from_native(native: u64) -> Self::Stream;
    /// An event from its native handle (a caller's `CUevent`/`hipEvent_t`).
    fn event_from_native(native: u64) -> Self::Event;
    /// Device-to-device copy.
    ///
    /// # Safety
    /// See the trait's contract; both ranges stay valid until the copy ran.
    unsafe fn memcpy_dtod(&self, dst: u64, src: u64, len: usize, s: Self::Stream) -> Result<()>;
    /// Host-to-device copy.
    ///
    /// # Safety
    /// See the trait's contract; both ranges stay valid until the copy ran.
    unsafe fn memcpy_htod(
        &self,
        dst: u64,
        src: *const u8,
        len: usize,
        s: Self::Stream,
    ) -> Result<()>;
    /// Device-to-host copy.
    ///
    /// # Safety
    /// See the trait's contract; both ranges stay valid until the copy ran.
    unsafe fn memcpy_dtoh(&self, dst: *mut u8, src: u64, len: usize, s: Self::Stream)
    -> Result<()>;
    /// Byte fill.
    ///
    /// # Safety
    /// See the trait's contract; the range stays valid until the fill ran.
    unsafe fn memset_d8(&self, dst: u64, value: u8, len: usize, s: Self::Stream) -> Result<()>;
    /// Ordered 8-byte write of `value` at the aligned address `dst`.
    ///
    /// # Safety
    /// See the trait's contract; the location stays valid until the write ran.
    unsafe fn write_value64(&self, dst: u64, value: u64, s: Self::Stream) -> Result<()>;
    /// Makes the stream wait until the aligned 8-byte word at `dst` satisfies `cmp` against
    /// `value`.
    ///
    /// # Safety
    /// See the trait's contract; the location stays valid until the wait ran.
    unsafe fn wait_value64(
        &self,
        dst: u64,
        value: u64,
        cmp: mscclpp_hal::WaitCmp,
        s: Self::Stream,
    ) -> Result<()>;
    /// Makes `stream` wait for `event`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_wait_event(&self, stream: Self::Stream, event: Self::Event) -> Result<()>;
    /// Creates an event (`timing`: with timing enabled).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn event_create(&self, timing: bool) -> Result<Self::Event>;
    /// Destroys an event (a pending recording still completes).
    ///
    /// # Safety
    /// See the trait's contract; destroyed once.
    unsafe fn event_destroy(&self, event: Self::Event) -> Result<()>;
    /// Records `event` on `stream`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn event_record(&self, event: Self::Event, stream: Self::Stream) -> Result<()>;
    /// Whether the event has been reached (a sticky error of its stream is an `Err`).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn event_query(&self, event: Self::Event) -> Result<bool>;
    /// Milliseconds between two reached events; [`events_not_reached`] when one is not.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn event_elapsed_ms(&self, start: Self::Event, end: Self::Event) -> Result<f32>;

    /// Makes this thread's stream-capture mode relaxed and returns the mode it had (the
    /// vendor's enum value: 0 global, 1 thread-local, 2 relaxed), or `None` where the runtime
    /// cannot say. In the default (global) mode a thread may not wait on the host, allocate or
    /// free while any thread captures a graph in global mode, as PyTorch's `torch.cuda.graph`
    /// does: the call is refused and the other thread's capture is invalidated. Work of this
    /// library's own (a stream dropped with work pending, a host copy, a proxy thread's wait)
    /// touches no capturing stream, so it runs relaxed ([`crate::capture::Relaxed`]).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn relax_thread_capture(&self) -> Option<i32>;
    /// Sets this thread's capture mode back to what [`Runtime::relax_thread_capture`] returned.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn restore_thread_capture(&self, mode: i32);

    // ----- graphs (called only where [`Features::graph_capture`] holds) -----

    /// Starts capturing `stream` (relaxed mode: other threads keep making unrelated calls).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_begin_capture(&self, stream: Self::Stream) -> Result<()>;
    /// Whether `stream` is capturing (whoever began the capture).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_is_capturing(&self, stream: Self::Stream) -> Result<bool>;
    /// Ends the capture of `stream`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn stream_end_capture(&self, stream: Self::Stream) -> Result<Self::Graph>;
    /// Instantiates a captured graph.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn graph_instantiate(&self, graph: Self::Graph) -> Result<Self::GraphExec>;
    /// Launches an instantiated graph on `stream`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn graph_launch(&self, exec: Self::GraphExec, stream: Self::Stream) -> Result<()>;
    /// Destroys an instantiated graph.
    ///
    /// # Safety
    /// See the trait's contract; destroyed once, no launch pending.
    unsafe fn graph_exec_destroy(&self, exec: Self::GraphExec) -> Result<()>;
    /// Destroys a captured graph.
    ///
    /// # Safety
    /// See the trait's contract; destroyed once.
    unsafe fn graph_destroy(&self, graph: Self::Graph) -> Result<()>;

    // ----- modules and kernels -----

    /// Loads a module from an image of [`Runtime::compile`].
    ///
    /// # Safety
    /// See the trait's contract; `image` is a complete image of this vendor.
    unsafe fn module_load(&self, image: &[u8]) -> Result<Self::Module>;
    /// Unloads a module.
    ///
    /// # Safety
    /// See the trait's contract; unloaded once, no launch of it pending.
    unsafe fn module_unload(&self, module: Self::Module) -> Result<()>;
    /// The kernel `name` of `module`.
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn module_function(&self, module: Self::Module, name: &CStr) -> Result<Self::Function>;
    /// Most threads per block the kernel can be launched with; `None` where the runtime does not
    /// say (the device limit then applies).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn function_max_threads(&self, f: Self::Function) -> Result<Option<u32>>;
    /// Bytes of the kernel's parameters, where the runtime can tell (else the kernel table's).
    ///
    /// # Safety
    /// See the trait's contract.
    unsafe fn function_param_size(&self, f: Self::Function) -> Option<usize> {
        let _ = f;
        None
    }
    /// Launches `f` with one argument struct: `len` bytes at the start of `args` (8-byte
    /// aligned, read during the call); `len == 0` launches without arguments.
    ///
    /// # Safety
    /// See the trait's contract; device addresses inside `args` are the caller's contract.
    unsafe fn launch(
        &self,
        f: Self::Function,
        cfg: &LaunchConfig,
        stream: Self::Stream,
        args: &mut [u64],
        len: usize,
    ) -> Result<()>;

    // ----- run-time compilation -----

    /// The compiler's version (part of the cache key); `Unavailable` without a compiler.
    fn rtc_version(&self) -> Result<(i32, i32)>;
    /// The compile target for a device's architecture (ROCm drops the feature suffix).
    fn rtc_target(arch: &str) -> &str {
        arch
    }
    /// The options every compile uses besides the target (part of the cache key).
    fn rtc_options(&self) -> String;
    /// Compiles `source` (named `name`) with `headers` for `target`.
    fn compile(
        &self,
        name: &str,
        source: &str,
        headers: &[(&str, &str)],
        target: &str,
    ) -> Result<Compiled>;
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A vendor for tests of the generic code.
    pub(crate) const TEST_VENDOR: Vendor = Vendor {
        kind: BackendKind::Host,
        name: "test",
        runtime: "TEST",
        ipc_magic: *b"TEST",
        ipc_what: "test IPC handle",
        ipc_mechanism: "TEST IPC",
        ipc_export_call: "testExport",
        cache_magic: *b"MSKT",
        image_kinds: &[1, 2],
        cache_domain: "mscclpp-test kernel cache v1",
        cache_dir: "test",
        compiler: "TESTRTC",
        core_header: "// test core.cuh",
        no_multicast: None,
    };
}
