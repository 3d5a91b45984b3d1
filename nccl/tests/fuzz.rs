//! Every export of `libmscclpp_nccl.so` called with hostile arguments (host backend, in a child
//! process so that a crash is a failure, not the end of the runner):
//!
//! 1. **One bad argument** at a time, the others valid: a NULL, stale (destroyed), foreign
//!    (random number, pointer to garbage memory, forged handle) communicator or handle; a NULL
//!    out-pointer or buffer; an unknown type, operator, root, peer, rank, device, color or flag;
//!    counts and sizes near `usize::MAX`; a config without its magic. Each call must return an
//!    error code and leave a message for `ncclGetLastError`.
//! 2. **Random mixes** of good and bad arguments: every call must return a known result code.
//!
//! Seeded (`MSCCLPP_NCCL_FUZZ_SEED` replays a run), bounded by time (`MSCCLPP_NCCL_FUZZ_SECS`,
//! default 12 s) and by a watchdog: a hang fails the test. Every export must have been called.
//! Runs with `cargo test -p mscclpp-nccl --test fuzz`.

#[macro_use]
mod support;
use std::collections::BTreeSet;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::EXPORTS;
use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{CollFn, Comm, MoveFn, lib_path, open_lib, output_text, self_command, wait_or_kill};

const CHILD_VAR: &str = "MSCCLPP_NCCL_FUZZ_CHILD";
const SEED_VAR: &str = "MSCCLPP_NCCL_FUZZ_SEED";
const SECS_VAR: &str = "MSCCLPP_NCCL_FUZZ_SECS";
const IN_PROGRESS: c_int = 7;
const MAX_RESULT: c_int = 8;

type P = *mut c_void;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.below(v.len())]
    }
    fn chance(&mut self, one_in: usize) -> bool {
        self.below(one_in) == 0
    }
}

type Red8 = unsafe extern "C" fn(*const c_void, P, usize, c_int, c_int, c_int, Comm, P) -> c_int;
type P2p = unsafe extern "C" fn(P, usize, c_int, c_int, Comm, P) -> c_int;
type Out = unsafe extern "C" fn(Comm, *mut c_int) -> c_int;

/// The kinds of argument a case may spoil.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arg {
    Comm,
    Out,
    Buf,
    Count,
    Dtype,
    Op,
    Root,
    Stream,
    Other,
}

/// What the library is fuzzed with: its exports and the values, good and bad.
struct Fuzz {
    lib: libloading::Library,
    rng: Rng,
    /// A live one-rank communicator (collectives are copies; nothing blocks).
    live: Comm,
    stale: Comm,
    garbage: Vec<u64>,
    bufs: [P; 2],
    /// An out-slot for anything the library writes.
    slot: [u64; 16],
    id: NcclUniqueId,
    called: BTreeSet<&'static str>,
    cases: usize,
    mixed: usize,
}

