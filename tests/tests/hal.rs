//! HAL conformance, stamped out for every backend (absent ones are listed as ignored, with the
//! reason). Runs with `cargo test -p mscclpp-conformance --test hal`.

use mscclpp_conformance::{hal_suite, harness, multiproc};

fn main() {
    if let Some(role) = multiproc::role() {
        let code = match role.as_str() {
            hal_suite::IPC_CHILD_ROLE => hal_suite::ipc_child(),
            other => {
                eprintln!("unknown test role {other}");
                2
            }
        };
        std::process::exit(code);
    }
    let args = libtest_mimic::Arguments::from_args();
    libtest_mimic::run(
        &args,
        harness::stamp("hal", hal_suite::CASES, hal_suite::ALONE),
    )
    .exit();
}
