//! An NCCL net plugin, opened at run time: the newest of the `ncclNet_v6` … `v12` tables
//! (layouts in [`super::abi`]) the plugin exports, behind one safe wrapper.
//!
//! Which file: `NCCL_NET_PLUGIN` as NCCL reads it — a path (it holds a `/` or ends in `.so`), a
//! name (`libnccl-net-<name>.so`), or `none`; unset, `libnccl-net.so`. Every call into the
//! plugin is made under one lock: plugins are written for NCCL's proxy threads, and nothing
//! here needs two calls at once.

use std::ffi::{CStr, c_char, c_int, c_ulong, c_void};
use std::sync::{Arc, Mutex, OnceLock};

use mscclpp_hal::{Error, Result};

use super::abi::{
    CommConfig, Logger, NCCL_SUCCESS, NcclResult, Ptr, SYMBOLS, TRAFFIC_CLASS_UNDEF, Table, each,
};

/// The newest ncclNet version to take (unset: the newest the plugin exports).
pub const ABI_VAR: &str = "MSCCLPP_NET_PLUGIN_ABI";

/// `NCCL_NET_HANDLE_MAXSIZE`: the bytes of a listen handle.
pub const HANDLE_BYTES: usize = 128;
/// `NCCL_PTR_HOST`, `NCCL_PTR_CUDA`, `NCCL_PTR_DMABUF`.
pub const PTR_HOST: c_int = 1;
/// Device memory can be registered.
pub const PTR_CUDA: c_int = 2;
/// DMA-BUF registration.
pub const PTR_DMABUF: c_int = 4;

/// What a device of the plugin reports (`getProperties`).
#[derive(Debug, Clone, PartialEq)]
pub struct NetProperties {
    /// The device's name.
    pub name: String,
    /// Its PCI path in /sys.
    pub pci_path: String,
    /// The NIC's unique id.
    pub guid: u64,
    /// `NCCL_PTR_*` bits: which memory `regMr` takes.
    pub ptr_support: i32,
    /// Registrations are not tied to a comm.
    pub reg_is_global: bool,
    /// Port speed in Mbit/s.
    pub speed_mbps: i32,
    /// Port number.
    pub port: i32,
    /// Latency, in µs as the plugin reports it.
    pub latency_us: f32,
    /// Comms the device can hold.
    pub max_comms: i32,
    /// Receives groupable in one `irecv`.
    pub max_recvs: i32,
    /// Largest point-to-point transfer (v9+; `None` before).
    pub max_p2p_bytes: Option<usize>,
}

/// A loaded, initialised plugin.
pub struct Plugin {
    /// The file opened.
    pub path: String,
    /// The exported table's version (6 to 12).
    pub version: u32,
    /// The plugin's own name.
    pub name: String,
    table: Table,
    /// The context `init` returned (v11 and newer; null before).
    ctx: Ptr,
    /// `init` succeeded: only then is there anything for `finalize` to end (NCCL never
    /// finalises a plugin whose init failed).
    initialised: bool,
    /// Serialises every call (see the module doc).
    lock: Mutex<()>,
    _lib: libloading::Library,
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Plugin({} v{} from {})",
            self.name, self.version, self.path
        )
    }
}

// SAFETY: the plugin's tables and comms are plain pointers the plugin owns; every call into it
// is serialised by `lock`, and the library stays loaded as long as the value lives.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

/// The file `NCCL_NET_PLUGIN` names (`None`: `none`, plugins disabled).
pub fn plugin_file() -> Option<String> {
    match mscclpp_hal::env::get("NCCL_NET_PLUGIN") {
        None => Some("libnccl-net.so".into()),
        Some(v) if v.trim().is_empty() => Some("libnccl-net.so".into()),
        Some(v) if v.trim().eq_ignore_ascii_case("none") => None,
        Some(v) if v.contains('/') || v.ends_with(".so") => Some(v.trim().into()),
        Some(v) => Some(format!("libnccl-net-{}.so", v.trim())),
    }
}

