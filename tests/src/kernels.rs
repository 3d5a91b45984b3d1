//! The HAL conformance kernels, owned by the suite that launches them: `mscclpp_fill_u32` and
//! `mscclpp_atomic_add_u64` prove launches, argument passing and device-side atomics on every
//! backend. Their device source is `kernels/tests/test_kernels.cu`, their argument structs are
//! mirrored in `kernels/tests/args.cuh` (checked by the generated `kernels/tests/args_check.h`),
//! and the host backend runs the Rust functions below.

use std::sync::atomic::{AtomicU64, Ordering};

use mscclpp::hal::dev::for_each_block;
use mscclpp::hal::{Error, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig, Result};

/// Fills `count` 32-bit words at `dst` with `value` (args: [`FillU32Args`]).
pub const FILL_U32: KernelId = KernelId("mscclpp_fill_u32");
/// Every thread of the grid atomically adds `value` to the 64-bit counter at `counter` (args:
/// [`AtomicAddU64Args`]).
pub const ATOMIC_ADD_U64: KernelId = KernelId("mscclpp_atomic_add_u64");

/// Arguments of [`FILL_U32`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FillU32Args {
    /// Device address of the first word.
    pub dst: u64,
    /// Number of 32-bit words.
    pub count: u64,
    /// The value to store.
    pub value: u32,
    /// Keeps the struct free of implicit padding.
    pub _pad: u32,
}

// SAFETY: repr(C), integers only, explicit padding; every bit pattern is valid.
unsafe impl KernelArgs for FillU32Args {}

/// Arguments of [`ATOMIC_ADD_U64`].
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AtomicAddU64Args {
    /// Device address of an 8-byte-aligned counter.
    pub counter: u64,
    /// Added once by every thread of the grid.
    pub value: u64,
}

// SAFETY: repr(C), integers only, no padding; every bit pattern is valid.
unsafe impl KernelArgs for AtomicAddU64Args {}

/// The conformance kernels' module.
pub static MODULE: KernelModule = KernelModule {
    name: "tests/test_kernels.cu",
    source: include_str!("../../kernels/tests/test_kernels.cu"),
    headers: &[
        (
            "tests/args.cuh",
            include_str!("../../kernels/tests/args.cuh"),
        ),
        (
            "tests/args_check.h",
            include_str!("../../kernels/tests/args_check.h"),
        ),
    ],
    kernels: &[
        KernelDef::new::<FillU32Args>(FILL_U32.0, fill_u32),
        KernelDef::new::<AtomicAddU64Args>(ATOMIC_ADD_U64.0, atomic_add_u64),
    ],
};

fn check_aligned(addr: u64, align: u64, what: &str) -> Result<()> {
    if addr == 0 || addr % align != 0 {
        return Err(Error::invalid(format!(
            "{what} address {addr:#x} is null or not {align}-byte aligned"
        )));
    }
    Ok(())
}

/// A raw device address shared by the blocks of one launch.
#[derive(Clone, Copy)]
struct Addr(u64);

fn fill_u32(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = FillU32Args::from_bytes(args)?;
    check_aligned(a.dst, 4, "fill destination")?;
    let blocks = cfg.num_blocks();
    let per_block = a.count.div_ceil(blocks);
    let dst = Addr(a.dst);
    for_each_block(cfg, |b| {
        let start = b * per_block;
        let end = (start + per_block).min(a.count);
        for i in start..end {
            // SAFETY: the launcher promised (Stream::launch_raw's contract) that `dst` addresses
            // `count` live, aligned 32-bit words; `i < count`.
            unsafe { (dst.0 as *mut u32).add(i as usize).write_volatile(a.value) };
        }
        Ok(())
    })
}

fn atomic_add_u64(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = AtomicAddU64Args::from_bytes(args)?;
    check_aligned(a.counter, 8, "atomic counter")?;
    let threads = cfg.threads_per_block();
    let counter = Addr(a.counter);
    for_each_block(cfg, |_| {
        // SAFETY: the launcher promised a live, 8-byte aligned u64 (alignment checked above);
        // all accesses to it during the kernel are atomic.
        let c = unsafe { AtomicU64::from_ptr(counter.0 as *mut u64) };
        for _ in 0..threads {
            c.fetch_add(a.value, Ordering::AcqRel);
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use mscclpp::hal::dev::layout::{check_header, header};
    use mscclpp::hal::layout_entry;

    use super::*;

    #[test]
    fn committed_args_check_header_matches_the_rust_layouts() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/tests/args_check.h");
        let expected = header(
            "tests/src/kernels.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p \
             mscclpp-conformance --lib kernels)",
            &[
                layout_entry!(FillU32Args {
                    dst,
                    count,
                    value,
                    _pad
                }),
                layout_entry!(AtomicAddU64Args { counter, value }),
            ],
        );
        if let Err(e) = check_header(&path, &expected) {
            panic!("{e}");
        }
    }
}
