//! The adapters between the typed traits and the trait objects, on two minimal backends that
//! count what reaches them: a backend's objects meet each other's types; another backend's are
//! refused with an error naming the receiver, never taken for its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::api::{Api, DeviceApi, EventApi, GraphApi, KernelApi, StreamApi, typed_device};
use crate::caps::{BackendKind, Capabilities, DeviceInfo, MulticastSupport};
use crate::error::{Error, Result};
use crate::ipc::IpcHandle;
use crate::kernel::{KernelArgs, KernelId, LaunchConfig};
use crate::memory::{BufferSlice, DeviceBuffer, MemoryKind};
use crate::module::{KernelDef, KernelModule};
use crate::multicast::MulticastGroup;
use crate::{Device, TypedKernel};

#[derive(Clone, Copy)]
#[repr(C)]
struct Args {
    value: u64,
}
// SAFETY: one `u64`, no padding, valid for every bit pattern.
unsafe impl KernelArgs for Args {}

static MODULE: KernelModule = KernelModule {
    name: "api_tests",
    source: "",
    headers: &[],
    kernels: &[KernelDef {
        id: KernelId("count"),
        param_size: 8,
        host: None,
    }],
};

fn unsupported<T>() -> Result<T> {
    Err(Error::invalid("not part of this test backend"))
}

