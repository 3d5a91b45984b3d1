//! The device sources every GPU vendor compiles, embedded in the binary: the vendor-neutral
//! device API (`kernels/include`) and kernels (`kernels/<owner>/*.cu`), with each vendor's own `mscclpp/core.cuh` (the one
//! header that differs; HIP's lives in `kernels/hip/include/mscclpp`).

use mscclpp_hal::KernelId;

macro_rules! header {
    ($name:literal) => {
        (
            concat!("mscclpp/", $name),
            include_str!(concat!("../../../kernels/include/mscclpp/", $name)),
        )
    };
}

/// The include name of the vendor header.
pub const CORE_HEADER: &str = "mscclpp/core.cuh";
/// CUDA's `core.cuh` (inline PTX).
pub const CUDA_CORE: &str = include_str!("../../../kernels/cuda/include/mscclpp/core.cuh");
/// HIP's `core.cuh` (`__hip_atomic_*`, AMDGCN builtins).
pub const HIP_CORE: &str = include_str!("../../../kernels/hip/include/mscclpp/core.cuh");

/// How many headers the device API has.
pub const HEADER_COUNT: usize = 13;

/// Every header of the device API with `core` as `mscclpp/core.cuh`, as `(include name,
/// contents)`: what `#include "mscclpp/<name>"` resolves to inside a run-time compile.
pub const fn headers(core: &'static str) -> [(&'static str, &'static str); HEADER_COUNT] {
    [
        (CORE_HEADER, core),
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
    ]
}

/// One compilation unit of `kernels/` and the kernels it defines.
#[derive(Debug, Clone, Copy)]
pub struct Module {
    /// Path under `kernels/` (also the name compilers report errors under).
    pub name: &'static str,
    /// The source text.
    pub source: &'static str,
    /// The `extern "C"` kernels it defines.
    pub kernels: &'static [KernelId],
}

/// Every module under `kernels/`.
pub const MODULES: &[Module] = &[
    Module {
        name: "bench/bench_kernels.cu",
        source: include_str!("../../../kernels/bench/bench_kernels.cu"),
        kernels: &[
            KernelId::BENCH_MEMORY_CHANNEL_PUT,
            KernelId::BENCH_PORT_CHANNEL_PUT,
            KernelId::EXAMPLE_PING_PONG,
        ],
    },
    Module {
        name: "collectives/ll.cu",
        source: include_str!("../../../kernels/collectives/ll.cu"),
        kernels: &KernelId::COLLECTIVE_LL_ALL,
    },
    Module {
        name: "collectives/direct.cu",
        source: include_str!("../../../kernels/collectives/direct.cu"),
        kernels: &[
            KernelId::COLLECTIVE_DIRECT,
            KernelId::COLLECTIVE_READ_ALLREDUCE,
        ],
    },
    Module {
        name: "tests/test_kernels.cu",
        source: include_str!("../../../kernels/tests/test_kernels.cu"),
        kernels: &[KernelId::FILL_U32, KernelId::ATOMIC_ADD_U64],
    },
];

/// Compile-only coverage of every device-API function (never launched, so not in [`MODULES`]):
/// each compile generates, and the assembler checks, every inline-asm and builtin path.
pub const DEVICE_API_CHECK: Module = Module {
    name: "checks/device_api.cu",
    source: include_str!("../../../kernels/checks/device_api.cu"),
    kernels: &[
        KernelId("check_core"),
        KernelId("check_packets"),
        KernelId("check_semaphores"),
        KernelId("check_fifo"),
        KernelId("check_memory_channel"),
        KernelId("check_port_channel"),
        KernelId("check_switch_channel"),
        KernelId("check_device_syncer"),
        KernelId("check_test_args"),
    ],
};

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

    const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");

    #[test]
    fn every_header_on_disk_is_embedded_and_hip_overrides_only_core() {
        let on_disk: Vec<String> = list(&format!("{ROOT}/include/mscclpp"), |_| true)
            .into_iter()
            .map(|n| format!("mscclpp/{n}"))
            .collect();
        let embedded: Vec<String> = headers(HIP_CORE)
            .iter()
            .map(|(n, _)| n.to_string())
            .filter(|n| n != CORE_HEADER)
            .collect();
        let mut sorted = embedded.clone();
        sorted.sort();
        assert_eq!(
            on_disk, sorted,
            "kernels/include/mscclpp and headers() differ"
        );
        assert_eq!(headers(CUDA_CORE)[0], (CORE_HEADER, CUDA_CORE));
        assert_eq!(headers(HIP_CORE)[0], (CORE_HEADER, HIP_CORE));
        for vendor in ["cuda", "hip"] {
            assert_eq!(
                list(&format!("{ROOT}/{vendor}/include/mscclpp"), |_| true),
                vec!["core.cuh"]
            );
        }
    }

    #[test]
    fn every_module_on_disk_is_embedded() {
        let on_disk: Vec<String> = ["bench", "collectives", "tests"]
            .iter()
            .flat_map(|d| {
                list(&format!("{ROOT}/{d}"), |n| n.ends_with(".cu"))
                    .into_iter()
                    .map(move |n| format!("{d}/{n}"))
            })
            .collect();
        let mut embedded: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
        embedded.sort();
        assert_eq!(on_disk, embedded, "kernels/*/*.cu and MODULES differ");
        assert!(module_for(KernelId::FILL_U32).is_some());
        assert!(module_for(KernelId::ATOMIC_ADD_U64).is_some());
        assert!(module_for(KernelId("no_such_kernel")).is_none());
    }

    #[test]
    fn every_listed_kernel_is_defined_in_its_module() {
        for m in MODULES.iter().chain([&DEVICE_API_CHECK]) {
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
