//! Stamps a suite of cases out once per backend, as libtest-mimic trials.
//!
//! A backend that is not compiled in, or whose probe fails on this machine, still lists every
//! case — as ignored, with the probe's reason — so that a run never passes silently on
//! hardware it did not have.

use std::sync::{Arc, OnceLock};

use libtest_mimic::{Completion, Failed, Trial};
use mscclpp::hal::{Backend, BackendKind, Device};

/// What a case gets: the backend and its device 0.
#[derive(Debug)]
pub struct Fixture {
    /// The backend under test.
    pub backend: Arc<dyn Backend>,
    /// Its first device.
    pub device: Arc<dyn Device>,
}

/// Why a conformance case did not pass.
#[derive(Debug)]
pub enum CaseError {
    /// It failed, with the message.
    Fail(String),
    /// It cannot run here (a capability this backend or device lacks), with the reason: reported
    /// as ignored.
    Skip(String),
}

impl From<String> for CaseError {
    fn from(message: String) -> Self {
        CaseError::Fail(message)
    }
}

impl From<&str> for CaseError {
    fn from(message: &str) -> Self {
        CaseError::Fail(message.to_owned())
    }
}

/// A conformance case: `Ok(())` passes, `Err(CaseError::Fail)` fails, `Err(skipped(reason))` is
/// reported as ignored with the reason. Failures given as `String` convert with `?`.
pub type CaseFn = fn(&Fixture) -> Result<(), CaseError>;

/// The error of a case that cannot run here, with the reason (see [`CaseFn`]).
pub fn skipped(reason: impl std::fmt::Display) -> CaseError {
    CaseError::Skip(reason.to_string())
}

/// Fails a case with a formatted message unless the condition holds.
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

/// Converts a library error into a case failure, with context.
pub trait Context<T> {
    /// Adds what was being done.
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Context<T> for mscclpp::hal::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| format!("{what}: {e}"))
    }
}

/// A backend's or compiler's probe error as the reason of an ignored trial: its first clause,
/// which names what is missing, without the parenthesised list of the library files it tried
/// and the install hint after `; ` — both there for a user, and what made every ignored line
/// of a run 200 to 310 characters long. The tool's header (`mscclpp-perf`) and
/// `MSCCLPP_LOG_LEVEL=debug` show the whole error.
pub fn ignore_reason(error: impl std::fmt::Display) -> String {
    let mut out = error.to_string();
    while let Some(start) = out.find(" (tried ") {
        // The list's closing parenthesis (file names have none of their own).
        let Some(len) = out[start..].find(')') else {
            break;
        };
        out.replace_range(start..start + len + 1, "");
    }
    if let Some(hint) = out.find("; ") {
        out.truncate(hint);
    }
    out
}

/// `head` and `text` as lines of at most [`WRAP_COLUMNS`] characters (where the words allow),
/// the later ones indented under the first's text: for the examples of expected errors that
/// trials print, which run to 250 characters on one line.
pub fn wrapped(head: &str, text: &str) -> String {
    let indent = " ".repeat(head.len() - head.trim_start().len() + 4);
    let mut out = String::from(head);
    let mut col = head.chars().count();
    // Whether the current line holds something to break after (never an empty line).
    let mut filled = !head.trim().is_empty();
    for word in text.split(' ') {
        let w = word.chars().count();
        if filled && col + 1 + w > WRAP_COLUMNS {
            out.push('\n');
            out.push_str(&indent);
            col = indent.len();
        } else if !out.is_empty() && !out.ends_with(' ') {
            out.push(' ');
            col += 1;
        }
        out.push_str(word);
        col += w;
        filled = true;
    }
    out
}

/// The width [`wrapped`] keeps to.
pub const WRAP_COLUMNS: usize = 100;

type Probed = Result<Arc<dyn Backend>, String>;

fn probed(kind: BackendKind) -> &'static Probed {
    static CELLS: [OnceLock<Probed>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = BackendKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(0);
    CELLS[i].get_or_init(|| mscclpp::registry::probe(kind).map_err(ignore_reason))
}

// The gate between the cases that must run alone and the others is serial_test's: `serial`
// excludes every other case of the key, `parallel` only the serial ones. Its attributes make
// functions of no arguments, so the case and its fixture reach them through this thread's
// slot (the attribute runs the body on the calling thread).
thread_local! {
    static PENDING: std::cell::RefCell<Option<(CaseFn, Fixture)>> =
        const { std::cell::RefCell::new(None) };
}

fn run_pending() -> Result<(), CaseError> {
    let (case, fixture) = PENDING
        .with(|p| p.borrow_mut().take())
        .ok_or("no case was handed to the gate")?;
    case(&fixture)
}

/// Runs the pending case with no other case of the process at the same time.
#[serial_test::serial(device_cases)]
fn run_alone() -> Result<(), CaseError> {
    run_pending()
}

/// Runs the pending case beside the others, never beside one that runs alone.
#[serial_test::parallel(device_cases)]
fn run_beside() -> Result<(), CaseError> {
    run_pending()
}

