//! The probe of the HIP runtime (open it, initialise it, count devices) and the device
//! properties it reports ([`DeviceInfo`]), read through the [`Api`] resolved at open
//! ([`crate::ffi`]). Every missing piece is an [`Error::Unavailable`] naming what was tried.

use std::ffi::{c_char, c_int};

use mscclpp_hal::{BackendKind, DeviceInfo, Error, Result};

use crate::ffi::{self, Api, attr, props};

fn unavailable(reason: String) -> Error {
    Error::unavailable("rocm backend", reason)
}

/// What the probe found in a working runtime.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `hipDriverGetVersion`, e.g. 50221153 for HIP 5.2.21153.
    pub version: i32,
    /// `hipRuntimeGetVersion`.
    pub runtime_version: i32,
    /// `hipGetDeviceCount`.
    pub devices: i32,
}

/// Opens the runtime, initialises it and counts devices.
pub fn probe_driver() -> Result<DriverInfo> {
    probe_with(ffi::api()?)
}

/// [`probe_driver`] over an already opened runtime.
pub fn probe_with(api: &Api) -> Result<DriverInfo> {
    let mut version = 0i32;
    // SAFETY: valid out-pointer to a local; callable before hipInit.
    api.check("hipDriverGetVersion", unsafe {
        (api.driver_get_version)(&mut version)
    })
    .map_err(|e| unavailable(format!("{} opened but {e}", api.library)))?;
    // SAFETY: hipInit takes flags that must be 0.
    api.check("hipInit", unsafe { (api.init)(0) })
        .map_err(|e| {
            unavailable(format!(
                "HIP runtime {} ({}) present but {e}",
                format_version(version),
                api.library
            ))
        })?;
    let mut runtime_version = 0i32;
    // SAFETY: valid out-pointer to a local.
    api.check("hipRuntimeGetVersion", unsafe {
        (api.runtime_get_version)(&mut runtime_version)
    })?;
    let mut devices = 0i32;
    // SAFETY: valid out-pointer to a local.
    let r = unsafe { (api.get_device_count)(&mut devices) };
    if r == ffi::code::NO_DEVICE {
        devices = 0;
    } else {
        api.check("hipGetDeviceCount", r)?;
    }
    Ok(DriverInfo {
        version,
        runtime_version,
        devices,
    })
}

/// `50221153` → `"5.2.21153"` (HIP encodes major * 10^7 + minor * 10^5 + patch).
pub fn format_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}

/// The major version of an encoded HIP version (`60032830` → 6).
pub fn major(v: i32) -> i32 {
    v / 10_000_000
}

fn attribute(api: &Api, ordinal: c_int, a: c_int, name: &'static str) -> Result<i32> {
    let mut v: c_int = 0;
    // SAFETY: valid out-pointer; the ordinal is below the device count.
    api.check("hipDeviceGetAttribute", unsafe {
        (api.device_get_attribute)(&mut v, a, ordinal)
    })
    .map_err(|e| e.with_context(|| format!("attribute {name}")))?;
    Ok(v)
}

fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

/// Whether `s` looks like an AMD target id: `gfx` + hex digits, optionally `:feature±` parts.
pub fn is_gfx_target(s: &str) -> bool {
    let base = s.split(':').next().unwrap_or("");
    base.len() > 3
        && base.starts_with("gfx")
        && base[3..].bytes().all(|b| b.is_ascii_hexdigit())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'+' | b'-' | b'_'))
}

/// The `gcnArchName` in a `hipDeviceProp_t` buffer: read at the layout's offset when that holds
/// a target id; otherwise found by scanning the buffer past the `name` field for a
/// NUL-delimited `gfx...` string (a guard against a layout that moved in a release we have not
/// seen). `None` when neither finds one.
pub fn arch_from_props(buf: &[u8], offset: usize) -> Option<String> {
    if let Some(field) = buf.get(offset..offset + props::GCN_ARCH_NAME_LEN) {
        let s = c_buf_to_string(field);
        if is_gfx_target(&s) {
            return Some(s);
        }
    }
    // Skip the 256-byte `name` at offset 0 (a marketing name may itself mention "gfx").
    let mut i = 256;
    while i + 4 <= buf.len() {
        if &buf[i..i + 3] == b"gfx" && buf[i - 1] == 0 {
            let end = buf[i..]
                .iter()
                .position(|&b| b == 0)
                .map_or(buf.len(), |p| i + p);
            let s = String::from_utf8_lossy(&buf[i..end]).into_owned();
            if is_gfx_target(&s) {
                return Some(s);
            }
        }
        i += 1;
    }
    None
}

/// The compile target for a device's `gcnArchName`: the processor without its feature suffix
/// (`gfx90a:sramecc+:xnack-` → `gfx90a`). A code object built for the bare processor has every
/// feature in "any" mode, which the loader accepts on each setting of that processor (LLVM's
/// AMDGPU target-id rules), so one cache entry serves all of them; the cost is code that must
/// also be correct with XNACK on.
pub fn compile_target(gcn_arch_name: &str) -> &str {
    gcn_arch_name.split(':').next().unwrap_or(gcn_arch_name)
}

