//! `Communicator`: a rank's bootstrap, device, collectives and executor, and the calls that take
//! callers' arrays (`UniqueId`, by which ranks meet, is in `open`).
//!
//! Without pyo3's `multiple-pymethods` feature a class has one `#[pymethods]` block, so every
//! Python method of `Communicator` is here, as a wrapper where its body lives with what it uses
//! in the submodules.

mod arrays;
mod channel_setup;
mod collectives;
mod moe;
mod open;
mod p2p;
mod plans;
mod registration;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use mscclpp::collectives::{CollectiveKind, P2pKind};
use mscclpp::comm::Communicator as RawComm;
use mscclpp::executor::Plan;
use mscclpp::hal::{BackendKind, Device, ReduceOp};
use mscclpp_caller::Caller;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::channels;
use crate::errors::{IntoPy, usage};
use collectives::parse_op;
pub use moe::ExpertExchange;
pub use open::PyUniqueId;
use open::Rendezvous;
pub use p2p::Group;
use p2p::Pending;
pub use registration::RegisteredBuffer;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while a lock was held leaves these maps consistent (each update is one insert).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What every rank's communicator holds.
#[derive(Debug)]
struct Inner {
    /// The caller side the C library shares: the communicator, its collectives (or why there
    /// are none), its own stream, callers' wrapped streams, the plans' staged buffers.
    caller: Caller,
    /// Decoded plans by their JSON text (at most [`plans::MAX_PLANS`]).
    plans: Mutex<HashMap<Vec<u8>, Arc<Plan>>>,
    /// Device ranges (address, bytes) registered by `register`: an all-reduce whose input lies
    /// inside one is a zero-copy call (registration is collective, so every rank's input is
    /// registered likewise).
    registered: Mutex<Vec<(u64, u64)>>,
}

impl Inner {
    fn comm(&self) -> &Arc<RawComm> {
        self.caller.communicator()
    }

    fn device(&self) -> &Arc<dyn Device> {
        self.comm().device()
    }

    fn backend(&self) -> BackendKind {
        self.device().info().backend
    }

    /// Whether `bytes` at `ptr` lie inside a registered buffer.
    fn is_registered(&self, ptr: u64, bytes: u64) -> bool {
        lock(&self.registered)
            .iter()
            .any(|&(p, n)| ptr >= p && ptr.saturating_add(bytes) <= p.saturating_add(n))
    }

    fn host(&self) -> bool {
        self.backend() == BackendKind::Host
    }

    /// `Ok` where `what` runs natively (one rank, or collectives), else why not.
    fn require(&self, what: &str) -> PyResult<()> {
        self.caller.require(what).py_err()
    }
}

/// A rank's communicator: collectives, sends and receives on caller arrays, execution plans.
///
/// Arrays are anything exposing `__dlpack__` or `__cuda_array_interface__` (torch tensors, CuPy
/// and NumPy arrays), contiguous, in memory of the communicator's device: GPU memory of the
/// device it opened, or host memory on the host backend. Calls on a GPU are enqueued on the
/// caller's stream (`stream=` a `cudaStream_t`/`hipStream_t` handle as an int; by default torch's
/// or CuPy's current stream for their arrays, else the legacy default stream), return at once
/// and can be captured in CUDA graphs; the arrays must stay alive until the stream has run the
/// call. On the host backend calls return when they have completed.
#[pyclass(module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct Communicator {
    inner: RwLock<Option<Arc<Inner>>>,
    /// The open `group()`'s queued sends and receives, if one is open.
    group: Mutex<Option<Vec<Pending>>>,
}

impl Communicator {
    fn inner(&self) -> PyResult<Arc<Inner>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| usage("this communicator was closed"))
    }
}

#[pymethods]
impl Communicator {
    /// Joins the ranks that meet at `id` (a `UniqueId`, its 128 bytes, or a root
    /// `"[ifname:]ip:port"` that rank 0 binds) as `rank` of `size`.
    ///
    /// `device`: the device ordinal (default: the local rank modulo the device count).
    /// `backend`: `"cuda"`, `"rocm"` or `"host"` (default: `MSCCLPP_BACKEND`, else the first
    /// that works, in that order).
    #[new]
    #[pyo3(signature = (id, rank, size, *, device = None, backend = None))]
    fn new(
        py: Python<'_>,
        id: &Bound<'_, PyAny>,
        rank: usize,
        size: usize,
        device: Option<usize>,
        backend: Option<&str>,
    ) -> PyResult<Self> {
        open::open(
            py,
            Some((Rendezvous::from_py(id)?, rank, size)),
            device,
            backend,
        )
    }

