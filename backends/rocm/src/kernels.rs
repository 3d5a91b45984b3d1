//! The HIP device sources of `kernels/hip`, embedded in the binary, and the modules that the
//! backend compiles from them with [`crate::hiprtc`].

use mscclpp_hal::{KernelId, Result};

use crate::hiprtc;

macro_rules! header {
    ($name:literal) => {
        (
            concat!("mscclpp/", $name),
            include_str!(concat!("../../../kernels/hip/include/mscclpp/", $name)),
        )
    };
}

/// Every header of the device API, as `(include name, contents)`: what `#include
/// "mscclpp/<name>"` resolves to inside a hipRTC compile.
pub const HEADERS: &[(&str, &str)] = &[
    header!("core.cuh"),
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
];

/// The one vendor-specific header; every other header is the same text as its CUDA twin.
pub const VENDOR_HEADER: &str = "mscclpp/core.cuh";

/// One compilation unit of `kernels/hip` and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// File name under `kernels/hip` (also the name hipRTC reports errors under).
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [KernelId],
}

/// Every module of `kernels/hip`.
pub const MODULES: &[Module] = &[
    Module {
        name: "bench_kernels.hip",
        source: include_str!("../../../kernels/hip/bench_kernels.hip"),
        kernels: &[
            KernelId::BENCH_MEMORY_CHANNEL_PUT,
            KernelId::BENCH_PORT_CHANNEL_PUT,
            KernelId::EXAMPLE_PING_PONG,
        ],
    },
    Module {
        name: "collectives.hip",
        source: include_str!("../../../kernels/hip/collectives.hip"),
        kernels: &[KernelId::COLLECTIVE_LL],
    },
    Module {
        name: "collectives_direct.hip",
        source: include_str!("../../../kernels/hip/collectives_direct.hip"),
        kernels: &[KernelId::COLLECTIVE_DIRECT],
    },
    Module {
        name: "test_kernels.hip",
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
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../kernels/hip/include/mscclpp"
        );
        let on_disk: Vec<String> = list(dir, |_| true)
            .into_iter()
            .map(|n| format!("mscclpp/{n}"))
            .collect();
        let embedded: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            on_disk, embedded,
            "kernels/hip/include/mscclpp and HEADERS differ"
        );
    }

    #[test]
    fn every_module_on_disk_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/hip");
        let embedded: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
        assert_eq!(list(dir, |n| n.ends_with(".hip")), embedded);
        assert!(module_for(KernelId::FILL_U32).is_some());
        assert!(module_for(KernelId::ATOMIC_ADD_U64).is_some());
    }

    /// The HIP headers other than core.cuh are copies of the CUDA ones: a change to one side
    /// must be made to both.
    #[test]
    fn vendor_neutral_headers_match_the_cuda_ones() {
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");
        let cuda = list(&format!("{root}/cuda/include/mscclpp"), |_| true);
        let hip = list(&format!("{root}/hip/include/mscclpp"), |_| true);
        assert_eq!(
            cuda, hip,
            "the CUDA and HIP device APIs have different files"
        );
        for name in hip {
            if format!("mscclpp/{name}") == VENDOR_HEADER {
                continue;
            }
            let read = |v: &str| {
                std::fs::read_to_string(format!("{root}/{v}/include/mscclpp/{name}")).unwrap()
            };
            assert!(
                read("cuda") == read("hip"),
                "kernels/hip/include/mscclpp/{name} differs from its CUDA twin; copy it over"
            );
        }
    }
}
