//! The layout header committed under `kernels/` must be exactly what the Rust layouts generate:
//! it is what every device compile (CUDA and HIP share it) checks the mirrored structs against.

use std::path::Path;

#[test]
fn committed_layout_header_matches_the_rust_layouts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let expected = mscclpp_hal::dev::layout::generate_header();
    let target = "kernels/include/mscclpp/layout_check.h";
    let path = root.join(target);
    let found = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    assert!(
        found == expected,
        "{target} differs from the Rust layouts; regenerate it with \
         `cargo run -p mscclpp-hal --example gen_layout`"
    );
}
