//! Same-process aliasing of exported allocations, shared by the GPU backends.
//!
//! A GPU runtime refuses (CUDA) or leaves undefined (HIP) opening an IPC handle in the process
//! that exported it, yet the HAL allows an import anywhere on the host. An [`IpcRegistry`] maps
//! every allocation a backend exported (by a process-unique allocation id carried in the handle)
//! to a weak reference; an import in the exporting process gets a buffer that *aliases* the
//! original (and keeps it alive), and a handle of memory freed since fails cleanly. A second map
//! reuses live mappings when another process's handle is imported twice into one device.
//!
//! Each backend keeps its own registry (a `static`): allocation ids are unique per backend only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use crate::error::{Error, Result};
use crate::ipc_payload::{IpcFormat, MemoryIpcPayload};
use crate::memory::{Allocation, DeviceBuffer};

/// Live mappings of other processes' memory: (host, exporter pid, allocation id, importing
/// device).
type ImportKey = (String, u32, u64, usize);
type Map<K> = Mutex<HashMap<K, Weak<dyn Allocation>>>;

/// A backend's exported allocations and imported mappings.
#[derive(Debug, Default)]
pub struct IpcRegistry {
    exported: OnceLock<Map<u64>>,
    imported: OnceLock<Map<ImportKey>>,
}

fn lock<K>(m: &OnceLock<Map<K>>) -> MutexGuard<'_, HashMap<K, Weak<dyn Allocation>>> {
    m.get_or_init(|| Mutex::new(HashMap::new()))
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

impl IpcRegistry {
    /// An empty registry (for a `static`).
    pub const fn new() -> Self {
        IpcRegistry {
            exported: OnceLock::new(),
            imported: OnceLock::new(),
        }
    }

    /// Records that `allocation` was exported under `alloc_id` (dropping entries of freed ones).
    pub fn record_export(&self, alloc_id: u64, allocation: &Arc<dyn Allocation>) {
        let mut reg = lock(&self.exported);
        reg.retain(|_, w| w.strong_count() > 0);
        reg.insert(alloc_id, Arc::downgrade(allocation));
    }

