//! The direct modules: the direct kernel of every collective and the read all-reduce (`read`),
//! one source (`kernels/collectives/direct.cuh`) since they share the 16-byte data paths, compiled
//! as [`MODULE`] (`direct.cu`, the base element types f32, f16, bf16, i32, u32: its direct kernel
//! runs 896 threads per block on large messages, which its 70 registers allow) and
//! [`WIDE_MODULE`] (`direct_wide.cu`, f64, i64, u64, i8, u8, FP8; loaded at their first call).

use mscclpp_hal::{KernelDef, KernelId, KernelModule};

use super::args::DirectCollectiveArgs;
use super::host::collective_direct;
use crate::algorithms::base::HEADERS;
use crate::algorithms::read::args::ReadCollectiveArgs;
use crate::algorithms::read::host::collective_read_allreduce;

/// The direct (bandwidth) algorithm of every collective: the base types, the wide ones.
pub(crate) const DIRECT: KernelId = KernelId("mscclpp_collective_direct");
pub(crate) const DIRECT_WIDE: KernelId = KernelId("mscclpp_collective_direct_wide");

/// The read algorithm of all-reduce: the base types, the wide ones.
pub(crate) const READ_ALLREDUCE: KernelId = KernelId("mscclpp_collective_read_allreduce");
pub(crate) const READ_ALLREDUCE_WIDE: KernelId = KernelId("mscclpp_collective_read_allreduce_wide");

/// The direct module of the base element types, loaded at set-up.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/direct.cu",
    source: include_str!("../../../../kernels/collectives/direct.cu"),
    headers: HEADERS,
    kernels: &[
        KernelDef::new::<DirectCollectiveArgs>(DIRECT.0, collective_direct),
        KernelDef::new::<ReadCollectiveArgs>(READ_ALLREDUCE.0, collective_read_allreduce),
    ],
};

/// The direct module of the wide element types, loaded at their first call.
pub static WIDE_MODULE: KernelModule = KernelModule {
    name: "collectives/direct_wide.cu",
    source: include_str!("../../../../kernels/collectives/direct_wide.cu"),
    headers: HEADERS,
    kernels: &[
        KernelDef::new::<DirectCollectiveArgs>(DIRECT_WIDE.0, collective_direct),
        KernelDef::new::<ReadCollectiveArgs>(READ_ALLREDUCE_WIDE.0, collective_read_allreduce),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_the_source() {
        for m in [&MODULE, &WIDE_MODULE] {
            for k in m.kernels {
                let def = format!("extern \"C\" __global__ void {}(", k.id);
                assert!(m.source.contains(&def), "{}: {}", m.name, k.id);
            }
        }
    }
}
