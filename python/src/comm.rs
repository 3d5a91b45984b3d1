//! `Communicator` and `UniqueId`: a rank's bootstrap, device, collectives and executor, and the
//! calls that take callers' arrays.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};

use mscclpp::collectives::{CollectiveCall, CollectiveKind, Collectives, P2pKind, P2pOp, Window};
use mscclpp::comm::{Bootstrap, BootstrapConfig, Communicator as RawComm, UniqueId as RawId};
use mscclpp::hal::{
    Backend, BackendKind, BufferSlice, DataType, Device, DeviceBuffer, ReduceOp, Stream,
};
use mscclpp_caller::Caller;
use mscclpp_executor::Plan;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString, PyType};

use crate::array::{self, ArrayView, Elem, Place};
use crate::channels;
use crate::errors::{IntoPy, usage};

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while a lock was held leaves these maps consistent (each update is one insert).
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A bootstrap unique id: the root's address and a random secret. The process that creates it
/// runs the root when it joins as a rank; the others receive it (`bytes(uid)`, pickling) and
/// join with it.
#[pyclass(name = "UniqueId", module = "mscclpp_rs", frozen, eq, hash)]
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PyUniqueId {
    id: RawId,
}

#[pymethods]
impl PyUniqueId {
    /// Creates an id and binds its root listener on `root` (`"ip:port"`, port 0 for any), by
    /// default on this host's address and an ephemeral port.
    #[new]
    #[pyo3(signature = (root = None))]
    fn new(root: Option<&str>) -> PyResult<Self> {
        let id = match root {
            None => RawId::new(),
            Some(r) => {
                let addr: std::net::SocketAddr = r.parse().map_err(|e| {
                    usage(format!(
                        "UniqueId root {r:?} is not an \"ip:port\" address: {e}"
                    ))
                })?;
                RawId::with_root(addr)
            }
        }
        .py_err()?;
        Ok(PyUniqueId { id })
    }

    /// Decodes the 128 bytes of `bytes(uid)`.
    #[staticmethod]
    fn from_bytes(data: &[u8]) -> PyResult<Self> {
        Ok(PyUniqueId {
            id: RawId::from_bytes(data).py_err()?,
        })
    }

    fn __bytes__<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.id.to_bytes())
    }

    /// The root's `"ip:port"`.
    #[getter]
    fn root(&self) -> String {
        self.id.root_addr().to_string()
    }

    fn __repr__(&self) -> String {
        format!("UniqueId(root={:?})", self.root())
    }

    fn __reduce__<'py>(
        slf: &Bound<'py, Self>,
    ) -> PyResult<(Bound<'py, PyAny>, (Bound<'py, PyBytes>,))> {
        let py = slf.py();
        let from = slf.get_type().getattr("from_bytes")?;
        Ok((from, (slf.get().__bytes__(py),)))
    }
}

fn parse_op(op: &str) -> PyResult<ReduceOp> {
    match op.to_ascii_lowercase().as_str() {
        "sum" => Ok(ReduceOp::Sum),
        "prod" | "product" => Ok(ReduceOp::Prod),
        "min" => Ok(ReduceOp::Min),
        "max" => Ok(ReduceOp::Max),
        "avg" | "mean" => Ok(ReduceOp::Avg),
        _ => Err(usage(format!(
            "unknown reduction op {op:?}: expected \"sum\", \"prod\", \"min\", \"max\" or \"avg\""
        ))),
    }
}

fn place_name(p: Place) -> String {
    match p {
        Place::Host => "host memory".into(),
        Place::Gpu { vendor, ordinal } if ordinal == usize::MAX => format!("{vendor} memory"),
        Place::Gpu { vendor, ordinal } => format!("{vendor}:{ordinal}"),
    }
}

/// Most distinct plans (by JSON text) decoded and kept per communicator.
const MAX_PLANS: usize = 64;

/// What every rank's communicator holds.
#[derive(Debug)]
struct Inner {
    /// The caller side the C library shares: the communicator, its collectives (or why there
    /// are none), its own stream, callers' wrapped streams, the plans' staged buffers.
    caller: Caller,
    /// Decoded plans by their JSON text (at most [`MAX_PLANS`]).
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

