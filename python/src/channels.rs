//! Channels and semaphores between two ranks, and caller-compiled kernels: the custom-kernel
//! workflow. Each object owns what its device handle points at, so `device_handle()` bytes stay
//! valid for kernels while the Python object lives.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use mscclpp::comm::proxy::ProxyService;
use mscclpp::comm::semaphore::{Host2DeviceSemaphore, MemoryDevice2DeviceSemaphore};
use mscclpp::comm::{Communicator as RawComm, channel};
use mscclpp::hal::module::{KernelDef, KernelModule};
use mscclpp::hal::{
    BackendKind, BufferSlice, Device, DeviceBuffer, Kernel as RawKernel, KernelId, LaunchConfig,
    MemoryKind, Stream,
};
use mscclpp::transports::{
    AnyConnection, EndpointConfig, RegisteredMemory, Transport, TransportFlags,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::errors::{IntoPy, Kind, new as new_err, usage};

/// The bytes of a device-side struct, exactly as kernels take it.
fn bytes_of<T: Copy>(v: &T) -> Vec<u8> {
    // SAFETY: only called with the `#[repr(C)]` device handles of `mscclpp::hal::dev`, whose
    // padding is spelled out as fields (so every byte is initialised); `v` is a live reference
    // of `size_of::<T>()` bytes.
    unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), std::mem::size_of::<T>()) }
        .to_vec()
}

fn parse_transport(t: &str) -> PyResult<Transport> {
    let norm: String = t.chars().filter(|c| *c != '_' && *c != '-').collect();
    norm.parse::<Transport>().map_err(|_| {
        usage(format!(
            "transport={t:?}: expected \"CudaIpc\" (same host), \"Ethernet\" or \"IB0\"..\"IB7\""
        ))
    })
}

/// Memory the communicator allocated on its device (shared memory on the host backend): what
/// channels expose to peers where callers' arrays cannot be mapped.
#[pyclass(name = "Buffer", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct Buffer {
    pub(crate) buf: DeviceBuffer,
    stream: Arc<dyn Stream>,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // Wrappers of this memory kept by communicators' caller sides are dropped at their next
        // call, so a stale array over it is checked again rather than trusted.
        mscclpp_caller::memory_freed();
    }
}

impl Buffer {
    pub(crate) fn new(
        device: &Arc<dyn Device>,
        stream: Arc<dyn Stream>,
        nbytes: usize,
    ) -> PyResult<Self> {
        if nbytes == 0 {
            return Err(usage("alloc: nbytes must be at least 1"));
        }
        let buf = device.alloc(nbytes, MemoryKind::Device).py_err()?;
        stream.fill(&buf.full(), 0).py_err()?;
        stream.synchronize().py_err()?;
        Ok(Buffer { buf, stream })
    }

    #[allow(clippy::too_many_arguments)]
    fn export<'py>(
        &self,
        slf: &Bound<'py, Self>,
        data_type: &str,
        shape: Option<Vec<i64>>,
        strides: Option<Vec<i64>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        let py = slf.py();
        let device =
            crate::dlpack::device_of(self.buf.backend(), self.buf.allocation().device_ordinal());
        if dl_device.is_some_and(|d| d != device) {
            return Err(pyo3::exceptions::PyBufferError::new_err(format!(
                "__dlpack__: dl_device={dl_device:?}, but the buffer lives on {device:?} (no copies)"
            )));
        }
        if copy == Some(true) {
            return Err(pyo3::exceptions::PyBufferError::new_err(
                "__dlpack__: copy=True is not served (the buffer is exported in place)",
            ));
        }
        let t = crate::array::parse_dtype(&pyo3::types::PyString::new(py, data_type).into_any())?;
        let shape =
            crate::dlpack::typed_shape(self.buf.len(), t.size(), shape, strides.as_deref())?;
        crate::dlpack::capsule(
            py,
            self.buf.ptr().0,
            shape,
            strides,
            crate::dlpack::dl_type(t),
            device,
            Some(slf.clone().into_any().unbind()),
        )
    }

    fn range(&self, offset: usize, n: usize, what: &str) -> PyResult<BufferSlice> {
        let len = self.buf.len();
        if offset.checked_add(n).is_none_or(|end| end > len) {
            return Err(usage(format!(
                "{what}: bytes {offset}..{} are outside the {len}-byte buffer",
                offset.saturating_add(n)
            )));
        }
        self.buf.slice(offset..offset + n).py_err()
    }
}

