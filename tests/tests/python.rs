//! The Python package (`python/`, import name `mscclpp_rs`) through `ci/python.sh`: a venv,
//! `pip install ./python` (maturin, its own target directory `python/target`), then its pytest
//! suite on the host backend. Part of `cargo test --workspace`, the README's test command, so
//! that the Python tests run wherever the Rust ones do.
//!
//! Without a Python 3 that can make a venv, or without access to PyPI (maturin, pytest, numpy),
//! the test prints "skipped: <reason>" and returns — unless `MSCCLPP_REQUIRE_PYTHON=1` (CI,
//! through `ci/check.sh`), where it fails.

use std::path::Path;
use std::process::Command;

/// Straight to stderr, past the harness's capture, so that "skipped: ..." shows in every run.
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

fn required() -> bool {
    std::env::var("MSCCLPP_REQUIRE_PYTHON").is_ok_and(|v| v == "1")
}

/// Why this machine cannot run the Python tests, if it cannot.
fn unavailable(python: &str) -> Option<String> {
    let probe = Command::new(python)
        .args([
            "-c",
            "import venv, ensurepip, sys; assert sys.version_info >= (3, 9)",
        ])
        .output();
    match probe {
        Err(e) => Some(format!("{python} cannot be run: {e}")),
        Ok(o) if !o.status.success() => Some(format!(
            "{python} is not a Python >= 3.9 with venv and ensurepip: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Ok(_) => None,
    }
}

#[test]
fn python_package_builds_and_its_tests_pass_or_skipped() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let python = std::env::var("MSCCLPP_PYTHON").unwrap_or_else(|_| "python3".into());
    if let Some(why) = unavailable(&python) {
        assert!(!required(), "MSCCLPP_REQUIRE_PYTHON=1 but {why}");
        report!("skipped: {why}");
        return;
    }
    let out = Command::new("bash")
        .arg(root.join("ci/python.sh"))
        .env("MSCCLPP_PYTHON", &python)
        // The outer cargo's settings are for the workspace, not for the extension's build.
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("RUSTFLAGS")
        .output()
        .expect("bash runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let offline = stderr.contains("Could not find a version that satisfies")
        || stderr.contains("No matching distribution found")
        || stderr.contains("Failed to establish a new connection");
    if !out.status.success() && offline && !required() {
        report!("skipped: pip could not reach the package index for maturin, pytest and numpy");
        return;
    }
    // The pytest summary line (counts of passed and skipped) in every run's log. ci/python.sh's
    // own lines already start with "python:": they are not prefixed twice.
    for line in stdout
        .lines()
        .filter(|l| l.contains("passed") || l.starts_with("python:"))
    {
        report!("{}", prefixed(line));
    }
    assert!(
        out.status.success(),
        "ci/python.sh failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

/// `line` of ci/python.sh's output as this test reports it: with one `python: ` in front.
fn prefixed(line: &str) -> String {
    if line.starts_with("python:") {
        line.to_owned()
    } else {
        format!("python: {line}")
    }
}

#[test]
fn reported_lines_carry_one_prefix() {
    assert_eq!(
        prefixed("python: pip install ./python took 3 s"),
        "python: pip install ./python took 3 s"
    );
    assert_eq!(
        prefixed("364 passed, 2 skipped in 80s"),
        "python: 364 passed, 2 skipped in 80s"
    );
}