/// `gcnArchName` of device `ordinal`, through the properties call whose layout we know.
fn gcn_arch_name(api: &Api, ordinal: c_int) -> Result<String> {
    // 8-byte aligned (the struct holds `size_t`s) and larger than either layout.
    let mut words = vec![0u64; props::BUFFER / 8];
    let (call, f, offset) = match api.get_device_properties_r0600 {
        Some(f) => ("hipGetDevicePropertiesR0600", f, props::R0600_GCN_ARCH_NAME),
        None => (
            "hipGetDeviceProperties",
            api.get_device_properties,
            props::R0000_GCN_ARCH_NAME,
        ),
    };
    // SAFETY: the buffer holds `props::BUFFER` bytes, more than `hipDeviceProp_tR0600` (1472)
    // and `hipDeviceProp_tR0000` (792), so the runtime cannot write past it whichever layout
    // it fills; the ordinal is below the device count.
    api.check(call, unsafe { f(words.as_mut_ptr().cast(), ordinal) })?;
    // SAFETY: viewing initialised `u64`s as bytes.
    let bytes = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), props::BUFFER) };
    arch_from_props(bytes, offset).ok_or_else(|| {
        Error::unavailable(
            "rocm device architecture",
            format!(
                "{call} returned no gfx target name for device {ordinal} (neither at offset \
                 {offset} nor anywhere in the structure)"
            ),
        )
    })
}

pub(crate) fn query_info(api: &Api, ordinal: usize) -> Result<DeviceInfo> {
    let dev = ordinal as c_int;
    let mut name = [0u8; 256];
    // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within it.
    api.check("hipDeviceGetName", unsafe {
        (api.device_get_name)(name.as_mut_ptr().cast::<c_char>(), name.len() as c_int, dev)
    })?;
    let mut total = 0usize;
    // SAFETY: valid out-pointer.
    api.check("hipDeviceTotalMem", unsafe {
        (api.device_total_mem)(&mut total, dev)
    })?;
    let mut bus = [0u8; 64];
    // SAFETY: the buffer holds `len` bytes; the runtime NUL-terminates within it.
    let pci_bus_id = match unsafe {
        (api.device_get_pci_bus_id)(bus.as_mut_ptr().cast::<c_char>(), bus.len() as c_int, dev)
    } {
        ffi::code::SUCCESS => Some(c_buf_to_string(&bus)).filter(|s| !s.is_empty()),
        _ => None,
    };
    let cus = attribute(api, dev, attr::MULTIPROCESSOR_COUNT, "multiprocessor count")?;
    let max_threads = attribute(
        api,
        dev,
        attr::MAX_THREADS_PER_BLOCK,
        "max threads per block",
    )?;
    let warp = attribute(api, dev, attr::WARP_SIZE, "warp size")?;
    let arch = gcn_arch_name(api, dev)?;
    Ok(DeviceInfo {
        backend: BackendKind::Rocm,
        ordinal,
        name: c_buf_to_string(&name),
        arch,
        total_memory: total as u64,
        warp_size: u32::try_from(warp).unwrap_or(64),
        multiprocessors: u32::try_from(cus).unwrap_or(0),
        max_threads_per_block: u32::try_from(max_threads).unwrap_or(0),
        pci_bus_id,
        // LL128 is not established for AMD fabrics: its lines are never used there.
        caps: mscclpp_gpu::device::capabilities(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gfx_targets_are_recognised_and_stripped() {
        for ok in [
            "gfx90a",
            "gfx942",
            "gfx908",
            "gfx90a:sramecc+:xnack-",
            "gfx1100",
        ] {
            assert!(is_gfx_target(ok), "{ok}");
        }
        for bad in ["", "gfx", "AMD Instinct", "gfx90a extra", "gfxzz", "sm_90"] {
            assert!(!is_gfx_target(bad), "{bad}");
        }
        assert_eq!(compile_target("gfx90a:sramecc+:xnack-"), "gfx90a");
        assert_eq!(compile_target("gfx942"), "gfx942");
    }

    fn props_with(offset: usize, name: &[u8], arch: &[u8]) -> Vec<u8> {
        let mut b = vec![0u8; props::BUFFER];
        b[..name.len()].copy_from_slice(name);
        b[offset..offset + arch.len()].copy_from_slice(arch);
        b
    }

    #[test]
    fn arch_is_read_at_the_layout_offset_or_found_by_scanning() {
        let b = props_with(
            props::R0000_GCN_ARCH_NAME,
            b"AMD Instinct MI250X",
            b"gfx90a:sramecc+:xnack-",
        );
        assert_eq!(
            arch_from_props(&b, props::R0000_GCN_ARCH_NAME).as_deref(),
            Some("gfx90a:sramecc+:xnack-")
        );
        // The R0600 layout read as R0000: found by the scan.
        let b = props_with(
            props::R0600_GCN_ARCH_NAME,
            b"AMD Instinct MI300X",
            b"gfx942:sramecc+:xnack-",
        );
        assert_eq!(
            arch_from_props(&b, props::R0000_GCN_ARCH_NAME).as_deref(),
            Some("gfx942:sramecc+:xnack-")
        );
        // A name mentioning gfx is not taken for the arch.
        let b = props_with(props::R0000_GCN_ARCH_NAME, b"gfx90a board", b"");
        assert_eq!(arch_from_props(&b, props::R0000_GCN_ARCH_NAME), None);
        // Garbage everywhere: none, and no panic at the buffer's end.
        let mut b = vec![0xffu8; props::BUFFER];
        let n = b.len();
        b[n - 4..].copy_from_slice(b"\0gfx");
        assert_eq!(arch_from_props(&b, props::R0000_GCN_ARCH_NAME), None);
        assert_eq!(arch_from_props(&b[..10], props::R0600_GCN_ARCH_NAME), None);
    }

    #[test]
    fn versions_format() {
        assert_eq!(format_version(50221153), "5.2.21153");
        assert_eq!(format_version(60032830), "6.0.32830");
        assert_eq!(major(60032830), 6);
        assert_eq!(major(50221153), 5);
    }
}