/// The process's plugin, loaded and initialised at the first call; the error names the file and
/// the symbol.
pub fn plugin() -> Result<Arc<Plugin>> {
    static P: OnceLock<std::result::Result<Arc<Plugin>, String>> = OnceLock::new();
    P.get_or_init(|| match plugin_file() {
        None => Err("NCCL_NET_PLUGIN=none disables net plugins".into()),
        Some(f) => Plugin::open(&f).map(Arc::new).map_err(|e| e.to_string()),
    })
    .clone()
    .map_err(|why| Error::unavailable("an NCCL net plugin", why))
}

fn logger() -> Logger {
    let f: extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char) =
        mscclpp_hal::plugin_log::plugin_log;
    // SAFETY: a variadic C call passes its named arguments as a plain call does (System V
    // x86-64 and AAPCS64 on Linux), so a function taking exactly the named ones reads them
    // correctly and never touches the rest.
    unsafe {
        std::mem::transmute::<
            extern "C" fn(c_int, c_ulong, *const c_char, c_int, *const c_char),
            Logger,
        >(f)
    }
}

impl Plugin {
    /// Opens `file`, takes the newest table it exports (v12 down to v6, or down from
    /// `MSCCLPP_NET_PLUGIN_ABI` where that is set) and initialises it.
    pub fn open(file: &str) -> Result<Plugin> {
        let cap = mscclpp_hal::env::parse::<u32>(ABI_VAR, "an ncclNet version, 6 to 12")?;
        Plugin::open_with(file, cap)
    }

    /// [`Plugin::open`] taking no table newer than `max_version` (all when `None`): for a
    /// plugin whose newest table misbehaves, and to drive each table of one plugin in tests.
    pub fn open_with(file: &str, max_version: Option<u32>) -> Result<Plugin> {
        if let Some(v) = max_version.filter(|v| !(6..=12).contains(v)) {
            return Err(Error::invalid(format!(
                "{ABI_VAR}={v}: this build speaks ncclNet v6 to v12"
            )));
        }
        let cap = max_version.unwrap_or(12);
        // SAFETY: opening a shared library runs its initialisers; a net plugin is a library
        // built to be loaded into a communication process.
        let lib = unsafe { libloading::Library::new(file) }.map_err(|e| {
            Error::unavailable(
                format!("the NCCL net plugin {file}"),
                format!("it could not be opened: {e}"),
            )
        })?;
        // SAFETY: each symbol, when present, is the plugin's static table of that version's
        // layout, alive as long as the library stays loaded (it moves into `Plugin`).
        let found = SYMBOLS
            .iter()
            .filter(|&&(_, v)| v <= cap)
            .find_map(|&(sym, v)| unsafe {
                let s = lib.get::<*const c_void>(sym).ok()?;
                Table::at(v, *s).map(|t| (v, t))
            });
        let Some((version, table)) = found else {
            return Err(Error::unavailable(
                format!("the NCCL net plugin {file}"),
                format!(
                    "it exports none of the symbols ncclNetPlugin_v{cap} … ncclNetPlugin_v6 (this \
                     build speaks v6 to v12{})",
                    if cap < 12 {
                        format!("; {ABI_VAR} takes none newer than v{cap}")
                    } else {
                        String::new()
                    }
                ),
            ));
        };
        let name_ptr = table.name();
        let name = if name_ptr.is_null() {
            "(unnamed)".to_string()
        } else {
            // SAFETY: the table's name is a static NUL-terminated string of the plugin.
            unsafe { CStr::from_ptr(name_ptr) }
                .to_string_lossy()
                .into_owned()
        };
        let p = Plugin {
            path: file.to_string(),
            version,
            name,
            table,
            ctx: std::ptr::null_mut(),
            initialised: false,
            lock: Mutex::new(()),
            _lib: lib,
        };
        let mut p = p;
        let mut ctx: Ptr = std::ptr::null_mut();
        let mut cfg = CommConfig {
            traffic_class: TRAFFIC_CLASS_UNDEF,
        };
        // One context serves the whole process: NCCL makes one per communicator, but nothing
        // here is per communicator (the comm id only names it in the plugin's logs).
        let comm_id = u64::from(std::process::id());
        // SAFETY: init is called once, before any other call, with a logger of the right
        // calling convention, no profiler, and (v11+) valid out- and config pointers.
        let rc = p.call(|| unsafe {
            match p.table {
                Table::V6(t) => (t.init)(Some(logger())),
                Table::V7(t) => (t.init)(Some(logger())),
                Table::V8(t) => (t.init)(Some(logger())),
                Table::V9(t) => (t.init)(Some(logger())),
                Table::V10(t) => (t.init)(Some(logger()), std::ptr::null_mut()),
                Table::V11(t) => (t.init)(
                    &mut ctx,
                    comm_id,
                    &mut cfg,
                    Some(logger()),
                    std::ptr::null_mut(),
                ),
                Table::V12(t) => (t.init)(
                    &mut ctx,
                    comm_id,
                    &mut cfg,
                    Some(logger()),
                    std::ptr::null_mut(),
                ),
            }
        });
        p.check(rc, "init")?;
        p.ctx = ctx;
        p.initialised = true;
        tracing::info!(plugin = %p.name, version = p.version, path = %p.path, "NCCL net plugin loaded");
        Ok(p)
    }

