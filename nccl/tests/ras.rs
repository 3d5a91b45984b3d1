//! NCCL's RAS client service through the C ABI on the host backend: three ranks as child
//! processes, every one listening on the same `NCCL_RAS_ADDR` (as NCCL's processes do), asked as
//! NCCL's `ncclras` client asks: the protocol handshake, `TIMEOUT`, `SET FORMAT json`, `STATUS`.
//! Checked: the JSON document (one communicator of 3 ranks, each with its process, host and
//! per-collective counts after 2 all-reduces and an all-gather, no rank missing), the text report
//! of a healthy job (NCCL's job summary and communicators table), bad commands answered with
//! NCCL's errors; then ranks 0 and 1 start a third all-reduce that rank 2 does not join, and the
//! report (asked of rank 2's service, while the others wait inside the call) names the
//! mismatch: two ranks up to operation 3, rank 2 up to 2. Runs with
//! `cargo test -p mscclpp-nccl --test ras`.

#[macro_use]
mod support;
use std::ffi::{c_int, c_void};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{
    CollFn, Comm, MoveFn, fresh_dir, init_world, lib_path, mark, open_lib, run_if_rank, run_ranks,
    wait_file,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_RAS_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_RAS_TEST_DIR";
const NRANKS: usize = 3;
const NCCL_FLOAT32: c_int = 7;
const NCCL_SUM: c_int = 0;

/// A client connection: one command, its one-line answer.
struct Client {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Client {
    fn connect(addr: &str) -> Result<Self, String> {
        let s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(30)))
            .map_err(|e| e.to_string())?;
        Ok(Client {
            w: s.try_clone().map_err(|e| e.to_string())?,
            r: BufReader::new(s),
        })
    }

    fn ask(&mut self, cmd: &str) -> Result<String, String> {
        self.w
            .write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.r
            .read_line(&mut line)
            .map_err(|e| format!("{cmd}: {e}"))?;
        Ok(line)
    }

    /// Sends `cmd` and reads to the end (the report, then the service closes).
    fn report(mut self, cmd: &str) -> Result<String, String> {
        self.w
            .write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut all = String::new();
        self.r
            .read_to_string(&mut all)
            .map_err(|e| format!("{cmd}: {e}"))?;
        Ok(all)
    }
}