#[pymethods]
impl Buffer {
    /// Bytes of the buffer.
    #[getter]
    fn nbytes(&self) -> usize {
        self.buf.len()
    }

    /// Its device address (what kernels take).
    #[getter]
    fn ptr(&self) -> u64 {
        self.buf.ptr().0
    }

    /// Copies `data` into the buffer at `offset` (waits until done).
    #[pyo3(signature = (data, offset = 0))]
    fn write(&self, py: Python<'_>, data: &[u8], offset: usize) -> PyResult<()> {
        let s = self.range(offset, data.len(), "Buffer.write")?;
        let data = data.to_vec();
        let stream = self.stream.clone();
        py.detach(move || stream.write_from_host(&s, &data))
            .py_err()
    }

    /// Copies `nbytes` (default: to the end) from `offset` out of the buffer.
    #[pyo3(signature = (offset = 0, nbytes = None))]
    fn read<'py>(
        &self,
        py: Python<'py>,
        offset: usize,
        nbytes: Option<usize>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let n = nbytes.unwrap_or_else(|| self.buf.len().saturating_sub(offset));
        let s = self.range(offset, n, "Buffer.read")?;
        let stream = self.stream.clone();
        let v = py
            .detach(move || {
                let mut v = vec![0u8; n];
                stream.read_to_host(&mut v, &s).map(|()| v)
            })
            .py_err()?;
        Ok(PyBytes::new(py, &v))
    }

    fn __len__(&self) -> usize {
        self.buf.len()
    }

    /// DLPack's `(device_type, device_id)`: `(2, ordinal)` on CUDA, `(10, ordinal)` on ROCm,
    /// `(1, 0)` (CPU) on the host backend.
    fn __dlpack_device__(&self) -> (i32, i32) {
        crate::dlpack::device_of(self.buf.backend(), self.buf.allocation().device_ordinal())
    }

    /// The whole buffer as a one-dimensional uint8 DLPack tensor (not copied; the capsule keeps
    /// the buffer alive). `stream` is accepted and needs no wait: the library enqueued nothing
    /// on the buffer that the consumer's stream could race with (it was zeroed synchronously).
    #[pyo3(signature = (*, stream = None, max_version = None, dl_device = None, copy = None))]
    fn __dlpack__<'py>(
        slf: &Bound<'py, Self>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        let _ = (stream, max_version);
        slf.get().export(slf, "uint8", None, None, dl_device, copy)
    }

    /// The buffer as a DLPack capsule of `data_type` (a name or anything whose `str()` is one:
    /// `str(torch.float16)`), one dimension unless `shape` (and `strides`, in elements) are
    /// given: MSCCL++'s `RawGpuBuffer.to_dlpack`.
    #[pyo3(signature = (data_type = None, shape = None, strides = None))]
    fn to_dlpack<'py>(
        slf: &Bound<'py, Self>,
        data_type: Option<&Bound<'py, PyAny>>,
        shape: Option<Vec<i64>>,
        strides: Option<Vec<i64>>,
    ) -> PyResult<Bound<'py, pyo3::types::PyCapsule>> {
        let name = match data_type {
            Some(d) => d.str()?.to_string(),
            None => "uint8".to_string(),
        };
        slf.get().export(slf, &name, shape, strides, None, None)
    }

    fn __repr__(&self) -> String {
        format!(
            "Buffer(nbytes={}, ptr={:#x})",
            self.buf.len(),
            self.buf.ptr().0
        )
    }
}

/// A semaphore between two devices that map each other's memory (same host, CudaIpc): device
/// code signals and waits on it (`mscclpp/semaphore.cuh`).
#[pyclass(name = "MemorySemaphore", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct MemorySemaphore {
    sem: Arc<MemoryDevice2DeviceSemaphore>,
    _conn: Arc<AnyConnection>,
}

