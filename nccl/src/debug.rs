//! NCCL's debug variables, honoured by this library as NCCL honours them.
//!
//! - `NCCL_DEBUG`: `VERSION` prints the version banner once (at the first `ncclGetUniqueId` or
//!   communicator creation); `WARN` adds warnings (every failing call, with its message);
//!   `INFO` adds what NCCL calls init lines (the version, each communicator's rank, size and
//!   device, which library serves it — mscclpp-rs natively or the real NCCL — and the algorithm
//!   choices this library makes) and, under `COLL`/`P2P`, one line per operation; `TRACE` adds
//!   the library's debug and trace events and, under `CALL`, one line per API call. `ABORT` is
//!   taken as `WARN`. Case does not matter; another value is reported once and ignored.
//! - `NCCL_DEBUG_SUBSYS`: a comma list of `INIT, COLL, P2P, SHM, NET, GRAPH, TUNING, ENV,
//!   ALLOC, CALL, PROXY, NVLS, BOOTSTRAP, REG, PROFILE, RAS` or `ALL`; a leading `^` inverts the
//!   list (everything but those). Unset: `INIT,BOOTSTRAP,ENV`, NCCL's default. It filters
//!   `INFO` and `TRACE` lines; warnings and the version are always printed.
//! - `NCCL_DEBUG_FILE`: the output file (created, or truncated, at the first call into the
//!   library) instead of standard output, for levels above `VERSION`; `%h` in the name becomes
//!   the host name (up to its first dot), `%p` the process id, `%%` a `%`. A file that cannot
//!   be created leaves the output on standard output, with a warning.
//!
//! Lines have NCCL's layout, `host:pid:tid [dev] NCCL INFO message` (warnings and traces with
//! the source location before `NCCL WARN` / `NCCL TRACE`), where `dev` is the device of the
//! calling thread's last communicator (0 before any, as `cudaGetDevice` says).
//!
//! The library's `tracing` events are what is printed: each event's subsystem comes from its
//! target (this crate's init lines name theirs, see [`INIT`]; the other crates' by module:
//! bootstrap → `BOOTSTRAP`, transports → `NET`, collectives → `COLL`, point-to-point → `P2P`,
//! ...). `MSCCLPP_LOG_LEVEL` (or `MSCCLPP_DEBUG`) takes precedence: when either is set the NCCL
//! variables are ignored and the library logs in its own format on standard error, as it does
//! when `NCCL_DEBUG` is unset.

use std::cell::Cell;
use std::fmt::Write as _;
use std::io::Write;
use std::sync::{Arc, Mutex, Once, OnceLock};

use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::subscriber::Interest;
use tracing::{Event, Metadata, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

use crate::abi::NCCL_VERSION_CODE;

/// Target of this crate's init lines (`INIT`).
pub const INIT: &str = "mscclpp_nccl::INIT";
/// Target of this crate's per-collective lines (`COLL`).
pub const COLL: &str = "mscclpp_nccl::COLL";
/// Target of this crate's per-send/receive lines (`P2P`).
pub const P2P: &str = "mscclpp_nccl::P2P";
/// Target of the per-call trace lines (`CALL`).
pub const CALL: &str = "mscclpp_nccl::CALL";
/// Target of the algorithm choices made at creation (`TUNING`).
pub const TUNING: &str = "mscclpp_nccl::TUNING";
/// Target of lines about the environment (`ENV`).
pub const ENV: &str = "mscclpp_nccl::ENV";
/// Target of the events of the communicator modules (comm, init, registry, route): the module
/// path they had when comm.rs held them all, which log filters may name.
pub const COMM_MODULE: &str = "mscclpp_nccl::comm";
/// Target of the events of reading an `ncclConfig_t`: the module path they had in
/// lifecycle.rs, which log filters may name.
pub const LIFECYCLE_MODULE: &str = "mscclpp_nccl::lifecycle";

/// `NCCL_DEBUG`'s levels, least verbose first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// The version banner only.
    Version,
    /// And warnings.
    Warn,
    /// And init lines (subsystems filtered).
    Info,
    /// And traces (subsystems filtered).
    Trace,
}

/// Reads an `NCCL_DEBUG` value (`None`: not one of NCCL's levels).
pub fn parse_level(v: &str) -> Option<Level> {
    match v.trim().to_ascii_uppercase().as_str() {
        "VERSION" => Some(Level::Version),
        "WARN" | "ABORT" => Some(Level::Warn),
        "INFO" => Some(Level::Info),
        "TRACE" => Some(Level::Trace),
        _ => None,
    }
}

/// NCCL's subsystems, each a bit of a mask.
pub const SUBSYSTEMS: &[&str] = &[
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
];

/// Every subsystem.
pub const ALL: u32 = u32::MAX;

