//! The registry of live handles: what an `ncclComm_t` names (a communicator, one being made,
//! one that failed), so that every export can refuse a stale or foreign handle.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, OnceLock};

use crate::abi::*;
use crate::comm::Comm;
use crate::error::{Failure, Res};
use crate::job::Job;

/// Live communicators by serial number. Every export looks its handle up here, so a stale,
/// foreign or garbage handle is `ncclInvalidArgument` rather than a crash.
///
/// A handle is not an address: it encodes a serial number that is never issued twice
/// (`serial * HANDLE_STRIDE + HANDLE_TAG`), so the handle of a destroyed communicator can never
/// come to name a later one, as a reused allocation address would. NCCL's clients only store,
/// compare and pass `ncclComm_t` values, never dereference them.
///
/// A handle is issued before its communicator exists when the creation runs in the background
/// (non-blocking config, or inside a group): the slot is [`Slot::Pending`] until the job ends.
struct Registry {
    live: HashMap<u64, Slot, BuildHasherDefault<SerialHasher>>,
    /// The next serial number; those below it were issued.
    next: u64,
}

/// What a live handle names.
#[derive(Debug, Clone)]
pub enum Slot {
    /// A usable communicator.
    Ready(Arc<Comm>),
    /// Being created by a background job (`ncclCommGetAsyncError`: `ncclInProgress`).
    Pending(Arc<Job>),
    /// Its creation failed; only `ncclCommGetAsyncError`, destroy and abort make sense.
    Failed(Failure),
}

/// Handles are `serial * HANDLE_STRIDE + HANDLE_TAG`: never 0 (NULL), never aligned like a
/// pointer, so a foreign value rarely decodes as one of ours.
const HANDLE_STRIDE: u64 = 16;
const HANDLE_TAG: u64 = 0xd;

/// Serials are issued in order and never repeat: one multiplication spreads them over the hash
/// (the table takes its tag from the top bits), where SipHash of a u64 would cost more than the
/// rest of the look-up that every export makes.
#[derive(Default)]
struct SerialHasher(u64);

impl Hasher for SerialHasher {
    fn finish(&self) -> u64 {
        self.0.wrapping_mul(0x9e37_79b9_7f4a_7c15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u64(&mut self, v: u64) {
        self.0 = v;
    }
}

fn registry() -> &'static Mutex<Registry> {
    static R: OnceLock<Mutex<Registry>> = OnceLock::new();
    R.get_or_init(|| {
        Mutex::new(Registry {
            live: HashMap::default(),
            next: 1,
        })
    })
}

fn lock_registry() -> std::sync::MutexGuard<'static, Registry> {
    registry().lock().unwrap_or_else(|p| p.into_inner())
}

fn handle_of(serial: u64) -> NcclComm {
    (serial * HANDLE_STRIDE + HANDLE_TAG) as usize as NcclComm
}

fn insert(slot: Slot) -> NcclComm {
    let mut r = lock_registry();
    let serial = r.next;
    r.next += 1;
    r.live.insert(serial, slot);
    handle_of(serial)
}

/// Registers a communicator; returns its handle.
pub fn register(c: Comm) -> NcclComm {
    insert(Slot::Ready(Arc::new(c)))
}

/// Every communicator ready now (the RAS service reports them).
pub fn ready() -> Vec<Arc<Comm>> {
    lock_registry()
        .live
        .values()
        .filter_map(|s| match s {
            Slot::Ready(c) => Some(Arc::clone(c)),
            _ => None,
        })
        .collect()
}

/// Issues the handle of a communicator a background job is creating; the job settles it with
/// [`settle`].
pub fn register_pending(job: &Arc<Job>) -> NcclComm {
    insert(Slot::Pending(Arc::clone(job)))
}

