//! NCCL's profiler-plugin ABI, versions 1 to 6, as facts: the symbol names, the function tables'
//! signatures, the event-type bits and states, and where each field of an event descriptor lies
//! in each version (x86-64). The layouts are read from NCCL's public headers
//! (`src/include/plugin/profiler/profiler_v{1..6}.h`); the code is ours. A descriptor is written
//! field by field into a zeroed buffer ([`Descr`]) by [`encode`], so that one event of ours
//! becomes whichever version the plugin speaks; `nccl/tests/profiler.rs` reads every field back
//! through a C plugin compiled against C declarations of each version.

use std::ffi::{CStr, c_char, c_int, c_void};

/// The newest version served.
pub const NEWEST: u32 = 6;

/// `ncclProfiler_vN`: the symbols probed, newest first.
pub const SYMBOLS: [(u32, &CStr); 6] = [
    (6, c"ncclProfiler_v6"),
    (5, c"ncclProfiler_v5"),
    (4, c"ncclProfiler_v4"),
    (3, c"ncclProfiler_v3"),
    (2, c"ncclProfiler_v2"),
    (1, c"ncclProfiler_v1"),
];

/// `ncclDebugLogger_t` (variadic in C; the arguments after `fmt` are not read by ours).
pub type Logger =
    unsafe extern "C" fn(c_int, std::ffi::c_ulong, *const c_char, c_int, *const c_char);

/// `init` of versions 1 to 3: `(void** context, int* eActivationMask)`.
pub type InitV1 = unsafe extern "C" fn(*mut *mut c_void, *mut c_int) -> c_int;
/// `init` of version 4: `(context, mask, commName, commHash, nNodes, nranks, rank, logfn)`.
pub type InitV4 = unsafe extern "C" fn(
    *mut *mut c_void,
    *mut c_int,
    *const c_char,
    u64,
    c_int,
    c_int,
    c_int,
    Logger,
) -> c_int;
/// `init` of versions 5 and 6: `(context, commId, mask, commName, nNodes, nranks, rank, logfn)`.
pub type InitV5 = unsafe extern "C" fn(
    *mut *mut c_void,
    u64,
    *mut c_int,
    *const c_char,
    c_int,
    c_int,
    c_int,
    Logger,
) -> c_int;
/// `startEvent(void* context, void** eHandle, descriptor*)`.
pub type StartEvent = unsafe extern "C" fn(*mut c_void, *mut *mut c_void, *mut Descr) -> c_int;
/// `stopEvent(void* eHandle)`.
pub type StopEvent = unsafe extern "C" fn(*mut c_void) -> c_int;
/// `recordEventState(void* eHandle, state, stateArgs*)`.
pub type RecordState = unsafe extern "C" fn(*mut c_void, c_int, *mut c_void) -> c_int;
/// `finalize(void* context)`.
pub type Finalize = unsafe extern "C" fn(*mut c_void) -> c_int;

/// `ncclProfiler_vN`: six pointers in every version; `init`'s type depends on the version.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Table {
    /// The plugin's name.
    pub name: *const c_char,
    /// [`InitV1`], [`InitV4`] or [`InitV5`].
    pub init: *const c_void,
    /// [`StartEvent`].
    pub start_event: Option<StartEvent>,
    /// [`StopEvent`].
    pub stop_event: Option<StopEvent>,
    /// [`RecordState`].
    pub record_state: Option<RecordState>,
    /// [`Finalize`].
    pub finalize: Option<Finalize>,
}

