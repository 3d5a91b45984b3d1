//! The reduction of the copy-engine reduce-scatter: one small kernel that combines, in rank order,
//! the arrays the copy engines gathered (`kernels/collectives/ce_reduce.cu`), and its host
//! kernel.

use mscclpp_hal::{
    DataType, Error, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig, ReduceOp, Result,
};

use super::super::base::MAX_RANKS;
use super::super::host_common::reduce_ranks;

/// `dst` = the combination of `srcs[..nsrc]` (args: [`CeReduceArgs`]).
pub(crate) const CE_REDUCE: KernelId = KernelId("mscclpp_collective_ce_reduce");

/// Arguments of [`CE_REDUCE`] (mirrored in `kernels/collectives/ce_reduce.cu`; its layout checks
/// are `kernels/collectives/ce_args_check.h`, generated from this definition).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CeReduceArgs {
    pub dst: u64,
    /// The sources, combined in this order.
    pub srcs: [u64; MAX_RANKS],
    pub bytes: u64,
    pub nsrc: u32,
    pub dtype: u32,
    pub op: u32,
    pub _pad: u32,
}

// SAFETY: repr(C) of integers, no implicit padding (checked by the layout test); every bit
// pattern is valid.
unsafe impl KernelArgs for CeReduceArgs {}

/// The module of the reduction (every element type).
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/ce_reduce.cu",
    source: include_str!("../../../../kernels/collectives/ce_reduce.cu"),
    headers: &[(
        "collectives/ce_args_check.h",
        include_str!("../../../../kernels/collectives/ce_args_check.h"),
    )],
    kernels: &[KernelDef::new::<CeReduceArgs>(CE_REDUCE.0, ce_reduce_host)],
};

/// The host kernel: the same reduction (rounding after every combination, as the other host
/// kernels do).
fn ce_reduce_host(_cfg: &LaunchConfig, args: &[u8]) -> Result<()> {
    let a = CeReduceArgs::from_bytes(args)?;
    let n = a.nsrc as usize;
    if !(1..=MAX_RANKS).contains(&n) {
        return Err(Error::invalid(format!(
            "ce reduce: {n} sources, expected 1 to {MAX_RANKS}"
        )));
    }
    let dtype = DataType::from_code(a.dtype)?;
    let op = ReduceOp::from_code(a.op)?;
    let dst = a.dst;
    // SAFETY: the launcher vouches that every source holds `bytes` readable bytes and `dst`
    // `bytes` writable ones (launch contract); `dst` may be `srcs[i]` itself (in place), which
    // is fine since every word is read from all sources before it is written.
    unsafe {
        reduce_ranks(
            n,
            a.bytes,
            dtype,
            op,
            |p| a.srcs[p],
            |at, w, nb| super::super::host_common::store(dst + at, w, nb),
        )
    };
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use mscclpp_hal::dev::layout::{check_header, header};
    use mscclpp_hal::layout_entry;

    use super::*;

    #[test]
    fn committed_ce_args_check_header_matches_the_rust_layout() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/collectives/ce_args_check.h");
        let expected = header(
            "collectives/src/algorithms/ce/reduce.rs (regenerate with MSCCLPP_BLESS_LAYOUT=1 \
             cargo test -p mscclpp-collectives ce_args)",
            &[layout_entry!(CeReduceArgs {
                dst,
                srcs,
                bytes,
                nsrc,
                dtype,
                op,
                _pad
            })],
        );
        if let Err(e) = check_header(&path, &expected) {
            panic!("{e}");
        }
    }

    #[test]
    fn the_host_kernel_reduces_in_rank_order_in_place_too() {
        let mut a: Vec<f32> = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        let b: Vec<f32> = vec![10.0, 20.0, 30.0, 40.0, 50.0];
        let mut args = CeReduceArgs {
            dst: a.as_mut_ptr() as u64,
            srcs: [0; MAX_RANKS],
            bytes: 20,
            nsrc: 2,
            dtype: DataType::F32 as u32,
            op: ReduceOp::Sum as u32,
            _pad: 0,
        };
        args.srcs[0] = a.as_ptr() as u64;
        args.srcs[1] = b.as_ptr() as u64;
        ce_reduce_host(&LaunchConfig::linear(1, 1), args.as_bytes()).unwrap();
        assert_eq!(a, [11.0, 22.0, 33.0, 44.0, 55.0]);
        args.nsrc = 9;
        assert!(ce_reduce_host(&LaunchConfig::linear(1, 1), args.as_bytes()).is_err());
    }
}
