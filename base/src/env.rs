//! Configuration by environment: every `MSCCLPP_*` variable mscclpp-rs reads is parsed here.
//!
//! Names follow MSCCL++ where it has one. A malformed value is an error naming the variable and
//! what was expected, never a silent default. Launcher variables (torchrun's `RANK`, Open MPI's
//! `OMPI_COMM_WORLD_*`, Slurm's `SLURM_PROCID`, ...) are read by the bootstrap through
//! [`parse`], since they describe the launch rather than the library.

use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use crate::error::{Error, Result};

/// Every `MSCCLPP_*` variable this build understands, with a one-line meaning (for `--help`
/// texts and the README).
pub const KNOWN_VARS: &[(&str, &str)] = &[
    ("MSCCLPP_BACKEND", "force one backend: host, cuda or rocm"),
    (
        "MSCCLPP_LOG_LEVEL",
        "trace, debug, info, warn or error (binaries and the C library)",
    ),
    (
        "MSCCLPP_DEBUG",
        "NCCL-style alias of MSCCLPP_LOG_LEVEL (INFO, WARN, TRACE, ...)",
    ),
    (
        "MSCCLPP_MASTER_ADDR",
        "bootstrap root address (overrides MASTER_ADDR)",
    ),
    (
        "MSCCLPP_MASTER_PORT",
        "bootstrap root port (overrides MASTER_PORT)",
    ),
    (
        "MSCCLPP_SOCKET_IFNAME",
        "network interface the bootstrap listens on",
    ),
    (
        "MSCCLPP_HOSTID",
        "overrides the host identity (ranks with equal ids share memory)",
    ),
    (
        "MSCCLPP_BOOTSTRAP_TIMEOUT",
        "seconds every bootstrap wait may take (default 60, at least 0.001)",
    ),
    (
        "MSCCLPP_STATUS",
        "1 or HOST:PORT: rank 0 serves every rank's last call to `mscclpp-perf status`",
    ),
    (
        "MSCCLPP_COMPLETION",
        "1: surveys say each rank's last call finished (default: on with MSCCLPP_STATUS)",
    ),
    (
        "MSCCLPP_WATCHDOG_SECONDS",
        "a call whose stream finishes nothing for this long is an error naming the ranks behind",
    ),
    (
        "MSCCLPP_STATUS_FILE",
        "where rank 0 appends the `mscclpp-perf status ADDR TOKEN` line",
    ),
    (
        "MSCCLPP_HOST_WAIT",
        "seconds a device-side wait of the host backend spins at most (default 60)",
    ),
    (
        "MSCCLPP_BOOTSTRAP_SECRET",
        "shared secret for ip:port bootstrap (UniqueIds carry their own)",
    ),
    (
        "MSCCLPP_CACHE_DIR",
        "kernel cache directory (default ~/.cache/mscclpp)",
    ),
    (
        "MSCCLPP_HCA_DEVICES",
        "comma list of IB devices, one per GPU",
    ),
    (
        "MSCCLPP_NCCL_LIB_PATH",
        "the real NCCL, for the C library's fallback and the baseline",
    ),
    (
        "MSCCLPP_FORCE_NCCL_FALLBACK_OPERATION",
        "all, or a comma list of operations sent to NCCL",
    ),
    (
        "MSCCLPP_FORCE_DISABLE_NVLS",
        "1 disables NVLink multicast (also NCCL_NVLS_ENABLE=0)",
    ),
];

/// The value of a variable, if it is set and not empty.
pub fn get(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Some(v.trim().to_owned()),
        _ => None,
    }
}

/// Parses a variable with `FromStr`; unset is `Ok(None)`, unparsable is an error naming it.
pub fn parse<T: FromStr>(name: &str, expected: &str) -> Result<Option<T>> {
    match get(name) {
        None => Ok(None),
        Some(v) => v.parse::<T>().map(Some).map_err(|_| {
            Error::invalid(format!(
                "environment variable {name}={v:?} is malformed: expected {expected}"
            ))
        }),
    }
}