/// Trials named `{suite}::{backend}::{case}` for every backend and case. The cases named in
/// `alone` run with no other case of the process at the same time, whatever the test thread
/// count: a case that leaves the device waiting on a flag that only its own next driver call
/// releases would otherwise hang the process when another thread's driver call synchronizes the
/// device meanwhile (a free does), since that call waits for the device while holding the
/// driver's lock that the release needs.
pub fn stamp(suite: &str, cases: &[(&'static str, CaseFn)], alone: &[&str]) -> Vec<Trial> {
    // A renamed case must not leave the gate silently: every name in `alone` is a case.
    for a in alone {
        assert!(
            cases.iter().any(|(name, _)| name == a),
            "{suite}: `alone` names {a}, which is not a case"
        );
    }
    let mut trials = Vec::new();
    for kind in BackendKind::ALL {
        for &(name, case) in cases {
            let full = format!("{suite}::{kind}::{name}");
            let exclusive = alone.contains(&name);
            trials.push(Trial::ignorable_test(full, move || {
                let backend = match probed(kind) {
                    Ok(b) => b.clone(),
                    Err(reason) => return Ok(Completion::ignored_with(reason.clone())),
                };
                let device = backend
                    .open_device(0)
                    .map_err(|e| Failed::from(format!("opening device 0: {e}")))?;
                PENDING.with(|p| *p.borrow_mut() = Some((case, Fixture { backend, device })));
                let run = if exclusive { run_alone } else { run_beside };
                match run() {
                    Ok(()) => Ok(Completion::Completed),
                    Err(CaseError::Skip(reason)) => Ok(Completion::ignored_with(reason)),
                    Err(CaseError::Fail(message)) => Err(Failed::from(message)),
                }
            }));
        }
    }
    trials
}

/// Lower-case hex of bytes (for passing handles to child processes).
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Inverse of [`hex`].
pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if s.len() % 2 != 0 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::{WRAP_COLUMNS, ignore_reason, wrapped};

    #[test]
    fn ignore_reasons_drop_the_list_of_files_tried() {
        assert_eq!(
            ignore_reason(
                "rocm backend not available: no usable HIP runtime library (tried \
                 libamdhip64.so.7, /opt/rocm/lib/libamdhip64.so; MSCCLPP_LOG_LEVEL=debug says why)"
            ),
            "rocm backend not available: no usable HIP runtime library"
        );
        // The install hint goes too; a reason with neither is unchanged.
        assert_eq!(
            ignore_reason("NVRTC could not be opened (tried libnvrtc.so.13); install CUDA"),
            "NVRTC could not be opened"
        );
        assert_eq!(ignore_reason("no device (none)"), "no device (none)");
    }

    #[test]
    fn wrapped_lines_keep_to_the_width_and_every_word() {
        let text = "rank 1: died while this rank waited for LL16 packet at 0x7fb11f195000 to \
                    carry flag 2; then: rank 1: died (127.0.0.1:38181, its bootstrap connection \
                    closed: 127.0.0.1:38181 closed the connection); rank 0 learned it 0.001 s ago";
        let out = wrapped("    ll: e.g. rank 0:", text);
        assert!(out.lines().count() >= 3, "{out}");
        for line in out.lines() {
            assert!(line.chars().count() <= WRAP_COLUMNS, "{line:?}");
        }
        assert!(
            out.starts_with("    ll: e.g. rank 0: rank 1: died"),
            "{out}"
        );
        assert!(
            out.lines().skip(1).all(|l| l.starts_with("        ")),
            "{out}"
        );
        let words: Vec<&str> = out.split_whitespace().collect();
        let want: Vec<&str> = "ll: e.g. rank 0:"
            .split_whitespace()
            .chain(text.split_whitespace())
            .collect();
        assert_eq!(words, want);
        // A word longer than the width stays whole (on its own line after another word).
        let long = "x".repeat(150);
        let out = wrapped("  a:", &format!("b {long} c"));
        assert!(out.lines().any(|l| l.trim() == long), "{out}");
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            ["a:", "b", &long, "c"]
        );
    }

    /// The gate: a case named in `alone` never overlaps another case, while the others do run
    /// side by side (eight threads, the host backend).
    #[test]
    fn a_case_named_alone_runs_with_no_other() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        use std::time::Duration;
        static RUNNING: AtomicUsize = AtomicUsize::new(0);
        static MOST: AtomicUsize = AtomicUsize::new(0);
        static OVERLAPPED: AtomicBool = AtomicBool::new(false);
        fn busy(_: &super::Fixture) -> Result<(), super::CaseError> {
            let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
            MOST.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(30));
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
        fn lonely(_: &super::Fixture) -> Result<(), super::CaseError> {
            if RUNNING.fetch_add(1, Ordering::SeqCst) != 0 {
                OVERLAPPED.store(true, Ordering::SeqCst);
            }
            std::thread::sleep(Duration::from_millis(60));
            if RUNNING.load(Ordering::SeqCst) != 1 {
                OVERLAPPED.store(true, Ordering::SeqCst);
            }
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
        let mut cases: Vec<(&'static str, super::CaseFn)> = vec![
            ("busy_0", busy),
            ("busy_1", busy),
            ("busy_2", busy),
            ("lonely", lonely),
        ];
        cases.extend([
            ("busy_3", busy as super::CaseFn),
            ("busy_4", busy),
            ("busy_5", busy),
        ]);
        let trials = super::stamp("gate", &cases, &["lonely"]);
        let args = libtest_mimic::Arguments {
            test_threads: Some(8),
            filter: Some("gate::host::".into()),
            quiet: true,
            ..Default::default()
        };
        let done = libtest_mimic::run(&args, trials);
        assert_eq!((done.num_passed, done.num_failed), (7, 0));
        assert!(
            !OVERLAPPED.load(Ordering::SeqCst),
            "the lone case ran beside another"
        );
        assert!(
            MOST.load(Ordering::SeqCst) > 1,
            "the other cases never ran side by side"
        );
    }
}
