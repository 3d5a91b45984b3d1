//! What every example does first: become one of two ranks (spawning them when run standalone),
//! pick the backend and this rank's device, and build a communicator.

use std::sync::Arc;

use mscclpp::comm::Communicator;
use mscclpp_perf::launch::{self, Role};

/// The communicator of this rank; `None` in the standalone parent once the ranks have finished
/// (it exits with their status).
pub fn two_ranks() -> mscclpp::Result<Option<Communicator>> {
    mscclpp::init_logging();
    let role = launch::role()?;
    if let Role::Parent = role {
        let failed = launch::spawn_and_wait(2)?;
        std::process::exit(if failed == 0 { 0 } else { 1 });
    }
    let boot = Arc::new(launch::bootstrap(&role)?);
    let backend = mscclpp::registry::select()?;
    let local = boot.local_rank().unwrap_or(boot.rank());
    let device = backend.open_device(local % backend.device_count().max(1))?;
    if boot.rank() == 0 {
        println!(
            "# 2 ranks on the {} backend: {}",
            backend.kind(),
            device.info().name
        );
        if backend.kind() == mscclpp::hal::BackendKind::Host {
            for reason in mscclpp::registry::why_no_gpu() {
                println!("#   {reason}");
            }
        }
    }
    Ok(Some(Communicator::new(boot, device)))
}

/// The largest message of an example: `MSCCLPP_EXAMPLE_MAX_BYTES` where set, else `gpu` bytes
/// on a GPU and 16 MiB on the host backend, whose "device" buffers are this machine's RAM (two
/// per rank, plus the check's copy: 1 GiB ones took 5 GB of a laptop's memory).
#[allow(dead_code)]
pub fn max_bytes(comm: &Communicator, gpu: usize) -> mscclpp::Result<usize> {
    if let Ok(v) = std::env::var("MSCCLPP_EXAMPLE_MAX_BYTES") {
        return v.trim().parse().map_err(|_| {
            mscclpp::Error::invalid(format!(
                "MSCCLPP_EXAMPLE_MAX_BYTES={v:?}: expected a number of bytes"
            ))
        });
    }
    Ok(
        if comm.device().info().backend == mscclpp::hal::BackendKind::Host {
            gpu.min(16 << 20)
        } else {
            gpu
        },
    )
}

/// GB/s with three significant digits at least (small sizes printed `0.0` with one decimal).
#[allow(dead_code)]
pub fn gbps(v: f64, width: usize) -> String {
    let a = v.abs();
    let decimals = if a == 0.0 || a >= 10.0 {
        1
    } else {
        ((-a.log10()).floor() as i64 + 3).clamp(1, 9) as usize
    };
    format!("{v:>width$.decimals$}")
}
