//! Writes the generated layout header into the device-header folder (shared by CUDA and HIP):
//! `cargo run -p mscclpp-hal --example gen_layout`. The test `layout_header` fails when the
//! committed copies and the Rust layouts disagree.

use std::path::Path;

/// Where the header goes, relative to the workspace root.
const TARGETS: &[&str] = &["kernels/include/mscclpp/layout_check.h"];

fn main() -> std::io::Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let header = mscclpp_hal::dev::layout::generate_header();
    for target in TARGETS {
        let path = root.join(target);
        let unchanged = std::fs::read_to_string(&path).is_ok_and(|old| old == header);
        if unchanged {
            println!("{target}: up to date");
        } else {
            std::fs::write(&path, &header)?;
            println!("{target}: written");
        }
    }
    Ok(())
}