/// `ncclProfileGroup` … the event-type bits.
pub mod bit {
    /// The per-launch group (legacy).
    pub const GROUP: i32 = 1 << 0;
    /// A collective as launched.
    pub const COLL: i32 = 1 << 1;
    /// A send or receive as launched.
    pub const P2P: i32 = 1 << 2;
    /// A proxy operation.
    pub const PROXY_OP: i32 = 1 << 3;
    /// A proxy step.
    pub const PROXY_STEP: i32 = 1 << 4;
    /// The proxy thread's control.
    pub const PROXY_CTRL: i32 = 1 << 5;
    /// A kernel channel (v3).
    pub const KERNEL_CH: i32 = 1 << 6;
    /// A network plugin's event (v3).
    pub const NET_PLUGIN: i32 = 1 << 7;
    /// `ncclGroupStart`…`ncclGroupEnd` as the API sees it (v5).
    pub const GROUP_API: i32 = 1 << 8;
    /// A collective call (v5).
    pub const COLL_API: i32 = 1 << 9;
    /// A send or receive call (v5).
    pub const P2P_API: i32 = 1 << 10;
    /// A kernel launch (v5).
    pub const KERNEL_LAUNCH: i32 = 1 << 11;
    /// The copy-engine events (v6).
    pub const CE: i32 = (1 << 12) | (1 << 13) | (1 << 14);
    /// What a launched operation's descendants are.
    pub const BELOW_OPS: i32 = PROXY_OP | PROXY_STEP | KERNEL_CH | NET_PLUGIN;
}

/// Proxy states (`ncclProfilerEventState_t`): a proxy operation's, versions 1 to 3 (with
/// `transSize` and `steps`), and since version 4 (none).
pub mod state {
    use std::ffi::c_int;
    /// `ncclProfilerProxyOpSendTransmitted` (v1–v3): a step's data left.
    pub const PROXY_OP_SEND_TRANSMITTED: c_int = 2;
    /// `ncclProfilerProxyOpSendDone` (v1–v3): the operation's last step is done.
    pub const PROXY_OP_SEND_DONE: c_int = 3;
    /// `ncclProfilerProxyStepSendGPUWait`: the step's data is ready on the GPU.
    pub const PROXY_STEP_SEND_GPU_WAIT: c_int = 8;
    /// `ncclProfilerProxyStepSendWait`: the step is posted to the network (`transSize`).
    pub const PROXY_STEP_SEND_WAIT: c_int = 9;
    /// `ncclProfilerProxyCtrlIdle`: the proxy found no work.
    pub const PROXY_CTRL_IDLE: c_int = 13;
    /// `ncclProfilerProxyCtrlActive`: the proxy took up work.
    pub const PROXY_CTRL_ACTIVE: c_int = 14;
    /// `ncclProfilerProxyOpInProgress_v4`: the operation's first step began.
    pub const PROXY_OP_IN_PROGRESS_V4: c_int = 19;
}

/// A state's arguments (`ncclProfilerEventStateArgs_vN_t`): `transSize` first in every
/// version; versions 1 to 3 put a proxy operation's `steps` after it. Larger than any
/// version's union, zeroed beyond what is written.
#[derive(Debug)]
#[repr(C, align(8))]
pub struct StateArgs {
    /// `proxyStep.transSize` (v4+) / `proxyOp.transSize` (v1–v3).
    pub trans_size: u64,
    /// `proxyOp.steps` (v1–v3).
    pub steps: c_int,
    _rest: [u8; 52],
}

impl StateArgs {
    /// Arguments carrying `trans_size` and `steps`.
    pub fn new(trans_size: u64, steps: c_int) -> Self {
        StateArgs {
            trans_size,
            steps,
            _rest: [0; 52],
        }
    }
}

/// `ncclProfilerGroupStartApiStop`: the group API event's first call ended.
pub const STATE_GROUP_START_API_STOP: c_int = 23;
/// `ncclProfilerGroupEndApiStart`: the outermost `ncclGroupEnd` began.
pub const STATE_GROUP_END_API_START: c_int = 24;

/// One of our events, before it is written in a version's layout.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// The API group (`groupDepth` 1: an implicit group around one call; 2: a user's group).
    GroupApi { depth: c_int, captured: bool },
    /// A collective call.
    CollApi {
        func: Func,
        count: usize,
        dtype: c_int,
        root: c_int,
        stream: *mut c_void,
        captured: bool,
    },
    /// A send or receive call.
    P2pApi {
        func: Func,
        count: usize,
        dtype: c_int,
        stream: *mut c_void,
        captured: bool,
    },
    /// A kernel launch on `stream`.
    KernelLaunch { stream: *mut c_void },
    /// The legacy per-launch group (no payload).
    Group,
    /// A collective as launched.
    Coll {
        seq: u64,
        func: Func,
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        root: c_int,
        dtype: c_int,
        channels: u8,
        warps: u8,
        algo: Algo,
        parent_group: *mut c_void,
    },
    /// A send or receive as launched.
    P2p {
        func: Func,
        buff: *mut c_void,
        dtype: c_int,
        count: usize,
        peer: c_int,
        channels: u8,
        parent_group: *mut c_void,
    },
    /// A proxy operation: the transfers of one launch to one peer.
    ProxyOp {
        pid: c_int,
        channel: u8,
        peer: c_int,
        steps: c_int,
        chunk: c_int,
        is_send: bool,
    },
    /// One step of a proxy operation.
    ProxyStep { step: c_int },
    /// A busy span of the proxy thread (no payload).
    ProxyCtrl,
}

