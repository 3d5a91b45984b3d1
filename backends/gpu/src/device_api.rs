//! The device API every GPU vendor compiles modules against, embedded in the binary: the
//! vendor-neutral headers of `kernels/include/mscclpp`, with each vendor's own
//! `mscclpp/core.cuh` (the one header that differs: `kernels/{cuda,hip}/include/mscclpp`). The
//! kernels themselves belong to their owners, who hand them over as [`KernelModule`]s.

use mscclpp_hal::{KernelDef, KernelId, KernelModule};

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
        header!("spin.cuh"),
        header!("switch_channel.cuh"),
        header!("word.cuh"),
    ]
}

/// What `#include`s resolve to when `module` is compiled with `core`: the device API, then the
/// module's own headers.
pub fn module_headers(
    core: &'static str,
    module: &KernelModule,
) -> Vec<(&'static str, &'static str)> {
    headers(core)
        .into_iter()
        .chain(module.headers.iter().copied())
        .collect()
}

const fn check(name: &'static str) -> KernelDef {
    // Compile-only kernels: no argument struct to check, no host version.
    KernelDef {
        id: KernelId(name),
        param_size: 0,
        host: None,
    }
}

/// Compile-only coverage of every device-API function (`kernels/checks/device_api.cu`; never
/// launched): each compile generates, and the assembler checks, every inline-asm and builtin
/// path.
pub static DEVICE_API_CHECK: KernelModule = KernelModule {
    name: "checks/device_api.cu",
    source: include_str!("../../../kernels/checks/device_api.cu"),
    headers: &[],
    kernels: &[
        check("check_core"),
        check("check_packets"),
        check("check_semaphores"),
        check("check_fifo"),
        check("check_memory_channel"),
        check("check_port_channel"),
        check("check_switch_channel"),
        check("check_device_syncer"),
    ],
};

/// Whether `source` defines the kernel `name` (`extern "C" __global__ void <name>(`).
pub fn defines(source: &str, name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && source.contains(&format!("extern \"C\" __global__ void {name}("))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(dir: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.'))
            .collect();
        names.sort();
        names
    }

    const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../kernels");

    #[test]
    fn every_header_on_disk_is_embedded_and_only_core_is_per_vendor() {
        let on_disk: Vec<String> = list(&format!("{ROOT}/include/mscclpp"))
            .into_iter()
            .map(|n| format!("mscclpp/{n}"))
            .collect();
        let mut embedded: Vec<String> = headers(HIP_CORE)
            .iter()
            .map(|(n, _)| n.to_string())
            .filter(|n| n != CORE_HEADER)
            .collect();
        embedded.sort();
        assert_eq!(
            on_disk, embedded,
            "kernels/include/mscclpp and headers() differ"
        );
        assert_eq!(headers(CUDA_CORE)[0], (CORE_HEADER, CUDA_CORE));
        assert_eq!(headers(HIP_CORE)[0], (CORE_HEADER, HIP_CORE));
        for vendor in ["cuda", "hip"] {
            assert_eq!(
                list(&format!("{ROOT}/{vendor}/include/mscclpp")),
                vec!["core.cuh"]
            );
        }
    }

    #[test]
    fn every_check_kernel_is_defined_and_module_headers_follow_the_api() {
        for k in DEVICE_API_CHECK.kernels {
            assert!(defines(DEVICE_API_CHECK.source, k.id.name()), "{}", k.id);
        }
        assert!(!defines("extern \"C\" __global__ void a(", ""));
        static M: KernelModule = KernelModule {
            name: "m.cu",
            source: "",
            headers: &[("m/args.cuh", "x")],
            kernels: &[],
        };
        let h = module_headers(CUDA_CORE, &M);
        assert_eq!(h.len(), HEADER_COUNT + 1);
        assert_eq!(h[HEADER_COUNT], ("m/args.cuh", "x"));
    }
}
