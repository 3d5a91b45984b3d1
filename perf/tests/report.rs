//! `mscclpp-perf report` from a real run: a tiny host-backend all-reduce and memory-channel
//! benchmark with `-J -` (JSON lines) and an all-gather with `-J FILE` (one document, as
//! nccl-tests writes it), then the page: an `<svg>` per plot, the series, the run's command.

use std::path::Path;
use std::process::Command;

const PERF: &str = env!("CARGO_BIN_EXE_mscclpp-perf");

fn perf(args: &[&str]) -> std::process::Output {
    Command::new(PERF)
        .args(args)
        .env("MSCCLPP_BACKEND", "host")
        .output()
        .expect("mscclpp-perf runs")
}

fn json_run(dir: &Path, name: &str, args: &[&str]) -> String {
    let out = perf(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let file = dir.join(name);
    std::fs::write(&file, &out.stdout).unwrap();
    file.to_str().unwrap().to_string()
}

#[test]
fn report_of_a_host_run_has_its_plots_and_series() {
    let dir = std::env::temp_dir().join(format!("mscclpp-perf-report-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let small = [
        "-b", "1K", "-e", "16K", "-f", "4", "-n", "3", "-w", "1", "-J", "-",
    ];
    let ar = json_run(&dir, "allreduce.jsonl", &small);
    let mut mc_args = vec!["memory-channel"];
    mc_args.extend_from_slice(&small);
    let mc = json_run(&dir, "channel.jsonl", &mc_args);
    // -J FILE: the table on standard output, the document in the file.
    let doc = dir.join("allgather.json");
    let mut ag_args = vec!["allgather"];
    ag_args.extend_from_slice(&small[..small.len() - 2]);
    ag_args.extend_from_slice(&["-J", doc.to_str().unwrap()]);
    let ag = perf(&ag_args);
    let html = dir.join("report.html");
    let out = perf(&[
        "report",
        &ar,
        &mc,
        doc.to_str().unwrap(),
        "--output",
        html.to_str().unwrap(),
    ]);
    // Without --output the page goes beside the first file.
    let beside = perf(&["report", doc.to_str().unwrap()]);
    let page = std::fs::read_to_string(&html).unwrap_or_default();
    let first = std::fs::read_to_string(&ar).unwrap_or_default();
    let document = std::fs::read_to_string(&doc).unwrap_or_default();
    let default_page = dir.join("mscclpp-perf-report.html").exists();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        ag.status.success(),
        "{}",
        String::from_utf8_lossy(&ag.stderr)
    );
    assert!(beside.status.success());
    assert!(default_page, "the default page is beside the first file");
    let table = String::from_utf8_lossy(&ag.stdout);
    assert!(table.contains("# Writing JSON output to"), "{table}");
    assert!(table.contains("# Out of bounds values : 0 OK"), "{table}");
    assert!(table.contains("# Avg bus bandwidth    : "), "{table}");
    // Comments are wrapped at 100 characters; the two column-title lines are as wide as the
    // rows under them.
    let columns = |l: &str| l.contains("size(B)") || l.contains("(elements)");
    assert!(
        table
            .lines()
            .all(|l| !l.starts_with('#') || l.chars().count() <= 100 || columns(l)),
        "{table}"
    );
    // One JSON document: nccl-tests' shape (results, out_of_bounds, average_bus_bandwidth).
    assert!(document.trim_start().starts_with('{'), "{document}");
    assert!(document.contains("\"results\""), "{document}");
    assert!(document.contains("\"out_of_bounds\""), "{document}");
    assert!(document.contains("\"average_bus_bandwidth\""), "{document}");
    assert!(document.contains("\"bus_bw\""), "{document}");
    // Standard output under -J is JSON lines only, the meta line first.
    assert!(first.starts_with("{\"meta\":"), "{first}");
    assert!(first.lines().all(|l| l.starts_with('{')), "{first}");
    assert_eq!(page.matches("<svg").count(), 2, "bus bandwidth and time");
    for needle in [
        "allreduce mscclpp",
        "memory-channel mscclpp",
        "allgather mscclpp",
        "mscclpp-perf -b 1K -e 16K -f 4 -n 3 -w 1 -J -",
        "Host backend",
        "no ratio plot",
    ] {
        assert!(page.contains(needle), "{needle} missing from the page");
    }
    // The page is self-contained: no scripts, styles or images from elsewhere.
    assert!(!page.contains("<script"));
    assert!(!page.contains("src=\""));
}

#[test]
fn report_refuses_what_it_cannot_read() {
    let out = perf(&["report", "/nonexistent/run.jsonl"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/run.jsonl"), "{err}");
    let out = perf(&["report", "-o", "max", "x.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
}