#[pymethods]
impl MemorySemaphore {
    /// The peer's rank.
    #[getter]
    fn peer(&self) -> usize {
        self.sem.peer()
    }

    /// The bytes of `MemoryDevice2DeviceSemaphoreDeviceHandle` (32: four device addresses).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &bytes_of(&self.sem.device_handle()))
    }

    /// The bytes of `BaseMemoryChannelDeviceHandle`: signal/wait only, over this semaphore.
    fn channel_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        let ch = channel::BaseMemoryChannel::new(self.sem.clone());
        PyBytes::new(py, &bytes_of(&ch.device_handle()))
    }
}

/// A semaphore the host signals (through a connection) and a device waits on.
#[pyclass(name = "HostSemaphore", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct HostSemaphore {
    sem: Arc<Host2DeviceSemaphore>,
}

#[pymethods]
impl HostSemaphore {
    /// The peer's rank.
    #[getter]
    fn peer(&self) -> usize {
        use mscclpp::transports::Connection;
        self.sem.connection().remote_rank()
    }

    /// Signals the peer's device (after every earlier write on the connection has landed).
    fn signal(&self, py: Python<'_>) -> PyResult<()> {
        let sem = self.sem.clone();
        py.detach(move || sem.signal()).py_err()
    }

    /// The bytes of `Host2DeviceSemaphoreDeviceHandle` (16: two device addresses).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &bytes_of(&self.sem.device_handle()))
    }
}

/// A memory channel to one peer: device code puts from the local `send` memory into the peer's
/// `recv` memory (mapped here) and signals/waits (`mscclpp/memory_channel.cuh`).
#[pyclass(name = "MemoryChannel", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct MemoryChannel {
    ch: channel::MemoryChannel,
    peer: usize,
    _recv: RegisteredMemory,
    _conn: Arc<AnyConnection>,
    _keep: Vec<Py<PyAny>>,
}

#[pymethods]
impl MemoryChannel {
    /// The peer's rank.
    #[getter]
    fn peer(&self) -> usize {
        self.peer
    }

    /// Bytes of the peer's `recv` memory (the channel's destination).
    #[getter]
    fn dst_nbytes(&self) -> usize {
        self.ch.dst_len()
    }

    /// Bytes of the local `send` memory (the channel's source).
    #[getter]
    fn src_nbytes(&self) -> usize {
        self.ch.src_len()
    }

    /// The bytes of `MemoryChannelDeviceHandle` (56: the semaphore's 32, then dst, src and the
    /// packet buffer's addresses).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &bytes_of(&self.ch.device_handle()))
    }
}

/// A port channel to one peer: device code posts put/signal/flush requests into a FIFO and a
/// proxy thread of this process carries them out on the connection (`mscclpp/port_channel.cuh`).
#[pyclass(name = "PortChannel", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct PortChannel {
    service: Mutex<Option<ProxyService>>,
    handle: mscclpp::hal::dev::PortChannelDeviceHandle,
    peer: usize,
    _keep: Vec<Py<PyAny>>,
}

#[pymethods]
impl PortChannel {
    /// The peer's rank.
    #[getter]
    fn peer(&self) -> usize {
        self.peer
    }

    /// The bytes of `PortChannelDeviceHandle` (ids, the semaphore's handle and the FIFO's).
    fn device_handle<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &bytes_of(&self.handle))
    }

    /// Stops the proxy thread (after the kernels using the channel have finished); raises the
    /// error that stopped it, if one did. Also done when the channel is freed.
    fn stop(&self, py: Python<'_>) -> PyResult<()> {
        let taken = self
            .service
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match taken {
            Some(mut s) => py.detach(move || s.stop()).py_err(),
            None => Ok(()),
        }
    }
}

/// What a channel call needs of the communicator.
pub(crate) struct Parts {
    pub comm: Arc<RawComm>,
    pub stream: Arc<dyn Stream>,
}

/// Local memory for a channel: a `Buffer`, or (on a GPU) a caller's array, wrapped.
pub(crate) type Memory = (BufferSlice, Py<PyAny>);

