//! Puts the NCCL-compatible C library in the wheel: under maturin, builds `libmscclpp_nccl.so`
//! (`cargo build --release -p mscclpp-nccl` of the main workspace, into `python/target/nccl`, so
//! a repeated `pip install ./python` is incremental) and copies it to
//! `mscclpp_rs/lib/libmscclpp_nccl.so`, which maturin packs as package data
//! (`python -m mscclpp_rs.nccl` prints its path).
//!
//! `MSCCLPP_NCCL_SO=/path/to/libmscclpp_nccl.so` packs that file instead of building one (a
//! release pipeline that built it already, or a source tree without the main workspace).
//! `MSCCLPP_NCCL_TARGET_DIR` moves the nested build's target directory (default
//! `python/target/nccl`; an outer `CARGO_TARGET_DIR` is not passed on).
//! Outside maturin (`cargo clippy`, `cargo build` of this crate) nothing is built unless
//! `MSCCLPP_PY_BUILD_NCCL=1`.

use std::env;
use std::ffi::OsStr;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime};

const LIB: &str = "libmscclpp_nccl.so";

fn main() {
    // Taken before anything is written: see `copy_into_package`.
    let started = SystemTime::now();
    println!("cargo:rerun-if-env-changed=MSCCLPP_NCCL_SO");
    println!("cargo:rerun-if-env-changed=MSCCLPP_PY_BUILD_NCCL");
    println!("cargo:rerun-if-env-changed=MSCCLPP_NCCL_TARGET_DIR");
    // maturin sets it for every build of a pyo3 extension (`pip install`, `maturin build`/`develop`).
    println!("cargo:rerun-if-env-changed=PYO3_ENVIRONMENT_SIGNATURE");
    let under_maturin = env::var_os("PYO3_ENVIRONMENT_SIGNATURE").is_some();
    let forced = env::var_os("MSCCLPP_PY_BUILD_NCCL").is_some_and(|v| v == "1");
    if !under_maturin && !forced {
        return;
    }
    let here = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let dest = here.join("mscclpp_rs").join("lib").join(LIB);
    let built = match env::var_os("MSCCLPP_NCCL_SO").filter(|v| !v.is_empty()) {
        Some(given) => {
            let given = PathBuf::from(given);
            println!("cargo:rerun-if-changed={}", given.display());
            if !given.is_file() {
                fail(&format!(
                    "MSCCLPP_NCCL_SO={} is not a file",
                    given.display()
                ));
            }
            given
        }
        None => build_nccl(&here),
    };
    copy_into_package(&built, &dest, started);
}

