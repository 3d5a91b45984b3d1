//! PyTorch captures CUDA graphs in global mode (`torch.cuda.graph`'s default). While it does,
//! CUDA refuses a host wait, an allocation or a free made by any other thread in the default
//! mode, and the refusal ends the capture ("operation failed due to a previous error during
//! capture"). The library's own host work (a stream of its own dropped with work pending, host
//! copies, allocations and frees of its buffers, a proxy thread's waits) touches no capturing
//! stream and must leave such a capture intact. Needs a CUDA device; without one the test prints
//! "skipped: <reason>" and returns.

mod common;

use std::sync::mpsc;

use cudarc::driver::sys;
use mscclpp_hal::{MemoryKind, Stream};

/// A raw pointer that may cross to the capturing thread (a context and a device address).
struct Raw(sys::CUcontext, sys::CUdeviceptr);
// SAFETY: a CUDA context handle and a device address are plain values usable from any thread.
unsafe impl Send for Raw {}

#[test]
fn host_work_of_ours_leaves_another_threads_global_capture_intact() {
    let Some(device) = common::device_or_skip() else {
        return;
    };
    let target = device.alloc(1 << 20, MemoryKind::Device).expect("alloc");
    // A stream of ours with work pending, to be dropped during the capture.
    let busy: std::sync::Arc<dyn Stream> = device.create_stream().expect("stream");
    let big = device.alloc(256 << 20, MemoryKind::Device).expect("alloc");
    let copies = device.create_stream().expect("stream");
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: valid out-pointer; the calls above made device 0's context current here.
    let got = unsafe { sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(got, sys::CUresult::CUDA_SUCCESS);
    let raw = Raw(ctx, target.ptr().0);
    let (started_tx, started) = mpsc::channel();
    let (done, done_rx) = mpsc::channel::<()>();
    // The other thread captures as PyTorch does: its own stream, global mode.
    let capturer = std::thread::spawn(move || -> Result<(), String> {
        // The whole value moves here (a closure would otherwise take its fields one by one).
        let raw = raw;
        let Raw(ctx, ptr) = raw;
        let ok = |what: &str, r: sys::CUresult| {
            if r == sys::CUresult::CUDA_SUCCESS {
                Ok(())
            } else {
                Err(format!("{what}: {r:?}"))
            }
        };
        // SAFETY: a live context of this process.
        ok("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(ctx) })?;
        let mut s: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: valid out-pointer; the context is current.
        ok("cuStreamCreate", unsafe {
            sys::cuStreamCreate(&mut s, flags)
        })?;
        let global = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: a live stream of the current context.
        ok("cuStreamBeginCapture", unsafe {
            sys::cuStreamBeginCapture_v2(s, global)
        })?;
        let _ = started_tx.send(());
        // SAFETY: a captured memset of 1 MiB the main thread allocated and keeps alive.
        ok("cuMemsetD8Async (captured)", unsafe {
            sys::cuMemsetD8Async(ptr, 3, 1 << 20, s)
        })?;
        let _ = done_rx.recv();
        let mut graph: sys::CUgraph = std::ptr::null_mut();
        // SAFETY: the capturing stream; valid out-pointer.
        let end = unsafe { sys::cuStreamEndCapture(s, &mut graph) };
        if !graph.is_null() {
            // SAFETY: the graph the capture made, destroyed once.
            unsafe { sys::cuGraphDestroy(graph) };
        }
        // SAFETY: the stream created above, destroyed once.
        unsafe { sys::cuStreamDestroy_v2(s) };
        ok("cuStreamEndCapture (the capture must have survived)", end)
    });
    started.recv().expect("the capturing thread started");
    // Ours, during the capture: each must succeed and leave the capture intact.
    let ours = (|| -> mscclpp_hal::Result<()> {
        busy.fill(&big.full(), 1)?;
        drop(busy); // waits for its fill on the way
        let b = device.alloc(4096, MemoryKind::Device)?;
        copies.write_from_host(&b.full(), &[7u8; 4096])?;
        let mut back = [0u8; 4096];
        copies.read_to_host(&mut back, &b.full())?;
        assert_eq!(back, [7u8; 4096]);
        copies.synchronize()?;
        drop(b);
        drop(big);
        Ok(())
    })();
    let _ = done.send(());
    let captured = capturer.join().expect("the capturing thread panicked");
    ours.expect("host work of ours during another thread's global capture");
    captured.expect("the other thread's capture");
}
