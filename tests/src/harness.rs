//! Stamps a suite of cases out once per backend, as libtest-mimic trials.
//!
//! A backend that is not compiled in, or whose probe fails on this machine, still lists every
//! case — as ignored, with the probe's reason — so that a run never passes silently on
//! hardware it did not have.

use std::sync::{Arc, OnceLock, RwLock};

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

type Probed = Result<Arc<dyn Backend>, String>;

fn probed(kind: BackendKind) -> &'static Probed {
    static CELLS: [OnceLock<Probed>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let i = BackendKind::ALL
        .iter()
        .position(|k| *k == kind)
        .unwrap_or(0);
    CELLS[i].get_or_init(|| mscclpp::registry::probe(kind).map_err(|e| e.to_string()))
}

/// Held shared by every case and alone by the cases named in `stamp`'s `alone`.
static GATE: RwLock<()> = RwLock::new(());

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
                // A poisoned gate only means a case panicked: the others still run.
                let (_shared, _alone) = if exclusive {
                    (None, Some(GATE.write().unwrap_or_else(|p| p.into_inner())))
                } else {
                    (Some(GATE.read().unwrap_or_else(|p| p.into_inner())), None)
                };
                let backend = match probed(kind) {
                    Ok(b) => b.clone(),
                    Err(reason) => return Ok(Completion::ignored_with(reason.clone())),
                };
                let device = backend
                    .open_device(0)
                    .map_err(|e| Failed::from(format!("opening device 0: {e}")))?;
                match case(&Fixture { backend, device }) {
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
