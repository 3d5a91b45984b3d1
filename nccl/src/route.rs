//! Which way an operation goes: the operations ([`Op`], [`Call`]), those
//! `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION` forces to the real NCCL, and [`decide`], which picks
//! mscclpp or the real NCCL from what the call and the communicator offer.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use mscclpp::collectives::CollectiveKind;
use mscclpp::hal::{DataType, ReduceOp};

use crate::abi::CudaStream;
use crate::error::{Failure, Res};

/// The operations this library dispatches (names as in `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// `ncclAllReduce`.
    AllReduce,
    /// `ncclAllGather`.
    AllGather,
    /// `ncclReduceScatter`.
    ReduceScatter,
    /// `ncclBroadcast` / `ncclBcast`.
    Broadcast,
    /// `ncclAlltoAll`.
    AllToAll,
    /// `ncclReduce`.
    Reduce,
    /// `ncclSend`.
    Send,
    /// `ncclRecv`.
    Recv,
}

impl Op {
    const ALL: [Op; 8] = [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::Broadcast,
        Op::AllToAll,
        Op::Reduce,
        Op::Send,
        Op::Recv,
    ];

    /// Lower-case name.
    pub fn name(self) -> &'static str {
        match self {
            Op::AllReduce => "allreduce",
            Op::AllGather => "allgather",
            Op::ReduceScatter => "reducescatter",
            Op::Broadcast => "broadcast",
            Op::AllToAll => "alltoall",
            Op::Reduce => "reduce",
            Op::Send => "send",
            Op::Recv => "recv",
        }
    }

    /// The collective of mscclpp that serves it, if one does.
    pub fn collective(self) -> Option<CollectiveKind> {
        match self {
            Op::AllReduce => Some(CollectiveKind::AllReduce),
            Op::AllGather => Some(CollectiveKind::AllGather),
            Op::ReduceScatter => Some(CollectiveKind::ReduceScatter),
            Op::Broadcast => Some(CollectiveKind::Broadcast),
            Op::AllToAll => Some(CollectiveKind::AllToAll),
            Op::Reduce | Op::Send | Op::Recv => None,
        }
    }

    fn parse(s: &str) -> Option<Op> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "bcast" => Some(Op::Broadcast),
            "all_reduce" => Some(Op::AllReduce),
            "all_gather" => Some(Op::AllGather),
            "reduce_scatter" => Some(Op::ReduceScatter),
            "all_to_all" | "alltoallv" => Some(Op::AllToAll),
            _ => Op::ALL.into_iter().find(|o| o.name() == s),
        }
    }
}

/// `MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION`: `all`, or a comma list of operation names.
pub fn forced() -> Res<&'static HashSet<Op>> {
    static FORCED: OnceLock<Result<HashSet<Op>, Failure>> = OnceLock::new();
    FORCED
        .get_or_init(|| {
            const VAR: &str = "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION";
            let Some(v) = mscclpp::hal::env::get(VAR) else {
                return Ok(HashSet::new());
            };
            let mut set = HashSet::new();
            for part in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                if part.eq_ignore_ascii_case("all") {
                    set.extend(Op::ALL);
                } else {
                    set.insert(Op::parse(part).ok_or_else(|| {
                        Failure::argument(format!(
                            "{VAR}={v:?}: unknown operation {part:?}; expected `all` or a comma list of {}",
                            Op::ALL.map(Op::name).join(", ")
                        ))
                    })?);
                }
            }
            Ok(set)
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Logs once per operation kind which way it went.
pub fn log_route(op: Op, native: bool, why: &str) {
    static LOGGED: [[AtomicBool; 8]; 2] = [const { [const { AtomicBool::new(false) }; 8] }; 2];
    let slot = &LOGGED[usize::from(native)][Op::ALL.iter().position(|o| *o == op).unwrap_or(0)];
    // A load first: a store on every call would bounce the line between the callers' cores.
    if !slot.load(Ordering::Relaxed) && !slot.swap(true, Ordering::Relaxed) {
        if native {
            tracing::info!(target: crate::debug::COMM_MODULE, op = op.name(), "served natively by mscclpp");
        } else {
            tracing::info!(
                target: crate::debug::COMM_MODULE,
                op = op.name(),
                "falls back to the real NCCL: {why}"
            );
        }
    }
}

/// One collective call, as the C API gave it.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    /// Which operation.
    pub op: Op,
    /// Send buffer.
    pub send: *const c_void,
    /// Receive buffer.
    pub recv: *mut c_void,
    /// Element count (per rank block, as NCCL defines it per operation).
    pub count: usize,
    /// `ncclDataType_t`.
    pub dtype: c_int,
    /// `ncclRedOp_t` (reducing operations).
    pub redop: c_int,
    /// Root (broadcast, reduce) or peer (send, recv).
    pub root: c_int,
    /// `cudaStream_t`.
    pub stream: CudaStream,
    /// What the call's `ncclCollConfig_t` changes (the plain calls: nothing).
    pub tuning: crate::collconfig::Tuning,
}

