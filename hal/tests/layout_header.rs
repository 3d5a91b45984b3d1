//! The layout headers committed under `kernels/` must be exactly what the Rust layouts generate:
//! they are what every device compile checks the mirrored structs against.

use std::path::Path;

#[test]
fn committed_layout_headers_match_the_rust_layouts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let expected = mscclpp_hal::dev::layout::generate_header();
    for target in [
        "kernels/cuda/include/mscclpp/layout_check.h",
        "kernels/hip/include/mscclpp/layout_check.h",
    ] {
        let path = root.join(target);
        let found = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        assert!(
            found == expected,
            "{target} differs from the Rust layouts; regenerate it with \
             `cargo run -p mscclpp-hal --example gen_layout`"
        );
    }
}
