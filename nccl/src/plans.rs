//! Execution plans from `MSCCLPP_EXECUTION_PLAN_DIR`: MSCCL++ JSON plans (what its DSL emits)
//! chosen ahead of the built-in algorithms, as MSCCL++'s NCCL library does.
//!
//! **Loading** (at communicator init): every `*.json` of the directory, in file-name order.
//! A plan for another number of ranks is skipped (info); a file the reader refuses is skipped
//! with its error (warn); a second plan of a name already loaded is skipped (warn: the executor
//! caches set-ups by plan name). Nothing here fails an init.
//!
//! **Choosing** (per call): the first loaded plan of the call's collective whose
//! `min_message_size..=max_message_size` holds the message (the output for an all-gather, else
//! the input, in bytes) and that the executor can run with these sizes and this type here
//! ([`Executor::check`]); reducing plans take the call's operator (`avg` is not one a plan can
//! compute: built-in). No plan: the built-in algorithm. Each plan's first use is logged at info.
//!
//! **Running** (`mscclpp_caller::Caller::run_plan`): on buffers of this library arranged as the
//! plan says, between two copies on the caller's stream, inside the communicator's launch order.
//! With staging, whether a caller's call is in place plays no part in the choice, so every rank
//! chooses the same plan whatever its pointers. The first call of a plan with a size is its
//! collective set-up (memory, connections, a synchronisation): not capturable in a CUDA graph;
//! later ones are stream-ordered copies and one kernel.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use mscclpp::executor::Plan;
use mscclpp::hal::{BufferSlice, DataType, DynStream, Error, ReduceOp, Result};
use mscclpp_caller::Caller;

/// The variable naming the plan directory.
pub const PLAN_DIR_VAR: &str = "MSCCLPP_EXECUTION_PLAN_DIR";

/// The plans of one communicator, in the order they are tried.
#[derive(Debug)]
pub struct Plans {
    plans: Vec<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    plan: Plan,
    file: PathBuf,
    used: AtomicBool,
    runs: AtomicU64,
}

/// One collective call, as the plans see it.
#[derive(Debug)]
pub struct PlanCall<'a> {
    /// The plan's name for the collective (`allreduce`, `allgather`, `reducescatter`,
    /// `alltoall`, `broadcast`).
    pub collective: &'a str,
    /// The caller's send buffer (its whole input).
    pub send: &'a BufferSlice,
    /// The caller's receive buffer (its whole output).
    pub recv: &'a BufferSlice,
    /// Element type.
    pub dtype: DataType,
    /// The operator of a reducing collective (`None`: the collective does not reduce).
    pub op: Option<ReduceOp>,
}

impl Plans {
    /// Loads the plans of `MSCCLPP_EXECUTION_PLAN_DIR` for `comm` (`None`: the variable is not
    /// set, or no plan there is for this communicator; the reasons are logged).
    pub fn from_env(caller: &Caller) -> Option<Plans> {
        let dir = mscclpp::hal::env::get(PLAN_DIR_VAR)?;
        Plans::load(caller, Path::new(&dir))
    }

