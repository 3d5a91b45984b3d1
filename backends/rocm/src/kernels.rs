//! The HIP device sources, embedded in the binary, and the modules that the backend compiles
//! from them with [`crate::hiprtc`].
//!
//! The device API and the library's kernels are vendor-neutral text written once under
//! `kernels/cuda`; only `core.cuh` (atomics, fences, packet stores, traps) differs for HIP and
//! lives in `kernels/hip/include/mscclpp`, with the modules that use HIP-only builtins
//! (`kernels/hip/*.hip`).

use mscclpp_hal::{KernelId, Result};

use crate::hiprtc;

macro_rules! header {
    ($name:literal) => {
        (
            concat!("mscclpp/", $name),
            include_str!(concat!("../../../kernels/cuda/include/mscclpp/", $name)),
        )
    };
}

/// Every header of the device API, as `(include name, contents)`: what `#include
/// "mscclpp/<name>"` resolves to inside a hipRTC compile.
pub const HEADERS: &[(&str, &str)] = &[
    (
        "mscclpp/core.cuh",
        include_str!("../../../kernels/hip/include/mscclpp/core.cuh"),
    ),
    header!("device_syncer.cuh"),
    header!("fifo.cuh"),
    header!("layout_check.h"),
    header!("memory_channel.cuh"),
    header!("mscclpp.cuh"),
    header!("numeric.cuh"),
    header!("packet.cuh"),
    header!("port_channel.cuh"),
    header!("semaphore.cuh"),
    header!("switch_channel.cuh"),
    header!("test_args.cuh"),
    header!("word.cuh"),
];

/// The one vendor-specific header (from `kernels/hip`); every other one is the CUDA text.
pub const VENDOR_HEADER: &str = "mscclpp/core.cuh";

/// One compilation unit and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// Path under `kernels/` (also the name hipRTC reports errors under).
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [KernelId],
}

/// Every module: the vendor-neutral ones of `kernels/cuda` and the HIP-only ones of `kernels/hip`.
pub const MODULES: &[Module] = &[
    Module {
        name: "cuda/bench_kernels.cu",
        source: include_str!("../../../kernels/cuda/bench_kernels.cu"),
        kernels: &[
            KernelId::BENCH_MEMORY_CHANNEL_PUT,
            KernelId::BENCH_PORT_CHANNEL_PUT,
            KernelId::EXAMPLE_PING_PONG,
        ],
    },
    Module {
        name: "cuda/collectives.cu",
        source: include_str!("../../../kernels/cuda/collectives.cu"),
        kernels: &KernelId::COLLECTIVE_LL_ALL,
    },
    Module {
        name: "cuda/collectives_direct.cu",
        source: include_str!("../../../kernels/cuda/collectives_direct.cu"),
        kernels: &[
            KernelId::COLLECTIVE_DIRECT,
            KernelId::COLLECTIVE_READ_ALLREDUCE,
        ],
    },
    Module {
        name: "hip/test_kernels.hip",
        source: include_str!("../../../kernels/hip/test_kernels.hip"),
        kernels: &[KernelId::FILL_U32, KernelId::ATOMIC_ADD_U64],
    },
];

/// The module that defines kernel `id`.
pub fn module_for(id: KernelId) -> Option<&'static Module> {
    MODULES.iter().find(|m| m.kernels.contains(&id))
}

impl Module {
    /// Compiles the module for `arch` (`"gfx90a"`) with the embedded headers.
    pub fn compile(&self, arch: &str) -> Result<hiprtc::Compiled> {
        hiprtc::compile(self.name, self.source, HEADERS, arch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(dir: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && keep(n))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_header_on_disk_is_embedded() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
        let on_disk: Vec<String> = list(&format!("{root}/cuda/include/mscclpp"), |_| true)
            .into_iter()
            .map(|n| format!("mscclpp/{n}"))
            .collect();
        let embedded: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            on_disk, embedded,
            "kernels/cuda/include/mscclpp and HEADERS differ"
        );
        // HIP overrides exactly the vendor header.
        assert_eq!(
            list(&format!("{root}/hip/include/mscclpp"), |_| true),
            vec!["core.cuh"]
        );
        assert_eq!(VENDOR_HEADER, "mscclpp/core.cuh");
    }

    #[test]
    fn every_module_on_disk_is_embedded() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
        let mut on_disk: Vec<String> = list(&format!("{root}/cuda"), |n| n.ends_with(".cu"))
            .into_iter()
            .filter(|n| n != "test_kernels.cu")
            .map(|n| format!("cuda/{n}"))
            .chain(
                list(&format!("{root}/hip"), |n| n.ends_with(".hip"))
                    .into_iter()
                    .map(|n| format!("hip/{n}")),
            )
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded);
        assert!(module_for(KernelId::FILL_U32).is_some());
        assert!(module_for(KernelId::ATOMIC_ADD_U64).is_some());
    }
}
