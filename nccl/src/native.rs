//! Running an operation: its checks, the route [`crate::route::decide`] picks, and the runs on
//! mscclpp (collectives, `ncclReduce`'s all-reduces, a group's sends and receives, PreMulSum's
//! scaling) or through the real NCCL.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use mscclpp::collectives::{CollectiveCall, CollectiveKind, P2pKind, P2pOp};
use mscclpp::hal::{BufferSlice, DataType, DeviceBuffer, DevicePtr, MemoryKind, ReduceOp};

use mscclpp_caller::{ReduceCall, buffer_bytes};

use crate::abi::*;
use crate::comm::Comm;
use crate::error::{Failure, Res};
use crate::group::{defer_p2p, enter_real_group, in_group};
use crate::real::{RealResults, no_real};
use crate::route::{Call, NativeSide, Op, Request, Route, decide, forced, log_route};
use crate::types::{dtype_info, op_info};

/// A call as the profiler describes it.
fn profiled_call(call: &Call) -> crate::profiler::What {
    use crate::profiler::abi::Func;
    let func = match call.op {
        Op::AllReduce => Func::AllReduce,
        Op::AllGather => Func::AllGather,
        Op::ReduceScatter => Func::ReduceScatter,
        Op::Broadcast => Func::Broadcast,
        Op::AllToAll => Func::AllToAll,
        Op::Reduce => Func::Reduce,
        Op::Send => Func::Send,
        Op::Recv => Func::Recv,
    };
    crate::profiler::What {
        func,
        count: call.count,
        dtype: call.dtype,
        root: call.root,
        stream: call.stream.cast(),
        captured: false,
    }
}

impl Comm {
    /// Runs one operation natively or through the real NCCL (a native send or receive inside a
    /// group waits for the outermost `ncclGroupEnd`).
    pub fn run(self: &Arc<Self>, call: Call) -> Res<()> {
        let (tuning, stream) = (call.tuning, call.stream);
        if tuning.launch_event.is_some() && self.native.as_ref().is_some_and(|n| n.caller.is_host())
        {
            // Before anything runs: the same answer on every rank.
            return Err(Failure::usage(
                "config->launchCompletionEvent: the host backend has no native events (its calls complete before they return)",
            ));
        }
        let profiled = self.profiler.as_ref().map(|a| {
            let w = profiled_call(&call);
            (crate::profiler::Call::begin(a, &w, in_group()), w)
        });
        let ran = self.run_op(call, profiled.as_ref());
        if let Some((p, _)) = profiled {
            p.end(in_group());
        }
        ran?;
        self.record_launch(stream, tuning)
    }

    /// Records a call's `launchCompletionEvent` (in `tuning`) on its stream, after the call.
    pub fn record_launch(&self, stream: CudaStream, tuning: crate::collconfig::Tuning) -> Res<()> {
        if tuning.launch_event.is_none() {
            return Ok(());
        }
        let n = self.native.as_ref().ok_or_else(|| {
            Failure::usage("config->launchCompletionEvent on a communicator the real NCCL made: this library records it on its own communicators only")
        })?;
        let s = n.stream(stream)?;
        // SAFETY: NCCL's contract: the config's event is a live event of the call's device.
        unsafe { n.caller.record_launch(tuning, &*s) }.map_err(|e| self.note(e))
    }