    /// Maps the memory of payload `p` (already checked by [`MemoryIpcPayload::from_handle`])
    /// into the device `device`: in the exporting process, an alias of the original
    /// (`alias`); a mapping of this device already open, another alias of it; else a new
    /// mapping from `open` (the vendor call), remembered for later imports.
    pub fn import<F: IpcFormat>(
        &self,
        p: &MemoryIpcPayload<F>,
        device: usize,
        alias: impl FnOnce(Arc<dyn Allocation>) -> DeviceBuffer,
        open: impl FnOnce() -> Result<Arc<dyn Allocation>>,
    ) -> Result<DeviceBuffer> {
        if p.pid == std::process::id() {
            let original = lock(&self.exported)
                .get(&p.alloc_id)
                .and_then(Weak::upgrade);
            return match original {
                Some(o) if o.len() as u64 == p.len => Ok(alias(o)),
                Some(o) => Err(Error::malformed(
                    F::FORMAT.what,
                    format!(
                        "handle claims {} bytes but the exported allocation has {}",
                        p.len,
                        o.len()
                    ),
                )),
                None => Err(Error::invalid(format!(
                    "stale IPC handle: allocation {} of this process (device {}) was freed or never exported",
                    p.alloc_id, p.device
                ))),
            };
        }
        let key = (p.host_id.clone(), p.pid, p.alloc_id, device);
        let mut reg = lock(&self.imported);
        reg.retain(|_, w| w.strong_count() > 0);
        if let Some(existing) = reg.get(&key).and_then(Weak::upgrade) {
            return Ok(alias(existing));
        }
        let a = open()?;
        reg.insert(key, Arc::downgrade(&a));
        Ok(DeviceBuffer::new(a))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::caps::BackendKind;
    use crate::ipc_payload::{FieldOrder, PayloadFormat};
    use crate::memory::{DevicePtr, MemoryKind};

    #[derive(Debug, Clone, PartialEq, Eq)]
    struct T;
    impl IpcFormat for T {
        type Handle = [u8; 4];
        const FORMAT: PayloadFormat = PayloadFormat {
            backend: BackendKind::Host,
            magic: *b"TEST",
            what: "test IPC handle",
            mechanism: "TEST IPC",
            export_call: "testExport",
            order: FieldOrder::AllocIdThenLen,
        };
    }
    const FMT: PayloadFormat = T::FORMAT;

    #[derive(Debug)]
    struct Fake {
        len: usize,
        kind: MemoryKind,
        imported: bool,
    }

    impl Allocation for Fake {
        fn backend(&self) -> BackendKind {
            BackendKind::Host
        }
        fn device_ordinal(&self) -> usize {
            0
        }
        fn device_ptr(&self) -> DevicePtr {
            DevicePtr(0x1000)
        }
        fn len(&self) -> usize {
            self.len
        }
        fn kind(&self) -> MemoryKind {
            self.kind
        }
        fn host_ptr(&self) -> Option<*mut u8> {
            None
        }
        fn is_imported(&self) -> bool {
            self.imported
        }
        fn as_any(&self) -> &dyn std::any::Any {
            self
        }
    }

    fn fake(len: usize) -> Arc<dyn Allocation> {
        Arc::new(Fake {
            len,
            kind: MemoryKind::Device,
            imported: false,
        })
    }

    #[test]
    fn same_process_imports_alias_the_original_until_it_is_freed() {
        let reg = IpcRegistry::new();
        let a = fake(64);
        FMT.check_exportable(a.as_ref(), 0).unwrap();
        reg.record_export(7, &a);
        let p = MemoryIpcPayload::<T>::this_process(0, 7, 64, [0u8; 4]);
        let never = || -> Result<Arc<dyn Allocation>> { panic!("opened in the exporting process") };
        let b = reg.import(&p, 0, DeviceBuffer::new, never).unwrap();
        assert!(Arc::ptr_eq(b.allocation(), &a));
        let mut wrong = p.clone();
        wrong.len = 32;
        let e = reg.import(&wrong, 0, DeviceBuffer::new, never);
        assert!(e.unwrap_err().to_string().contains("claims 32 bytes"));
        drop((a, b));
        let e = reg.import(&p, 0, DeviceBuffer::new, never);
        assert!(e.unwrap_err().to_string().contains("stale IPC handle"));
    }

    #[test]
    fn other_process_mappings_are_opened_once_per_device() {
        let reg = IpcRegistry::new();
        let mut p = MemoryIpcPayload::<T>::this_process(0, 7, 64, [0u8; 4]);
        p.pid = p.pid.wrapping_add(1).max(1);
        let first = reg.import(&p, 0, DeviceBuffer::new, || Ok(fake(64)));
        let first = first.unwrap();
        let again = reg.import(&p, 0, DeviceBuffer::new, || panic!("opened twice"));
        assert!(Arc::ptr_eq(again.unwrap().allocation(), first.allocation()));
        let other = reg.import(&p, 1, DeviceBuffer::new, || Ok(fake(64)));
        assert!(!Arc::ptr_eq(
            other.unwrap().allocation(),
            first.allocation()
        ));
    }

    #[test]
    fn only_own_device_memory_is_exportable() {
        let mapped = Fake {
            len: 8,
            kind: MemoryKind::HostMapped,
            imported: false,
        };
        let e = FMT.check_exportable(&mapped, 0).unwrap_err().to_string();
        assert!(
            e.contains("over TEST IPC: testExport only exports device memory"),
            "{e}"
        );
        let imported = Fake {
            len: 8,
            kind: MemoryKind::Device,
            imported: true,
        };
        assert!(FMT.check_exportable(&imported, 0).is_err());
        let e = FMT.check_exportable(fake(8).as_ref(), 1).unwrap_err();
        assert!(
            e.to_string()
                .contains("buffer of host device 0 exported through device 1")
        );
    }
}
