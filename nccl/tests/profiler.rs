//! NCCL profiler plugins (`NCCL_PROFILER_PLUGIN`) see our calls, through the C ABI on the host
//! backend: a C plugin (`tests/fixtures/profiler_plugin.c`, declared from NCCL's published
//! layouts) is built with `cc` for each ABI version 1 to 6, and two ranks as child processes
//! run an all-reduce, an all-gather, a grouped send/receive pair and a split under it. From
//! the plugin's log the test checks, per version: `init`'s arguments (rank, size, nodes, the
//! communicator name, one id on both ranks), every field the version has of each event (API
//! events from version 5; the collective's function, count, type, root, buffers, sequence
//! number, algorithm and protocol; the send's and receive's peer and buffer), the parent chain,
//! the group API states, every start stopped, and one `finalize` per communicator. Also: a
//! library exporting versions 4 and 6 is used as 6; a mask of 0 gives no events; an `init`
//! that fails leaves the communicator working without events; `none` loads nothing. On two
//! simulated hosts (`MSCCLPP_HOSTID` per rank, a proxy carrying the transfers between them),
//! per version: the proxy events: a `ProxyOp` per launch and peer under its `Coll` (pid, peer,
//! steps, chunk, send), its `ProxyStep`s numbered from 0 with their states and sizes, the
//! version's operation states, and `ProxyCtrl` busy spans, every one stopped.
//! Runs with `cargo test -p mscclpp-nccl --test profiler`.

#[macro_use]
mod support;
use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use libtest_mimic::{Failed, Trial};
use mscclpp_nccl::abi::NcclConfig;
use support::{
    CollFn, Comm, MoveFn, fresh_dir, init_world, open_lib, rank_of, run_if_rank, run_ranks,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_PROFILER_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_PROFILER_TEST_DIR";
const COUNT: usize = 1000;
const NCCL_FLOAT32: c_int = 7;
const NCCL_INT32: c_int = 2;
const NCCL_SUM: c_int = 0;

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let split = sym!(
        lib,
        "ncclCommSplit",
        fn(Comm, c_int, c_int, *mut Comm, *mut NcclConfig) -> c_int
    );
    let destroy = sym!(lib, "ncclCommDestroy", fn(Comm) -> c_int);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let all_gather: MoveFn = sym!(lib, "ncclAllGather" as MoveFn);
    let send = sym!(
        lib,
        "ncclSend",
        fn(*const c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let recv = sym!(
        lib,
        "ncclRecv",
        fn(*mut c_void, usize, c_int, c_int, Comm, *mut c_void) -> c_int
    );
    let group_start = sym!(lib, "ncclGroupStart", fn() -> c_int);
    let group_end = sym!(lib, "ncclGroupEnd", fn() -> c_int);
    let check = |what: &str, rc: c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("rank {rank}: {what} returned {rc}"))
        }
    };
    let mut cfg = NcclConfig::INITIALIZER;
    cfg.comm_name = c"fixture-comm".as_ptr();
    let comm = init_world(&lib, rank, 2, dir, &mut cfg)?;
    let null = std::ptr::null_mut();
    let x: Vec<f32> = (0..COUNT).map(|i| (i % 13) as f32 + rank as f32).collect();
    let mut y = vec![f32::NAN; COUNT];
    // SAFETY: host buffers of COUNT floats; the host backend's calls have run when they return.
    unsafe {
        check(
            "ncclAllReduce",
            all_reduce(
                x.as_ptr().cast(),
                y.as_mut_ptr().cast(),
                COUNT,
                NCCL_FLOAT32,
                NCCL_SUM,
                comm,
                null,
            ),
        )?;
    }
    if (0..COUNT).any(|i| y[i] != 2.0 * (i % 13) as f32 + 1.0) {
        return Err(format!("rank {rank}: the profiled all-reduce is wrong"));
    }
    let mut g = vec![-1i32; 2 * 10];
    let mine = [rank as i32; 10];
    // SAFETY: as above.
    unsafe {
        check(
            "ncclAllGather",
            all_gather(
                mine.as_ptr().cast(),
                g.as_mut_ptr().cast(),
                10,
                NCCL_INT32,
                comm,
                null,
            ),
        )?;
    }
    if g[..10].iter().any(|&v| v != 0) || g[10..].iter().any(|&v| v != 1) {
        return Err(format!(
            "rank {rank}: the profiled all-gather is wrong: {g:?}"
        ));
    }
    let peer = 1 - rank as c_int;
    let out = [rank as i32 + 40; 7];
    let mut inb = [-1i32; 7];
    // Between hosts our sends and receives fall back to the real NCCL (none here).
    let p2p = std::env::var_os("MSCCLPP_HOSTID").is_none();
    if p2p {
        // SAFETY: as above; the group's sends and receives run at its end.
        unsafe {
            check("ncclGroupStart", group_start())?;
            check(
                "ncclSend",
                send(out.as_ptr().cast(), 7, NCCL_INT32, peer, comm, null),
            )?;
            check(
                "ncclRecv",
                recv(inb.as_mut_ptr().cast(), 7, NCCL_INT32, peer, comm, null),
            )?;
            check("ncclGroupEnd", group_end())?;
        }
        if inb.iter().any(|&v| v != peer + 40) {
            return Err(format!(
                "rank {rank}: the profiled send/receive is wrong: {inb:?}"
            ));
        }
    }
    let mut child: Comm = null;
    // SAFETY: valid pointers; NULL config inherits.
    unsafe {
        check(
            "ncclCommSplit",
            split(comm, 0, rank as c_int, &mut child, null.cast()),
        )?;
        check("destroy child", destroy(child))?;
        check("destroy", destroy(comm))?;
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// The fixture built for `versions` (one object each, linked into one library).
fn fixture(dir: &Path, versions: &[u32]) -> Result<PathBuf, String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/profiler_plugin.c");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let tag: Vec<String> = versions.iter().map(u32::to_string).collect();
    let so = dir.join(format!("libnccl-profiler-fixture{}.so", tag.join("")));
    let mut objs = Vec::new();
    for v in versions {
        let o = dir.join(format!("fixture-v{v}.o"));
        let st = Command::new(&cc)
            .args(["-c", "-fPIC", "-O2", "-Wall", "-Werror"])
            .arg(format!("-DFIXTURE_PROFILER_VERSION={v}"))
            .arg("-o")
            .arg(&o)
            .arg(&src)
            .status()
            .map_err(|e| format!("running {cc} (a C compiler builds the plugin fixture): {e}"))?;
        if !st.success() {
            return Err(format!("{cc} failed on {} for version {v}", src.display()));
        }
        objs.push(o);
    }
    let st = Command::new(&cc)
        .args(["-shared", "-o"])
        .arg(&so)
        .args(&objs)
        .arg("-lpthread")
        .status()
        .map_err(|e| format!("linking the fixture: {e}"))?;
    if !st.success() {
        return Err("linking the fixture failed".into());
    }
    Ok(so)
}

