//! Proxy events: the transfers between hosts as a profiler plugin sees NCCL's network proxy.
//!
//! A communicator that spans hosts carries its inter-host data through a proxy thread (port
//! channels over IB, a net plugin or Ethernet). [`ProxyEvents`] observes that proxy
//! ([`mscclpp::comm::proxy::ProxyObserver`]):
//! - at each launch that pushes triggers, on the launching thread, inside the `Coll` event of
//!   the call ([`under`]): a `ProxyOp` per peer the launch sends to (parent: the `Coll`;
//!   `pid`, `channelId` the peer's port channel (its index among the proxy's connections,
//!   modulo [`CHANNELS`]), the peer's rank, `nSteps` its puts, `chunkSize` the largest put,
//!   `isSend` 1). Our port channels write one-sidedly into the peer's memory, so there is no
//!   receiving proxy and no receive operation;
//! - on the proxy thread, each put of that launch: a `ProxyStep` (parent: its `ProxyOp`; `step`
//!   from 0) with `ProxyStepSendGPUWait` when the proxy takes it up and `ProxyStepSendWait`
//!   (`transSize`: its bytes) when it is handed to the transport, stopped once the transport
//!   has it. The `ProxyOp` records `ProxyOpInProgress_v4` at its first step (versions 4+),
//!   or `ProxyOpSendTransmitted` (`transSize`, `steps` so far) after each step and
//!   `ProxyOpSendDone` at the end (versions 1–3), and stops after its last step;
//! - a `ProxyCtrl` per busy span of the proxy thread: `ProxyCtrlActive` when it takes up work
//!   after an empty FIFO, `ProxyCtrlIdle` and the stop when the FIFO is empty again.
//!
//! Triggers belong to launches by count: a launch says how many it pushes, and the FIFO keeps
//! their order (see the observer's documentation). Launches outside a profiled call (no `Coll`
//! open on the thread) are counted and emit nothing. Once a launch of the communicator is
//! captured into a graph, its replays push triggers nobody announces: counting cannot tell whose
//! a trigger is any more, so the communicator emits no more proxy events (rather than wrong
//! ones).

use std::cell::Cell;
use std::collections::VecDeque;
use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use mscclpp::comm::proxy::{ProxyObserver, ProxyOpInfo};

use super::abi::{Event, StateArgs, bit, state};
use super::{Attached, mask};

/// Channels a plugin can be expected to hold per collective: NCCL's example keeps 32 and does
/// not check; spreading the peers over them keeps a many-host launch within its arrays.
pub const CHANNELS: usize = 32;

thread_local! {
    /// The `Coll` event a launch on this thread runs under, and the mask it started with.
    static UNDER: Cell<(usize, i32)> = const { Cell::new((0, 0)) };
}

/// Runs `run` (a collective's launch) with `coll` as the parent of the proxy operations it
/// enqueues.
pub(super) fn under<T>(coll: *mut c_void, mask: i32, run: impl FnOnce() -> T) -> T {
    let before = UNDER.with(|u| u.replace((coll as usize, mask)));
    let out = run();
    UNDER.with(|u| u.set(before));
    out
}

/// One communicator's proxy events.
#[derive(Debug)]
pub struct ProxyEvents {
    att: Arc<Attached>,
    pid: c_int,
    q: Mutex<Queue>,
    /// No more proxy operations (a launch was captured).
    off: AtomicBool,
}

#[derive(Debug, Default)]
struct Queue {
    /// Launches whose triggers are not all carried out, oldest first.
    launches: VecDeque<Launch>,
    /// The open `ProxyCtrl` (0: none).
    ctrl: usize,
}

#[derive(Debug)]
struct Launch {
    /// Triggers still to come.
    left: u64,
    /// The mask the launch's call started under.
    mask: i32,
    ops: Vec<Op>,
}

#[derive(Debug)]
struct Op {
    conn_peer: usize,
    handle: usize,
    steps: u32,
    /// Steps done.
    done: u32,
    /// The open `ProxyStep` (0: none).
    step: usize,
}

impl Launch {
    /// The operation to `conn_peer` with steps still to come (the one a put to it belongs to).
    fn open_op(&mut self, conn_peer: usize) -> Option<&mut Op> {
        self.ops
            .iter_mut()
            .find(|o| o.conn_peer == conn_peer && o.done < o.steps && o.handle != 0)
    }
}

fn h(p: usize) -> *mut c_void {
    p as *mut c_void
}

impl ProxyEvents {
    /// The proxy events of the communicator `att` profiles.
    pub fn new(att: Arc<Attached>) -> Self {
        ProxyEvents {
            att,
            pid: std::process::id() as c_int,
            q: Mutex::new(Queue::default()),
            off: AtomicBool::new(false),
        }
    }

