//! The C ABI of `libmscclpp_nccl.so`, exercised through `dlopen` as a C program would: every
//! export resolves, version and error strings, and two ranks (child processes of this test, host
//! backend) running every native collective against a CPU reference, plus the error paths.
//! Runs with `cargo test -p mscclpp-nccl --test abi`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp::hal::{DataType, ReduceOp};
use mscclpp_nccl::EXPORTS;
use mscclpp_nccl::abi::NcclUniqueId;
use support::{
    CollFn, Comm, MoveFn, fresh_dir, lib_path, open_lib, output_text, publish, rank_command,
    rank_failure, run_if_rank, self_command, wait_or_kill, wait_published,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_ABI_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_ABI_TEST_DIR";
const ROLE_230_VAR: &str = "MSCCLPP_NCCL_ABI_TEST_230_RANK";
const DIR_230_VAR: &str = "MSCCLPP_NCCL_ABI_TEST_230_DIR";

/// Every function NVIDIA/nccl v2.30.7's `src/nccl.h.in` declares (the `ncclX` names; NCCL also
/// exports `pncclX` twins, which this library does not). Each must be ours: under `LD_PRELOAD` an
/// undefined one resolves to the real `libnccl.so`, which would be handed our handle.
const NCCL_H_2_30_7: &[&str] = &[
    "ncclMemAlloc",
    "ncclMemFree",
    "ncclGetVersion",
    "ncclGetUniqueId",
    "ncclCommInitRankConfig",
    "ncclCommInitRank",
    "ncclCommInitAll",
    "ncclCommFinalize",
    "ncclCommDestroy",
    "ncclCommAbort",
    "ncclCommRevoke",
    "ncclCommSplit",
    "ncclCommShrink",
    "ncclCommGetUniqueId",
    "ncclCommGrow",
    "ncclCommInitRankScalable",
    "ncclGetErrorString",
    "ncclGetLastError",
    "ncclResetDebugInit",
    "ncclCommGetAsyncError",
    "ncclCommCount",
    "ncclCommCuDevice",
    "ncclCommUserRank",
    "ncclCommRegister",
    "ncclCommDeregister",
    "ncclCommSuspend",
    "ncclCommResume",
    "ncclCommMemStats",
    "ncclCommWindowRegister",
    "ncclCommWindowDeregister",
    "ncclWinGetUserPtr",
    "ncclRedOpCreatePreMulSum",
    "ncclRedOpDestroy",
    "ncclReduce",
    "ncclBcast",
    "ncclBroadcast",
    "ncclAllReduce",
    "ncclReduceScatter",
    "ncclAllGather",
    "ncclAlltoAll",
    "ncclGather",
    "ncclScatter",
    "ncclSend",
    "ncclRecv",
    "ncclPutSignal",
    "ncclSignal",
    "ncclWaitSignal",
    "ncclGroupStart",
    "ncclGroupEnd",
    "ncclGroupSimulateEnd",
    "ncclParamBind",
    "ncclParamGetI8",
    "ncclParamGetI16",
    "ncclParamGetI32",
    "ncclParamGetI64",
    "ncclParamGetU8",
    "ncclParamGetU16",
    "ncclParamGetU32",
    "ncclParamGetU64",
    "ncclParamGetStr",
    "ncclParamGet",
    "ncclParamGetParameter",
    "ncclParamGetAllParameterKeys",
    "ncclParamDumpAll",
];

/// Host functions of v2.30.7's device-API headers (`nccl_device/*.h`, exported by `libnccl.so`
/// too) that take a communicator or a window, so must be ours as well.
const NCCL_DEVICE_HOST_2_30_7: &[&str] = &[
    "ncclCommQueryProperties",
    "ncclDevCommCreate",
    "ncclDevCommDestroy",
    "ncclGetLsaMultimemDevicePointer",
    "ncclGetMultimemDevicePointer",
    "ncclGetLsaDevicePointer",
    "ncclGetPeerDevicePointer",
    "ncclGinBarrierCreateRequirement",
];

fn symbols_resolve() -> Result<(), Failed> {
    let lib = open_lib()?;
    let missing: Vec<&str> = EXPORTS
        .iter()
        .copied()
        .chain(NCCL_H_2_30_7.iter().copied())
        .chain(NCCL_DEVICE_HOST_2_30_7.iter().copied())
        // SAFETY: only the address is looked up.
        .filter(|n| unsafe { lib.get::<*const c_void>(format!("{n}\0").as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("unresolved exports: {missing:?}").into());
    }
    if NCCL_H_2_30_7.len() != 64 {
        return Err(format!(
            "expected nccl.h 2.30.7's 64 functions, listed {}",
            NCCL_H_2_30_7.len()
        )
        .into());
    }
    // Every function's profiling twin `pnccl…` is ours too, and the same function: the version
    // and an error string through the twin equal the originals'.
    let twins: Vec<String> = NCCL_H_2_30_7.iter().map(|n| format!("p{n}")).collect();
    let missing: Vec<&String> = twins
        .iter()
        // SAFETY: only the address is looked up.
        .filter(|n| unsafe { lib.get::<*const c_void>(format!("{n}\0").as_bytes()) }.is_err())
        .collect();
    if !missing.is_empty() {
        return Err(format!("unresolved profiling twins: {missing:?}").into());
    }
    {
        type GetVersion = unsafe extern "C" fn(*mut std::ffi::c_int) -> std::ffi::c_int;
        type ErrStr = unsafe extern "C" fn(std::ffi::c_int) -> *const std::ffi::c_char;
        // SAFETY: the exports' C signatures (nccl.h).
        let (v, pv, e, pe) = unsafe {
            (
                *lib.get::<GetVersion>(b"ncclGetVersion\0")
                    .map_err(|e| e.to_string())?,
                *lib.get::<GetVersion>(b"pncclGetVersion\0")
                    .map_err(|e| e.to_string())?,
                *lib.get::<ErrStr>(b"ncclGetErrorString\0")
                    .map_err(|e| e.to_string())?,
                *lib.get::<ErrStr>(b"pncclGetErrorString\0")
                    .map_err(|e| e.to_string())?,
            )
        };
        let (mut a, mut b) = (0, 0);
        // SAFETY: valid out-pointers; the strings are static.
        let same = unsafe {
            v(&mut a) == 0
                && pv(&mut b) == 0
                && a == b
                && std::ffi::CStr::from_ptr(e(4)) == std::ffi::CStr::from_ptr(pe(4))
        };
        if !same {
            return Err(format!(
                "pncclGetVersion/pncclGetErrorString differ from their twins ({a} vs {b})"
            )
            .into());
        }
    }
    // docs/gpu-machines.md's list of PyTorch 2.11's imports: all 38 are in EXPORTS.
    let torch = "ncclAllGather ncclAllReduce ncclAlltoAll ncclBcast ncclBroadcast ncclCommAbort ncclCommCount \
        ncclCommDeregister ncclCommDestroy ncclCommFinalize ncclCommGetAsyncError ncclCommInitAll \
        ncclCommInitRank ncclCommInitRankConfig ncclCommInitRankScalable ncclCommRegister \
        ncclCommShrink ncclCommSplit ncclCommUserRank ncclCommWindowDeregister ncclCommWindowRegister \
        ncclDevCommCreate ncclDevCommDestroy ncclGetErrorString ncclGetLastError ncclGetUniqueId \
        ncclGetVersion ncclGroupEnd ncclGroupSimulateEnd ncclGroupStart ncclMemAlloc ncclMemFree \
        ncclRecv ncclRedOpCreatePreMulSum ncclRedOpDestroy ncclReduce ncclReduceScatter ncclSend";
    let names: Vec<&str> = torch.split_whitespace().collect();
    if names.len() != 38 {
        return Err(format!("expected 38 names, found {}", names.len()).into());
    }
    for n in names {
        if !EXPORTS.contains(&n) {
            return Err(format!("{n} is not exported").into());
        }
    }
    Ok(())
}

fn version_and_strings() -> Result<(), Failed> {
    let lib = open_lib()?;
    let get_version = sym!(lib, "ncclGetVersion", fn(*mut c_int) -> c_int);
    let err_str = sym!(lib, "ncclGetErrorString", fn(c_int) -> *const c_char);
    let mut v = 0;
    // SAFETY: valid out-pointer.
    assert_eq!(unsafe { get_version(&mut v) }, 0);
    if v != 23206 {
        return Err(format!("version {v}").into());
    }
    // SAFETY: NULL is checked by the export.
    assert_eq!(unsafe { get_version(std::ptr::null_mut()) }, 4);
    for (code, word) in [
        (0, "no error"),
        (4, "invalid argument"),
        (5, "invalid usage"),
        (6, "remote"),
        (99, "unknown"),
    ] {
        // SAFETY: a static NUL-terminated string.
        let s = unsafe { CStr::from_ptr(err_str(code)) }
            .to_string_lossy()
            .into_owned();
        if !s.contains(word) {
            return Err(format!("ncclGetErrorString({code}) = {s:?}, expected {word:?}").into());
        }
    }
    Ok(())
}

/// xorshift: the same stream on every rank for a (seed, rank) pair.
struct Rng(u64);
impl Rng {
    fn new(seed: u64, rank: usize, salt: u64) -> Self {
        Rng((seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn small(&mut self) -> i32 {
        (self.next() % 201) as i32 - 100
    }
}

fn data_f32(seed: u64, rank: usize, salt: u64, n: usize) -> Vec<f32> {
    let mut r = Rng::new(seed, rank, salt);
    (0..n).map(|_| r.small() as f32).collect()
}

fn data_i32(seed: u64, rank: usize, salt: u64, n: usize) -> Vec<i32> {
    let mut r = Rng::new(seed, rank, salt);
    (0..n).map(|_| r.small()).collect()
}

fn check<T: PartialEq + std::fmt::Debug>(what: &str, got: &[T], want: &[T]) -> Result<(), String> {
    if let Some(i) = (0..want.len()).find(|&i| got[i] != want[i]) {
        return Err(format!(
            "{what}: element {i}: got {:?}, expected {:?}",
            got[i], want[i]
        ));
    }
    Ok(())
}

/// `n` elements of `dtype` for `rank`: small integers (so that every type holds them), as bytes.
fn data_of(dtype: DataType, seed: u64, rank: usize, salt: u64, n: usize) -> Vec<u8> {
    let mut r = Rng::new(seed, rank, salt);
    let mut out = Vec::with_capacity(n * dtype.size());
    for _ in 0..n {
        let v = (r.next() % 9) as f64
            - if dtype.is_float() || dtype == DataType::I8 {
                4.0
            } else {
                0.0
            };
        let v = if matches!(dtype, DataType::I32 | DataType::I64) {
            v - 4.0
        } else {
            v
        };
        dtype.encode_f64(v, &mut out);
    }
    out
}

/// The reduction of every rank's `data_of(..)` in rank order, as the kernels compute it.
fn reduced(dtype: DataType, op: ReduceOp, parts: &[Vec<u8>]) -> Vec<u8> {
    let s = dtype.size();
    let mut acc = parts[0].clone();
    let mut tmp = vec![0u8; s];
    for p in &parts[1..] {
        for (a, b) in acc.chunks_exact_mut(s).zip(p.chunks_exact(s)) {
            dtype.combine_elem(a, b, op, &mut tmp);
            a.copy_from_slice(&tmp);
        }
    }
    if op == ReduceOp::Avg {
        for a in acc.chunks_exact_mut(s) {
            dtype.divide_elem(a, parts.len() as u32, &mut tmp);
            a.copy_from_slice(&tmp);
        }
    }
    acc
}

/// One rank's body (a child process).
fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    const N: usize = 1000;
    let nranks = 2usize;
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let count_f = sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int);
    let rank_f = sym!(lib, "ncclCommUserRank", fn(Comm, *mut c_int) -> c_int);
    let async_f = sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let mem_free = sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let reduce_scatter: CollFn = sym!(lib, "ncclReduceScatter" as CollFn);
    let all_gather: MoveFn = sym!(lib, "ncclAllGather" as MoveFn);
    let all_to_all: MoveFn = sym!(lib, "ncclAlltoAll" as MoveFn);
    let broadcast = sym!(lib, "ncclBroadcast" as CollFn);
    let bcast = sym!(
        lib,
        "ncclBcast",
        fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let send = sym!(
        lib,
        "ncclSend",
        fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let reduce = sym!(
        lib,
        "ncclReduce",
        fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let recv = sym!(
        lib,
        "ncclRecv",
        fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let gather = sym!(lib, "ncclGather" as CollFn);
    let scatter = sym!(lib, "ncclScatter" as CollFn);
    let group_start = sym!(lib, "ncclGroupStart", fn() -> c_int);
    let group_end = sym!(lib, "ncclGroupEnd", fn() -> c_int);
    let split = sym!(
        lib,
        "ncclCommSplit",
        fn(Comm, c_int, c_int, *mut Comm, *mut c_void) -> c_int
    );
    let register = sym!(
        lib,
        "ncclCommRegister",
        fn(Comm, *mut c_void, usize, *mut *mut c_void) -> c_int
    );
    let deregister = sym!(lib, "ncclCommDeregister", fn(Comm, *mut c_void) -> c_int);
    let last = || {
        // SAFETY: the library's thread-local NUL-terminated message.
        unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    let expect = |what: &str, got: c_int, want: c_int| -> Result<(), String> {
        if got != want {
            return Err(format!(
                "{what}: returned {got}, expected {want} (last error: {})",
                last()
            ));
        }
        Ok(())
    };

    // The id: rank 0 makes it (and runs the root); rank 1 reads it from a file.
    let (id, seed) = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        expect("ncclGetUniqueId", unsafe { get_id(&mut id) }, 0)?;
        let mut seed = [0u8; 8];
        getrandom::fill(&mut seed).map_err(|e| e.to_string())?;
        let mut bytes = id.internal.to_vec();
        bytes.extend_from_slice(&seed);
        publish(dir, &bytes)?;
        (id, u64::from_le_bytes(seed))
    } else {
        let b = wait_published(dir, 136)?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        id.internal.copy_from_slice(&b[..128]);
        let mut s = [0u8; 8];
        s.copy_from_slice(&b[128..]);
        (id, u64::from_le_bytes(s))
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    expect(
        "ncclCommInitRank",
        // SAFETY: valid out-pointer.
        unsafe { init(&mut comm, 2, id, rank as c_int) },
        0,
    )?;
    let (mut c, mut r, mut ae) = (0, 0, -1);
    // SAFETY: valid out-pointers, live comm.
    unsafe {
        expect("ncclCommCount", count_f(comm, &mut c), 0)?;
        expect("ncclCommUserRank", rank_f(comm, &mut r), 0)?;
        expect("ncclCommGetAsyncError", async_f(comm, &mut ae), 0)?;
    }
    if (c, r, ae) != (2, rank as c_int, 0) {
        return Err(format!("count/rank/async error = {c}/{r}/{ae}"));
    }

    let alloc = |bytes: usize| -> Result<*mut c_void, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        expect("ncclMemAlloc", unsafe { mem_alloc(&mut p, bytes) }, 0)?;
        Ok(p)
    };
    let send_buf = alloc(nranks * N * 8)?;
    let recv_buf = alloc(nranks * N * 8)?;
    let null = std::ptr::null_mut::<c_void>();
    // Host-backend device memory is this process's memory.
    let put_f32 = |p: *mut c_void, v: &[f32]| {
        // SAFETY: `p` has room for nranks * N elements of 4 bytes.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<f32>(), v.len()) }
    };
    let get_f32 = |p: *mut c_void, n: usize| -> Vec<f32> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p.cast::<f32>(), n) }.to_vec()
    };
    let poison = |p: *mut c_void| put_f32(p, &vec![f32::NAN; nranks * N]);

    // all-reduce f32 sum
    put_f32(send_buf, &data_f32(seed, rank, 1, N));
    poison(recv_buf);
    // SAFETY: buffers of N f32; NULL stream = the communicator's own (host backend).
    expect(
        "ncclAllReduce",
        // SAFETY: buffers of N f32; NULL stream = the communicator's own (host backend).
        unsafe { all_reduce(send_buf, recv_buf, N, 7, 0, comm, null) },
        0,
    )?;
    let want: Vec<f32> = (0..N)
        .map(|i| (0..nranks).map(|q| data_f32(seed, q, 1, N)[i]).sum())
        .collect();
    check("allreduce f32 sum", &get_f32(recv_buf, N), &want)?;

    // all-reduce i32 min, in place
    let mine = data_i32(seed, rank, 2, N);
    // SAFETY: room for N i32.
    unsafe { std::ptr::copy_nonoverlapping(mine.as_ptr(), recv_buf.cast::<i32>(), N) };
    // SAFETY: as above.
    expect(
        "ncclAllReduce in place",
        // SAFETY: as above.
        unsafe { all_reduce(recv_buf, recv_buf, N, 2, 3, comm, null) },
        0,
    )?;
    let want: Vec<i32> = (0..N)
        .map(|i| {
            (0..nranks)
                .map(|q| data_i32(seed, q, 2, N)[i])
                .min()
                .unwrap_or(0)
        })
        .collect();
    // SAFETY: N i32 just written by the collective.
    let got = unsafe { std::slice::from_raw_parts(recv_buf.cast::<i32>(), N) }.to_vec();
    check("allreduce i32 min in place", &got, &want)?;

    // all-gather f32
    put_f32(send_buf, &data_f32(seed, rank, 3, N));
    poison(recv_buf);
    // SAFETY: N in, 2N out.
    expect(
        "ncclAllGather",
        // SAFETY: N in, 2N out.
        unsafe { all_gather(send_buf, recv_buf, N, 7, comm, null) },
        0,
    )?;
    let want: Vec<f32> = (0..nranks).flat_map(|q| data_f32(seed, q, 3, N)).collect();
    check("allgather f32", &get_f32(recv_buf, nranks * N), &want)?;

    // all-gather of 6 uint8 per rank (moved as 16-bit words)
    let bytes: Vec<u8> = (0..6).map(|i| (rank * 10 + i) as u8).collect();
    // SAFETY: room for 6 bytes.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), send_buf.cast::<u8>(), 6) };
    // SAFETY: 6 bytes in, 12 out.
    expect(
        "ncclAllGather uint8",
        // SAFETY: 6 bytes in, 12 out.
        unsafe { all_gather(send_buf, recv_buf, 6, 1, comm, null) },
        0,
    )?;
    // SAFETY: 12 bytes written by the collective.
    let got = unsafe { std::slice::from_raw_parts(recv_buf.cast::<u8>(), 12) }.to_vec();
    let want: Vec<u8> = (0..nranks)
        .flat_map(|q| (0..6).map(move |i| (q * 10 + i) as u8))
        .collect();
    check("allgather uint8", &got, &want)?;

    // reduce-scatter f32 sum
    put_f32(send_buf, &data_f32(seed, rank, 4, nranks * N));
    poison(recv_buf);
    // SAFETY: 2N in, N out.
    expect(
        "ncclReduceScatter",
        // SAFETY: 2N in, N out.
        unsafe { reduce_scatter(send_buf, recv_buf, N, 7, 0, comm, null) },
        0,
    )?;
    let want: Vec<f32> = (0..N)
        .map(|i| {
            (0..nranks)
                .map(|q| data_f32(seed, q, 4, nranks * N)[rank * N + i])
                .sum()
        })
        .collect();
    check("reducescatter f32 sum", &get_f32(recv_buf, N), &want)?;

    // broadcast from rank 1, then ncclBcast from rank 0 in place
    put_f32(send_buf, &data_f32(seed, rank, 5, N));
    poison(recv_buf);
    // SAFETY: N in, N out.
    expect(
        "ncclBroadcast",
        // SAFETY: N in, N out.
        unsafe { broadcast(send_buf, recv_buf, N, 7, 1, comm, null) },
        0,
    )?;
    check(
        "broadcast root 1",
        &get_f32(recv_buf, N),
        &data_f32(seed, 1, 5, N),
    )?;
    put_f32(recv_buf, &data_f32(seed, rank, 6, N));
    // SAFETY: N in place.
    expect(
        "ncclBcast",
        // SAFETY: N in place.
        unsafe { bcast(recv_buf, N, 7, 0, comm, null) },
        0,
    )?;
    check(
        "bcast root 0",
        &get_f32(recv_buf, N),
        &data_f32(seed, 0, 6, N),
    )?;

    // all-to-all f32
    put_f32(send_buf, &data_f32(seed, rank, 7, nranks * N));
    poison(recv_buf);
    // SAFETY: 2N in, 2N out.
    expect(
        "ncclAlltoAll",
        // SAFETY: 2N in, 2N out.
        unsafe { all_to_all(send_buf, recv_buf, N, 7, comm, null) },
        0,
    )?;
    let want: Vec<f32> = (0..nranks)
        .flat_map(|q| data_f32(seed, q, 7, nranks * N)[rank * N..(rank + 1) * N].to_vec())
        .collect();
    check("alltoall f32", &get_f32(recv_buf, nranks * N), &want)?;

    // all-to-all in place
    put_f32(recv_buf, &data_f32(seed, rank, 9, nranks * N));
    expect(
        "ncclAlltoAll in place",
        // SAFETY: 2N in place.
        unsafe { all_to_all(recv_buf, recv_buf, N, 7, comm, null) },
        0,
    )?;
    let want: Vec<f32> = (0..nranks)
        .flat_map(|q| data_f32(seed, q, 9, nranks * N)[rank * N..(rank + 1) * N].to_vec())
        .collect();
    check(
        "alltoall f32 in place",
        &get_f32(recv_buf, nranks * N),
        &want,
    )?;

    // every other NCCL type natively: all-reduce (odd counts), all-gather, broadcast
    let bytes_in = |p: *mut c_void, v: &[u8]| {
        // SAFETY: `p` has room for nranks * N * 8 bytes; `v` is at most that.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<u8>(), v.len()) }
    };
    let bytes_out = |p: *mut c_void, n: usize| -> Vec<u8> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec()
    };
    // (ncclDataType_t, HAL type, ncclRedOp_t, HAL op, count)
    let cases = [
        (0, DataType::I8, 0, ReduceOp::Sum, 1001),
        (1, DataType::U8, 2, ReduceOp::Max, 7),
        (4, DataType::I64, 1, ReduceOp::Prod, 333),
        (5, DataType::U64, 0, ReduceOp::Sum, 5),
        (8, DataType::F64, 4, ReduceOp::Avg, 999),
        (10, DataType::F8E4M3, 0, ReduceOp::Sum, 501),
        (11, DataType::F8E5M2, 3, ReduceOp::Min, 13),
    ];
    for (salt, &(code, dt, rop, op, cnt)) in cases.iter().enumerate() {
        let salt = 100 + salt as u64;
        let mine = data_of(dt, seed, rank, salt, cnt);
        let all: Vec<Vec<u8>> = (0..nranks)
            .map(|q| data_of(dt, seed, q, salt, cnt))
            .collect();
        bytes_in(send_buf, &mine);
        poison(recv_buf);
        expect(
            &format!("ncclAllReduce {dt} {op}"),
            // SAFETY: `cnt` elements in both buffers.
            unsafe { all_reduce(send_buf, recv_buf, cnt, code, rop, comm, null) },
            0,
        )?;
        let b = cnt * dt.size();
        check(
            &format!("allreduce {dt} {op}"),
            &bytes_out(recv_buf, b),
            &reduced(dt, op, &all),
        )?;
        poison(recv_buf);
        expect(
            &format!("ncclAllGather {dt}"),
            // SAFETY: `cnt` elements in, `nranks * cnt` out.
            unsafe { all_gather(send_buf, recv_buf, cnt, code, comm, null) },
            0,
        )?;
        check(
            &format!("allgather {dt}"),
            &bytes_out(recv_buf, nranks * b),
            &all.concat(),
        )?;
        poison(recv_buf);
        expect(
            &format!("ncclBroadcast {dt}"),
            // SAFETY: `cnt` elements in and out.
            unsafe { broadcast(send_buf, recv_buf, cnt, code, 1, comm, null) },
            0,
        )?;
        check(&format!("broadcast {dt}"), &bytes_out(recv_buf, b), &all[1])?;
    }

    // reduce: f32 sum to rank 1; i64 max in place to rank 0 (the other rank's buffer stays);
    // 3 Mi f32 (two all-reduces of the 8 MiB chunks) to rank 0
    put_f32(send_buf, &data_f32(seed, rank, 10, N));
    poison(recv_buf);
    expect(
        "ncclReduce",
        // SAFETY: N in, N out (read on the root only).
        unsafe { reduce(send_buf, recv_buf, N, 7, 0, 1, comm, null) },
        0,
    )?;
    if rank == 1 {
        let want: Vec<f32> = (0..N)
            .map(|i| (0..nranks).map(|q| data_f32(seed, q, 10, N)[i]).sum())
            .collect();
        check("reduce f32 sum to 1", &get_f32(recv_buf, N), &want)?;
    } else if !get_f32(recv_buf, N).iter().all(|x| x.is_nan()) {
        return Err("ncclReduce wrote the output of a rank other than the root".into());
    }
    check(
        "reduce's input",
        &get_f32(send_buf, N),
        &data_f32(seed, rank, 10, N),
    )?;
    let mine = data_of(DataType::I64, seed, rank, 11, N);
    bytes_in(recv_buf, &mine);
    expect(
        "ncclReduce in place",
        // SAFETY: N i64 in place.
        unsafe { reduce(recv_buf, recv_buf, N, 4, 2, 0, comm, null) },
        0,
    )?;
    let want = if rank == 0 {
        let all: Vec<Vec<u8>> = (0..nranks)
            .map(|q| data_of(DataType::I64, seed, q, 11, N))
            .collect();
        reduced(DataType::I64, ReduceOp::Max, &all)
    } else {
        mine
    };
    check(
        "reduce i64 max in place",
        &bytes_out(recv_buf, N * 8),
        &want,
    )?;
    const BIG: usize = 3 << 20;
    let big_in = alloc(BIG * 4)?;
    let big_out = alloc(BIG * 4)?;
    // SAFETY: BIG f32 in each.
    let (bi, bo) = unsafe {
        (
            std::slice::from_raw_parts_mut(big_in.cast::<f32>(), BIG),
            std::slice::from_raw_parts_mut(big_out.cast::<f32>(), BIG),
        )
    };
    for (i, x) in bi.iter_mut().enumerate() {
        *x = (i % 1000) as f32 + rank as f32;
    }
    bo.fill(f32::NAN);
    expect(
        "ncclReduce of 12 MiB",
        // SAFETY: BIG f32 in and out.
        unsafe { reduce(big_in, big_out, BIG, 7, 0, 0, comm, null) },
        0,
    )?;
    if rank == 0 {
        if let Some(i) = (0..BIG).find(|&i| bo[i] != (2 * (i % 1000) + 1) as f32) {
            return Err(format!("reduce of 12 MiB: element {i} is {}", bo[i]));
        }
    }
    // SAFETY: buffers of ncclMemAlloc, no longer used.
    unsafe {
        expect("ncclMemFree", mem_free(big_in), 0)?;
        expect("ncclMemFree", mem_free(big_out), 0)?;
    }

    // a group of native operations
    put_f32(send_buf, &data_f32(seed, rank, 8, N));
    // SAFETY: as for the all-reduce above.
    unsafe {
        expect("ncclGroupStart", group_start(), 0)?;
        expect("ncclGroupStart (nested)", group_start(), 0)?;
        expect(
            "ncclAllReduce in group",
            all_reduce(send_buf, recv_buf, N, 7, 0, comm, null),
            0,
        )?;
        expect("ncclGroupEnd (inner)", group_end(), 0)?;
        expect("ncclGroupEnd (outer)", group_end(), 0)?;
        expect("ncclGroupEnd without start", group_end(), 5)?;
    }
    let want: Vec<f32> = (0..N)
        .map(|i| (0..nranks).map(|q| data_f32(seed, q, 8, N)[i]).sum())
        .collect();
    check("allreduce in a group", &get_f32(recv_buf, N), &want)?;

    // send/recv natively: alone, exchanged in a group (several rounds each way), with a copy to
    // oneself, uneven sizes (PyTorch's all_to_all_single), and a size mismatch
    let peer = 1 - rank;
    let msg = |from: usize, salt: u64, n: usize| data_f32(seed, from, 200 + salt, n);
    poison(recv_buf);
    if rank == 0 {
        put_f32(send_buf, &msg(0, 0, N));
        // SAFETY: N f32.
        expect(
            "ncclSend alone",
            // SAFETY: N f32.
            unsafe { send(send_buf, N, 7, 1, comm, null) },
            0,
        )?;
    } else {
        // SAFETY: N f32.
        expect(
            "ncclRecv alone",
            // SAFETY: N f32.
            unsafe { recv(recv_buf, N, 7, 0, comm, null) },
            0,
        )?;
        check("recv alone", &get_f32(recv_buf, N), &msg(0, 0, N))?;
    }
    const X: usize = 300_000; // 1.2 MB each way: rounds of 128 KiB
    let xs = alloc(2 * X * 4)?;
    let xr = alloc(2 * X * 4)?;
    let put = |p: *mut c_void, off: usize, v: &[f32]| {
        // SAFETY: `p` has room for 2 X f32.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<f32>().add(off), v.len()) }
    };
    let get = |p: *mut c_void, off: usize, n: usize| -> Vec<f32> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p.cast::<f32>().add(off), n) }.to_vec()
    };
    put(xs, 0, &msg(rank, 1, X));
    put(xs, X, &msg(rank, 2, 7));
    // SAFETY: the buffers hold what each operation names.
    unsafe {
        expect("ncclGroupStart", group_start(), 0)?;
        // Receive first on one rank, send first on the other: the order inside a group is free.
        if rank == 0 {
            expect(
                "ncclRecv in group",
                recv(xr, X, 7, peer as c_int, comm, null),
                0,
            )?;
            expect(
                "ncclSend in group",
                send(xs, X, 7, peer as c_int, comm, null),
                0,
            )?;
        } else {
            expect(
                "ncclSend in group",
                send(xs, X, 7, peer as c_int, comm, null),
                0,
            )?;
            expect(
                "ncclRecv in group",
                recv(xr, X, 7, peer as c_int, comm, null),
                0,
            )?;
        }
        // to oneself
        expect(
            "ncclSend to self",
            send(
                xs.cast::<f32>().add(X).cast(),
                7,
                7,
                rank as c_int,
                comm,
                null,
            ),
            0,
        )?;
        expect(
            "ncclRecv from self",
            recv(
                xr.cast::<f32>().add(X).cast(),
                7,
                7,
                rank as c_int,
                comm,
                null,
            ),
            0,
        )?;
        expect("ncclGroupEnd", group_end(), 0)?;
    }
    check("exchange in a group", &get(xr, 0, X), &msg(peer, 1, X))?;
    check("send to oneself", &get(xr, X, 7), &msg(rank, 2, 7))?;
    // uneven all-to-all: rank r sends 3 + 5 r + 2 p elements to rank p (0 from rank 0 to 1)
    let sz = |r: usize, p: usize| {
        if (r, p) == (0, 1) {
            0
        } else {
            3 + 5 * r + 2 * p
        }
    };
    let (mut so, mut ro) = (0, 0);
    // SAFETY: the offsets stay within 2 X f32.
    unsafe {
        expect("ncclGroupStart", group_start(), 0)?;
        for p in 0..nranks {
            put(xs, so, &msg(rank, 10 + p as u64, sz(rank, p)));
            expect(
                "ncclSend a2av",
                send(
                    xs.cast::<f32>().add(so).cast(),
                    sz(rank, p),
                    7,
                    p as c_int,
                    comm,
                    null,
                ),
                0,
            )?;
            expect(
                "ncclRecv a2av",
                recv(
                    xr.cast::<f32>().add(ro).cast(),
                    sz(p, rank),
                    7,
                    p as c_int,
                    comm,
                    null,
                ),
                0,
            )?;
            so += sz(rank, p);
            ro += sz(p, rank);
        }
        expect("ncclGroupEnd", group_end(), 0)?;
    }
    let mut ro = 0;
    for p in 0..nranks {
        check(
            &format!("a2av from {p}"),
            &get(xr, ro, sz(p, rank)),
            &msg(p, 10 + rank as u64, sz(p, rank)),
        )?;
        ro += sz(p, rank);
    }
    // NCCL 2.28's ncclGather / ncclScatter (nccl-tests calls them directly): 1000 f32 per rank,
    // root = the last rank; outputs poisoned first.
    const G: usize = 1000;
    let root = nranks - 1;
    put(xs, 0, &msg(rank, 30, G));
    put(xr, 0, &vec![f32::NAN; nranks * G]);
    expect(
        "ncclGather",
        // SAFETY: xs holds G f32, xr nranks * G (at most 2 X).
        unsafe { gather(xs, xr, G, 7, root as c_int, comm, null) },
        0,
    )?;
    if rank == root {
        for p in 0..nranks {
            check(
                &format!("gather block {p}"),
                &get(xr, p * G, G),
                &msg(p, 30, G),
            )?;
        }
    }
    if rank == root {
        for p in 0..nranks {
            put(xs, p * G, &msg(p, 40, G));
        }
    }
    put(xr, 0, &vec![f32::NAN; G]);
    expect(
        "ncclScatter",
        // SAFETY: the root's xs holds nranks * G f32, xr G.
        unsafe { scatter(xs, xr, G, 7, root as c_int, comm, null) },
        0,
    )?;
    check("scatter", &get(xr, 0, G), &msg(rank, 40, G))?;
    // a mismatch: rank 0 sends 100 elements, rank 1 receives 64: rank 1 fails naming both
    if rank == 0 {
        // SAFETY: 100 f32 fit.
        expect(
            "ncclSend of 100",
            // SAFETY: 100 f32 fit.
            unsafe { send(xs, 100, 7, 1, comm, null) },
            0,
        )?;
    } else {
        // SAFETY: as above.
        let r = unsafe { recv(xr, 64, 7, 0, comm, null) };
        let m = last();
        if r == 0 || !(m.contains("rank 0 sent 400 bytes to rank 1") && m.contains("256")) {
            return Err(format!("a size mismatch: returned {r}, last error {m:?}"));
        }
    }
    // SAFETY: no longer used.
    unsafe {
        expect("ncclMemFree", mem_free(xs), 0)?;
        expect("ncclMemFree", mem_free(xr), 0)?;
    }

    // error paths: none of these may reach the other rank, so both ranks make the same calls
    // SAFETY: each export checks its arguments before using them.
    unsafe {
        expect(
            "ncclAllReduce NULL sendbuff",
            all_reduce(null, recv_buf, N, 7, 0, comm, null),
            4,
        )?;
        expect(
            "ncclAllReduce NULL recvbuff",
            all_reduce(send_buf, null, N, 7, 0, comm, null),
            4,
        )?;
        expect(
            "ncclAllReduce NULL comm",
            all_reduce(send_buf, recv_buf, N, 7, 0, null, null),
            4,
        )?;
        expect(
            "ncclAllReduce bogus comm",
            all_reduce(send_buf, recv_buf, N, 7, 0, 0x1234 as Comm, null),
            4,
        )?;
        expect(
            "ncclAllReduce dtype 42",
            all_reduce(send_buf, recv_buf, N, 42, 0, comm, null),
            4,
        )?;
        let msg = last();
        if !(msg.contains("42") && msg.contains("ncclDataType_t")) {
            return Err(format!("last error after an unknown dtype: {msg:?}"));
        }
        expect(
            "ncclAllReduce op -1",
            all_reduce(send_buf, recv_buf, N, 7, -1, comm, null),
            4,
        )?;
        expect(
            "ncclAllReduce with a stream on host",
            all_reduce(send_buf, recv_buf, N, 7, 0, comm, 0x10 as *mut c_void),
            4,
        )?;
        expect("ncclSend bad peer", send(send_buf, N, 7, 7, comm, null), 4)?;
        let mut child: Comm = std::ptr::null_mut();
        expect(
            "ncclCommSplit natively",
            split(comm, 0, rank as c_int, &mut child, null),
            0,
        )?;
        if child.is_null() || child == comm {
            return Err(format!("ncclCommSplit gave {child:p}"));
        }
        expect("ncclCommDestroy of the child", destroy(child), 0)?;
        let mut h: *mut c_void = std::ptr::null_mut();
        expect("ncclCommRegister", register(comm, send_buf, N, &mut h), 0)?;
        expect("ncclCommDeregister", deregister(comm, h), 0)?;
        expect("ncclCommDeregister twice", deregister(comm, h), 4)?;
        expect("ncclMemFree unknown", mem_free(0x4321 as *mut c_void), 4)?;
    }
    // a zero-count call is a no-op
    // SAFETY: nothing is touched.
    expect(
        "ncclAllReduce count 0",
        // SAFETY: nothing is touched.
        unsafe { all_reduce(send_buf, recv_buf, 0, 7, 0, comm, null) },
        0,
    )?;

    // SAFETY: live comm, then the same handle again (now stale).
    unsafe {
        expect("ncclCommDestroy", destroy(comm), 0)?;
        expect("ncclCommDestroy twice", destroy(comm), 4)?;
        expect("ncclMemFree", mem_free(send_buf), 0)?;
        expect("ncclMemFree", mem_free(recv_buf), 0)?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// `ncclCommProperties_t` of NCCL 2.30 (`nccl_device/core.h`).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct Props {
    size: usize,
    magic: u32,
    version: u32,
    rank: c_int,
    n_ranks: c_int,
    cuda_dev: c_int,
    nvml_dev: c_int,
    device_api: bool,
    multimem: bool,
    gin: c_int,
    n_lsa: c_int,
    host_rma: bool,
    railed_gin: c_int,
}

/// `ncclTeam_t` (passed by value).
#[repr(C)]
#[derive(Clone, Copy)]
struct Team {
    n_ranks: c_int,
    rank: c_int,
    stride: c_int,
}

/// `ncclPutSignal`: (localbuff, count, datatype, peer, peerWin, peerWinOffset, sigIdx, ctx,
/// flags, comm, stream).
type PutSignalFn = unsafe extern "C" fn(
    *const c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    usize,
    c_int,
    c_int,
    u32,
    Comm,
    *mut c_void,
) -> c_int;

/// One rank's body for the exports NCCL added after 2.28 (a child process): each one works on
/// the host backend or returns its documented error, naming itself in `ncclGetLastError`.
fn rank_main_230(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let cu_device = sym!(lib, "ncclCommCuDevice", fn(Comm, *mut c_int) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let mem_free = sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let shrink = sym!(
        lib,
        "ncclCommShrink",
        fn(Comm, *mut c_int, c_int, *mut Comm, *mut c_void, c_int) -> c_int
    );
    let win_reg = sym!(
        lib,
        "ncclCommWindowRegister",
        fn(Comm, *mut c_void, usize, *mut *mut c_void, c_int) -> c_int
    );
    let win_dereg = sym!(
        lib,
        "ncclCommWindowDeregister",
        fn(Comm, *mut c_void) -> c_int
    );
    let revoke = sym!(lib, "ncclCommRevoke", fn(Comm, c_int) -> c_int);
    let async_err = sym!(lib, "ncclCommGetAsyncError", fn(Comm, *mut c_int) -> c_int);
    let comm_get_id = sym!(
        lib,
        "ncclCommGetUniqueId",
        fn(Comm, *mut NcclUniqueId) -> c_int
    );
    let grow = sym!(
        lib,
        "ncclCommGrow",
        fn(Comm, c_int, *const NcclUniqueId, c_int, *mut Comm, *mut c_void) -> c_int
    );
    let suspend = sym!(lib, "ncclCommSuspend", fn(Comm, c_int) -> c_int);
    let resume = sym!(lib, "ncclCommResume", fn(Comm) -> c_int);
    let mem_stats = sym!(lib, "ncclCommMemStats", fn(Comm, c_int, *mut u64) -> c_int);
    let user_ptr = sym!(
        lib,
        "ncclWinGetUserPtr",
        fn(Comm, *mut c_void, *mut *mut c_void) -> c_int
    );
    let put_signal = sym!(lib, "ncclPutSignal" as PutSignalFn);
    let signal = sym!(
        lib,
        "ncclSignal",
        fn(c_int, c_int, c_int, u32, Comm, *mut c_void) -> c_int
    );
    let wait_signal = sym!(
        lib,
        "ncclWaitSignal",
        fn(c_int, *mut c_void, Comm, *mut c_void) -> c_int
    );
    let query = sym!(
        lib,
        "ncclCommQueryProperties",
        fn(Comm, *mut Props) -> c_int
    );
    let peer_ptr = sym!(
        lib,
        "ncclGetPeerDevicePointer",
        fn(*mut c_void, usize, c_int, *mut *mut c_void) -> c_int
    );
    let gin_barrier = sym!(
        lib,
        "ncclGinBarrierCreateRequirement",
        fn(Comm, Team, c_int, *mut c_void, *mut c_void) -> c_int
    );
    let param_bind = sym!(
        lib,
        "ncclParamBind",
        fn(*mut *mut c_void, *const c_char) -> c_int
    );
    let param_i32 = sym!(lib, "ncclParamGetI32", fn(*mut c_void, *mut i32) -> c_int);
    let param_str = sym!(
        lib,
        "ncclParamGetStr",
        fn(*mut c_void, *mut *const c_char) -> c_int
    );
    let param_get = sym!(
        lib,
        "ncclParamGet",
        fn(*mut c_void, *mut c_void, c_int, *mut c_int) -> c_int
    );
    let param_value = sym!(
        lib,
        "ncclParamGetParameter",
        fn(*const c_char, *mut *const c_char, *mut c_int) -> c_int
    );
    let param_keys = sym!(
        lib,
        "ncclParamGetAllParameterKeys",
        fn(*mut *const *const c_char, *mut c_int) -> c_int
    );
    // SAFETY: `void ncclParamDumpAll(void)` and `void ncclResetDebugInit(void)`.
    let (param_dump, reset_debug) = unsafe {
        (
            *lib.get::<unsafe extern "C" fn()>(b"ncclParamDumpAll\0")
                .map_err(|e| format!("ncclParamDumpAll: {e}"))?,
            *lib.get::<unsafe extern "C" fn()>(b"ncclResetDebugInit\0")
                .map_err(|e| format!("ncclResetDebugInit: {e}"))?,
        )
    };
    let last = || {
        // SAFETY: the library's thread-local NUL-terminated message.
        unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }
            .to_string_lossy()
            .into_owned()
    };
    let expect = |what: &str, got: c_int, want: c_int| -> Result<(), String> {
        if got != want {
            return Err(format!(
                "{what}: returned {got}, expected {want} (last error: {})",
                last()
            ));
        }
        Ok(())
    };
    // The error and a message that names the function and says why.
    let refused = |what: &str, got: c_int, want: c_int, words: &[&str]| -> Result<(), String> {
        expect(what, got, want)?;
        let m = last();
        if let Some(w) = words.iter().find(|w| !m.contains(*w)) {
            return Err(format!("{what}: last error {m:?} lacks {w:?}"));
        }
        Ok(())
    };

    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        expect("ncclGetUniqueId", unsafe { get_id(&mut id) }, 0)?;
        publish(dir, &id.internal)?;
        id
    } else {
        let b = wait_published(dir, 128)?;
        let mut id = NcclUniqueId { internal: [0; 128] };
        id.internal.copy_from_slice(&b[..128]);
        id
    };
    let mut comm: Comm = std::ptr::null_mut();
    expect(
        "ncclCommInitRank",
        // SAFETY: valid out-pointer.
        unsafe { init(&mut comm, 2, id, rank as c_int) },
        0,
    )?;
    let null = std::ptr::null_mut::<c_void>();
    let peer = (1 - rank) as c_int;
    let bogus = 0x1234 as *mut c_void;

    // ncclCommQueryProperties: NCCL 2.30's struct filled; 2.29.2's (40 bytes) only as far as
    // its size; the magic checked
    let mut dev: c_int = -1;
    // SAFETY: valid out-pointer.
    expect("ncclCommCuDevice", unsafe { cu_device(comm, &mut dev) }, 0)?;
    let fresh = |size: usize, version: u32| Props {
        size,
        magic: 0xcafe_beef,
        version,
        rank: -7,
        n_ranks: -7,
        cuda_dev: -7,
        nvml_dev: -7,
        device_api: true,
        multimem: true,
        gin: 77,
        n_lsa: 77,
        host_rma: true,
        railed_gin: 77,
    };
    let mut p = fresh(std::mem::size_of::<Props>(), 23007);
    // SAFETY: a whole 2.30 struct.
    expect("ncclCommQueryProperties", unsafe { query(comm, &mut p) }, 0)?;
    let got = (
        p.rank,
        p.n_ranks,
        p.cuda_dev,
        p.nvml_dev,
        p.device_api,
        p.multimem,
        p.gin,
        p.n_lsa,
        p.host_rma,
        p.railed_gin,
    );
    // The device API is served: the host backend has shareable memory; both ranks share one
    // host, so one LSA team, and GIN of the proxy type (2); no multicast.
    if got != (rank as c_int, 2, dev, -1, true, false, 2, 1, false, 2) {
        return Err(format!("ncclCommQueryProperties (2.30 struct): {p:?}"));
    }
    let mut p = fresh(40, 22902);
    expect(
        "ncclCommQueryProperties 2.29.2",
        // SAFETY: the struct is larger than the 40 bytes it claims.
        unsafe { query(comm, &mut p) },
        0,
    )?;
    if (p.rank, p.n_ranks, p.gin, p.n_lsa, p.host_rma, p.railed_gin)
        != (rank as c_int, 2, 0, 77, true, 77)
    {
        return Err(format!("ncclCommQueryProperties (2.29.2 struct): {p:?}"));
    }
    let mut p = fresh(std::mem::size_of::<Props>(), 23007);
    p.magic = 0;
    // SAFETY: as above.
    unsafe {
        refused(
            "ncclCommQueryProperties without the magic",
            query(comm, &mut p),
            5,
            &[
                "ncclCommQueryProperties",
                "NCCL_COMM_PROPERTIES_INITIALIZER",
            ],
        )?;
        refused(
            "ncclCommQueryProperties NULL",
            query(comm, std::ptr::null_mut()),
            4,
            &["ncclCommQueryProperties", "props"],
        )?;
        expect(
            "ncclCommQueryProperties bogus comm",
            query(bogus, &mut p),
            4,
        )?;
    }

    // ncclWinGetUserPtr: the window's address (ncclMemAlloc memory, at an offset); a window of
    // other memory, NULLs, foreign and stale windows refused
    let mut buf: *mut c_void = null;
    // SAFETY: valid out-pointer.
    expect("ncclMemAlloc", unsafe { mem_alloc(&mut buf, 8192) }, 0)?;
    let at = buf.cast::<u8>().wrapping_add(64).cast::<c_void>();
    let mut host = vec![0u8; 4096];
    let (mut w, mut w2, mut up) = (null, null, null);
    // SAFETY: ranges within the buffers; valid out-pointers; every rank makes the same calls.
    unsafe {
        expect(
            "ncclCommWindowRegister",
            win_reg(comm, at, 1024, &mut w, 0),
            0,
        )?;
        expect("ncclWinGetUserPtr", user_ptr(comm, w, &mut up), 0)?;
        if up != at {
            return Err(format!(
                "ncclWinGetUserPtr gave {up:p}, registered at {at:p}"
            ));
        }
        refused(
            "ncclWinGetUserPtr NULL out",
            user_ptr(comm, w, std::ptr::null_mut()),
            4,
            &["ncclWinGetUserPtr", "outUserPtr"],
        )?;
        expect(
            "ncclWinGetUserPtr NULL win",
            user_ptr(comm, null, &mut up),
            4,
        )?;
        expect(
            "ncclWinGetUserPtr bogus win",
            user_ptr(comm, bogus, &mut up),
            4,
        )?;
        refused(
            "ncclGetPeerDevicePointer of a window 64 bytes into its ncclMemAlloc allocation",
            peer_ptr(w, 0, peer, &mut up),
            5,
            &["ncclGetPeerDevicePointer", "no device window"],
        )?;
        expect(
            "ncclCommWindowRegister of host memory",
            win_reg(comm, host.as_mut_ptr().cast(), host.len(), &mut w2, 0),
            0,
        )?;
        refused(
            "ncclWinGetUserPtr of a window not in ncclMemAlloc memory",
            user_ptr(comm, w2, &mut up),
            5,
            &["ncclWinGetUserPtr", "ncclMemAlloc"],
        )?;
        expect("ncclCommWindowDeregister", win_dereg(comm, w2), 0)?;
        expect("ncclCommWindowDeregister", win_dereg(comm, w), 0)?;
        expect("ncclWinGetUserPtr stale win", user_ptr(comm, w, &mut up), 4)?;
    }

    // memory: the collectives' memory suspended and resumed on both ranks, counted
    let mut v: u64 = 99;
    let (mut susp, mut persist, mut total) = (0u64, 0u64, 0u64);
    let null_stream = std::ptr::null_mut();
    // SAFETY: valid out-pointers; host buffers for the all-reduces.
    unsafe {
        expect("ncclCommMemStats Suspend", mem_stats(comm, 0, &mut susp), 0)?;
        expect("ncclCommMemStats Suspended", mem_stats(comm, 1, &mut v), 0)?;
        expect("ncclCommMemStats Suspended value", v as c_int, 0)?;
        expect(
            "ncclCommMemStats Persist",
            mem_stats(comm, 2, &mut persist),
            0,
        )?;
        expect("ncclCommMemStats Total", mem_stats(comm, 3, &mut total), 0)?;
        if susp == 0 || total != susp + persist {
            return Err(format!(
                "memory stats: suspendable {susp}, persistent {persist}, total {total}"
            ));
        }
        expect("ncclCommMemStats stat 9", mem_stats(comm, 9, &mut v), 4)?;
        expect(
            "ncclCommMemStats NULL",
            mem_stats(comm, 0, std::ptr::null_mut()),
            4,
        )?;
        expect("ncclCommSuspend no flag", suspend(comm, 0), 0)?;
        expect("ncclCommSuspend unknown flag", suspend(comm, 4), 4)?;
        refused(
            "ncclCommResume before a suspend",
            resume(comm),
            5,
            &["ncclCommResume", "not suspended"],
        )?;
        expect("ncclCommSuspend NCCL_SUSPEND_MEM", suspend(comm, 1), 0)?;
        expect("ncclCommMemStats Suspended", mem_stats(comm, 1, &mut v), 0)?;
        expect("ncclCommMemStats Suspended value", v as c_int, 1)?;
        expect("ncclCommMemStats Suspend", mem_stats(comm, 0, &mut v), 0)?;
        expect(
            "ncclCommMemStats Suspend value when suspended",
            v as c_int,
            0,
        )?;
        let mut y = vec![0.0f32; 64];
        let p = y.as_mut_ptr().cast::<c_void>();
        let rc = all_reduce(p, p, 64, 7, 0, comm, null_stream);
        if rc == 0 {
            return Err("an all-reduce on a suspended communicator ran".into());
        }
        let msg = CStr::from_ptr(last_err(std::ptr::null_mut()))
            .to_string_lossy()
            .into_owned();
        if !msg.contains("suspended") {
            return Err(format!("the refusal does not say suspended: {msg}"));
        }
        expect("ncclCommResume", resume(comm), 0)?;
        expect("ncclCommMemStats Suspended", mem_stats(comm, 1, &mut v), 0)?;
        expect("ncclCommMemStats Suspended value", v as c_int, 0)?;
        expect("ncclCommMemStats Suspend", mem_stats(comm, 0, &mut v), 0)?;
        if v != susp {
            return Err(format!("resumed collectives hold {v} bytes, first {susp}"));
        }
        // The resumed collectives are right, on fresh data into a poisoned output.
        let n = 3000;
        let x = data_f32(0x5e5, rank, 91, n);
        let mut out = vec![f32::NAN; n];
        expect(
            "ncclAllReduce after resume",
            all_reduce(
                x.as_ptr().cast(),
                out.as_mut_ptr().cast(),
                n,
                7,
                0,
                comm,
                null_stream,
            ),
            0,
        )?;
        let want: Vec<f32> = (0..n)
            .map(|i| data_f32(0x5e5, 0, 91, n)[i] + data_f32(0x5e5, 1, 91, n)[i])
            .collect();
        check("all-reduce after suspend and resume", &out, &want)?;
        // A registered window lives in the collectives' registrations: no suspend until it is
        // deregistered.
        let (mut wb, mut win): (*mut c_void, *mut c_void) = (null_stream, null_stream);
        expect("ncclMemAlloc", mem_alloc(&mut wb, 1 << 16), 0)?;
        expect(
            "ncclCommWindowRegister",
            win_reg(comm, wb, 1 << 16, &mut win, 0),
            0,
        )?;
        refused(
            "ncclCommSuspend with a window",
            suspend(comm, 1),
            5,
            &["window", "deregister"],
        )?;
        expect("ncclCommWindowDeregister", win_dereg(comm, win), 0)?;
        expect("ncclMemFree", mem_free(wb), 0)?;
        expect("ncclCommSuspend bogus comm", suspend(bogus, 0), 4)?;
    }

    // grow's argument checks (growing itself: tests/grow.rs)
    let mut gid = NcclUniqueId { internal: [0; 128] };
    let mut nc: Comm = null;
    // SAFETY: valid pointers; nothing is created.
    unsafe {
        expect(
            "ncclCommGetUniqueId NULL",
            comm_get_id(comm, std::ptr::null_mut()),
            4,
        )?;
        expect("ncclCommGetUniqueId", comm_get_id(comm, &mut gid), 0)?;
        expect("ncclCommGetUniqueId again", comm_get_id(comm, &mut gid), 0)?;
        expect(
            "ncclCommGrow with a rank",
            grow(comm, 3, std::ptr::null(), 1, &mut nc, null),
            4,
        )?;
        expect(
            "ncclCommGrow not larger",
            grow(comm, 2, std::ptr::null(), -1, &mut nc, null),
            4,
        )?;
        expect(
            "ncclCommGrow NULL newcomm",
            grow(comm, 3, std::ptr::null(), -1, std::ptr::null_mut(), null),
            4,
        )?;
        expect(
            "ncclCommGrow as a new rank without an id",
            grow(std::ptr::null_mut(), 3, std::ptr::null(), 2, &mut nc, null),
            4,
        )?;
        expect(
            "ncclCommGrow as a new rank out of range",
            grow(std::ptr::null_mut(), 3, &gid, 3, &mut nc, null),
            4,
        )?;
        if !nc.is_null() {
            return Err(format!("ncclCommGrow wrote {nc:p}"));
        }
    }

    // one-sided operations and the device API's requirements: not supported
    // SAFETY: nothing is read or written by the refused calls.
    unsafe {
        refused(
            "ncclPutSignal",
            put_signal(buf, 4, 7, peer, null, 0, 0, 0, 0, comm, null),
            5,
            &["ncclPutSignal", "not supported"],
        )?;
        refused(
            "ncclSignal",
            signal(peer, 0, 0, 0, comm, null),
            5,
            &["ncclSignal", "not supported"],
        )?;
        let mut desc = [1 as c_int, peer, 0, 0];
        refused(
            "ncclWaitSignal",
            wait_signal(1, desc.as_mut_ptr().cast(), comm, null),
            5,
            &["ncclWaitSignal", "not supported"],
        )?;
        expect(
            "ncclWaitSignal nDesc -1",
            wait_signal(-1, desc.as_mut_ptr().cast(), comm, null),
            4,
        )?;
        expect(
            "ncclPutSignal bogus comm",
            put_signal(buf, 4, 7, peer, null, 0, 0, 0, 0, bogus, null),
            4,
        )?;
        let team = Team {
            n_ranks: 2,
            rank: rank as c_int,
            stride: 1,
        };
        let mut h = [0xffu8; 8];
        let mut req = [0xffu8; 56];
        expect(
            "ncclGinBarrierCreateRequirement",
            gin_barrier(
                comm,
                team,
                3,
                h.as_mut_ptr().cast(),
                req.as_mut_ptr().cast(),
            ),
            0,
        )?;
        // 3 barriers of max(2, 2) signals; outGinSignalStart -> the handle's signal0.
        let signals = i32::from_le_bytes(req[32..36].try_into().unwrap_or_default());
        let start = u64::from_le_bytes(req[40..48].try_into().unwrap_or_default());
        if signals != 6 || start != h.as_ptr() as u64 || h != [0; 8] || req[..32] != [0; 32] {
            return Err(format!(
                "ncclGinBarrierCreateRequirement: {signals} signals, start {start:#x} (handle at {:p}), handle {h:?}",
                h.as_ptr()
            ));
        }
    }

    // parameters: an empty registry, answered as NCCL answers unknown keys
    let (mut h, mut x, mut sv, mut len) = (null, 0i32, std::ptr::null::<c_char>(), 5 as c_int);
    let mut keys: *const *const c_char = std::ptr::null();
    // SAFETY: NUL-terminated keys, valid out-pointers (or NULL where the export checks it).
    unsafe {
        refused(
            "ncclParamBind",
            param_bind(&mut h, c"NCCL_DEBUG".as_ptr()),
            4,
            &["ncclParamBind", "NCCL_DEBUG"],
        )?;
        expect(
            "ncclParamBind NULL out",
            param_bind(std::ptr::null_mut(), c"NCCL_DEBUG".as_ptr()),
            4,
        )?;
        expect("ncclParamGetI32 NULL handle", param_i32(null, &mut x), 4)?;
        refused(
            "ncclParamGetI32 bogus handle",
            param_i32(bogus, &mut x),
            4,
            &["ncclParamGetI32"],
        )?;
        expect("ncclParamGetStr", param_str(bogus, &mut sv), 4)?;
        let mut raw = [0u8; 8];
        expect(
            "ncclParamGet",
            param_get(bogus, raw.as_mut_ptr().cast(), 8, &mut len),
            4,
        )?;
        sv = c"sentinel".as_ptr();
        refused(
            "ncclParamGetParameter",
            param_value(c"NCCL_DEBUG".as_ptr(), &mut sv, &mut len),
            4,
            &["ncclParamGetParameter", "NCCL_DEBUG"],
        )?;
        if !sv.is_null() || len != 0 {
            return Err(format!(
                "ncclParamGetParameter of an unknown key left {sv:p} / {len}"
            ));
        }
        expect(
            "ncclParamGetAllParameterKeys",
            param_keys(&mut keys, &mut len),
            0,
        )?;
        if keys.is_null() || len != 0 {
            return Err(format!(
                "ncclParamGetAllParameterKeys gave {keys:p} / {len}"
            ));
        }
        expect(
            "ncclParamGetAllParameterKeys NULL",
            param_keys(std::ptr::null_mut(), &mut len),
            4,
        )?;
        param_dump();
        reset_debug();
    }

    // revoke: operations refused from then on, a second revoke too; shrink and destroy still
    // work, and the shrunk communicator runs
    let mut child: Comm = null;
    // SAFETY: live handles, valid out-pointers, NCCL's buffers.
    unsafe {
        expect("ncclCommRevoke NULL", revoke(std::ptr::null_mut(), 0), 0)?;
        expect("ncclCommRevoke flags 1", revoke(comm, 1), 4)?;
        expect("ncclCommRevoke", revoke(comm, 0), 0)?;
        // NCCL's sequence: revoke, poll until quiescent (ncclSuccess), shrink.
        let mut ae = -1;
        expect(
            "ncclCommGetAsyncError after revoke",
            async_err(comm, &mut ae),
            0,
        )?;
        expect("the async error of a revoked, quiescent comm", ae, 0)?;
        expect(
            "ncclAllReduce after ncclCommRevoke",
            all_reduce(buf, buf, 4, 7, 0, comm, null),
            5,
        )?;
        refused(
            "ncclCommRevoke twice",
            revoke(comm, 0),
            4,
            &["ncclCommRevoke", "revoked already"],
        )?;
        expect(
            "ncclCommShrink of the revoked communicator",
            shrink(comm, std::ptr::null_mut(), 0, &mut child, null, 0),
            0,
        )?;
        let f = buf.cast::<f32>();
        for i in 0..16 {
            f.add(i).write((rank + 1) as f32);
        }
        expect(
            "ncclAllReduce on the shrunk communicator",
            all_reduce(buf, buf, 16, 7, 0, child, null),
            0,
        )?;
        let got = std::slice::from_raw_parts(f, 16);
        if got.iter().any(|&v| v != 3.0) {
            return Err(format!(
                "all-reduce after shrinking a revoked comm: {got:?}"
            ));
        }
        expect("ncclCommDestroy of the child", destroy(child), 0)?;
        expect("ncclCommDestroy of the revoked comm", destroy(comm), 0)?;
        expect("ncclMemFree", mem_free(buf), 0)?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

fn two_ranks_host() -> Result<(), Failed> {
    two_ranks(ROLE_VAR, DIR_VAR, "abi")
}

fn two_ranks_230() -> Result<(), Failed> {
    two_ranks(ROLE_230_VAR, DIR_230_VAR, "abi-230")
}

/// Runs this binary as ranks 0 and 1 (`role_var`) sharing a fresh directory (`dir_var`).
fn two_ranks(role_var: &str, dir_var: &str, tag: &str) -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir(tag)?;
    let mut children = Vec::new();
    for rank in 0..2 {
        let child = rank_command(role_var, dir_var, rank, &dir)?
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failures = Vec::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, _) = wait_or_kill(child, deadline, Duration::from_millis(20))?;
        if !out.status.success() {
            failures.push(rank_failure(rank, &out));
        }
    }
    for rank in 0..2 {
        if failures.is_empty() && !dir.join(format!("done-{rank}")).exists() {
            failures.push(format!(
                "rank {rank} exited successfully without finishing its checks"
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

/// `MSCCLPP_NCCL_LIB_PATH` naming this library: the binding of the real NCCL refuses it with
/// an error naming the path (forwarding to ourselves recursed until the stack overflowed).
fn refused_as_the_real_nccl() -> Result<(), Failed> {
    let p = lib_path()?;
    let path = p.to_string_lossy();
    let e = match mscclpp_nccl_real::RealNccl::open(&path, "MSCCLPP_NCCL_LIB_PATH") {
        Ok(real) => return Err(format!("{real:?} was taken for the real NCCL").into()),
        Err(e) => e,
    };
    let text = e.to_string();
    if e.class() != mscclpp::hal::ErrorClass::InvalidUsage
        || !text.contains(&*path)
        || !text.contains("libmscclpp_nccl")
    {
        return Err(format!("unexpected error: {text}").into());
    }
    Ok(())
}

const STALE_VAR: &str = "MSCCLPP_NCCL_ABI_TEST_STALE";

/// The child's body for [`stale_handles_are_refused`]: one-rank communicators created and
/// destroyed 20 times; every destroyed handle must be refused, whatever the new one's value.
fn stale_handles_child() -> Result<String, String> {
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let count_f = sym!(lib, "ncclCommCount", fn(Comm, *mut c_int) -> c_int);
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let create = || -> Result<Comm, String> {
        let mut id = NcclUniqueId { internal: [0; 128] };
        let mut c: Comm = std::ptr::null_mut();
        // SAFETY: valid out-pointers; a one-rank communicator needs no peer.
        let r = unsafe {
            let r = get_id(&mut id);
            if r != 0 { r } else { init(&mut c, 1, id, 0) }
        };
        if r != 0 {
            return Err(format!("creating a one-rank communicator: {r}"));
        }
        Ok(c)
    };
    let (mut reused, mut accepted) = (0, 0);
    let mut stale: Vec<Comm> = Vec::new();
    for _ in 0..20 {
        let c = create()?;
        reused += usize::from(stale.contains(&c));
        for &old in &stale {
            let mut n: c_int = -1;
            // SAFETY: `old` is a stale handle: the library must refuse it without touching it.
            let r = unsafe { count_f(old, &mut n) };
            if r == 0 {
                accepted += 1;
                continue;
            }
            // SAFETY: the library's thread-local NUL-terminated message.
            let msg = unsafe { CStr::from_ptr(last_err(std::ptr::null_mut())) }
                .to_string_lossy()
                .into_owned();
            if r != 4 || !msg.contains("destroyed") {
                return Err(format!("stale handle {old:p}: returned {r} ({msg})"));
            }
        }
        // SAFETY: a live handle.
        let r = unsafe { destroy(c) };
        if r != 0 {
            return Err(format!("ncclCommDestroy: {r}"));
        }
        stale.push(c);
    }
    let checks = stale.len() * (stale.len() - 1) / 2;
    let report = format!(
        "stale handles accepted {accepted} of {checks} checks; a new handle equal to a destroyed one {reused} of 20 times"
    );
    if accepted > 0 || reused > 0 {
        return Err(report);
    }
    Ok(report)
}

/// Destroy, then create, 20 times: a destroyed communicator's handle is refused every time
/// (handles used to be addresses, reused by the next communicator, so a stale one worked).
fn stale_handles_are_refused() -> Result<(), Failed> {
    lib_path()?;
    let out = self_command()?
        .env(STALE_VAR, "1")
        .env("MSCCLPP_BACKEND", "host")
        .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "30")
        .output()
        .map_err(|e| e.to_string())?;
    let text = output_text(&out);
    if !out.status.success() || !text.contains("stale handles accepted 0") {
        return Err(format!("{}: {text}", out.status).into());
    }
    Ok(())
}

/// A copy of this library under the real NCCL's file name is refused too: the binding looks
/// for the library's marker symbol, not at the name.
fn refused_under_the_real_nccl_name() -> Result<(), Failed> {
    let p = lib_path()?;
    let dir = std::env::temp_dir().join(format!("mscclpp-nccl-renamed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let copy = dir.join("libnccl.so.2");
    std::fs::copy(&p, &copy).map_err(|e| format!("copying {}: {e}", p.display()))?;
    let path = copy.to_string_lossy().into_owned();
    let got = mscclpp_nccl_real::RealNccl::open(&path, "MSCCLPP_NCCL_LIB_PATH");
    let _ = std::fs::remove_dir_all(&dir);
    let e = match got {
        Ok(real) => return Err(format!("{real:?} was taken for the real NCCL").into()),
        Err(e) => e,
    };
    let text = e.to_string();
    if e.class() != mscclpp::hal::ErrorClass::InvalidUsage
        || !text.contains(&path)
        || !text.contains("libmscclpp_nccl")
    {
        return Err(format!("unexpected error: {text}").into());
    }
    Ok(())
}

fn main() {
    support::quiet_expected_refusals();
    if std::env::var_os(STALE_VAR).is_some() {
        match stale_handles_child() {
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
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    run_if_rank(ROLE_230_VAR, DIR_230_VAR, rank_main_230);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test("abi::symbols_resolve", symbols_resolve),
        Trial::test("abi::version_and_error_strings", version_and_strings),
        Trial::test("abi::host::2_ranks_collectives_and_errors", two_ranks_host),
        Trial::test("abi::host::2_ranks_nccl_2_30_exports", two_ranks_230),
        Trial::test("abi::refused_as_the_real_nccl", refused_as_the_real_nccl),
        Trial::test(
            "abi::refused_under_the_real_nccl_name",
            refused_under_the_real_nccl_name,
        ),
        Trial::test("abi::stale_handles_are_refused", stale_handles_are_refused),
    ];
    libtest_mimic::run(&args, trials).exit();
}