fn check_peer(p: &Parts, peer: usize, what: &str) -> PyResult<()> {
    if peer >= p.comm.nranks() || peer == p.comm.rank() {
        return Err(usage(format!(
            "{what}: peer {peer} is not another rank of this communicator (rank {} of {})",
            p.comm.rank(),
            p.comm.nranks()
        )));
    }
    Ok(())
}

/// A device-to-device semaphore with `peer` (collective with it).
pub(crate) fn memory_semaphore(py: Python<'_>, p: Parts, peer: usize) -> PyResult<MemorySemaphore> {
    check_peer(&p, peer, "memory_semaphore")?;
    py.detach(move || {
        let conn = p
            .comm
            .connect(peer, EndpointConfig::new(Transport::CudaIpc))?;
        let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&p.comm, &conn)?);
        Ok(MemorySemaphore { sem, _conn: conn })
    })
    .py_err()
}

/// A host-to-device semaphore with `peer` (collective with it).
pub(crate) fn host_semaphore(
    py: Python<'_>,
    p: Parts,
    peer: usize,
    transport: &str,
) -> PyResult<HostSemaphore> {
    check_peer(&p, peer, "host_semaphore")?;
    let t = parse_transport(transport)?;
    py.detach(move || {
        let conn = p.comm.connect(peer, EndpointConfig::new(t))?;
        let sem = Arc::new(Host2DeviceSemaphore::new(&p.comm, conn)?);
        Ok(HostSemaphore { sem })
    })
    .py_err()
}

/// A memory channel with `peer` (collective with it): `recv` is exposed to the peer.
pub(crate) fn memory_channel(
    py: Python<'_>,
    p: Parts,
    peer: usize,
    send: Memory,
    recv: Memory,
    packets: Option<Memory>,
) -> PyResult<MemoryChannel> {
    check_peer(&p, peer, "memory_channel")?;
    let mut keep = vec![send.1, recv.1];
    let (send, recv) = (send.0, recv.0);
    let packet_slice = packets.map(|(s, o)| {
        keep.push(o);
        s
    });
    let (ch, mine, conn) = py
        .detach(move || -> mscclpp::hal::Result<_> {
            let conn = p
                .comm
                .connect(peer, EndpointConfig::new(Transport::CudaIpc))?;
            let sem = Arc::new(MemoryDevice2DeviceSemaphore::new(&p.comm, &conn)?);
            // Earlier writes into `recv` must land before the peer can write there.
            p.stream.synchronize()?;
            let mine = p
                .comm
                .register_memory(&recv, TransportFlags::single(Transport::CudaIpc))?;
            let theirs = Arc::new(p.comm.exchange_memory(&mine, peer)?);
            let ch = channel::MemoryChannel::new(sem, theirs, send, packet_slice)?;
            Ok((ch, mine, conn))
        })
        .py_err()?;
    Ok(MemoryChannel {
        ch,
        peer,
        _recv: mine,
        _conn: conn,
        _keep: keep,
    })
}

/// A port channel with `peer` (collective with it), with a proxy service of its own.
pub(crate) fn port_channel(
    py: Python<'_>,
    p: Parts,
    peer: usize,
    send: Memory,
    recv: Memory,
    transport: &str,
    fifo_size: usize,
) -> PyResult<PortChannel> {
    check_peer(&p, peer, "port_channel")?;
    let t = parse_transport(transport)?;
    if !(1..=1 << 20).contains(&fifo_size) || !fifo_size.is_power_of_two() {
        return Err(usage(format!(
            "port_channel: fifo_size={fifo_size}: expected a power of two from 1 to 1048576"
        )));
    }
    let keep = vec![send.1, recv.1];
    let (send, recv) = (send.0, recv.0);
    let (service, handle) = py
        .detach(move || -> mscclpp::hal::Result<_> {
            let conn = p.comm.connect(peer, EndpointConfig::new(t))?;
            let sem = Arc::new(Host2DeviceSemaphore::new(&p.comm, conn)?);
            p.stream.synchronize()?;
            let flags = TransportFlags::single(t);
            let mine = p.comm.register_memory(&recv, flags)?;
            let theirs = p.comm.exchange_memory(&mine, peer)?;
            let local_src = p.comm.register_memory(&send, flags)?;
            let mut service = ProxyService::new(p.comm.device(), fifo_size)?;
            let sid = service.add_semaphore(sem)?;
            let dst = service.add_memory(Arc::new(theirs))?;
            let src = service.add_memory(Arc::new(local_src))?;
            // The peer's writes land in `recv` through this registration: it lives as long as
            // the service (whose memories table holds it).
            let _recv_id = service.add_memory(Arc::new(mine))?;
            let handle = service.port_channel(sid, dst, src)?;
            service.start()?;
            Ok((service, handle))
        })
        .py_err()?;
    Ok(PortChannel {
        service: Mutex::new(Some(service)),
        handle,
        peer,
        _keep: keep,
    })
}

