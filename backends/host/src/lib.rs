//! # mscclpp-host — the CPU reference backend
//!
//! The embedded default of mscclpp-rs and the reference CI runs: it implements every HAL trait
//! with real behaviour, so that everything above the HAL runs with no accelerator.
//!
//! - **Memory** is shared memory (`memfd`) mapped into the process; a device address is the
//!   mapping's virtual address. An IPC handle lets another process of the same host map the same
//!   pages ([`memory`]).
//! - **Streams** are in-order executors, one worker thread each; events mark points in them
//!   ([`stream`]).
//! - **Kernels** are the Rust functions that a [`mscclpp_hal::KernelModule`]'s owner gives for
//!   the entry points the GPU backends compile from its source; their blocks run on worker
//!   threads and device-side atomics are Rust atomics on the shared mapping ([`kernels`]). The
//!   backend names no kernel of the library.
//! - **Multicast** is emulated: a mapped group exposes every member's memory ([`multicast`]).
//!
//! The file split (device, memory, stream, kernels, multicast) is the one every backend follows;
//! [`device`] sits over the others and none of them imports it (the launch limit the streams
//! check, [`kernels::MAX_THREADS_PER_BLOCK`], lives with the kernels).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod device;
pub mod kernels;
pub mod memory;
pub mod multicast;
pub mod pieces;
pub mod shareable;
pub mod stream;

pub use device::{HostBackend, HostDevice};

/// The host backend's family of types ([`mscclpp_hal::Api`]).
#[derive(Debug, Clone, Copy)]
pub struct Host;

impl mscclpp_hal::Api for Host {
    const NAME: &'static str = "host";
    type Device = HostDevice;
    type Stream = stream::HostStream;
    type Event = stream::HostEvent;
    type Kernel = kernels::HostKernel;
    type Graph = stream::HostGraph;
}

use std::sync::Arc;

/// The host backend; it cannot be absent, but returns `Result` like every backend's probe.
pub fn probe() -> mscclpp_hal::Result<Arc<dyn mscclpp_hal::Backend>> {
    Ok(Arc::new(HostBackend::new()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mscclpp_hal::{
        Backend, Error, ErrorClass, KernelArgs, KernelDef, KernelId, KernelModule, LaunchConfig,
        MemoryKind,
    };

    use super::*;

    /// A host kernel that refuses a misaligned address before touching memory.
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct AlignedArgs {
        dst: u64,
    }
    // SAFETY: repr(C), one integer.
    unsafe impl KernelArgs for AlignedArgs {}

    fn refuse_misaligned(_: &LaunchConfig, args: &[u8]) -> mscclpp_hal::Result<()> {
        let a = AlignedArgs::from_bytes(args)?;
        if a.dst % 4 != 0 {
            return Err(Error::invalid(format!(
                "{:#x} is not 4-byte aligned",
                a.dst
            )));
        }
        Ok(())
    }

    static MODULE: KernelModule = KernelModule {
        name: "host_test",
        source: "",
        headers: &[],
        kernels: &[KernelDef::new::<AlignedArgs>(
            "refuse_misaligned",
            refuse_misaligned,
        )],
    };

    #[test]
    fn a_module_without_a_host_function_or_the_kernel_is_refused() {
        static GPU_ONLY: KernelModule = KernelModule {
            name: "gpu_only",
            source: "",
            headers: &[],
            kernels: &[KernelDef::device_only::<AlignedArgs>("k")],
        };
        let dev = HostBackend::new().open_device(0).unwrap();
        let e = dev.load(&GPU_ONLY, KernelId("k")).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
        let e = dev.load(&MODULE, KernelId("nope")).unwrap_err();
        assert!(e.to_string().contains("refuse_misaligned"), "{e}");
    }

    #[test]
    fn kernel_error_is_sticky_until_synchronize_and_skips_dependent_work() {
        let dev = HostBackend::new().open_device(0).unwrap();
        let s = dev.create_stream().unwrap();
        let k = dev.load(&MODULE, KernelId("refuse_misaligned")).unwrap();
        let buf = dev.alloc(64, MemoryKind::Device).unwrap();
        s.fill(&buf.full(), 1).unwrap();
        let bad = AlignedArgs {
            dst: buf.ptr().0 + 1,
        };
        // SAFETY: the kernel rejects the misaligned address before touching memory.
        unsafe { s.launch(&*k, LaunchConfig::linear(1, 1), &bad) }.unwrap();
        s.fill(&buf.full(), 2).unwrap(); // skipped: it follows the failure
        let mut out = [0u8; 64];
        // A blocking read behind the failure reports the failure itself.
        let e = s.read_to_host(&mut out, &buf.full()).unwrap_err();
        assert_eq!(e.class(), ErrorClass::InvalidUsage, "{e}");
        assert!(e.to_string().contains("aligned"), "{e}");
        s.read_to_host(&mut out, &buf.full()).unwrap();
        assert!(out.iter().all(|&b| b == 1), "work after the failure ran");
        s.synchronize_timeout(Duration::from_secs(10)).unwrap();
    }

    #[test]
    fn synchronize_times_out_on_stuck_work() {
        let dev = HostBackend::new().open_device(0).unwrap();
        let (s1, s2) = (dev.create_stream().unwrap(), dev.create_stream().unwrap());
        let ev = dev.create_event().unwrap();
        // Hold s1 up with a large amount of work, make s2 wait for it, and give s2 no time.
        let buf = dev.alloc(64 << 20, MemoryKind::Device).unwrap();
        for i in 0..64 {
            s1.fill(&buf.full(), i).unwrap();
        }
        s1.record(&*ev).unwrap();
        s2.wait_event(&*ev).unwrap();
        let e = s2
            .synchronize_timeout(Duration::from_micros(1))
            .unwrap_err();
        assert_eq!(e.class(), ErrorClass::Timeout, "{e}");
        s2.synchronize_timeout(Duration::from_secs(60)).unwrap();
    }

    #[test]
    fn handle_from_another_host_is_refused() {
        let dev = HostBackend::new().open_device(0).unwrap();
        let buf = dev.alloc(4096, MemoryKind::Device).unwrap();
        let mut h = dev.ipc_export(&buf).unwrap();
        // Rewrite the host id inside the payload (the first field after magic and version).
        let here = mscclpp_hal::env::host_id();
        let other: String = here
            .chars()
            .map(|c| if c == '0' { '1' } else { '0' })
            .collect();
        let pos = h
            .payload
            .windows(here.len())
            .position(|w| w == here.as_bytes())
            .unwrap();
        h.payload[pos..pos + here.len()].copy_from_slice(other.as_bytes());
        let e = dev.ipc_import(&h).unwrap_err();
        assert!(e.to_string().contains("made on host"), "{e}");
    }
}
