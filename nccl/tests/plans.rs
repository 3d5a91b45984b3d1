//! `MSCCLPP_EXECUTION_PLAN_DIR` through the C ABI (`dlopen`, as a C program would): two ranks
//! (child processes of this test, host backend) with a directory of plans written by the
//! executor's testgen — an LL all-reduce for small messages, an in-place Simple all-reduce for
//! large ones, an NVLS all-gather (emulated multicast), a plan for 4 ranks and a malformed one.
//! Every call is checked against a CPU reference; the ranks' logs must show each plan picked for
//! the sizes of its range (once, at info), the 4-rank plan skipped and the malformed one refused
//! with the reader's error; calls no plan can run (avg; a size the chunks do not divide) take the
//! built-in algorithms. Runs with `cargo test -p mscclpp-nccl --test plans`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_executor::testgen;
use mscclpp_nccl::abi::NcclUniqueId;
use support::{
    CollFn, Comm, MoveFn, fresh_dir, lib_path, open_lib, publish, rank_command, read_id,
    run_if_rank, wait_or_kill,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_PLANS_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_PLANS_TEST_DIR";
const NRANKS: usize = 2;
/// `ncclDataType_t` / `ncclRedOp_t` codes (NCCL 2.28).
const INT32: c_int = 2;
const FLOAT32: c_int = 7;
const SUM: c_int = 0;
const MAX: c_int = 2;
const AVG: c_int = 4;

/// Input element `i` of rank `r` for call `salt`: small integers, exact in f32 sums.
fn value(salt: usize, r: usize, i: usize) -> i32 {
    ((i * 7 + r * 13 + salt * 5) % 23) as i32 - 11
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce = sym!(lib, "ncclAllReduce" as CollFn);
    let all_gather = sym!(lib, "ncclAllGather" as MoveFn);
    let check_rc = |what: &str, rc: c_int| -> Result<(), String> {
        if rc == 0 {
            return Ok(());
        }
        // SAFETY: the library's thread-local NUL-terminated message.
        let msg = unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }.to_string_lossy();
        Err(format!("{what}: returned {rc} ({msg})"))
    };

    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        check_rc("ncclGetUniqueId", unsafe { get_id(&mut id) })?;
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    check_rc("ncclCommInitRank", unsafe {
        init(&mut comm, NRANKS as c_int, id, rank as c_int)
    })?;
    let alloc = |bytes: usize| -> Result<*mut c_void, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        check_rc("ncclMemAlloc", unsafe { mem_alloc(&mut p, bytes) })?;
        Ok(p)
    };
    const MAX_ELEMS: usize = 8192;
    let send = alloc(MAX_ELEMS * 4 * NRANKS)?;
    let recv = alloc(MAX_ELEMS * 4 * NRANKS)?;
    let null = std::ptr::null_mut::<c_void>();
    // Host-backend device memory is this process's memory.
    let put = |p: *mut c_void, v: &[i32]| {
        // SAFETY: `p` has room for MAX_ELEMS * NRANKS elements of 4 bytes; v is no longer.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<i32>(), v.len()) }
    };
    let get = |p: *mut c_void, n: usize| -> Vec<i32> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p.cast::<i32>(), n) }.to_vec()
    };
    let poison = |p: *mut c_void| put(p, &vec![-0x5a5a_5a5b; MAX_ELEMS * NRANKS]);
    let as_f32 = |v: &[i32]| -> Vec<i32> {
        v.iter()
            .map(|&x| i32::from_ne_bytes((x as f32).to_ne_bytes()))
            .collect()
    };
    let compare = |what: &str, got: &[i32], want: &[i32]| -> Result<(), String> {
        match (0..want.len()).find(|&i| got[i] != want[i]) {
            None => Ok(()),
            Some(i) => Err(format!(
                "{what}: element {i} is {:#x}, expected {:#x} ({} wrong of {})",
                got[i],
                want[i],
                (0..want.len()).filter(|&i| got[i] != want[i]).count(),
                want.len()
            )),
        }
    };

    // All-reduces: (salt, elements, type, operator, in place).
    let cases = [
        (1, 1000, FLOAT32, SUM, false), // 4000 bytes: the small LL plan
        (2, 1000, FLOAT32, SUM, true),  // again, in place: the same plan, on its staged buffers
        (3, 4096, INT32, MAX, false),   // 16 KiB: the large (in-place) Simple plan, max
        (4, 4096, INT32, SUM, true),    // again, in place
        (5, 1000, FLOAT32, AVG, false), // avg: no plan computes it, built-in
        (6, 1001, FLOAT32, SUM, false), // 4004 bytes: not whole 16-byte chunks, built-in
    ];
    for (salt, n, dt, op, inplace) in cases {
        let mine: Vec<i32> = (0..n).map(|i| value(salt, rank, i)).collect();
        let data = if dt == FLOAT32 { as_f32(&mine) } else { mine };
        poison(recv);
        let (s, r) = if inplace { (recv, recv) } else { (send, recv) };
        put(s, &data);
        // SAFETY: buffers of n 4-byte elements; NULL stream = the communicator's own.
        check_rc("ncclAllReduce", unsafe {
            all_reduce(s, r, n, dt, op, comm, null)
        })?;
        let want: Vec<i32> = (0..n)
            .map(|i| {
                let vals = (0..NRANKS).map(|q| value(salt, q, i));
                match op {
                    MAX => vals.max().unwrap_or(0),
                    AVG => vals.sum::<i32>() / NRANKS as i32,
                    _ => vals.sum(),
                }
            })
            .collect();
        let want = if dt == FLOAT32 && op == AVG {
            (0..n)
                .map(|i| {
                    let s: f32 = (0..NRANKS).map(|q| value(salt, q, i) as f32).sum();
                    i32::from_ne_bytes((s / NRANKS as f32).to_ne_bytes())
                })
                .collect()
        } else if dt == FLOAT32 {
            as_f32(&want)
        } else {
            want
        };
        compare(
            &format!("all-reduce {salt} ({n} elements, op {op}, in place {inplace})"),
            &get(r, n),
            &want,
        )?;
    }

    // All-gathers of 1000 i32 per rank (8000 bytes out): the NVLS plan (its input is its chunk
    // of the output when in place).
    for (salt, inplace) in [(7, false), (8, true), (9, false)] {
        let n = 1000;
        let mine: Vec<i32> = (0..n).map(|i| value(salt, rank, i)).collect();
        poison(recv);
        let s = if inplace {
            // SAFETY: block `rank` of recv, inside its allocation.
            unsafe { recv.cast::<i32>().add(rank * n).cast::<c_void>() }
        } else {
            send
        };
        put(s, &mine);
        // SAFETY: n elements in, NRANKS * n out.
        check_rc("ncclAllGather", unsafe {
            all_gather(s, recv, n, INT32, comm, null)
        })?;
        let want: Vec<i32> = (0..NRANKS * n).map(|j| value(salt, j / n, j % n)).collect();
        compare(
            &format!("all-gather {salt} (in place {inplace})"),
            &get(recv, NRANKS * n),
            &want,
        )?;
    }
    // SAFETY: a live communicator, destroyed once.
    check_rc("ncclCommDestroy", unsafe { destroy(comm) })?;
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// Writes the plan directory: JSON values, with their message ranges narrowed where asked.
fn write_plans(dir: &Path) -> Result<(), String> {
    let mut small = testgen::allreduce_ll(NRANKS, false);
    small["name"] = "allreduce_small_ll".into();
    small["max_message_size"] = 4096.into();
    let mut large = testgen::allreduce_simple(NRANKS, true);
    large["name"] = "allreduce_large_simple".into();
    large["min_message_size"] = 4097.into();
    let gather = testgen::allgather_nvls(NRANKS, false);
    let four = testgen::allreduce_simple(4, false);
    let mut broken = testgen::allreduce_simple(NRANKS, false);
    broken["name"] = "broken".into();
    broken["gpus"][0]["threadblocks"][0]["ops"][2]["name"] = "frobnicate".into();
    // File names set the order plans are tried in.
    for (file, v) in [
        ("1_small.json", &small),
        ("2_large.json", &large),
        ("3_gather.json", &gather),
        ("4_four_ranks.json", &four),
        ("5_malformed.json", &broken),
    ] {
        let bytes = serde_json::to_vec_pretty(v).map_err(|e| e.to_string())?;
        std::fs::write(dir.join(file), bytes).map_err(|e| e.to_string())?;
    }
    std::fs::write(dir.join("notes.txt"), b"not a plan").map_err(|e| e.to_string())?;
    Ok(())
}