/// Ends a pending slot: the communicator (or the failure) replaces the job. If the handle was
/// destroyed or aborted meanwhile, the communicator is released here instead. The job is
/// finished last, so whoever waits on it finds the slot settled.
pub fn settle(h: NcclComm, job: &Arc<Job>, made: Res<Comm>) {
    let serial = h as usize as u64 / HANDLE_STRIDE;
    let result = made.as_ref().map(|_| ()).map_err(Clone::clone);
    let orphan = {
        let mut r = lock_registry();
        match r.live.get_mut(&serial) {
            Some(slot @ Slot::Pending(_)) => {
                *slot = match made {
                    Ok(c) => Slot::Ready(Arc::new(c)),
                    Err(f) => Slot::Failed(f),
                };
                None
            }
            _ => made.ok(),
        }
    };
    if let Some(c) = orphan {
        tracing::debug!(
            target: crate::debug::COMM_MODULE,
            "a communicator finished after its handle {h:p} was destroyed or aborted; releasing it"
        );
        c.abort_native();
        if let Err(e) = c.release_real(true) {
            tracing::warn!(target: crate::debug::COMM_MODULE, "{}", e.message);
        }
    }
    job.finish(result);
}

/// The serial number a handle encodes, or why it names no communicator.
fn serial_of(h: NcclComm, r: &Registry) -> Res<u64> {
    let serial = issued(h, r)?;
    if !r.live.contains_key(&serial) {
        return Err(destroyed(h));
    }
    Ok(serial)
}

/// The serial a handle encodes, if this library issued it (live or not).
fn issued(h: NcclComm, r: &Registry) -> Res<u64> {
    if h.is_null() {
        return Err(Failure::argument("comm is NULL"));
    }
    let v = h as usize as u64;
    let serial = v / HANDLE_STRIDE;
    if v % HANDLE_STRIDE != HANDLE_TAG || serial == 0 || serial >= r.next {
        return Err(Failure::argument(format!(
            "comm {h:p} is not a communicator of this library (not made by its \
             ncclCommInitRank, or corrupted)"
        )));
    }
    Ok(serial)
}

fn destroyed(h: NcclComm) -> Failure {
    Failure::argument(format!(
        "comm {h:p} was destroyed (ncclCommDestroy/ncclCommAbort): a stale handle"
    ))
}

/// What a handle names now, whatever its state.
pub fn slot(h: NcclComm) -> Res<Slot> {
    let r = lock_registry();
    let serial = issued(h, &r)?;
    r.live.get(&serial).cloned().ok_or_else(|| destroyed(h))
}

/// Why a slot that is not [`Slot::Ready`] cannot be used, as NCCL says it.
fn not_ready(h: NcclComm, s: Slot) -> Res<Arc<Comm>> {
    match s {
        Slot::Ready(c) => match c.busy_job() {
            None => Ok(c),
            Some(_) => Err(in_progress_misuse(h)),
        },
        Slot::Pending(_) => Err(in_progress_misuse(h)),
        Slot::Failed(f) => Err(Failure {
            code: f.code,
            message: format!("comm {h:p} failed to initialise: {}", f.message),
        }),
    }
}

/// NCCL's answer to a call on a communicator whose last non-blocking operation is still
/// running: `ncclInvalidArgument` (its `ncclCommEnsureReady`).
fn in_progress_misuse(h: NcclComm) -> Failure {
    Failure::argument(format!(
        "attempt to use communicator {h:p} before the previous operation returned ncclSuccess: \
         poll ncclCommGetAsyncError until it is no longer ncclInProgress"
    ))
}

/// The communicator behind a handle, ready for use (not pending, not finalizing).
pub fn lookup(h: NcclComm) -> Res<Arc<Comm>> {
    not_ready(h, slot(h)?)
}

/// As [`lookup`], for operations: also refuses a finalized communicator.
pub fn lookup_for_op(h: NcclComm) -> Res<Arc<Comm>> {
    let c = lookup(h)?;
    if c.finalized.load(Ordering::Acquire) {
        return Err(Failure::usage(format!(
            "comm {h:p} was finalized (ncclCommFinalize): only ncclCommDestroy or ncclCommAbort may follow"
        )));
    }
    Ok(c)
}

/// Removes a handle from the registry (destroy / abort), whatever its state.
pub fn unregister(h: NcclComm) -> Res<Slot> {
    let mut r = lock_registry();
    let serial = serial_of(h, &r)?;
    r.live
        .remove(&serial)
        .ok_or_else(|| Failure::argument(format!("comm {h:p} was destroyed")))
}