    fn colls(&self, what: &str) -> PyResult<Option<&Collectives>> {
        match (self.caller.collectives(), self.caller.no_collectives()) {
            (Some(c), _) => Ok(Some(c)),
            (None, Some(why)) => Err(crate::errors::new(
                crate::errors::Kind::Unavailable,
                format!("{what} not available: {why}"),
            )),
            (None, None) => Ok(None),
        }
    }

    /// The stream of a call: the communicator's own on the host backend, else the caller's
    /// (`explicit`, else the current stream of `like`'s library), wrapped once per handle.
    fn stream(
        &self,
        like: &Bound<'_, PyAny>,
        explicit: Option<u64>,
    ) -> PyResult<(Arc<dyn Stream>, Option<u64>)> {
        if self.host() {
            return Ok((self.caller.stream(explicit).py_err()?, None));
        }
        let h = match explicit {
            Some(h) => h,
            None => array::current_stream(like)?,
        };
        Ok((self.caller.stream(Some(h)).py_err()?, Some(h)))
    }

    /// Reads `obj` and checks that its memory belongs to this communicator's device.
    fn view(&self, obj: &Bound<'_, PyAny>, what: &str, stream: Option<u64>) -> PyResult<ArrayView> {
        let v = array::view(obj, what, stream)?;
        let info = self.device().info();
        let ok = match (v.place, info.backend) {
            (Place::Host, BackendKind::Host) => true,
            (Place::Gpu { vendor, ordinal }, b) => {
                vendor == b && (ordinal == usize::MAX || ordinal == info.ordinal)
            }
            _ => false,
        };
        if !ok {
            let mine = match info.backend {
                BackendKind::Host => "the host backend (host memory: NumPy, CPU tensors)".into(),
                b => format!("{b}:{}", info.ordinal),
            };
            return Err(usage(format!(
                "{what}: an array in {}, but this communicator runs on {mine}",
                place_name(v.place)
            )));
        }
        Ok(v)
    }

    /// Wraps a view's memory (not copied, not owned).
    fn wrap(&self, v: &ArrayView) -> PyResult<DeviceBuffer> {
        // SAFETY: the view describes the memory of a live caller object on this device (checked
        // by `view`); the caller keeps it alive until the call has run on its stream, as
        // documented on every call.
        unsafe { self.caller.wrap(v.ptr, v.nbytes()) }.py_err()
    }
}

/// The element type of a call over `views`: `dtype` when given (of the arrays' element size),
/// else the arrays' common type.
fn call_dtype(
    views: &[(&str, &ArrayView)],
    dtype: Option<DataType>,
    reduces: bool,
) -> PyResult<DataType> {
    let (first_name, first) = views[0];
    for (name, v) in &views[1..] {
        if v.elem.size() != first.elem.size() || (dtype.is_none() && v.elem != first.elem) {
            // Two raw types of one size count as different: their names are unknown.
            return Err(usage(format!(
                "{first_name} is {} but {name} is {}: both must have the same element type",
                first.elem.name(),
                v.elem.name()
            )));
        }
    }
    match (dtype, first.elem) {
        (Some(t), e) if t.size() != e.size() => Err(usage(format!(
            "dtype={}: {} bytes per element, but {first_name} is {} ({} bytes)",
            array::dtype_name(t),
            t.size(),
            e.name(),
            e.size()
        ))),
        (Some(t), _) => Ok(t),
        (None, Elem::Known(t)) => Ok(t),
        (None, Elem::Bool) if reduces => Err(usage(
            "bool arrays cannot be reduced (pass dtype=\"uint8\" to reduce their bytes)",
        )),
        (None, Elem::Bool) => Ok(DataType::U8),
        (None, Elem::Raw { size }) => Err(usage(format!(
            "{first_name}: its element type ({size} bytes: int16, uint16, complex or another \
             float8 format) has no collective here; pass dtype= to move or reduce it as a type \
             of the same size"
        ))),
    }
}

