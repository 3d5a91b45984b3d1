//! NCCL's profiler plugins (`NCCL_PROFILER_PLUGIN`, ABI versions 1 to 6) receive our calls'
//! events: the API events (a group, each collective and point-to-point call, kernel launches;
//! version 5+) and the launch events (a group per launch, each collective and send or receive),
//! with NCCL's fields, parents and states, each version in its own layout ([`abi`]), and the
//! proxy events of the transfers between hosts ([`proxy`]). Kernel-channel and network events
//! are not emitted.
//!
//! Each native communicator calls the plugin's `init` at creation ([`Attached`], with one
//! process-wide activation mask, as NCCL) and `finalize` when it is freed. One call's events,
//! on the calling thread ([`Call`]):
//! - `GroupApi` starts at the first call of a group (depth 1 for a call outside any group, 2 in
//!   a user's group) and records `GroupStartApiStop`; the outermost `ncclGroupEnd` (or the end
//!   of a call outside a group) records `GroupEndApiStart` and stops it ([`group_end`]);
//! - `CollApi` / `P2pApi` (parent: the group's) start at the call and stop once it is enqueued
//!   (before its launch events, as in NCCL);
//! - a collective run here: `KernelLaunch` around it (parent: the group's), the legacy `Group`,
//!   then `Coll` (parent: the `CollApi`, or the `Group` before version 5; `parentGroup` the
//!   `Group`; a per-communicator, per-function sequence number; our algorithm and protocol),
//!   all stopped when the launch returns. As in NCCL, an all-gather's and a broadcast's `Coll`
//!   count bytes of `ncclInt8`;
//! - a send or receive: `P2p` right after its `P2pApi` (sends and receives of a group are
//!   launched together at its end; their events mark the enqueue);
//! - operations that fall back to the real NCCL get the API events only: the real NCCL reports
//!   their launch to its own instance of the plugin.

pub mod abi;
mod plugin;
pub mod proxy;

use std::cell::RefCell;
use std::ffi::{CString, c_int, c_void};
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use abi::{Algo, Event, Func, STATE_GROUP_END_API_START, STATE_GROUP_START_API_STOP};
pub use plugin::{Plugin, open, plugin};

/// The activation mask every `init` gets the address of (one per process, as NCCL's: the last
/// plugin `init` to write it sets it for every communicator).
static MASK: AtomicI32 = AtomicI32::new(0);

/// The mask now.
fn mask() -> i32 {
    MASK.load(Ordering::Acquire)
}

/// A communicator's plugin context: `init` made it, `finalize` ends it when this is dropped.
#[derive(Debug)]
pub struct Attached {
    plugin: &'static Plugin,
    context: usize,
    rank: c_int,
    /// The `Coll` sequence numbers, per function (NCCL counts per communicator and function).
    seq: [AtomicU64; 8],
    /// Kept alive for the plugin, which may keep the pointer.
    _name: Option<CString>,
}

impl Attached {
    /// Calls the plugin's `init` for a communicator (`None` when there is no plugin, or its
    /// `init` failed: then the communicator goes on without it, as in NCCL).
    pub fn new(
        comm_id: u64,
        name: Option<&str>,
        nodes: usize,
        nranks: usize,
        rank: usize,
    ) -> Option<Self> {
        let p = plugin()?;
        let cname = plugin::c_name(name);
        let name_ptr = cname.as_ref().map_or(std::ptr::null(), |c| c.as_ptr());
        let mut ctx: *mut c_void = std::ptr::null_mut();
        let (nodes, nranks, rank) = (nodes as c_int, nranks as c_int, rank as c_int);
        let logger: abi::Logger = mscclpp::base::plugin_log::plugin_log;
        // SAFETY: `init` has the signature of the plugin's version (the symbol found says
        // which); the pointers are valid for the call and the mask and name for the plugin's
        // life.
        let rc = unsafe {
            match p.version {
                1..=3 => {
                    let f: abi::InitV1 = std::mem::transmute(p.table.init);
                    f(&mut ctx, MASK.as_ptr())
                }
                4 => {
                    let f: abi::InitV4 = std::mem::transmute(p.table.init);
                    f(
                        &mut ctx,
                        MASK.as_ptr(),
                        name_ptr,
                        comm_id,
                        nodes,
                        nranks,
                        rank,
                        logger,
                    )
                }
                _ => {
                    let f: abi::InitV5 = std::mem::transmute(p.table.init);
                    f(
                        &mut ctx,
                        comm_id,
                        MASK.as_ptr(),
                        name_ptr,
                        nodes,
                        nranks,
                        rank,
                        logger,
                    )
                }
            }
        };
        if rc != 0 {
            tracing::warn!(
                target: crate::debug::INIT,
                "rank {rank}: profiler plugin {} init failed ({rc}); continuing without it",
                p.name
            );
            return None;
        }
        Some(Attached {
            plugin: p,
            context: ctx as usize,
            rank,
            seq: Default::default(),
            _name: cname,
        })
    }