    fn run_op(
        self: &Arc<Self>,
        call: Call,
        profiled: Option<&(crate::profiler::Call<'_>, crate::profiler::What)>,
    ) -> Res<()> {
        let (_, hal_dtype) = dtype_info(call.dtype)?;
        let reduces = matches!(call.op, Op::AllReduce | Op::ReduceScatter | Op::Reduce);
        let hal_op = if reduces { op_info(call.redop)? } else { None };
        // A PreMulSum operator: a sum, then the output scaled (or the real NCCL's operator).
        let user = match (reduces, hal_op) {
            (true, None) => Some(crate::premul::resolve(self, call.redop, call.dtype)?),
            _ => None,
        };
        let hal_op = hal_op.or(user.as_ref().map(|_| ReduceOp::Sum));
        let n = self.nranks;
        if matches!(call.op, Op::Broadcast | Op::Reduce | Op::Send | Op::Recv) {
            let r = usize::try_from(call.root).ok().filter(|&r| r < n);
            if r.is_none() {
                return Err(Failure::argument(format!(
                    "{} {} {} is not a rank of {n}",
                    call.op.name(),
                    if matches!(call.op, Op::Send | Op::Recv) {
                        "peer"
                    } else {
                        "root"
                    },
                    call.root
                )));
            }
        }
        let needs_send = !matches!(call.op, Op::Recv);
        let needs_recv = !matches!(call.op, Op::Send);
        if call.count > 0 {
            let root_only_send = call.op == Op::Broadcast && call.root as usize != self.rank;
            if needs_send && !root_only_send && call.send.is_null() {
                return Err(Failure::argument(format!(
                    "{}: sendbuff is NULL",
                    call.op.name()
                )));
            }
            let root_only_recv = call.op == Op::Reduce && call.root as usize != self.rank;
            if needs_recv && !root_only_recv && call.recv.is_null() {
                return Err(Failure::argument(format!(
                    "{}: recvbuff is NULL",
                    call.op.name()
                )));
            }
        }
        let request = Request {
            op: call.op,
            count: call.count,
            dtype: call.dtype,
            hal_dtype,
            hal_op,
            premul_without_factor: user.as_ref().is_some_and(|u| u.scaler.is_none()),
        };
        match decide(&request, forced()?, self.native_side()) {
            Route::Native {
                dtype: dt,
                count,
                op,
            } => {
                log_route(call.op, true, "");
                self.log_call(&call, || {
                    let caller = &self.native.as_ref()?.caller;
                    let algo = call
                        .op
                        .collective()
                        .and_then(|kind| caller.algorithm(kind, count as u64 * dt.size() as u64));
                    match algo {
                        Some(a) => Some(format!("native ({a})")),
                        None => Some("native".into()),
                    }
                });
                if matches!(call.op, Op::Send | Op::Recv) {
                    if let Some((p, w)) = profiled {
                        let buff = if call.op == Op::Send {
                            call.send.cast_mut()
                        } else {
                            call.recv
                        };
                        p.p2p(w, buff);
                    }
                    if in_group() {
                        defer_p2p(self.clone(), call, Comm::run_p2p);
                        return Ok(());
                    }
                    return self.run_p2p(&[call]);
                }
                if call.count == 0 {
                    return Ok(());
                }
                let run = || match &user {
                    Some(u) => {
                        let scaled = self.pre_scale(call, dt, count, u)?;
                        self.run_native(scaled, dt, count, op)
                    }
                    None => self.run_native(call, dt, count, op),
                };
                match profiled {
                    None => run(),
                    Some((p, w)) => {
                        let algo = self.native.as_ref().and_then(|n| {
                            let kind = call.op.collective().unwrap_or(CollectiveKind::AllReduce);
                            n.caller.algorithm(kind, count as u64 * dt.size() as u64)
                        });
                        p.launch(w, call.send, call.recv, crate::profiler::algo(algo), run)
                    }
                }
            }
            Route::Real(why) => {
                log_route(call.op, false, &why);
                self.log_call(&call, || Some(format!("real NCCL ({why})")));
                let call = match &user {
                    None => call,
                    Some(u) => Call {
                        redop: u.real.ok_or_else(|| {
                            no_real(&format!(
                                "{} with PreMulSum operator {} ({why})",
                                call.op.name(),
                                call.redop
                            ))
                        })?,
                        ..call
                    },
                };
                self.run_real(call, &why)
            }
        }
    }

    /// What the mscclpp side offers an operation, for [`decide`].
    fn native_side(&self) -> NativeSide<'_> {
        match &self.native {
            None => NativeSide::Absent,
            Some(n) if !n.caller.serves() => {
                NativeSide::Idle(n.caller.no_collectives().unwrap_or_default())
            }
            Some(n) => NativeSide::Serves {
                hosts: n.caller.spans_hosts(),
            },
        }
    }

    /// The per-operation line of `NCCL_DEBUG=INFO` under `COLL` (`P2P` for sends and
    /// receives), in NCCL's words, with the route `route` names (computed only when printed).
    fn log_call(&self, call: &Call, route: impl FnOnce() -> Option<String>) {
        let name = match call.op {
            Op::AllReduce => "AllReduce",
            Op::AllGather => "AllGather",
            Op::ReduceScatter => "ReduceScatter",
            Op::Broadcast => "Broadcast",
            Op::AllToAll => "AllToAll",
            Op::Reduce => "Reduce",
            Op::Send => "Send",
            Op::Recv => "Recv",
        };
        let p2p = matches!(call.op, Op::Send | Op::Recv);
        let on = if p2p {
            tracing::enabled!(target: crate::debug::P2P, tracing::Level::INFO)
        } else {
            tracing::enabled!(target: crate::debug::COLL, tracing::Level::INFO)
        };
        if !on {
            return;
        }
        let line = format!(
            "{name}: sendbuff {:p} recvbuff {:p} count {} datatype {} op {} root {} rank {} [nranks={}] stream {:p} - {}",
            call.send,
            call.recv,
            call.count,
            call.dtype,
            call.redop,
            call.root,
            self.rank,
            self.nranks,
            call.stream,
            route().unwrap_or_default()
        );
        if p2p {
            tracing::info!(target: crate::debug::P2P, "{line}");
        } else {
            tracing::info!(target: crate::debug::COLL, "{line}");
        }
    }

