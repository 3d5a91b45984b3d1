//! Multicast (NVLink SHARP) on the CUDA backend: **not implemented in this build**, and guarded
//! so that it can never be reached where the environment disables it.
//!
//! The shared GPU test machines set `MSCCLPP_FORCE_DISABLE_NVLS=1` / `NCCL_NVLS_ENABLE=0`:
//! creating a multicast object there can take the host's GPUs out of service. This module never
//! calls any `cuMulticast*` function; [`support`] decides the capability from the environment
//! first (without touching the driver when it disables multicast), and [`create`] / [`import`]
//! re-check the environment at call time and return `Unavailable` before anything else.

use std::sync::Arc;

use mscclpp_hal::{Error, IpcHandle, MulticastGroup, MulticastSupport, Result};

/// Why multicast is off in this build even where hardware and environment allow it.
pub const NOT_IMPLEMENTED: &str = "not implemented in this build";

/// The multicast capability of a device.
///
/// `disabled` is [`mscclpp_hal::env::multicast_disabled`]; a malformed variable counts as
/// disabled (the safe side). `device_supports` queries
/// `CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED`; it is called only when the environment allows
/// multicast and the driver has the entry points.
pub fn support(
    disabled: Result<bool>,
    has_entry_points: bool,
    device_supports: impl FnOnce() -> Result<bool>,
) -> MulticastSupport {
    match disabled {
        Ok(true) => {
            return MulticastSupport::Unsupported(
                "NVLink multicast is disabled by the environment (MSCCLPP_FORCE_DISABLE_NVLS, \
                 MSCCLPP_DISABLE_NVLS or NCCL_NVLS_ENABLE=0)"
                    .into(),
            );
        }
        Err(e) => {
            return MulticastSupport::Unsupported(format!(
                "NVLink multicast treated as disabled: {e}"
            ));
        }
        Ok(false) => {}
    }
    if !has_entry_points {
        return MulticastSupport::Unsupported(
            "the CUDA driver lacks the cuMulticast* entry points (CUDA 12.1+ needed)".into(),
        );
    }
    match device_supports() {
        Ok(true) => MulticastSupport::Unsupported(format!(
            "the device supports NVLink multicast, but it is {NOT_IMPLEMENTED}"
        )),
        Ok(false) => MulticastSupport::Unsupported(
            "the device does not support NVLink multicast (CU_DEVICE_ATTRIBUTE_MULTICAST_SUPPORTED = 0)"
                .into(),
        ),
        Err(e) => MulticastSupport::Unsupported(format!(
            "NVLink multicast support could not be queried: {e}"
        )),
    }
}

/// The error every multicast entry point returns when multicast may not be used: checked
/// against the environment at call time (so a variable set after the device was opened still
/// counts), then against the device's capability.
pub fn refusal(caps: &MulticastSupport) -> Error {
    let reason = match mscclpp_hal::env::multicast_disabled() {
        Ok(true) => {
            "disabled by the environment (MSCCLPP_FORCE_DISABLE_NVLS, MSCCLPP_DISABLE_NVLS \
                     or NCCL_NVLS_ENABLE=0)"
                .to_owned()
        }
        Err(e) => format!("treated as disabled: {e}"),
        Ok(false) => match caps {
            MulticastSupport::Unsupported(r) => r.clone(),
            _ => NOT_IMPLEMENTED.to_owned(),
        },
    };
    Error::unavailable("cuda multicast", reason)
}

/// `Device::multicast_create`: always `Unavailable` in this build, before any driver call.
pub fn create(
    caps: &MulticastSupport,
    _bytes: usize,
    _members: usize,
) -> Result<Arc<dyn MulticastGroup>> {
    Err(refusal(caps))
}

/// `Device::multicast_import`: always `Unavailable` in this build, before any driver call.
pub fn import(caps: &MulticastSupport, _handle: &IpcHandle) -> Result<Arc<dyn MulticastGroup>> {
    Err(refusal(caps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mscclpp_hal::ErrorClass;

    #[test]
    fn disabled_environment_wins_without_querying_the_device() {
        let caps = support(Ok(true), true, || {
            panic!("device queried although disabled")
        });
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("disabled")));
        let caps = support(
            Err(Error::invalid(
                "MSCCLPP_FORCE_DISABLE_NVLS=\"maybe\" is malformed",
            )),
            true,
            || panic!("device queried although the variable is malformed"),
        );
        assert!(!caps.is_supported());
        let caps = support(Ok(false), false, || panic!("queried without entry points"));
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("entry points")));
        let caps = support(Ok(false), true, || Ok(false));
        assert!(
            matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("does not support"))
        );
        let caps = support(Ok(false), true, || Ok(true));
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains(NOT_IMPLEMENTED)));
    }

    #[test]
    fn force_disable_nvls_makes_caps_unsupported_and_create_unavailable() {
        // SAFETY: this is the only test of this crate that touches these variables.
        unsafe { std::env::set_var("MSCCLPP_FORCE_DISABLE_NVLS", "1") };
        let caps = support(mscclpp_hal::env::multicast_disabled(), true, || {
            panic!("device queried although MSCCLPP_FORCE_DISABLE_NVLS=1")
        });
        assert!(!caps.is_supported(), "{caps:?}");
        // Even with a capability that claims hardware support, the environment refuses first.
        let hw = MulticastSupport::Hardware {
            granularity: 2 << 20,
        };
        let e = create(&hw, 2 << 20, 2).unwrap_err();
        assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
        assert!(e.to_string().contains("MSCCLPP_FORCE_DISABLE_NVLS"), "{e}");
        let h = IpcHandle {
            backend: mscclpp_hal::BackendKind::Cuda,
            kind: mscclpp_hal::IpcHandleKind::Multicast,
            len: 2 << 20,
            payload: vec![],
        };
        assert_eq!(
            import(&hw, &h).unwrap_err().class(),
            ErrorClass::Unavailable
        );
        // SAFETY: as above.
        unsafe { std::env::remove_var("MSCCLPP_FORCE_DISABLE_NVLS") };
    }
}