    /// Starts `ev` under `parent` if the mask asks for it and the plugin's version has it: its
    /// handle (NULL when not started, or when the plugin gave none).
    fn start(&self, ev: &Event, parent: *mut c_void, mask: i32) -> *mut c_void {
        if !ev.wanted(mask) {
            return std::ptr::null_mut();
        }
        let Some(mut d) = abi::encode(self.plugin.version, ev, parent, self.rank) else {
            return std::ptr::null_mut();
        };
        let Some(start) = self.plugin.table.start_event else {
            return std::ptr::null_mut();
        };
        let mut h: *mut c_void = std::ptr::null_mut();
        // SAFETY: the communicator's context, a valid out-pointer and a descriptor laid out
        // for the plugin's version (zeroed beyond its fields).
        unsafe { start(self.context as *mut c_void, &mut h, &mut d) };
        h
    }

    fn stop(&self, h: *mut c_void) {
        if h.is_null() {
            return;
        }
        if let Some(stop) = self.plugin.table.stop_event {
            // SAFETY: a handle the plugin gave for an event not stopped yet.
            unsafe { stop(h) };
        }
    }

    fn record(&self, h: *mut c_void, state: c_int) {
        if h.is_null() {
            return;
        }
        if let Some(rec) = self.plugin.table.record_state {
            // SAFETY: a live handle; the group API states take no arguments (NULL, as NCCL).
            unsafe { rec(h, state, std::ptr::null_mut()) };
        }
    }

    /// Records `state` with arguments (the proxy states).
    fn record_args(&self, h: *mut c_void, state: c_int, args: &mut abi::StateArgs) {
        if h.is_null() {
            return;
        }
        if let Some(rec) = self.plugin.table.record_state {
            // SAFETY: a live handle; `args` is larger than any version's argument union and
            // lives for the call.
            unsafe { rec(h, state, (args as *mut abi::StateArgs).cast()) };
        }
    }

    /// The plugin's ABI version.
    fn version(&self) -> u32 {
        self.plugin.version
    }

    /// The next sequence number of `func` on this communicator.
    fn next_seq(&self, func: Func) -> u64 {
        self.seq[func as usize].fetch_add(1, Ordering::Relaxed)
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        // As NCCL: no finalize for a plugin that made no context.
        if self.context == 0 {
            return;
        }
        if let Some(f) = self.plugin.table.finalize {
            // SAFETY: the context `init` made, finalized once.
            unsafe { f(self.context as *mut c_void) };
        }
    }
}

/// The group API event open on this thread: its communicator's context (the first call's) and
/// handle, and the mask it started under (the group's calls inherit it).
struct OpenGroup {
    owner: Arc<Attached>,
    handle: *mut c_void,
    mask: i32,
}

thread_local! {
    static OPEN: RefCell<Option<OpenGroup>> = const { RefCell::new(None) };
}

/// One call's API events: made by [`Call::begin`], ended by [`Call::end`].
#[derive(Debug)]
pub struct Call<'a> {
    att: &'a Arc<Attached>,
    /// The API event until it is stopped (at the launch, or at the end of the call).
    api: std::cell::Cell<*mut c_void>,
    group: *mut c_void,
    mask: i32,
}

/// What a call is, for its events.
#[derive(Debug, Clone, Copy)]
pub struct What {
    /// The function.
    pub func: Func,
    /// The user's count.
    pub count: usize,
    /// The user's `ncclDataType_t`.
    pub dtype: c_int,
    /// Root (collectives) or peer (sends and receives).
    pub root: c_int,
    /// The user's stream.
    pub stream: *mut c_void,
    /// Whether the stream is being captured.
    pub captured: bool,
}

