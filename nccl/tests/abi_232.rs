//! NCCL 2.31–2.32's host calls through the C ABI (`dlopen`, as a C program would):
//! - every function `nccl.h` and `nccl_device/host.h` declare is exported (the headers read from
//!   `MSCCLPP_NCCL_INCLUDE`; CI installs them from the `nvidia-nccl-cu13` wheel);
//! - the `nccl*Config` collectives on two ranks (child processes, host backend): the same
//!   results as the plain calls against a CPU reference on random data, outputs poisoned first;
//!   a NULL config; configs that are refused, with the code and the field named;
//! - `ncclSetEncryption`; the device-host calls, each answering its code and naming itself.
//!
//! Runs with `cargo test -p mscclpp-nccl --test abi_232`.

#[macro_use]
mod support;
#[path = "abi_232/headers.rs"]
mod headers;

use std::ffi::{CStr, c_char, c_int, c_void};
use std::path::Path;
use std::time::{Duration, Instant};

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::{NCCL_CTA_POLICY_ZERO, NcclCollConfig, NcclEncryptionConfig, NcclUniqueId};
use support::{
    Comm, fresh_dir, lib_path, open_lib, publish, rank_command, rank_failure, run_if_rank,
    wait_or_kill, wait_published,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_ABI232_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_ABI232_TEST_DIR";

/// (send, recv, count, datatype, op or root, comm, stream, config): `ncclAllReduceConfig`,
/// `ncclReduceScatterConfig`, `ncclBroadcastConfig`, `ncclGatherConfig`, `ncclScatterConfig`.
type CfgFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    Comm,
    *mut c_void,
    *const NcclCollConfig,
) -> c_int;
/// (send, recv, count, datatype, comm, stream, config): `ncclAllGatherConfig`,
/// `ncclAlltoAllConfig`.
type MoveCfgFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    Comm,
    *mut c_void,
    *const NcclCollConfig,
) -> c_int;
/// `ncclReduceConfig`: (send, recv, count, datatype, op, root, comm, stream, config).
type ReduceCfgFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    *mut c_void,
    *const NcclCollConfig,
) -> c_int;
/// The plain forms with one int before the communicator (`ncclAllReduce` …, `ncclGather`).
type PlainFn = support::CollFn;
/// `ncclReduce`.
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    Comm,
    *mut c_void,
) -> c_int;

const FLOAT32: c_int = 7;
const SUM: c_int = 0;
/// Elements of one rank block.
const N: usize = 777;
/// What outputs hold before each call: a NaN no result has.
const POISON: u32 = 0x7fc0_dead;

/// The last error of this thread, through the library.
fn last_error(lib: &libloading::Library) -> String {
    let Ok(f) =
        // SAFETY: `ncclGetLastError`'s C signature.
        (unsafe { lib.get::<unsafe extern "C" fn(Comm) -> *const c_char>(b"ncclGetLastError\0") })
    else {
        return "(no ncclGetLastError)".into();
    };
    // SAFETY: a NUL-terminated thread-local message.
    unsafe { CStr::from_ptr(f(std::ptr::null_mut())) }
        .to_string_lossy()
        .into_owned()
}

/// `got` is `want`, and when it is an error, the last error contains every word of `names`.
fn expect_code(
    lib: &libloading::Library,
    what: &str,
    got: c_int,
    want: c_int,
    names: &[&str],
) -> Result<(), String> {
    let last = last_error(lib);
    if got != want {
        return Err(format!(
            "{what}: returned {got}, expected {want} (last error: {last})"
        ));
    }
    if want != 0 {
        for n in names {
            if !last.contains(n) {
                return Err(format!(
                    "{what}: the last error {last:?} does not name {n:?}"
                ));
            }
        }
    }
    Ok(())
}