    /// Joins the ranks of a launcher: torchrun (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    /// `MASTER_ADDR`, root at `MASTER_PORT + 1`), Open MPI (`OMPI_COMM_WORLD_*`), PMI or Slurm
    /// (`SLURM_PROCID`, ...), root from `MSCCLPP_MASTER_ADDR`/`MSCCLPP_MASTER_PORT` when set.
    #[classmethod]
    #[pyo3(signature = (*, device = None, backend = None))]
    fn from_env(
        _cls: &Bound<'_, PyType>,
        py: Python<'_>,
        device: Option<usize>,
        backend: Option<&str>,
    ) -> PyResult<Self> {
        open::open(py, None, device, backend)
    }

    /// All-reduces so far whose peers read a registered input in place instead of a copy
    /// (see `register`): the zero-copy path at the sizes where it pays.
    #[getter]
    fn zero_copy_calls(&self) -> PyResult<u64> {
        Ok(self.inner()?.caller.zero_copy_calls())
    }

    /// This rank.
    #[getter]
    fn rank(&self) -> PyResult<usize> {
        Ok(self.inner()?.comm().rank())
    }

    /// The number of ranks.
    #[getter]
    fn size(&self) -> PyResult<usize> {
        Ok(self.inner()?.comm().nranks())
    }

    /// This rank's index among the ranks of its host.
    #[getter]
    fn local_rank(&self) -> PyResult<usize> {
        let inner = self.inner()?;
        let b = inner.comm().bootstrap();
        Ok(b.local_rank().unwrap_or_else(|| b.host_rank()))
    }

    /// The backend's name: `"cuda"`, `"rocm"` or `"host"`.
    #[getter]
    fn backend(&self) -> PyResult<String> {
        Ok(self.inner()?.backend().to_string())
    }

    /// The device ordinal.
    #[getter]
    fn device(&self) -> PyResult<usize> {
        Ok(self.inner()?.device().info().ordinal)
    }

    /// The device's name.
    #[getter]
    fn device_name(&self) -> PyResult<String> {
        Ok(self.inner()?.device().info().name.clone())
    }

    /// An expert-parallel exchange over this communicator's ranks (2 to 32, on one host or
    /// several): every rank calls it with the same settings. `max_row_bytes`: a token's row at most (hidden size
    /// times the element size, of the dispatch's and the combine's rows); `max_scale_bytes`: its
    /// scales at most (0: none).
    #[pyo3(signature = (num_experts, topk, max_tokens, max_row_bytes, max_scale_bytes = 0))]
    fn expert_exchange(
        &self,
        py: Python<'_>,
        num_experts: usize,
        topk: usize,
        max_tokens: usize,
        max_row_bytes: usize,
        max_scale_bytes: usize,
    ) -> PyResult<ExpertExchange> {
        let cfg = mscclpp::collectives::moe::MoeConfig {
            num_experts,
            topk,
            max_tokens,
            max_row_bytes,
            max_scale_bytes,
        };
        moe::open(py, self.inner()?, cfg)
    }

    /// Waits until every rank has called it (over the bootstrap, on the host).
    fn barrier(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner()?;
        py.detach(move || inner.comm().bootstrap().barrier())
            .py_err()
    }

    /// Reduces `tensor` over the ranks, in place (or into `out`), and returns the result's array.
    #[pyo3(signature = (tensor, op = "sum", *, out = None, stream = None, dtype = None))]
    fn all_reduce(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        op: &str,
        out: Option<&Bound<'_, PyAny>>,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let op = parse_op(op)?;
        let out = out.unwrap_or(tensor);
        self.collective(
            py,
            CollectiveKind::AllReduce,
            tensor,
            out,
            op,
            0,
            stream,
            dtype,
        )?;
        Ok(out.clone().unbind())
    }