/// A send or receive queued in a `group()`.
#[derive(Debug)]
struct Pending {
    kind: P2pKind,
    obj: Py<PyAny>,
    peer: usize,
    stream: Option<u64>,
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

enum Rendezvous {
    Id(RawId),
    Addr(String),
}

fn open(
    py: Python<'_>,
    how: Option<(Rendezvous, usize, usize)>,
    device: Option<usize>,
    backend: Option<&str>,
) -> PyResult<Communicator> {
    let backend_kind = backend
        .map(|b| b.parse::<BackendKind>())
        .transpose()
        .py_err()?;
    let inner = py.detach(move || -> mscclpp::hal::Result<Inner> {
        let cfg = BootstrapConfig::from_env()?;
        let boot = Arc::new(match how {
            None => Bootstrap::from_env(cfg)?,
            Some((Rendezvous::Id(id), rank, size)) => Bootstrap::new(&id, rank, size, cfg)?,
            Some((Rendezvous::Addr(a), rank, size)) => Bootstrap::from_addr(&a, rank, size, cfg)?,
        });
        let backend: Arc<dyn Backend> = match backend_kind {
            Some(k) => mscclpp::registry::probe(k)?,
            None => mscclpp::registry::select()?,
        };
        let count = backend.device_count().max(1);
        let ordinal = match device {
            Some(d) if d >= count => {
                return Err(mscclpp::hal::Error::invalid(format!(
                    "device={d}: the {} backend has {count} device(s)",
                    backend.kind()
                )));
            }
            Some(d) => d,
            None => boot.local_rank().unwrap_or_else(|| boot.host_rank()) % count,
        };
        let dev = backend.open_device(ordinal)?;
        let caller = Caller::new(Arc::new(RawComm::new(boot, dev)))?;
        let comm = caller.communicator();
        tracing::info!(
            rank = comm.rank(),
            nranks = comm.nranks(),
            device = ordinal,
            backend = %comm.device().info().backend,
            "python communicator ready"
        );
        Ok(Inner {
            caller,
            plans: Mutex::new(HashMap::new()),
            registered: Mutex::new(Vec::new()),
        })
    });
    Ok(Communicator {
        inner: RwLock::new(Some(Arc::new(inner.py_err()?))),
        group: Mutex::new(None),
    })
}

impl Communicator {
    fn parts(&self) -> PyResult<channels::Parts> {
        let inner = self.inner()?;
        Ok(channels::Parts {
            comm: inner.comm().clone(),
            stream: inner.caller.internal().clone(),
        })
    }

