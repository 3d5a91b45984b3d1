//! The loopback NCCL net plugin of `tests/fixtures/net_plugin.c`, compiled with the system C
//! compiler for the tests of the Net transport (a real plugin is used instead where
//! `MSCCLPP_TEST_NET_PLUGIN` names one).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The plugin the Net tests load: `MSCCLPP_TEST_NET_PLUGIN` when set, else the fixture's ncclNet
/// v8 build, once per process. `Err` says why there is none (no C compiler).
pub fn plugin() -> Result<PathBuf, String> {
    if let Ok(p) = std::env::var("MSCCLPP_TEST_NET_PLUGIN") {
        return Ok(PathBuf::from(p));
    }
    fixture(8)
}

/// The fixture built as ncclNet `version` (6 to 12), once per process and version.
pub fn fixture(version: u32) -> Result<PathBuf, String> {
    static P: [OnceLock<Result<PathBuf, String>>; 13] = [const { OnceLock::new() }; 13];
    let slot = P
        .get(version as usize)
        .filter(|_| version >= 6)
        .ok_or_else(|| format!("the fixture has no ncclNet v{version}"))?;
    slot.get_or_init(|| build(version)).clone()
}

fn build(version: u32) -> Result<PathBuf, String> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/net_plugin.c");
    let out = std::env::temp_dir().join(format!(
        "libnccl-net-fixture-conformance-v{version}-{}.so",
        std::process::id()
    ));
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(&cc)
        .args([
            "-shared",
            "-fPIC",
            "-O2",
            &format!("-DFIXTURE_NET_VERSION={version}"),
            "-o",
        ])
        .arg(&out)
        .arg(&src)
        .status()
        .map_err(|e| format!("no C compiler to build the fixture net plugin ({cc}): {e}"))?;
    if !st.success() {
        return Err(format!("{cc} failed on {}: {st}", src.display()));
    }
    Ok(out)
}