    /// Records a failure that made the communicator unusable (`ncclCommGetAsyncError`).
    fn note(&self, e: mscclpp::hal::Error) -> Failure {
        let f = Failure::from(e);
        if matches!(f.code, NCCL_REMOTE_ERROR | NCCL_SYSTEM_ERROR) {
            self.async_error.store(f.code, Ordering::Relaxed);
        }
        f
    }

    fn run_native(&self, call: Call, dt: DataType, count: usize, op: ReduceOp) -> Res<()> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let caller = &native.caller;
        let stream = native.stream(call.stream)?;
        let root = usize::try_from(call.root).unwrap_or(0);
        if call.op == Op::Reduce {
            let reduce = ReduceCall {
                send: call.send as u64,
                recv: call.recv as u64,
                count,
                dtype: dt,
                op,
                root,
            };
            // SAFETY: NCCL's contract: `count` elements at `sendbuff` on every rank, and at
            // `recvbuff` on the root, alive until the operation has run on `stream`.
            let res = unsafe { caller.reduce(&reduce, call.tuning, &*stream) };
            return res.map_err(|e| self.note(e));
        }
        let kind = call
            .op
            .collective()
            .ok_or_else(|| Failure::internal("not a native operation"))?;
        let (in_bytes, out_bytes) = buffer_bytes(kind, count, dt, self.nranks)?;
        // Broadcast: only the root's send buffer is read; the others may pass anything.
        let send_ptr = if call.op == Op::Broadcast && root != self.rank {
            call.recv as u64
        } else {
            call.send as u64
        };
        // SAFETY: NCCL's contract: the caller's buffers are device memory of these sizes that
        // stays allocated until the operation has run on `stream` (the CUDA backend checks the
        // ranges with the driver).
        let (i, o) =
            unsafe { caller.wrap_pair((send_ptr, in_bytes), (call.recv as u64, out_bytes))? };
        // A plan of MSCCLPP_EXECUTION_PLAN_DIR that fits the call goes first (plans have no root),
        // unless the call's ncclCollConfig_t named an algorithm: that request is the more specific.
        let planned = match &native.plans {
            Some(p) if kind != CollectiveKind::Broadcast && call.tuning.algorithm.is_none() => {
                let pc = crate::plans::PlanCall {
                    collective: call.op.name(),
                    send: &i,
                    recv: &o,
                    dtype: dt,
                    op: kind.reduces().then_some(op),
                };
                p.run(caller, &pc, &*stream)
            }
            _ => Ok(false),
        };
        let res = match planned {
            Ok(true) => Ok(()),
            Err(e) => Err(e),
            Ok(false) => caller.collective_tuned(
                // NCCL's rule: every rank passes registered buffers or none.
                &CollectiveCall::new(kind, &i, &o, count, dt)
                    .op(op)
                    .root(root)
                    .registered(true),
                call.tuning,
                &*stream,
            ),
        };
        res.map_err(|e| self.note(e))
    }

    /// A group's native sends and receives on this communicator (checked when they were
    /// called): one launch of the point-to-point kernel on their stream.
    fn run_p2p(&self, calls: &[Call]) -> Res<()> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let Some(first) = calls.first() else {
            return Ok(());
        };
        if let Some(other) = calls.iter().find(|c| c.stream != first.stream) {
            return Err(Failure::usage(format!(
                "a group's sends and receives on one communicator run on one stream here: {:p} and {:p} were given",
                first.stream, other.stream
            )));
        }
        let caller = &native.caller;
        let stream = native.stream(first.stream)?;
        let mut buffers = Vec::with_capacity(calls.len());
        for c in calls {
            let (esize, _) = dtype_info(c.dtype)?;
            let bytes = c
                .count
                .checked_mul(esize)
                .ok_or_else(|| Failure::argument("count overflows"))?;
            let ptr = if c.op == Op::Send {
                c.send as u64
            } else {
                c.recv as u64
            };
            let buf = if bytes == 0 {
                None
            } else {
                // SAFETY: NCCL's contract: `count` elements at the buffer, alive until the
                // operation has run on `stream`.
                Some(unsafe { caller.wrap_slice(ptr, bytes)? })
            };
            buffers.push((buf, bytes));
        }
        let slices: Vec<Option<BufferSlice>> = buffers.iter().map(|(b, _)| b.clone()).collect();
        let ops: Vec<P2pOp> = calls
            .iter()
            .zip(&slices)
            .zip(&buffers)
            .filter_map(|((c, s), (_, bytes))| {
                s.as_ref().map(|s| P2pOp {
                    kind: if c.op == Op::Send {
                        P2pKind::Send
                    } else {
                        P2pKind::Recv
                    },
                    peer: usize::try_from(c.root).unwrap_or(usize::MAX),
                    buffer: s,
                    bytes: *bytes,
                })
            })
            .collect();
        caller.send_recv(&ops, &*stream).map_err(|e| self.note(e))
    }

    fn run_real(&self, call: Call, why: &str) -> Res<()> {
        let (lib, c) = self
            .real_comm()
            .ok_or_else(|| no_real(&format!("{} ({why})", call.op.name())))?;
        enter_real_group(lib)?;
        let (s, r, cnt, dt, rop, root, st) = (
            call.send,
            call.recv,
            call.count,
            call.dtype,
            call.redop,
            call.root,
            call.stream,
        );
        // SAFETY: the caller's arguments, as given, to the same function of the real NCCL with
        // its own communicator.
        let rc = unsafe {
            match call.op {
                Op::AllReduce => {
                    lib.need(lib.all_reduce, "ncclAllReduce")?(s, r, cnt, dt, rop, c, st)
                }
                Op::AllGather => lib.need(lib.all_gather, "ncclAllGather")?(s, r, cnt, dt, c, st),
                Op::ReduceScatter => {
                    lib.need(lib.reduce_scatter, "ncclReduceScatter")?(s, r, cnt, dt, rop, c, st)
                }
                Op::Broadcast => {
                    lib.need(lib.broadcast, "ncclBroadcast")?(s, r, cnt, dt, root, c, st)
                }
                Op::Reduce => lib.need(lib.reduce, "ncclReduce")?(s, r, cnt, dt, rop, root, c, st),
                Op::AllToAll => lib.need(lib.all_to_all, "ncclAlltoAll")?(s, r, cnt, dt, c, st),
                Op::Send => lib.need(lib.send, "ncclSend")?(s, cnt, dt, root, c, st),
                Op::Recv => lib.need(lib.recv, "ncclRecv")?(r, cnt, dt, root, c, st),
            }
        };
        lib.check(call.op.name(), rc)
    }

    /// The first half of a PreMulSum reduction: this rank's input times its own factor (NCCL
    /// sums `factor_r * x_r`, and ranks may pass different factors), enqueued on the operation's
    /// stream. All-reduce scales into the receive buffer and then runs in place there;
    /// reduce-scatter and reduce scale into the communicator's staging buffer. Returns the call
    /// that sums the scaled input.
    fn pre_scale(
        &self,
        call: Call,
        dt: DataType,
        count: usize,
        u: &crate::premul::UserOp,
    ) -> Res<Call> {
        let native = self
            .native
            .as_ref()
            .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
        let (Some(scaler), Some(factor)) = (&u.scaler, &u.factor) else {
            return Err(Failure::internal("a PreMulSum operator without its factor"));
        };
        // The input's bytes: a reduce's are an all-reduce's.
        let kind = call.op.collective().unwrap_or(CollectiveKind::AllReduce);
        let (bytes, _) = buffer_bytes(kind, count, dt, self.nranks)?;
        let in_elems = bytes / dt.size();
        let device = native.communicator().device();
        let stream = native.stream(call.stream)?;
        // SAFETY: NCCL's contract: `in_elems` elements at `sendbuff`, alive until the operation
        // has run on `stream`.
        let src = unsafe { device.wrap_external(DevicePtr(call.send as u64), bytes)? };
        let (dst, dst_ptr): (DeviceBuffer, u64) = if call.op == Op::AllReduce {
            // SAFETY: as above, for the `count` elements at `recvbuff`.
            let out = unsafe { device.wrap_external(DevicePtr(call.recv as u64), bytes)? };
            (out, call.recv as u64)
        } else {
            let mut staged = self
                .native
                .as_ref()
                .map(|n| n.premul_staging.lock().unwrap_or_else(|p| p.into_inner()))
                .ok_or_else(|| Failure::internal("native path without a native communicator"))?;
            if staged.last().is_none_or(|b| b.len() < bytes) {
                let b = device.alloc(bytes.max(4096), MemoryKind::Device)?;
                staged.push(b);
            }
            let b = staged
                .last()
                .cloned()
                .ok_or_else(|| Failure::internal("PreMulSum staging buffer missing"))?;
            let p = b.ptr().0;
            (b, p)
        };
        let (s, d) = (src.full(), dst.full());
        let same = s.ptr() == d.ptr();
        let enqueue =
            || scaler.scale_from(&d, (!same).then_some(&s), in_elems, dt, factor, &*stream);
        // The staging buffer is the communicator's: ordered as its collectives are.
        let res = native.caller.ordered(&*stream, enqueue);
        res.map_err(|e| self.note(e))?;
        Ok(Call {
            send: dst_ptr as *const c_void,
            ..call
        })
    }
}
