//! `mscclpp-perf moe`: the expert-parallel benchmark runs on the host backend (ranks as
//! processes), prints a row per token count with every received row checked, and refuses shapes
//! the exchange cannot serve.

use std::process::Command;

const PERF: &str = env!("CARGO_BIN_EXE_mscclpp-perf");

fn perf(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(PERF)
        .args(args)
        .env("MSCCLPP_BACKEND", "host")
        .output()
        .expect("mscclpp-perf runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_moe_benchmark_checks_every_received_row() {
    let (ok, out, err) = perf(&[
        "moe",
        "--ranks",
        "3",
        "--hidden",
        "64",
        "--experts",
        "24",
        "--topk",
        "3",
        "--tokens",
        "1,40",
        "-n",
        "2",
        "-w",
        "1",
    ]);
    assert!(ok, "{out}{err}");
    let rows: Vec<Vec<&str>> = out
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "{out}");
    for (row, tokens) in rows.iter().zip(["1", "40"]) {
        // tokens, rows, dispatch_us, GB/s, combine_us, GB/s, wrong, then (one host) the
        // expert-major form's ll_dispatch_us, ll_combine_us
        assert_eq!(row.len(), 9, "{out}");
        assert_eq!(row[0], tokens, "{out}");
        assert_eq!(row[6], "0", "{out}");
        let received: f64 = row[1].parse().unwrap();
        assert!(received > 0.0, "{out}");
        for us in &row[7..] {
            assert!(us.parse::<f64>().unwrap() > 0.0, "{out}");
        }
    }
    assert!(out.contains("# wrong rows in all: 0"), "{out}");
}

#[test]
fn the_moe_benchmark_refuses_what_it_cannot_serve() {
    for (args, want) in [
        (
            &["moe", "--ranks", "3", "--experts", "10"][..],
            "--experts 10",
        ),
        (&["moe", "--topk", "0"][..], "--topk 0"),
        (
            &["moe", "--tokens", "12,x"][..],
            "x is not a positive token count",
        ),
        (&["moe", "-d", "half"][..], "-d does not apply to moe"),
    ] {
        let (ok, out, err) = perf(args);
        assert!(!ok && err.contains(want), "{args:?}: {out}{err}");
    }
}