    /// Local memory of a channel: a `Buffer` of this communicator's device, or on a GPU a
    /// caller's array (wrapped, not copied; a peer may map it).
    fn channel_memory(&self, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<channels::Memory> {
        let inner = self.inner()?;
        if let Ok(b) = obj.cast::<channels::Buffer>() {
            let buf = &b.get().buf;
            let dev = inner.device().info();
            let ordinal = buf.allocation().device_ordinal();
            if buf.backend() != dev.backend || ordinal != dev.ordinal {
                return Err(usage(format!(
                    "{what}: a Buffer of {}:{ordinal}, but this communicator runs on {}:{}",
                    buf.backend(),
                    dev.backend,
                    dev.ordinal
                )));
            }
            return Ok((buf.full(), obj.clone().unbind()));
        }
        if inner.host() {
            return Err(usage(format!(
                "{what}: on the host backend channel memory must come from \
                 Communicator.alloc() (shared memory the peer can map), not {}",
                obj.get_type().name()?
            )));
        }
        // Memory a peer maps may be a caller's array too: CudaIpc exports the allocation that
        // holds it (torch's caching allocator's segment) with the array's offset in it.
        let v = inner.view(obj, what, None)?;
        if v.nbytes() == 0 {
            return Err(usage(format!("{what}: an empty array")));
        }
        Ok((inner.wrap(&v)?.full(), obj.clone().unbind()))
    }

    pub(crate) fn compile_kernel_on(
        &self,
        py: Python<'_>,
        source: &str,
        name: &str,
        arg_size: Option<usize>,
    ) -> PyResult<channels::Kernel> {
        let dev = self.inner()?.device().clone();
        channels::compile(py, dev, source, name, arg_size)
    }

    fn inner(&self) -> PyResult<Arc<Inner>> {
        self.inner
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(|| usage("this communicator was closed"))
    }

    #[allow(clippy::too_many_arguments)]
    fn collective(
        &self,
        py: Python<'_>,
        kind: CollectiveKind,
        input: &Bound<'_, PyAny>,
        output: &Bound<'_, PyAny>,
        op: ReduceOp,
        root: usize,
        stream: Option<u64>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let inner = self.inner()?;
        let n = inner.comm().nranks();
        let name = match kind {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::AllToAll => "all_to_all",
        };
        if kind == CollectiveKind::Broadcast && root >= n {
            return Err(usage(format!("{name}: root {root} is not a rank of {n}")));
        }
        let (s, handle) = inner.stream(output, stream)?;
        let vin = inner.view(input, "input", handle)?;
        let vout = inner.view(output, "output", handle)?;
        let dtype = dtype.map(array::parse_dtype).transpose()?;
        let reduces = matches!(
            kind,
            CollectiveKind::AllReduce | CollectiveKind::ReduceScatter
        );
        let dt = call_dtype(&[("input", &vin), ("output", &vout)], dtype, reduces)?;
        let (count, want_in, want_out) = match kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => (vin.len, vin.len, vin.len),
            CollectiveKind::AllGather => (vin.len, vin.len, vin.len * n),
            CollectiveKind::ReduceScatter => (vout.len, vout.len * n, vout.len),
            CollectiveKind::AllToAll => {
                if vin.len % n != 0 {
                    return Err(usage(format!(
                        "{name}: input of {} elements is not {n} equal blocks (one per rank)",
                        vin.len
                    )));
                }
                (vin.len / n, vin.len, vin.len)
            }
        };
        if vin.len != want_in || vout.len != want_out {
            return Err(usage(format!(
                "{name} over {n} ranks: input of {} and output of {} elements were given; \
                 {want_in} and {want_out} are needed",
                vin.len, vout.len
            )));
        }
        if count == 0 {
            return Ok(());
        }
        inner.colls(name)?;
        let bin = inner.wrap(&vin)?;
        let bout = inner.wrap(&vout)?;
        let registered =
            kind == CollectiveKind::AllReduce && inner.is_registered(vin.ptr, vin.nbytes() as u64);
        py.detach(move || {
            let (i, o) = (bin.full(), bout.full());
            inner.caller.collective(
                &CollectiveCall::new(kind, &i, &o, count, dt)
                    .op(op)
                    .root(root)
                    .registered(registered),
                &*s,
            )
        })
        .py_err()
    }

