//! `ncclGroupStart`/`ncclGroupEnd` on the calling thread: the nesting depth, the native sends
//! and receives kept for the outermost end, the creations it waits for, and the real NCCL's
//! group opened for the operations that fall back.

use std::sync::Arc;

use crate::comm::Comm;
use crate::error::{Failure, Res};
use crate::job::{Job, job_deadline};
use crate::real::{RealNccl, RealResults};
use crate::route::Call;

thread_local! {
    /// `ncclGroupStart` nesting depth on this thread.
    static GROUP_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// The real NCCL library whose group this thread has opened (lazily, at the first
    /// fallback operation inside our group), to be closed at the outermost `ncclGroupEnd`.
    static REAL_GROUP: std::cell::Cell<Option<&'static RealNccl>> = const { std::cell::Cell::new(None) };
    /// Native sends and receives of this thread's open group, in call order: launched at the
    /// outermost `ncclGroupEnd`, one launch per communicator.
    static PENDING: std::cell::RefCell<Vec<(Arc<Comm>, Call, P2pLaunch)>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Communicator creations started inside this thread's open group (job, blocking, what):
    /// the outermost `ncclGroupEnd` waits for the blocking ones.
    static GROUP_JOBS: std::cell::RefCell<Vec<(Arc<Job>, bool, &'static str)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs one communicator's deferred sends and receives as one launch. The native side hands it
/// over with them, so that this module need not use the native one (which uses this one).
pub type P2pLaunch = fn(&Comm, &[Call]) -> Res<()>;

/// Leaves a native send or receive, checked already, to the outermost `ncclGroupEnd`, which
/// runs it with `launch` together with the others of its communicator.
pub fn defer_p2p(c: Arc<Comm>, call: Call, launch: P2pLaunch) {
    PENDING.with(|p| p.borrow_mut().push((c, call, launch)));
}

/// Leaves a creation started inside the open group to the outermost `ncclGroupEnd`.
pub fn defer_job(job: Arc<Job>, blocking: bool, what: &'static str) {
    GROUP_JOBS.with(|g| g.borrow_mut().push((job, blocking, what)));
}

/// The outermost `ncclGroupEnd`'s wait for the group's creations: the blocking ones must end
/// (within the deadline); a non-blocking one makes the group end `ncclInProgress`.
fn end_group_jobs() -> Res<()> {
    let jobs = GROUP_JOBS.with(|g| std::mem::take(&mut *g.borrow_mut()));
    if jobs.is_empty() {
        return Ok(());
    }
    let deadline = job_deadline();
    let mut first: Option<Failure> = None;
    let mut in_progress = false;
    for (job, blocking, what) in &jobs {
        if !blocking {
            in_progress |= job.result().is_none();
            continue;
        }
        if let Err(f) = job.wait(deadline, what) {
            first.get_or_insert(Failure {
                code: f.code,
                message: format!("{what} inside the group: {}", f.message),
            });
        }
    }
    match first {
        Some(f) => Err(f),
        None if in_progress => Err(Failure::in_progress()),
        None => Ok(()),
    }
}

/// `ncclGroupStart`.
pub fn group_start() -> Res<()> {
    GROUP_DEPTH.with(|d| d.set(d.get().saturating_add(1)));
    Ok(())
}

/// `ncclGroupEnd`.
pub fn group_end() -> Res<()> {
    let depth = GROUP_DEPTH.with(|d| d.get());
    if depth == 0 {
        return Err(Failure::usage(
            "ncclGroupEnd without a matching ncclGroupStart",
        ));
    }
    GROUP_DEPTH.with(|d| d.set(depth - 1));
    if depth == 1 {
        // Creations first: operations in the same group may use what they create.
        let created = end_group_jobs();
        // Then the collective calls (window registrations, device communicators), which the
        // group's operations may use too.
        let collectives = if created.is_ok() {
            end_group_collectives()
        } else {
            GROUP_COLLECTIVES.with(|g| g.borrow_mut().clear());
            Ok(())
        };
        // The group's native sends and receives: one launch per communicator.
        let pending = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
        let mut first_error: Option<Failure> = None;
        let mut done: Vec<*const Comm> = Vec::new();
        for (c, _, launch) in &pending {
            if done.contains(&Arc::as_ptr(c)) {
                continue;
            }
            done.push(Arc::as_ptr(c));
            let calls: Vec<Call> = pending
                .iter()
                .filter(|(d, _, _)| Arc::ptr_eq(c, d))
                .map(|(_, call, _)| *call)
                .collect();
            if let Err(e) = launch(c, &calls) {
                first_error.get_or_insert(e);
            }
        }
        // The group API event of the profiler, if one is open on this thread, ends here
        // (before anything below can return early).
        crate::profiler::group_end();
        if let Some(lib) = REAL_GROUP.with(|g| g.take()) {
            let end = lib.need(lib.group_end, "ncclGroupEnd")?;
            // SAFETY: closes the group this thread opened in the real NCCL.
            lib.check("ncclGroupEnd", unsafe { end() })?;
        }
        if let Some(e) = first_error {
            return Err(e);
        }
        created?;
        collectives?;
    }
    Ok(())
}

/// Whether the calling thread is inside a group.
pub fn in_group() -> bool {
    GROUP_DEPTH.with(|d| d.get()) > 0
}

/// Inside our group, opens the real NCCL's group once, before the first forwarded operation.
pub fn enter_real_group(lib: &'static RealNccl) -> Res<()> {
    if !in_group() || REAL_GROUP.with(|g| g.get()).is_some() {
        return Ok(());
    }
    let start = lib.need(lib.group_start, "ncclGroupStart")?;
    // SAFETY: no arguments; balanced at the outermost ncclGroupEnd.
    lib.check("ncclGroupStart", unsafe { start() })?;
    REAL_GROUP.with(|g| g.set(Some(lib)));
    Ok(())
}

/// A collective call left to the outermost `ncclGroupEnd`: its communicator (by address), its
/// name, and its body.
type Deferred = (usize, &'static str, Body);
/// The body of a deferred collective call.
type Body = Box<dyn FnOnce() -> Res<()> + Send>;

thread_local! {
    /// The collective calls of this thread's open group ([`run_collective`]), in call order.
    static GROUP_COLLECTIVES: std::cell::RefCell<Vec<Deferred>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs a collective call that may be made inside a group (`ncclCommWindowRegister`,
/// `ncclCommWindowDeregister`, `ncclDevCommCreate`) on communicator `comm`: at once outside a
/// group; inside one, at the outermost `ncclGroupEnd` — one thread may drive several ranks in
/// one group (a process of several GPUs, nccl-tests' `-g`), which a blocking collective on the
/// calling thread would deadlock. There each communicator's calls run in call order on a thread
/// of their own (its collectives must not interleave: every rank makes them in the same
/// order), the communicators side by side. NCCL's contract: the outputs may be written only
/// when the group ends, so the call's pointers stay valid until then.
pub fn run_collective(
    comm: &Arc<Comm>,
    what: &'static str,
    body: impl FnOnce() -> Res<()> + Send + 'static,
) -> Res<()> {
    if !in_group() {
        return body();
    }
    let key = Arc::as_ptr(comm) as usize;
    GROUP_COLLECTIVES.with(|g| g.borrow_mut().push((key, what, Box::new(body) as Body)));
    Ok(())
}

/// The outermost `ncclGroupEnd`'s run of the group's collective calls (see [`run_collective`]).
fn end_group_collectives() -> Res<()> {
    let calls = GROUP_COLLECTIVES.with(|g| std::mem::take(&mut *g.borrow_mut()));
    if calls.is_empty() {
        return Ok(());
    }
    let mut by_comm: Vec<(usize, Vec<(&'static str, Body)>)> = Vec::new();
    for (key, what, body) in calls {
        match by_comm.iter_mut().find(|(k, _)| *k == key) {
            Some((_, list)) => list.push((what, body)),
            None => by_comm.push((key, vec![(what, body)])),
        }
    }
    let results: Vec<Res<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = by_comm
            .into_iter()
            .map(|(_, list)| {
                s.spawn(move || -> Res<()> {
                    for (what, body) in list {
                        std::panic::catch_unwind(std::panic::AssertUnwindSafe(body))
                            .unwrap_or_else(|_| {
                                Err(Failure::internal(format!("{what}: caught a panic")))
                            })
                            .map_err(|f| Failure {
                                code: f.code,
                                message: format!("{what} inside the group: {}", f.message),
                            })?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Failure::internal("a group's collective calls panicked"))
                })
            })
            .collect()
    });
    results.into_iter().collect()
}