    /// `output` (`size` times `input`'s elements) = every rank's `input`, in rank order.
    #[pyo3(signature = (output, input, *, stream = None, dtype = None))]
    fn all_gather(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.collective(
            py,
            CollectiveKind::AllGather,
            input,
            output,
            ReduceOp::Sum,
            0,
            stream,
            dtype,
        )?;
        Ok(output.clone().unbind())
    }

    /// `output` = the reduction over ranks of block `rank` of `input` (`size` blocks of
    /// `output`'s elements).
    #[pyo3(signature = (output, input, op = "sum", *, stream = None, dtype = None))]
    fn reduce_scatter(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        op: &str,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let op = parse_op(op)?;
        self.collective(
            py,
            CollectiveKind::ReduceScatter,
            input,
            output,
            op,
            0,
            stream,
            dtype,
        )?;
        Ok(output.clone().unbind())
    }

    /// `tensor` (or `out`) = `root`'s `tensor` on every rank.
    #[pyo3(signature = (tensor, root = 0, *, out = None, stream = None, dtype = None))]
    fn broadcast(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        root: usize,
        out: Option<&Bound<'_, PyAny>>,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        let out = out.unwrap_or(tensor);
        self.collective(
            py,
            CollectiveKind::Broadcast,
            tensor,
            out,
            ReduceOp::Sum,
            root,
            stream,
            dtype,
        )?;
        Ok(out.clone().unbind())
    }

    /// Block `p` of `output` = block `rank` of rank `p`'s `input` (`size` equal blocks each).
    #[pyo3(signature = (output, input, *, stream = None, dtype = None))]
    fn all_to_all(
        &self,
        py: Python<'_>,
        output: &Bound<'_, PyAny>,
        input: &Bound<'_, PyAny>,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Py<PyAny>> {
        self.collective(
            py,
            CollectiveKind::AllToAll,
            input,
            output,
            ReduceOp::Sum,
            0,
            stream,
            dtype,
        )?;
        Ok(output.clone().unbind())
    }

    /// Sends `tensor` to `peer`, which receives it with `recv` (same size). Inside `group()`
    /// it is queued and runs with the group's other sends and receives.
    #[pyo3(signature = (tensor, peer, *, stream = None))]
    fn send(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        self.send_or_queue(py, P2pKind::Send, tensor, peer, stream)
    }

    /// Receives into `tensor` what `peer` sends.
    #[pyo3(signature = (tensor, peer, *, stream = None))]
    fn recv(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        self.send_or_queue(py, P2pKind::Recv, tensor, peer, stream)
    }

    /// A context manager: the sends and receives called inside run together when it closes, as
    /// one operation in which none waits for another (exchanges, rings, all-to-all-v).
    fn group(slf: &Bound<'_, Self>) -> Group {
        Group {
            comm: slf.clone().unbind(),
        }
    }

    /// Registers `tensor` with every rank's collectives (collective: every rank registers one
    /// array, in the same order): all-reduces reading from it then read it in place on the
    /// peers, with the IPC mappings made once. Keep it registered while calls use it; end with
    /// `deregister`.
    fn register(&self, py: Python<'_>, tensor: &Bound<'_, PyAny>) -> PyResult<RegisteredBuffer> {
        registration::register(self, py, tensor)
    }

    /// Ends a registration (collective, in the same order on every rank) once every call using
    /// it has finished on its stream.
    fn deregister(&self, py: Python<'_>, buffer: &RegisteredBuffer) -> PyResult<()> {
        registration::deregister(self, py, buffer)
    }

    /// Runs an MSCCL++ execution plan (the JSON its DSL emits: a path, the JSON text or bytes)
    /// with `send` as input and `recv` as output. The first run of a plan with given arrays is
    /// collective (every rank makes it); later ones only enqueue. `op` overrides the plan's
    /// reduction operator.
    #[pyo3(signature = (plan, send, recv, *, dtype = None, op = None, stream = None))]
    #[allow(clippy::too_many_arguments)]
    fn execute_plan(
        &self,
        py: Python<'_>,
        plan: &Bound<'_, PyAny>,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        op: Option<&str>,
        stream: Option<u64>,
    ) -> PyResult<Py<PyAny>> {
        plans::execute_plan(self, py, plan, send, recv, dtype, op, stream)
    }

