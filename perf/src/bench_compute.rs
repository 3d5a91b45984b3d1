//! The compute load of the overlap benchmark (`mscclpp-perf overlap`): a GEMM-like kernel that
//! keeps every SM busy with fused multiply-adds on bf16 operands, accumulated in f32, streaming
//! its operand array through the caches on every pass — what a training step's matrix
//! multiplications do to the SMs while communication runs beside them (cuBLAS is not reachable
//! from here). Its device source is `kernels/bench/compute.cu`; the host backend runs
//! [`compute_host`], the same arithmetic on a CPU.
//!
//! Load it with [`mscclpp::hal::DynKernel::load`]`(device, &MODULE, COMPUTE)`.

use mscclpp::hal::dev::for_each_block;
use mscclpp::hal::{Error, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig, Result};

/// `passes` passes over `words` words of two bf16 operands each, `fmas` rounds of four FMAs per
/// word (args: [`ComputeArgs`]).
pub const COMPUTE: KernelId = KernelId("mscclpp_bench_compute");

/// Arguments of [`COMPUTE`] (mirrored in `kernels/bench/compute.cu`; its layout checks are
/// `kernels/bench/compute_check.h`, generated from this definition).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComputeArgs {
    /// Device address of `words` u32 words (two bf16 operands each).
    pub data: u64,
    /// Device address of one u32 per thread of the grid (the results, so nothing is elided).
    pub out: u64,
    /// Words of `data`.
    pub words: u64,
    /// Passes over `data`.
    pub passes: u32,
    /// Rounds of four FMAs per word.
    pub fmas: u32,
}

// SAFETY: repr(C) of integers, no implicit padding (32 bytes, checked below); every bit pattern
// is valid.
unsafe impl KernelArgs for ComputeArgs {}

/// The compute module.
pub static MODULE: KernelModule = KernelModule {
    name: "bench/compute.cu",
    source: include_str!("../../kernels/bench/compute.cu"),
    headers: &[(
        "bench/compute_check.h",
        include_str!("../../kernels/bench/compute_check.h"),
    )],
    kernels: &[KernelDef::new::<ComputeArgs>(COMPUTE.0, compute_host)],
};

fn bf16(w: u32) -> f32 {
    f32::from_bits((w & 0xffff) << 16)
}

/// The kernel on the host backend: the same arithmetic, one block per worker, thread `t` of a
/// block taking words `t, t + threads, ...` of the block's share.
fn compute_host(cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = ComputeArgs::from_bytes(args)?;
    let words = usize::try_from(a.words)
        .map_err(|_| Error::invalid(format!("{} words do not fit this host", a.words)))?;
    let threads = cfg.num_blocks() * u64::from(cfg.block[0]);
    let blocks = cfg.num_blocks() as usize;
    let per_block = words.div_ceil(blocks.max(1));
    for_each_block(cfg, |b| {
        let start = (b as usize * per_block).min(words);
        let end = (start + per_block).min(words);
        let (mut c0, mut c1, mut c2, mut c3) = (0f32, 1f32, 2f32, 3f32);
        for _ in 0..a.passes {
            for i in start..end {
                // SAFETY: the launcher vouches that `data` holds `words` aligned u32 words
                // (launch contract); only read.
                let w = unsafe { std::ptr::read_volatile((a.data as *const u32).add(i)) };
                let (x, y) = (bf16(w), bf16(w >> 16));
                for _ in 0..a.fmas {
                    c0 = c0.mul_add(x, y);
                    c1 = c1.mul_add(y, x);
                    c2 = c2.mul_add(x, x);
                    c3 = c3.mul_add(y, y);
                }
            }
        }
        if b < threads {
            // SAFETY: `out` holds one u32 per thread of the grid (launch contract); block `b`
            // writes its first thread's word, which no other block writes.
            unsafe {
                std::ptr::write_volatile(
                    (a.out as *mut u32).add((b * u64::from(cfg.block[0])) as usize),
                    (c0 + c1 + c2 + c3).to_bits(),
                )
            };
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_compute_check_header_matches_the_rust_layout() {
        use mscclpp::hal::dev::layout::{check_header, header};
        use mscclpp::hal::layout_entry;
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../kernels/bench/compute_check.h");
        let expected = header(
            "perf/src/bench_compute.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 cargo test -p \
             mscclpp-perf --lib bench_compute)",
            &[layout_entry!(ComputeArgs {
                data,
                out,
                words,
                passes,
                fmas
            })],
        );
        if let Err(e) = check_header(&path, &expected) {
            panic!("{e}");
        }
    }

    #[test]
    fn the_host_kernel_computes_and_writes_one_word_per_block() {
        let data: Vec<u32> = (0..1000u32).map(|i| 0x3f80_3f80 + (i & 7)).collect();
        let mut out = vec![0u32; 4 * 32];
        let args = ComputeArgs {
            data: data.as_ptr() as u64,
            out: out.as_mut_ptr() as u64,
            words: data.len() as u64,
            passes: 2,
            fmas: 3,
        };
        compute_host(&LaunchConfig::linear(4, 32), args.as_bytes()).unwrap();
        for b in 0..4 {
            let v = f32::from_bits(out[b * 32]);
            assert!(v.is_finite() && v != 6.0, "block {b}: {v}");
        }
    }
}