/// xorshift: the same stream on every rank for a (seed, rank) pair.
fn data(seed: u64, rank: usize, n: usize) -> Vec<f32> {
    let mut x = (seed ^ (rank as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            // Small integers: every sum is exact in f32.
            (x % 201) as f32 - 100.0
        })
        .collect()
}

fn config() -> NcclCollConfig {
    NcclCollConfig::INITIALIZER
}

/// One rank's body (a child process).
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
    let mem_free = sym!(lib, "ncclMemFree", fn(*mut c_void) -> c_int);
    let expect = |what: &str, got: c_int, want: c_int, names: &[&str]| {
        expect_code(&lib, what, got, want, names)
    };

    // The id and the data's seed: rank 0 makes them; rank 1 reads them from a file.
    let (id, seed) = if rank == 0 {
        let mut id = NcclUniqueId { internal: [0; 128] };
        // SAFETY: valid out-pointer.
        expect("ncclGetUniqueId", unsafe { get_id(&mut id) }, 0, &[])?;
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
    let rc = unsafe { init(&mut comm, 2, id, rank as c_int) };
    expect("ncclCommInitRank", rc, 0, &[])?;
    let inputs: Vec<Vec<f32>> = (0..2).map(|r| data(seed, r, 2 * N)).collect();
    let mine = &inputs[rank];

    let alloc = |elems: usize| -> Result<*mut f32, String> {
        let mut p = std::ptr::null_mut();
        // SAFETY: valid out-pointer.
        let rc = unsafe { mem_alloc(&mut p, elems * 4) };
        expect("ncclMemAlloc", rc, 0, &[])?;
        Ok(p.cast())
    };
    let send = alloc(2 * N)?;
    let recv = alloc(2 * N)?;
    // Host-backend device memory is this process's memory.
    // SAFETY: 2N floats each, allocated above.
    let (send_s, recv_s) = unsafe {
        (
            std::slice::from_raw_parts_mut(send, 2 * N),
            std::slice::from_raw_parts_mut(recv, 2 * N),
        )
    };
    send_s.copy_from_slice(mine);
    let null = std::ptr::null_mut::<c_void>();
    let (sp, rp) = (send.cast::<c_void>().cast_const(), recv.cast::<c_void>());

    // What each collective leaves in `recv` (the first `len` elements checked; `None`: this
    // rank's output is not written).
    let sum = |lo: usize, hi: usize| -> Vec<f32> {
        (lo..hi).map(|i| inputs[0][i] + inputs[1][i]).collect()
    };
    let cat = |a: &[f32], b: &[f32]| -> Vec<f32> { a.iter().chain(b).copied().collect() };
    let all_reduce = sum(0, N);
    let all_gather = cat(&inputs[0][..N], &inputs[1][..N]);
    let reduce_scatter = sum(rank * N, (rank + 1) * N);
    let broadcast = inputs[1][..N].to_vec();
    let all_to_all = cat(
        &inputs[0][rank * N..(rank + 1) * N],
        &inputs[1][rank * N..(rank + 1) * N],
    );
    let gather_at_1 = (rank == 1).then(|| all_gather.clone());
    let scatter_from_0 = inputs[0][rank * N..(rank + 1) * N].to_vec();
    let reduce_at_0 = (rank == 0).then(|| all_reduce.clone());

    // Runs `call` on a poisoned output and checks it against `want`.
    let mut check = |what: &str, want: Option<&[f32]>, call: &dyn Fn() -> c_int| {
        recv_s.fill(f32::from_bits(POISON));
        expect(what, call(), 0, &[])?;
        let Some(want) = want else {
            return Ok::<(), String>(());
        };
        if let Some(i) = (0..want.len()).find(|&i| recv_s[i].to_bits() != want[i].to_bits()) {
            return Err(format!(
                "{what}: element {i} of {}: got {}, expected {}",
                want.len(),
                recv_s[i],
                want[i]
            ));
        }
        Ok(())
    };

    let cfg_ar: CfgFn = sym!(lib, "ncclAllReduceConfig" as CfgFn);
    let cfg_rs: CfgFn = sym!(lib, "ncclReduceScatterConfig" as CfgFn);
    let cfg_bc: CfgFn = sym!(lib, "ncclBroadcastConfig" as CfgFn);
    let cfg_ga: CfgFn = sym!(lib, "ncclGatherConfig" as CfgFn);
    let cfg_sc: CfgFn = sym!(lib, "ncclScatterConfig" as CfgFn);
    let cfg_ag: MoveCfgFn = sym!(lib, "ncclAllGatherConfig" as MoveCfgFn);
    let cfg_a2a: MoveCfgFn = sym!(lib, "ncclAlltoAllConfig" as MoveCfgFn);
    let cfg_red: ReduceCfgFn = sym!(lib, "ncclReduceConfig" as ReduceCfgFn);
    let p_cfg_ar: CfgFn = sym!(lib, "pncclAllReduceConfig" as CfgFn);
    let ar: PlainFn = sym!(lib, "ncclAllReduce" as PlainFn);
    let rs: PlainFn = sym!(lib, "ncclReduceScatter" as PlainFn);
    let bc: PlainFn = sym!(lib, "ncclBroadcast" as PlainFn);
    let ga: PlainFn = sym!(lib, "ncclGather" as PlainFn);
    let sc: PlainFn = sym!(lib, "ncclScatter" as PlainFn);
    let ag: support::MoveFn = sym!(lib, "ncclAllGather" as support::MoveFn);
    let a2a: support::MoveFn = sym!(lib, "ncclAlltoAll" as support::MoveFn);
    let red: ReduceFn = sym!(lib, "ncclReduce" as ReduceFn);

    // Each collective: the plain call, then its Config form with NULL, with the initializer and
    // with an algorithm of ours named (direct serves every collective; gather and scatter run as
    // sends and receives, where it is advisory).
    let mut direct = config();
    direct.alg_selection = c"direct".as_ptr();
    let configs: [(&str, *const NcclCollConfig); 3] = [
        ("NULL", std::ptr::null()),
        ("initializer", &config()),
        ("algSelection direct", &direct),
    ];
    // SAFETY: every call below: the exports' C signatures; buffers of 2N floats on this
    // communicator's (host) device; the configs live through the calls.
    unsafe {
        check("ncclAllReduce", Some(&all_reduce), &|| {
            ar(sp, rp, N, FLOAT32, SUM, comm, null)
        })?;
        check("ncclAllGather", Some(&all_gather), &|| {
            ag(sp, rp, N, FLOAT32, comm, null)
        })?;
        check("ncclReduceScatter", Some(&reduce_scatter), &|| {
            rs(sp, rp, N, FLOAT32, SUM, comm, null)
        })?;
        check("ncclBroadcast", Some(&broadcast), &|| {
            bc(sp, rp, N, FLOAT32, 1, comm, null)
        })?;
        check("ncclAlltoAll", Some(&all_to_all), &|| {
            a2a(sp, rp, N, FLOAT32, comm, null)
        })?;
        check("ncclReduce", reduce_at_0.as_deref(), &|| {
            red(sp, rp, N, FLOAT32, SUM, 0, comm, null)
        })?;
        check("ncclGather", gather_at_1.as_deref(), &|| {
            ga(sp, rp, N, FLOAT32, 1, comm, null)
        })?;
        check("ncclScatter", Some(&scatter_from_0), &|| {
            sc(sp, rp, N, FLOAT32, 0, comm, null)
        })?;
        for (how, c) in configs {
            let w = |n: &str| format!("{n} ({how})");
            check(&w("ncclAllReduceConfig"), Some(&all_reduce), &|| {
                cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, c)
            })?;
            check(&w("ncclAllGatherConfig"), Some(&all_gather), &|| {
                cfg_ag(sp, rp, N, FLOAT32, comm, null, c)
            })?;
            check(
                &w("ncclReduceScatterConfig"),
                Some(&reduce_scatter),
                &|| cfg_rs(sp, rp, N, FLOAT32, SUM, comm, null, c),
            )?;
            check(&w("ncclBroadcastConfig"), Some(&broadcast), &|| {
                cfg_bc(sp, rp, N, FLOAT32, 1, comm, null, c)
            })?;
            check(&w("ncclAlltoAllConfig"), Some(&all_to_all), &|| {
                cfg_a2a(sp, rp, N, FLOAT32, comm, null, c)
            })?;
            check(&w("ncclReduceConfig"), reduce_at_0.as_deref(), &|| {
                cfg_red(sp, rp, N, FLOAT32, SUM, 0, comm, null, c)
            })?;
            check(&w("ncclGatherConfig"), gather_at_1.as_deref(), &|| {
                cfg_ga(sp, rp, N, FLOAT32, 1, comm, null, c)
            })?;
            check(&w("ncclScatterConfig"), Some(&scatter_from_0), &|| {
                cfg_sc(sp, rp, N, FLOAT32, 0, comm, null, c)
            })?;
        }
        check("pncclAllReduceConfig", Some(&all_reduce), &|| {
            p_cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, &config())
        })?;

        // Requests that cannot all be honoured, allowed to fall back (forceAlgSelection 0):
        // an unknown name, an algorithm that does not serve all-gather (read), and the
        // zero-CTA policy (copy engines where they serve the call); NCCL's own names are
        // advisory whatever forceAlgSelection says.
        let mut lenient = config();
        lenient.force_alg_selection = 0;
        for sel in [c"warp-drive", c"read", c"Ring,Tree"] {
            lenient.alg_selection = sel.as_ptr();
            check(
                &format!("ncclAllGatherConfig ({sel:?}, forceAlgSelection 0)"),
                Some(&all_gather),
                &|| cfg_ag(sp, rp, N, FLOAT32, comm, null, &lenient),
            )?;
        }
        let mut ring = config();
        ring.alg_selection = c"Ring".as_ptr();
        check("ncclAllReduceConfig (Ring)", Some(&all_reduce), &|| {
            cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, &ring)
        })?;
        let mut zero = config();
        zero.cta_policy = NCCL_CTA_POLICY_ZERO;
        check(
            "ncclAllGatherConfig (CTAPolicy ZERO)",
            Some(&all_gather),
            &|| cfg_ag(sp, rp, N, FLOAT32, comm, null, &zero),
        )?;
        check(
            "ncclAllReduceConfig (CTAPolicy ZERO)",
            Some(&all_reduce),
            &|| cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, &zero),
        )?;

        // Refused before anything runs, on both ranks alike: the code, and the field named.
        let refused = |what: &str, c: &NcclCollConfig, code: c_int, names: &[&str]| {
            let rc = cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, c);
            expect(what, rc, code, names)
        };
        let mut bad = config();
        bad.size = 16;
        refused("size 16", &bad, 4, &["ncclAllReduceConfig", "config->size"])?;
        bad = config();
        bad.magic = 0x1234;
        refused(
            "magic 0x1234",
            &bad,
            4,
            &["ncclAllReduceConfig", "config->magic"],
        )?;
        bad = config();
        bad.version = 22803;
        refused("version 22803", &bad, 4, &["config->version"])?;
        bad = config();
        bad.force_alg_selection = 7;
        refused(
            "forceAlgSelection 7",
            &bad,
            4,
            &["config->forceAlgSelection"],
        )?;
        bad = config();
        bad.cta_policy = 64;
        refused("CTAPolicy 64", &bad, 4, &["config->CTAPolicy"])?;
        bad = config();
        bad.alg_selection = c"warp-drive".as_ptr();
        refused(
            "algSelection warp-drive",
            &bad,
            4,
            &["config->algSelection"],
        )?;
        bad = config();
        bad.launch_completion_event = 8 as *mut c_void;
        refused(
            "launchCompletionEvent",
            &bad,
            5,
            &["config->launchCompletionEvent"],
        )?;
        // An algorithm of ours that cannot serve the call, with forceAlgSelection 1: refused by
        // the collectives, naming it (read serves all-reduce only).
        bad = config();
        bad.alg_selection = c"read".as_ptr();
        let rc = cfg_ag(sp, rp, N, FLOAT32, comm, null, &bad);
        expect(
            "ncclAllGatherConfig (read, forced)",
            rc,
            5,
            &["ncclAllGatherConfig", "read"],
        )?;
        // The communicator still works after the refusals.
        check(
            "ncclAllReduceConfig after the refusals",
            Some(&all_reduce),
            &|| cfg_ar(sp, rp, N, FLOAT32, SUM, comm, null, std::ptr::null()),
        )?;
    }

    // The world team: every rank, stride 1; its rank 1 is world rank 1.
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Team {
        n_ranks: c_int,
        rank: c_int,
        stride: c_int,
    }
    let team_world = sym!(lib, "ncclTeamWorld", fn(Comm) -> Team);
    let to_world = sym!(lib, "ncclTeamRankToWorld", fn(Comm, Team, c_int) -> c_int);
    // SAFETY: the exports' C signatures; a live communicator.
    let (world, w1, w5) = unsafe {
        let t = team_world(comm);
        (t, to_world(comm, t, 1), to_world(comm, t, 5))
    };
    let want = Team {
        n_ranks: 2,
        rank: rank as c_int,
        stride: 1,
    };
    if world != want || w1 != 1 || w5 != -1 {
        return Err(format!(
            "ncclTeamWorld {world:?} (expected {want:?}), ncclTeamRankToWorld 1 -> {w1}, 5 -> {w5}"
        ));
    }

    // SAFETY: live comm; buffers of ncclMemAlloc.
    unsafe {
        expect("ncclCommDestroy", destroy(comm), 0, &[])?;
        expect("ncclMemFree", mem_free(send.cast()), 0, &[])?;
        expect("ncclMemFree", mem_free(recv.cast()), 0, &[])?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// Ranks 0 and 1 as child processes of this binary.
fn two_ranks_config_collectives() -> Result<(), Failed> {
    lib_path()?;
    let dir = fresh_dir("abi-232")?;
    let mut children = Vec::new();
    for rank in 0..2 {
        let child = rank_command(ROLE_VAR, DIR_VAR, rank, &dir)?
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "TUNING")
            .spawn()
            .map_err(|e| format!("spawning rank {rank}: {e}"))?;
        children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failures = Vec::new();
    let mut logs = String::new();
    for (rank, child) in children.into_iter().enumerate() {
        let (out, _) = wait_or_kill(child, deadline, Duration::from_millis(20))?;
        logs.push_str(&support::output_text(&out));
        if !out.status.success() {
            failures.push(rank_failure(rank, &out));
        }
    }
    for rank in 0..2 {
        if failures.is_empty() && !dir.join(format!("done-{rank}")).exists() {
            failures.push(format!("rank {rank} exited without finishing its checks"));
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    // NCCL_DEBUG=INFO says what was done with each field.
    for said in [
        "takes the direct algorithm",
        "names NCCL's algorithms",
        "falling back to automatic selection",
        "NCCL_CTA_POLICY_ZERO",
    ] {
        if failures.is_empty() && !logs.contains(said) {
            failures.push(format!("NCCL_DEBUG=INFO never said {said:?}:\n{logs}"));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n").into())
    }
}

/// `ncclSetEncryption`: plaintext served (NULL too), a PSK refused naming what is missing, bad
/// configs refused as NCCL refuses them; the twin is the same function.
fn set_encryption() -> Result<(), Failed> {
    let lib = open_lib()?;
    type SetFn = unsafe extern "C" fn(*const NcclEncryptionConfig) -> c_int;
    let set: SetFn = sym!(lib, "ncclSetEncryption" as SetFn);
    let pset: SetFn = sym!(lib, "pncclSetEncryption" as SetFn);
    let plain = NcclEncryptionConfig {
        size: std::mem::size_of::<NcclEncryptionConfig>(),
        magic: 0xcafe_beef,
        version: 23206,
        mode: 0,
        psk: std::ptr::null(),
    };
    let psk = NcclEncryptionConfig {
        mode: 1,
        psk: c"0123456789abcdef0123456789abcdef".as_ptr(),
        ..plain
    };
    let no_key = NcclEncryptionConfig {
        psk: std::ptr::null(),
        ..psk
    };
    let bad_magic = NcclEncryptionConfig { magic: 7, ..plain };
    let bad_mode = NcclEncryptionConfig { mode: 9, ..plain };
    let cases: [(&str, *const NcclEncryptionConfig, c_int, &[&str]); 6] = [
        ("NULL", std::ptr::null(), 0, &[]),
        ("NCCL_ENCRYPTION_MODE_NONE", &plain, 0, &[]),
        (
            "a PSK",
            &psk,
            5,
            &["ncclSetEncryption", "TLS", "NCCL_ENCRYPTION_MODE_PSK"],
        ),
        ("a PSK mode without a key", &no_key, 4, &["config->psk"]),
        ("a bad magic", &bad_magic, 4, &["config->magic"]),
        ("an unknown mode", &bad_mode, 4, &["config->mode"]),
    ];
    for (what, c, code, names) in cases {
        for (f, name) in [(set, "ncclSetEncryption"), (pset, "pncclSetEncryption")] {
            // SAFETY: the export's C signature; NULL or a whole config.
            let rc = unsafe { f(c) };
            expect_code(&lib, &format!("{name} ({what})"), rc, code, names)?;
        }
    }
    Ok(())
}

/// The device-host calls of `nccl_device/host.h` this library refuses: each answers
/// `ncclInvalidArgument` for a NULL pointer first, then `ncclInvalidUsage` naming itself (the
/// team calls: an empty team or -1, and the same message).
fn device_host_calls_refuse_naming_themselves() -> Result<(), Failed> {
    let lib = open_lib()?;
    #[repr(C)]
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct Team {
        n_ranks: c_int,
        rank: c_int,
        stride: c_int,
    }
    let team = Team {
        n_ranks: 2,
        rank: 0,
        stride: 1,
    };
    let mut slot = [0u64; 8];
    let p: *mut c_void = slot.as_mut_ptr().cast();
    let null = std::ptr::null_mut::<c_void>();
    let win = 0x1000 as *mut c_void;
    let mut off = 0usize;
    let o: *mut usize = &mut off;
    let team_req = |name: &'static str, served: bool| -> Result<(), String> {
        type F = unsafe extern "C" fn(Team, c_int, *mut c_void, *mut c_void) -> c_int;
        // SAFETY: the header's signature of the Lsa/Cft barrier requirement calls.
        let f = *unsafe { lib.get::<F>(format!("{name}\0").as_bytes()) }
            .map_err(|e| format!("{name}: {e}"))?;
        // SAFETY: valid or NULL pointers; a served call writes its 56-byte requirement and
        // 8-byte handle into `slot` (64 bytes; the two share it here).
        unsafe {
            expect_code(&lib, name, f(team, 1, null, p), 4, &[name, "outHandle"])?;
            expect_code(&lib, name, f(team, 1, p, null), 4, &[name, "outReq"])?;
            if served {
                expect_code(&lib, name, f(team, 1, p, p), 0, &[])
            } else {
                expect_code(&lib, name, f(team, 1, p, p), 5, &[name, "device API"])
            }
        }
    };
    team_req("ncclLsaBarrierCreateRequirement", true)?;
    // ncclLsaBarrierCreateRequirement's sizes: (3 + nRanks) * 4 bytes per barrier, aligned to 4.
    let lsa_req = sym!(
        lib,
        "ncclLsaBarrierCreateRequirement",
        fn(Team, c_int, *mut c_void, *mut c_void) -> c_int
    );
    let mut handle = [7u32; 2];
    let mut req = [0xffu8; 56];
    // SAFETY: an 8-byte handle and a 56-byte requirement.
    let rc = unsafe { lsa_req(team, 3, handle.as_mut_ptr().cast(), req.as_mut_ptr().cast()) };
    let word = |at: usize| u64::from_le_bytes(req[at..at + 8].try_into().unwrap_or_default());
    if rc != 0
        || word(0) != 0
        || word(8) != 60
        || word(16) != 4
        || word(24) != handle.as_ptr() as u64
        || handle[1] != 3
    {
        return Err(format!(
            "ncclLsaBarrierCreateRequirement: rc {rc}, requirement {req:?}, handle {handle:?}"
        )
        .into());
    }
    team_req("ncclCftBarrierCreateRequirement", false)?;
    let int_req = |name: &'static str, served: bool| -> Result<(), String> {
        type F = unsafe extern "C" fn(c_int, c_int, *mut c_void, *mut c_void) -> c_int;
        // SAFETY: the header's signature of the LLA2A and GIN outbox requirement calls.
        let f = *unsafe { lib.get::<F>(format!("{name}\0").as_bytes()) }
            .map_err(|e| format!("{name}: {e}"))?;
        // SAFETY: as above.
        unsafe {
            expect_code(&lib, name, f(1, 1, null, p), 4, &[name, "outHandle"])?;
            if served {
                expect_code(&lib, name, f(1, 1, p, p), 0, &[])
            } else {
                expect_code(&lib, name, f(1, 1, p, p), 5, &[name, "device API"])
            }
        }
    };
    int_req("ncclLLA2ACreateRequirement", true)?;
    int_req("ncclGinOutboxCreateRequirement", false)?;
    {
        let name = "ncclGinInboxA2ACreateRequirement";
        let f = sym!(
            lib,
            "ncclGinInboxA2ACreateRequirement",
            fn(Team, c_int, c_int, *mut c_void, *mut c_void) -> c_int
        );
        // SAFETY: as above.
        unsafe {
            expect_code(&lib, name, f(team, 1, 1, p, null), 4, &[name, "outReq"])?;
            expect_code(&lib, name, f(team, 1, 1, p, p), 5, &[name, "device API"])?;
        }
    }
    {
        let peer = sym!(
            lib,
            "ncclGetPeerDeviceLeInfo",
            fn(*mut c_void, usize, c_int, *mut c_void, *mut usize) -> c_int
        );
        let mc = sym!(
            lib,
            "ncclGetMultimemDeviceLeInfo",
            fn(*mut c_void, usize, *mut c_void, *mut usize) -> c_int
        );
        let cft = sym!(
            lib,
            "ncclGetCftDeviceLeInfo",
            fn(*mut c_void, usize, c_int, Team, *mut c_void, *mut usize) -> c_int
        );
        let n = std::ptr::null_mut::<usize>();
        // SAFETY: valid or NULL pointers; nothing is read or written through them.
        unsafe {
            let name = "ncclGetPeerDeviceLeInfo";
            expect_code(&lib, name, peer(null, 0, 1, p, o), 4, &[name, "window"])?;
            expect_code(&lib, name, peer(win, 0, 1, null, o), 4, &[name, "leId"])?;
            expect_code(&lib, name, peer(win, 0, 1, p, n), 4, &[name, "leOffset"])?;
            expect_code(&lib, name, peer(win, 0, 1, p, o), 5, &[name, "device API"])?;
            let name = "ncclGetMultimemDeviceLeInfo";
            expect_code(&lib, name, mc(win, 0, null, o), 4, &[name, "leId"])?;
            expect_code(&lib, name, mc(win, 0, p, o), 5, &[name, "device API"])?;
            let name = "ncclGetCftDeviceLeInfo";
            expect_code(
                &lib,
                name,
                cft(win, 0, 1, team, p, n),
                4,
                &[name, "leOffset"],
            )?;
            expect_code(
                &lib,
                name,
                cft(win, 0, 1, team, p, o),
                5,
                &[name, "device API"],
            )?;
        }
    }
    // The calls that return no result code: an empty team or -1, and the message.
    let empty = Team {
        n_ranks: 0,
        rank: -1,
        stride: 0,
    };
    let teams: [&str; 4] = [
        "ncclTeamLsa",
        "ncclTeamCftMultimem",
        "ncclTeamRail",
        "ncclTeamWorld",
    ];
    for name in teams {
        type F = unsafe extern "C" fn(Comm) -> Team;
        // SAFETY: the header's signature.
        let f = *unsafe { lib.get::<F>(format!("{name}\0").as_bytes()) }
            .map_err(|e| format!("{name}: {e}"))?;
        // SAFETY: a handle that is no communicator: checked, never followed.
        let t = unsafe { f(0x10 as Comm) };
        let last = last_error(&lib);
        // The world, LSA and rail teams serve live communicators only: this handle is not one.
        let word = if name == "ncclTeamCftMultimem" {
            "device API"
        } else {
            "not a communicator"
        };
        if t != empty || !last.contains(name) || !last.contains(word) {
            return Err(format!("{name}: {t:?}, last error {last:?}").into());
        }
    }
    let team_cft = sym!(lib, "ncclTeamCft", fn(Comm, c_int) -> Team);
    let to_lsa = sym!(lib, "ncclTeamRankToLsa", fn(Comm, Team, c_int) -> c_int);
    let calc = sym!(lib, "ncclLLA2ACalcSlots", fn(c_int, c_int) -> c_int);
    // SAFETY: the header's signatures; the handle is not followed.
    let t = unsafe { team_cft(0x10 as Comm, 0) };
    let last = last_error(&lib);
    if t != empty || !last.contains("ncclTeamCft") {
        return Err(format!("ncclTeamCft: {t:?}, last error {last:?}").into());
    }
    // SAFETY: as above.
    let r = unsafe { to_lsa(0x10 as Comm, team, 1) };
    let last = last_error(&lib);
    if r != -1 || !last.contains("ncclTeamRankToLsa") {
        return Err(format!("ncclTeamRankToLsa: {r}, last error {last:?}").into());
    }
    // NCCL's arithmetic: a slot holds 8 bytes.
    // SAFETY: as above.
    let r = unsafe { (calc(64, 8), calc(64, 12), calc(-1, 8)) };
    let last = last_error(&lib);
    if r != (64, 128, -1) || !last.contains("ncclLLA2ACalcSlots") {
        return Err(format!("ncclLLA2ACalcSlots: {r:?}, last error {last:?}").into());
    }
    Ok(())
}

fn main() {
    support::quiet_expected_refusals();
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    let args = libtest_mimic::Arguments::from_args();
    let trials = vec![
        Trial::test(
            "abi_232::every_header_function_is_exported",
            headers::every_header_function_is_exported,
        ),
        Trial::test(
            "abi_232::header_parser_reads_declarations",
            headers::parser_reads_declarations,
        ),
        Trial::test(
            "abi_232::host::2_ranks_config_collectives",
            two_ranks_config_collectives,
        ),
        Trial::test("abi_232::set_encryption", set_encryption),
        Trial::test(
            "abi_232::device_host_calls_refuse_naming_themselves",
            device_host_calls_refuse_naming_themselves,
        ),
    ];
    libtest_mimic::run(&args, trials).exit();
}