// --------------------------------------------------------------------------------------------

/// A kernel compiled from a caller's source string.
#[pyclass(name = "Kernel", module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct Kernel {
    device: Arc<dyn Device>,
    source: &'static str,
    name: &'static str,
    file: &'static str,
    arg_size: Option<usize>,
    /// Loaded entry points by argument size (the module is compiled once per device).
    loaded: Mutex<HashMap<usize, Arc<dyn RawKernel>>>,
    streams: Mutex<HashMap<u64, Arc<dyn Stream>>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every update of these maps is one insert: a panic while held leaves them consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Kernel {
    fn load(&self, arg_size: usize) -> mscclpp::hal::Result<Arc<dyn RawKernel>> {
        if let Some(k) = lock(&self.loaded).get(&arg_size) {
            return Ok(k.clone());
        }
        // `Device::load` takes `&'static` modules (the library's are statics, and loaded modules
        // are cached by them for the process's life); a caller's module is leaked deliberately,
        // once per (source, argument size) of a `Kernel`.
        let defs: &'static [KernelDef] = Box::leak(Box::new([KernelDef {
            id: KernelId(self.name),
            param_size: arg_size,
            host: None,
        }]));
        let module: &'static KernelModule = Box::leak(Box::new(KernelModule {
            name: self.file,
            source: self.source,
            headers: &[],
            kernels: defs,
        }));
        let k = self.device.load(module, KernelId(self.name))?;
        lock(&self.loaded).insert(arg_size, k.clone());
        Ok(k)
    }

    fn stream(&self, handle: u64) -> PyResult<Arc<dyn Stream>> {
        let mut cache = lock(&self.streams);
        if let Some(s) = cache.get(&handle) {
            return Ok(s.clone());
        }
        // SAFETY: the caller's contract (documented on `launch`): `stream` is a live stream of
        // the kernel's device (0: the legacy default stream) that outlives the launches on it.
        let s = unsafe { self.device.wrap_stream(handle) }.py_err()?;
        cache.insert(handle, s.clone());
        Ok(s)
    }
}

