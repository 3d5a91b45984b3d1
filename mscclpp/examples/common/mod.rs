//! What every example does first: become one of two ranks (spawning them when run standalone),
//! pick the backend and this rank's device, and build a communicator.

use std::sync::Arc;

use mscclpp::comm::Communicator;
use mscclpp::launch::{self, Role};

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