/// Parses a boolean flag: `1/true/yes/on` or `0/false/no/off`; unset is `Ok(None)`.
pub fn flag(name: &str) -> Result<Option<bool>> {
    match get(name) {
        None => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(Error::invalid(format!(
                "environment variable {name}={v:?} is malformed: expected 1/0, true/false, yes/no or on/off"
            ))),
        },
    }
}

/// Parses a duration given in (possibly fractional) seconds.
pub fn seconds(name: &str) -> Result<Option<Duration>> {
    match parse::<f64>(name, "a number of seconds")? {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => Err(Error::invalid(format!(
            "environment variable {name}={s} is out of range: expected a positive number of seconds"
        ))),
    }
}

/// Whether NVLink multicast is disabled by the environment.
///
/// Honours MSCCL++'s `MSCCLPP_FORCE_DISABLE_NVLS`, the older `MSCCLPP_DISABLE_NVLS`, and NCCL's
/// `NCCL_NVLS_ENABLE=0`: the shared GPU machines set these, and creating a multicast object there
/// can take the host's GPUs out of service.
pub fn multicast_disabled() -> Result<bool> {
    let forced = flag("MSCCLPP_FORCE_DISABLE_NVLS")?.unwrap_or(false)
        || flag("MSCCLPP_DISABLE_NVLS")?.unwrap_or(false);
    let nccl_off = flag("NCCL_NVLS_ENABLE")? == Some(false);
    Ok(forced || nccl_off)
}

/// Checks, before a real NCCL is loaded into this process (the C library's fallback, the
/// benchmark's baseline), that it cannot create NVLink multicast objects where this process has
/// them disabled. NCCL reads only `NCCL_NVLS_ENABLE`, so when `MSCCLPP_FORCE_DISABLE_NVLS` or
/// `MSCCLPP_DISABLE_NVLS` disables multicast (or a variable is malformed), `NCCL_NVLS_ENABLE`
/// must be 0 too; the error says so, naming `what` is about to load NCCL.
pub fn check_nccl_nvls(what: &str) -> Result<()> {
    nccl_nvls_verdict(what, multicast_disabled(), flag("NCCL_NVLS_ENABLE"))
}

fn nccl_nvls_verdict(
    what: &str,
    disabled: Result<bool>,
    nccl_nvls_enable: Result<Option<bool>>,
) -> Result<()> {
    match nccl_nvls_enable {
        Err(e) => Err(Error::invalid(format!(
            "{what}: NCCL would load with an unreadable NVLS setting: {e}"
        ))),
        Ok(Some(false)) => Ok(()),
        Ok(_) => match disabled {
            Ok(false) => Ok(()),
            Ok(true) => Err(Error::invalid(format!(
                "{what}: NVLink multicast is disabled here (MSCCLPP_FORCE_DISABLE_NVLS or \
                 MSCCLPP_DISABLE_NVLS) but NCCL_NVLS_ENABLE is not 0, so the real NCCL could create \
                 multicast objects: set NCCL_NVLS_ENABLE=0"
            ))),
            Err(e) => Err(Error::invalid(format!(
                "{what}: NVLink multicast counts as disabled ({e}) but NCCL_NVLS_ENABLE is not 0, \
                 so the real NCCL could create multicast objects: set NCCL_NVLS_ENABLE=0"
            ))),
        },
    }
}

/// The kernel cache directory: `MSCCLPP_CACHE_DIR`, else `~/.cache/mscclpp`, else a temp dir.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = get("MSCCLPP_CACHE_DIR") {
        return PathBuf::from(d);
    }
    match get("HOME") {
        Some(h) => PathBuf::from(h).join(".cache").join("mscclpp"),
        None => std::env::temp_dir().join("mscclpp-cache"),
    }
}

