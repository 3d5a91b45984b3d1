//! Multicast memory: **not implemented in this build**, and guarded so that it can never be
//! reached where the environment disables it or the vendor has none (AMD GPUs have no multicast
//! memory, nothing like NVLink SHARP).
//!
//! The shared GPU test machines set `MSCCLPP_FORCE_DISABLE_NVLS=1` / `NCCL_NVLS_ENABLE=0`:
//! creating a multicast object there can take the host's GPUs out of service. Nothing here calls
//! a multicast entry point; [`support`] decides the capability from the vendor and the
//! environment first (without touching the runtime when either rules it out), and [`create`] /
//! [`import`] re-check at call time and return `Unavailable` before anything else.

use std::sync::Arc;

use mscclpp_hal::{Error, IpcHandle, MulticastGroup, MulticastSupport, Result};

use crate::runtime::{Runtime, Vendor};

/// Why multicast is off in this build even where hardware and environment allow it.
pub const NOT_IMPLEMENTED: &str = "not implemented in this build";

const DISABLED: &str = "disabled by the environment (MSCCLPP_FORCE_DISABLE_NVLS, MSCCLPP_DISABLE_NVLS or NCCL_NVLS_ENABLE=0)";

/// The multicast capability of a device of `vendor`.
///
/// `disabled` is [`mscclpp_hal::env::multicast_disabled`]; a malformed variable counts as
/// disabled (the safe side). `device_supports` asks the device; it is called only when the
/// vendor has multicast, the environment allows it and the runtime has the entry points.
pub fn support(
    vendor: &Vendor,
    disabled: Result<bool>,
    has_entry_points: bool,
    device_supports: impl FnOnce() -> Result<bool>,
) -> MulticastSupport {
    if let Some(reason) = vendor.no_multicast {
        return MulticastSupport::Unsupported(reason.into());
    }
    match disabled {
        Ok(true) => {
            return MulticastSupport::Unsupported(format!("NVLink multicast is {DISABLED}"));
        }
        Err(e) => {
            return MulticastSupport::Unsupported(format!(
                "NVLink multicast treated as disabled: {e}"
            ));
        }
        Ok(false) => {}
    }
    if !has_entry_points {
        return MulticastSupport::Unsupported(format!(
            "the {} runtime lacks the multicast entry points",
            vendor.runtime
        ));
    }
    match device_supports() {
        Ok(true) => MulticastSupport::Unsupported(format!(
            "the device supports NVLink multicast, but it is {NOT_IMPLEMENTED}"
        )),
        Ok(false) => {
            MulticastSupport::Unsupported("the device does not support NVLink multicast".into())
        }
        Err(e) => MulticastSupport::Unsupported(format!(
            "NVLink multicast support could not be queried: {e}"
        )),
    }
}

/// The error every multicast entry point returns when multicast may not be used: the vendor
/// first, then the environment at call time (so a variable set after the device was opened
/// still counts), then the device's capability.
pub fn refusal(vendor: &Vendor, caps: &MulticastSupport) -> Error {
    let reason = match (vendor.no_multicast, mscclpp_hal::env::multicast_disabled()) {
        (Some(reason), _) => reason.to_owned(),
        (None, Ok(true)) => DISABLED.to_owned(),
        (None, Err(e)) => format!("treated as disabled: {e}"),
        (None, Ok(false)) => match caps {
            MulticastSupport::Unsupported(r) => r.clone(),
            _ => NOT_IMPLEMENTED.to_owned(),
        },
    };
    Error::unavailable(format!("{} multicast", vendor.name), reason)
}

/// `Device::multicast_create`: always `Unavailable` in this build, before any runtime call.
pub fn create<R: Runtime>(
    caps: &MulticastSupport,
    _bytes: usize,
    _members: usize,
) -> Result<Arc<dyn MulticastGroup>> {
    Err(refusal(&R::VENDOR, caps))
}

/// `Device::multicast_import`: always `Unavailable` in this build, before any runtime call.
pub fn import<R: Runtime>(
    caps: &MulticastSupport,
    _handle: &IpcHandle,
) -> Result<Arc<dyn MulticastGroup>> {
    Err(refusal(&R::VENDOR, caps))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::tests::TEST_VENDOR;
    use mscclpp_hal::ErrorClass;

    const V: Vendor = TEST_VENDOR;

    #[test]
    fn a_vendor_without_multicast_never_asks() {
        let none = Vendor {
            no_multicast: Some("AMD GPUs have no multicast memory"),
            ..V
        };
        let caps = support(&none, Ok(false), true, || panic!("device queried"));
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("AMD")));
        let e = refusal(&none, &caps);
        assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
        assert!(
            e.to_string().contains("AMD GPUs have no multicast memory"),
            "{e}"
        );
    }

    #[test]
    fn disabled_environment_wins_without_querying_the_device() {
        let caps = support(&V, Ok(true), true, || {
            panic!("device queried although disabled")
        });
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("disabled")));
        let caps = support(
            &V,
            Err(Error::invalid(
                "MSCCLPP_FORCE_DISABLE_NVLS=\"maybe\" is malformed",
            )),
            true,
            || panic!("device queried although the variable is malformed"),
        );
        assert!(!caps.is_supported());
        let caps = support(&V, Ok(false), false, || {
            panic!("queried without entry points")
        });
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("entry points")));
        let caps = support(&V, Ok(false), true, || Ok(false));
        assert!(
            matches!(&caps, MulticastSupport::Unsupported(r) if r.contains("does not support"))
        );
        let caps = support(&V, Ok(false), true, || Ok(true));
        assert!(matches!(&caps, MulticastSupport::Unsupported(r) if r.contains(NOT_IMPLEMENTED)));
    }

    #[test]
    fn force_disable_nvls_makes_caps_unsupported_and_create_unavailable() {
        // SAFETY: this is the only test of this crate that touches these variables.
        unsafe { std::env::set_var("MSCCLPP_FORCE_DISABLE_NVLS", "1") };
        let caps = support(&V, mscclpp_hal::env::multicast_disabled(), true, || {
            panic!("device queried although MSCCLPP_FORCE_DISABLE_NVLS=1")
        });
        assert!(!caps.is_supported(), "{caps:?}");
        // Even with a capability that claims hardware support, the environment refuses first.
        let hw = MulticastSupport::Hardware {
            granularity: 2 << 20,
        };
        let e = refusal(&V, &hw);
        assert_eq!(e.class(), ErrorClass::Unavailable, "{e}");
        assert!(e.to_string().contains("MSCCLPP_FORCE_DISABLE_NVLS"), "{e}");
        // SAFETY: as above.
        unsafe { std::env::remove_var("MSCCLPP_FORCE_DISABLE_NVLS") };
    }
}