/// One logged line: its verb and its `key=value` words.
#[derive(Debug, Clone)]
struct Line {
    verb: String,
    kv: HashMap<String, String>,
    text: String,
}

impl Line {
    fn get(&self, k: &str) -> &str {
        self.kv.get(k).map_or("", String::as_str)
    }
    fn num(&self, k: &str) -> u64 {
        self.get(k).parse().unwrap_or(u64::MAX)
    }
}

/// The plugin's logs, one per process (keyed by the first event's rank).
fn logs(dir: &Path, prefix: &str) -> Result<Vec<Vec<Line>>, String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).map_err(|e| e.to_string())?.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with(&format!("{prefix}.")) {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).map_err(|e| e.to_string())?;
        let lines = text
            .lines()
            .map(|l| {
                let mut w = l.split_whitespace();
                let verb = w.next().unwrap_or("").to_owned();
                let kv = w
                    .filter_map(|x| x.split_once('='))
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect();
                Line {
                    verb,
                    kv,
                    text: l.to_owned(),
                }
            })
            .collect();
        out.push(lines);
    }
    Ok(out)
}

/// Runs the two ranks under `env`; returns the logs of the plugin (`log` prefix).
fn run(tag: &str, env: &[(&str, String)]) -> Result<Vec<Vec<Line>>, String> {
    run_on(tag, env, false)
}

