//! Device code for tests on the host backend, written as closures.
//!
//! A closure is parked in a process-wide table under a fresh id and a host kernel
//! (`mscclpp_test_closure`, the one entry point of a module of host kernels) runs it with the
//! launch shape, so the test's
//! "device code" executes inside a real kernel launch on a HAL stream — ordered with the
//! stream's copies and fills, its errors surfacing at synchronize like any kernel's.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use mscclpp::hal::dev::for_each_block;
use mscclpp::hal::{
    Device, Error, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig, Result, Stream,
};

/// The kernel id the closures run under.
pub const CLOSURE_KERNEL: KernelId = KernelId("mscclpp_test_closure");

/// What a closure kernel receives: the launch shape and the block index it runs as.
pub type DeviceFn = dyn Fn(&LaunchConfig, u64) -> Result<()> + Send + Sync;

fn table() -> &'static Mutex<HashMap<u64, Arc<DeviceFn>>> {
    static T: OnceLock<Mutex<HashMap<u64, Arc<DeviceFn>>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

#[repr(C)]
#[derive(Clone, Copy)]
struct ClosureArgs {
    id: u64,
}
// SAFETY: repr(C), one integer.
unsafe impl KernelArgs for ClosureArgs {}

fn closure_kernel(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = ClosureArgs::from_bytes(args)?;
    let f = table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&a.id)
        .ok_or_else(|| {
            Error::invalid(format!(
                "closure kernel {} launched twice or never parked",
                a.id
            ))
        })?;
    for_each_block(cfg, |b| f(cfg, b))
}

/// The closure kernel's module: host functions only (no device source).
static MODULE: KernelModule = KernelModule {
    name: "tests/closures",
    source: "",
    headers: &[],
    kernels: &[KernelDef::new::<ClosureArgs>(
        CLOSURE_KERNEL.0,
        closure_kernel,
    )],
};

/// Launches `f` as a kernel of shape `cfg` on `stream` (host backend only); every block runs
/// `f(cfg, block_index)`, blocks concurrently.
pub fn launch(
    device: &Arc<dyn Device>,
    stream: &dyn Stream,
    cfg: LaunchConfig,
    f: impl Fn(&LaunchConfig, u64) -> Result<()> + Send + Sync + 'static,
) -> Result<()> {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    table()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id, Arc::new(f));
    let k = device.load(&MODULE, CLOSURE_KERNEL)?;
    // SAFETY: the closure captures what it touches; the args carry only its id.
    unsafe { stream.launch_raw(&*k, cfg, ClosureArgs { id }.as_bytes()) }
}
