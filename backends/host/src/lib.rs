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
//! - **Kernels** are Rust functions registered under the same [`mscclpp_hal::KernelId`]s the GPU
//!   backends compile; their blocks run on worker threads and device-side atomics are Rust
//!   atomics on the shared mapping ([`kernels`]).
//! - **Multicast** is emulated: a mapped group exposes every member's memory ([`multicast`]).
//!
//! The file split (device, memory, stream, kernels, multicast) is the one every backend follows.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod collectives;
pub mod collectives_direct;
pub mod collectives_ll128;
pub mod collectives_read;
pub mod device;
pub mod kernels;
pub mod memory;
pub mod multicast;
pub mod stream;

pub use device::{HostBackend, HostDevice};

use std::sync::Arc;

/// The host backend; it cannot be absent, but returns `Result` like every backend's probe.
pub fn probe() -> mscclpp_hal::Result<Arc<dyn mscclpp_hal::Backend>> {
    Ok(Arc::new(HostBackend::new()))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use mscclpp_hal::kernel::FillU32Args;
    use mscclpp_hal::{Backend, ErrorClass, KernelId, LaunchConfig, MemoryKind};

    use super::*;

    #[test]
    fn kernel_error_is_sticky_until_synchronize_and_skips_dependent_work() {
        let dev = HostBackend::new().open_device(0).unwrap();
        let s = dev.create_stream().unwrap();
        let k = dev.load_kernel(KernelId::FILL_U32).unwrap();
        let buf = dev.alloc(64, MemoryKind::Device).unwrap();
        s.fill(&buf.full(), 1).unwrap();
        let bad = FillU32Args {
            dst: buf.ptr().0 + 1,
            count: 4,
            value: 9,
            _pad: 0,
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
