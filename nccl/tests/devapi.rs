//! NCCL's device API through the C ABI (`dlopen`, as a C program), on the host backend, where
//! "device" memory is the host's: two ranks as child processes register symmetric windows of
//! `ncclMemAlloc` memory, read each other's data and write into each other's windows through
//! the address arithmetic of NCCL's device headers (`lsaFlatBase + lsaRank * stride4G << 32`),
//! create device communicators at every client layout served (2.29.2, 2.29.7, 2.30.7, 2.32.6)
//! and check their fields, run the LSA barrier's protocol over the resource buffer as the
//! headers' `ncclLsaBarrierSession` does (arrive: store `epoch + 1` into each peer's slot;
//! wait: load one's own), drive GIN through the library's proxy as device code does (descriptors
//! posted into its queues, data, signals and counters checked), and get the refusals of what is
//! not served (GIN of 2.28 and 2.29 clients, multimem, 2.28 clients whose release nothing
//! names) by code and message; clients of 2.28.3 (`MSCCLPP_NCCL_VERSION`) and 2.28.9 (its
//! `ncclConfig_t`) get their own layouts, nothing read or written past their structs. Runs with `cargo test -p mscclpp-nccl --test devapi`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{Comm, fresh_dir, lib_path, open_lib, publish, read_id, run_if_rank, run_ranks};

const ROLE_VAR: &str = "MSCCLPP_NCCL_DEVAPI_TEST_RANK";
const HOSTS_ROLE_VAR: &str = "MSCCLPP_NCCL_DEVAPI_HOSTS_TEST_RANK";
const V228_ROLE_VAR: &str = "MSCCLPP_NCCL_DEVAPI_228_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_DEVAPI_TEST_DIR";
const NRANKS: usize = 2;
const SYMMETRIC: c_int = 1;
const MAGIC: u32 = 0xcafe_beef;
const NCCL_INVALID_ARGUMENT: c_int = 4;
const NCCL_INVALID_USAGE: c_int = 5;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
struct Team {
    n_ranks: c_int,
    rank: c_int,
    stride: c_int,
}

fn rd32(p: u64, at: usize) -> u32 {
    // SAFETY: `p` is memory of this process (host backend) that the callers name: a window
    // record, a device communicator or a window table of the library, each longer than `at + 4`.
    unsafe { ((p as usize + at) as *const u32).read_unaligned() }
}

fn rd64(p: u64, at: usize) -> u64 {
    // SAFETY: as for `rd32`.
    unsafe { ((p as usize + at) as *const u64).read_unaligned() }
}

/// Requirements of NCCL `version`'s layout (its `size`), with `lsa` LSA barriers.
fn requirements(version: u32, lsa: i32) -> Vec<u8> {
    let size: usize = match version {
        22902..=22903 => 72,
        22905..=22907 => 88,
        23000..=23099 => 96,
        23100..=23205 => 120,
        _ => 136,
    };
    let mut r = vec![0u8; size];
    r[0..8].copy_from_slice(&(size as u64).to_le_bytes());
    r[8..12].copy_from_slice(&MAGIC.to_le_bytes());
    r[12..16].copy_from_slice(&version.to_le_bytes());
    r[40..44].copy_from_slice(&lsa.to_le_bytes());
    // ginContextCount's default (4) is left as the initializer sets it: it asks for nothing.
    r[60..64].copy_from_slice(&4i32.to_le_bytes());
    if size > 84 {
        r[84..88].copy_from_slice(&i32::MIN.to_le_bytes());
    }
    r
}