    fn call<T>(&self, f: impl FnOnce() -> T) -> T {
        let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        f()
    }

    fn check(&self, rc: NcclResult, what: &str) -> Result<()> {
        if rc == NCCL_SUCCESS {
            return Ok(());
        }
        // ncclResult_t: 1 unhandled CUDA error, 2 system, 3 internal, 4 invalid argument,
        // 5 invalid usage, 6 remote.
        let kind = match rc {
            1 => "unhandled CUDA error",
            2 => "system error",
            3 => "internal error",
            4 => "invalid argument",
            5 => "invalid usage",
            6 => "remote error",
            _ => "error",
        };
        Err(Error::io(
            format!("{}'s {what} ({})", self.name, self.path),
            std::io::Error::other(format!("ncclResult_t {rc} ({kind})")),
        ))
    }

    /// `bytes` as the `int` the versions before `sized_from` take (refused above `INT_MAX`, not
    /// truncated); from that version on the call takes a `size_t` and this value is not used.
    fn int_size(&self, bytes: usize, what: &str, sized_from: u32) -> Result<c_int> {
        match c_int::try_from(bytes) {
            Ok(n) => Ok(n),
            Err(_) if self.version >= sized_from => Ok(c_int::MAX),
            Err(_) => Err(Error::invalid(format!(
                "a net {what} of {bytes} bytes (ncclNet v{} takes an int)",
                self.version
            ))),
        }
    }

    /// Devices the plugin drives.
    pub fn devices(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: valid out-pointer.
        let rc = self.call(|| unsafe { each!(self.table, t => (t.devices)(&mut n)) });
        self.check(rc, "devices")?;
        Ok(usize::try_from(n).unwrap_or(0))
    }

    /// What device `dev` reports.
    pub fn properties(&self, dev: usize) -> Result<NetProperties> {
        let d = c_int::try_from(dev).map_err(|_| Error::invalid(format!("net device {dev}")))?;
        let s = |p: *mut c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: the plugin's NUL-terminated strings, owned by it for its life.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // The fields every version has, then what the version adds.
        macro_rules! props {
            ($t:expr, $ty:ty, |$p:ident| $extra:expr) => {{
                // SAFETY: an all-zero properties struct is valid (null pointers, zero numbers).
                let mut $p: $ty = unsafe { std::mem::zeroed() };
                // SAFETY: a valid out-pointer of the version's layout.
                let rc = self.call(|| unsafe { ($t.get_properties)(d, &mut $p) });
                self.check(rc, "getProperties")?;
                let (reg_is_global, max_p2p_bytes): (bool, Option<usize>) = $extra;
                NetProperties {
                    name: s($p.name),
                    pci_path: s($p.pci_path),
                    guid: $p.guid,
                    ptr_support: $p.ptr_support,
                    reg_is_global,
                    speed_mbps: $p.speed,
                    port: $p.port,
                    latency_us: $p.latency,
                    max_comms: $p.max_comms,
                    max_recvs: $p.max_recvs,
                    max_p2p_bytes,
                }
            }};
        }
        use super::abi::{PropsV6, PropsV7, PropsV8, PropsV9, PropsV11, PropsV12};
        Ok(match self.table {
            Table::V6(t) => props!(t, PropsV6, |p| (false, None)),
            Table::V7(t) => props!(t, PropsV7, |p| (false, None)),
            Table::V8(t) => props!(t, PropsV8, |p| (p.reg_is_global != 0, None)),
            Table::V9(t) => props!(t, PropsV9, |p| (
                p.reg_is_global != 0,
                Some(p.max_p2p_bytes)
            )),
            Table::V10(t) => props!(t, PropsV9, |p| (
                p.reg_is_global != 0,
                Some(p.max_p2p_bytes)
            )),
            Table::V11(t) => props!(t, PropsV11, |p| (
                p.reg_is_global != 0,
                Some(p.max_p2p_bytes)
            )),
            Table::V12(t) => props!(t, PropsV12, |p| (
                p.reg_is_global != 0,
                Some(p.max_p2p_bytes)
            )),
        })
    }

