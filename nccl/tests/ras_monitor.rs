//! NCCL's RAS monitor mode (`MONITOR`, NCCL 2.29+) through the C ABI on the host backend: three
//! ranks as child processes; rank 0's process serves RAS (`NCCL_RAS_ADDR`), rank 1 is the
//! monitoring client (as `ncclras -m` is: `CLIENT PROTOCOL 2`, `MONITOR`, then lines). After
//! it subscribes, the ranks split their communicator: rank 0's service says `PEER_NEW` for the
//! processes of ranks 1 and 2, each by pid, host and device; then rank 2's process exits
//! without a word and the service says `PEER_DEAD` naming that process. Bad groups are refused
//! with NCCL's error. Runs with `cargo test -p mscclpp-nccl --test ras_monitor`.

#[macro_use]
mod support;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use support::{
    Comm, free_port, fresh_dir, init_world, lib_path, mark, open_lib, rank_of, run_if_rank,
    run_ranks, wait_file,
};

const ROLE_VAR: &str = "MSCCLPP_NCCL_RAS_MONITOR_TEST_RANK";
const DIR_VAR: &str = "MSCCLPP_NCCL_RAS_MONITOR_TEST_DIR";
const NRANKS: usize = 3;

/// Lines from the monitor until `want` matches one, for at most 20 s.
fn read_until(
    r: &mut BufReader<TcpStream>,
    seen: &mut Vec<String>,
    want: impl Fn(&str) -> bool,
) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let mut line = String::new();
        match r.read_line(&mut line) {
            Ok(0) => return Err(format!("the service closed; lines so far: {seen:?}")),
            Ok(_) => {
                seen.push(line.clone());
                if want(&line) {
                    return Ok(line);
                }
            }
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut => {}
            Err(e) => return Err(format!("reading the monitor: {e}")),
        }
    }
    Err(format!("no such line in 20 s; lines: {seen:?}"))
}

