//! `ncclCommGrow` through the C ABI (`dlopen`, as a C program), four ranks as child processes
//! on the host backend, NCCL's parameter usage: ranks 0 and 1 make a 2-rank communicator; rank
//! 0 asks `ncclCommGetUniqueId` for a grow id (twice: as NCCL, the second replaces the first)
//! and hands it to ranks 2 and 3, which join with `ncclCommGrow(NULL, 4, &id, rank)` while the
//! existing ranks pass their communicator and rank -1 (rank 0 its id, rank 1 NULL). On the
//! grown communicator: its count and ranks, and an all-reduce of random data into a poisoned
//! output checked against a CPU reference; the parent goes on working. Then the grown
//! communicator grows again, non-blocking this time (4 to 5 ranks, rank 1 makes the id, a new
//! rank 4), polled with `ncclCommGetAsyncError`, and is checked the same way. Bad input: an
//! existing rank passing a rank, a size not larger, two existing ranks each making an id (both
//! fail naming them, quickly), ids passed that no existing rank made. Runs with
//! `cargo test -p mscclpp-nccl --test grow`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use mscclpp_nccl::abi::{NcclConfig, NcclUniqueId};
use support::{
    CollFn, Comm, fresh_dir, init_world, lib_path, mark, open_lib, run_if_rank, run_ranks,
    wait_file,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_GROW_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_GROW_TEST_DIR";
/// Processes: ranks 0 and 1 from the start, 2 and 3 join at the first grow, 4 at the second.
const NPROCS: usize = 5;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;
const SUCCESS: c_int = 0;
const INVALID_ARGUMENT: c_int = 4;
const INVALID_USAGE: c_int = 5;
const IN_PROGRESS: c_int = 7;
const COUNT: usize = 3001;

type GrowFn = unsafe extern "C" fn(
    Comm,
    c_int,
    *const NcclUniqueId,
    c_int,
    *mut Comm,
    *mut NcclConfig,
) -> c_int;

/// Rank `rank`'s input for round `salt`: pseudo-random small integers (exact f32 sums).
fn input(rank: usize, salt: u64) -> Vec<f32> {
    let mut s = 0x9e37_79b9_7f4a_7c15u64 ^ (rank as u64 * 0x1000_0001 + salt * 7919);
    (0..COUNT)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % 61) as f32 - 30.0
        })
        .collect()
}

struct Api {
    all_reduce: CollFn,
    count: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    user_rank: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    async_err: unsafe extern "C" fn(Comm, *mut c_int) -> c_int,
    last_err: unsafe extern "C" fn(Comm) -> *const c_char,
}

