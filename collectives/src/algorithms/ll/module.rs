//! The LL modules: the general LL kernels (this folder), the short LL kernels (`ll_short`) and
//! LL128 all-reduce (`ll128`), one source (`kernels/collectives/ll.cuh`) since they share the LL
//! scratch, flag counter and device helpers, compiled as two modules: [`MODULE`]
//! (`kernels/collectives/ll.cu`, the base element types f32, f16, bf16, i32, u32) and
//! [`WIDE_MODULE`] (`kernels/collectives/ll_wide.cu`, f64, i64, u64, i8, u8, FP8), which only a
//! process that uses those types compiles. Every entry point takes an [`LlCollectiveArgs`]; on
//! the host one Rust kernel serves the LL and short entry points (it reads the kind, type and
//! operator from its arguments) and one the LL128 entry points.

use mscclpp_hal::{KernelDef, KernelId, KernelModule};

use super::args::LlCollectiveArgs;
use super::host::collective_ll;
use crate::algorithms::base::{BASE_TYPES, HEADERS};
use crate::algorithms::ll128::host::collective_ll128_allreduce;

/// Element types, in code order: every kernel table has one row per type.
pub(crate) const NTYPES: usize = mscclpp_hal::DataType::ALL.len();

/// The names of a kernel per element type and operator, `<prefix>_<type>_<op>`, indexed by
/// their codes (`DataType`: f32, f16, bf16, i32, u32, f64, i64, u64, i8, u8, f8e4m3, f8e5m2;
/// `ReduceOp`: sum, prod, min, max, avg).
macro_rules! by_type_and_op {
    ($prefix:literal) => {
        $crate::algorithms::ll::module::ids([
            by_type_and_op!(@ops $prefix, "_f32"),
            by_type_and_op!(@ops $prefix, "_f16"),
            by_type_and_op!(@ops $prefix, "_bf16"),
            by_type_and_op!(@ops $prefix, "_i32"),
            by_type_and_op!(@ops $prefix, "_u32"),
            by_type_and_op!(@ops $prefix, "_f64"),
            by_type_and_op!(@ops $prefix, "_i64"),
            by_type_and_op!(@ops $prefix, "_u64"),
            by_type_and_op!(@ops $prefix, "_i8"),
            by_type_and_op!(@ops $prefix, "_u8"),
            by_type_and_op!(@ops $prefix, "_f8e4m3"),
            by_type_and_op!(@ops $prefix, "_f8e5m2"),
        ])
    };
    (@ops $prefix:literal, $ty:literal) => {
        [
            concat!($prefix, $ty, "_sum"),
            concat!($prefix, $ty, "_prod"),
            concat!($prefix, $ty, "_min"),
            concat!($prefix, $ty, "_max"),
            concat!($prefix, $ty, "_avg"),
        ]
    };
}

