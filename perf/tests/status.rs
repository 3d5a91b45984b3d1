//! `mscclpp-perf status ADDR TOKEN`: the command an operator runs against a job's status
//! service. Two bootstrap ranks in this process, rank 1 one call behind; the command prints
//! both ranks' last calls and names rank 1 as behind; a wrong token exits with an error.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use mscclpp::comm::bootstrap::{Bootstrap, BootstrapConfig, UniqueId};

const PERF: &str = env!("CARGO_BIN_EXE_mscclpp-perf");

#[test]
fn the_status_command_prints_who_is_behind() {
    let uid = UniqueId::with_root("127.0.0.1:0".parse().unwrap()).unwrap();
    let cfg = BootstrapConfig {
        timeout: Duration::from_secs(30),
        ..BootstrapConfig::default()
    };
    let (c1, u1) = (cfg.clone(), uid);
    let other = std::thread::spawn(move || {
        let b = Bootstrap::new(&u1, 1, 2, c1).unwrap();
        b.note_call("allgather", 512);
        b.barrier().unwrap();
        // Waits here (its event loop answering) while rank 0 runs the command.
        b.barrier().unwrap();
    });
    let b = Arc::new(Bootstrap::new(&uid, 0, 2, cfg).unwrap());
    b.note_call("allgather", 512);
    b.note_call("allreduce", 1 << 20);
    b.barrier().unwrap();
    let server = b.serve_status("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = server.addr().to_string();
    let out = Command::new(PERF)
        .args(["status", &addr, server.token()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let bad = Command::new(PERF)
        .args(["status", &addr, &"f".repeat(32)])
        .output()
        .unwrap();
    b.barrier().unwrap();
    other.join().unwrap();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("rank 0: call #2 allreduce of 1048576 bytes")
            && text.contains("rank 1: call #1 allgather of 512 bytes")
            && text.contains("behind (the most calls is 2): rank 1 (call #1 allgather"),
        "{text}"
    );
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("wrong token"),
        "{err}"
    );
}
