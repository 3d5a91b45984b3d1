//! An application that resets the device under live objects of ours (`cudaDeviceReset`, as
//! nccl-tests does before exiting, its `-p 1` communicators never destroyed) must find them
//! reported lost, so that the library's own threads stand down instead of calling the driver on
//! freed state, and dropping them must not touch the driver either. Needs a CUDA device; without
//! one the test prints "skipped: <reason>" and returns.

mod common;

use cudarc::driver::sys;
use mscclpp_hal::{MemoryKind, Stream};

#[test]
fn a_device_reset_under_live_objects_is_seen_as_lost_or_skipped() {
    let Some(device) = common::device_or_skip() else {
        return;
    };
    let stream: std::sync::Arc<dyn Stream> = device.create_stream().expect("stream");
    let buf = device.alloc(4096, MemoryKind::Device).expect("alloc");
    stream.fill(&buf.full(), 7).expect("fill");
    stream.synchronize().expect("sync");
    assert!(!device.lost(), "a live device reported lost");
    assert!(!stream.device_lost(), "a live stream reported lost");

    let mut dev: sys::CUdevice = 0;
    // SAFETY: valid out-pointer; the driver is initialised (the probe opened device 0).
    let got = unsafe { sys::cuDeviceGet(&mut dev, 0) };
    assert_eq!(got, sys::CUresult::CUDA_SUCCESS);
    // What cudaDeviceReset does underneath.
    // SAFETY: no work of this process is pending on the device (synchronised above).
    let reset = unsafe { sys::cuDevicePrimaryCtxReset_v2(dev) };
    assert_eq!(reset, sys::CUresult::CUDA_SUCCESS);
    assert!(
        device.lost(),
        "the device was reset but is not reported lost"
    );
    assert!(
        stream.device_lost(),
        "the stream's device was reset but it is not reported lost"
    );
    // Dropping them after the reset must neither crash nor hang: they leak what the reset freed.
    drop(stream);
    drop(buf);
    drop(device);
}