impl Api {
    fn last(&self) -> String {
        // SAFETY: the library's NUL-terminated message.
        unsafe { CStr::from_ptr((self.last_err)(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    }

    /// `code` must be `want`; a refusal's message must name every word of `words`.
    fn expect(&self, what: &str, code: c_int, want: c_int, words: &[&str]) -> Result<(), String> {
        let msg = self.last();
        if code != want {
            return Err(format!("{what}: code {code}, expected {want}: {msg}"));
        }
        if let Some(w) = words.iter().find(|w| !msg.contains(*w)) {
            return Err(format!("{what}: the message does not name {w:?}: {msg}"));
        }
        Ok(())
    }

    /// Count and rank of `comm`, then an all-reduce over its `n` ranks checked against the sum.
    fn check(&self, comm: Comm, n: usize, rank: usize, salt: u64) -> Result<(), String> {
        let (mut cnt, mut r) = (-1, -1);
        // SAFETY: valid out-pointers.
        unsafe {
            self.expect("ncclCommCount", (self.count)(comm, &mut cnt), SUCCESS, &[])?;
            self.expect(
                "ncclCommUserRank",
                (self.user_rank)(comm, &mut r),
                SUCCESS,
                &[],
            )?;
        }
        if cnt != n as c_int || r != rank as c_int {
            return Err(format!("count {cnt} and rank {r}, expected {n} and {rank}"));
        }
        let x = input(rank, salt);
        let mut y = vec![f32::NAN; COUNT];
        // SAFETY: host buffers of COUNT floats; the host backend's call has run when it returns.
        let rc = unsafe {
            (self.all_reduce)(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast::<c_void>(),
                COUNT,
                NCCL_FLOAT32,
                NCCL_SUM,
                comm,
                std::ptr::null_mut(),
            )
        };
        self.expect("ncclAllReduce", rc, SUCCESS, &[])?;
        let want: Vec<f32> = (0..COUNT)
            .map(|i| (0..n).map(|q| input(q, salt)[i]).sum())
            .collect();
        if let Some(i) = (0..COUNT).find(|&i| y[i] != want[i]) {
            return Err(format!(
                "all-reduce over {n} ranks (round {salt}): element {i} is {}, expected {}",
                y[i], want[i]
            ));
        }
        Ok(())
    }

    /// Polls a non-blocking creation until it settles; must be success within 60 s.
    fn wait_ready(&self, comm: Comm, what: &str) -> Result<(), String> {
        let until = Instant::now() + Duration::from_secs(60);
        loop {
            let mut e = -1;
            // SAFETY: valid out-pointer.
            let rc = unsafe { (self.async_err)(comm, &mut e) };
            self.expect(&format!("{what}: ncclCommGetAsyncError"), rc, SUCCESS, &[])?;
            match e {
                SUCCESS => return Ok(()),
                IN_PROGRESS if Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(2))
                }
                other => return Err(format!("{what}: settled as {other}: {}", self.last())),
            }
        }
    }
}

fn id_bytes(id: &NcclUniqueId) -> Vec<u8> {
    id.internal.to_vec()
}

fn id_from(bytes: &[u8]) -> NcclUniqueId {
    let mut id = NcclUniqueId { internal: [0; 128] };
    let n = bytes.len().min(128);
    id.internal[..n].copy_from_slice(&bytes[..n]);
    id
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let grow_id = sym!(
        lib,
        "ncclCommGetUniqueId",
        fn(Comm, *mut NcclUniqueId) -> c_int
    );
    let grow: GrowFn = sym!(lib, "ncclCommGrow" as GrowFn);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let api = Api {
        all_reduce: sym!(lib, "ncclAllReduce" as CollFn),
        count: sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int),
        user_rank: sym!(lib, "ncclCommUserRank", fn(Comm, *mut c_int) -> c_int),
        async_err: sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int),
        last_err: sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char),
    };
    let null = std::ptr::null_mut();

    // The first communicator: ranks 0 and 1.
    let mut parent: Comm = null;
    if rank < 2 {
        parent = init_world(&lib, rank, 2, dir, null.cast())?;
        api.check(parent, 2, rank, 1)?;
        bad_input(&api, grow_id, grow, parent, rank, dir)?;
    }

    // The first grow: 2 to 4 ranks, blocking.
    let mut grown: Comm = null;
    match rank {
        0 => {
            let mut gid = NcclUniqueId { internal: [0; 128] };
            // SAFETY: valid out-pointers.
            unsafe {
                api.expect(
                    "ncclCommGetUniqueId",
                    grow_id(parent, &mut gid),
                    SUCCESS,
                    &[],
                )?;
                // The second id replaces the first (NCCL makes a new one each call).
                api.expect(
                    "a second ncclCommGetUniqueId",
                    grow_id(parent, &mut gid),
                    SUCCESS,
                    &[],
                )?;
            }
            mark(&dir.join("grow-id"), &id_bytes(&gid))?;
            // SAFETY: valid pointers; NULL config inherits the parent's.
            let rc = unsafe { grow(parent, 4, &gid, -1, &mut grown, null.cast()) };
            api.expect("ncclCommGrow (existing rank 0, the id)", rc, SUCCESS, &[])?;
        }
        1 => {
            // SAFETY: as above.
            let rc = unsafe { grow(parent, 4, std::ptr::null(), -1, &mut grown, null.cast()) };
            api.expect("ncclCommGrow (existing rank 1, NULL)", rc, SUCCESS, &[])?;
        }
        2 | 3 => {
            let gid = id_from(&wait_file(&dir.join("grow-id"))?);
            // SAFETY: valid pointers.
            let rc = unsafe { grow(null, 4, &gid, rank as c_int, &mut grown, null.cast()) };
            api.expect(&format!("ncclCommGrow (new rank {rank})"), rc, SUCCESS, &[])?;
        }
        _ => {}
    }
    if rank < 4 {
        api.check(grown, 4, rank, 2)?;
    }
    if rank < 2 {
        // The parent lives on beside its grown communicator.
        api.check(parent, 2, rank, 3)?;
    }

    // The second grow: 4 to 5, non-blocking; rank 1 makes the id.
    let mut cfg = NcclConfig::INITIALIZER;
    cfg.blocking = 0;
    let mut second: Comm = null;
    let rc = match rank {
        1 => {
            let mut gid = NcclUniqueId { internal: [0; 128] };
            // SAFETY: valid out-pointer.
            let rc = unsafe { grow_id(grown, &mut gid) };
            api.expect("ncclCommGetUniqueId on the grown", rc, SUCCESS, &[])?;
            mark(&dir.join("grow-id-2"), &id_bytes(&gid))?;
            // SAFETY: valid pointers.
            unsafe { grow(grown, 5, &gid, -1, &mut second, &mut cfg) }
        }
        4 => {
            let gid = id_from(&wait_file(&dir.join("grow-id-2"))?);
            // SAFETY: valid pointers.
            unsafe { grow(null, 5, &gid, 4, &mut second, &mut cfg) }
        }
        // SAFETY: valid pointers.
        _ => unsafe { grow(grown, 5, std::ptr::null(), -1, &mut second, &mut cfg) },
    };
    api.expect("non-blocking ncclCommGrow", rc, IN_PROGRESS, &[])?;
    if second.is_null() {
        return Err("a non-blocking ncclCommGrow wrote no handle".into());
    }
    api.wait_ready(second, "the second grow")?;
    api.check(second, 5, rank, 4)?;

    // SAFETY: the communicators made above, each destroyed once.
    unsafe {
        api.expect("destroy", destroy(second), SUCCESS, &[])?;
        if !grown.is_null() {
            api.expect("destroy", destroy(grown), SUCCESS, &[])?;
        }
        if !parent.is_null() {
            api.expect("destroy", destroy(parent), SUCCESS, &[])?;
        }
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// Bad input on the 2-rank communicator of ranks 0 and 1 (the others are not started yet).
fn bad_input(
    api: &Api,
    grow_id: unsafe extern "C" fn(Comm, *mut NcclUniqueId) -> c_int,
    grow: GrowFn,
    parent: Comm,
    rank: usize,
    dir: &Path,
) -> Result<(), String> {
    let null: Comm = std::ptr::null_mut();
    let mut out: Comm = null;
    // SAFETY: valid pointers; each call is refused before anything is made.
    unsafe {
        api.expect(
            "ncclCommGrow with a rank from an existing rank",
            grow(parent, 3, std::ptr::null(), 0, &mut out, null.cast()),
            INVALID_ARGUMENT,
            &["ncclCommGrow", "-1"],
        )?;
        api.expect(
            "ncclCommGrow not larger",
            grow(parent, 2, std::ptr::null(), -1, &mut out, null.cast()),
            INVALID_ARGUMENT,
            &["ncclCommGrow", "not more than"],
        )?;
        api.expect(
            "ncclCommGrow new rank without an id",
            grow(null, 3, std::ptr::null(), 2, &mut out, null.cast()),
            INVALID_ARGUMENT,
            &["uniqueId is NULL"],
        )?;
    }
    if !out.is_null() {
        return Err(format!("a refused ncclCommGrow wrote {out:p}"));
    }
    // Both existing ranks make an id and pass it: both fail at once, naming both.
    let mut gid = NcclUniqueId { internal: [0; 128] };
    let t = Instant::now();
    // SAFETY: valid pointers.
    unsafe {
        api.expect(
            "ncclCommGetUniqueId",
            grow_id(parent, &mut gid),
            SUCCESS,
            &[],
        )?;
        api.expect(
            "ncclCommGrow with two ids",
            grow(parent, 3, &gid, -1, &mut out, null.cast()),
            INVALID_USAGE,
            &["existing ranks [0, 1] each made a grow id"],
        )?;
    }
    if t.elapsed() > Duration::from_secs(10) {
        return Err(format!("two ids were refused only after {:?}", t.elapsed()));
    }
    // Ids passed that no existing rank made here (rank 0's sent to rank 1 and the reverse;
    // each rank's own stays pending): refused on both.
    let mine = NcclUniqueId {
        internal: {
            let mut fresh = NcclUniqueId { internal: [0; 128] };
            // SAFETY: valid out-pointer.
            let rc = unsafe { grow_id(parent, &mut fresh) };
            api.expect("ncclCommGetUniqueId (again)", rc, SUCCESS, &[])?;
            fresh.internal
        },
    };
    mark(&dir.join(format!("foreign-{rank}")), &id_bytes(&mine))?;
    let theirs = id_from(&wait_file(&dir.join(format!("foreign-{}", 1 - rank)))?);
    // SAFETY: valid pointers.
    let rc = unsafe { grow(parent, 3, &theirs, -1, &mut out, null.cast()) };
    api.expect(
        "ncclCommGrow with another rank's id",
        rc,
        INVALID_USAGE,
        &["no existing rank made the grow id"],
    )?;
    // This rank's own id is still pending (the foreign one did not consume it): a grow with it
    // alone would work; consume it in a refused grow (both ranks pass theirs) to leave none.
    // SAFETY: valid pointers.
    let rc = unsafe { grow(parent, 3, &mine, -1, &mut out, null.cast()) };
    api.expect(
        "ncclCommGrow consuming the pending ids",
        rc,
        INVALID_USAGE,
        &["each made a grow id"],
    )?;
    if !out.is_null() {
        return Err(format!("a refused ncclCommGrow wrote {out:p}"));
    }
    Ok(())
}

fn fail(msg: &str) -> ! {
    eprintln!("grow: {msg}");
    std::process::exit(1)
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("grow").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NPROCS,
        Duration::from_secs(120),
        |_| {},
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!(
        "grow: 2 ranks grown to 4 (blocking) and to 5 (non-blocking) on the host backend; all-reduces checked; bad input refused"
    );
}