impl Fuzz {
    fn last(&self) -> Result<String, String> {
        let f = sym!(self.lib, "ncclGetLastError", fn(Comm) -> *const c_char);
        // SAFETY: the library's thread-local NUL-terminated message.
        Ok(unsafe { CStr::from_ptr(f(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned())
    }

    fn fresh(&mut self) -> Result<Comm, String> {
        let get_id = sym!(self.lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
        let init = sym!(
            self.lib,
            "ncclCommInitRank",
            fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
        );
        let mut id = NcclUniqueId { internal: [0; 128] };
        let mut c: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointers; one rank needs no peer.
        let r = unsafe {
            let r = get_id(&mut id);
            if r != 0 { r } else { init(&mut c, 1, id, 0) }
        };
        if r != 0 {
            return Err(format!("a one-rank communicator: {r} ({})", self.last()?));
        }
        self.id = id;
        Ok(c)
    }

    fn bad_comm(&mut self) -> Comm {
        let g = self.garbage.as_ptr() as usize;
        let forged = ((1u64 << 40) * 16 + 0xd) as usize;
        let random = (self.rng.next() | 1) as usize;
        self.rng.pick(&[
            0,
            self.stale as usize,
            g,
            forged,
            random,
            0x1d_usize + (1 << 44),
        ]) as Comm
    }

    fn comm(&mut self, bad: bool) -> Comm {
        if bad { self.bad_comm() } else { self.live }
    }

    fn out(&mut self, bad: bool) -> P {
        if bad {
            std::ptr::null_mut()
        } else {
            self.slot = [0; 16];
            self.slot.as_mut_ptr().cast()
        }
    }

    fn buf(&mut self, bad: bool, i: usize) -> P {
        if bad {
            std::ptr::null_mut()
        } else {
            self.bufs[i]
        }
    }

    fn count(&mut self, bad: bool) -> usize {
        if bad {
            self.rng
                .pick(&[usize::MAX, usize::MAX - 7, 1 << 63, (1 << 63) + 12_345])
        } else {
            self.rng.pick(&[0, 1, 16, 1000])
        }
    }

    fn dtype(&mut self, bad: bool) -> c_int {
        if bad {
            self.rng.pick(&[-1, 12, 255, c_int::MIN, c_int::MAX])
        } else {
            self.rng.below(12) as c_int
        }
    }

    fn op(&mut self, bad: bool) -> c_int {
        if bad {
            self.rng.pick(&[-1, c_int::MIN, 77, 1000])
        } else {
            self.rng.below(5) as c_int
        }
    }

    fn root(&mut self, bad: bool) -> c_int {
        if bad {
            self.rng.pick(&[-1, 1, 9, c_int::MAX, c_int::MIN])
        } else {
            0
        }
    }

    fn stream(&mut self, bad: bool) -> P {
        if bad {
            (self.rng.next() | 0x1000) as usize as P
        } else {
            std::ptr::null_mut()
        }
    }

    /// Records a call's result: in phase 1 it must be an error with a message; always a known
    /// code. Creations that succeeded are destroyed (a fresh handle, not the live one).
    fn check(
        &mut self,
        name: &'static str,
        rc: c_int,
        must_fail: bool,
        made: Comm,
    ) -> Result<(), String> {
        self.called.insert(name);
        if !(0..=MAX_RESULT).contains(&rc) {
            return Err(format!("{name}: unknown result code {rc}"));
        }
        if must_fail {
            self.cases += 1;
            if rc == 0 {
                return Err(format!("{name} with a bad argument returned ncclSuccess"));
            }
            if rc != IN_PROGRESS && self.last()?.is_empty() {
                return Err(format!("{name} failed ({rc}) without a message"));
            }
        } else {
            self.mixed += 1;
        }
        if (rc == 0 || rc == IN_PROGRESS) && !made.is_null() && made != self.live {
            self.dispose(made)?;
        }
        Ok(())
    }

    /// Waits for a communicator a call made (a non-blocking one too) and destroys it.
    fn dispose(&mut self, c: Comm) -> Result<(), String> {
        let async_f = sym!(
            self.lib,
            "ncclCommGetAsyncError",
            fn(Comm, *mut c_int) -> c_int
        );
        let destroy = sym!(self.lib, "ncclCommDestroy", fn(Comm) -> c_int);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut e = -1;
            // SAFETY: valid out-pointer; a handle the library issued.
            let rc = unsafe { async_f(c, &mut e) };
            if rc != 0 || e != IN_PROGRESS {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "a communicator made by the fuzz stayed in progress: {c:p}"
                ));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        // SAFETY: a handle the library issued; destroyed once.
        unsafe { destroy(c) };
        Ok(())
    }

    /// One call of export `k`; `bad` names the argument to spoil (phase 1), or `None` to draw
    /// every argument at random (phase 2).
    #[allow(clippy::too_many_lines)]
    fn call(&mut self, k: usize, bad: Option<Arg>) -> Result<(), String> {
        let mix = bad.is_none();
        let b = |a: Arg, rng: &mut Rng| match bad {
            Some(x) => x == a,
            None => rng.chance(3),
        };
        let must = !mix;
        let lib = &self.lib as *const libloading::Library;
        // SAFETY: the library outlives this call; the borrow checker cannot see that `self`'s
        // other fields are distinct from it.
        let lib = unsafe { &*lib };
        macro_rules! flag {
            ($a:expr) => {
                b($a, &mut self.rng)
            };
        }
        let null: P = std::ptr::null_mut();
        match k {
            0..=4 => {
                let (name, f): (&'static str, CollFn) = match k {
                    0 => ("ncclAllReduce", sym!(lib, "ncclAllReduce" as CollFn)),
                    1 => (
                        "ncclReduceScatter",
                        sym!(lib, "ncclReduceScatter" as CollFn),
                    ),
                    2 => ("ncclBroadcast", sym!(lib, "ncclBroadcast" as CollFn)),
                    3 => ("ncclGather", sym!(lib, "ncclGather" as CollFn)),
                    _ => ("ncclScatter", sym!(lib, "ncclScatter" as CollFn)),
                };
                let reduces = k < 2;
                let bad_arg = if reduces { Arg::Op } else { Arg::Root };
                let (cb, bb, nb, db, xb, sb) = (
                    flag!(Arg::Comm),
                    flag!(Arg::Buf),
                    flag!(Arg::Count),
                    flag!(Arg::Dtype),
                    flag!(bad_arg),
                    flag!(Arg::Stream),
                );
                let (c, s, r) = (self.comm(cb), self.buf(bb, 0), self.buf(bb, 1));
                let mut n = self.count(nb);
                if (bb || sb) && n == 0 {
                    n = 16;
                }
                let (d, st) = (self.dtype(db), self.stream(sb));
                let x = if reduces { self.op(xb) } else { self.root(xb) };
                // SAFETY: buffers are NULL or 64 KiB allocations of the library (counts of at
                // most 1000 elements of 8 bytes), or counts too large to describe memory.
                let rc = unsafe { f(s, r, n, d, x, c, st) };
                self.check(name, rc, must, null)
            }
            5..=6 => {
                let (name, f): (&'static str, MoveFn) = if k == 5 {
                    ("ncclAllGather", sym!(lib, "ncclAllGather" as MoveFn))
                } else {
                    ("ncclAlltoAll", sym!(lib, "ncclAlltoAll" as MoveFn))
                };
                let (cb, bb, nb, db, sb) = (
                    flag!(Arg::Comm),
                    flag!(Arg::Buf),
                    flag!(Arg::Count),
                    flag!(Arg::Dtype),
                    flag!(Arg::Stream),
                );
                let (c, s, r) = (self.comm(cb), self.buf(bb, 0), self.buf(bb, 1));
                let mut n = self.count(nb);
                if (bb || sb) && n == 0 {
                    n = 16;
                }
                let (d, st) = (self.dtype(db), self.stream(sb));
                // SAFETY: as above.
                let rc = unsafe { f(s, r, n, d, c, st) };
                self.check(name, rc, must, null)
            }
            7 => {
                let f: Red8 = sym!(
                    lib,
                    "ncclReduce",
                    fn(*const c_void, P, usize, c_int, c_int, c_int, Comm, P) -> c_int
                );
                let (cb, bb, nb, db, ob, rb, sb) = (
                    flag!(Arg::Comm),
                    flag!(Arg::Buf),
                    flag!(Arg::Count),
                    flag!(Arg::Dtype),
                    flag!(Arg::Op),
                    flag!(Arg::Root),
                    flag!(Arg::Stream),
                );
                let (c, s, r) = (self.comm(cb), self.buf(bb, 0), self.buf(bb, 1));
                let mut n = self.count(nb);
                if (bb || sb) && n == 0 {
                    n = 16;
                }
                let (d, o, root, st) =
                    (self.dtype(db), self.op(ob), self.root(rb), self.stream(sb));
                // SAFETY: as above.
                let rc = unsafe { f(s, r, n, d, o, root, c, st) };
                self.check("ncclReduce", rc, must, null)
            }
            8..=10 => {
                let (name, f): (&'static str, P2p) = match k {
                    8 => (
                        "ncclSend",
                        sym!(
                            lib,
                            "ncclSend",
                            fn(P, usize, c_int, c_int, Comm, P) -> c_int
                        ),
                    ),
                    9 => (
                        "ncclRecv",
                        sym!(
                            lib,
                            "ncclRecv",
                            fn(P, usize, c_int, c_int, Comm, P) -> c_int
                        ),
                    ),
                    _ => (
                        "ncclBcast",
                        sym!(
                            lib,
                            "ncclBcast",
                            fn(P, usize, c_int, c_int, Comm, P) -> c_int
                        ),
                    ),
                };
                let (cb, bb, nb, db, rb, sb) = (
                    flag!(Arg::Comm),
                    flag!(Arg::Buf),
                    flag!(Arg::Count),
                    flag!(Arg::Dtype),
                    flag!(Arg::Root),
                    flag!(Arg::Stream),
                );
                let (c, p) = (self.comm(cb), self.buf(bb, 0));
                let mut n = self.count(nb);
                if (bb || sb) && n == 0 {
                    n = 16;
                }
                let (d, peer, st) = (self.dtype(db), self.root(rb), self.stream(sb));
                // SAFETY: as above. A lone send or receive of one rank has no partner: the
                // library refuses it (valid arguments do not make a valid call here).
                let rc = unsafe { f(p, n, d, peer, c, st) };
                let must = must || (k < 10 && !mix);
                self.check(name, rc, must, null)
            }
            11..=14 => {
                let (name, f): (&'static str, Out) = match k {
                    11 => (
                        "ncclCommCount",
                        sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int),
                    ),
                    12 => (
                        "ncclCommUserRank",
                        sym!(lib, "ncclCommUserRank", fn(Comm, *mut c_int) -> c_int),
                    ),
                    // This library's own counter writes a u64: the 16-byte slot holds it.
                    13 if self.rng.chance(2) => (
                        "mscclppNcclZeroCopyCalls",
                        sym!(
                            lib,
                            "mscclppNcclZeroCopyCalls",
                            fn(Comm, *mut c_int) -> c_int
                        ),
                    ),
                    13 => (
                        "ncclCommCuDevice",
                        sym!(lib, "ncclCommCuDevice", fn(Comm, *mut c_int) -> c_int),
                    ),
                    _ => (
                        "ncclCommGetAsyncError",
                        sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int),
                    ),
                };
                let (cb, ob) = (flag!(Arg::Comm), flag!(Arg::Out));
                if !(mix || cb || ob) {
                    return Ok(());
                }
                let (c, o) = (self.comm(cb), self.out(ob));
                // SAFETY: `o` is NULL or the slot.
                let rc = unsafe { f(c, o.cast()) };
                self.check(name, rc, must, null)
            }
            15..=17 => {
                let (name, f): (&'static str, unsafe extern "C" fn(Comm) -> c_int) = match k {
                    15 => (
                        "ncclCommFinalize",
                        sym!(lib, "ncclCommFinalize", fn(Comm) -> c_int),
                    ),
                    16 => (
                        "ncclCommDestroy",
                        sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int),
                    ),
                    _ => (
                        "ncclCommAbort",
                        sym!(lib, "ncclCommAbort", fn(Comm) -> c_int),
                    ),
                };
                let cb = flag!(Arg::Comm);
                if !(mix || cb) {
                    return Ok(());
                }
                let c = if cb { self.bad_comm() } else { self.fresh()? };
                // SAFETY: a handle (checked by the library).
                let rc = unsafe { f(c) };
                self.check(name, rc, must, if cb || k != 15 { null } else { c })
            }
            18..=20 => {
                // Creations: out NULL, bad ranks, a foreign id, a config without magic.
                let init = sym!(
                    lib,
                    "ncclCommInitRank",
                    fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
                );
                let init_c = sym!(
                    lib,
                    "ncclCommInitRankConfig",
                    fn(*mut Comm, c_int, NcclUniqueId, c_int, P) -> c_int
                );
                let init_s = sym!(
                    lib,
                    "ncclCommInitRankScalable",
                    fn(*mut Comm, c_int, c_int, c_int, *mut NcclUniqueId, P) -> c_int
                );
                let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
                let which = self.rng.below(5);
                let (ob, rb, ib, fb) = match bad {
                    Some(_) => (which == 0, which == 1, which == 2, which == 3 || which == 4),
                    None => (
                        self.rng.chance(4),
                        self.rng.chance(4),
                        self.rng.chance(4),
                        self.rng.chance(4),
                    ),
                };
                // A fresh id only for a call that may succeed: an unused id keeps its root's
                // socket open until the process ends. The others get a used one: they are
                // refused before it is looked at.
                let mut id = self.id;
                if !(ob || rb || ib || fb) {
                    // SAFETY: valid out-pointer.
                    unsafe { get_id(&mut id) };
                    self.called.insert("ncclGetUniqueId");
                }
                if ib {
                    for (i, byte) in id.internal.iter_mut().enumerate() {
                        *byte = (self.rng.next() >> (i % 7)) as u8;
                    }
                }
                // Only one rank with a real id: more would wait for peers that never come.
                let (n, r) = if rb {
                    self.rng
                        .pick(&[(0, 0), (-1, 0), (1, 1), (1, -1), (c_int::MIN, 0)])
                } else {
                    (1, 0)
                };
                let (n, r) = if ib || rb { (n, r) } else { (1, 0) };
                let mut cfg = NcclConfig::INITIALIZER;
                cfg.blocking = self.rng.pick(&[0, 1, 7, c_int::MIN]);
                if fb {
                    cfg.magic = self.rng.next() as u32 | 1;
                }
                if !(mix || ob || rb || ib || fb) {
                    return Ok(());
                }
                let mut made: Comm = std::ptr::null_mut();
                let o: *mut Comm = if ob { std::ptr::null_mut() } else { &mut made };
                let cp: P = (&mut cfg as *mut NcclConfig).cast();
                // SAFETY: out NULL or a local; config a local struct; one id.
                let (name, rc) = unsafe {
                    match k {
                        18 if !fb => ("ncclCommInitRank", init(o, n, id, r)),
                        18 | 19 => ("ncclCommInitRankConfig", init_c(o, n, id, r, cp)),
                        _ => {
                            let nid = if rb { self.rng.pick(&[0, -3]) } else { 1 };
                            let ids: *mut NcclUniqueId = if ob && self.rng.chance(2) {
                                std::ptr::null_mut()
                            } else {
                                &mut id
                            };
                            ("ncclCommInitRankScalable", init_s(o, n, r, nid, ids, cp))
                        }
                    }
                };
                self.check(name, rc, must, made)
            }
            21 => {
                let f = sym!(
                    lib,
                    "ncclCommInitAll",
                    fn(*mut Comm, c_int, *const c_int) -> c_int
                );
                let mut comms = [std::ptr::null_mut::<c_void>(); 3];
                let which = self.rng.below(3);
                let (ob, nb, db) = match bad {
                    Some(_) => (which == 0, which == 1, which == 2),
                    None => (self.rng.chance(3), self.rng.chance(3), self.rng.chance(3)),
                };
                if !(mix || ob || nb || db) {
                    return Ok(());
                }
                let n = if nb {
                    self.rng.pick(&[0, -1, c_int::MIN])
                } else {
                    self.rng.pick(&[1, 2])
                };
                let bad_dev = [self.rng.pick(&[-1, 99, c_int::MAX]); 3];
                let dl: *const c_int = if db {
                    bad_dev.as_ptr()
                } else {
                    std::ptr::null()
                };
                let o = if ob {
                    std::ptr::null_mut()
                } else {
                    comms.as_mut_ptr()
                };
                // SAFETY: room for 3 handles; devlist NULL or 3 ints.
                let rc = unsafe { f(o, n, dl) };
                self.check("ncclCommInitAll", rc, must, null)?;
                if rc == 0 {
                    for c in comms.into_iter().filter(|c| !c.is_null()) {
                        self.dispose(c)?;
                    }
                }
                Ok(())
            }
            22 => {
                let f = sym!(
                    lib,
                    "ncclCommSplit",
                    fn(Comm, c_int, c_int, *mut Comm, P) -> c_int
                );
                let which = self.rng.below(4);
                let (cb, ob, xb, fb) = match bad {
                    Some(_) => (which == 0, which == 1, which == 2, which == 3),
                    None => (
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                    ),
                };
                if !(mix || cb || ob || xb || fb) {
                    return Ok(());
                }
                let c = self.comm(cb);
                let color = if xb {
                    self.rng.pick(&[-2, -100, c_int::MIN])
                } else {
                    self.rng.pick(&[-1, 0, 3])
                };
                let key = self.rng.next() as c_int;
                let mut cfg = NcclConfig::INITIALIZER;
                cfg.blocking = 1;
                if fb {
                    cfg.magic = 0;
                }
                let mut made: Comm = std::ptr::null_mut();
                let o: *mut Comm = if ob { std::ptr::null_mut() } else { &mut made };
                // SAFETY: out NULL or a local; a local config.
                let rc = unsafe { f(c, color, key, o, (&mut cfg as *mut NcclConfig).cast()) };
                self.check("ncclCommSplit", rc, must, made)
            }
            23 => {
                let f = sym!(
                    lib,
                    "ncclCommShrink",
                    fn(Comm, *mut c_int, c_int, *mut Comm, P, c_int) -> c_int
                );
                let which = self.rng.below(4);
                let (cb, ob, lb, fb) = match bad {
                    Some(_) => (which == 0, which == 1, which == 2, which == 3),
                    None => (
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                    ),
                };
                if !(mix || cb || ob || lb || fb) {
                    return Ok(());
                }
                let c = self.comm(cb);
                let mut list = [self.rng.pick(&[0, -1, 5, c_int::MAX])];
                let (lp, cnt) = if lb {
                    match self.rng.below(3) {
                        0 => (std::ptr::null_mut(), 1),
                        1 => (list.as_mut_ptr(), self.rng.pick(&[-1, 2, c_int::MAX])),
                        _ => (list.as_mut_ptr(), 1),
                    }
                } else {
                    (std::ptr::null_mut(), 0)
                };
                let flags = if fb {
                    self.rng.pick(&[2, -1, 0x100])
                } else {
                    self.rng.pick(&[0, 1])
                };
                let mut made: Comm = std::ptr::null_mut();
                let o: *mut Comm = if ob { std::ptr::null_mut() } else { &mut made };
                // SAFETY: the list holds one int and the count says at most that many only
                // when it may be read (larger counts are refused before any read).
                let rc = unsafe { f(c, lp, cnt, o, null, flags) };
                let r = self.check("ncclCommShrink", rc, must, made);
                if flags == 1 && rc == 0 {
                    // NCCL_SHRINK_ABORT aborted the live communicator's operations: replace it.
                    self.live = self.fresh()?;
                }
                r
            }
            24..=25 => {
                let (name, f): (
                    &'static str,
                    unsafe extern "C" fn(Comm, P, usize, *mut P) -> c_int,
                ) = if k == 24 {
                    (
                        "ncclCommRegister",
                        sym!(lib, "ncclCommRegister", fn(Comm, P, usize, *mut P) -> c_int),
                    )
                } else {
                    let w = sym!(
                        lib,
                        "ncclCommWindowRegister",
                        fn(Comm, P, usize, *mut P, c_int) -> c_int
                    );
                    self.called.insert("ncclCommWindowRegister");
                    // SAFETY: same arguments; flags 0.
                    let rc = unsafe {
                        let (cb, ob) = (flag!(Arg::Comm), flag!(Arg::Out));
                        if !(mix || cb || ob) {
                            return Ok(());
                        }
                        let (c, o) = (self.comm(cb), self.out(ob));
                        w(c, self.bufs[0], 4096, o.cast(), 0)
                    };
                    return self.check("ncclCommWindowRegister", rc, must, null);
                };
                let (cb, bb, ob) = (flag!(Arg::Comm), flag!(Arg::Buf), flag!(Arg::Out));
                if !(mix || cb || bb || ob) {
                    return Ok(());
                }
                let (c, p, o) = (self.comm(cb), self.buf(bb, 0), self.out(ob));
                // SAFETY: buffer NULL or a 64 KiB allocation; out NULL or the slot.
                let rc = unsafe { f(c, p, 4096, o.cast()) };
                self.check(name, rc, must, null)
            }
            26..=27 => {
                let name = if k == 26 {
                    "ncclCommDeregister"
                } else {
                    "ncclCommWindowDeregister"
                };
                let f = if k == 26 {
                    sym!(lib, "ncclCommDeregister", fn(Comm, P) -> c_int)
                } else {
                    sym!(lib, "ncclCommWindowDeregister", fn(Comm, P) -> c_int)
                };
                let cb = flag!(Arg::Comm);
                let c = self.comm(cb);
                let r = self.rng.next() as usize;
                let h = self
                    .rng
                    .pick(&[0usize, 0x1000, self.garbage.as_ptr() as usize, r])
                    as P;
                // SAFETY: handles are looked up, never dereferenced.
                let rc = unsafe { f(c, h) };
                self.check(name, rc, !mix, null)
            }
            28 => {
                let alloc = sym!(lib, "ncclMemAlloc", fn(*mut P, usize) -> c_int);
                let free = sym!(lib, "ncclMemFree", fn(P) -> c_int);
                let (ob, sb) = (flag!(Arg::Out), flag!(Arg::Count));
                if !(mix || ob || sb) {
                    // A double free instead.
                    let mut p: P = std::ptr::null_mut();
                    // SAFETY: valid out-pointer; then the same pointer twice.
                    unsafe {
                        self.check("ncclMemAlloc", alloc(&mut p, 4096), false, null)?;
                        self.check("ncclMemFree", free(p), false, null)?;
                        return self.check("ncclMemFree", free(p), true, null);
                    }
                }
                let size = if sb {
                    self.rng.pick(&[0, usize::MAX, usize::MAX - 4095, 1 << 62])
                } else {
                    64
                };
                let mut p: P = std::ptr::null_mut();
                let o: *mut P = if ob { std::ptr::null_mut() } else { &mut p };
                // SAFETY: out NULL or a local.
                let rc = unsafe { alloc(o, size) };
                self.check("ncclMemAlloc", rc, must, null)?;
                if rc == 0 && !p.is_null() {
                    // SAFETY: what ncclMemAlloc returned.
                    unsafe { free(p) };
                }
                let fp = self
                    .rng
                    .pick(&[0usize, 0x4321, self.garbage.as_ptr() as usize])
                    as P;
                // SAFETY: pointers are looked up, never dereferenced.
                let rc = unsafe { free(fp) };
                self.check("ncclMemFree", rc, true, null)
            }
            29 => {
                let f = sym!(
                    lib,
                    "ncclRedOpCreatePreMulSum",
                    fn(*mut c_int, P, c_int, c_int, Comm) -> c_int
                );
                let which = self.rng.below(4);
                let (ob, sb, db, cb) = match bad {
                    Some(_) => (which == 0, which == 1, which == 2, which == 3),
                    None => (
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                        self.rng.chance(3),
                    ),
                };
                if !(mix || ob || sb || db || cb) {
                    return Ok(());
                }
                let mut op: c_int = -1;
                let o: *mut c_int = if ob { std::ptr::null_mut() } else { &mut op };
                let s = self.buf(sb, 0);
                let (d, c) = (self.dtype(db), self.comm(cb));
                let residence = self.rng.pick(&[0, 1]);
                // SAFETY: out NULL or a local; the scalar NULL or a 64 KiB host-accessible
                // allocation (either residence reads at most 8 bytes of it).
                let rc = unsafe { f(o, s, d, residence, c) };
                self.check("ncclRedOpCreatePreMulSum", rc, must, null)?;
                if rc == 0 {
                    let destroy = sym!(lib, "ncclRedOpDestroy", fn(c_int, Comm) -> c_int);
                    // SAFETY: the operator just made, on its communicator.
                    unsafe { destroy(op, c) };
                }
                Ok(())
            }
            30 => {
                let f = sym!(lib, "ncclRedOpDestroy", fn(c_int, Comm) -> c_int);
                let cb = flag!(Arg::Comm);
                let c = self.comm(cb);
                let op = self.rng.pick(&[0, 4, 5, 999, -1, c_int::MIN]);
                // SAFETY: operators are looked up.
                let rc = unsafe { f(op, c) };
                self.check("ncclRedOpDestroy", rc, !mix, null)
            }
            31..=32 => {
                let cb = flag!(Arg::Comm);
                let c = self.comm(cb);
                let g = self.garbage.as_mut_ptr().cast::<c_void>();
                // SAFETY: requirements and device communicators are NULL or garbage memory of
                // 2 KiB; on a communicator of this library they are refused or forwarded to a
                // real NCCL, which is not loaded here.
                let create = sym!(
                    lib,
                    "ncclDevCommCreate",
                    fn(Comm, *const c_void, P) -> c_int
                );
                let destroy = sym!(lib, "ncclDevCommDestroy", fn(Comm, *const c_void) -> c_int);
                let reqs = if self.rng.chance(2) { null } else { g };
                let o = if self.rng.chance(2) {
                    null
                } else {
                    self.out(false)
                };
                // SAFETY: as said above.
                let rc = unsafe {
                    if k == 31 {
                        create(c, reqs, o)
                    } else {
                        destroy(c, reqs)
                    }
                };
                let name = if k == 31 {
                    "ncclDevCommCreate"
                } else {
                    "ncclDevCommDestroy"
                };
                self.check(name, rc, true, null)
            }
            33 => {
                let start = sym!(lib, "ncclGroupStart", fn() -> c_int);
                let end = sym!(lib, "ncclGroupEnd", fn() -> c_int);
                let sim = sym!(lib, "ncclGroupSimulateEnd", fn(P) -> c_int);
                // An end without a start, a simulation without a group; then a balanced group
                // of random collectives (phase 2 only).
                // SAFETY: no arguments / simInfo is only passed on.
                unsafe {
                    self.check("ncclGroupEnd", end(), true, null)?;
                    let g = if self.rng.chance(2) {
                        null
                    } else {
                        self.garbage.as_mut_ptr().cast()
                    };
                    self.check("ncclGroupSimulateEnd", sim(g), true, null)?;
                    if mix {
                        self.check("ncclGroupStart", start(), false, null)?;
                        for _ in 0..self.rng.below(4) {
                            let k = self.rng.below(11);
                            self.call(k, None)?;
                        }
                        self.check("ncclGroupEnd", end(), false, null)?;
                        self.check("ncclGroupStart", start(), false, null)?;
                        self.check("ncclGroupSimulateEnd", sim(null), false, null)?;
                    }
                }
                Ok(())
            }
            _ => {
                let v = sym!(lib, "ncclGetVersion", fn(*mut c_int) -> c_int);
                let es = sym!(lib, "ncclGetErrorString", fn(c_int) -> *const c_char);
                let le = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
                let id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
                let shim = sym!(lib, "mscclppNcclShim", fn() -> c_int);
                let code = self.rng.next() as c_int;
                let c = self.comm(true);
                // SAFETY: NULL out-pointers are refused; the strings are static or the
                // library's thread-local.
                unsafe {
                    self.check("ncclGetVersion", v(std::ptr::null_mut()), true, null)?;
                    self.check("ncclGetUniqueId", id(std::ptr::null_mut()), true, null)?;
                    for (name, p) in [
                        ("ncclGetErrorString", es(code)),
                        ("ncclGetLastError", le(c)),
                    ] {
                        self.called.insert(name);
                        if p.is_null() {
                            return Err(format!("{name} returned NULL"));
                        }
                        let _ = CStr::from_ptr(p);
                    }
                    if shim() != 1 {
                        return Err("mscclppNcclShim() != 1".into());
                    }
                }
                self.called.insert("mscclppNcclShim");
                Ok(())
            }
        }
    }
}

