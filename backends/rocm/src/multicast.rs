//! Multicast on the ROCm backend: AMD GPUs have no multicast memory (nothing like NVLink
//! SHARP), so the capability is always `Unsupported` and creating or importing a group is
//! always `Unavailable`, before any runtime call. Collectives take their non-multicast paths.

use std::sync::Arc;

use mscclpp_hal::{Error, IpcHandle, MulticastGroup, MulticastSupport, Result};

/// Why there is no multicast on this backend.
pub const REASON: &str = "AMD GPUs have no multicast memory";

/// The multicast capability of every AMD device.
pub fn support() -> MulticastSupport {
    MulticastSupport::Unsupported(REASON.into())
}

/// `Device::multicast_create`: always `Unavailable`.
pub fn create(_bytes: usize, _members: usize) -> Result<Arc<dyn MulticastGroup>> {
    Err(Error::unavailable("rocm multicast", REASON))
}

/// `Device::multicast_import`: always `Unavailable`.
pub fn import(_handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
    Err(Error::unavailable("rocm multicast", REASON))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::ErrorClass;

    #[test]
    fn multicast_is_unsupported_and_unavailable() {
        assert_eq!(support(), MulticastSupport::Unsupported(REASON.into()));
        let e = create(2 << 20, 2).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
        assert!(e.to_string().contains(REASON), "{e}");
        let h = IpcHandle {
            backend: mscclpp_hal::BackendKind::Rocm,
            kind: mscclpp_hal::IpcHandleKind::Multicast,
            len: 2 << 20,
            payload: vec![],
        };
        assert_eq!(import(&h).unwrap_err().class(), ErrorClass::Unavailable);
    }
}
