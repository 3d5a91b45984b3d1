//! The settings of a bootstrap: [`BootstrapConfig`] and its environment variables, the
//! collectives' [`Schedule`] (which also fixes the peers a rank ever connects to), the checks
//! of the deadline variable, and the secret of address-based bootstraps.
//!
//! Nothing here talks to a peer; the rest of the bootstrap only reads these values.

use std::time::Duration;

use mscclpp_base::{Error, Result};

/// The fixed string `ip:port` bootstraps derive their secret from when
/// `MSCCLPP_BOOTSTRAP_SECRET` is unset.
const DEFAULT_SECRET_STRING: &str = "mscclpp-rs bootstrap v1 (set MSCCLPP_BOOTSTRAP_SECRET)";

/// Settings of a bootstrap.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootstrapConfig {
    /// Deadline of the rendezvous and of each operation.
    pub timeout: Duration,
    /// Largest message a peer may send; larger frames are refused before any allocation.
    pub max_frame_bytes: usize,
    /// The collectives' schedule (`MSCCLPP_BOOTSTRAP_SCHEDULE`: `log` or `ring`).
    pub schedule: Schedule,
    /// Ranks of a view that share a host meet in shared memory for the barrier, with TCP
    /// between hosts only (`MSCCLPP_BOOTSTRAP_SHM`, default on). A view uses it only when
    /// every member allows it and every host could set it up; else it keeps the TCP barrier.
    pub shared_memory: bool,
    /// Lets another thread end the join (the rendezvous through the root) early; `None`: only
    /// the deadline ends it. Not kept once the bootstrap is up.
    pub cancel: Option<super::Cancel>,
}

impl Default for BootstrapConfig {
    /// 60 s and 1 GiB, without looking at the environment (see [`BootstrapConfig::from_env`]).
    fn default() -> Self {
        BootstrapConfig {
            timeout: Duration::from_secs(60),
            max_frame_bytes: 1 << 30,
            schedule: Schedule::Log,
            shared_memory: true,
            cancel: None,
        }
    }
}

impl BootstrapConfig {
    /// The defaults, with `MSCCLPP_BOOTSTRAP_TIMEOUT` (seconds), `MSCCLPP_BOOTSTRAP_SCHEDULE`
    /// and `MSCCLPP_BOOTSTRAP_SHM` (`0` keeps every barrier on TCP) applied when set.
    ///
    /// Also checks `MSCCLPP_SOCKET_IFNAME` when it is set, so that a name that does not exist
    /// fails every process that joins a bootstrap (a launching parent, its ranks, launched
    /// ranks) rather than only the ones that happen to listen through it.
    pub fn from_env() -> Result<Self> {
        if mscclpp_base::env::get("MSCCLPP_SOCKET_IFNAME").is_some() {
            mscclpp_base::net::local_ip()?;
        }
        let mut c = Self::default();
        if let Some(t) = checked_timeout(mscclpp_base::env::seconds(TIMEOUT_VAR)?)? {
            c.timeout = t;
        }
        if let Some(s) = mscclpp_base::env::get("MSCCLPP_BOOTSTRAP_SCHEDULE") {
            c.schedule = s.parse()?;
        }
        if let Some(f) = mscclpp_base::env::flag("MSCCLPP_BOOTSTRAP_SHM")? {
            c.shared_memory = f;
        }
        Ok(c)
    }
}

/// The variable that sets every bootstrap wait's deadline.
pub(crate) const TIMEOUT_VAR: &str = "MSCCLPP_BOOTSTRAP_TIMEOUT";

/// The shortest deadline [`TIMEOUT_VAR`] may set: below it no connection, let alone a
/// rendezvous, can finish (a value in seconds is easily given in the wrong unit).
pub(crate) const MIN_TIMEOUT: Duration = Duration::from_millis(1);

/// A [`TIMEOUT_VAR`] value, refused below [`MIN_TIMEOUT`].
pub(crate) fn checked_timeout(t: Option<Duration>) -> Result<Option<Duration>> {
    match t {
        Some(t) if t < MIN_TIMEOUT => Err(Error::invalid(format!(
            "{TIMEOUT_VAR}={}: a deadline of {t:?} is too short for any bootstrap wait; \
             expected at least {} seconds (1 ms; the value is in seconds, default 60)",
            t.as_secs_f64(),
            MIN_TIMEOUT.as_secs_f64()
        ))),
        t => Ok(t),
    }
}

/// A bootstrap timeout that says which variable sets the deadline that passed.
pub(crate) fn name_timeout_var(e: Error) -> Error {
    match e {
        Error::Timeout { waiting_for, after } if !waiting_for.contains(TIMEOUT_VAR) => {
            Error::Timeout {
                waiting_for: format!("{waiting_for} (the bootstrap deadline: {TIMEOUT_VAR})"),
                after,
            }
        }
        e => e,
    }
}

/// `MSCCLPP_BOOTSTRAP_SECRET` (`raw`: its value when set): a value that is set but blank is
/// refused rather than read as unset, which would silently mean the public default secret.
pub(crate) fn secret_setting(raw: Option<&str>) -> Result<Option<&str>> {
    match raw.map(str::trim) {
        None => Ok(None),
        Some("") => Err(Error::invalid(
            "MSCCLPP_BOOTSTRAP_SECRET is set but empty: that would mean the public default \
             secret; set a non-empty secret (the same on every rank) or unset the variable",
        )),
        Some(s) => Ok(Some(s)),
    }
}

/// The secret of address-based bootstraps: `MSCCLPP_BOOTSTRAP_SECRET`, else the fixed string.
pub(super) fn env_secret() -> Result<String> {
    let raw = std::env::var("MSCCLPP_BOOTSTRAP_SECRET").ok();
    Ok(secret_setting(raw.as_deref())?
        .unwrap_or(DEFAULT_SECRET_STRING)
        .to_owned())
}

/// Which message schedules the collectives use; this also decides which peers a rank ever
/// connects to (connections are opened on first use).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedule {
    /// Binomial-tree barrier and broadcast, Bruck all-gather: `ceil(log2 N)` rounds,
    /// with the peers `rank ± 2^k` — at most `2 ceil(log2 N)` connections per rank.
    #[default]
    Log,
    /// Ring all-gather and barrier, chain broadcast: `N - 1` rounds, two connections per rank.
    /// For very many ranks in one process, where every connection costs two descriptors.
    Ring,
}

impl std::str::FromStr for Schedule {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "log" | "" => Ok(Schedule::Log),
            "ring" => Ok(Schedule::Ring),
            other => Err(Error::invalid(format!(
                "bootstrap schedule {other:?}: expected \"log\" or \"ring\""
            ))),
        }
    }
}

/// The peers a rank exchanges collective messages with under `schedule` (sorted, without
/// `rank` itself): the only connections the collectives ever open.
pub fn schedule_peers(schedule: Schedule, rank: usize, nranks: usize) -> Vec<usize> {
    let mut v = Vec::new();
    if nranks > 1 {
        match schedule {
            Schedule::Ring => {
                v.push((rank + 1) % nranks);
                v.push((rank + nranks - 1) % nranks);
            }
            Schedule::Log => {
                let mut d = 1;
                while d < nranks {
                    v.push((rank + d) % nranks);
                    v.push((rank + nranks - d) % nranks);
                    d <<= 1;
                }
            }
        }
    }
    v.sort_unstable();
    v.dedup();
    v.retain(|&p| p != rank);
    v
}
