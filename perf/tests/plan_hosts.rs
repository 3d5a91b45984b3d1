//! `mscclpp-perf plan --hosts`: a multi-node-shaped plan (memory channels within a host, port
//! channels between hosts; `testgen::allgather_hosts`) on 4 ranks split into 2 simulated hosts,
//! beside the built-in (hierarchical) all-gather on the same buffers: both checked, 0 wrong, the
//! preamble naming the hosts; a split that does not divide the ranks is refused naming it.

use std::process::Command;

const PERF: &str = env!("CARGO_BIN_EXE_mscclpp-perf");

fn perf(args: &[&str]) -> std::process::Output {
    Command::new(PERF)
        .args(args)
        .env("MSCCLPP_BACKEND", "host")
        .output()
        .expect("mscclpp-perf runs")
}

#[test]
fn a_plan_across_simulated_hosts_runs_beside_the_builtin() {
    let dir = std::env::temp_dir().join(format!("mscclpp-perf-hosts-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("allgather_hosts_2x2.json");
    std::fs::write(
        &file,
        mscclpp::executor::testgen::allgather_hosts(2, 2, false).to_string(),
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = perf(&[
        "plan", path, "--ranks", "4", "--hosts", "2", "-b", "4K", "-e", "64K", "-f", "4", "-n",
        "2", "-w", "1",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("4 ranks on 2 hosts"), "{text}");
    assert!(
        text.contains("# wrong values (all ranks, ours and the baseline's): 0 OK"),
        "{text}"
    );
    // Three sizes, each a row with the plan's and the built-in's columns.
    let rows = text
        .lines()
        .filter(|l| !l.starts_with('#') && l.split_whitespace().count() > 10)
        .count();
    assert_eq!(rows, 3, "{text}");
    let bad = perf(&["plan", path, "--ranks", "4", "--hosts", "3"]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success() && err.contains("--hosts 3"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}