/// Maps `MSCCLPP_LOG_LEVEL` (or `MSCCLPP_DEBUG`, NCCL-style) onto a `tracing` filter directive.
/// Returns `Ok(None)` when neither is set.
pub fn log_filter() -> Result<Option<String>> {
    let (name, v) = match (get("MSCCLPP_LOG_LEVEL"), get("MSCCLPP_DEBUG")) {
        (Some(v), _) => ("MSCCLPP_LOG_LEVEL", v),
        (None, Some(v)) => ("MSCCLPP_DEBUG", v),
        (None, None) => return Ok(None),
    };
    let level = match v.to_ascii_lowercase().as_str() {
        "trace" => "trace",
        "debug" => "debug",
        "info" => "info",
        "warn" | "warning" => "warn",
        "error" => "error",
        "version" | "none" | "off" => "off",
        _ => {
            return Err(Error::invalid(format!(
                "environment variable {name}={v:?} is malformed: expected trace, debug, info, warn, error or off"
            )));
        }
    };
    Ok(Some(level.to_owned()))
}

/// The identity of this host: `MSCCLPP_HOSTID` if set, else the kernel's boot id (which also
/// tells containers on one machine apart from another machine), else the host name.
///
/// Ranks with equal host ids are assumed to share memory (IPC handles work between them).
pub fn host_id() -> String {
    if let Some(id) = get("MSCCLPP_HOSTID") {
        return id;
    }
    if let Ok(b) = std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        let b = b.trim();
        if !b.is_empty() {
            return b.to_owned();
        }
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "unknown-host".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    // Each test uses its own variable names, so they can run in parallel.
    #[test]
    fn real_nccl_loads_only_with_its_nvls_off_where_ours_is_off() {
        let bad = || {
            Err(Error::invalid(
                "MSCCLPP_FORCE_DISABLE_NVLS=\"maybe\" is malformed",
            ))
        };
        assert!(nccl_nvls_verdict("x", Ok(false), Ok(None)).is_ok());
        assert!(nccl_nvls_verdict("x", Ok(true), Ok(Some(false))).is_ok());
        assert!(nccl_nvls_verdict("x", bad(), Ok(Some(false))).is_ok());
        for nccl in [None, Some(true)] {
            let e = nccl_nvls_verdict("NCCL baseline", Ok(true), Ok(nccl)).unwrap_err();
            let m = e.to_string();
            assert!(
                m.contains("NCCL baseline") && m.contains("NCCL_NVLS_ENABLE=0"),
                "{m}"
            );
            let e = nccl_nvls_verdict("x", bad(), Ok(nccl)).unwrap_err();
            assert!(e.to_string().contains("malformed"), "{e}");
        }
        let e = nccl_nvls_verdict(
            "x",
            Ok(false),
            Err(Error::invalid("NCCL_NVLS_ENABLE=\"?\"")),
        )
        .unwrap_err();
        assert!(e.to_string().contains("NCCL_NVLS_ENABLE"), "{e}");
    }

    #[test]
    fn malformed_values_name_the_variable() {
        // SAFETY: the variable is unique to this test; no other thread reads it.
        unsafe { std::env::set_var("MSCCLPP_TEST_ENV_FLAG_A", "maybe") };
        let e = flag("MSCCLPP_TEST_ENV_FLAG_A").unwrap_err().to_string();
        assert!(e.contains("MSCCLPP_TEST_ENV_FLAG_A"), "{e}");
        // SAFETY: as above.
        unsafe { std::env::set_var("MSCCLPP_TEST_ENV_SECS_A", "-3") };
        assert!(seconds("MSCCLPP_TEST_ENV_SECS_A").is_err());
        // SAFETY: as above.
        unsafe { std::env::set_var("MSCCLPP_TEST_ENV_SECS_B", "2.5") };
        assert_eq!(
            seconds("MSCCLPP_TEST_ENV_SECS_B").unwrap(),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            parse::<u16>("MSCCLPP_TEST_ENV_UNSET", "a port").unwrap(),
            None
        );
    }
}
