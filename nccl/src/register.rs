//! Buffer registration: `ncclCommRegister` (local in NCCL) and `ncclCommWindowRegister`
//! (collective in NCCL 2.27+).
//!
//! mscclpp's registration (`Collectives::register`) maps a buffer into every peer, so it is
//! collective. Only the window API is collective in NCCL, so only it registers for zero copy:
//! every rank tells the others whether its buffer came from `ncclMemAlloc` (memory this library
//! owns and can export), and when all did, the buffers are registered together; all-reduces
//! whose input lies in such a window then read it in place where that pays (2 to 4 MiB per rank,
//! `Collectives::zero_copy_calls` counts them). `ncclCommRegister` is local: a local call cannot
//! make the peers' mappings, and registering lazily inside a later collective would need every
//! rank to register the same shapes at the same call, which NCCL does not require — a mismatch
//! would leave some ranks waiting for a registration the others never start. So it records the
//! range (and keeps `ncclMemAlloc` memory alive until deregistered) and the calls copy as
//! without it.
//!
//! A registered `ncclMemAlloc` buffer stays allocated until it is deregistered or its
//! communicator is destroyed, even after `ncclMemFree`: peers may still map it, so a buffer
//! freed without deregistering never leaves a dangling mapping behind.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use mscclpp::collectives::Window;
use mscclpp::hal::DeviceBuffer;

use crate::devapi::layout::WIN_COLL_SYMMETRIC;
use crate::devapi::space::{Mapped, Space};

use crate::comm::Comm;
use crate::error::{Failure, Res};

/// Which call made a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `ncclCommRegister`.
    Local,
    /// `ncclCommWindowRegister`.
    Window,
}

impl Kind {
    fn what(self) -> &'static str {
        match self {
            Kind::Local => "handle (of ncclCommRegister)",
            Kind::Window => "window (of ncclCommWindowRegister)",
        }
    }
}

#[derive(Debug)]
struct Reg {
    comm: Weak<Comm>,
    kind: Kind,
    /// The `ncclMemAlloc` buffer holding the range, kept alive while registered.
    _keep: Option<DeviceBuffer>,
    /// The collective registration (windows of `ncclMemAlloc` memory on every rank).
    window: Option<Window>,
    /// The caller's address of the range (`ncclWinGetUserPtr`), where it is known: ranges
    /// inside `ncclMemAlloc` memory (the only ones whose owner and offset are recorded).
    user: Option<usize>,
    /// A symmetric window (`NCCL_WIN_COLL_SYMMETRIC`): its mapping in every LSA rank's space;
    /// the handle is then its record's device address, which kernels read.
    sym: Option<(Arc<Space>, Mapped)>,
}

fn regs() -> &'static Mutex<HashMap<usize, Reg>> {
    static R: OnceLock<Mutex<HashMap<usize, Reg>>> = OnceLock::new();
    R.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Handles are never reused, nor aligned like pointers (so a foreign value rarely decodes).
static NEXT_HANDLE: AtomicU64 = AtomicU64::new(0x1000_0007);

fn insert(reg: Reg) -> *mut c_void {
    // A symmetric window's handle is its record's device address (what NCCL's `ncclWindow_t`
    // is), unique while the record lives.
    let h = match &reg.sym {
        Some((_, m)) => m.record.ptr().0 as usize,
        None => NEXT_HANDLE.fetch_add(16, Ordering::Relaxed) as usize,
    };
    let mut m = regs().lock().unwrap_or_else(|p| p.into_inner());
    // Registrations of destroyed communicators go with them.
    m.retain(|_, r| r.comm.strong_count() > 0);
    m.insert(h, reg);
    h as *mut c_void
}

/// `ncclCommRegister`: records the range; registers nothing collectively (see the module).
pub fn register_local(c: &Arc<Comm>, owner: Option<DeviceBuffer>) -> *mut c_void {
    tracing::debug!(
        rank = c.rank,
        owned = owner.is_some(),
        "ncclCommRegister: recorded (local registration: calls copy as without it; \
         ncclCommWindowRegister registers for zero copy)"
    );
    insert(Reg {
        comm: Arc::downgrade(c),
        kind: Kind::Local,
        _keep: owner,
        window: None,
        user: None,
        sym: None,
    })
}

