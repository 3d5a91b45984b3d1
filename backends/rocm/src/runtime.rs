//! Run-time loading of the HIP runtime (`libamdhip64.so`) and the calls the probe needs.
//!
//! The library is opened with `libloading`, never linked, so a binary built with the `rocm`
//! feature starts on machines without AMD software; every missing piece becomes an
//! [`Error::Unavailable`] naming the paths tried.

use mscclpp_hal::{Error, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &[
    "libamdhip64.so.6",
    "libamdhip64.so.5",
    "libamdhip64.so",
    "/opt/rocm/lib/libamdhip64.so",
];

type HipInit = unsafe extern "C" fn(flags: u32) -> i32;
type HipDriverGetVersion = unsafe extern "C" fn(version: *mut i32) -> i32;
type HipGetDeviceCount = unsafe extern "C" fn(count: *mut i32) -> i32;

/// What the probe found in a working driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `hipDriverGetVersion`, e.g. 50422804 for HIP 5.4.22804.
    pub version: i32,
    /// `hipGetDeviceCount`.
    pub devices: i32,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("rocm backend", reason)
}

fn open() -> Result<libloading::Library> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading the vendor runtime library runs its initialisers, which is what every
        // HIP program does; we pass a plain library name resolved by the dynamic loader.
        match unsafe { libloading::Library::new(*name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{name}: {}", mscclpp_hal::error::chain(&e))),
        }
    }
    Err(unavailable(format!(
        "the HIP runtime library (libamdhip64) could not be opened (tried {})",
        tried.join("; ")
    )))
}

fn check(call: &'static str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Driver {
            backend: "rocm",
            call,
            code: i64::from(code),
            message: match code {
                100 => "no ROCm-capable device is detected".into(),
                101 => {
                    "invalid device: the runtime found no usable GPU (is /dev/kfd present?)".into()
                }
                35 | 999 => "the driver could not be initialised".into(),
                3 => "the driver is not initialised".into(),
                _ => "see hipError_t documentation".into(),
            },
        })
    }
}

/// Opens the driver, initialises it and counts devices.
pub fn probe_driver() -> Result<DriverInfo> {
    let lib = open()?;
    // SAFETY: the symbol types match the HIP runtime API's C declarations
    // (`hipError_t hipInit(unsigned)`, `hipDriverGetVersion(int*)`, `hipGetDeviceCount(int*)`).
    let (init, get_version, get_count) = unsafe {
        let init = lib.get::<HipInit>(b"hipInit\0").map_err(|e| {
            unavailable(format!(
                "libamdhip64 lacks hipInit: {}",
                mscclpp_hal::error::chain(&e)
            ))
        })?;
        let ver = lib
            .get::<HipDriverGetVersion>(b"hipDriverGetVersion\0")
            .map_err(|e| {
                unavailable(format!(
                    "libamdhip64 lacks hipDriverGetVersion: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        let count = lib
            .get::<HipGetDeviceCount>(b"hipGetDeviceCount\0")
            .map_err(|e| {
                unavailable(format!(
                    "libamdhip64 lacks hipGetDeviceCount: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        (*init, *ver, *count)
    };
    let mut version = 0i32;
    // SAFETY: valid out-pointer to a local; the library stays loaded (`lib` lives to the end).
    check("hipDriverGetVersion", unsafe { get_version(&mut version) })?;
    // SAFETY: hipInit takes flags that must be 0.
    check("hipInit", unsafe { init(0) }).map_err(|e| {
        unavailable(format!(
            "HIP runtime {} present but {e}",
            format_version(version)
        ))
    })?;
    let mut devices = 0i32;
    // SAFETY: valid out-pointer to a local.
    check("hipGetDeviceCount", unsafe { get_count(&mut devices) })?;
    drop(lib);
    Ok(DriverInfo { version, devices })
}

/// `50422804` → `"5.4.22804"` (HIP encodes major * 10^7 + minor * 10^5 + patch).
pub fn format_version(v: i32) -> String {
    format!("{}.{}.{}", v / 10_000_000, (v / 100_000) % 100, v % 100_000)
}