    /// Stops every launch still counted.
    fn drop_launches(&self) {
        let launches = std::mem::take(&mut self.lock().launches);
        for l in launches {
            self.close(l);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // Plain counters and handles: a panic elsewhere leaves nothing half-written to fear.
        self.q.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Stops what `l` still has open (a launch that ended early or was withdrawn).
    fn close(&self, l: Launch) {
        for op in l.ops {
            self.att.stop(h(op.step));
            self.att.stop(h(op.handle));
        }
    }
}

impl ProxyObserver for ProxyEvents {
    fn enqueued(&self, triggers: u64, ops: &[ProxyOpInfo]) {
        if triggers == 0 || self.off.load(Ordering::Relaxed) {
            return;
        }
        let (coll, mask) = UNDER.with(Cell::get);
        let ops = if coll == 0 || mask & (bit::PROXY_OP | bit::PROXY_STEP) == 0 {
            Vec::new()
        } else {
            ops.iter()
                .filter(|o| o.steps > 0)
                .map(|o| {
                    let ev = Event::ProxyOp {
                        pid: self.pid,
                        channel: (o.conn_peer % CHANNELS) as u8,
                        peer: o.peer as c_int,
                        steps: o.steps.min(c_int::MAX as u32) as c_int,
                        chunk: o.step_bytes.min(c_int::MAX as u64) as c_int,
                        is_send: true,
                    };
                    Op {
                        conn_peer: o.conn_peer,
                        handle: self.att.start(&ev, h(coll), mask) as usize,
                        steps: o.steps,
                        done: 0,
                        step: 0,
                    }
                })
                .collect()
        };
        self.lock().launches.push_back(Launch {
            left: triggers,
            mask,
            ops,
        });
    }

    fn captured(&self) {
        if !self.off.swap(true, Ordering::Relaxed) {
            tracing::info!(
                "a launch across hosts was captured into a graph: no more proxy events for this communicator"
            );
        }
        self.drop_launches();
    }

    fn attached(&self) {
        self.drop_launches();
    }

    fn withdrawn(&self) {
        let l = self.lock().launches.pop_back();
        if let Some(l) = l {
            self.close(l);
        }
    }

    fn trigger_start(&self, conn_peer: usize, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let mut q = self.lock();
        let Some(l) = q.launches.front_mut() else {
            return;
        };
        let mask = l.mask;
        let Some(op) = l.open_op(conn_peer) else {
            return;
        };
        if op.done == 0 && self.att.version() >= 4 {
            self.att
                .record(h(op.handle), state::PROXY_OP_IN_PROGRESS_V4);
        }
        let ev = Event::ProxyStep {
            step: op.done as c_int,
        };
        let s = self.att.start(&ev, h(op.handle), mask);
        self.att.record(s, state::PROXY_STEP_SEND_GPU_WAIT);
        self.att.record_args(
            s,
            state::PROXY_STEP_SEND_WAIT,
            &mut StateArgs::new(bytes, 0),
        );
        op.step = s as usize;
    }

    fn trigger_done(&self, conn_peer: usize, bytes: u64, _ok: bool) {
        let mut q = self.lock();
        let Some(l) = q.launches.front_mut() else {
            return;
        };
        if bytes > 0
            && let Some(op) = l.open_op(conn_peer)
        {
            self.att.stop(h(std::mem::take(&mut op.step)));
            op.done += 1;
            if self.att.version() <= 3 {
                self.att.record_args(
                    h(op.handle),
                    state::PROXY_OP_SEND_TRANSMITTED,
                    &mut StateArgs::new(bytes, op.done as c_int),
                );
            }
            if op.done == op.steps {
                if self.att.version() <= 3 {
                    self.att.record_args(
                        h(op.handle),
                        state::PROXY_OP_SEND_DONE,
                        &mut StateArgs::new(0, op.done as c_int),
                    );
                }
                self.att.stop(h(std::mem::take(&mut op.handle)));
            }
        }
        l.left -= 1;
        if l.left == 0
            && let Some(l) = q.launches.pop_front()
        {
            drop(q);
            self.close(l);
        }
    }

    fn busy(&self, busy: bool) {
        let mut q = self.lock();
        if busy {
            let m = mask();
            if q.ctrl == 0 && m & bit::PROXY_CTRL != 0 {
                let c = self.att.start(&Event::ProxyCtrl, std::ptr::null_mut(), m);
                self.att.record(c, state::PROXY_CTRL_ACTIVE);
                q.ctrl = c as usize;
            }
        } else if q.ctrl != 0 {
            let c = h(std::mem::take(&mut q.ctrl));
            self.att.record(c, state::PROXY_CTRL_IDLE);
            self.att.stop(c);
        }
    }
}

impl Drop for ProxyEvents {
    fn drop(&mut self) {
        let q = std::mem::take(&mut *self.lock());
        for l in q.launches {
            self.close(l);
        }
        self.att.stop(h(q.ctrl));
    }
}
