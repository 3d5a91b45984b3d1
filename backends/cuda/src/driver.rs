//! Run-time loading of the CUDA driver (`libcuda.so.1`) and the calls the probe needs.
//!
//! The library is opened with `libloading`, never linked, so a binary built with the `cuda`
//! feature starts on machines without NVIDIA software; every missing piece becomes an
//! [`Error::Unavailable`] naming the paths tried.

use mscclpp_hal::{Error, Result};

/// Library names tried, in order.
pub const LIBRARY_NAMES: &[&str] = &["libcuda.so.1", "libcuda.so"];

type CuInit = unsafe extern "C" fn(flags: u32) -> i32;
type CuDriverGetVersion = unsafe extern "C" fn(version: *mut i32) -> i32;
type CuDeviceGetCount = unsafe extern "C" fn(count: *mut i32) -> i32;

/// What the probe found in a working driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0.
    pub version: i32,
    /// `cuDeviceGetCount`.
    pub devices: i32,
}

fn unavailable(reason: String) -> Error {
    Error::unavailable("cuda backend", reason)
}

fn open() -> Result<libloading::Library> {
    let mut tried = Vec::new();
    for name in LIBRARY_NAMES {
        // SAFETY: loading the vendor's driver library runs its initialisers, which is what every
        // CUDA program does; we pass a plain library name resolved by the dynamic loader.
        match unsafe { libloading::Library::new(*name) } {
            Ok(lib) => return Ok(lib),
            Err(e) => tried.push(format!("{name}: {}", mscclpp_hal::error::chain(&e))),
        }
    }
    Err(unavailable(format!(
        "the CUDA driver library could not be opened (tried {})",
        tried.join("; ")
    )))
}

fn check(call: &'static str, code: i32) -> Result<()> {
    if code == 0 {
        Ok(())
    } else {
        Err(Error::Driver {
            backend: "cuda",
            call,
            code: i64::from(code),
            message: match code {
                100 => "no CUDA-capable device is detected".into(),
                35 | 999 => "the driver could not be initialised".into(),
                3 => "the driver is not initialised".into(),
                _ => "see cudaError/CUresult documentation".into(),
            },
        })
    }
}

/// Opens the driver, initialises it and counts devices.
pub fn probe_driver() -> Result<DriverInfo> {
    let lib = open()?;
    // SAFETY: the symbol types match the CUDA driver API's C declarations
    // (`CUresult cuInit(unsigned)`, `cuDriverGetVersion(int*)`, `cuDeviceGetCount(int*)`).
    let (init, get_version, get_count) = unsafe {
        let init = lib.get::<CuInit>(b"cuInit\0").map_err(|e| {
            unavailable(format!(
                "libcuda lacks cuInit: {}",
                mscclpp_hal::error::chain(&e)
            ))
        })?;
        let ver = lib
            .get::<CuDriverGetVersion>(b"cuDriverGetVersion\0")
            .map_err(|e| {
                unavailable(format!(
                    "libcuda lacks cuDriverGetVersion: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        let count = lib
            .get::<CuDeviceGetCount>(b"cuDeviceGetCount\0")
            .map_err(|e| {
                unavailable(format!(
                    "libcuda lacks cuDeviceGetCount: {}",
                    mscclpp_hal::error::chain(&e)
                ))
            })?;
        (*init, *ver, *count)
    };
    let mut version = 0i32;
    // SAFETY: valid out-pointer to a local; the library stays loaded (`lib` lives to the end).
    check("cuDriverGetVersion", unsafe { get_version(&mut version) })?;
    // SAFETY: cuInit takes flags that must be 0.
    check("cuInit", unsafe { init(0) }).map_err(|e| {
        unavailable(format!(
            "CUDA driver {} present but {e}",
            format_version(version)
        ))
    })?;
    let mut devices = 0i32;
    // SAFETY: valid out-pointer to a local.
    check("cuDeviceGetCount", unsafe { get_count(&mut devices) })?;
    drop(lib);
    Ok(DriverInfo { version, devices })
}

/// `13000` → `"13.0"`.
pub fn format_version(v: i32) -> String {
    format!("{}.{}", v / 1000, (v % 1000) / 10)
}