/// [`run`], with each rank on its own simulated host when `hosts`.
fn run_on(tag: &str, env: &[(&str, String)], hosts: bool) -> Result<Vec<Vec<Line>>, String> {
    let dir = fresh_dir(&format!("profiler-{tag}"))?;
    let log = dir.join("plugin-log");
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        2,
        Duration::from_secs(120),
        |cmd| {
            cmd.env("FIXTURE_PROFILER_LOG", &log);
            for (k, v) in env {
                cmd.env(k, v);
            }
            if hosts {
                let rank = rank_of(cmd, ROLE_VAR).unwrap_or(0);
                cmd.env(
                    "MSCCLPP_HOSTID",
                    format!("profiler-{}-host-{rank}", std::process::id()),
                );
            }
        },
    );
    let l = logs(&dir, "plugin-log");
    let _ = std::fs::remove_dir_all(&dir);
    ran?;
    l
}

/// The checks of one version's log of one rank.
fn check_rank(v: u32, lines: &[Line]) -> Result<(), String> {
    let fail = |why: String| Err(format!("v{v}: {why}\nlog:\n{}", text(lines)));
    let inits: Vec<&Line> = lines.iter().filter(|l| l.verb == "init").collect();
    // The world and its split child.
    if inits.len() != 2 || inits.iter().any(|l| l.num("v") != u64::from(v)) {
        return fail(format!("{} inits of version {v} expected 2", inits.len()));
    }
    let rank = lines
        .iter()
        .find(|l| l.verb == "start")
        .map_or(u64::MAX, |l| l.num("rank"));
    if rank > 1 {
        return fail("no event names this process's rank".into());
    }
    if v >= 4 {
        let w = inits[0];
        if w.num("rank") != rank || w.num("nranks") != 2 || w.num("nnodes") != 1 {
            return fail(format!("init's rank, size or nodes: {}", w.text));
        }
        if w.get("name") != "fixture-comm" {
            return fail(format!("init's communicator name: {}", w.text));
        }
        if inits[1].get("name") != "fixture-comm" || inits[1].get("id") == w.get("id") {
            return fail("the split child inherits the name and has an id of its own".into());
        }
    }
    let finals = lines.iter().filter(|l| l.verb == "finalize").count();
    if finals != 2
        || lines
            .iter()
            .any(|l| l.verb == "finalize" && l.get("ctx") != "ok")
    {
        return fail(format!(
            "{finals} finalize calls with the init context, expected 2"
        ));
    }
    // Every start is stopped once; parents are events started before.
    let starts: HashMap<u64, &Line> = lines
        .iter()
        .filter(|l| l.verb == "start")
        .map(|l| (l.num("h"), l))
        .collect();
    for (h, l) in &starts {
        let stops = lines
            .iter()
            .filter(|s| s.verb == "stop" && s.num("h") == *h)
            .count();
        if stops != 1 {
            return fail(format!("{} stops of {}", stops, l.text));
        }
        let p = l.num("parent");
        if p != 0 && p >= *h {
            return fail(format!("parent {p} of {h} is not an earlier event"));
        }
        if l.num("rank") != rank {
            return fail(format!("rank of {}", l.text));
        }
    }
    let of_type = |t: u64| -> Vec<&Line> {
        lines
            .iter()
            .filter(|l| l.verb == "start" && l.num("type") == t)
            .collect()
    };
    let colls = of_type(2);
    let p2ps = of_type(4);
    let groups = of_type(1);
    if colls.len() != 2 || p2ps.len() != 2 {
        return fail(format!(
            "{} Coll and {} P2p events, expected 2 and 2",
            colls.len(),
            p2ps.len()
        ));
    }
    let (ar, ag) = (colls[0], colls[1]);
    let (send, recv) = (p2ps[0], p2ps[1]);
    let peer = 1 - rank;
    if v == 1 {
        // Codes: AllReduce 4, AllGather 2; Float32 7, Int8 0; Send 6, Recv 7; Int32 2.
        let want_ar =
            ar.get("func") == "#4" && ar.num("count") == COUNT as u64 && ar.get("dtype") == "#7";
        let want_ag = ag.get("func") == "#2" && ag.num("count") == 40 && ag.get("dtype") == "#0";
        let want_p2p = send.get("func") == "#6"
            && recv.get("func") == "#7"
            && send.get("dtype") == "#2"
            && send.num("peer") == peer
            && send.num("count") == 7;
        if !(want_ar && want_ag && want_p2p) || ar.get("proto") != "#2" && ar.get("proto") != "#0" {
            return fail("the version-1 codes".into());
        }
    } else {
        let want_ar = ar.get("func") == "AllReduce"
            && ar.num("count") == COUNT as u64
            && ar.get("dtype") == "ncclFloat32"
            && ["LL", "LL_SHORT", "LL128", "DIRECT", "READ", "CE", "HIER"]
                .contains(&ar.get("algo"))
            && ["LL", "LL128", "SIMPLE"].contains(&ar.get("proto"));
        // An all-gather counts bytes of ncclInt8, as NCCL reports it.
        let want_ag =
            ag.get("func") == "AllGather" && ag.num("count") == 40 && ag.get("dtype") == "ncclInt8";
        let want_p2p = send.get("func") == "Send"
            && recv.get("func") == "Recv"
            && send.get("dtype") == "ncclInt32"
            && send.num("peer") == peer
            && recv.num("peer") == peer
            && recv.num("count") == 7;
        if !(want_ar && want_ag && want_p2p) {
            return fail("the fields of Coll and P2p".into());
        }
    }
    if ar.get("send") == ar.get("recv") || ar.get("send") == "(nil)" {
        return fail("the all-reduce's buffers".into());
    }
    if ar.num("seq") != 0 || ag.num("seq") != 0 {
        return fail("the first all-reduce and all-gather have sequence number 0".into());
    }
    if v < 5 {
        // No API events; a launch event's parent is its legacy group.
        if lines
            .iter()
            .any(|l| l.verb == "start" && l.num("type") >= 256)
        {
            return fail("API events before version 5".into());
        }
        for c in colls.iter().chain(&p2ps) {
            let p = c.num("parent");
            if !groups.iter().any(|g| g.num("h") == p) {
                return fail(format!("the parent of {} is not a Group", c.text));
            }
        }
        return Ok(());
    }
    let group_apis = of_type(256);
    let coll_apis = of_type(512);
    let p2p_apis = of_type(1024);
    let launches = of_type(2048);
    // Outside groups (all-reduce, all-gather, the split's calls have none) a group of depth 1;
    // the user's group of depth 2 holding both the send and the receive.
    if group_apis.len() != 3 || coll_apis.len() != 2 || p2p_apis.len() != 2 || launches.len() != 2 {
        return fail(format!(
            "{} GroupApi, {} CollApi, {} P2pApi, {} KernelLaunch: expected 3, 2, 2, 2",
            group_apis.len(),
            coll_apis.len(),
            p2p_apis.len(),
            launches.len()
        ));
    }
    let depths: Vec<u64> = group_apis.iter().map(|g| g.num("depth")).collect();
    if depths != [1, 1, 2] {
        return fail(format!("group depths {depths:?}"));
    }
    let ca = coll_apis[0];
    if ca.get("func") != "AllReduce"
        || ca.num("count") != COUNT as u64
        || ca.get("dtype") != "ncclFloat32"
    {
        return fail(format!("CollApi fields: {}", ca.text));
    }
    if coll_apis[1].num("count") != 10 || coll_apis[1].get("dtype") != "ncclInt32" {
        return fail(format!(
            "the all-gather's CollApi keeps the user's count: {}",
            coll_apis[1].text
        ));
    }
    for (api, g) in coll_apis.iter().zip(&group_apis[..2]) {
        if api.num("parent") != g.num("h") {
            return fail(format!("CollApi's parent: {}", api.text));
        }
    }
    for (c, api) in colls.iter().zip(&coll_apis) {
        if c.num("parent") != api.num("h") || !groups.iter().any(|g| g.num("h") == c.num("pgroup"))
        {
            return fail(format!("Coll's parent and parentGroup: {}", c.text));
        }
    }
    for (p, api) in p2ps.iter().zip(&p2p_apis) {
        if p.num("parent") != api.num("h") || api.num("parent") != group_apis[2].num("h") {
            return fail(format!("P2p's chain: {} under {}", p.text, api.text));
        }
    }
    // Each group API event records GroupStartApiStop (23) then GroupEndApiStart (24), no args.
    for g in &group_apis {
        let states: Vec<u64> = lines
            .iter()
            .filter(|l| l.verb == "state" && l.num("h") == g.num("h"))
            .map(|l| l.num("s"))
            .collect();
        if states != [23, 24]
            || lines
                .iter()
                .any(|l| l.verb == "state" && l.num("h") == g.num("h") && l.get("args") != "null")
        {
            return fail(format!("the states of {}: {states:?}", g.text));
        }
    }
    Ok(())
}

