//! NCCL, opened at run time, as the baseline measured in the same run on the same buffers and
//! stream (`--baseline nccl`).

use std::ffi::{CStr, c_char, c_int, c_void};

use mscclpp::hal::{CollectiveKind, DataType, Error, ReduceOp, Result};

/// `ncclUniqueId`: 128 opaque bytes, passed by value to `ncclCommInitRank`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// The bytes.
    pub internal: [u8; 128],
}

type Comm = *mut c_void;
type GetUniqueId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type InitRank = unsafe extern "C" fn(*mut Comm, c_int, UniqueId, c_int) -> c_int;
type Destroy = unsafe extern "C" fn(Comm) -> c_int;
type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;
type AllReduce = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;
type AllGather =
    unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, Comm, *mut c_void) -> c_int;
type Broadcast = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;

/// The NCCL library and one communicator.
pub struct Nccl {
    _lib: libloading::Library,
    comm: Comm,
    destroy: Destroy,
    error_string: ErrorString,
    all_reduce: AllReduce,
    all_gather: AllGather,
    reduce_scatter: AllReduce,
    broadcast: Broadcast,
    all_to_all: Option<AllGather>,
    /// Version string for the table.
    pub version: String,
}

impl std::fmt::Debug for Nccl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nccl")
            .field("version", &self.version)
            .finish()
    }
}

fn dtype_code(d: DataType) -> c_int {
    match d {
        DataType::F32 => 7,
        DataType::F16 => 6,
        DataType::BF16 => 9,
        DataType::I32 => 2,
        DataType::U32 => 3,
    }
}

fn op_code(o: ReduceOp) -> c_int {
    match o {
        ReduceOp::Sum => 0,
        ReduceOp::Prod => 1,
        ReduceOp::Max => 2,
        ReduceOp::Min => 3,
        ReduceOp::Avg => 4,
    }
}