    /// Loads the plans of `dir` for `comm` (see the module doc).
    pub fn load(caller: &Caller, dir: &Path) -> Option<Plans> {
        let n = caller.communicator().nranks();
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(
                    "{PLAN_DIR_VAR}={}: cannot read the directory ({e}); no execution plans",
                    dir.display()
                );
                return None;
            }
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json") && p.is_file())
            .collect();
        files.sort();
        let mut plans: Vec<Loaded> = Vec::new();
        for file in files {
            match read_plan(&file, n) {
                Ok(Some(plan)) => {
                    if let Some(first) = plans.iter().find(|l| l.plan.name == plan.name) {
                        tracing::warn!(
                            "execution plan {} in {}: skipped, a plan of that name was loaded from {} (plans are set up by name)",
                            plan.name,
                            file.display(),
                            first.file.display()
                        );
                        continue;
                    }
                    tracing::info!(
                        "loaded execution plan {} ({}, {} ranks, {}, messages of {}..={} bytes) from {}",
                        plan.name,
                        plan.collective,
                        n,
                        if plan.inplace {
                            "in place"
                        } else {
                            "out of place"
                        },
                        plan.min_message_size,
                        plan.max_message_size,
                        file.display()
                    );
                    plans.push(Loaded {
                        plan,
                        file,
                        used: AtomicBool::new(false),
                        runs: AtomicU64::new(0),
                    });
                }
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!("execution plan {} skipped: {e}", file.display());
                }
            }
        }
        if plans.is_empty() {
            tracing::info!(
                "{PLAN_DIR_VAR}={}: no execution plan for {n} ranks",
                dir.display()
            );
            return None;
        }
        // The executor loads its kernel now, so that a device that cannot run it says so at init.
        match caller.executor() {
            Ok(_) => Some(Plans { plans }),
            Err(e) => {
                tracing::warn!(
                    "{PLAN_DIR_VAR}: the executor cannot run here ({e}); the built-in algorithms serve every call"
                );
                None
            }
        }
    }

    /// Names of the loaded plans, in the order they are tried.
    pub fn names(&self) -> Vec<&str> {
        self.plans.iter().map(|l| l.plan.name.as_str()).collect()
    }

    /// Executions of plan `name` so far.
    pub fn runs(&self, name: &str) -> u64 {
        self.plans
            .iter()
            .find(|l| l.plan.name == name)
            .map_or(0, |l| l.runs.load(Ordering::Relaxed))
    }

    /// Runs `call` with the first plan that fits it, enqueued on `stream`: `Ok(false)` when no
    /// plan does (the caller runs its built-in algorithm), `Ok(true)` when one ran.
    pub fn run(&self, caller: &Caller, call: &PlanCall<'_>, stream: &DynStream) -> Result<bool> {
        let (ib, ob) = (call.send.len(), call.recv.len());
        let msg = (if call.collective == "allgather" {
            ob
        } else {
            ib
        }) as u64;
        for l in &self.plans {
            let plan = &l.plan;
            if plan.collective != call.collective
                || msg < plan.min_message_size
                || msg > plan.max_message_size
            {
                continue;
            }
            if call.op == Some(ReduceOp::Avg) {
                tracing::debug!(
                    "execution plan {} not used for {} of {msg} bytes: plans sum, avg divides",
                    plan.name,
                    call.collective
                );
                continue;
            }
            if let Err(e) = caller.check_plan(plan, ib, ob, call.dtype) {
                tracing::debug!(
                    "execution plan {} not used for {} of {msg} bytes ({}): {e}",
                    plan.name,
                    call.collective,
                    call.dtype
                );
                continue;
            }
            let ran = caller
                .run_plan(plan, call.send, call.recv, call.dtype, call.op, stream)
                .map_err(|e| e.with_context(|| format!("execution plan {}", plan.name)))?;
            if !ran {
                continue;
            }
            if !l.used.swap(true, Ordering::Relaxed) {
                tracing::info!(
                    "using execution plan {} for {} of {msg} bytes",
                    plan.name,
                    call.collective
                );
            }
            l.runs.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        Ok(false)
    }
}

/// Reads `file` as a plan for `n` ranks: `Ok(None)` for a plan of another rank count (logged).
fn read_plan(file: &Path, n: usize) -> Result<Option<Plan>> {
    let len = std::fs::metadata(file)
        .map_err(|e| Error::io(format!("reading {}", file.display()), e))?
        .len();
    if len > mscclpp::executor::plan::MAX_PLAN_BYTES as u64 {
        return Err(Error::invalid(format!(
            "{len} bytes: at most {} are accepted",
            mscclpp::executor::plan::MAX_PLAN_BYTES
        )));
    }
    let bytes =
        std::fs::read(file).map_err(|e| Error::io(format!("reading {}", file.display()), e))?;
    let v: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| Error::invalid(format!("execution plan is not valid JSON: {e}")))?;
    if let Some(ranks) = v.get("gpus").and_then(|g| g.as_array()).map(Vec::len)
        && ranks != n
    {
        tracing::info!(
            "execution plan {} skipped: it is for {ranks} ranks, the communicator has {n}",
            file.display()
        );
        return Ok(None);
    }
    Plan::from_value(&v, n).map(Some)
}