/// The bit of a subsystem name (case-insensitive; `None` for a name NCCL does not have).
pub fn subsystem_bit(name: &str) -> Option<u32> {
    SUBSYSTEMS
        .iter()
        .position(|s| s.eq_ignore_ascii_case(name))
        .map(|i| 1 << i)
}

/// NCCL's default when `NCCL_DEBUG_SUBSYS` is unset: `INIT,BOOTSTRAP,ENV`.
pub fn default_mask() -> u32 {
    parse_subsys("INIT,BOOTSTRAP,ENV")
}

/// Reads an `NCCL_DEBUG_SUBSYS` value: a comma list (`ALL` for every one), inverted by a
/// leading `^`. Names NCCL does not know are ignored, as NCCL ignores them.
pub fn parse_subsys(v: &str) -> u32 {
    let v = v.trim();
    let (invert, list) = match v.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, v),
    };
    let listed = list
        .split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .fold(0u32, |m, t| {
            if t.eq_ignore_ascii_case("ALL") {
                ALL
            } else {
                m | subsystem_bit(t).unwrap_or(0)
            }
        });
    if invert { !listed } else { listed }
}

/// `NCCL_DEBUG_FILE`'s name with `%h` (host), `%p` (pid) and `%%` replaced; any other `%x` is
/// kept as written.
pub fn expand_file_pattern(pattern: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('h') => out.push_str(host),
            Some('p') => {
                let _ = write!(out, "{pid}");
            }
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The subsystem bit of an event, from its target: this crate's explicit ones
/// (`mscclpp_nccl::INIT`, ...), else by crate and module.
pub fn subsystem_of(target: &str) -> u32 {
    if let Some(s) = target.strip_prefix("mscclpp_nccl::")
        && let Some(bit) = subsystem_bit(s).filter(|_| s.chars().all(|c| c.is_ascii_uppercase()))
    {
        return bit;
    }
    const BY_MODULE: &[(&str, &str)] = &[
        ("mscclpp_nccl::register", "REG"),
        ("mscclpp_nccl::plans", "TUNING"),
        ("mscclpp_nccl::premul", "COLL"),
        ("mscclpp_bootstrap", "BOOTSTRAP"),
        ("mscclpp_comm::proxy", "PROXY"),
        ("mscclpp_transports", "NET"),
        ("mscclpp_collectives::algorithms::p2p", "P2P"),
        ("mscclpp_collectives", "COLL"),
        ("mscclpp_executor", "COLL"),
        ("mscclpp_caller::tuning", "TUNING"),
        ("mscclpp_caller", "COLL"),
        ("mscclpp_base::env", "ENV"),
    ];
    let name = BY_MODULE
        .iter()
        .find(|(prefix, _)| target.starts_with(prefix))
        .map_or("INIT", |(_, s)| s);
    subsystem_bit(name).unwrap_or(1)
}

/// `2.32.6+mscclpp-rs.0.1.0`: the NCCL API version this library implements, and its own.
pub fn version_string() -> String {
    let c = NCCL_VERSION_CODE;
    format!(
        "{}.{}.{}+mscclpp-rs.{}",
        c / 10000,
        (c % 10000) / 100,
        c % 100,
        env!("CARGO_PKG_VERSION")
    )
}

thread_local! {
    static DEVICE: Cell<i32> = const { Cell::new(0) };
    static TID: Cell<u32> = const { Cell::new(0) };
}

/// Records the device of the communicator this thread works on (the `[dev]` of its lines).
pub fn set_device(device: i32) {
    DEVICE.with(|d| d.set(device));
}

/// The kernel's id of the calling thread (`/proc/thread-self` is `pid/task/tid`), cached per
/// thread; the process id where it cannot be read.
fn tid() -> u32 {
    TID.with(|t| {
        if t.get() == 0 {
            let id = std::fs::read_link("/proc/thread-self")
                .ok()
                .and_then(|p| p.file_name()?.to_str()?.parse().ok())
                .unwrap_or_else(std::process::id);
            t.set(id);
        }
        t.get()
    })
}

/// The host name up to its first dot, as NCCL prints it.
fn short_hostname() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let h = h.trim();
    let short = h.split('.').next().unwrap_or(h);
    if short.is_empty() {
        "localhost".into()
    } else {
        short.to_owned()
    }
}

/// Where the lines go and what passes.
struct Sink {
    level: Level,
    mask: u32,
    host: String,
    pid: u32,
    out: Mutex<Box<dyn Write + Send>>,
}

/// NCCL's level of a `tracing` level: errors and warnings are `WARN`, debug and trace `TRACE`.
fn nccl_level(l: &tracing::Level) -> Level {
    match *l {
        tracing::Level::ERROR | tracing::Level::WARN => Level::Warn,
        tracing::Level::INFO => Level::Info,
        _ => Level::Trace,
    }
}

