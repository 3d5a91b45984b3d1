//! `ncclRedOpCreatePreMulSum` / `ncclRedOpDestroy` and buffer registration through the C ABI
//! (`dlopen`, as a C program): two ranks as child processes on the host backend. PreMulSum:
//! every NCCL type, host and device scalars (a device scalar changed between calls is read
//! anew), all-reduce, reduce-scatter and reduce against a CPU reference with poisoned outputs,
//! and the errors (destroyed operator, another communicator's, a type mismatch). Registration:
//! windows of `ncclMemAlloc` memory take the zero-copy path (the library's counter says so), local
//! registrations and unregistered buffers do not, and a registered buffer freed without
//! deregistering leaves later calls working. Runs with
//! `cargo test -p mscclpp-nccl --test premul_register`.

#[macro_use]
mod support;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::Duration;

use mscclpp::hal::{DataType, ReduceOp};
use mscclpp_nccl::abi::NcclUniqueId;
use support::{
    CollFn, Comm, fresh_dir, lib_path, open_lib, publish, read_id, run_if_rank, run_ranks,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_PREMUL_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_PREMUL_TEST_DIR";
const NRANKS: usize = 2;

/// NCCL's type codes in DataType order of `DataType::ALL`.
fn nccl_code(t: DataType) -> c_int {
    match t {
        DataType::I8 => 0,
        DataType::U8 => 1,
        DataType::I32 => 2,
        DataType::U32 => 3,
        DataType::I64 => 4,
        DataType::U64 => 5,
        DataType::F16 => 6,
        DataType::F32 => 7,
        DataType::F64 => 8,
        DataType::BF16 => 9,
        DataType::F8E4M3 => 10,
        DataType::F8E5M2 => 11,
    }
}

/// Small values every type holds (negative ones for the signed and float types).
fn data_of(t: DataType, rank: usize, salt: usize, n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * t.size());
    let signed = t.is_float() || matches!(t, DataType::I8 | DataType::I32 | DataType::I64);
    for i in 0..n {
        let v = ((i * 7 + rank * 3 + salt) % 9) as f64 - if signed { 4.0 } else { 0.0 };
        t.encode_f64(v, &mut out);
    }
    out
}