impl Event {
    /// Its type bit.
    pub fn bit(&self) -> i32 {
        match self {
            Event::GroupApi { .. } => bit::GROUP_API,
            Event::CollApi { .. } => bit::COLL_API,
            Event::P2pApi { .. } => bit::P2P_API,
            Event::KernelLaunch { .. } => bit::KERNEL_LAUNCH,
            Event::Group => bit::GROUP,
            Event::Coll { .. } => bit::COLL,
            Event::P2p { .. } => bit::P2P,
            Event::ProxyOp { .. } => bit::PROXY_OP,
            Event::ProxyStep { .. } => bit::PROXY_STEP,
            Event::ProxyCtrl => bit::PROXY_CTRL,
        }
    }

    /// Whether `mask` asks for it: its own bit or a descendant's (NCCL emits the ancestors of
    /// every event asked for).
    pub fn wanted(&self, mask: i32) -> bool {
        use bit::*;
        let below = match self {
            Event::GroupApi { .. } => !PROXY_CTRL & 0x7fff,
            Event::CollApi { .. } => COLL | BELOW_OPS | CE,
            Event::P2pApi { .. } => P2P | BELOW_OPS,
            Event::KernelLaunch { .. } => 0,
            Event::Group => COLL | P2P | BELOW_OPS,
            Event::Coll { .. } | Event::P2p { .. } => BELOW_OPS,
            Event::ProxyOp { .. } => PROXY_STEP,
            Event::ProxyStep { .. } | Event::ProxyCtrl => 0,
        };
        mask & (self.bit() | below) != 0
    }

    /// Whether version `v` has it (the API events came with version 5).
    pub fn in_version(&self, v: u32) -> bool {
        match self {
            Event::GroupApi { .. }
            | Event::CollApi { .. }
            | Event::P2pApi { .. }
            | Event::KernelLaunch { .. } => v >= 5,
            Event::Group
            | Event::Coll { .. }
            | Event::P2p { .. }
            | Event::ProxyOp { .. }
            | Event::ProxyStep { .. }
            | Event::ProxyCtrl => true,
        }
    }
}

/// `ncclFunc_t` of an operation: its name (versions 2+) and code (version 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Func {
    /// Broadcast.
    Broadcast,
    /// Reduce.
    Reduce,
    /// AllGather.
    AllGather,
    /// ReduceScatter.
    ReduceScatter,
    /// AllReduce.
    AllReduce,
    /// AlltoAll (no version-1 code: reported as NCCL's version-1 adapter reports names it does
    /// not know, as Send).
    AllToAll,
    /// Send.
    Send,
    /// Recv.
    Recv,
}

impl Func {
    /// The name NCCL gives it.
    pub fn name(self) -> &'static CStr {
        match self {
            Func::Broadcast => c"Broadcast",
            Func::Reduce => c"Reduce",
            Func::AllGather => c"AllGather",
            Func::ReduceScatter => c"ReduceScatter",
            Func::AllReduce => c"AllReduce",
            Func::AllToAll => c"AlltoAll",
            Func::Send => c"Send",
            Func::Recv => c"Recv",
        }
    }

    /// Version 1's `ncclFunc_t` code.
    fn code(self) -> u8 {
        match self {
            Func::Broadcast => 0,
            Func::Reduce => 1,
            Func::AllGather => 2,
            Func::ReduceScatter => 3,
            Func::AllReduce => 4,
            Func::Send | Func::AllToAll => 6,
            Func::Recv => 7,
        }
    }
}

/// The algorithm a collective ran, as the descriptor's `algo` and `proto` strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Algo {
    /// Its name (ours: NCCL's names do not describe our algorithms).
    pub name: &'static CStr,
    /// Its protocol: "LL", "LL128" or "SIMPLE".
    pub proto: &'static CStr,
}