    /// Starts listening on `dev`: the handle a peer connects with, and the listen comm.
    pub fn listen(&self, dev: usize) -> Result<([u8; HANDLE_BYTES], Comm)> {
        let d = c_int::try_from(dev).map_err(|_| Error::invalid(format!("net device {dev}")))?;
        let mut handle = [0u8; HANDLE_BYTES];
        let mut comm: Ptr = std::ptr::null_mut();
        let h = handle.as_mut_ptr().cast::<c_void>();
        let ctx = self.ctx;
        // SAFETY: a handle buffer of NCCL_NET_HANDLE_MAXSIZE bytes and a valid out-pointer.
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V6(t) => (t.listen)(d, h, &mut comm),
                Table::V7(t) => (t.listen)(d, h, &mut comm),
                Table::V8(t) => (t.listen)(d, h, &mut comm),
                Table::V9(t) => (t.listen)(d, h, &mut comm),
                Table::V10(t) => (t.listen)(d, h, &mut comm),
                Table::V11(t) => (t.listen)(ctx, d, h, &mut comm),
                Table::V12(t) => (t.listen)(ctx, d, h, &mut comm),
            }
        });
        self.check(rc, "listen")?;
        Ok((handle, Comm(comm)))
    }

    /// One `connect` attempt to a peer's `handle`: `None` while the plugin is not done yet (call
    /// again), as NCCL's non-blocking connect.
    pub fn try_connect(&self, dev: usize, handle: &mut [u8; HANDLE_BYTES]) -> Result<Option<Comm>> {
        let d = c_int::try_from(dev).map_err(|_| Error::invalid(format!("net device {dev}")))?;
        let mut comm: Ptr = std::ptr::null_mut();
        let mut dev_comm: Ptr = std::ptr::null_mut();
        let h = handle.as_mut_ptr().cast::<c_void>();
        let mut cfg = CommConfig {
            traffic_class: TRAFFIC_CLASS_UNDEF,
        };
        let ctx = self.ctx;
        // SAFETY: the peer's handle bytes (the plugin may keep state in them between attempts,
        // as NCCL allows) and valid out-pointers.
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V6(t) => (t.connect)(d, h, &mut comm),
                Table::V7(t) => (t.connect)(d, h, &mut comm, &mut dev_comm),
                Table::V8(t) => (t.connect)(d, h, &mut comm, &mut dev_comm),
                Table::V9(t) => (t.connect)(d, h, &mut comm, &mut dev_comm),
                Table::V10(t) => (t.connect)(d, &mut cfg, h, &mut comm, &mut dev_comm),
                Table::V11(t) => (t.connect)(ctx, d, h, &mut comm, &mut dev_comm),
                Table::V12(t) => (t.connect)(ctx, d, h, &mut comm, &mut dev_comm),
            }
        });
        self.check(rc, "connect")?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// One `accept` attempt on `listen`: `None` while no peer is connected yet.
    pub fn try_accept(&self, listen: &Comm) -> Result<Option<Comm>> {
        let mut comm: Ptr = std::ptr::null_mut();
        let mut dev_comm: Ptr = std::ptr::null_mut();
        // SAFETY: a live listen comm of this plugin and valid out-pointers.
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V6(t) => (t.accept)(listen.0, &mut comm),
                Table::V7(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
                Table::V8(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
                Table::V9(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
                Table::V10(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
                Table::V11(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
                Table::V12(t) => (t.accept)(listen.0, &mut comm, &mut dev_comm),
            }
        });
        self.check(rc, "accept")?;
        Ok((!comm.is_null()).then_some(Comm(comm)))
    }

    /// Registers `len` bytes of host memory at `data` with `comm`.
    ///
    /// # Safety
    /// `data..data + len` stays allocated until [`Plugin::dereg_mr`] of the handle.
    pub unsafe fn reg_mr(&self, comm: &Comm, data: *mut u8, len: usize) -> Result<Mr> {
        let mut mh: Ptr = std::ptr::null_mut();
        let n = self.int_size(len, "registration", 8)?;
        let (p, k) = (data.cast::<c_void>(), PTR_HOST);
        // SAFETY: forwarded contract; a live comm; valid out-pointer.
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V6(t) => (t.reg_mr)(comm.0, p, n, k, &mut mh),
                Table::V7(t) => (t.reg_mr)(comm.0, p, n, k, &mut mh),
                Table::V8(t) => (t.reg_mr)(comm.0, p, len, k, &mut mh),
                Table::V9(t) => (t.reg_mr)(comm.0, p, len, k, &mut mh),
                Table::V10(t) => (t.reg_mr)(comm.0, p, len, k, &mut mh),
                Table::V11(t) => (t.reg_mr)(comm.0, p, len, k, &mut mh),
                Table::V12(t) => (t.reg_mr)(comm.0, p, len, k, &mut mh),
            }
        });
        self.check(rc, "regMr")?;
        Ok(Mr(mh))
    }

    /// Ends a registration.
    pub fn dereg_mr(&self, comm: &Comm, mr: Mr) -> Result<()> {
        // SAFETY: a handle `reg_mr` returned for this comm, deregistered once (consumed).
        let rc = self.call(|| unsafe { each!(self.table, t => (t.dereg_mr)(comm.0, mr.0)) });
        self.check(rc, "deregMr")
    }

    /// Posts a send of `len` bytes at `data` (registered as `mr`): `None` when the plugin cannot
    /// take it now (post again).
    ///
    /// # Safety
    /// The bytes stay valid and unchanged until the request completes.
    pub unsafe fn isend(
        &self,
        comm: &Comm,
        data: *mut u8,
        len: usize,
        mr: &Mr,
    ) -> Result<Option<Request>> {
        let mut req: Ptr = std::ptr::null_mut();
        let n = self.int_size(len, "send", 9)?;
        let (d, m, ph) = (data.cast::<c_void>(), mr.0, std::ptr::null_mut());
        // SAFETY: forwarded contract; a live send comm; tag 0 (sends of one comm match in order);
        // no profiler handle.
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V6(t) => (t.isend)(comm.0, d, n, 0, m, &mut req),
                Table::V7(t) => (t.isend)(comm.0, d, n, 0, m, &mut req),
                Table::V8(t) => (t.isend)(comm.0, d, n, 0, m, &mut req),
                Table::V9(t) => (t.isend)(comm.0, d, len, 0, m, &mut req),
                Table::V10(t) => (t.isend)(comm.0, d, len, 0, m, ph, &mut req),
                Table::V11(t) => (t.isend)(comm.0, d, len, 0, m, ph, &mut req),
                Table::V12(t) => (t.isend)(comm.0, d, len, 0, m, ph, &mut req),
            }
        });
        self.check(rc, "isend")?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// Posts a receive of at most `cap` bytes into `data` (registered as `mr`): `None` when the
    /// plugin cannot take it now.
    ///
    /// # Safety
    /// The bytes stay allocated, and unread, until the request completes.
    pub unsafe fn irecv(
        &self,
        comm: &Comm,
        data: *mut u8,
        cap: usize,
        mr: &Mr,
    ) -> Result<Option<Request>> {
        let mut req: Ptr = std::ptr::null_mut();
        let mut d: Ptr = data.cast();
        let mut tag: c_int = 0;
        let mut m: Ptr = mr.0;
        let mut p: Ptr = std::ptr::null_mut();
        let mut n32 = self.int_size(cap, "receive", 9)?;
        let mut n = cap;
        // SAFETY: forwarded contract; one receive (n = 1) of arrays of one element each.
        let rc = self.call(|| unsafe {
            let (c, d, t, m, r) = (comm.0, &mut d, &mut tag, &mut m, &mut req);
            match self.table {
                Table::V6(x) => (x.irecv)(c, 1, d, &mut n32, t, m, r),
                Table::V7(x) => (x.irecv)(c, 1, d, &mut n32, t, m, r),
                Table::V8(x) => (x.irecv)(c, 1, d, &mut n32, t, m, r),
                Table::V9(x) => (x.irecv)(c, 1, d, &mut n, t, m, r),
                Table::V10(x) => (x.irecv)(c, 1, d, &mut n, t, m, &mut p, r),
                Table::V11(x) => (x.irecv)(c, 1, d, &mut n, t, m, &mut p, r),
                Table::V12(x) => (x.irecv)(c, 1, d, &mut n, t, m, &mut p, r),
            }
        });
        self.check(rc, "irecv")?;
        Ok((!req.is_null()).then_some(Request(req)))
    }

    /// Tests a request: the bytes it moved once done (the request is then gone), `None` before.
    pub fn test(&self, req: &Request) -> Result<Option<usize>> {
        let (mut done, mut size): (c_int, c_int) = (0, 0);
        // SAFETY: a request of this plugin not yet reported done; valid out-pointers.
        let rc =
            self.call(|| unsafe { each!(self.table, t => (t.test)(req.0, &mut done, &mut size)) });
        self.check(rc, "test")?;
        Ok((done != 0).then(|| usize::try_from(size).unwrap_or(0)))
    }

    /// Closes a send comm.
    pub fn close_send(&self, c: Comm) -> Result<()> {
        // SAFETY: a send comm of this plugin, closed once (consumed).
        let rc = self.call(|| unsafe { each!(self.table, t => (t.close_send)(c.0)) });
        self.check(rc, "closeSend")
    }

    /// Closes a receive comm.
    pub fn close_recv(&self, c: Comm) -> Result<()> {
        // SAFETY: a receive comm of this plugin, closed once (consumed).
        let rc = self.call(|| unsafe { each!(self.table, t => (t.close_recv)(c.0)) });
        self.check(rc, "closeRecv")
    }

    /// Closes a listen comm.
    pub fn close_listen(&self, c: Comm) -> Result<()> {
        // SAFETY: a listen comm of this plugin, closed once (consumed).
        let rc = self.call(|| unsafe { each!(self.table, t => (t.close_listen)(c.0)) });
        self.check(rc, "closeListen")
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        if !self.initialised {
            return;
        }
        let ctx = self.ctx;
        // SAFETY: the context a successful `init` returned, finalised once, after every comm
        // of this plugin is gone (the connections' shared state holds an `Arc` of the plugin).
        let rc = self.call(|| unsafe {
            match self.table {
                Table::V11(t) => t.finalize.map_or(NCCL_SUCCESS, |f| f(ctx)),
                Table::V12(t) => t.finalize.map_or(NCCL_SUCCESS, |f| f(ctx)),
                _ => NCCL_SUCCESS,
            }
        });
        if let Err(e) = self.check(rc, "finalize") {
            tracing::warn!("{e}");
        }
    }
}

/// A comm of the plugin (listen, send or receive).
#[derive(Debug)]
pub struct Comm(Ptr);
// SAFETY: an opaque handle the plugin owns; used only through the plugin's serialised calls.
unsafe impl Send for Comm {}
// SAFETY: as above.
unsafe impl Sync for Comm {}

/// A memory registration of the plugin.
#[derive(Debug)]
pub struct Mr(Ptr);
// SAFETY: as for Comm.
unsafe impl Send for Mr {}
// SAFETY: as for Comm.
unsafe impl Sync for Mr {}

/// A request in flight.
#[derive(Debug)]
pub struct Request(Ptr);
// SAFETY: as for Comm.
unsafe impl Send for Request {}