    /// Allocates `nbytes` of this communicator's device memory (zeroed; shared memory on the
    /// host backend): memory for channels, which on the host backend cannot use NumPy arrays.
    fn alloc(&self, nbytes: usize) -> PyResult<channels::Buffer> {
        let inner = self.inner()?;
        channels::Buffer::new(inner.device(), inner.caller.internal().clone(), nbytes)
    }

    /// A device-to-device semaphore with `peer` over a CudaIpc connection (same host).
    /// Collective set-up: `peer` makes the matching call at the same point.
    fn memory_semaphore(&self, py: Python<'_>, peer: usize) -> PyResult<channels::MemorySemaphore> {
        channels::memory_semaphore(py, self.parts()?, peer)
    }

    /// A host-to-device semaphore with `peer`: this host signals, the peer's device waits.
    /// Collective set-up with `peer`. `transport`: "CudaIpc", "Ethernet" or "IB0".."IB7".
    #[pyo3(signature = (peer, *, transport = "CudaIpc"))]
    fn host_semaphore(
        &self,
        py: Python<'_>,
        peer: usize,
        transport: &str,
    ) -> PyResult<channels::HostSemaphore> {
        channels::host_semaphore(py, self.parts()?, peer, transport)
    }

    /// A memory channel with `peer` (same host): device code puts from this rank's `send` into
    /// the peer's `recv`, and signals/waits. Each of `send`, `recv` (written by the peer from now
    /// on) and `packet_buffer` (local memory that packet reads poll) is a `Buffer` of `alloc()`
    /// or, on a GPU, an array of the device (a torch tensor: the peer maps the allocator's
    /// segment that holds it). Collective set-up with `peer`.
    #[pyo3(signature = (peer, send, recv, *, packet_buffer = None))]
    fn memory_channel(
        &self,
        py: Python<'_>,
        peer: usize,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        packet_buffer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<channels::MemoryChannel> {
        let s = self.channel_memory(send, "memory_channel send")?;
        let r = self.channel_memory(recv, "memory_channel recv")?;
        let pk = packet_buffer
            .map(|b| self.channel_memory(b, "memory_channel packet_buffer"))
            .transpose()?;
        channels::memory_channel(py, self.parts()?, peer, s, r, pk)
    }

    /// A port channel with `peer` over `transport`: device code posts puts from `send` into the
    /// peer's `recv`, signals and flushes; a proxy thread of its own carries them out. Both are
    /// `Buffer`s of `alloc()` or, on a GPU, arrays of the device. Collective set-up with `peer`.
    #[pyo3(signature = (peer, send, recv, *, transport = "CudaIpc", fifo_size = 64))]
    #[allow(clippy::too_many_arguments)]
    fn port_channel(
        &self,
        py: Python<'_>,
        peer: usize,
        send: &Bound<'_, PyAny>,
        recv: &Bound<'_, PyAny>,
        transport: &str,
        fifo_size: usize,
    ) -> PyResult<channels::PortChannel> {
        let s = self.channel_memory(send, "port_channel send")?;
        let r = self.channel_memory(recv, "port_channel recv")?;
        channels::port_channel(py, self.parts()?, peer, s, r, transport, fifo_size)
    }

    /// Compiles `source` for this communicator's device (see `mscclpp_rs.compile_kernel`).
    #[pyo3(signature = (source, name, *, arg_size = None))]
    fn compile_kernel(
        &self,
        py: Python<'_>,
        source: &str,
        name: &str,
        arg_size: Option<usize>,
    ) -> PyResult<channels::Kernel> {
        self.compile_kernel_on(py, source, name, arg_size)
    }

    /// Releases the communicator (its memory, connections and threads). Make sure the other
    /// ranks are done with it too (a `barrier()` first). Later calls raise.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self.inner.write().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(inner) = taken {
            py.detach(move || {
                inner.caller.finish(&**inner.caller.internal())?;
                drop(inner);
                Ok(())
            })
            .py_err()?;
        }
        Ok(())
    }

    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.inner() {
            Ok(i) => format!(
                "Communicator(rank={}, size={}, backend={:?}, device={})",
                i.comm().rank(),
                i.comm().nranks(),
                i.backend().to_string(),
                i.device().info().ordinal
            ),
            Err(_) => "Communicator(closed)".into(),
        }
    }
}