/// The sum over ranks of `factor(r) * x_r` (NCCL's PreMulSum: every rank multiplies its own
/// input by its own factor), each product rounded to the type, then summed in rank order.
fn reference(t: DataType, parts: &[Vec<u8>], factor: impl Fn(usize) -> f64) -> Vec<u8> {
    let s = t.size();
    let scaled: Vec<Vec<u8>> = parts
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let mut out = Vec::with_capacity(p.len());
            for x in p.chunks_exact(s) {
                t.encode_f64(t.decode_f64(x) * factor(r), &mut out);
            }
            out
        })
        .collect();
    let mut acc = scaled[0].clone();
    let mut tmp = vec![0u8; s];
    for p in &scaled[1..] {
        for (a, b) in acc.chunks_exact_mut(s).zip(p.chunks_exact(s)) {
            t.combine_elem(a, b, ReduceOp::Sum, &mut tmp);
            a.copy_from_slice(&tmp);
        }
    }
    acc
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    const N: usize = 999;
    let lib = open_lib()?;
    let get_id = sym!(lib, "ncclGetUniqueId", fn(*mut NcclUniqueId) -> c_int);
    let init = sym!(
        lib,
        "ncclCommInitRank",
        fn(*mut Comm, c_int, NcclUniqueId, c_int) -> c_int
    );
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let mem_alloc = sym!(lib, "ncclMemAlloc", fn(*mut *mut c_void, usize) -> c_int);
    let mem_free = sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int);
    let last_err = sym!(lib, "ncclGetLastError", fn(Comm) -> *const c_char);
    let create_op = sym!(
        lib,
        "ncclRedOpCreatePreMulSum",
        fn(*mut c_int, *mut c_void, c_int, c_int, Comm) -> c_int
    );
    let destroy_op = sym!(lib, "ncclRedOpDestroy", fn(c_int, Comm) -> c_int);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let reduce_scatter: CollFn = sym!(lib, "ncclReduceScatter" as CollFn);
    let reduce = sym!(
        lib,
        "ncclReduce",
        fn(*const c_void, *mut c_void, usize, c_int, c_int, c_int, Comm, *mut c_void) -> c_int
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
    let reg = sym!(
        lib,
        "ncclCommRegister",
        fn(Comm, *mut c_void, usize, *mut *mut c_void) -> c_int
    );
    let dereg = sym!(lib, "ncclCommDeregister", fn(Comm, *mut c_void) -> c_int);
    let zero_copy = sym!(lib, "mscclppNcclZeroCopyCalls", fn(Comm, *mut u64) -> c_int);

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
    let expect_msg = |what: &str, got: c_int, word: &str| -> Result<(), String> {
        let msg = last();
        if got != 4 || !msg.contains(word) {
            return Err(format!(
                "{what}: returned {got} ({msg}); expected 4 naming {word:?}"
            ));
        }
        Ok(())
    };

    // The id: rank 0 makes it; rank 1 reads it from a file.
    let id = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        expect("ncclGetUniqueId", unsafe { get_id(&mut id) }, 0)?;
        publish(dir, &id.internal)?;
        id
    } else {
        read_id(dir)?
    };
    let mut comm: Comm = std::ptr::null_mut();
    // SAFETY: valid out-pointer.
    expect(
        "ncclCommInitRank",
        // SAFETY: the test's live handles and buffers, sized for the call.
        unsafe { init(&mut comm, 2, id, rank as c_int) },
        0,
    )?;
    // A second, one-rank communicator: its operators must not work on `comm`.
    let mut solo: Comm = std::ptr::null_mut();
    let mut solo_id = NcclUniqueId { internal: [0; 128] };
    // SAFETY: valid out-pointers; a one-rank communicator needs no peer.
    unsafe {
        expect("ncclGetUniqueId (solo)", get_id(&mut solo_id), 0)?;
        expect("ncclCommInitRank (solo)", init(&mut solo, 1, solo_id, 0), 0)?;
    }

    let alloc = |bytes: usize| -> Result<*mut c_void, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        expect("ncclMemAlloc", unsafe { mem_alloc(&mut p, bytes) }, 0)?;
        Ok(p)
    };
    let null = std::ptr::null_mut::<c_void>();
    // Host-backend device memory is this process's memory.
    let put = |p: *mut c_void, v: &[u8]| {
        // SAFETY: every buffer below has room for what is put in it.
        unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), p.cast::<u8>(), v.len()) }
    };
    let get = |p: *mut c_void, n: usize| -> Vec<u8> {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) }.to_vec()
    };
    let send_buf = alloc(NRANKS * N * 8)?;
    let recv_buf = alloc(NRANKS * N * 8)?;
    let scalar_buf = alloc(8)?;
    let poison = |p: *mut c_void| put(p, &vec![0xA5; NRANKS * N * 8]);
    let compare = |what: &str, t: DataType, got: &[u8], want: &[u8]| -> Result<(), String> {
        let s = t.size();
        if let Some(i) =
            (0..want.len() / s).find(|&i| got[i * s..(i + 1) * s] != want[i * s..(i + 1) * s])
        {
            return Err(format!(
                "{what} {t}: element {i}: got {}, expected {}",
                t.decode_f64(&got[i * s..]),
                t.decode_f64(&want[i * s..])
            ));
        }
        Ok(())
    };

    // ---- PreMulSum: every type, host and device scalars -----------------------------------
    for t in DataType::ALL {
        let code = nccl_code(t);
        let s = t.size();
        // Every rank its own factors (NCCL's nccl-tests do the same): host 3 + rank, device
        // 2 + rank, then 5 + rank.
        let mut host3 = Vec::new();
        t.encode_f64(3.0 + rank as f64, &mut host3);
        host3.resize(8, 0);
        let mut op_host: c_int = -1;
        // SAFETY: a host scalar of the type, copied at creation.
        expect(
            "create (host)",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { create_op(&mut op_host, host3.as_mut_ptr().cast(), code, 1, comm) },
            0,
        )?;
        // The host scalar was copied: changing it now changes nothing.
        host3.fill(0);
        let mut dev = Vec::new();
        t.encode_f64(2.0 + rank as f64, &mut dev);
        put(scalar_buf, &dev);
        let mut op_dev: c_int = -1;
        // SAFETY: a device scalar of the type (host-backend device memory), alive to the end.
        expect(
            "create (device)",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { create_op(&mut op_dev, scalar_buf, code, 0, comm) },
            0,
        )?;
        if op_host < 5 || op_dev < 5 || op_host == op_dev {
            return Err(format!("operator codes {op_host} and {op_dev}"));
        }
        for (op, base, label) in [(op_host, 3.0, "host"), (op_dev, 2.0, "device")] {
            let factor = |r: usize| base + r as f64;
            let parts: Vec<Vec<u8>> = (0..NRANKS).map(|r| data_of(t, r, 1, N)).collect();
            // all-reduce
            put(send_buf, &parts[rank]);
            poison(recv_buf);
            // SAFETY: N elements each; NULL stream on the host backend.
            expect(
                "allreduce premul",
                // SAFETY: the test's live handles and buffers, sized for the call.
                unsafe { all_reduce(send_buf, recv_buf, N, code, op, comm, null) },
                0,
            )?;
            compare(
                &format!("allreduce premul {label}"),
                t,
                &get(recv_buf, N * s),
                &reference(t, &parts, factor),
            )?;
            // reduce-scatter: block `rank` of everyone's 2N
            let full: Vec<Vec<u8>> = (0..NRANKS).map(|r| data_of(t, r, 2, NRANKS * N)).collect();
            let blocks: Vec<Vec<u8>> = full
                .iter()
                .map(|f| f[rank * N * s..(rank + 1) * N * s].to_vec())
                .collect();
            put(send_buf, &full[rank]);
            poison(recv_buf);
            // SAFETY: 2N in, N out.
            expect(
                "reducescatter premul",
                // SAFETY: the test's live handles and buffers, sized for the call.
                unsafe { reduce_scatter(send_buf, recv_buf, N, code, op, comm, null) },
                0,
            )?;
            compare(
                &format!("reducescatter premul {label}"),
                t,
                &get(recv_buf, N * s),
                &reference(t, &blocks, factor),
            )?;
            // reduce to rank 1: the other rank's output stays poisoned
            put(send_buf, &parts[rank]);
            poison(recv_buf);
            // SAFETY: N elements each.
            expect(
                "reduce premul",
                // SAFETY: the test's live handles and buffers, sized for the call.
                unsafe { reduce(send_buf, recv_buf, N, code, op, 1, comm, null) },
                0,
            )?;
            if rank == 1 {
                compare(
                    &format!("reduce premul {label}"),
                    t,
                    &get(recv_buf, N * s),
                    &reference(t, &parts, factor),
                )?;
            } else if get(recv_buf, N * s) != vec![0xA5; N * s] {
                return Err(format!("reduce premul {t}: a non-root output was written"));
            }
        }
        // The device scalar is read when the call runs.
        let mut five = Vec::new();
        t.encode_f64(5.0 + rank as f64, &mut five);
        put(scalar_buf, &five);
        let parts: Vec<Vec<u8>> = (0..NRANKS).map(|r| data_of(t, r, 3, N)).collect();
        put(send_buf, &parts[rank]);
        poison(recv_buf);
        // SAFETY: as above.
        expect(
            "allreduce premul (new scalar)",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { all_reduce(send_buf, recv_buf, N, code, op_dev, comm, null) },
            0,
        )?;
        compare(
            "allreduce premul after the device scalar changed",
            t,
            &get(recv_buf, N * s),
            &reference(t, &parts, |r| 5.0 + r as f64),
        )?;
        // Errors: another type, another communicator, destroyed.
        let other = nccl_code(if t == DataType::F32 {
            DataType::I32
        } else {
            DataType::F32
        });
        // SAFETY: the buffers hold N elements of 8 bytes.
        unsafe {
            expect_msg(
                "premul with another type",
                all_reduce(send_buf, recv_buf, N, other, op_host, comm, null),
                "types must match",
            )?;
            expect_msg(
                "premul on another communicator",
                all_reduce(send_buf, recv_buf, N, code, op_host, solo, null),
                "another communicator",
            )?;
            expect_msg(
                "destroy on another communicator",
                destroy_op(op_host, solo),
                "another communicator",
            )?;
            expect("ncclRedOpDestroy (host)", destroy_op(op_host, comm), 0)?;
            expect("ncclRedOpDestroy (device)", destroy_op(op_dev, comm), 0)?;
            expect_msg(
                "premul after destroy",
                all_reduce(send_buf, recv_buf, N, code, op_host, comm, null),
                "destroyed",
            )?;
            expect_msg("destroy twice", destroy_op(op_dev, comm), "destroyed")?;
        }
    }
    // SAFETY: bad arguments, refused before anything is touched.
    unsafe {
        let mut op: c_int = 0;
        let mut v = 1.0f32;
        expect_msg(
            "bad residence",
            create_op(&mut op, (&raw mut v).cast(), 7, 9, comm),
            "residence",
        )?;
        expect_msg(
            "NULL scalar",
            create_op(&mut op, null, 7, 1, comm),
            "scalar",
        )?;
        expect_msg(
            "bad type",
            create_op(&mut op, (&raw mut v).cast(), 42, 1, comm),
            "ncclDataType_t",
        )?;
        expect_msg("destroy a built-in", destroy_op(0, comm), "built in")?;
        expect_msg("destroy an unknown", destroy_op(1 << 30, comm), "not made")?;
        // One rank: the sum is the input, then scaled.
        expect(
            "create (solo)",
            create_op(&mut op, (&raw mut v).cast(), 7, 1, solo),
            0,
        )?;
    }
    {
        let mut op: c_int = 0;
        let mut f = 4.0f32;
        // SAFETY: a host scalar.
        expect(
            "create (solo, 4)",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { create_op(&mut op, (&raw mut f).cast(), 7, 1, solo) },
            0,
        )?;
        let x: Vec<u8> = (0..N).flat_map(|i| (i as f32).to_le_bytes()).collect();
        put(send_buf, &x);
        poison(recv_buf);
        // SAFETY: N f32.
        expect(
            "allreduce premul (one rank)",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { all_reduce(send_buf, recv_buf, N, 7, op, solo, null) },
            0,
        )?;
        let want: Vec<u8> = (0..N)
            .flat_map(|i| (4.0 * i as f32).to_le_bytes())
            .collect();
        compare(
            "allreduce premul on one rank",
            DataType::F32,
            &get(recv_buf, N * 4),
            &want,
        )?;
    }

    // ---- Registration ---------------------------------------------------------------------
    let counter = || -> Result<u64, String> {
        let mut n = u64::MAX;
        // SAFETY: valid out-pointer.
        expect(
            "mscclppNcclZeroCopyCalls",
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { zero_copy(comm, &mut n) },
            0,
        )?;
        Ok(n)
    };
    // 4 MiB of f32 per rank: a size where a registered input is read in place.
    const M: usize = 1 << 20;
    let big_in = alloc(M * 4)?;
    let big_out = alloc(M * 4)?;
    let plain_in = alloc(M * 4)?;
    let local_in = alloc(M * 4)?;
    let f32_data = |r: usize, salt: usize| -> Vec<f32> {
        (0..M)
            .map(|i| ((i * 5 + r + salt) % 11) as f32 - 5.0)
            .collect()
    };
    let run_big = |input: *mut c_void, salt: usize, what: &str| -> Result<(), String> {
        let mine: Vec<u8> = f32_data(rank, salt)
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        put(input, &mine);
        put(big_out, &vec![0xA5; M * 4]);
        // SAFETY: M f32 each.
        expect(
            what,
            // SAFETY: the test's live handles and buffers, sized for the call.
            unsafe { all_reduce(input, big_out, M, 7, 0, comm, null) },
            0,
        )?;
        let all: Vec<Vec<f32>> = (0..NRANKS).map(|r| f32_data(r, salt)).collect();
        let want: Vec<u8> = (0..M)
            .flat_map(|i| all.iter().map(|d| d[i]).sum::<f32>().to_le_bytes())
            .collect();
        compare(what, DataType::F32, &get(big_out, M * 4), &want)
    };
    let before = counter()?;
    run_big(plain_in, 1, "allreduce 4 MiB unregistered")?;
    if counter()? != before {
        return Err("an unregistered input took the zero-copy path".into());
    }
    let mut h_local: *mut c_void = null;
    // SAFETY: valid out-pointer; ncclMemAlloc memory.
    expect(
        "ncclCommRegister",
        // SAFETY: the test's live handles and buffers, sized for the call.
        unsafe { reg(comm, local_in, M * 4, &mut h_local) },
        0,
    )?;
    run_big(local_in, 2, "allreduce 4 MiB, locally registered")?;
    if counter()? != before {
        return Err(
            "a locally registered input took the zero-copy path (it is not mapped into the peers)"
                .into(),
        );
    }
    let mut win: *mut c_void = null;
    // SAFETY: valid out-pointer; ncclMemAlloc memory; every rank registers (collective).
    expect(
        "ncclCommWindowRegister",
        // SAFETY: the test's live handles and buffers, sized for the call.
        unsafe { win_reg(comm, big_in, M * 4, &mut win, 0) },
        0,
    )?;
    run_big(big_in, 3, "allreduce 4 MiB in a window")?;
    if counter()? != before + 1 {
        return Err(format!(
            "the window's all-reduce did not take the zero-copy path: counter {} after {before}",
            counter()?
        ));
    }
    run_big(big_in, 4, "allreduce 4 MiB in a window, again")?;
    if counter()? != before + 2 {
        return Err("the second call on the window did not take the zero-copy path".into());
    }
    // Freed without deregistering: the registration keeps the memory; later calls still work.
    // SAFETY: no work is outstanding (host backend: calls return once run).
    expect(
        "ncclMemFree of a registered buffer",
        // SAFETY: the test's live handles and buffers, sized for the call.
        unsafe { mem_free(big_in) },
        0,
    )?;
    run_big(plain_in, 5, "allreduce after freeing a registered buffer")?;
    // SAFETY: handles of this library; the window deregistration is collective.
    unsafe {
        expect_msg(
            "window deregistered as a local handle",
            dereg(comm, win),
            "not a",
        )?;
        expect("ncclCommWindowDeregister", win_dereg(comm, win), 0)?;
        expect_msg(
            "ncclCommWindowDeregister twice",
            win_dereg(comm, win),
            "deregistered already",
        )?;
        expect("ncclCommDeregister", dereg(comm, h_local), 0)?;
        expect_msg(
            "ncclCommDeregister twice",
            dereg(comm, h_local),
            "deregistered already",
        )?;
        let mut h: *mut c_void = null;
        expect_msg("register NULL", reg(comm, null, 8, &mut h), "buff is NULL")?;
        expect_msg(
            "register 0 bytes",
            reg(comm, local_in, 0, &mut h),
            "size is 0",
        )?;
    }

    // SAFETY: live handles, no outstanding work.
    unsafe {
        expect("ncclCommDestroy (solo)", destroy(solo), 0)?;
        expect("ncclCommDestroy", destroy(comm), 0)?;
        for p in [send_buf, recv_buf, scalar_buf, big_out, plain_in, local_in] {
            expect("ncclMemFree", mem_free(p), 0)?;
        }
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// The test's failure outside a rank: this runner has no harness to report it.
fn fail(e: &str) -> ! {
    eprintln!("premul_register: {e}");
    std::process::exit(1);
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    // cargo builds the cdylib with the package's tests; without it nothing can run.
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("premul").unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(240),
        |c| {
            c.env_remove("MSCCLPP_ALGO_ALLREDUCE");
        },
    );
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!("premul_register: 2 ranks on the host backend: every check passed");
}
