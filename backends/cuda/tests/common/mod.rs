//! What the backend's GPU tests share: a report line past the harness's capture, and device 0
//! or the reason there is none.

use std::sync::Arc;

use mscclpp_hal::Device;

/// Writes a line straight to the process's stderr, past the test harness's output capture, so
/// that "skipped: ..." shows in every `cargo test` run (CI logs included).
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

/// Device 0 of the CUDA backend, or `None` after reporting "skipped: <why>".
#[allow(dead_code)] // each test binary compiles this module; not every one opens a device
pub fn device_or_skip() -> Option<Arc<dyn Device>> {
    match mscclpp_cuda::probe() {
        Ok(b) => Some(b.open_device(0).expect("device 0")),
        Err(e) => {
            report!("skipped: {e}");
            None
        }
    }
}