/// `ncclCommWindowRegister`: a collective call. `owner` is the `ncclMemAlloc` buffer holding
/// `[buff, buff + size)` and the range's offset in it, if any; `flags` the window's. Where every
/// rank's memory comes from `ncclMemAlloc`, the window is mapped into every LSA rank's
/// symmetric space for the device API whatever its flags (as NCCL does: DeepEP registers with
/// `NCCL_WIN_STRICT_ORDERING` alone and asks for LSA pointers); with `NCCL_WIN_COLL_SYMMETRIC`
/// every rank's memory must come from `ncclMemAlloc`, and the collectives read the peers'
/// windows through the mappings.
pub fn register_window(
    c: &Arc<Comm>,
    owner: Option<(DeviceBuffer, usize)>,
    size: usize,
    flags: i32,
) -> Res<*mut c_void> {
    let symmetric = flags & WIN_COLL_SYMMETRIC != 0;
    let sym = match c.native.as_ref() {
        Some(n) => {
            // Collective on every rank alike: a rank without shareable memory fails the space
            // on every rank, which only a symmetric window turns into an error.
            let space = match n.devapi.space(n.communicator()) {
                Ok(s) => Some(s),
                Err(e) if symmetric => return Err(e),
                Err(e) => {
                    tracing::debug!("a window without a device window: {}", e.message);
                    None
                }
            };
            match space {
                Some(space) => {
                    let user = owner.as_ref().map_or(0, |(b, off)| b.ptr().0 + *off as u64);
                    space
                        .map(
                            owner.as_ref().map(|(b, _)| b),
                            owner.as_ref().map_or(0, |(_, off)| *off),
                            size,
                            user,
                            flags as u32,
                            symmetric,
                        )?
                        .map(|m| (space, m))
                }
                None => None,
            }
        }
        None => None,
    };
    let window = match c.caller() {
        Some(caller) => {
            let slice = match &owner {
                Some((buf, off)) => Some(buf.slice(*off..*off + size)?),
                None => None,
            };
            // A symmetric window every rank mapped at the same offset: the collectives read the
            // peers' windows through the symmetric mappings (no IPC handle is needed, which
            // shareable memory has none of); otherwise the caller side's agreed registration.
            let mapped = sym
                .as_ref()
                .filter(|_| symmetric)
                .and_then(|(_, m)| m.peers.as_ref());
            match (&slice, mapped) {
                (Some(s), Some(peers)) => caller.register_mapped(s, peers)?,
                _ => caller.register(slice.as_ref())?,
            }
        }
        None => None,
    };
    let user = owner
        .as_ref()
        .and_then(|(b, off)| (b.ptr().0 as usize).checked_add(*off));
    Ok(insert(Reg {
        comm: Arc::downgrade(c),
        kind: Kind::Window,
        _keep: owner.map(|(b, _)| b),
        window,
        user,
        sym,
    }))
}

/// `ncclWinGetUserPtr`: the caller's address of window `h` of `c`, where it was recorded
/// (windows inside `ncclMemAlloc` memory); `Ok(None)` for a window of other memory.
pub fn window_user_ptr(c: &Arc<Comm>, h: *mut c_void) -> Res<Option<*mut c_void>> {
    let m = regs().lock().unwrap_or_else(|p| p.into_inner());
    match m.get(&(h as usize)) {
        None => Err(Failure::argument(format!(
            "{} {h:p} was not returned by this library, or was deregistered already",
            Kind::Window.what()
        ))),
        Some(r) if r.kind != Kind::Window => Err(Failure::argument(format!(
            "{h:p} is a {}, not a {}",
            r.kind.what(),
            Kind::Window.what()
        ))),
        Some(r) if r.comm.as_ptr() != Arc::as_ptr(c) => Err(Failure::argument(format!(
            "{} {h:p} belongs to another communicator",
            Kind::Window.what()
        ))),
        Some(r) => Ok(r.user.map(|u| u as *mut c_void)),
    }
}

/// `ncclCommDeregister` / `ncclCommWindowDeregister` (collective for a window registered for
/// zero copy, as NCCL's window deregistration is).
pub fn deregister(c: &Arc<Comm>, h: *mut c_void, kind: Kind) -> Res<()> {
    let reg = {
        let mut m = regs().lock().unwrap_or_else(|p| p.into_inner());
        match m.get(&(h as usize)) {
            None => {
                return Err(Failure::argument(format!(
                    "{} {h:p} was not returned by this library, or was deregistered already",
                    kind.what()
                )));
            }
            Some(r) if r.kind != kind => {
                return Err(Failure::argument(format!(
                    "{h:p} is a {}, not a {}",
                    r.kind.what(),
                    kind.what()
                )));
            }
            Some(r) if r.comm.as_ptr() != Arc::as_ptr(c) => {
                return Err(Failure::argument(format!(
                    "{} {h:p} belongs to another communicator",
                    kind.what()
                )));
            }
            Some(_) => m.remove(&(h as usize)),
        }
    };
    let Some(reg) = reg else { return Ok(()) };
    // The collectives' window first: it may read through the symmetric mappings.
    if let Some(w) = reg.window {
        let caller = c
            .caller()
            .ok_or_else(|| Failure::internal("a window without a native side"))?;
        caller.deregister(w)?;
    }
    if let Some((space, m)) = reg.sym {
        space.unmap(m)?;
    }
    Ok(())
}

/// The address of `offset` bytes into LSA rank `lsa`'s copy of symmetric window `h`
/// (`ncclGetLsaDevicePointer`); `peer` names a world rank instead (`ncclGetPeerDevicePointer`).
pub fn symmetric_pointer(
    h: *mut c_void,
    offset: usize,
    lsa: Option<usize>,
    peer: Option<usize>,
) -> Res<u64> {
    let m = regs().lock().unwrap_or_else(|p| p.into_inner());
    let reg = m.get(&(h as usize)).ok_or_else(|| {
        Failure::argument(format!(
            "window {h:p} was not returned by ncclCommWindowRegister, or was deregistered already"
        ))
    })?;
    let (space, mapped) = reg.sym.as_ref().ok_or_else(|| {
        Failure::usage(format!(
            "window {h:p} has no device window: on some rank its memory is not ncclMemAlloc memory starting at a multiple of {} bytes into its allocation",
            crate::devapi::layout::WIN_ALIGNMENT
        ))
    })?;
    let size = mapped.entry.1 as usize;
    if offset >= size {
        return Err(Failure::argument(format!(
            "offset {offset} is past the window's {size} bytes"
        )));
    }
    let lsa = match (lsa, peer) {
        (Some(l), _) => l,
        (None, Some(p)) => space.team.iter().position(|&r| r == p).ok_or_else(|| {
            Failure::argument(format!(
                "rank {p} is not in this rank's LSA team {:?}: its memory is not mapped here",
                space.team
            ))
        })?,
        (None, None) => return Err(Failure::internal("neither an LSA rank nor a peer")),
    };
    space.lsa_pointer(mapped, offset as u64, lsa)
}