fn plans_host() -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir("plans")?;
    let plan_dir = dir.join("plans");
    std::fs::create_dir_all(&plan_dir).map_err(|e| e.to_string())?;
    write_plans(&plan_dir)?;
    let mut children = Vec::new();
    for rank in 0..NRANKS {
        let child = rank_command(ROLE_VAR, DIR_VAR, rank, &dir)?
            .env("MSCCLPP_EXECUTION_PLAN_DIR", &plan_dir)
            .env("MSCCLPP_LOG_LEVEL", "info")
            .env("NO_COLOR", "1")
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, _) = wait_or_kill(child, deadline, Duration::from_millis(20))?;
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        if !out.status.success() || !dir.join(format!("done-{rank}")).exists() {
            failures.push(format!("rank {rank}: {}\n{log}", out.status));
            continue;
        }
        // What the log must say, and how many times.
        let expect: [(&str, usize); 6] = [
            (
                "using execution plan allreduce_small_ll for allreduce of 4000 bytes",
                1,
            ),
            (
                "using execution plan allreduce_large_simple for allreduce of 16384 bytes",
                1,
            ),
            (
                "using execution plan allgather_nvls_2 for allgather of 8000 bytes",
                1,
            ),
            ("using execution plan", 3),
            (
                "4_four_ranks.json skipped: it is for 4 ranks, the communicator has 2",
                1,
            ),
            ("5_malformed.json skipped", 1),
        ];
        for (line, times) in expect {
            let got = log.matches(line).count();
            if got != times {
                failures.push(format!(
                    "rank {rank}: {got} log lines with {line:?}, expected {times}:\n{log}"
                ));
            }
        }
        if !log.contains("unknown operation \"frobnicate\"") || !log.contains("WARN") {
            failures.push(format!(
                "rank {rank}: the malformed plan's reader error is not logged at warn:\n{log}"
            ));
        }
        if log.contains("notes.txt") {
            failures.push(format!(
                "rank {rank}: a file not named *.json was read:\n{log}"
            ));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![Trial::test("plans::host::2_ranks_plan_dir", plans_host)];
    libtest_mimic::run(&args, trials).exit();
}