fn text(lines: &[Line]) -> String {
    lines
        .iter()
        .map(|l| l.text.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

fn version(v: u32) -> Result<(), Failed> {
    let dir = fresh_dir(&format!("profiler-build-v{v}"))?;
    let so = fixture(&dir, &[v])?;
    let logs = run(
        &format!("v{v}"),
        &[("NCCL_PROFILER_PLUGIN", so.display().to_string())],
    );
    let _ = std::fs::remove_dir_all(&dir);
    let logs = logs?;
    if logs.len() != 2 {
        return Err(format!("{} processes logged, expected 2", logs.len()).into());
    }
    let ids: Vec<String> = logs
        .iter()
        .map(|l| {
            l.iter()
                .find(|l| l.verb == "init")
                .map_or(String::new(), |l| l.get("id").to_owned())
        })
        .collect();
    if v >= 4 && ids[0] != ids[1] {
        return Err(format!("the ranks' commId differ: {ids:?}").into());
    }
    for l in &logs {
        check_rank(v, l)?;
    }
    Ok(())
}

/// The proxy events of one rank's log (two ranks, each its own host): see the file's comment.
fn check_proxy(v: u32, lines: &[Line]) -> Result<(), String> {
    let fail = |why: String| Err(format!("v{v}: {why}\nlog:\n{}", text(lines)));
    let starts: Vec<&Line> = lines.iter().filter(|l| l.verb == "start").collect();
    let of_type = |t: u64| starts.iter().filter(move |l| l.num("type") == t);
    let handle_type: HashMap<u64, u64> =
        starts.iter().map(|l| (l.num("h"), l.num("type"))).collect();
    let states = |h: u64| -> Vec<&Line> {
        lines
            .iter()
            .filter(|l| l.verb == "state" && l.num("h") == h)
            .collect()
    };
    let stop_at = |h: u64| {
        lines
            .iter()
            .position(|l| l.verb == "stop" && l.num("h") == h)
    };
    let rank = starts.first().map_or(u64::MAX, |l| l.num("rank"));
    let ops: Vec<&&Line> = of_type(1 << 3).collect();
    if ops.is_empty() {
        return fail("no ProxyOp event".into());
    }
    for op in &ops {
        let oh = op.num("h");
        if handle_type.get(&op.num("parent")) != Some(&2) {
            return fail(format!("ProxyOp {oh}'s parent is not a Coll"));
        }
        if op.num("pid") == 0
            || op.num("channel") != 1 - rank
            || op.num("peer") != 1 - rank
            || op.get("send") != "1"
            || op.num("steps") == 0
            || op.num("chunk") == 0
        {
            return fail(format!("ProxyOp fields: {}", op.text));
        }
        let steps: Vec<&&Line> = of_type(1 << 4).filter(|s| s.num("parent") == oh).collect();
        let numbers: Vec<u64> = steps.iter().map(|s| s.num("step")).collect();
        let n = op.num("steps");
        if numbers != (0..n).collect::<Vec<_>>() {
            return fail(format!(
                "ProxyOp {oh} has {n} steps, its ProxySteps say {numbers:?}"
            ));
        }
        let Some(op_stop) = stop_at(oh) else {
            return fail(format!("ProxyOp {oh} not stopped"));
        };
        for s in &steps {
            let sh = s.num("h");
            let st = states(sh);
            let codes: Vec<&str> = st.iter().map(|l| l.get("s")).collect();
            let trans = st.last().map_or(0, |l| l.num("trans"));
            if codes != ["8", "9"] || trans == 0 || trans > op.num("chunk") {
                return fail(format!(
                    "ProxyStep {sh}: states {codes:?}, transSize {trans}"
                ));
            }
            if stop_at(sh).is_none_or(|at| at > op_stop) {
                return fail(format!("ProxyStep {sh} not stopped before its ProxyOp"));
            }
        }
        let codes: Vec<String> = states(oh).iter().map(|l| l.get("s").to_owned()).collect();
        let want: Vec<String> = if v >= 4 {
            vec!["19".into()]
        } else {
            let mut w = vec!["2".to_string(); n as usize];
            w.push("3".into());
            w
        };
        if codes != want {
            return fail(format!(
                "ProxyOp {oh}'s states {codes:?}, expected {want:?}"
            ));
        }
    }
    let ctrls: Vec<&&Line> = of_type(1 << 5).collect();
    if ctrls.is_empty() {
        return fail("no ProxyCtrl event".into());
    }
    for c in ctrls {
        let ch = c.num("h");
        let codes: Vec<&str> = states(ch).iter().map(|l| l.get("s")).collect();
        if codes != ["14", "13"] || stop_at(ch).is_none() || c.num("parent") != 0 {
            return fail(format!(
                "ProxyCtrl {ch}: states {codes:?}, parent {}",
                c.get("parent")
            ));
        }
    }
    let stopped = lines.iter().filter(|l| l.verb == "stop").count();
    if stopped != starts.len() {
        return fail(format!(
            "{} events started, {stopped} stopped",
            starts.len()
        ));
    }
    Ok(())
}

/// Two ranks on two simulated hosts (slots of 4 KiB: several steps per operation), version
/// `v`: the proxy events.
fn hosts(v: u32) -> Result<(), Failed> {
    let dir = fresh_dir(&format!("profiler-build-hosts-v{v}"))?;
    let so = fixture(&dir, &[v])?;
    let logs = run_on(
        &format!("hosts-v{v}"),
        &[
            ("NCCL_PROFILER_PLUGIN", so.display().to_string()),
            ("MSCCLPP_HIER_SLOT_BYTES", "4096".into()),
        ],
        true,
    );
    let _ = std::fs::remove_dir_all(&dir);
    let logs = logs?;
    if logs.len() != 2 {
        return Err(format!("{} processes logged, expected 2", logs.len()).into());
    }
    for l in &logs {
        check_proxy(v, l)?;
    }
    Ok(())
}

/// A library exporting versions 4 and 6 is used as 6; a name is tried as
/// `libnccl-profiler-<name>.so` on the loader's path.
fn newest_first() -> Result<(), Failed> {
    let dir = fresh_dir("profiler-build-46")?;
    let so = fixture(&dir, &[4, 6])?;
    let named = dir.join("libnccl-profiler-pair.so");
    std::fs::copy(&so, &named).map_err(|e| e.to_string())?;
    let logs = run(
        "pair",
        &[
            ("NCCL_PROFILER_PLUGIN", "pair".into()),
            ("LD_LIBRARY_PATH", dir.display().to_string()),
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
    for l in logs? {
        check_rank(6, &l)?;
    }
    Ok(())
}

/// A mask of 0: `init` and `finalize`, no events; an `init` that fails: nothing more, and the
/// communicator works (the ranks check their results); `none`: nothing loaded.
fn quiet_cases() -> Result<(), Failed> {
    let dir = fresh_dir("profiler-build-quiet")?;
    let so = fixture(&dir, &[6])?.display().to_string();
    let plugin = ("NCCL_PROFILER_PLUGIN", so.clone());
    let masked = run(
        "mask0",
        &[plugin.clone(), ("FIXTURE_PROFILER_MASK", "0".into())],
    );
    let failing = run(
        "failinit",
        &[plugin, ("FIXTURE_PROFILER_FAIL_INIT", "1".into())],
    );
    let none = run("none", &[("NCCL_PROFILER_PLUGIN", "none".into())]);
    let _ = std::fs::remove_dir_all(&dir);
    for l in masked? {
        let verbs: Vec<&str> = l.iter().map(|l| l.verb.as_str()).collect();
        if verbs != ["init", "init", "finalize", "finalize"] {
            return Err(format!("mask 0: {verbs:?}").into());
        }
    }
    for l in failing? {
        let verbs: Vec<&str> = l.iter().map(|l| l.verb.as_str()).collect();
        if verbs != ["init", "init"] {
            return Err(format!("a failing init: {verbs:?}").into());
        }
    }
    if !none?.is_empty() {
        return Err("NCCL_PROFILER_PLUGIN=none loaded a plugin".into());
    }
    Ok(())
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    let args = libtest_mimic::Arguments::from_args();
    let mut trials: Vec<Trial> = (1..=6)
        .map(|v| Trial::test(format!("profiler::host::abi_v{v}"), move || version(v)))
        .collect();
    trials.extend((1..=6).map(|v| {
        Trial::test(
            format!("profiler::host::proxy_events_two_hosts_v{v}"),
            move || hosts(v),
        )
    }));
    trials.push(Trial::test(
        "profiler::host::newest_version_first",
        newest_first,
    ));
    trials.push(Trial::test(
        "profiler::host::mask_zero_failed_init_and_none",
        quiet_cases,
    ));
    libtest_mimic::run(&args, trials).exit();
}