fn dims(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<[u32; 3]> {
    let v: Vec<u32> = if let Ok(n) = obj.extract::<u32>() {
        vec![n]
    } else if let Ok(t) = obj.extract::<Vec<u32>>() {
        t
    } else {
        return Err(usage(format!(
            "{what}: expected an int or a tuple of 1 to 3 non-negative ints, got {}",
            obj.repr()?
        )));
    };
    if v.is_empty() || v.len() > 3 || v.contains(&0) {
        return Err(usage(format!(
            "{what}={v:?}: expected 1 to 3 dimensions, each at least 1"
        )));
    }
    let mut d = [1u32; 3];
    d[..v.len()].copy_from_slice(&v);
    Ok(d)
}

#[pymethods]
impl Kernel {
    /// The entry point's name.
    #[getter]
    fn name(&self) -> &'static str {
        self.name
    }

    /// Enqueues the kernel on `stream` (a `cudaStream_t`/`hipStream_t` handle as an int;
    /// default 0, the legacy default stream) and returns at once. `args` are the bytes of the
    /// kernel's one argument struct (e.g. `struct.pack` or concatenated `device_handle()`s);
    /// the objects whose addresses it holds must live until the kernel has run.
    #[pyo3(signature = (grid, block, args, *, stream = None, shared_mem = 0))]
    fn launch(
        &self,
        py: Python<'_>,
        grid: &Bound<'_, PyAny>,
        block: &Bound<'_, PyAny>,
        args: &[u8],
        stream: Option<u64>,
        shared_mem: u32,
    ) -> PyResult<()> {
        let cfg = LaunchConfig {
            grid: dims(grid, "grid")?,
            block: dims(block, "block")?,
            shared_mem_bytes: shared_mem,
        };
        if let Some(n) = self.arg_size.filter(|&n| n != args.len()) {
            return Err(usage(format!(
                "Kernel {}: compiled with arg_size={n} but launched with {} bytes of args",
                self.name,
                args.len()
            )));
        }
        let s = self.stream(stream.unwrap_or(0))?;
        let args = args.to_vec();
        py.detach(|| {
            let k = self.load(args.len())?;
            // SAFETY: the addresses inside `args` are the caller's contract, documented above:
            // memory of the kernel's device (or channel handles) alive until the kernel ran.
            unsafe { s.launch_raw(&*k, cfg, &args) }
        })
        .py_err()
    }

    /// Waits until the work on `stream` (default 0) has completed, at most `timeout` seconds;
    /// raises the first error it raised.
    #[pyo3(signature = (stream = None, timeout = 60.0))]
    fn synchronize(&self, py: Python<'_>, stream: Option<u64>, timeout: f64) -> PyResult<()> {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(usage(format!(
                "timeout={timeout}: expected a positive number of seconds"
            )));
        }
        let s = self.stream(stream.unwrap_or(0))?;
        py.detach(move || s.synchronize_timeout(std::time::Duration::from_secs_f64(timeout)))
            .py_err()
    }

    fn __repr__(&self) -> String {
        format!(
            "Kernel(name={:?}, device={})",
            self.name,
            self.device.info().ordinal
        )
    }
}

/// Compiles `source` for `device` with the library's device headers (`#include
/// "mscclpp/memory_channel.cuh"`, ...), through the backend's run-time compiler; `name` is an
/// `extern "C" __global__` function taking one argument struct by value.
pub(crate) fn compile(
    py: Python<'_>,
    device: Arc<dyn Device>,
    source: &str,
    name: &str,
    arg_size: Option<usize>,
) -> PyResult<Kernel> {
    let backend = device.info().backend;
    if backend == BackendKind::Host {
        return Err(new_err(
            Kind::Unavailable,
            "compile_kernel: the host backend has no device compiler (it runs only the \
             library's own kernels, as Rust functions); use a CUDA or ROCm device",
        ));
    }
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(usage(format!(
            "compile_kernel: name={name:?} is not a C identifier (the kernel's extern \"C\" name)"
        )));
    }
    if source.trim().is_empty() {
        return Err(usage("compile_kernel: the source is empty"));
    }
    // Kernel modules are `&'static` (see `Kernel::load`): the strings live for the process.
    let source: &'static str = Box::leak(source.to_owned().into_boxed_str());
    let name: &'static str = Box::leak(name.to_owned().into_boxed_str());
    let file: &'static str = Box::leak(format!("python/{name}.cu").into_boxed_str());
    let k = Kernel {
        device,
        source,
        name,
        file,
        arg_size,
        loaded: Mutex::new(HashMap::new()),
        streams: Mutex::new(HashMap::new()),
    };
    if let Some(n) = arg_size {
        // Compiled now, so that compile errors come from this call.
        py.detach(|| k.load(n)).py_err()?;
    }
    Ok(k)
}

/// Opens a device for `compile_kernel` without a communicator.
pub(crate) fn open_device(
    py: Python<'_>,
    ordinal: usize,
    backend: Option<&str>,
) -> PyResult<Arc<dyn Device>> {
    let kind = backend
        .map(|b| b.parse::<BackendKind>())
        .transpose()
        .py_err()?;
    py.detach(move || {
        let b = match kind {
            Some(k) => mscclpp::registry::probe(k)?,
            None => mscclpp::registry::select()?,
        };
        let count = b.device_count().max(1);
        if ordinal >= count {
            return Err(mscclpp::hal::Error::invalid(format!(
                "device={ordinal}: the {} backend has {count} device(s)",
                b.kind()
            )));
        }
        b.open_device(ordinal)
    })
    .py_err()
}
