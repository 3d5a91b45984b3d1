//! The LL module, `kernels/collectives/ll.cu`: the general LL kernels (this folder), the short
//! LL kernels (`ll_short`) and LL128 all-reduce (`ll128`), one compilation unit since they share
//! the LL scratch, flag counter and device helpers. Every entry point takes an
//! [`LlCollectiveArgs`]; on the host one Rust kernel serves the LL and short entry points (it
//! reads the kind, type and operator from its arguments) and one the LL128 entry point.

use mscclpp_hal::{KernelDef, KernelId, KernelModule};

use super::args::LlCollectiveArgs;
use super::host::collective_ll;
use crate::algorithms::ll128::host::collective_ll128_allreduce;
use crate::algorithms::{HEADERS, ll_short, ll128};

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
pub(crate) use by_type_and_op;

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

/// The general LL kernel of the copying collectives — all-gather, broadcast, all-to-all.
pub(crate) const COPY: KernelId = KernelId("mscclpp_collective_ll_copy");

/// The general LL kernels of the reducing collectives — all-reduce, reduce-scatter — one per
/// element type and operator, indexed by their codes. Separate kernels, each compiled for its
/// one case, keep a small message's path short (2 x H200: 0.15-0.3 µs less per all-reduce than
/// one kernel for every case).
pub(crate) const REDUCE: [[KernelId; 5]; NTYPES] = by_type_and_op!("mscclpp_collective_ll_reduce");

const fn ll(id: KernelId) -> KernelDef {
    KernelDef::new::<LlCollectiveArgs>(id.0, collective_ll)
}

/// Entry points per reducing family (one per element type and operator).
const PER_FAMILY: usize = 5 * NTYPES;

/// Every entry point: the general, short and LL128 kernels.
const NKERNELS: usize = 4 + 3 * PER_FAMILY;
const KERNELS: [KernelDef; NKERNELS] = {
    let mut all = [ll(COPY); NKERNELS];
    all[1] = ll(ll_short::ALLGATHER);
    all[2] = ll(ll_short::ALLTOALL);
    let mut i = 0;
    while i < PER_FAMILY {
        all[3 + i] = ll(REDUCE[i / 5][i % 5]);
        all[3 + PER_FAMILY + i] = ll(ll_short::ALLREDUCE[i / 5][i % 5]);
        all[3 + 2 * PER_FAMILY + i] = ll(ll_short::REDUCE_SCATTER[i / 5][i % 5]);
        i += 1;
    }
    all[NKERNELS - 1] =
        KernelDef::new::<LlCollectiveArgs>(ll128::ALLREDUCE.0, collective_ll128_allreduce);
    all
};

/// The LL module.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/ll.cu",
    source: include_str!("../../../../kernels/collectives/ll.cu"),
    headers: HEADERS,
    kernels: &KERNELS,
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_listed_once_and_defined_in_the_source() {
        let mut names: Vec<&str> = MODULE.kernels.iter().map(|k| k.id.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), NKERNELS);
        for k in MODULE.kernels {
            let def = format!("extern \"C\" __global__ void {}(", k.id);
            assert!(MODULE.source.contains(&def), "{}", k.id);
            assert_eq!(k.param_size, size_of::<LlCollectiveArgs>());
            assert!(k.host.is_some());
        }
        assert_eq!(REDUCE[2][3].name(), "mscclpp_collective_ll_reduce_bf16_max");
        assert_eq!(
            REDUCE[mscclpp_hal::DataType::F8E5M2 as usize][4].name(),
            "mscclpp_collective_ll_reduce_f8e5m2_avg"
        );
    }
}