impl Sink {
    fn wants(&self, meta: &Metadata<'_>) -> bool {
        // Spans are not printed; events and `enabled!` hints are.
        if meta.is_span() {
            return false;
        }
        let l = nccl_level(meta.level());
        l <= self.level && (l == Level::Warn || self.mask & subsystem_of(meta.target()) != 0)
    }

    fn write(&self, line: &str) {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }

    fn prefix(&self) -> String {
        format!(
            "{}:{}:{} [{}]",
            self.host,
            self.pid,
            tid(),
            DEVICE.with(Cell::get)
        )
    }

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut v = Fields::default();
        event.record(&mut v);
        let mut line = self.prefix();
        let tag = match nccl_level(meta.level()) {
            Level::Warn => "WARN",
            Level::Info | Level::Version => "INFO",
            Level::Trace => "TRACE",
        };
        if tag != "INFO" {
            let _ = write!(
                line,
                " {}:{}",
                meta.file().unwrap_or("?"),
                meta.line().unwrap_or(0)
            );
        }
        let _ = writeln!(line, " NCCL {tag} {}{}", v.message, v.rest);
        self.write(&line);
    }
}

/// The message and the other fields (` name=value`) of an event.
#[derive(Default)]
struct Fields {
    message: String,
    rest: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            let _ = write!(self.rest, " {}={value}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            let _ = write!(self.rest, " {}={value:?}", field.name());
        }
    }
}

/// The `tracing` layer that prints in NCCL's format.
struct NcclLayer(Arc<Sink>);

impl<S: Subscriber> Layer<S> for NcclLayer {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> Interest {
        if self.0.wants(meta) {
            Interest::always()
        } else {
            Interest::never()
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.0.wants(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        Some(match self.0.level {
            Level::Version => LevelFilter::OFF,
            Level::Warn => LevelFilter::WARN,
            Level::Info => LevelFilter::INFO,
            Level::Trace => LevelFilter::TRACE,
        })
    }

    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        self.0.event(event);
    }
}

static SINK: OnceLock<Arc<Sink>> = OnceLock::new();

/// What logging the environment asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// The library's own (`MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG` set, or `NCCL_DEBUG` unset).
    Ours,
    /// NCCL's, at this level and subsystem mask, to this file (already expanded) or stdout.
    Nccl {
        /// `NCCL_DEBUG`.
        level: Level,
        /// `NCCL_DEBUG_SUBSYS`.
        mask: u32,
        /// `NCCL_DEBUG_FILE`, expanded (levels above `VERSION` only).
        file: Option<String>,
    },
    /// `NCCL_DEBUG` holds something else: the notice to print; the library's own logging.
    BadLevel(String),
}

/// Decides from the variables' values (`get` returns a set, non-blank variable's value).
pub fn choose(get: impl Fn(&str) -> Option<String>, host: &str, pid: u32) -> Choice {
    if get("MSCCLPP_LOG_LEVEL").is_some() || get("MSCCLPP_DEBUG").is_some() {
        return Choice::Ours;
    }
    let Some(v) = get("NCCL_DEBUG") else {
        return Choice::Ours;
    };
    let Some(level) = parse_level(&v) else {
        return Choice::BadLevel(format!(
            "mscclpp: NCCL_DEBUG={v:?} is not VERSION, WARN, INFO, ABORT or TRACE; ignored"
        ));
    };
    let mask = get("NCCL_DEBUG_SUBSYS").map_or_else(default_mask, |s| parse_subsys(&s));
    let file = get("NCCL_DEBUG_FILE")
        .filter(|_| level > Level::Version)
        .map(|p| expand_file_pattern(&p, host, pid));
    Choice::Nccl { level, mask, file }
}

/// Installs the library's logging once: NCCL's format when `NCCL_DEBUG` asks for it (and
/// `MSCCLPP_LOG_LEVEL` / `MSCCLPP_DEBUG` are unset), else the library's own
/// ([`mscclpp::init_logging`]).
pub fn init() {
    let host = short_hostname();
    let pid = std::process::id();
    let (level, mask, file) = match choose(mscclpp::hal::env::get, &host, pid) {
        Choice::Ours => return mscclpp::init_logging(),
        Choice::BadLevel(notice) => {
            eprintln!("{notice}");
            return mscclpp::init_logging();
        }
        Choice::Nccl { level, mask, file } => (level, mask, file),
    };
    let mut file_error = None;
    let out: Box<dyn Write + Send> = match file {
        None => Box::new(std::io::stdout()),
        Some(path) => match std::fs::File::create(&path) {
            Ok(f) => Box::new(f),
            Err(e) => {
                file_error = Some(format!(
                    "NCCL_DEBUG_FILE: cannot create {path:?} ({e}); logging to standard output"
                ));
                Box::new(std::io::stdout())
            }
        },
    };
    let sink = Arc::new(Sink {
        level,
        mask,
        host,
        pid,
        out: Mutex::new(out),
    });
    let _ = SINK.set(Arc::clone(&sink));
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let _ = tracing_subscriber::registry()
        .with(NcclLayer(sink))
        .try_init();
    if let Some(e) = file_error {
        tracing::warn!(target: ENV, "{e}");
    }
}