impl Algo {
    /// Version 1's codes: none of ours has an NCCL algorithm code, so the last one (as NCCL's
    /// version-1 adapter reports names it does not know); the protocol's own.
    fn codes(self) -> (u8, u8) {
        let proto = match self.proto.to_bytes() {
            b"LL" => 0,
            b"LL128" => 1,
            _ => 2,
        };
        (6, proto)
    }
}

/// Version 1's datatype code: NCCL's own, but the types version 1 does not know (FP8) as
/// NCCL's adapter reports them (Float64).
fn dtype_code(dtype: c_int) -> u8 {
    match dtype {
        0..=9 => dtype as u8,
        _ => 8,
    }
}

/// `ncclDataType_t` as NCCL's profiler names it.
pub fn dtype_name(dtype: c_int) -> &'static CStr {
    match dtype {
        0 => c"ncclInt8",
        1 => c"ncclUint8",
        2 => c"ncclInt32",
        3 => c"ncclUint32",
        4 => c"ncclInt64",
        5 => c"ncclUint64",
        6 => c"ncclFloat16",
        7 => c"ncclFloat32",
        8 => c"ncclFloat64",
        9 => c"ncclBfloat16",
        10 => c"ncclFloat8e4m3",
        11 => c"ncclFloat8e5m2",
        _ => c"Unknown",
    }
}

/// An event descriptor: 128 bytes, 8-aligned, the largest version's size; zeroed, then the
/// fields of the event in its version's places.
#[derive(Debug)]
#[repr(C, align(8))]
pub struct Descr([u8; 128]);

impl Descr {
    fn zeroed() -> Self {
        Descr([0; 128])
    }

    fn u8(&mut self, at: usize, v: u8) {
        self.0[at] = v;
    }

    fn i32(&mut self, at: usize, v: i32) {
        self.0[at..at + 4].copy_from_slice(&v.to_ne_bytes());
    }

    fn u64(&mut self, at: usize, v: u64) {
        self.0[at..at + 8].copy_from_slice(&v.to_ne_bytes());
    }

    fn ptr<T>(&mut self, at: usize, p: *const T) {
        self.u64(at, p as usize as u64);
    }

    fn text(&mut self, at: usize, s: &'static CStr) {
        self.ptr(at, s.as_ptr());
    }
}

