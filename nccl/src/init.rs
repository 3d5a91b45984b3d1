//! Making a communicator: the checks an init call makes on its own thread ([`InitPlan`]), a
//! new rank's bootstrap, device and real NCCL ([`init_rank`]), the mscclpp side over a
//! bootstrap ([`build`]), and the wrapper of a communicator the real NCCL made
//! ([`from_real`]).

use std::ffi::c_int;
use std::sync::atomic::{AtomicBool, AtomicI32};
use std::sync::{Arc, Mutex};

use mscclpp::collectives::CollectiveKind;
use mscclpp::comm::{Bootstrap, BootstrapConfig, Cancel, Communicator, UniqueId};
use mscclpp::hal::Device;

use mscclpp_caller::Caller;

use crate::abi::*;
use crate::comm::{Comm, Native, RealComm};
use crate::config::CommConfig;
use crate::error::{Failure, Res};
use crate::real::{RealNccl, RealResults, real};
use crate::route::forced;

/// The checked `(nranks, rank)` of an init call.
pub fn check_ranks(nranks: c_int, rank: c_int) -> Res<(usize, usize)> {
    let n = usize::try_from(nranks)
        .ok()
        .filter(|&n| n >= 1)
        .ok_or_else(|| Failure::argument(format!("nranks {nranks}: must be at least 1")))?;
    let r = usize::try_from(rank)
        .ok()
        .filter(|&r| r < n)
        .ok_or_else(|| Failure::argument(format!("rank {rank} is not in 0..{n}")))?;
    Ok((n, r))
}

/// Decodes an `ncclUniqueId` made by this library's `ncclGetUniqueId`.
pub fn decode_id(id: &NcclUniqueId) -> Res<UniqueId> {
    UniqueId::from_bytes(&id.internal).map_err(|e| {
        Failure::argument(format!(
            "the ncclUniqueId was not made by this library's ncclGetUniqueId: {e}"
        ))
    })
}

/// What an init call settles on the calling thread before the work may move to another one:
/// the checked arguments and the device (the caller's current one: CUDA's current device is
/// per thread, so a background job cannot ask for it).
#[derive(Debug, Clone)]
pub struct InitPlan {
    /// Ranks.
    pub nranks: usize,
    /// This rank.
    pub rank: usize,
    /// The bootstrap id.
    pub uid: UniqueId,
    /// The device ordinal; `None`: pick by the rank's position on its host.
    pub ordinal: Option<usize>,
    /// The communicator's configuration.
    pub config: CommConfig,
    /// Ends the bootstrap join early (an abort of the pending handle).
    pub cancel: Cancel,
}

impl InitPlan {
    /// Checks the arguments and reads the calling thread's current device.
    pub fn new(nranks: c_int, id: &NcclUniqueId, rank: c_int, config: CommConfig) -> Res<Self> {
        crate::debug::show_version();
        let (n, r) = check_ranks(nranks, rank)?;
        forced()?;
        let uid = decode_id(id)?;
        real()?;
        let ordinal = mscclpp::registry::select()?.current_device()?;
        Ok(InitPlan {
            nranks: n,
            rank: r,
            uid,
            ordinal,
            config,
            cancel: Cancel::new(),
        })
    }
}