/// Kernel ids from names, in the same order.
pub(crate) const fn ids(names: [[&'static str; 5]; NTYPES]) -> [[KernelId; 5]; NTYPES] {
    let mut out = [[KernelId(""); 5]; NTYPES];
    let mut i = 0;
    while i < 5 * NTYPES {
        out[i / 5][i % 5] = KernelId(names[i / 5][i % 5]);
        i += 1;
    }
    out
}

/// The general LL kernel of the copying collectives — all-gather, broadcast, all-to-all — for the
/// base types, and for the wide ones (byte-granular).
pub(crate) const COPY: KernelId = KernelId("mscclpp_collective_ll_copy");
pub(crate) const COPY_WIDE: KernelId = KernelId("mscclpp_collective_ll_copy_wide");

/// The general LL kernels of the reducing collectives — all-reduce, reduce-scatter — one per
/// element type and operator, indexed by their codes. Separate kernels, each compiled for its
/// one case, keep a small message's path short (measured in docs/performance.md).
pub(crate) const REDUCE: [[KernelId; 5]; NTYPES] = by_type_and_op!("mscclpp_collective_ll_reduce");

// The entry points of the short LL kernels and of LL128 are this module's too: their ids live
// here, with the tables that list them, so that `ll_short` and `ll128` use this module and it
// uses neither of them (only LL128's host kernel, `ll128/host.rs`, which uses no set-up).

/// The short all-reduce (`ll_short`), one per element type and operator (by their codes).
pub(crate) const SHORT_ALLREDUCE: [[KernelId; 5]; NTYPES] =
    by_type_and_op!("mscclpp_collective_ll_short_allreduce");
/// The short reduce-scatter, one per element type and operator.
pub(crate) const SHORT_REDUCE_SCATTER: [[KernelId; 5]; NTYPES] =
    by_type_and_op!("mscclpp_collective_ll_short_reduce_scatter");
/// The short all-gather (it copies bytes): of the base types, and of the wide ones.
pub(crate) const SHORT_ALLGATHER: KernelId = KernelId("mscclpp_collective_ll_short_allgather");
pub(crate) const SHORT_ALLGATHER_WIDE: KernelId =
    KernelId("mscclpp_collective_ll_short_allgather_wide");
/// The short all-to-all: of the base types, and of the wide ones.
pub(crate) const SHORT_ALLTOALL: KernelId = KernelId("mscclpp_collective_ll_short_alltoall");
pub(crate) const SHORT_ALLTOALL_WIDE: KernelId =
    KernelId("mscclpp_collective_ll_short_alltoall_wide");

/// All-reduce by LL128 lines (`ll128`, one round): of the base element types, and of the wide
/// ones.
pub(crate) const LL128_ALLREDUCE: KernelId = KernelId("mscclpp_collective_ll128_allreduce");
pub(crate) const LL128_ALLREDUCE_WIDE: KernelId =
    KernelId("mscclpp_collective_ll128_allreduce_wide");

const fn ll(id: KernelId) -> KernelDef {
    KernelDef::new::<LlCollectiveArgs>(id.0, collective_ll)
}

/// Entry points per reducing family (one per element type and operator) in each module.
const BASE_PER_FAMILY: usize = 5 * BASE_TYPES;
const WIDE_PER_FAMILY: usize = 5 * (NTYPES - BASE_TYPES);

/// The entry points of one module: its copying general and short kernels, its types' reducing
/// general and short kernels, its LL128 kernel.
const fn kernels<const N: usize, const PER_FAMILY: usize>(
    copies: [KernelId; 3],
    first_type: usize,
    ll128: KernelId,
) -> [KernelDef; N] {
    let mut all = [ll(copies[0]); N];
    all[1] = ll(copies[1]);
    all[2] = ll(copies[2]);
    let mut i = 0;
    while i < PER_FAMILY {
        let (t, op) = (first_type + i / 5, i % 5);
        all[3 + i] = ll(REDUCE[t][op]);
        all[3 + PER_FAMILY + i] = ll(SHORT_ALLREDUCE[t][op]);
        all[3 + 2 * PER_FAMILY + i] = ll(SHORT_REDUCE_SCATTER[t][op]);
        i += 1;
    }
    all[N - 1] = KernelDef::new::<LlCollectiveArgs>(ll128.0, collective_ll128_allreduce);
    all
}

const BASE_KERNELS: [KernelDef; 4 + 3 * BASE_PER_FAMILY] =
    kernels::<{ 4 + 3 * BASE_PER_FAMILY }, BASE_PER_FAMILY>(
        [COPY, SHORT_ALLGATHER, SHORT_ALLTOALL],
        0,
        LL128_ALLREDUCE,
    );
const WIDE_KERNELS: [KernelDef; 4 + 3 * WIDE_PER_FAMILY] =
    kernels::<{ 4 + 3 * WIDE_PER_FAMILY }, WIDE_PER_FAMILY>(
        [COPY_WIDE, SHORT_ALLGATHER_WIDE, SHORT_ALLTOALL_WIDE],
        BASE_TYPES,
        LL128_ALLREDUCE_WIDE,
    );

/// The LL module of the base element types (f32, f16, bf16, i32, u32), loaded at set-up.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/ll.cu",
    source: include_str!("../../../../kernels/collectives/ll.cu"),
    headers: HEADERS,
    kernels: &BASE_KERNELS,
};

/// The LL module of the wide element types (f64, i64, u64, i8, u8, FP8), loaded at their first
/// call.
pub static WIDE_MODULE: KernelModule = KernelModule {
    name: "collectives/ll_wide.cu",
    source: include_str!("../../../../kernels/collectives/ll_wide.cu"),
    headers: HEADERS,
    kernels: &WIDE_KERNELS,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_listed_once_and_defined_in_the_source() {
        let mut names: Vec<&str> = [&MODULE, &WIDE_MODULE]
            .iter()
            .flat_map(|m| m.kernels.iter().map(|k| k.id.name()))
            .collect();
        names.sort();
        names.dedup();
        // The base module: the 79 entry points of before the wide types; the wide one the same
        // families for seven types.
        assert_eq!(MODULE.kernels.len(), 79);
        assert_eq!(names.len(), 8 + 3 * 5 * NTYPES);
        for m in [&MODULE, &WIDE_MODULE] {
            for k in m.kernels {
                let def = format!("extern \"C\" __global__ void {}(", k.id);
                assert!(m.source.contains(&def), "{}: {}", m.name, k.id);
                assert_eq!(k.param_size, size_of::<LlCollectiveArgs>());
                assert!(k.host.is_some());
            }
        }
        for (t, ids) in REDUCE.iter().enumerate() {
            for id in ids {
                let module = if t < BASE_TYPES {
                    &MODULE
                } else {
                    &WIDE_MODULE
                };
                assert!(module.kernel(*id).is_some(), "{id}");
            }
        }
        assert_eq!(REDUCE[2][3].name(), "mscclpp_collective_ll_reduce_bf16_max");
        assert_eq!(
            REDUCE[mscclpp_hal::DataType::F8E5M2 as usize][4].name(),
            "mscclpp_collective_ll_reduce_f8e5m2_avg"
        );
    }
}