/// `ev` as version `v` lays it out, with its parent and rank; `None` where `v` has no such
/// event.
pub fn encode(v: u32, ev: &Event, parent: *mut c_void, rank: c_int) -> Option<Descr> {
    if !ev.in_version(v) || !(1..=NEWEST).contains(&v) {
        return None;
    }
    let mut d = Descr::zeroed();
    // The header: `type` (uint8_t until version 4, uint64_t since 5), parentObj, rank.
    if v >= 5 {
        d.u64(0, ev.bit() as u64);
    } else {
        d.u8(0, ev.bit() as u8);
    }
    d.ptr(8, parent);
    d.i32(16, rank);
    match *ev {
        Event::Group | Event::ProxyCtrl => {}
        // The proxy descriptors sit at the union's start in every version (24).
        Event::ProxyOp {
            pid,
            channel,
            peer,
            steps,
            chunk,
            is_send,
        } => {
            d.i32(24, pid);
            d.u8(28, channel);
            d.i32(32, peer);
            d.i32(36, steps);
            d.i32(40, chunk);
            d.i32(44, is_send.into());
        }
        Event::ProxyStep { step } => d.i32(24, step),
        Event::GroupApi { depth, captured } => {
            d.u8(24, captured.into());
            d.i32(28, depth);
        }
        Event::CollApi {
            func,
            count,
            dtype,
            root,
            stream,
            captured,
        } => {
            d.text(24, func.name());
            d.u64(32, count as u64);
            d.text(40, dtype_name(dtype));
            d.i32(48, root);
            d.ptr(56, stream);
            d.u8(64, captured.into());
        }
        Event::P2pApi {
            func,
            count,
            dtype,
            stream,
            captured,
        } => {
            d.text(24, func.name());
            d.u64(32, count as u64);
            d.text(40, dtype_name(dtype));
            d.ptr(48, stream);
            d.u8(56, captured.into());
        }
        Event::KernelLaunch { stream } => d.ptr(24, stream),
        Event::Coll {
            seq,
            func,
            send,
            recv,
            count,
            root,
            dtype,
            channels,
            warps,
            algo,
            parent_group,
        } => match v {
            1 => {
                // name, commHash (24, 32) stay NULL and 0, as NCCL's adapter leaves them.
                let (a, p) = algo.codes();
                d.u64(40, seq);
                d.u8(48, func.code());
                d.ptr(56, send);
                d.ptr(64, recv);
                d.u64(72, count as u64);
                d.i32(80, root);
                d.u8(84, dtype_code(dtype));
                d.u8(104, channels);
                d.u8(105, warps);
                d.u8(106, a);
                d.u8(107, p);
            }
            2 | 3 => {
                d.u64(40, seq);
                d.text(48, func.name());
                d.ptr(56, send);
                d.ptr(64, recv);
                d.u64(72, count as u64);
                d.i32(80, root);
                d.text(88, dtype_name(dtype));
                // Version 2 keeps trafficBytes at 96 (0, as NCCL's adapter), then the channels.
                let at = if v == 2 { 104 } else { 96 };
                d.u8(at, channels);
                d.u8(at + 1, warps);
                let at = if v == 2 { 112 } else { 104 };
                d.text(at, algo.name);
                d.text(at + 8, algo.proto);
            }
            _ => {
                d.u64(24, seq);
                d.text(32, func.name());
                d.ptr(40, send);
                d.ptr(48, recv);
                d.u64(56, count as u64);
                d.i32(64, root);
                d.text(72, dtype_name(dtype));
                d.u8(80, channels);
                d.u8(81, warps);
                d.text(88, algo.name);
                d.text(96, algo.proto);
                if v >= 5 {
                    d.ptr(104, parent_group);
                }
            }
        },
        Event::P2p {
            func,
            buff,
            dtype,
            count,
            peer,
            channels,
            parent_group,
        } => match v {
            1 => {
                d.u8(40, func.code());
                d.ptr(48, buff);
                d.u8(56, dtype_code(dtype));
                d.u64(64, count as u64);
                d.i32(72, peer);
            }
            2 | 3 => {
                d.text(40, func.name());
                d.ptr(48, buff);
                d.text(56, dtype_name(dtype));
                d.u64(64, count as u64);
                d.i32(72, peer);
            }
            _ => {
                d.text(24, func.name());
                d.ptr(32, buff);
                d.text(40, dtype_name(dtype));
                d.u64(48, count as u64);
                d.i32(56, peer);
                d.u8(60, channels);
                if v >= 5 {
                    d.ptr(64, parent_group);
                }
            }
        },
    }
    Some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_events_only_from_version_5() {
        let ev = Event::GroupApi {
            depth: 1,
            captured: false,
        };
        assert!(encode(4, &ev, std::ptr::null_mut(), 0).is_none());
        let d = encode(5, &ev, std::ptr::null_mut(), 3).unwrap();
        assert_eq!(u64::from_ne_bytes(d.0[0..8].try_into().unwrap()), 256);
        assert_eq!(i32::from_ne_bytes(d.0[16..20].try_into().unwrap()), 3);
        assert_eq!(i32::from_ne_bytes(d.0[28..32].try_into().unwrap()), 1);
    }

    #[test]
    fn ancestors_are_implied() {
        let coll_api = Event::CollApi {
            func: Func::AllReduce,
            count: 1,
            dtype: 7,
            root: 0,
            stream: std::ptr::null_mut(),
            captured: false,
        };
        assert!(coll_api.wanted(bit::COLL));
        assert!(coll_api.wanted(bit::PROXY_STEP));
        assert!(!coll_api.wanted(bit::P2P | bit::KERNEL_LAUNCH));
        assert!(Event::Group.wanted(bit::P2P));
        assert!(!Event::Group.wanted(bit::GROUP_API));
        let group_api = Event::GroupApi {
            depth: 1,
            captured: false,
        };
        assert!(group_api.wanted(bit::KERNEL_LAUNCH));
        assert!(!group_api.wanted(bit::PROXY_CTRL));
    }
}