impl Nccl {
    /// Opens `MSCCLPP_NCCL_LIB_PATH` or `libnccl.so.2`; `get_id` runs on rank 0 and `share`
    /// distributes the id (the caller's bootstrap broadcast).
    pub fn open(
        rank: usize,
        nranks: usize,
        share: impl FnOnce(Option<[u8; 128]>) -> Result<[u8; 128]>,
    ) -> Result<Nccl> {
        let path = mscclpp::hal::env::get("MSCCLPP_NCCL_LIB_PATH")
            .unwrap_or_else(|| "libnccl.so.2".into());
        mscclpp::hal::env::check_nccl_nvls("NCCL baseline")?;
        // SAFETY: loading NCCL runs its initialisers, as any program linking it does.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
            Error::unavailable(
                "NCCL baseline",
                format!("{path}: {}", mscclpp::hal::error::chain(&e)),
            )
        })?;
        macro_rules! sym {
            ($t:ty, $name:literal) => {{
                // SAFETY: the type is the C declaration of the symbol in NCCL's nccl.h.
                let s = unsafe { lib.get::<$t>($name) }.map_err(|e| {
                    Error::unavailable(
                        "NCCL baseline",
                        format!(
                            "{path} lacks {}: {e}",
                            String::from_utf8_lossy(&$name[..$name.len() - 1])
                        ),
                    )
                })?;
                *s
            }};
        }
        let get_id = sym!(GetUniqueId, b"ncclGetUniqueId\0");
        let init = sym!(InitRank, b"ncclCommInitRank\0");
        let destroy = sym!(Destroy, b"ncclCommDestroy\0");
        let error_string = sym!(ErrorString, b"ncclGetErrorString\0");
        let get_version = sym!(
            unsafe extern "C" fn(*mut c_int) -> c_int,
            b"ncclGetVersion\0"
        );
        let all_reduce = sym!(AllReduce, b"ncclAllReduce\0");
        let all_gather = sym!(AllGather, b"ncclAllGather\0");
        let reduce_scatter = sym!(AllReduce, b"ncclReduceScatter\0");
        let broadcast = sym!(Broadcast, b"ncclBroadcast\0");
        // SAFETY: as above; NCCL 2.28 names it ncclAlltoAll.
        let all_to_all = unsafe { lib.get::<AllGather>(b"ncclAlltoAll\0") }
            .ok()
            .map(|s| *s);
        let mut v: c_int = 0;
        // SAFETY: valid out-pointer.
        unsafe { get_version(&mut v) };
        let version = format!("{}.{}.{}", v / 10000, (v / 100) % 100, v % 100);
        let id = if rank == 0 {
            let mut id = UniqueId { internal: [0; 128] };
            // SAFETY: valid out-pointer to a 128-byte struct.
            let r = unsafe { get_id(&mut id) };
            if r != 0 {
                return Err(Error::unavailable(
                    "NCCL baseline",
                    format!("ncclGetUniqueId failed with {r}"),
                ));
            }
            share(Some(id.internal))?
        } else {
            share(None)?
        };
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointer; the id came from rank 0's ncclGetUniqueId.
        let r = unsafe {
            init(
                &mut comm,
                nranks as c_int,
                UniqueId { internal: id },
                rank as c_int,
            )
        };
        let nccl = Nccl {
            _lib: lib,
            comm,
            destroy,
            error_string,
            all_reduce,
            all_gather,
            reduce_scatter,
            broadcast,
            all_to_all,
            version,
        };
        nccl.check("ncclCommInitRank", r)?;
        Ok(nccl)
    }

    fn check(&self, call: &'static str, r: c_int) -> Result<()> {
        if r == 0 {
            return Ok(());
        }
        // SAFETY: NCCL returns a static NUL-terminated string for every result code.
        let msg = unsafe { CStr::from_ptr((self.error_string)(r)) }
            .to_string_lossy()
            .into_owned();
        Err(Error::Driver {
            backend: "nccl",
            call,
            code: i64::from(r),
            message: msg,
        })
    }

    /// Enqueues one collective on `stream` (a `CUstream`).
    #[allow(clippy::too_many_arguments)]
    pub fn run(
        &self,
        kind: CollectiveKind,
        input: u64,
        output: u64,
        count: usize,
        dtype: DataType,
        op: ReduceOp,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        let (i, o, s) = (
            input as *const c_void,
            output as *mut c_void,
            stream as *mut c_void,
        );
        let (d, p) = (dtype_code(dtype), op_code(op));
        // SAFETY: the buffers are device allocations of the sizes the collective needs (checked
        // by the caller, the same ones our collectives use) and `stream` is a live CUstream.
        let (call, r) = unsafe {
            match kind {
                CollectiveKind::AllReduce => (
                    "ncclAllReduce",
                    (self.all_reduce)(i, o, count, d, p, self.comm, s),
                ),
                CollectiveKind::AllGather => (
                    "ncclAllGather",
                    (self.all_gather)(i, o, count, d, self.comm, s),
                ),
                CollectiveKind::ReduceScatter => (
                    "ncclReduceScatter",
                    (self.reduce_scatter)(i, o, count, d, p, self.comm, s),
                ),
                CollectiveKind::Broadcast => (
                    "ncclBroadcast",
                    (self.broadcast)(i, o, count, d, root as c_int, self.comm, s),
                ),
                CollectiveKind::AllToAll => match self.all_to_all {
                    Some(f) => ("ncclAlltoAll", f(i, o, count, d, self.comm, s)),
                    None => {
                        return Err(Error::unavailable(
                            "ncclAlltoAll",
                            format!("NCCL {} has no all-to-all", self.version),
                        ));
                    }
                },
            }
        };
        self.check(call, r)
    }
}

impl Drop for Nccl {
    fn drop(&mut self) {
        // SAFETY: the communicator was created by ncclCommInitRank and is destroyed once.
        unsafe { (self.destroy)(self.comm) };
    }
}