    fn p2p(
        &self,
        py: Python<'_>,
        ops: &[(P2pKind, Bound<'_, PyAny>, usize, Option<u64>)],
    ) -> PyResult<()> {
        let inner = self.inner()?;
        let n = inner.comm().nranks();
        let Some(first) = ops.first() else {
            return Ok(());
        };
        if let Some(o) = ops.iter().find(|o| o.3 != first.3) {
            return Err(usage(format!(
                "the sends and receives of one group run on one stream: stream={:?} and stream={:?} were given",
                first.3, o.3
            )));
        }
        let (s, handle) = inner.stream(&first.1, first.3)?;
        let mut buffers = Vec::with_capacity(ops.len());
        for (kind, obj, peer, _) in ops {
            let what = if *kind == P2pKind::Send {
                "send"
            } else {
                "recv"
            };
            if *peer >= n {
                return Err(usage(format!("{what}: peer {peer} is not a rank of {n}")));
            }
            let v = inner.view(obj, what, handle)?;
            let buf = if v.nbytes() == 0 {
                None
            } else {
                Some(inner.wrap(&v)?)
            };
            buffers.push((*kind, *peer, buf, v.nbytes()));
        }
        inner.colls("send/recv")?;
        py.detach(move || {
            let slices: Vec<(P2pKind, usize, BufferSlice, usize)> = buffers
                .iter()
                .filter_map(|(k, p, b, bytes)| b.as_ref().map(|b| (*k, *p, b.full(), *bytes)))
                .collect();
            let ops: Vec<P2pOp> = slices
                .iter()
                .map(|(kind, peer, buffer, bytes)| P2pOp {
                    kind: *kind,
                    peer: *peer,
                    buffer,
                    bytes: *bytes,
                })
                .collect();
            inner.caller.send_recv(&ops, &*s)
        })
        .py_err()
    }

    fn send_or_queue(
        &self,
        py: Python<'_>,
        kind: P2pKind,
        obj: &Bound<'_, PyAny>,
        peer: usize,
        stream: Option<u64>,
    ) -> PyResult<()> {
        {
            let mut g = lock(&self.group);
            if let Some(pending) = g.as_mut() {
                pending.push(Pending {
                    kind,
                    obj: obj.clone().unbind(),
                    peer,
                    stream,
                });
                return Ok(());
            }
        }
        self.p2p(py, &[(kind, obj.clone(), peer, stream)])
    }
}

/// A buffer registered with every rank's collectives ([`Communicator::register`]).
#[pyclass(module = "mscclpp_rs", frozen)]
#[derive(Debug)]
pub struct RegisteredBuffer {
    window: Mutex<Option<Window>>,
    /// Its device range, as `Inner::registered` holds it.
    range: (u64, u64),
    /// The wrapper of the caller's memory and the caller's object: both live as long as the
    /// registration.
    _buffer: DeviceBuffer,
    array: Py<PyAny>,
}

#[pymethods]
impl RegisteredBuffer {
    /// The registered array.
    #[getter]
    fn array(&self, py: Python<'_>) -> Py<PyAny> {
        self.array.clone_ref(py)
    }

    /// Whether it is still registered.
    #[getter]
    fn registered(&self) -> bool {
        lock(&self.window).is_some()
    }
}

/// The context manager `Communicator.group()` returns.
#[pyclass(module = "mscclpp_rs")]
#[derive(Debug)]
pub struct Group {
    comm: Py<Communicator>,
}

#[pymethods]
impl Group {
    fn __enter__(slf: PyRef<'_, Self>) -> PyResult<PyRef<'_, Self>> {
        {
            let comm = slf.comm.get();
            let mut g = lock(&comm.group);
            if g.is_some() {
                return Err(usage("a group() is already open on this communicator"));
            }
            *g = Some(Vec::new());
        }
        Ok(slf)
    }

    #[pyo3(signature = (exc_type = None, _exc = None, _tb = None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc: Option<&Bound<'_, PyAny>>,
        _tb: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let comm = self.comm.get();
        let pending = lock(&comm.group).take().unwrap_or_default();
        if exc_type.is_some_and(|t| !t.is_none()) {
            // The body failed: its sends and receives are dropped, the exception goes on.
            return Ok(false);
        }
        let ops: Vec<_> = pending
            .into_iter()
            .map(|p| (p.kind, p.obj.into_bound(py), p.peer, p.stream))
            .collect();
        comm.p2p(py, &ops)?;
        Ok(false)
    }
}

/// `bytes`, `str` (a path, or JSON text when it starts with `{`) or `os.PathLike`: the plan's
/// JSON bytes.
fn plan_bytes(plan: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    if let Ok(b) = plan.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    let text = if let Ok(s) = plan.cast::<PyString>() {
        s.to_string()
    } else {
        let os = plan.py().import("os")?;
        os.call_method1("fspath", (plan,))
            .map_err(|_| {
                pyo3::exceptions::PyTypeError::new_err("plan: expected a path, JSON text or bytes")
            })?
            .extract::<String>()?
    };
    if text.trim_start().starts_with('{') {
        return Ok(text.into_bytes());
    }
    std::fs::read(&text).map_err(|e| {
        crate::errors::new(
            crate::errors::Kind::InvalidUsage,
            format!("reading execution plan {text:?}: {e}"),
        )
    })
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
        let how = if let Ok(u) = id.cast::<PyUniqueId>() {
            Rendezvous::Id(u.get().id)
        } else if let Ok(b) = id.cast::<PyBytes>() {
            Rendezvous::Id(RawId::from_bytes(b.as_bytes()).py_err()?)
        } else if let Ok(s) = id.cast::<PyString>() {
            Rendezvous::Addr(s.to_string())
        } else {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "id: expected a UniqueId, its bytes or an \"ip:port\" string, got {}",
                id.get_type().name()?
            )));
        };
        open(py, Some((how, rank, size)), device, backend)
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
        open(py, None, device, backend)
    }

    /// All-reduces so far whose peers read a registered input in place instead of a copy
    /// (see `register`): the zero-copy path at the sizes where it pays.
    #[getter]
    fn zero_copy_calls(&self) -> PyResult<u64> {
        Ok(self
            .inner()?
            .caller
            .collectives()
            .map_or(0, Collectives::zero_copy_calls))
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
        let inner = self.inner()?;
        if inner.host() {
            return Err(crate::errors::new(
                crate::errors::Kind::Unavailable,
                "register: the host backend maps only memory it allocated itself (shared \
                 memory), not arrays of the process heap such as NumPy's; its collectives \
                 need no registration",
            ));
        }
        let v = inner.view(tensor, "register", None)?;
        if v.nbytes() == 0 {
            return Err(usage("register: an empty array"));
        }
        let buffer = inner.wrap(&v)?;
        inner.colls("register")?;
        let slice = buffer.full();
        let inner2 = inner.clone();
        let window = py.detach(move || match inner2.caller.collectives() {
            Some(c) => c.register(&slice),
            None => Err(mscclpp::hal::Error::unavailable(
                "registering a buffer",
                "a communicator of one rank has no collectives to register with",
            )),
        });
        let window = window.py_err()?;
        let range = (buffer.ptr().0, buffer.len() as u64);
        lock(&inner.registered).push(range);
        Ok(RegisteredBuffer {
            window: Mutex::new(Some(window)),
            range,
            _buffer: buffer,
            array: tensor.clone().unbind(),
        })
    }

    /// Ends a registration (collective, in the same order on every rank) once every call using
    /// it has finished on its stream.
    fn deregister(&self, py: Python<'_>, buffer: &RegisteredBuffer) -> PyResult<()> {
        let inner = self.inner()?;
        let w = lock(&buffer.window)
            .take()
            .ok_or_else(|| usage("deregister: this buffer is not registered (any more)"))?;
        {
            let mut reg = lock(&inner.registered);
            if let Some(i) = reg.iter().position(|r| *r == buffer.range) {
                reg.swap_remove(i);
            }
        }
        inner.colls("deregister")?;
        py.detach(move || match inner.caller.collectives() {
            Some(c) => c.deregister(w),
            None => Ok(()),
        })
        .py_err()
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
        let inner = self.inner()?;
        let bytes = plan_bytes(plan)?;
        let op = op.map(parse_op).transpose()?;
        let (s, handle) = inner.stream(recv, stream)?;
        let vin = inner.view(send, "send", handle)?;
        let vout = inner.view(recv, "recv", handle)?;
        let dtype = dtype.map(array::parse_dtype).transpose()?;
        let dt = call_dtype(&[("send", &vin), ("recv", &vout)], dtype, false)?;
        if vin.nbytes() == 0 || vout.nbytes() == 0 {
            return Err(usage("execute_plan: empty send or recv array"));
        }
        let bin = inner.wrap(&vin)?;
        let bout = inner.wrap(&vout)?;
        py.detach(move || -> mscclpp::hal::Result<()> {
            let n = inner.comm().nranks();
            let plan = {
                let cached = lock(&inner.plans).get(&bytes).cloned();
                match cached {
                    Some(p) => p,
                    None => {
                        let p = Arc::new(Plan::from_bytes(&bytes, n)?);
                        let mut plans = lock(&inner.plans);
                        if plans.len() < MAX_PLANS {
                            plans.insert(bytes, p.clone());
                        }
                        p
                    }
                }
            };
            // Staged as the plan says (the peers map only the library's own memory), in the
            // communicator's launch order: in place or not, for any pair of arrays.
            let ran = inner
                .caller
                .run_plan(&plan, &bin.full(), &bout.full(), dt, op, &*s)?;
            if ran {
                Ok(())
            } else {
                Err(mscclpp::hal::Error::invalid(format!(
                    "execute_plan: {} (plan, size) pairs are staged on this communicator already;                      its buffers are kept for good, so use fewer sizes or another communicator",
                    mscclpp_caller::MAX_STAGED
                )))
            }
        })
        .py_err()?;
        Ok(recv.clone().unbind())
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