/// The handshake as `ncclras` makes it, then `STATUS` in `format`.
fn status(addr: &str, format: &str) -> Result<String, String> {
    let mut c = Client::connect(addr)?;
    let hello = c.ask("CLIENT PROTOCOL 2")?;
    if hello != "SERVER PROTOCOL 2\n" {
        return Err(format!("handshake answered {hello:?}"));
    }
    let t = Instant::now();
    for (cmd, want) in [
        ("TIMEOUT 5", "OK\n"),
        (&*format!("SET FORMAT {format}"), "OK\n"),
    ] {
        let got = c.ask(cmd)?;
        if got != want {
            return Err(format!("{cmd} answered {got:?}"));
        }
    }
    if t.elapsed() > Duration::from_secs(1) {
        return Err(format!(
            "the commands took {:?} (ncclras waits 1 s)",
            t.elapsed()
        ));
    }
    c.report("STATUS")
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let abort = sym!(lib, "ncclCommAbort", fn(Comm) -> c_int);
    let all_reduce: CollFn = sym!(lib, "ncclAllReduce" as CollFn);
    let all_gather: MoveFn = sym!(lib, "ncclAllGather" as MoveFn);
    let addr = std::env::var("NCCL_RAS_ADDR").map_err(|_| "NCCL_RAS_ADDR unset")?;
    let comm = init_world(&lib, rank, NRANKS, dir, std::ptr::null_mut())?;
    let mut x = vec![1.0f32; 256];
    let p = x.as_mut_ptr().cast::<c_void>();
    let null = std::ptr::null_mut();
    let mut g = vec![0.0f32; 3 * 8];
    // SAFETY: host buffers; the host backend's calls have run when they return.
    unsafe {
        for _ in 0..2 {
            if all_reduce(p, p, 256, NCCL_FLOAT32, NCCL_SUM, comm, null) != 0 {
                return Err("all-reduce failed".into());
            }
        }
        if all_gather(p, g.as_mut_ptr().cast(), 8, NCCL_FLOAT32, comm, null) != 0 {
            return Err("all-gather failed".into());
        }
    }
    mark(&dir.join(format!("ready-{rank}")), b"")?;
    if rank == 0 {
        for r in 0..NRANKS {
            wait_file(&dir.join(format!("ready-{r}")))?;
        }
        healthy(&addr, dir)?;
        mark(&dir.join("healthy"), b"")?;
    }
    wait_file(&dir.join("healthy"))?;
    if rank == 2 {
        // Ranks 0 and 1 are (about to be) inside a third all-reduce this rank never joins.
        wait_file(&dir.join("entered-0"))?;
        wait_file(&dir.join("entered-1"))?;
        std::thread::sleep(Duration::from_millis(300));
        let report = status(&addr, "text")?;
        std::fs::write(dir.join("mismatch-report"), &report).map_err(|e| e.to_string())?;
        let want = [
            "MISMATCH",
            "  Communicator ranks have different AllReduce operation counts",
            "  2 ranks have launched up to operation 3",
            "  Rank 2 has launched up to operation 2 -- GPU",
        ];
        mark(&dir.join("asked"), b"")?;
        if let Some(w) = want.iter().find(|w| !report.contains(*w)) {
            return Err(format!("the report does not say {w:?}:\n{report}"));
        }
    } else {
        mark(&dir.join(format!("entered-{rank}")), b"")?;
        // SAFETY: as above; fails once the host backend's wait (MSCCLPP_HOST_WAIT) runs out.
        let rc = unsafe { all_reduce(p, p, 256, NCCL_FLOAT32, NCCL_SUM, comm, null) };
        if rc == 0 {
            return Err("the third all-reduce succeeded without rank 2".into());
        }
        wait_file(&dir.join("asked"))?;
    }
    // SAFETY: the communicator made above.
    unsafe { abort(comm) };
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

/// The JSON and text reports of the healthy job, and NCCL's answers to bad commands.
fn healthy(addr: &str, dir: &Path) -> Result<(), String> {
    let text = status(addr, "json")?;
    let doc: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("the JSON report: {e}\n{text}"))?;
    let comms = doc["communicators"].as_array().ok_or("no communicators")?;
    if doc["communicators_count"] != 1 || comms.len() != 1 {
        return Err(format!("one communicator expected:\n{text}"));
    }
    let c = &comms[0];
    if c["size"] != 3 || c["ranks_count"] != 3 || c["missing_ranks_count"] != 0 {
        return Err(format!("sizes: {c}"));
    }
    let ranks = c["ranks"].as_array().ok_or("no ranks")?;
    let mut pids = std::collections::BTreeSet::new();
    for (r, x) in ranks.iter().enumerate() {
        let counts = &x["collective_counts"];
        let ok = x["rank"] == r
            && counts["AllReduce"] == 2
            && counts["AllGather"] == 1
            && counts["Broadcast"] == 0
            && x["status"]["abort_flag"] == false
            && x["status"]["init_state"] == 0
            && x["host"]
                .as_str()
                .is_some_and(|h| h.parse::<std::net::IpAddr>().is_ok());
        if !ok {
            return Err(format!("rank {r}: {x}"));
        }
        pids.insert(x["pid"].as_i64().unwrap_or(-1));
    }
    if pids.len() != 3 {
        return Err(format!("three processes expected: {pids:?}"));
    }
    let report = status(addr, "text")?;
    std::fs::write(dir.join("healthy-report"), &report).map_err(|e| e.to_string())?;
    let want = [
        "Job summary\n===========\n",
        "  Nodes  Processes         GPUs  Processes     GPUs\n(total)   per node  per process    (total)  (total)\n      1          3            1          3        3\n",
        "Group     Comms     Nodes     Ranks     Ranks     Ranks    Status  Errors\n    #  in group  per comm  per node  per comm  in group\n    0         1         1         3         3         3   RUNNING      OK\n",
        "\nErrors\n======\n\nWarnings\n========\n\n",
    ];
    if let Some(w) = want.iter().find(|w| !report.contains(*w)) {
        return Err(format!("the text report lacks {w:?}:\n{report}"));
    }
    let mut c = Client::connect(addr)?;
    for (cmd, want) in [
        ("bogus", "ERROR: Unknown command bogus\n"),
        ("SET FORMAT xml", "ERROR: Invalid format xml\n"),
        ("TIMEOUT soon", "ERROR: Invalid timeout value soon\n"),
        ("monitor", "OK\n"),
        ("client protocol 2", "SERVER PROTOCOL 2\n"),
    ] {
        let got = c.ask(cmd)?;
        if got != want {
            return Err(format!("{cmd:?} answered {got:?}, expected {want:?}"));
        }
    }
    Ok(())
}

fn fail(msg: &str) -> ! {
    eprintln!("ras: {msg}");
    std::process::exit(1)
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("ras").unwrap_or_else(|e| fail(&e));
    // A port of its own (the default, 28028, may be another job's).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| fail(&e.to_string()));
    let addr = format!("127.0.0.1:{port}");
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(120),
        |cmd| {
            cmd.env("NCCL_RAS_ADDR", &addr)
                .env("MSCCLPP_HOST_WAIT", "8");
        },
    );
    let healthy = std::fs::read_to_string(dir.join("healthy-report")).unwrap_or_default();
    let mismatch = std::fs::read_to_string(dir.join("mismatch-report")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!("ras: the healthy job's report:\n{healthy}");
    println!("ras: with rank 2 behind:\n{mismatch}");
}