/// Creates this rank's communicator (`ncclCommInitRank*`): bootstrap, device, real NCCL
/// (when configured), collectives. Blocks until every rank has joined (or the bootstrap's
/// deadline).
pub fn init_rank(plan: InitPlan) -> Res<Comm> {
    let (n, r) = (plan.nranks, plan.rank);
    let real_lib = real()?;
    let cfg = BootstrapConfig {
        cancel: Some(plan.cancel.clone()),
        ..BootstrapConfig::from_env()?
    };
    let boot = Arc::new(Bootstrap::new(&plan.uid, r, n, cfg)?);
    let backend = mscclpp::registry::select()?;
    let ordinal = match plan.ordinal {
        Some(d) => d,
        None => {
            let count = backend.device_count().max(1);
            boot.host_rank() % count
        }
    };
    let device: Arc<dyn Device> = backend.open_device(ordinal)?;
    crate::debug::set_device(ordinal as i32);
    tracing::info!(
        target: crate::debug::INIT,
        "ncclCommInitRank rank {r} nranks {n} cudaDev {ordinal} backend {} ({}) - Init START",
        device.info().backend,
        backend.describe()
    );
    // The real NCCL communicator: rank 0 makes its id, the bootstrap carries it.
    let real_comm = match real_lib {
        None => None,
        Some(lib) => {
            device.make_current()?;
            let mut rid = NcclUniqueId {
                internal: [0; NCCL_UNIQUE_ID_BYTES],
            };
            let mut status = vec![1u8];
            if r == 0 {
                let get = lib.need(lib.get_unique_id, "ncclGetUniqueId")?;
                // SAFETY: valid out-pointer to a 128-byte struct.
                if let Err(e) = lib.check("ncclGetUniqueId", unsafe { get(&mut rid) }) {
                    tracing::warn!(target: crate::debug::COMM_MODULE, "{}", e.message);
                    status[0] = 0;
                }
                status.extend_from_slice(&rid.internal);
            }
            let got = boot.broadcast(0, &status)?;
            if got.first() != Some(&1) || got.len() != 1 + NCCL_UNIQUE_ID_BYTES {
                return Err(Failure::system(
                    "rank 0 could not create the real NCCL's unique id (see rank 0's log)",
                ));
            }
            rid.internal.copy_from_slice(&got[1..]);
            let init = lib.need(lib.comm_init_rank, "ncclCommInitRank")?;
            let mut c: NcclComm = std::ptr::null_mut();
            // SAFETY: valid out-pointer; the id came from rank 0's real ncclGetUniqueId; the
            // caller's device is current.
            lib.check("ncclCommInitRank", unsafe {
                init(&mut c, n as c_int, rid, r as c_int)
            })?;
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: real NCCL communicator for fallback operations ready ({}, version {})",
                lib.path,
                lib.version
            );
            Some(RealComm { lib, comm: c })
        }
    };
    let id = plan
        .uid
        .to_bytes()
        .iter()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            crate::comm::mix_id(h, u64::from(b))
        });
    build(boot, device, real_comm, plan.config, id)
}

/// A communicator of this library over `boot` (a fresh bootstrap, or a split or shrunk view of
/// a parent's) on `device`: its stream, collectives and reduce sink. Collective over `boot`'s
/// ranks. If anything fails, `real_comm` is released here.
pub fn build(
    boot: Arc<Bootstrap>,
    device: Arc<dyn Device>,
    real_comm: Option<RealComm>,
    config: CommConfig,
    id: u64,
) -> Res<Comm> {
    let (r, n) = (boot.rank(), boot.nranks());
    let ordinal = device.info().ordinal;
    let one_host = boot.hosts().iter().all(|&h| h == boot.hosts()[r]);
    let nodes = {
        let mut h = boot.hosts().to_vec();
        h.sort_unstable();
        h.dedup();
        h.len()
    };
    let made = (|| -> Res<Native> {
        let caller = Caller::new(Arc::new(Communicator::new(boot, device)))?;
        if let Some(why) = caller.no_collectives() {
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: every collective of this communicator falls back to the real NCCL: {why}"
            );
        }
        // Execution plans connect the ranks of one host.
        let plans = (caller.has_collectives() && one_host)
            .then(|| crate::plans::Plans::from_env(&caller))
            .flatten();
        Ok(Native {
            devapi: Default::default(),
            caller,
            plans,
            premul_staging: Mutex::new(Vec::new()),
            grow_id: Mutex::new(None),
        })
    })();
    crate::debug::set_device(ordinal as i32);
    if let Ok(native) = &made {
        log_served(r, n, ordinal, native, real_comm.is_some());
    }
    let c = Comm {
        rank: r,
        nranks: n,
        device: ordinal as i32,
        native: None,
        real: Mutex::new(real_comm),
        async_error: AtomicI32::new(NCCL_SUCCESS),
        config,
        busy: Mutex::new(None),
        has_busy: AtomicBool::new(false),
        finalized: AtomicBool::new(false),
        id,
        children: Default::default(),
        profiler: None,
    };
    match made {
        Ok(native) => {
            let c = Comm {
                native: Some(native),
                profiler: crate::profiler::Attached::new(
                    id,
                    c.config.comm_name.as_deref(),
                    nodes,
                    n,
                    r,
                )
                .map(Arc::new),
                ..c
            };
            // The proxy events of its transfers between hosts (where a proxy carries them).
            if let (Some(att), Some(n)) = (&c.profiler, &c.native) {
                let events = Arc::new(crate::profiler::proxy::ProxyEvents::new(att.clone()));
                if let Err(e) = n.caller.observe_proxy(events) {
                    tracing::warn!(
                        target: crate::debug::INIT,
                        "rank {r}: no proxy events for the profiler plugin: {e}"
                    );
                }
            }
            // NCCL's RAS service reports it from now on (every rank's card says who it is).
            crate::ras::start();
            crate::ras::publish(&c, false, false);
            Ok(c)
        }
        Err(f) => {
            if let Err(e) = c.release_real(true) {
                tracing::warn!(target: crate::debug::COMM_MODULE, "{}", e.message);
            }
            Err(f)
        }
    }
}