fn monitor(dir: &Path, addr: &str) -> Result<(), String> {
    let s = TcpStream::connect(addr).map_err(|e| format!("connecting to {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_millis(500)))
        .map_err(|e| e.to_string())?;
    let mut w = s.try_clone().map_err(|e| e.to_string())?;
    let mut r = BufReader::new(s);
    let mut ask = |cmd: &str| -> Result<String, String> {
        w.write_all(format!("{cmd}\n").as_bytes())
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while line.is_empty() && Instant::now() < deadline {
            let _ = r.read_line(&mut line);
        }
        Ok(line)
    };
    if ask("CLIENT PROTOCOL 2")? != "SERVER PROTOCOL 2\n" {
        return Err("no protocol handshake".into());
    }
    let bad = ask("MONITOR lifecycle,bogus")?;
    if bad != "ERROR: Invalid event group 'bogus'\n" {
        return Err(format!("a bad group answered {bad:?}"));
    }
    let ok = ask("MONITOR")?;
    if ok != "OK\n" {
        return Err(format!("MONITOR answered {ok:?}"));
    }
    mark(&dir.join("monitoring"), b"")?;
    let pid2: i64 = String::from_utf8_lossy(&wait_file(&dir.join("pid-2"))?)
        .trim()
        .parse()
        .map_err(|e| format!("rank 2's pid: {e}"))?;
    let pid1 = i64::from(std::process::id());
    let mut seen = Vec::new();
    let mut news = Vec::new();
    for _ in 0..2 {
        let l = read_until(&mut r, &mut seen, |l| l.contains("] PEER_NEW: Process "))?;
        news.push(l);
    }
    for pid in [pid1, pid2] {
        let want = format!("PEER_NEW: Process {pid} on node ");
        if !news.iter().any(|l| l.contains(&want)) {
            return Err(format!("no PEER_NEW for process {pid}: {news:?}"));
        }
    }
    mark(&dir.join("seen-new"), b"")?;
    let dead = read_until(&mut r, &mut seen, |l| l.contains("] PEER_DEAD: "))?;
    if !dead.contains(&format!("PEER_DEAD: Process {pid2} on node "))
        || !dead.contains(" managing GPU 2 ")
    {
        return Err(format!(
            "PEER_DEAD does not name rank 2's process {pid2}: {dead:?}"
        ));
    }
    std::fs::write(dir.join("events"), seen.concat()).map_err(|e| e.to_string())?;
    mark(&dir.join("seen-dead"), b"")
}

fn rank_main(rank: usize, dir: &Path) -> Result<(), String> {
    let lib = open_lib()?;
    let split = sym!(
        lib,
        "ncclCommSplit",
        fn(Comm, i32, i32, *mut Comm, *mut std::ffi::c_void) -> i32
    );
    let abort = sym!(lib, "ncclCommAbort", fn(Comm) -> i32);
    let comm = init_world(&lib, rank, NRANKS, dir, std::ptr::null_mut())?;
    if rank == 1 {
        let addr = String::from_utf8_lossy(&wait_file(&dir.join("addr"))?).into_owned();
        // The client runs beside this rank's own part in the split.
        let d = dir.to_path_buf();
        let client = std::thread::spawn(move || monitor(&d, &addr));
        wait_file(&dir.join("monitoring"))?;
        let mut child: Comm = std::ptr::null_mut();
        // SAFETY: a live communicator; NULL config inherits.
        let rc = unsafe { split(comm, 0, rank as i32, &mut child, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!("rank 1: split returned {rc}"));
        }
        client
            .join()
            .map_err(|_| "the monitor thread panicked".to_string())??;
        // SAFETY: the communicators made above (a peer is dead: aborted).
        unsafe {
            abort(child);
            abort(comm);
        }
    } else {
        if rank == 0 {
            mark(
                &dir.join("addr"),
                std::env::var("NCCL_RAS_ADDR")
                    .unwrap_or_default()
                    .as_bytes(),
            )?;
        }
        wait_file(&dir.join("monitoring"))?;
        let mut child: Comm = std::ptr::null_mut();
        // SAFETY: as above.
        let rc = unsafe { split(comm, 0, rank as i32, &mut child, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(format!("rank {rank}: split returned {rc}"));
        }
        if rank == 2 {
            mark(
                &dir.join("pid-2"),
                std::process::id().to_string().as_bytes(),
            )?;
            wait_file(&dir.join("seen-new"))?;
            std::fs::write(dir.join("done-2"), b"").map_err(|e| e.to_string())?;
            // Gone without a goodbye: no destroy, no abort.
            std::process::exit(0);
        }
        wait_file(&dir.join("seen-dead"))?;
        // SAFETY: as above.
        unsafe {
            abort(child);
            abort(comm);
        }
    }
    std::fs::write(dir.join(format!("done-{rank}")), b"").map_err(|e| e.to_string())?;
    Ok(())
}

fn fail(msg: &str) -> ! {
    eprintln!("ras_monitor: {msg}");
    std::process::exit(1)
}

fn main() {
    run_if_rank(ROLE_VAR, DIR_VAR, rank_main);
    if let Err(e) = lib_path() {
        fail(&e);
    }
    let dir = fresh_dir("ras-monitor").unwrap_or_else(|e| fail(&e));
    let port = free_port().unwrap_or_else(|e| fail(&e));
    let ran = run_ranks(
        (ROLE_VAR, DIR_VAR),
        &dir,
        NRANKS,
        Duration::from_secs(120),
        |cmd| {
            // Rank 0's process alone serves RAS.
            if rank_of(cmd, ROLE_VAR) == Some(0) {
                cmd.env("NCCL_RAS_ADDR", format!("127.0.0.1:{port}"));
            } else {
                cmd.env("NCCL_RAS_ENABLE", "0");
            }
        },
    );
    let events = std::fs::read_to_string(dir.join("events")).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(e) = ran {
        fail(&e);
    }
    println!("ras_monitor: the monitor read:\n{events}");
}