/// `cargo build --release -p mscclpp-nccl` of the main workspace (`../Cargo.toml`); returns the
/// built library.
fn build_nccl(here: &Path) -> PathBuf {
    let root = here.parent().expect("python/ has a parent").to_path_buf();
    let manifest = root.join("Cargo.toml");
    if !root.join("nccl").join("Cargo.toml").is_file() {
        fail(&format!(
            "the main workspace (with nccl/Cargo.toml) is not at {}: build from the repository \
             checkout, or set MSCCLPP_NCCL_SO to a built {LIB}",
            root.display()
        ));
    }
    watch_workspace(&root);
    let target_dir = env::var_os("MSCCLPP_NCCL_TARGET_DIR")
        .filter(|v| !v.is_empty())
        .map_or_else(|| here.join("target").join("nccl"), PathBuf::from);
    let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--release",
        "-p",
        "mscclpp-nccl",
        "--manifest-path",
    ])
    .arg(&manifest)
    .arg("--target-dir")
    .arg(&target_dir)
    .current_dir(&root);
    // Cross builds (maturin --target) build the library for the same target.
    let target = env::var("TARGET").unwrap_or_default();
    let cross = !target.is_empty() && env::var("HOST").ok().as_deref() != Some(target.as_str());
    if cross {
        cmd.args(["--target", &target]);
    }
    // What cargo tells this build script must not reach the nested build as its configuration:
    // the outer target dir and rustflags, this package's metadata and features, clippy's
    // wrapper. The jobserver (CARGO_MAKEFLAGS) stays, so the two builds share the cores, and
    // so do the linker settings maturin gives (`--zig`: CARGO_TARGET_<TRIPLE>_LINKER).
    for (key, _) in env::vars_os() {
        let Some(k) = key.to_str() else { continue };
        let drop = matches!(
            k,
            "CARGO_TARGET_DIR"
                | "CARGO_BUILD_TARGET_DIR"
                | "CARGO_BUILD_TARGET"
                | "CARGO_ENCODED_RUSTFLAGS"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "RUSTC_WORKSPACE_WRAPPER"
                | "OUT_DIR"
                | "TARGET"
                | "HOST"
                | "NUM_JOBS"
                | "OPT_LEVEL"
                | "PROFILE"
                | "DEBUG"
                | "RUSTC_LINKER"
        ) || k.starts_with("CARGO_PKG_")
            || k.starts_with("CARGO_FEATURE_")
            || k.starts_with("CARGO_CFG_")
            || k.starts_with("DEP_");
        if drop {
            cmd.env_remove(&key);
        }
    }
    // Its progress goes to this script's stderr (cargo shows it if the build fails); stdout
    // would be read as `cargo:` directives.
    cmd.stdout(Stdio::from(std::io::stderr()));
    let shown = format!(
        "{} build --release -p mscclpp-nccl --manifest-path {} --target-dir {}{}",
        Path::new(&cargo).display(),
        manifest.display(),
        target_dir.display(),
        if cross {
            format!(" --target {target}")
        } else {
            String::new()
        }
    );
    match cmd.status() {
        Ok(s) if s.success() => {}
        Ok(s) => fail(&format!(
            "building {LIB} for the wheel failed ({s}): `{shown}` (its output is above; \
             MSCCLPP_NCCL_SO=<a built {LIB}> skips this build)"
        )),
        Err(e) => fail(&format!(
            "building {LIB} for the wheel: cannot run `{shown}`: {e}"
        )),
    }
    let out = if cross {
        target_dir.join(&target).join("release").join(LIB)
    } else {
        target_dir.join("release").join(LIB)
    };
    if !out.is_file() {
        fail(&format!(
            "`{shown}` succeeded but left no {}",
            out.display()
        ));
    }
    out
}

/// Reruns this script when the main workspace's sources change (the nested cargo then decides
/// what to rebuild): its manifest and lock file and every crate folder beside python/.
fn watch_workspace(root: &Path) {
    for f in ["Cargo.toml", "Cargo.lock"] {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    let skip = ["target", "python", "docs", "ci"];
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    let mut dirs: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter(|e| {
            let name = e.file_name();
            !name.to_string_lossy().starts_with('.') && !skip.iter().any(|s| OsStr::new(s) == name)
        })
        .map(|e| e.path())
        .collect();
    dirs.sort();
    for d in dirs {
        println!("cargo:rerun-if-changed={}", d.display());
    }
}

/// Copies the library to where maturin packs it. The copy is dated before this run started:
/// cargo reruns a script when a watched file is newer than the run, and the copy is watched
/// (so that a deleted copy is made again).
fn copy_into_package(built: &Path, dest: &Path, started: SystemTime) {
    let dir = dest.parent().expect("dest has a folder");
    if let Err(e) = fs::create_dir_all(dir) {
        fail(&format!("cannot create {}: {e}", dir.display()));
    }
    // Through a temporary name: a process that has the old copy mapped keeps it intact.
    let tmp = dir.join(format!(".{LIB}.tmp"));
    if let Err(e) = fs::copy(built, &tmp) {
        fail(&format!(
            "cannot copy {} to {}: {e}",
            built.display(),
            tmp.display()
        ));
    }
    let stamp = started
        .checked_sub(Duration::from_secs(2))
        .unwrap_or(started);
    if let Err(e) = fs::File::options()
        .write(true)
        .open(&tmp)
        .and_then(|f| f.set_modified(stamp))
    {
        fail(&format!("cannot date {}: {e}", tmp.display()));
    }
    if let Err(e) = fs::rename(&tmp, dest) {
        fail(&format!(
            "cannot move {} to {}: {e}",
            tmp.display(),
            dest.display()
        ));
    }
    println!("cargo:rerun-if-changed={}", dest.display());
}

fn fail(msg: &str) -> ! {
    eprintln!("error: mscclpp-python build script: {msg}");
    panic!("mscclpp-python build script: {msg}");
}