/// The init lines (`NCCL_DEBUG=INFO`) of a native communicator: who serves it, and the
/// algorithm each collective takes (forced by `MSCCLPP_ALGO_*` or chosen by size).
fn log_served(r: usize, n: usize, ordinal: usize, native: &Native, has_real: bool) {
    if !tracing::enabled!(target: crate::debug::INIT, tracing::Level::INFO) {
        return;
    }
    let forced = forced().map(|f| f.iter().map(|o| o.name()).collect::<Vec<_>>());
    let forced = match forced {
        Ok(mut f) if !f.is_empty() => {
            f.sort_unstable();
            format!(
                "; forced to the real NCCL by MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION: {}",
                f.join(",")
            )
        }
        _ => String::new(),
    };
    let fallback = if has_real {
        "the real NCCL for the rest"
    } else {
        "no real NCCL loaded (MSCCLPP_NCCL_LIB_PATH unset)"
    };
    let served = match (native.caller.has_collectives(), n) {
        (true, _) => "natively by mscclpp-rs",
        (false, 1) => "natively by mscclpp-rs (one rank: operations are copies)",
        (false, _) => "by the real NCCL (no native collectives)",
    };
    tracing::info!(
        target: crate::debug::INIT,
        "comm rank {r} nranks {n} cudaDev {ordinal} - Init COMPLETE: served {served}; {fallback}{forced}"
    );
    if native.caller.has_collectives() {
        const KIB: u64 = 1 << 10;
        for kind in CollectiveKind::ALL {
            let by_size = [4 * KIB, 256 * KIB, 16 * KIB * KIB].map(|b| {
                let algo = native
                    .caller
                    .algorithm(kind, b)
                    .map_or("none", |a| a.name());
                format!("{}:{}", size_label(b), algo)
            });
            tracing::info!(
                target: crate::debug::INIT,
                "rank {r}: {kind:?} algorithm by rank-block size {}",
                by_size.join(" ")
            );
        }
    }
}

fn size_label(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 => format!("{}MiB", b >> 20),
        b if b >= 1 << 10 => format!("{}KiB", b >> 10),
        b => format!("{b}B"),
    }
}

/// A communicator made by the real NCCL (split, shrink, init-all): every operation falls back.
///
/// # Safety
/// `c` must be a live communicator of `lib`; the result takes it over (destroys it).
pub unsafe fn from_real(lib: &'static RealNccl, c: NcclComm) -> Res<Comm> {
    let (mut rank, mut count, mut dev) = (0, 0, -1);
    // SAFETY: valid out-pointers; `c` is a live real communicator.
    unsafe {
        lib.check(
            "ncclCommUserRank",
            lib.need(lib.comm_user_rank, "ncclCommUserRank")?(c, &mut rank),
        )?;
        lib.check(
            "ncclCommCount",
            lib.need(lib.comm_count, "ncclCommCount")?(c, &mut count),
        )?;
        if let Some(f) = lib.comm_cu_device {
            f(c, &mut dev);
        }
    }
    Ok(Comm {
        rank: usize::try_from(rank).unwrap_or(0),
        nranks: usize::try_from(count).unwrap_or(0),
        device: dev,
        native: None,
        real: Mutex::new(Some(RealComm { lib, comm: c })),
        async_error: AtomicI32::new(NCCL_SUCCESS),
        config: CommConfig::default(),
        busy: Mutex::new(None),
        has_busy: AtomicBool::new(false),
        finalized: AtomicBool::new(false),
        id: 0,
        children: Default::default(),
        profiler: None,
    })
}