/// One minimal backend: its streams count the launches, records and graph replays they get.
macro_rules! counting_backend {
    ($api:ident, $name:literal, $dev:ident, $stream:ident, $event:ident, $kernel:ident, $graph:ident) => {
        #[derive(Debug)]
        struct $api;
        impl Api for $api {
            const NAME: &'static str = $name;
            type Device = $dev;
            type Stream = $stream;
            type Event = $event;
            type Kernel = $kernel;
            type Graph = $graph;
        }
        #[derive(Debug)]
        struct $dev(DeviceInfo);
        #[derive(Debug, Default)]
        struct $stream {
            launched: AtomicUsize,
            recorded: AtomicUsize,
            replayed: AtomicUsize,
        }
        #[derive(Debug)]
        struct $event;
        #[derive(Debug)]
        struct $kernel(KernelId);
        #[derive(Debug)]
        struct $graph;

        impl DeviceApi for $dev {
            type A = $api;
            fn info(&self) -> &DeviceInfo {
                &self.0
            }
            fn alloc(&self, _: usize, _: MemoryKind) -> Result<DeviceBuffer> {
                unsupported()
            }
            fn create_stream(&self) -> Result<Arc<$stream>> {
                Ok(Arc::new($stream::default()))
            }
            fn create_event(&self) -> Result<Arc<$event>> {
                Ok(Arc::new($event))
            }
            fn ipc_export(&self, _: &DeviceBuffer) -> Result<IpcHandle> {
                unsupported()
            }
            fn ipc_import(&self, _: &IpcHandle) -> Result<DeviceBuffer> {
                unsupported()
            }
            fn multicast_create(&self, _: usize, _: usize) -> Result<Arc<dyn MulticastGroup>> {
                unsupported()
            }
            fn multicast_import(&self, _: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
                unsupported()
            }
            fn load(&self, m: &'static KernelModule, id: KernelId) -> Result<Arc<$kernel>> {
                m.require(id)?;
                Ok(Arc::new($kernel(id)))
            }
        }
        impl StreamApi for $stream {
            type A = $api;
            fn copy(&self, _: &BufferSlice, _: &BufferSlice) -> Result<()> {
                unsupported()
            }
            fn fill(&self, _: &BufferSlice, _: u8) -> Result<()> {
                unsupported()
            }
            fn write_value64(&self, _: &BufferSlice, _: u64) -> Result<()> {
                unsupported()
            }
            fn write_from_host(&self, _: &BufferSlice, _: &[u8]) -> Result<()> {
                unsupported()
            }
            fn read_to_host(&self, _: &mut [u8], _: &BufferSlice) -> Result<()> {
                unsupported()
            }
            unsafe fn launch_raw(&self, _: &$kernel, _: LaunchConfig, args: &[u8]) -> Result<()> {
                Args::from_bytes(args)?;
                self.launched.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            fn record(&self, _: &$event) -> Result<()> {
                self.recorded.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            fn wait_event(&self, _: &$event) -> Result<()> {
                Ok(())
            }
            fn synchronize_timeout(&self, _: Duration) -> Result<()> {
                Ok(())
            }
            fn end_capture(&self) -> Result<Box<$graph>> {
                Ok(Box::new($graph))
            }
        }
        impl EventApi for $event {
            type A = $api;
            fn query(&self) -> Result<bool> {
                Ok(true)
            }
            fn synchronize_timeout(&self, _: Duration) -> Result<()> {
                Ok(())
            }
            fn elapsed_ms_since(&self, _: &$event) -> Result<f64> {
                Ok(1.5)
            }
        }
        impl KernelApi for $kernel {
            type A = $api;
            fn id(&self) -> KernelId {
                self.0
            }
        }
        impl GraphApi for $graph {
            type A = $api;
            fn launch(&self, s: &$stream) -> Result<()> {
                s.replayed.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
        }
    };
}

counting_backend!(
    Red, "red", RedDevice, RedStream, RedEvent, RedKernel, RedGraph
);
counting_backend!(
    Blue, "blue", BlueDevice, BlueStream, BlueEvent, BlueKernel, BlueGraph
);

fn info() -> DeviceInfo {
    DeviceInfo {
        backend: BackendKind::Host,
        ordinal: 0,
        name: "test".into(),
        arch: "test".into(),
        total_memory: 0,
        warp_size: 1,
        multiprocessors: 1,
        max_threads_per_block: 1024,
        pci_bus_id: None,
        caps: Capabilities {
            ipc: false,
            host_mapped_memory: false,
            device_memory_host_accessible: false,
            kernels: true,
            multicast: MulticastSupport::Unsupported("a test backend".into()),
            ll128: false,
        },
    }
}

fn devices() -> (Arc<dyn Device>, Arc<dyn Device>) {
    (Arc::new(RedDevice(info())), Arc::new(BlueDevice(info())))
}

fn message(r: Result<impl std::fmt::Debug>) -> String {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_backend_gets_its_own_objects_through_the_trait_objects() {
    let (red, _) = devices();
    let stream = red.create_stream().unwrap();
    let kernel = red.load(&MODULE, KernelId("count")).unwrap();
    let event = red.create_event().unwrap();
    // SAFETY: the test backend dereferences nothing.
    unsafe { stream.launch(&*kernel, LaunchConfig::linear(1, 1), &Args { value: 7 }) }.unwrap();
    stream.record(&*event).unwrap();
    stream.wait_event(&*event).unwrap();
    assert_eq!(event.elapsed_ms_since(&*event).unwrap(), 1.5);
    let graph = stream.end_capture().unwrap();
    graph.launch(&*stream).unwrap();
    let s = stream.as_any().downcast_ref::<RedStream>().unwrap();
    let seen = |c: &AtomicUsize| c.load(Ordering::Relaxed);
    assert_eq!(
        (seen(&s.launched), seen(&s.recorded), seen(&s.replayed)),
        (1, 1, 1)
    );
}

#[test]
fn another_backends_objects_are_refused_naming_the_receiver() {
    let (red, blue) = devices();
    let red_stream = red.create_stream().unwrap();
    let blue_stream = blue.create_stream().unwrap();
    let blue_kernel = blue.load(&MODULE, KernelId("count")).unwrap();
    let blue_event = blue.create_event().unwrap();
    let red_event = red.create_event().unwrap();
    let cfg = LaunchConfig::linear(1, 1);
    // SAFETY: the test backend dereferences nothing.
    let launch = unsafe { red_stream.launch(&*blue_kernel, cfg, &Args { value: 1 }) };
    let m = message(launch);
    assert!(
        m.contains("kernel count was not loaded by the red backend"),
        "{m}"
    );
    let m = message(red_stream.record(&*blue_event));
    assert!(m.contains("not created by the red backend"), "{m}");
    let m = message(red_stream.wait_event(&*blue_event));
    assert!(m.contains("not created by the red backend"), "{m}");
    let m = message(red_event.elapsed_ms_since(&*blue_event));
    assert!(m.contains("not created by the red backend"), "{m}");
    let red_graph = red_stream.end_capture().unwrap();
    let m = message(red_graph.launch(&*blue_stream));
    assert!(
        m.contains("a red graph launched on a stream of another backend"),
        "{m}"
    );
    let s = red_stream.as_any().downcast_ref::<RedStream>().unwrap();
    assert_eq!(s.launched.load(Ordering::Relaxed), 0);
    assert_eq!(s.recorded.load(Ordering::Relaxed), 0);
}

#[test]
fn typed_code_starts_from_the_registry_device_once() {
    let (red, blue) = devices();
    let typed = typed_device::<Red>(&red).unwrap();
    let as_dyn: Arc<dyn Device> = typed.clone();
    assert!(Arc::ptr_eq(&as_dyn, &red), "the same device, not a copy");
    let m = message(typed_device::<Red>(&blue));
    assert!(m.contains("not a device of the red backend"), "{m}");

    // Over the typed Api: the kernel reaches the stream with no trait object in between.
    let stream = DeviceApi::create_stream(&*typed).unwrap();
    let k = TypedKernel::<Args, Red>::load(&typed, &MODULE, KernelId("count")).unwrap();
    // SAFETY: the test backend dereferences nothing.
    unsafe { k.launch(&stream, LaunchConfig::linear(1, 1), &Args { value: 2 }) }.unwrap();
    assert_eq!(stream.launched.load(Ordering::Relaxed), 1);

    // From the run-time stream: turned into the backend's own stream once, then launched on it;
    // another backend's stream is refused with the receiver named.
    let dyn_stream = red.create_stream().unwrap();
    let own = Red::stream_of(&*dyn_stream).unwrap();
    // SAFETY: as above.
    unsafe { k.launch(own, LaunchConfig::linear(1, 1), &Args { value: 3 }) }.unwrap();
    let s = dyn_stream.as_any().downcast_ref::<RedStream>().unwrap();
    assert_eq!(s.launched.load(Ordering::Relaxed), 1);
    let blue_stream = blue.create_stream().unwrap();
    let m = message(Red::stream_of(&*blue_stream).map(drop));
    assert!(m.contains("red backend"), "{m}");
    assert!(format!("{k:?}").contains("red"), "{k:?}");
}
