//! The CUDA device sources of `kernels/cuda`, embedded in the binary, and the modules that the
//! backend compiles from them with [`crate::nvrtc`].

use mscclpp_hal::{KernelId, Result};

use crate::nvrtc;

macro_rules! header {
    ($name:literal) => {
        (
            concat!("mscclpp/", $name),
            include_str!(concat!("../../../kernels/cuda/include/mscclpp/", $name)),
        )
    };
}

/// Every header of the device API, as `(include name, contents)`: what `#include
/// "mscclpp/<name>"` resolves to inside an NVRTC compile.
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
    header!("word.cuh"),
];

/// One compilation unit of `kernels/cuda` and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// File name under `kernels/cuda` (also the name NVRTC reports errors under).
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [KernelId],
}

/// Every module of `kernels/cuda`.
pub const MODULES: &[Module] = &[
    Module {
        name: "bench_kernels.cu",
        source: include_str!("../../../kernels/cuda/bench_kernels.cu"),
        kernels: &[
            KernelId::BENCH_MEMORY_CHANNEL_PUT,
            KernelId::BENCH_PORT_CHANNEL_PUT,
            KernelId::EXAMPLE_PING_PONG,
        ],
    },
    Module {
        name: "collectives.cu",
        source: include_str!("../../../kernels/cuda/collectives.cu"),
        kernels: &KernelId::COLLECTIVE_LL_ALL,
    },
    Module {
        name: "collectives_direct.cu",
        source: include_str!("../../../kernels/cuda/collectives_direct.cu"),
        kernels: &[
            KernelId::COLLECTIVE_DIRECT,
            KernelId::COLLECTIVE_READ_ALLREDUCE,
        ],
    },
    Module {
        name: "test_kernels.cu",
        source: include_str!("../../../kernels/cuda/test_kernels.cu"),
        kernels: &[KernelId::FILL_U32, KernelId::ATOMIC_ADD_U64],
    },
];

/// The module that defines kernel `id`: listed in a module's table, or defined in its source
/// (`extern "C" __global__ void <id>(`), so a kernel added to a `.cu` file is found even before
/// the table names it.
pub fn module_for(id: KernelId) -> Option<&'static Module> {
    MODULES
        .iter()
        .find(|m| m.kernels.contains(&id))
        .or_else(|| MODULES.iter().find(|m| defines(m.source, id.name())))
}

/// Whether `source` defines the kernel `name` (`extern "C" __global__ void <name>(`).
pub fn defines(source: &str, name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && source.contains(&format!("extern \"C\" __global__ void {name}("))
}

impl Module {
    /// Compiles the module for `arch` (`"sm_90"`) with the embedded headers.
    pub fn compile(&self, arch: &str) -> Result<nvrtc::Compiled> {
        nvrtc::compile(self.name, self.source, HEADERS, arch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_header_on_disk_is_embedded() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../kernels/cuda/include/mscclpp"
        );
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .map(|n| format!("mscclpp/{n}"))
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = HEADERS.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(
            on_disk, embedded,
            "kernels/cuda/include/mscclpp and HEADERS differ"
        );
    }

    #[test]
    fn every_module_on_disk_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels/cuda");
        let mut on_disk: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|e| {
                let name = e.unwrap().file_name().to_string_lossy().into_owned();
                name.ends_with(".cu").then_some(name)
            })
            .collect();
        on_disk.sort();
        let embedded: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
        assert_eq!(on_disk, embedded, "kernels/cuda/*.cu and MODULES differ");
        assert!(module_for(KernelId::FILL_U32).is_some());
        assert!(module_for(KernelId::ATOMIC_ADD_U64).is_some());
        assert!(module_for(KernelId("no_such_kernel")).is_none());
    }

    #[test]
    fn every_listed_kernel_is_defined_in_its_module() {
        for m in MODULES {
            for k in m.kernels {
                assert!(
                    defines(m.source, k.name()),
                    "{} does not define {k}",
                    m.name
                );
            }
        }
        assert!(!defines("extern \"C\" __global__ void a(", ""));
    }
}