/// What a communicator's mscclpp side offers an operation.
#[derive(Debug, Clone, Copy)]
pub enum NativeSide<'a> {
    /// None: the real NCCL made the communicator.
    Absent,
    /// It serves no operation, for the reason given (no collectives for these ranks).
    Idle(&'a str),
    /// It serves operations.
    Serves {
        /// Its ranks span several hosts.
        hosts: bool,
    },
}

/// An operation as [`decide`] sees it: the call, its types decoded.
#[derive(Debug, Clone, Copy)]
pub struct Request {
    /// Which operation.
    pub op: Op,
    /// Element count.
    pub count: usize,
    /// The `ncclDataType_t` (reasons name it).
    pub dtype: c_int,
    /// Its HAL type, if it has one.
    pub hal_dtype: Option<DataType>,
    /// The HAL operator of a reducing operation (a PreMulSum one: its sum).
    pub hal_op: Option<ReduceOp>,
    /// A PreMulSum operator without a native factor (made for a fallback communicator).
    pub premul_without_factor: bool,
}

/// Where an operation runs.
#[derive(Debug, Clone)]
pub enum Route {
    /// On mscclpp, moving `count` elements of `dtype` (reducing with `op`).
    Native {
        /// The HAL type that moves the bytes.
        dtype: DataType,
        /// Elements.
        count: usize,
        /// The operator (`Sum` for pure data movement).
        op: ReduceOp,
    },
    /// Through the real NCCL, for this reason.
    Real(String),
}

/// Whether `req` runs on mscclpp or through the real NCCL, given the operations `forced` to
/// the real NCCL and what the communicator's mscclpp side offers. It only decides (its caller
/// logs the route and runs the operation), so that the rule reads apart from the runs.
pub fn decide(req: &Request, forced: &HashSet<Op>, native: NativeSide<'_>) -> Route {
    let plan = || -> Result<(DataType, usize, ReduceOp), String> {
        if forced.contains(&req.op) {
            return Err("forced by MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION".into());
        }
        let hosts = match native {
            NativeSide::Absent => return Err("the communicator was made by the real NCCL".into()),
            NativeSide::Idle(why) => return Err(why.to_owned()),
            NativeSide::Serves { hosts } => hosts,
        };
        match req.op {
            Op::Send | Op::Recv if hosts => {
                Err("sends and receives between hosts are not served natively yet".into())
            }
            Op::Send | Op::Recv => {
                let dt = req
                    .hal_dtype
                    .ok_or_else(|| format!("no native type for ncclDataType_t {}", req.dtype))?;
                Ok((dt, req.count, ReduceOp::Sum))
            }
            Op::AllReduce | Op::ReduceScatter | Op::Reduce => {
                if req.premul_without_factor {
                    return Err("a PreMulSum operator of a fallback communicator".into());
                }
                let op = req.hal_op.ok_or("no native reduction operator")?;
                let dt = req.hal_dtype.ok_or_else(|| {
                    format!("no native reduction of ncclDataType_t {}", req.dtype)
                })?;
                Ok((dt, req.count, op))
            }
            Op::AllGather | Op::Broadcast | Op::AllToAll => {
                // Pure data movement: any type.
                let dt = req
                    .hal_dtype
                    .ok_or_else(|| format!("no native type for ncclDataType_t {}", req.dtype))?;
                Ok((dt, req.count, ReduceOp::Sum))
            }
        }
    };
    match plan() {
        Ok((dtype, count, op)) => Route::Native { dtype, count, op },
        Err(why) => Route::Real(why),
    }
}