/// Prints the version banner, once per process, where `NCCL_DEBUG` is set: a bare
/// `NCCL version …` line at `VERSION` and `WARN`, an init line above (whatever the
/// subsystems, as NCCL prints it).
pub fn show_version() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Some(s) = SINK.get() else {
            return;
        };
        let v = version_string();
        if s.level <= Level::Warn {
            s.write(&format!("NCCL version {v}\n"));
        } else {
            s.write(&format!(
                "{} NCCL INFO NCCL version {v} (libmscclpp_nccl.so: NCCL's API over mscclpp-rs)\n",
                s.prefix()
            ));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bit(n: &str) -> u32 {
        subsystem_bit(n).unwrap()
    }

    #[test]
    fn levels_read_as_nccl_reads_them() {
        assert_eq!(parse_level("info"), Some(Level::Info));
        assert_eq!(parse_level(" WARN "), Some(Level::Warn));
        assert_eq!(parse_level("Abort"), Some(Level::Warn));
        assert_eq!(parse_level("VERSION"), Some(Level::Version));
        assert_eq!(parse_level("trace"), Some(Level::Trace));
        assert_eq!(parse_level("verbose"), None);
    }

    #[test]
    fn subsystem_lists_negation_and_all() {
        assert_eq!(default_mask(), bit("INIT") | bit("BOOTSTRAP") | bit("ENV"));
        assert_eq!(parse_subsys("coll,P2P"), bit("COLL") | bit("P2P"));
        assert_eq!(parse_subsys("ALL"), ALL);
        assert_eq!(parse_subsys("^INIT"), !bit("INIT"));
        assert_eq!(parse_subsys("^INIT,COLL"), !(bit("INIT") | bit("COLL")));
        assert_eq!(parse_subsys("^ALL"), 0);
        assert_eq!(parse_subsys("NOPE,INIT"), bit("INIT"));
    }

    #[test]
    fn targets_map_onto_subsystems() {
        assert_eq!(subsystem_of(INIT), bit("INIT"));
        assert_eq!(subsystem_of(COLL), bit("COLL"));
        assert_eq!(subsystem_of(CALL), bit("CALL"));
        assert_eq!(subsystem_of("mscclpp_nccl::comm"), bit("INIT"));
        assert_eq!(subsystem_of("mscclpp_bootstrap::root"), bit("BOOTSTRAP"));
        assert_eq!(subsystem_of("mscclpp_transports::ib"), bit("NET"));
        assert_eq!(
            subsystem_of("mscclpp_collectives::algorithms::p2p::host"),
            bit("P2P")
        );
        assert_eq!(subsystem_of("mscclpp_collectives::algorithms"), bit("COLL"));
        assert_eq!(subsystem_of("mscclpp::registry"), bit("INIT"));
    }

    #[test]
    fn file_patterns_expand_host_and_pid() {
        assert_eq!(
            expand_file_pattern("/tmp/nccl.%h.%p.log", "node7", 42),
            "/tmp/nccl.node7.42.log"
        );
        assert_eq!(expand_file_pattern("a%%b%x%", "h", 1), "a%b%x%");
    }

    #[test]
    fn mscclpp_variables_take_precedence() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| (*v).to_owned())
            }
        };
        assert_eq!(
            choose(
                env(&[("NCCL_DEBUG", "INFO"), ("MSCCLPP_LOG_LEVEL", "warn")]),
                "h",
                1
            ),
            Choice::Ours
        );
        assert_eq!(choose(env(&[]), "h", 1), Choice::Ours);
        assert!(matches!(
            choose(env(&[("NCCL_DEBUG", "LOUD")]), "h", 1),
            Choice::BadLevel(m) if m.contains("LOUD")
        ));
        assert_eq!(
            choose(
                env(&[("NCCL_DEBUG", "info"), ("NCCL_DEBUG_FILE", "x.%p")]),
                "h",
                9
            ),
            Choice::Nccl {
                level: Level::Info,
                mask: default_mask(),
                file: Some("x.9".into())
            }
        );
        // VERSION prints to standard output whatever the file says (NCCL opens the file only
        // for higher levels).
        assert_eq!(
            choose(
                env(&[("NCCL_DEBUG", "VERSION"), ("NCCL_DEBUG_FILE", "x")]),
                "h",
                9
            ),
            Choice::Nccl {
                level: Level::Version,
                mask: default_mask(),
                file: None
            }
        );
    }
}