impl<'a> Call<'a> {
    /// Opens the thread's group API event if none is open (`in_group`: inside a user's group)
    /// and starts the call's `CollApi` or `P2pApi`.
    pub fn begin(att: &'a Arc<Attached>, w: &What, in_group: bool) -> Self {
        let (group, mask) = OPEN.with(|o| {
            let mut o = o.borrow_mut();
            if let Some(g) = o.as_ref() {
                return (g.handle, g.mask);
            }
            let mask = mask();
            let ev = Event::GroupApi {
                depth: if in_group { 2 } else { 1 },
                captured: w.captured,
            };
            let h = att.start(&ev, std::ptr::null_mut(), mask);
            att.record(h, STATE_GROUP_START_API_STOP);
            *o = Some(OpenGroup {
                owner: Arc::clone(att),
                handle: h,
                mask,
            });
            (h, mask)
        });
        let ev = match w.func {
            Func::Send | Func::Recv => Event::P2pApi {
                func: w.func,
                count: w.count,
                dtype: w.dtype,
                stream: w.stream,
                captured: w.captured,
            },
            _ => Event::CollApi {
                func: w.func,
                count: w.count,
                dtype: w.dtype,
                root: w.root,
                stream: w.stream,
                captured: w.captured,
            },
        };
        let api = att.start(&ev, group, mask);
        Call {
            att,
            api: std::cell::Cell::new(api),
            group,
            mask,
        }
    }

    /// Stops the API event (once): the call is enqueued. NCCL's API event ends before the
    /// launch events start, which name it as their parent.
    fn api_done(&self) -> *mut c_void {
        let h = self.api.replace(std::ptr::null_mut());
        self.att.stop(h);
        h
    }

    /// The launch of a collective run here: `KernelLaunch`, `Group` and `Coll` around `run`.
    #[allow(clippy::too_many_arguments)]
    pub fn launch<T>(
        &self,
        w: &What,
        send: *const c_void,
        recv: *mut c_void,
        algo: Algo,
        run: impl FnOnce() -> T,
    ) -> T {
        let a = self.att;
        let api = self.api_done();
        let kl = a.start(
            &Event::KernelLaunch { stream: w.stream },
            self.group,
            self.mask,
        );
        let g = a.start(&Event::Group, std::ptr::null_mut(), self.mask);
        // NCCL lowers an all-gather and a broadcast to bytes.
        let (count, dtype) = match w.func {
            Func::AllGather | Func::Broadcast => {
                let size = crate::types::dtype_info(w.dtype).map_or(1, |(s, _)| s);
                (w.count.saturating_mul(size), 0)
            }
            _ => (w.count, w.dtype),
        };
        let coll = Event::Coll {
            seq: a.next_seq(w.func),
            func: w.func,
            send,
            recv,
            count,
            root: w.root,
            dtype,
            channels: 0,
            warps: 0,
            algo,
            parent_group: g,
        };
        let parent = if a.plugin.version >= 5 { api } else { g };
        let c = a.start(&coll, parent, self.mask);
        // The proxy operations of the launch name this `Coll` as their parent (see `proxy`).
        let out = proxy::under(c, self.mask, run);
        a.stop(c);
        a.stop(g);
        a.stop(kl);
        out
    }

    /// A send's or receive's `P2p` event (started and stopped: it marks the enqueue).
    pub fn p2p(&self, w: &What, buff: *mut c_void) {
        let a = self.att;
        let api = self.api_done();
        let g = a.start(&Event::Group, std::ptr::null_mut(), self.mask);
        let ev = Event::P2p {
            func: w.func,
            buff,
            dtype: w.dtype,
            count: w.count,
            peer: w.root,
            channels: 0,
            parent_group: g,
        };
        let parent = if a.plugin.version >= 5 { api } else { g };
        let h = a.start(&ev, parent, self.mask);
        a.stop(h);
        a.stop(g);
    }

    /// Stops the call's API event; outside a user's group, ends the group API event too.
    pub fn end(self, in_group: bool) {
        self.api_done();
        if !in_group {
            group_end();
        }
    }
}

/// The outermost `ncclGroupEnd` (or the end of a call outside a group): records
/// `GroupEndApiStart` on the thread's group API event and stops it.
pub fn group_end() {
    let Some(g) = OPEN.with(|o| o.borrow_mut().take()) else {
        return;
    };
    // The group holds its first communicator's context alive (its finalize waits for this).
    g.owner.record(g.handle, STATE_GROUP_END_API_START);
    g.owner.stop(g.handle);
}

/// Our algorithm's names for a `Coll` event.
pub fn algo(id: Option<mscclpp::collectives::AlgorithmId>) -> Algo {
    use mscclpp::collectives::AlgorithmId as A;
    let (name, proto) = match id {
        Some(A::Ll) => (c"LL", c"LL"),
        Some(A::LlShort) => (c"LL_SHORT", c"LL"),
        Some(A::Ll128) => (c"LL128", c"LL128"),
        Some(A::Direct) => (c"DIRECT", c"SIMPLE"),
        Some(A::Read) => (c"READ", c"SIMPLE"),
        Some(A::Ce) => (c"CE", c"SIMPLE"),
        Some(A::Hier) => (c"HIER", c"SIMPLE"),
        None => (c"COPY", c"SIMPLE"),
    };
    Algo { name, proto }
}