const KINDS: usize = 35;

/// The arguments export `k` may have spoilt (phase 1 picks one).
fn args_of(k: usize) -> &'static [Arg] {
    match k {
        0..=1 => &[
            Arg::Comm,
            Arg::Buf,
            Arg::Count,
            Arg::Dtype,
            Arg::Op,
            Arg::Stream,
        ],
        2..=4 | 8..=10 => &[
            Arg::Comm,
            Arg::Buf,
            Arg::Count,
            Arg::Dtype,
            Arg::Root,
            Arg::Stream,
        ],
        5..=6 => &[Arg::Comm, Arg::Buf, Arg::Count, Arg::Dtype, Arg::Stream],
        7 => &[
            Arg::Comm,
            Arg::Buf,
            Arg::Count,
            Arg::Dtype,
            Arg::Op,
            Arg::Root,
            Arg::Stream,
        ],
        11..=14 => &[Arg::Comm, Arg::Out],
        15..=17 | 26..=27 | 30..=32 => &[Arg::Comm],
        24..=25 => &[Arg::Comm, Arg::Buf, Arg::Out],
        28 => &[Arg::Out, Arg::Count, Arg::Other],
        _ => &[Arg::Other],
    }
}

fn child() -> Result<String, String> {
    let lib = open_lib()?;
    let seed: u64 = std::env::var(SEED_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            let mut b = [0u8; 8];
            let _ = getrandom::fill(&mut b);
            u64::from_le_bytes(b) | 1
        });
    let secs: u64 = std::env::var(SECS_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(12);
    println!("seed {seed} ({SEED_VAR} replays it)");
    let mut rng = Rng(seed | 1);
    let garbage: Vec<u64> = (0..256).map(|_| rng.next()).collect();
    let mut f = Fuzz {
        lib,
        rng,
        live: std::ptr::null_mut(),
        stale: std::ptr::null_mut(),
        garbage,
        bufs: [std::ptr::null_mut(); 2],
        slot: [0; 16],
        id: NcclUniqueId { internal: [0; 128] },
        called: BTreeSet::new(),
        cases: 0,
        mixed: 0,
    };
    let alloc = sym!(f.lib, "ncclMemAlloc", fn(*mut P, usize) -> c_int);
    let destroy = sym!(f.lib, "ncclCommDestroy", fn(Comm) -> c_int);
    for b in &mut f.bufs {
        // SAFETY: valid out-pointer.
        if unsafe { alloc(b, 64 << 10) } != 0 {
            return Err(format!("ncclMemAlloc: {}", f.last()?));
        }
    }
    f.live = f.fresh()?;
    f.stale = f.fresh()?;
    // SAFETY: a live handle, made stale.
    unsafe { destroy(f.stale) };
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut round = 0usize;
    // Every export at least once in each phase, then at random until the time is up.
    while round < 2 * KINDS || Instant::now() < deadline {
        let k = if round < 2 * KINDS {
            round % KINDS
        } else {
            f.rng.below(KINDS)
        };
        let phase1 = round < KINDS || (round >= 2 * KINDS && f.rng.chance(2));
        let r = if phase1 {
            let args = args_of(k);
            let a = args[f.rng.below(args.len())];
            f.call(k, Some(a)).map_err(|e| format!("bad {a:?}: {e}"))
        } else {
            f.call(k, None)
        };
        r.map_err(|e| {
            format!(
                "round {round} (export kind {k}, phase {}): {e}",
                if phase1 { 1 } else { 2 }
            )
        })?;
        round += 1;
    }
    let missing: Vec<&&str> = EXPORTS.iter().filter(|n| !f.called.contains(**n)).collect();
    if !missing.is_empty() {
        return Err(format!("exports never called: {missing:?}"));
    }
    Ok(format!(
        "{} calls with one bad argument (each an error with a message), {} random calls, {} exports, seed {seed}",
        f.cases,
        f.mixed,
        f.called.len()
    ))
}

fn fuzz_every_export() -> Result<(), Failed> {
    lib_path()?;
    let c = self_command()?
        .env(CHILD_VAR, "1")
        .env("MSCCLPP_BACKEND", "host")
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "10")
        .env("MSCCLPP_LOG_LEVEL", "off")
        .env_remove("NCCL_COMM_BLOCKING")
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(90);
    let (out, killed) = wait_or_kill(c, deadline, Duration::from_millis(20))?;
    if killed {
        return Err(format!(
            "the fuzz hung (killed after 90 s)\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
        .into());
    }
    let text = output_text(&out);
    if !out.status.success() {
        return Err(format!("{} (a signal is a crash)\n{text}", out.status).into());
    }
    println!("{}", text.trim());
    Ok(())
}

fn main() {
    if std::env::var_os(CHILD_VAR).is_some() {
        match child() {
            Ok(report) => {
                println!("{report}");
                std::process::exit(0);
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![Trial::test(
        "fuzz::every_export_hostile_arguments",
        fuzz_every_export,
    )];
    libtest_mimic::run(&args, trials).exit();
}