fn set32(r: &mut [u8], at: usize, v: i32) {
    r[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

type WinRegFn = unsafe extern "C" fn(Comm, *mut c_void, usize, *mut *mut c_void, c_int) -> c_int;
type PtrFn = unsafe extern "C" fn(*mut c_void, usize, c_int, *mut *mut c_void) -> c_int;
type InitConfigFn =
    unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int, *const NcclConfig) -> c_int;

/// The library's exports these checks call, loaded once per process (`_lib` keeps it loaded).
struct Api {
    _lib: libloading::Library,
    get_id: unsafe extern "C" fn(*mut NcclUniqueId) -> c_int,
    init: unsafe extern "C" fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int,
    init_config: InitConfigFn,
    init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> c_int,
    destroy: unsafe extern "C" fn(Comm) -> c_int,
    last_err: unsafe extern "C" fn(Comm) -> *const c_char,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    mem_alloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> c_int,
    mem_free: unsafe extern "C" fn(*mut c_void) -> c_int,
    win_reg: WinRegFn,
    win_dereg: unsafe extern "C" fn(Comm, *mut c_void) -> c_int,
    lsa_ptr: PtrFn,
    peer_ptr: PtrFn,
    team_lsa: unsafe extern "C" fn(Comm) -> Team,
    team_rail: unsafe extern "C" fn(Comm) -> Team,
    barrier_req: unsafe extern "C" fn(Team, c_int, *mut c_void, *mut c_void) -> c_int,
    dev_create: unsafe extern "C" fn(Comm, *const c_void, *mut c_void) -> c_int,
    dev_destroy: unsafe extern "C" fn(Comm, *const c_void) -> c_int,
    all_reduce: support::CollFn,
}

impl Api {
    fn load() -> Result<Api, String> {
        let lib = open_lib()?;
        Ok(Api {
            get_id: sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int),
            init: sym!(
                lib,
                "ncclCommInitRank",
                fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
            ),
            init_config: sym!(lib, "ncclCommInitRankConfig" as InitConfigFn),
            init_all: sym!(
                lib,
                "ncclCommInitAll",
                fn(*mut Comm, c_int, *const c_int) -> c_int
            ),
            destroy: sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int),
            last_err: sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char),
            group_start: sym!(lib, "ncclGroupStart", fn() -> c_int),
            group_end: sym!(lib, "ncclGroupEnd", fn() -> c_int),
            mem_alloc: sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int),
            mem_free: sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int),
            win_reg: sym!(lib, "ncclCommWindowRegister" as WinRegFn),
            win_dereg: sym!(
                lib,
                "ncclCommWindowDeregister",
                fn(Comm, *mut c_void) -> c_int
            ),
            lsa_ptr: sym!(lib, "ncclGetLsaDevicePointer" as PtrFn),
            peer_ptr: sym!(lib, "ncclGetPeerDevicePointer" as PtrFn),
            team_lsa: sym!(lib, "ncclTeamLsa", fn(Comm) -> Team),
            team_rail: sym!(lib, "ncclTeamRail", fn(Comm) -> Team),
            barrier_req: sym!(
                lib,
                "ncclLsaBarrierCreateRequirement",
                fn(Team, c_int, *mut c_void, *mut c_void) -> c_int
            ),
            dev_create: sym!(
                lib,
                "ncclDevCommCreate",
                fn(Comm, *const c_void, *mut c_void) -> c_int
            ),
            dev_destroy: sym!(lib, "ncclDevCommDestroy", fn(Comm, *const c_void) -> c_int),
            all_reduce: sym!(lib, "ncclAllReduce" as support::CollFn),
            _lib: lib,
        })
    }

    /// `ncclGetLastError`'s text.
    fn message(&self) -> String {
        // SAFETY: the library's thread-local NUL-terminated message.
        unsafe { CStr::from_ptr((self.last_err)(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    }

    /// `Ok` for `ncclSuccess`, else the code and the message.
    fn check(&self, what: &str, got: c_int) -> Result<(), String> {
        if got == 0 {
            Ok(())
        } else {
            Err(format!("{what}: code {got}: {}", self.message()))
        }
    }

    /// Rank `rank` of `n` joins the communicator whose id rank 0 publishes in `dir`.
    fn join(&self, rank: usize, n: usize, dir: &Path) -> Result<Comm, String> {
        self.join_with(rank, n, dir, None)
    }

    /// [`Api::join`] through `ncclCommInitRankConfig` where `config` is given.
    fn join_with(
        &self,
        rank: usize,
        n: usize,
        dir: &Path,
        config: Option<&NcclConfig>,
    ) -> Result<Comm, String> {
        let id = if rank == 0 {
            let mut id = NcclUniqueId { internal: [0; 128] };
            // SAFETY: a valid out-pointer.
            self.check("ncclGetUniqueId", unsafe { (self.get_id)(&mut id) })?;
            publish(dir, &id.internal)?;
            id
        } else {
            read_id(dir)?
        };
        let mut comm: Comm = std::ptr::null_mut();
        match config {
            // SAFETY: valid out-pointer and id.
            None => self.check("ncclCommInitRank", unsafe {
                (self.init)(&mut comm, n as c_int, id, rank as c_int)
            })?,
            // SAFETY: valid out-pointer, id and config.
            Some(c) => self.check("ncclCommInitRankConfig", unsafe {
                (self.init_config)(&mut comm, n as c_int, id, rank as c_int, c)
            })?,
        }
        Ok(comm)
    }
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let api = Api::load()?;
    let Api {
        destroy,
        mem_alloc,
        mem_free,
        win_reg,
        win_dereg,
        lsa_ptr,
        peer_ptr,
        team_lsa,
        barrier_req,
        dev_create,
        dev_destroy,
        all_reduce,
        ..
    } = api;
    let message = || api.message();
    let check = |what: &str, got: c_int| api.check(what, got);
    let refused = |what: &str, got: c_int, code: c_int, words: &str| -> Result<(), String> {
        let m = message();
        if got == code && m.contains(words) {
            Ok(())
        } else {
            Err(format!(
                "{what}: code {got} ({m}); expected {code} naming '{words}'"
            ))
        }
    };

    let comm = api.join(rank, NRANKS, dir)?;
    // A barrier between the ranks: a one-element all-reduce (the host backend returns when done).
    let sync = || -> Result<(), String> {
        let mut x = [1.0f32];
        let p = x.as_mut_ptr().cast::<c_void>();
        // SAFETY: one float in place; the call has run when it returns (host backend).
        check("barrier", unsafe {
            all_reduce(p, p, 1, 7, 0, comm, std::ptr::null_mut())
        })
    };

    // SAFETY: every call below gets valid pointers of this function or the library's handles.
    unsafe {
        let lsa = team_lsa(comm);
        if lsa
            != (Team {
                n_ranks: 2,
                rank: rank as c_int,
                stride: 1,
            })
        {
            return Err(format!("ncclTeamLsa: {lsa:?}"));
        }

        // Windows of different sizes per rank, each rank's data its own.
        let bytes = (1 + rank) << 20;
        let mut p: *mut c_void = std::ptr::null_mut();
        check("ncclMemAlloc", mem_alloc(&mut p, bytes))?;
        let data =
            |r: usize, i: usize| (i as u32).wrapping_mul(2654435761) ^ (r as u32 * 0x01010101 + 7);
        let words = std::slice::from_raw_parts_mut(p.cast::<u32>(), bytes / 4);
        for (i, w) in words.iter_mut().enumerate() {
            *w = data(rank, i);
        }
        let mut win: *mut c_void = std::ptr::null_mut();
        check(
            "ncclCommWindowRegister (symmetric)",
            win_reg(comm, p, bytes, &mut win, SYMMETRIC),
        )?;
        let rec = win as u64;
        let (flat, lsa_rank, world, stride4g) =
            (rd64(rec, 8), rd32(rec, 16), rd32(rec, 20), rd32(rec, 24));
        if (lsa_rank, world) != (rank as u32, rank as u32) || stride4g == 0 {
            return Err(format!(
                "window record: lsaRank {lsa_rank} worldRank {world} stride4G {stride4g}"
            ));
        }
        let copy = |r: usize| flat + ((r as u64 * stride4g as u64) << 32);
        if copy(rank) != p as u64
            && std::slice::from_raw_parts(copy(rank) as *const u32, 4) != &words[..4]
        {
            return Err("this rank's copy in the flat range is not its memory".into());
        }
        let peer = 1 - rank;
        let peer_words = (1 + peer) << 18;
        let theirs = std::slice::from_raw_parts(copy(peer) as *const u32, peer_words);
        let bad = (0..peer_words)
            .filter(|&i| theirs[i] != data(peer, i))
            .count();
        if bad != 0 {
            return Err(format!(
                "reading rank {peer}'s window through the flat range: {bad} words wrong"
            ));
        }
        let mut q: *mut c_void = std::ptr::null_mut();
        check(
            "ncclGetLsaDevicePointer",
            lsa_ptr(win, 64, peer as c_int, &mut q),
        )?;
        if q as u64 != copy(peer) + 64 {
            return Err(format!(
                "ncclGetLsaDevicePointer: {q:p}, not {:#x}",
                copy(peer) + 64
            ));
        }
        check(
            "ncclGetPeerDevicePointer",
            peer_ptr(win, 128, peer as c_int, &mut q),
        )?;
        if q as u64 != copy(peer) + 128 {
            return Err(format!("ncclGetPeerDevicePointer: {q:p}"));
        }
        refused(
            "ncclGetLsaDevicePointer past the window",
            lsa_ptr(win, bytes << 1, 0, &mut q),
            NCCL_INVALID_ARGUMENT,
            "past the window",
        )?;
        // A write into the peer's window lands in its memory.
        (copy(peer) as *mut u32)
            .add(10)
            .write_volatile(0xabcd_0000 + rank as u32);
        sync()?;
        if words[10] != 0xabcd_0000 + peer as u32 {
            return Err(format!(
                "rank {peer}'s store did not land: {:#x}",
                words[10]
            ));
        }

        // Device communicators at each client layout: (version, rank offset, table, resource
        // window, inlined lsaFlatBase, lsaBarrier).
        let layouts: [(u32, usize, usize, usize, usize, usize); 4] = [
            (22902, 0, 24, 32, 48, 120),
            (22907, 0, 24, 32, 48, 120),
            (23007, 8, 32, 40, 56, 128),
            (23206, 8, 32, 40, 48, 80),
        ];
        for (version, at_rank, at_table, at_res, at_flat, at_barrier) in layouts {
            let nb = 5;
            let mut reqs = requirements(version, nb);
            // One resource of the client's own: 1000 bytes aligned to 256.
            let mut handle = [0u32; 2];
            let mut node = [0u8; 56];
            node[8..16].copy_from_slice(&1000u64.to_le_bytes());
            node[16..24].copy_from_slice(&256u64.to_le_bytes());
            node[24..32].copy_from_slice(&(handle.as_mut_ptr() as u64).to_le_bytes());
            reqs[16..24].copy_from_slice(&(node.as_ptr() as u64).to_le_bytes());
            let mut dc = vec![0xeeu8; 256];
            check(
                &format!("ncclDevCommCreate ({version})"),
                dev_create(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast()),
            )?;
            let d = dc.as_ptr() as u64;
            if at_rank == 8 && (rd32(d, 0), rd32(d, 4)) != (MAGIC, version) {
                return Err(format!(
                    "{version}: magic/version {:#x} {}",
                    rd32(d, 0),
                    rd32(d, 4)
                ));
            }
            let fields = [
                rd32(d, at_rank),
                rd32(d, at_rank + 4),
                rd32(d, at_rank + 12),
                rd32(d, at_rank + 16),
            ];
            if fields != [rank as u32, 2, rank as u32, 2] {
                return Err(format!(
                    "{version}: rank, nRanks, lsaRank, lsaSize {fields:?}"
                ));
            }
            let (table, res, inl) = (rd64(d, at_table), rd64(d, at_res), rd64(d, at_flat));
            let (bh, nbar) = (rd32(d, at_barrier), rd32(d, at_barrier + 4));
            if res == 0 || table == 0 || nbar != nb as u32 || inl != rd64(res, 8) {
                return Err(format!(
                    "{version}: table {table:#x} resource {res:#x} inlined {inl:#x} barrier ({bh}, {nbar})"
                ));
            }
            // The window table lists the user window and the resource window.
            let entries: Vec<(u64, u64, u64)> = (0..32)
                .map(|i| {
                    (
                        rd64(table, i * 24),
                        rd64(table, i * 24 + 8),
                        rd64(table, i * 24 + 16),
                    )
                })
                .filter(|e| e.2 != 0)
                .collect();
            if !entries.contains(&(p as u64, bytes as u64, rec))
                || !entries.iter().any(|e| e.2 == res)
            {
                return Err(format!("{version}: window table {entries:?}"));
            }
            // The barrier's region first, the client's resource after it at 256 bytes.
            let barrier_bytes = (3 + 2) * 4 * nb as usize;
            let want_user = (barrier_bytes.next_multiple_of(256) / 128) as u32;
            if bh != 0 || handle[0] != want_user {
                return Err(format!(
                    "{version}: barrier handle {bh}, client's handle {} (want {want_user})",
                    handle[0]
                ));
            }
            // The LSA barrier's protocol over the resource buffer, as ncclLsaBarrierSession runs
            // it: arrive stores epoch + 1 into every peer's slot `3nB + index*N + me`; wait
            // loads one's own slot `3nB + index*N + peer`.
            let rstride = rd32(res, 24) as u64;
            let slot = |owner: usize, index: usize, from: usize| -> &AtomicU32 {
                let base = rd64(res, 8) + ((owner as u64 * rstride) << 32) + bh as u64 * 128;
                let w = 3 * nb as usize + index * NRANKS + from;
                &*((base as usize + 4 * w) as *const AtomicU32)
            };
            for epoch in 0..3u32 {
                for index in 0..nb as usize {
                    slot(peer, index, rank).store(epoch + 1, Ordering::Release);
                }
                let deadline = Instant::now() + Duration::from_secs(20);
                for index in 0..nb as usize {
                    // Wrap-safe "at least", as the headers compare: a fast peer may be an
                    // epoch ahead already.
                    while slot(rank, index, peer)
                        .load(Ordering::Acquire)
                        .wrapping_sub(epoch + 1)
                        > 0x7fff_ffff
                    {
                        if Instant::now() > deadline {
                            return Err(format!(
                                "{version}: barrier {index} epoch {epoch}: rank {peer} never arrived"
                            ));
                        }
                        std::hint::spin_loop();
                    }
                }
            }
            sync()?;
            check("ncclDevCommDestroy", dev_destroy(comm, dc.as_ptr().cast()))?;
            refused(
                "ncclDevCommDestroy twice",
                dev_destroy(comm, dc.as_ptr().cast()),
                NCCL_INVALID_ARGUMENT,
                "destroyed already",
            )?;
        }

        // ncclLsaBarrierCreateRequirement's sizes, placed by ncclDevCommCreate.
        let mut h = [0u32; 2];
        let mut node = [0u8; 56];
        check(
            "ncclLsaBarrierCreateRequirement",
            barrier_req(lsa, 3, h.as_mut_ptr().cast(), node.as_mut_ptr().cast()),
        )?;
        let size = u64::from_le_bytes(node[8..16].try_into().unwrap_or_default());
        if size != (3 * 3 + 3 * 2) * 4 || h[1] != 3 {
            return Err(format!(
                "ncclLsaBarrierCreateRequirement: {size} bytes, {} barriers",
                h[1]
            ));
        }

        // What is not served is refused, naming it, on every rank alike.
        let mut dc = vec![0u8; 256];
        gin_through_the_proxy(&api, comm, rank, p as u64, rec, &sync)?;
        let mut mm = requirements(23206, 1);
        mm[32] = 1;
        refused(
            "lsaMultimem",
            dev_create(comm, mm.as_ptr().cast(), dc.as_mut_ptr().cast()),
            NCCL_INVALID_USAGE,
            "multicast",
        )?;
        let mut old = requirements(23206, 1);
        old[8..12].copy_from_slice(&0u32.to_le_bytes());
        refused(
            "2.28 requirements",
            dev_create(comm, old.as_ptr().cast(), dc.as_mut_ptr().cast()),
            NCCL_INVALID_USAGE,
            "NCCL 2.28",
        )?;
        let newer = requirements(23301, 1);
        refused(
            "newer client",
            dev_create(comm, newer.as_ptr().cast(), dc.as_mut_ptr().cast()),
            NCCL_INVALID_USAGE,
            "newer",
        )?;

        // A symmetric window of memory that is not ncclMemAlloc's fails on every rank.
        let mut plain = vec![0u8; 8192];
        let mut w2: *mut c_void = std::ptr::null_mut();
        refused(
            "a symmetric window of malloc memory",
            win_reg(
                comm,
                plain.as_mut_ptr().cast(),
                plain.len(),
                &mut w2,
                SYMMETRIC,
            ),
            NCCL_INVALID_ARGUMENT,
            "ncclMemAlloc",
        )?;

        // The collectives on the symmetric window (registered with them through the symmetric
        // mappings): an in-place all-reduce of its first MiB against a CPU reference.
        let n = (1 << 20) / 4;
        let floats = std::slice::from_raw_parts_mut(p.cast::<f32>(), n);
        let v = |r: usize, i: usize| ((i * 7 + r * 3) % 31) as f32 - 15.0;
        for (i, f) in floats.iter_mut().enumerate() {
            *f = v(rank, i);
        }
        check(
            "ncclAllReduce on the symmetric window",
            all_reduce(p, p, n, 7, 0, comm, std::ptr::null_mut()),
        )?;
        let bad = (0..n).filter(|&i| floats[i] != v(0, i) + v(1, i)).count();
        if bad != 0 {
            return Err(format!(
                "all-reduce on the symmetric window: {bad} of {n} wrong"
            ));
        }
        check("ncclCommWindowDeregister", win_dereg(comm, win))?;
        check("ncclMemFree", mem_free(p))?;
        check("ncclCommDestroy", destroy(comm))?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// One GIN context's queues and `cis` as device code reaches them (host backend: this
/// process's memory), read from its per-context struct at `ctx`.
struct Queues {
    queues: u64,
    queue: u64,
    cis: u64,
}

impl Queues {
    fn of(ctx: u64) -> Queues {
        Queues {
            queues: rd64(ctx, 8),
            queue: rd32(ctx, 4) as u64,
            cis: rd64(ctx, 24),
        }
    }

    /// Writes the first `count` qwords of `words` into slot `index` of the queue to `to`, last
    /// first, as `postGfd` does (the first qword's flag bit tells the proxy it is whole).
    fn post(&self, to: usize, index: u64, words: &[u64; 16], count: usize) {
        let slot = self.queues + ((to as u64 * self.queue + index) * 128);
        for i in (0..count).rev() {
            // SAFETY: slot `index` of queue `to` of this context, host memory of the library.
            unsafe { AtomicU64::from_ptr((slot + 8 * i as u64) as *mut u64) }
                .store(words[i], Ordering::Release);
        }
    }

    /// Descriptors the proxy finished on the queue to `q`.
    fn ci(&self, q: usize) -> u32 {
        // SAFETY: `cis[q]` of this context, host memory of the library.
        unsafe { AtomicU32::from_ptr((self.cis + 4 * q as u64) as *mut u32) }
            .load(Ordering::Acquire)
    }
}

/// A GIN descriptor as NCCL's device code writes it (2.30.7+ bit layout): every qword's bit 0
/// set; `version` 3 fills the first 8 qwords only. (op, size, (srcOff, srcHandle) or the inline
/// value, (dstOff, dstHandle), counter, signal, signal value.)
#[allow(clippy::too_many_arguments)]
fn gfd(
    version: u64,
    op: u64,
    size: u64,
    src: (u64, u64),
    inline: Option<u64>,
    dst: (u64, u64),
    counter: u64,
    signal: u64,
    value: u64,
) -> [u64; 16] {
    let mut q = [1u64; 16];
    q[0] = 1 | version << 1 | size << 7;
    match inline {
        Some(v) => {
            q[1] = 1 | (v & 0xffff_ffff) << 8 | ((v >> 32) & 0xffff) << 40;
            q[2] = 1 | (v >> 48) << 8;
        }
        None => {
            q[1] = 1 | src.0 << 1;
            q[2] = 1 | src.1 << 1;
        }
    }
    q[3] = 1 | dst.0 << 1;
    q[4] = 1 | dst.1 << 1;
    q[5] = 1 | counter << 1 | signal << 24 | (value & 0xffff) << 48;
    q[6] = 1 | ((value >> 16) & 0xffff) << 8 | (value >> 32) << 24;
    q[7] = 1 | op << 8;
    q
}

/// GIN through this library's proxy, with this test in the device's place (host backend: the
/// device communicator's pointers are this process's memory): a device communicator of 2.32.6
/// with GIN signals, counters and hybrid barriers; descriptors posted into the queues as
/// `postGfd` writes them (a put with a signal add and a counter, an inline put with a signal
/// increment, a flush); the data, signals, counters and `cis` checked against what was sent,
/// destinations poisoned first; then a descriptor naming no memory raises the abort flag
/// instead of hanging; then what GIN does not serve is refused, naming it.
fn gin_through_the_proxy(
    api: &Api,
    comm: Comm,
    rank: usize,
    win_base: u64,
    rec: u64,
    sync: &dyn Fn() -> Result<(), String>,
) -> Result<(), String> {
    let check = |what: &str, got: c_int| api.check(what, got);
    let peer = 1 - rank;
    let (dev_create, dev_destroy) = (api.dev_create, api.dev_destroy);
    let mut reqs = requirements(23206, 0);
    set32(&mut reqs, 36, 2); // barrierCount: hybrid barriers
    set32(&mut reqs, 64, 4); // ginSignalCount
    set32(&mut reqs, 68, 2); // ginCounterCount
    set32(&mut reqs, 72, 1); // ginConnectionType FULL
    reqs[92] = 1; // ginStrongSignalsRequired
    let mut dc = vec![0u8; 256];
    // Poison where the peer's puts land: 4 KiB at 512 KiB + 64 KiB * peer, 8 bytes at 600 KiB.
    let land = 512 * 1024 + 65536 * peer;
    // SAFETY: this rank's window (at least 1 MiB), written before the peer may put into it.
    unsafe {
        std::ptr::write_bytes((win_base as usize + land) as *mut u8, 0xa5, 4096);
        std::ptr::write_bytes((win_base as usize + 600 * 1024) as *mut u8, 0xa5, 8);
    }
    sync()?;
    // SAFETY: valid requirements and out-struct.
    check("ncclDevCommCreate (GIN)", unsafe {
        dev_create(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast())
    })?;
    let d = dc.as_ptr() as u64;
    let u8at = |at: usize| dc[at];
    let (contexts, signals, counters) = (rd32(d, 152), rd32(d, 136), rd32(d, 140));
    // 4 of the user's, 2 hybrid dense barriers of 2 slots, 2 hybrid rail barriers of 2.
    if (u8at(96), u8at(98), contexts, signals, counters) != (1, 2, 4, 12, 2)
        || (rd32(d, 156), rd32(d, 160), u8at(164)) != (1, 1, 1)
        || rd64(d, 104) == 0
        || rd64(d, 144) == 0
        || rd64(d, 168) == 0
        || rd32(d, 180) != 2
        || rd32(d, 64) != 4
        || rd32(d, 184) != 8
    {
        return Err(format!(
            "GIN devcomm: connections {} type {} contexts {contexts} signals {signals} counters {counters} strides {} {} strong {} hybrid LSA {} dense {} rail {}",
            u8at(96),
            u8at(98),
            rd32(d, 156),
            rd32(d, 160),
            u8at(164),
            rd32(d, 180),
            rd32(d, 64),
            rd32(d, 184)
        ));
    }
    // The window's GIN handle (ginWins[0..4]), one segment.
    let handle = rd64(rec, 40);
    if handle == 0 || handle >= 1 << 63 || rd64(rec, 64) != handle || rd32(rec, 80) != 1 {
        return Err(format!(
            "window record: ginWins {handle:#x} .. {:#x}, numSegments {}",
            rd64(rec, 64),
            rd32(rec, 80)
        ));
    }
    // Context 1 (structs of 80 bytes in 2.32.6).
    let ctx = rd64(d, 104) + 80;
    let (nranks, queue) = (rd32(ctx, 0) as u64, rd32(ctx, 4) as u64);
    let (queues, cis, ctr, sig) = (rd64(ctx, 8), rd64(ctx, 24), rd64(ctx, 32), rd64(ctx, 40));
    if nranks != 2 || !queue.is_power_of_two() || queues == 0 || sig == 0 || cis == 0 {
        return Err(format!("context 1: nranks {nranks} queue {queue}"));
    }
    let qs = Queues::of(ctx);
    let post = |to, index, words: &[u64; 16], count| qs.post(to, index, words, count);
    let src_off = 256 * 1024u64;
    let value = 0x1122_3344_5566_7788u64 ^ rank as u64;
    // A put of 4 KiB with SignalAdd(1, 5 + rank) and counter 1 (version 3: 8 qwords).
    post(
        peer,
        0,
        &gfd(
            3,
            0x01 | 0x10 | 0x04,
            4096,
            (src_off, handle),
            None,
            ((512 * 1024 + 65536 * rank) as u64, handle),
            1,
            1,
            5 + rank as u64,
        ),
        8,
    );
    // An inline put of 8 bytes with SignalInc(0) (version 2: 16 qwords).
    post(
        peer,
        1,
        &gfd(
            2,
            0x01 | 0x02 | 0x08,
            8,
            (0, 0),
            Some(value),
            (600 * 1024, handle),
            0,
            0,
            0,
        ),
        16,
    );
    // A flush on this rank's own queue.
    post(rank, 0, &gfd(3, 0x80, 0, (0, 0), None, (0, 0), 0, 0, 0), 8);
    let ci = |q| qs.ci(q);
    let deadline = Instant::now() + Duration::from_secs(30);
    while ci(peer) < 2 || ci(rank) < 1 {
        if Instant::now() > deadline {
            return Err(format!(
                "the proxy finished {} of 2 descriptors to rank {peer} and {} of 1 to itself in 30 s",
                ci(peer),
                ci(rank)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The slots are zeroed for the device's next lap; counter 1 counts the put.
    let slot0 = queues + peer as u64 * queue * 128;
    if (0..16).any(|i| rd64(slot0, 8 * i) != 0) || rd64(ctr, 8) != 1 || rd64(ctr, 0) != 0 {
        return Err(format!(
            "after the proxy: slot not zeroed or counters {} {}",
            rd64(ctr, 0),
            rd64(ctr, 8)
        ));
    }
    sync()?;
    // What the peer sent landed here: its signals on context 1, its data, its inline value.
    let (s0, s1) = (rd64(sig, 0), rd64(sig, 8));
    if (s0, s1) != (1, 5 + peer as u64) {
        return Err(format!(
            "signals of context 1: {s0}, {s1} (want 1, {})",
            5 + peer
        ));
    }
    let data =
        |r: usize, i: usize| (i as u32).wrapping_mul(2654435761) ^ (r as u32 * 0x01010101 + 7);
    let first = src_off as usize / 4;
    let bad = (0..1024)
        .filter(|&i| rd32(win_base, land + 4 * i) != data(peer, first + i))
        .count();
    let inline = rd64(win_base, 600 * 1024);
    if bad != 0 || inline != 0x1122_3344_5566_7788 ^ peer as u64 {
        return Err(format!(
            "rank {peer}'s put: {bad} of 1024 words wrong; inline {inline:#x}"
        ));
    }
    // A descriptor naming no memory: the proxy raises the abort flag and stops, no hang.
    let abort = rd64(d, 168);
    post(
        peer,
        2,
        &gfd(3, 0x01, 64, (0, 0x7777), None, (0, handle), 0, 0, 0),
        8,
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while rd32(abort, 0) == 0 {
        if Instant::now() > deadline {
            return Err("a put naming GIN handle 0x7777: no abort flag in 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sync()?;
    // SAFETY: the device communicator made above.
    check("ncclDevCommDestroy (GIN)", unsafe {
        dev_destroy(comm, dc.as_ptr().cast())
    })?;

    // What GIN does not serve, refused naming it.
    let refused = |what: &str, reqs: &[u8], code: c_int, words: &str| -> Result<(), String> {
        let mut dc = vec![0u8; 256];
        // SAFETY: valid requirements and out-struct.
        let got = unsafe { dev_create(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast()) };
        let m = api.message();
        if got == code && m.contains(words) {
            Ok(())
        } else {
            Err(format!(
                "{what}: code {got} ({m}); expected {code} naming '{words}'"
            ))
        }
    };
    let mut old = requirements(22907, 0);
    set32(&mut old, 64, 2);
    set32(&mut old, 72, 1);
    refused("GIN of a 2.29.7 client", &old, NCCL_INVALID_USAGE, "2.30.3")?;
    let mut none = requirements(23206, 0);
    set32(&mut none, 64, 2);
    refused(
        "GIN signals without a connection",
        &none,
        NCCL_INVALID_ARGUMENT,
        "NCCL_GIN_CONNECTION_NONE",
    )?;
    let mut bad = requirements(23206, 0);
    set32(&mut bad, 72, 9);
    refused(
        "ginConnectionType 9",
        &bad,
        NCCL_INVALID_ARGUMENT,
        "none of NCCL's",
    )?;
    // RAIL connections with 129 contexts, as DeepEP asks on one host: served as FULL (a
    // superset of the rail's peers), the context count a hint met with 32.
    let mut rail = requirements(23206, 0);
    set32(&mut rail, 72, 2);
    set32(&mut rail, 60, 129);
    let mut dc = vec![0u8; 256];
    // SAFETY: valid requirements and out-struct.
    check("ncclDevCommCreate (RAIL, 129 contexts)", unsafe {
        dev_create(comm, rail.as_ptr().cast(), dc.as_mut_ptr().cast())
    })?;
    let contexts = rd32(dc.as_ptr() as u64, 152);
    if contexts != 32 {
        return Err(format!(
            "129 GIN contexts asked: ginContextCount {contexts}"
        ));
    }
    // SAFETY: the device communicator made above.
    check("ncclDevCommDestroy (RAIL)", unsafe {
        dev_destroy(comm, dc.as_ptr().cast())
    })?;
    Ok(())
}

/// Four ranks on two simulated hosts (`MSCCLPP_HOSTID`): LSA teams of the two ranks of each
/// host; a symmetric window maps the host's pair only; the rail team crosses the hosts; a
/// device communicator says lsaSize 2 of 4 ranks; a peer on the other host has no device
/// pointer (refused naming the team); GIN reaches it ([`gin_between_hosts`]).
fn hosts_rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let api = Api::load()?;
    let Api {
        destroy,
        last_err,
        mem_alloc,
        mem_free,
        win_reg,
        win_dereg,
        peer_ptr,
        team_lsa,
        team_rail,
        dev_create,
        dev_destroy,
        ..
    } = api;
    let check = |what: &str, got: c_int| api.check(what, got);
    let comm = api.join(rank, 4, dir)?;
    // SAFETY: every call gets valid pointers of this function or the library's handles.
    unsafe {
        let (lsa, rail) = (team_lsa(comm), team_rail(comm));
        let want_lsa = Team {
            n_ranks: 2,
            rank: (rank % 2) as c_int,
            stride: 1,
        };
        let want_rail = Team {
            n_ranks: 2,
            rank: (rank / 2) as c_int,
            stride: 2,
        };
        if (lsa, rail) != (want_lsa, want_rail) {
            return Err(format!("teams: LSA {lsa:?}, rail {rail:?}"));
        }
        let bytes = 1 << 16;
        let mut p: *mut c_void = std::ptr::null_mut();
        check("ncclMemAlloc", mem_alloc(&mut p, bytes))?;
        std::slice::from_raw_parts_mut(p.cast::<u32>(), 4).fill(100 + rank as u32);
        // GIN's sources (4 KiB at 4 KiB) and what lands (poisoned; the VA signal's word 0).
        let words = std::slice::from_raw_parts_mut(p.cast::<u32>(), bytes / 4);
        for (i, w) in words.iter_mut().enumerate().skip(1024).take(1024) {
            *w = gin_data(rank, i);
        }
        words[2048..12288].fill(0xa5a5_a5a5);
        words[6144..6148].fill(0);
        // NCCL_WIN_STRICT_ORDERING alone, as DeepEP registers: ncclMemAlloc memory on every
        // rank gets a device window all the same.
        let mut win: *mut c_void = std::ptr::null_mut();
        check(
            "ncclCommWindowRegister (NCCL_WIN_STRICT_ORDERING)",
            win_reg(comm, p, bytes, &mut win, 2),
        )?;
        let mate = rank ^ 1;
        let mut q: *mut c_void = std::ptr::null_mut();
        check(
            "ncclGetPeerDevicePointer (same host)",
            peer_ptr(win, 0, mate as c_int, &mut q),
        )?;
        if q.cast::<u32>().read_volatile() != 100 + mate as u32 {
            return Err(format!(
                "rank {mate}'s window through the flat range holds {}",
                q.cast::<u32>().read()
            ));
        }
        let far = (rank + 2) % 4;
        let rc = peer_ptr(win, 0, far as c_int, &mut q);
        let m = CStr::from_ptr(last_err(std::ptr::null_mut()))
            .to_string_lossy()
            .into_owned();
        if rc != 4 || !m.contains("LSA team") {
            return Err(format!("a peer on the other host: code {rc} ({m})"));
        }
        let reqs = requirements(23206, 2);
        let mut dc = vec![0u8; 256];
        check(
            "ncclDevCommCreate",
            dev_create(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast()),
        )?;
        let d = dc.as_ptr() as u64;
        let f = [rd32(d, 8), rd32(d, 12), rd32(d, 20), rd32(d, 24)];
        if f != [rank as u32, 4, (rank % 2) as u32, 2] {
            return Err(format!("ncclDevComm rank, nRanks, lsaRank, lsaSize: {f:?}"));
        }
        check("ncclDevCommDestroy", dev_destroy(comm, dc.as_ptr().cast()))?;
        // GIN between the hosts, through the transport between them.
        let sync = || -> Result<(), String> {
            let mut x = [1.0f32];
            let q = x.as_mut_ptr().cast::<c_void>();
            // SAFETY: one float in place; the call has run when it returns (host backend).
            check(
                "barrier",
                (api.all_reduce)(q, q, 1, 7, 0, comm, std::ptr::null_mut()),
            )
        };
        gin_between_hosts(&api, comm, rank, p as u64, win as u64, &sync)?;
        check("ncclCommWindowDeregister", win_dereg(comm, win))?;
        check("ncclMemFree", mem_free(p))?;
        check("ncclCommDestroy", destroy(comm))?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// Word `i` of rank `r`'s GIN source.
fn gin_data(r: usize, i: usize) -> u32 {
    (i as u32).wrapping_mul(2654435761) ^ (r as u32 * 0x0101_0101 + 11)
}

/// GIN on four ranks of two simulated hosts, descriptors posted as device code posts them
/// (context 0): to the rank of the other host with the same LSA rank (`far`), a put of 1 KiB
/// with SignalAdd(1, 5 + rank) and counter 1, an inline put with SignalInc(0), a VA signal
/// adding 3 to a word of its window, and a get of 512 bytes of its window; to the rank of this
/// host (`mate`), a put of 256 bytes with SignalAdd(2, 1). Everything checked where it lands,
/// poisoned first: the transport between the hosts carries the data, the peer's proxy adds the
/// signals and answers the get. Then 2500 signals in laps of the queue and of the peer's inbox
/// ring (1024 records), each counted once.
fn gin_between_hosts(
    api: &Api,
    comm: Comm,
    rank: usize,
    win_base: u64,
    rec: u64,
    sync: &dyn Fn() -> Result<(), String>,
) -> Result<(), String> {
    let check = |what: &str, got: c_int| api.check(what, got);
    let (far, mate) = ((rank + 2) % 4, rank ^ 1);
    let mut reqs = requirements(23206, 0);
    set32(&mut reqs, 36, 1); // barrierCount: a hybrid barrier (its rail part crosses hosts)
    set32(&mut reqs, 64, 4); // ginSignalCount
    set32(&mut reqs, 68, 2); // ginCounterCount
    set32(&mut reqs, 72, 1); // ginConnectionType FULL
    let mut dc = vec![0u8; 256];
    sync()?;
    // SAFETY: valid requirements and out-struct.
    check("ncclDevCommCreate (GIN between hosts)", unsafe {
        (api.dev_create)(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast())
    })?;
    let d = dc.as_ptr() as u64;
    // 4 of the user's, a hybrid dense barrier of 4 ranks (4), its rail part of 2 ranks (2).
    let (contexts, signals, counters) = (rd32(d, 152), rd32(d, 136), rd32(d, 140));
    if (dc[96], dc[98], contexts, signals, counters) != (1, 2, 4, 10, 2) {
        return Err(format!(
            "GIN devcomm between hosts: connections {} type {} contexts {contexts} signals {signals} counters {counters}",
            dc[96], dc[98]
        ));
    }
    let handle = rd64(rec, 40);
    let ctx = rd64(d, 104);
    let (nranks, queue) = (rd32(ctx, 0) as u64, rd32(ctx, 4) as u64);
    let (ctr, sig) = (rd64(ctx, 32), rd64(ctx, 40));
    if nranks != 4 || !queue.is_power_of_two() {
        return Err(format!("context 0: nranks {nranks} queue {queue}"));
    }
    let qs = Queues::of(ctx);
    let post = |to, index, words: &[u64; 16]| qs.post(to, index, words, 8);
    let value = 0x0102_0304_0506_0708u64 ^ rank as u64;
    let g = |op, size, src, inline, dst, counter, signal, v| {
        gfd(3, op, size, src, inline, dst, counter, signal, v)
    };
    post(
        far,
        0,
        &g(
            0x01 | 0x10 | 0x04,
            1024,
            (4096, handle),
            None,
            (8192, handle),
            1,
            1,
            5 + rank as u64,
        ),
    );
    post(
        far,
        1,
        &g(
            0x01 | 0x02 | 0x08,
            8,
            (0, 0),
            Some(value),
            (16384, handle),
            0,
            0,
            0,
        ),
    );
    post(
        far,
        2,
        &g(0x20 | 0x10, 8, (24576, handle), None, (0, 0), 0, 0, 3),
    );
    post(
        far,
        3,
        &g(0x40, 512, (4096, handle), None, (32768, handle), 0, 0, 0),
    );
    post(
        mate,
        0,
        &g(
            0x01 | 0x10,
            256,
            (4096, handle),
            None,
            (40960, handle),
            0,
            2,
            1,
        ),
    );
    let ci = |q| qs.ci(q);
    let deadline = Instant::now() + Duration::from_secs(60);
    while ci(far) < 4 || ci(mate) < 1 {
        if Instant::now() > deadline {
            return Err(format!(
                "the proxy finished {} of 4 descriptors to rank {far} (another host) and {} of 1 to rank {mate} in 60 s",
                ci(far),
                ci(mate)
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    if rd64(ctr, 8) != 1 {
        return Err(format!(
            "counter 1: {} after the put between hosts",
            rd64(ctr, 8)
        ));
    }
    // The get has landed when its descriptor finished: rank `far`'s source words.
    let bad_get = (0..128)
        .filter(|&i| rd32(win_base, 32768 + 4 * i) != gin_data(far, 1024 + i))
        .count();
    if bad_get != 0 {
        return Err(format!(
            "a get of 512 bytes from rank {far}: {bad_get} of 128 words wrong"
        ));
    }
    sync()?;
    // What the peers sent: rank `far`'s put, inline value and VA signal, rank `mate`'s put.
    let bad_put = (0..256)
        .filter(|&i| rd32(win_base, 8192 + 4 * i) != gin_data(far, 1024 + i))
        .count();
    let bad_mate = (0..64)
        .filter(|&i| rd32(win_base, 40960 + 4 * i) != gin_data(mate, 1024 + i))
        .count();
    let (inline, va) = (rd64(win_base, 16384), rd64(win_base, 24576));
    if bad_put != 0 || bad_mate != 0 || inline != 0x0102_0304_0506_0708 ^ far as u64 || va != 3 {
        return Err(format!(
            "rank {far}'s put: {bad_put} of 256 words wrong; rank {mate}'s: {bad_mate} of 64; inline {inline:#x}; VA signal word {va}"
        ));
    }
    let got = (rd64(sig, 0), rd64(sig, 8), rd64(sig, 16));
    if got != (1, 5 + far as u64, 1) {
        return Err(format!(
            "signals of context 0: {got:?} (want 1 from rank {far}, {} from it, 1 from rank {mate})",
            5 + far
        ));
    }
    // Laps of the queue and of the peer's inbox: more signals than its ring holds, each
    // posted once the queue has room, as the device waits for it.
    let laps = 2500u64;
    for j in 0..laps {
        let at = 4 + j;
        let deadline = Instant::now() + Duration::from_secs(60);
        while at - u64::from(ci(far)) >= queue {
            if Instant::now() > deadline {
                return Err(format!(
                    "queue to rank {far}: no room after {} of {laps} signals",
                    j
                ));
            }
            std::hint::spin_loop();
        }
        post(
            far,
            at % queue,
            &g(0x20 | 0x08, 8, (24576 + 8, handle), None, (0, 0), 0, 0, 0),
        );
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while u64::from(ci(far)) < 4 + laps {
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {laps} signals finished in 60 s",
                u64::from(ci(far)) - 4
            ));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    sync()?;
    let count = rd64(win_base, 24576 + 8);
    if count != laps {
        return Err(format!(
            "{laps} VA SignalIncs from rank {far} added up to {count}"
        ));
    }
    // SAFETY: the device communicator made above.
    check("ncclDevCommDestroy (GIN between hosts)", unsafe {
        (api.dev_destroy)(comm, dc.as_ptr().cast())
    })
}

/// One thread driving two ranks (`ncclCommInitAll`, as a process of two GPUs does): symmetric
/// windows and device communicators made inside one group each, as nccl-tests' `-g 2` makes
/// them; the collective registrations run at `ncclGroupEnd`, not on the calling thread (where
/// the first rank's would wait for the second's forever).
#[allow(clippy::needless_range_loop)] // ranks index several arrays at once
fn one_thread_two_ranks() -> Result<(), String> {
    let api = Api::load()?;
    let Api {
        init_all,
        destroy,
        group_start,
        group_end,
        mem_alloc,
        mem_free,
        win_reg,
        win_dereg,
        dev_create,
        dev_destroy,
        ..
    } = api;
    let check = |what: &str, got: c_int| api.check(what, got);
    // SAFETY: every call gets valid pointers of this function or the library's handles; the
    // out-pointers given inside a group stay valid past its end.
    unsafe {
        let mut comms: [Comm; 2] = [std::ptr::null_mut(); 2];
        check(
            "ncclCommInitAll",
            init_all(comms.as_mut_ptr(), 2, std::ptr::null()),
        )?;
        // Two windows per rank registered in one group, as nccl-tests registers its send and
        // receive buffers: each communicator's registrations run in call order (their
        // collective exchanges must not interleave), so window k of every rank is window k.
        let mut bufs = [[std::ptr::null_mut::<c_void>(); 2]; 2];
        for r in 0..2 {
            for k in 0..2 {
                check("ncclMemAlloc", mem_alloc(&mut bufs[r][k], (1 + k) << 16))?;
                bufs[r][k]
                    .cast::<u32>()
                    .write(500 + 10 * k as u32 + r as u32);
            }
        }
        let mut wins = [[std::ptr::null_mut::<c_void>(); 2]; 2];
        check("ncclGroupStart", group_start())?;
        for r in 0..2 {
            for k in 0..2 {
                check(
                    "ncclCommWindowRegister in a group",
                    win_reg(
                        comms[r],
                        bufs[r][k],
                        (1 + k) << 16,
                        &mut wins[r][k],
                        SYMMETRIC,
                    ),
                )?;
            }
        }
        check("ncclGroupEnd (window registrations)", group_end())?;
        for r in 0..2 {
            for k in 0..2 {
                let rec = wins[r][k] as u64;
                let other = rd64(rec, 8) + (((1 - r) as u64 * rd32(rec, 24) as u64) << 32);
                let got = (other as *const u32).read_volatile();
                if got != 500 + 10 * k as u32 + (1 - r) as u32 {
                    return Err(format!(
                        "rank {r}'s window {k} shows {got} where rank {}'s window {k} is",
                        1 - r
                    ));
                }
            }
        }
        let reqs = requirements(23206, 2);
        let mut dcs = [[0u8; 256]; 2];
        check("ncclGroupStart", group_start())?;
        for r in 0..2 {
            check(
                "ncclDevCommCreate in a group",
                dev_create(comms[r], reqs.as_ptr().cast(), dcs[r].as_mut_ptr().cast()),
            )?;
        }
        check("ncclGroupEnd (device communicators)", group_end())?;
        for r in 0..2 {
            let d = dcs[r].as_ptr() as u64;
            if (rd32(d, 0), rd32(d, 8), rd32(d, 24)) != (MAGIC, r as u32, 2) {
                return Err(format!("rank {r}'s device communicator was not written"));
            }
            check(
                "ncclDevCommDestroy",
                dev_destroy(comms[r], dcs[r].as_ptr().cast()),
            )?;
        }
        check("ncclGroupStart", group_start())?;
        for r in 0..2 {
            for k in 0..2 {
                check(
                    "ncclCommWindowDeregister in a group",
                    win_dereg(comms[r], wins[r][k]),
                )?;
            }
        }
        check("ncclGroupEnd (deregistrations)", group_end())?;
        for r in 0..2 {
            for k in 0..2 {
                check("ncclMemFree", mem_free(bufs[r][k]))?;
            }
            check("ncclCommDestroy", destroy(comms[r]))?;
        }
    }
    Ok(())
}

/// A client of NCCL 2.28 (unversioned structures): 2.28.3 where `MSCCLPP_NCCL_VERSION` says so
/// (and `ncclGetVersion` reports it), else 2.28.9 learnt from the communicator's
/// `ncclConfig_t`. Past each struct of the client's size lies garbage the library must neither
/// read (it would ask for GIN or barriers) nor write.
fn v228_rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    const GARBAGE: u8 = 0x7f;
    const CANARY: u8 = 0xee;
    let declared = std::env::var("MSCCLPP_NCCL_VERSION").is_ok();
    let api = Api::load()?;
    let get_version = sym!(api._lib, "ncclGetVersion", fn(*mut c_int) -> c_int);
    let mut v: c_int = 0;
    // SAFETY: a valid out-pointer.
    api.check("ncclGetVersion", unsafe { get_version(&mut v) })?;
    let want = if declared { 22803 } else { 23206 };
    if v != want {
        return Err(format!("ncclGetVersion {v}, expected {want}"));
    }
    // The client's release comes from MSCCLPP_NCCL_VERSION, else from its config.
    let mut config = NcclConfig::INITIALIZER;
    config.version = 22809;
    let comm = api.join_with(rank, NRANKS, dir, (!declared).then_some(&config))?;
    // Another communicator of the process, made by a client of 2.32.6 (another library): the
    // first one's structs still follow its own config's release.
    let other = if declared {
        None
    } else {
        let second = dir.join("second");
        std::fs::create_dir_all(&second).map_err(|e| format!("{}: {e}", second.display()))?;
        let mut newer = NcclConfig::INITIALIZER;
        newer.version = 23206;
        Some(api.join_with(rank, NRANKS, &second, Some(&newer))?)
    };
    // SAFETY: the library's team of a live communicator.
    let lsa = unsafe { (api.team_lsa)(comm) };
    // ncclLsaBarrierCreateRequirement writes the client's size: 32 bytes at 2.28.3.
    let mut h = [0u32; 2];
    let mut node = [GARBAGE; 64];
    // SAFETY: valid handle and requirement buffers (64 bytes).
    api.check("ncclLsaBarrierCreateRequirement", unsafe {
        (api.barrier_req)(lsa, 2, h.as_mut_ptr().cast(), node.as_mut_ptr().cast())
    })?;
    let node_bytes = if declared { 32 } else { 56 };
    if node[node_bytes..].iter().any(|&b| b != GARBAGE)
        || node[32..node_bytes].iter().any(|&b| b != 0)
    {
        return Err(format!(
            "ncclLsaBarrierCreateRequirement wrote past {node_bytes} bytes or left its fields: {node:?}"
        ));
    }
    // The requirements: LSA barriers (and 2.28.9's barrierCount, folded into them), a resource
    // of the client's own in a node of the client's size, garbage after each struct.
    let (lsa_barriers, barriers) = (3i32, if declared { 0 } else { 2 });
    let mut reqs = [GARBAGE; 96];
    let mut res_handle = [0u32; 2];
    let mut own = [GARBAGE; 64];
    own[..node_bytes].fill(0);
    own[8..16].copy_from_slice(&1000u64.to_le_bytes());
    own[16..24].copy_from_slice(&256u64.to_le_bytes());
    own[24..32].copy_from_slice(&(res_handle.as_mut_ptr() as u64).to_le_bytes());
    let reqs_bytes = if declared { 24 } else { 56 };
    reqs[..reqs_bytes].fill(0);
    reqs[0..8].copy_from_slice(&(own.as_ptr() as u64).to_le_bytes());
    if declared {
        set32(&mut reqs, 20, lsa_barriers);
    } else {
        set32(&mut reqs, 20, barriers);
        set32(&mut reqs, 24, lsa_barriers);
        set32(&mut reqs, 44, 4);
    }
    let mut dc = [CANARY; 256];
    // SAFETY: the requirements and out-struct above, larger than the client's.
    api.check("ncclDevCommCreate (2.28)", unsafe {
        (api.dev_create)(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast())
    })?;
    let (size, at_multimem, at_barrier) = if declared {
        (88, 72, 80)
    } else {
        (200, 112, 120)
    };
    if dc[size..].iter().any(|&b| b != CANARY) {
        return Err(format!(
            "ncclDevCommCreate wrote past the {size} bytes of the client's ncclDevComm"
        ));
    }
    let d = dc.as_ptr() as u64;
    let (table, res, inl) = (rd64(d, 24), rd64(d, 32), rd64(d, 48));
    let fields = [rd32(d, 0), rd32(d, 4), rd32(d, 12), rd32(d, 16)];
    let barrier = (rd32(d, at_barrier), rd32(d, at_barrier + 4));
    let want_barriers = (lsa_barriers + barriers) as u32;
    if fields != [rank as u32, 2, rank as u32, 2]
        || table == 0
        || res == 0
        || inl != rd64(res, 8)
        || rd64(d, at_multimem) != 0
        || barrier != (0, want_barriers)
    {
        return Err(format!(
            "2.28 devcomm: fields {fields:?} table {table:#x} resource {res:#x} inlined {inl:#x} barrier {barrier:?}"
        ));
    }
    // The client's resource after the barriers, at 256 bytes.
    let want_user = (((3 + 2) * 4 * want_barriers as usize).next_multiple_of(256) / 128) as u32;
    if res_handle[0] != want_user {
        return Err(format!(
            "the client's resource handle {}, not {want_user}",
            res_handle[0]
        ));
    }
    // SAFETY: the device communicator written above.
    api.check("ncclDevCommDestroy (2.28)", unsafe {
        (api.dev_destroy)(comm, dc.as_ptr().cast())
    })?;
    if !declared {
        // Rail GIN barriers, which 2.28.7 to 2.28.9 declare, are GIN too: refused naming why.
        set32(&mut reqs, 28, 1);
        let mut dc = [CANARY; 256];
        // SAFETY: as above.
        let got = unsafe { (api.dev_create)(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast()) };
        let m = api.message();
        if got != NCCL_INVALID_USAGE || !m.contains("railGinBarrierCount") || !m.contains("2.30.3")
        {
            return Err(format!(
                "rail GIN barriers of a 2.28.9 client: code {got} ({m})"
            ));
        }
        set32(&mut reqs, 28, 0);
        // GIN is not served to 2.28 clients (their proxy descriptors have another format).
        set32(&mut reqs, 48, 1);
        let mut dc = [CANARY; 256];
        // SAFETY: as above.
        let got = unsafe { (api.dev_create)(comm, reqs.as_ptr().cast(), dc.as_mut_ptr().cast()) };
        let m = api.message();
        if got != NCCL_INVALID_USAGE || !m.contains("2.28.9") || !m.contains("2.30.3") {
            return Err(format!("GIN of a 2.28.9 client: code {got} ({m})"));
        }
    }
    for c in std::iter::once(comm).chain(other) {
        // SAFETY: the communicators made above.
        api.check("ncclCommDestroy", unsafe { (api.destroy)(c) })?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())
}

fn fail(e: &str) -> ! {
    eprintln!("devapi: {e}");
    std::process::exit(1);
}

fn main() {
    // The test runner itself drives two ranks of the host backend in `one_thread_two_ranks`.
    // SAFETY: set before any thread is started or the library loaded.
    unsafe { std::env::set_var("MSCCLPP_BACKEND", "host") };
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    run_if_rank(HOSTS_ROLE_VAR, DIR_VAR, hosts_rank_main);
    run_if_rank(V228_ROLE_VAR, DIR_VAR, v228_rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("devapi").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(120),
        |_| {},
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    // Two simulated hosts of two ranks each: the host id follows the rank (set per child).
    let dir = fresh_dir("devapi-hosts").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (HOSTS_ROLE_VAR, DIR_VAR),
        &dir,
        4,
        Duration::from_secs(120),
        |cmd| {
            let rank: usize = cmd
                .get_envs()
                .find(|(k, _)| *k == HOSTS_ROLE_VAR)
                .and_then(|(_, v)| v?.to_str()?.parse().ok())
                .unwrap_or(0);
            cmd.env("MSCCLPP_HOSTID", format!("devapi-host-{}", rank / 2));
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    // Clients of NCCL 2.28: 2.28.3 named by MSCCLPP_NCCL_VERSION, 2.28.9 by the communicator's
    // ncclConfig_t.
    for declared in [Some("2.28.3"), None] {
        let dir = fresh_dir("devapi-228").unwrap_or_else(|e| fail(&e));
        let ran = run_ranks(
            (V228_ROLE_VAR, DIR_VAR),
            &dir,
            NRANKS,
            Duration::from_secs(60),
            |cmd| {
                if let Some(v) = declared {
                    cmd.env("MSCCLPP_NCCL_VERSION", v);
                }
            },
        );
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = ran {
            fail(&format!("2.28 client ({declared:?}): {e}"));
        }
    }
    if let Err(e) = one_thread_two_ranks() {
        fail(&format!("one thread, two ranks: {e}"));
    }
    println!(
        "devapi: 2 ranks on the host backend: symmetric windows, device communicators at 4 layouts, LSA barriers, GIN through the proxy, refusals; clients of 2.28.3 and 2.28.9; 4 ranks on 2 simulated hosts: LSA teams per host, GIN between the hosts; one thread driving 2 ranks through groups: every check passed"
    );
}
