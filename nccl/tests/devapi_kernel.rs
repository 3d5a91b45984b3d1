//! A kernel of our own written against NCCL's public device API (`nccl/tests/devapi/lsa_put.cu`:
//! LSA puts between LSA barriers, through `ncclGetLsaPointer` and `ncclGetPeerPointer`), built
//! with nvcc against NCCL's headers and linked to this library, run as 2 ranks sharing device 0.
//! Skipped, with the reason, where there is no nvcc, no NCCL headers (`MSCCLPP_NCCL_INCLUDE`,
//! as `ci/install-toolchains.sh` sets it) or no CUDA device.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

#[allow(unused_macros)]
mod support;

fn nvcc() -> Option<PathBuf> {
    let candidates = [
        std::env::var_os("MSCCLPP_NVCC").map(PathBuf::from),
        Some(PathBuf::from("/usr/local/cuda/bin/nvcc")),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|p| p.exists())
        .or_else(|| {
            let out = Command::new("sh")
                .args(["-c", "command -v nvcc"])
                .output()
                .ok()?;
            let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
            (!p.is_empty()).then(|| PathBuf::from(p))
        })
}

fn skip(why: &str) {
    println!("SKIPPED lsa_put_kernel_runs_on_this_library: {why}");
}

#[test]
fn lsa_put_kernel_runs_on_this_library() {
    let Some(nvcc) = nvcc() else {
        return skip("no nvcc (MSCCLPP_NVCC, /usr/local/cuda/bin/nvcc or PATH)");
    };
    let Some(include) = std::env::var_os("MSCCLPP_NCCL_INCLUDE").map(PathBuf::from) else {
        return skip("MSCCLPP_NCCL_INCLUDE names no NCCL >= 2.29 headers");
    };
    #[cfg(feature = "cuda")]
    {
        use mscclpp::hal::Backend;
        if let Err(e) = mscclpp::cuda::probe_cuda().and_then(|b| b.open_device(0)) {
            return skip(&format!("no CUDA device: {e}"));
        }
    }
    #[cfg(not(feature = "cuda"))]
    return skip("built without the cuda feature");
    let lib = support::lib_path().expect("the library");
    let libdir = lib.parent().expect("its folder").to_path_buf();
    let work = std::env::temp_dir().join(format!("mscclpp-lsa-put-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("a work folder");
    let exe = work.join("lsa_put");
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/devapi/lsa_put.cu");
    let out = Command::new(&nvcc)
        .args(["-std=c++17", "-arch=native", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(&include)
        .arg(&src)
        .arg(format!("-L{}", libdir.display()))
        .arg("-l:libmscclpp_nccl.so")
        .arg(format!("-Xlinker=-rpath,{}", libdir.display()))
        .output()
        .expect("running nvcc");
    assert!(
        out.status.success(),
        "nvcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let n = 2;
    let mut children: Vec<_> = (0..n)
        .map(|r| {
            Command::new(&exe)
                .args([r.to_string(), n.to_string()])
                .arg(&work)
                .env("MSCCLPP_BOOTSTRAP_TIMEOUT", "30")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("a rank")
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut failures = Vec::new();
    for (r, c) in children.iter_mut().enumerate() {
        loop {
            if let Some(st) = c.try_wait().expect("wait") {
                if !st.success() {
                    let mut e = String::new();
                    use std::io::Read;
                    if let Some(mut s) = c.stderr.take() {
                        let _ = s.read_to_string(&mut e);
                    }
                    failures.push(format!("rank {r}: {st}: {e}"));
                }
                break;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                failures.push(format!("rank {r}: no result within 120 s (killed)"));
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
