//! `libmscclpp_nccl.so` serving a communicator that spans hosts natively: four ranks (child
//! processes, host backend) as two hosts of two by `MSCCLPP_HOSTID`, without a real NCCL to
//! fall back to (so every call that succeeds was served by mscclpp's multi-host collectives),
//! each collective against a CPU reference with poisoned outputs, then PyTorch's `new_group` +
//! `broadcast_object_list` over a split of it. Runs with
//! `cargo test -p mscclpp-nccl --test multinode`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::NcclUniqueId;
use support::{
    CollFn, Comm, MoveFn, fresh_dir, lib_path, open_lib, publish, rank_command, rank_failure,
    read_id, run_if_rank, wait_or_kill,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_MULTINODE_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_MULTINODE_TEST_DIR";
const HOSTS: usize = 2;
const PER_HOST: usize = 2;
const NRANKS: usize = HOSTS * PER_HOST;
/// Elements per rank block: odd, so that the ranks of a host cannot split it evenly.
const N: usize = 1001;
const FLOAT32: c_int = 7;
const SUM: c_int = 0;

/// Rank `rank`'s element `i` of data set `salt`: small integers, so every sum is exact.
fn value(rank: usize, salt: usize, i: usize) -> f32 {
    ((rank * 31 + salt * 17 + i * 7) % 13) as f32
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
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let reduce_scatter: CollFn = sym!(lib, "ncclReduceScatter" as CollFn);
    let broadcast: CollFn = sym!(lib, "ncclBroadcast" as CollFn);
    let all_gather: MoveFn = sym!(lib, "ncclAllGather" as MoveFn);
    let all_to_all: MoveFn = sym!(lib, "ncclAlltoAll" as MoveFn);
    let split = sym!(
        lib,
        "ncclCommSplit",
        fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int
    );
    let expect = |what: &str, got: c_int| -> Result<(), String> {
        if got != 0 {
            // SAFETY: the library's thread-local NUL-terminated message.
            let msg = unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) };
            return Err(format!(
                "{what}: returned {got} (last error: {})",
                msg.to_string_lossy()
            ));
        }
        Ok(())
    };
    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        expect("ncclGetUniqueId", unsafe { get_id(&mut id) })?;
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    expect(
        "ncclCommInitRank",
        // SAFETY: valid out-pointer.
        unsafe { init(&mut comm, NRANKS as c_int, id, rank as c_int) },
    )?;
    let alloc = |elems: usize| -> Result<*mut f32, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        expect("ncclMemAlloc", unsafe { mem_alloc(&mut p, elems * 4) })?;
        Ok(p.cast::<f32>())
    };
    let (send, recv) = (alloc(NRANKS * N)?, alloc(NRANKS * N)?);
    // Host-backend device memory is this process's memory; the calls on the NULL stream
    // return once done.
    let put = |p: *mut f32, v: &[f32]| {
        // SAFETY: room for NRANKS * N elements.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p, v.len()) }
    };
    let get = |p: *mut f32, n: usize| -> Vec<f32> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p, n) }.to_vec()
    };
    let poison = |p: *mut f32| put(p, &vec![f32::NAN; NRANKS * N]);
    let check = |what: &str, got: &[f32], want: &[f32]| -> Result<(), String> {
        let wrong = got.iter().zip(want).filter(|(g, w)| g != w).count();
        if wrong > 0 || got.len() != want.len() {
            return Err(format!("{what}: {wrong} of {} elements wrong", want.len()));
        }
        Ok(())
    };
    let data = |r: usize, salt: usize, n: usize| -> Vec<f32> {
        (0..n).map(|i| value(r, salt, i)).collect()
    };
    let null = std::ptr::null_mut::<c_void>();
    let (s, r) = (send.cast::<c_void>(), recv.cast::<c_void>());

    put(send, &data(rank, 1, N));
    poison(recv);
    // Every call below: buffers of NRANKS * N f32; NULL stream = the communicator's own (host
    // backend).
    // SAFETY: see above.
    expect("ncclAllReduce", unsafe {
        all_reduce(s, r, N, FLOAT32, SUM, comm, null)
    })?;
    let want: Vec<f32> = (0..N)
        .map(|i| (0..NRANKS).map(|q| value(q, 1, i)).sum())
        .collect();
    check("allreduce", &get(recv, N), &want)?;

    put(recv, &data(rank, 2, N));
    // SAFETY: see above.
    expect("ncclAllReduce in place", unsafe {
        all_reduce(r, r, N, FLOAT32, SUM, comm, null)
    })?;
    let want: Vec<f32> = (0..N)
        .map(|i| (0..NRANKS).map(|q| value(q, 2, i)).sum())
        .collect();
    check("allreduce in place", &get(recv, N), &want)?;

    put(send, &data(rank, 3, N));
    poison(recv);
    // SAFETY: see above.
    expect("ncclAllGather", unsafe {
        all_gather(s, r, N, FLOAT32, comm, null)
    })?;
    let want: Vec<f32> = (0..NRANKS).flat_map(|q| data(q, 3, N)).collect();
    check("allgather", &get(recv, NRANKS * N), &want)?;

    put(send, &data(rank, 4, NRANKS * N));
    poison(recv);
    // SAFETY: see above.
    expect("ncclReduceScatter", unsafe {
        reduce_scatter(s, r, N, FLOAT32, SUM, comm, null)
    })?;
    let want: Vec<f32> = (0..N)
        .map(|i| (0..NRANKS).map(|q| value(q, 4, rank * N + i)).sum())
        .collect();
    check("reducescatter", &get(recv, N), &want)?;

    let root = NRANKS - 1;
    put(send, &data(rank, 5, N));
    poison(recv);
    // SAFETY: see above.
    expect("ncclBroadcast", unsafe {
        broadcast(s, r, N, FLOAT32, root as c_int, comm, null)
    })?;
    check("broadcast", &get(recv, N), &data(root, 5, N))?;

    put(send, &data(rank, 6, NRANKS * N));
    poison(recv);
    // SAFETY: see above.
    expect("ncclAlltoAll", unsafe {
        all_to_all(s, r, N, FLOAT32, comm, null)
    })?;
    let want: Vec<f32> = (0..NRANKS)
        .flat_map(|q| (0..N).map(move |i| value(q, 6, rank * N + i)))
        .collect();
    check("alltoall", &get(recv, NRANKS * N), &want)?;

    // PyTorch's `new_group` of every rank (a split of one color) and its
    // `broadcast_object_list` over it: an int64 size, then that many bytes, from rank 0.
    let mut child: Comm = std::ptr::null_mut();
    expect(
        "ncclCommSplit",
        // SAFETY: a live communicator, a valid out-pointer, NULL config.
        unsafe { split(comm, 0, rank as c_int, &mut child, null) },
    )?;
    if child.is_null() {
        return Err("ncclCommSplit of one color gave no communicator".into());
    }
    let object: Vec<u8> = (0..333).map(|i| (i * 7 + 3) as u8).collect();
    const INT64: c_int = 4;
    const UINT8: c_int = 1;
    // SAFETY: `send` and `recv` hold NRANKS * N f32, more than either broadcast moves.
    unsafe {
        let size = send.cast::<i64>();
        size.write(if rank == 0 { object.len() as i64 } else { -1 });
        expect(
            "ncclBroadcast of the size (split)",
            broadcast(s, s, 1, INT64, 0, child, null),
        )?;
        if size.read() != object.len() as i64 {
            return Err(format!("broadcast size: got {}", size.read()));
        }
        let bytes = recv.cast::<u8>();
        let fill: Vec<u8> = if rank == 0 {
            object.clone()
        } else {
            vec![0xee; object.len()]
        };
        std::ptr::copy_nonoverlapping(fill.as_ptr(), bytes, fill.len());
        expect(
            "ncclBroadcast of the object (split)",
            broadcast(r, r, object.len(), UINT8, 0, child, null),
        )?;
        if std::slice::from_raw_parts(bytes, object.len()) != object.as_slice() {
            return Err("broadcast of the object over the split: wrong bytes".into());
        }
        expect("ncclCommDestroy (split)", destroy(child))?;
    }

    // SAFETY: a live communicator, no call in flight.
    expect("ncclCommDestroy", unsafe { destroy(comm) })?;
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

fn two_hosts_of_two() -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir("multinode")?;
    let mut children = Vec::new();
    for rank in 0..NRANKS {
        let child = rank_command(ROLE_VAR, DIR_VAR, rank, &dir)?
            .env(
                "MSCCLPP_HOSTID",
                format!(
                    "nccl-multinode-{}-host-{}",
                    std::process::id(),
                    rank / PER_HOST
                ),
            )
            .env("MSCCLPP_HIER_SLOT_BYTES", "4096")
            // The sharded all-reduce, with an odd remainder.
            .env("MSCCLPP_HIER_SMALL_BYTES", "1024")
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, _) = wait_or_kill(child, deadline, Duration::from_millis(20))?;
        if !out.status.success() || !dir.join(format!("done-{rank}")).exists() {
            failures.push(rank_failure(rank, &out));
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
    let trials = vec![Trial::test(
        "multinode::host::2_hosts_of_2_ranks_native",
        two_hosts_of_two,
    )];
    libtest_mimic::run(&args, trials).exit();
}
