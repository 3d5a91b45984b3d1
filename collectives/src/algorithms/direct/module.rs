//! The module of `kernels/collectives/direct.cu`: the direct kernel of every collective and the
//! read all-reduce (`read`), one compilation unit since they share the 16-byte data paths.

use mscclpp_hal::{KernelDef, KernelId, KernelModule};

use super::args::DirectCollectiveArgs;
use super::host::collective_direct;
use crate::algorithms::HEADERS;
use crate::algorithms::read::args::ReadCollectiveArgs;
use crate::algorithms::read::host::collective_read_allreduce;

/// The direct (bandwidth) algorithm of every collective.
pub(crate) const DIRECT: KernelId = KernelId("mscclpp_collective_direct");

/// The read algorithm of all-reduce.
pub(crate) const READ_ALLREDUCE: KernelId = KernelId("mscclpp_collective_read_allreduce");

/// The direct module.
pub static MODULE: KernelModule = KernelModule {
    name: "collectives/direct.cu",
    source: include_str!("../../../../kernels/collectives/direct.cu"),
    headers: HEADERS,
    kernels: &[
        KernelDef::new::<DirectCollectiveArgs>(DIRECT.0, collective_direct),
        KernelDef::new::<ReadCollectiveArgs>(READ_ALLREDUCE.0, collective_read_allreduce),
    ],
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_is_defined_in_the_source() {
        for k in MODULE.kernels {
            let def = format!("extern \"C\" __global__ void {}(", k.id);
            assert!(MODULE.source.contains(&def), "{}", k.id);
        }
    }
}
