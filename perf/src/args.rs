//! Command line, with nccl-tests' flag names where they exist.

use clap::parser::ValueSource;
use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use mscclpp::collectives::{CollectiveKind, MAX_RANKS};
use mscclpp::hal::{BackendKind, DataType};

/// Benchmarks of mscclpp-rs. Runs standalone (spawning one process per rank) or under
/// mpirun/torchrun/srun (one process per rank, taken from the launcher's environment).
#[derive(Debug, Parser, Clone)]
#[command(name = "mscclpp-perf", version, about)]
pub struct Args {
    /// What to measure (default: allreduce).
    #[command(subcommand)]
    pub bench: Option<Bench>,

    /// Smallest message size (bytes; K, M and G suffixes are powers of 1024).
    #[arg(short = 'b', long = "minbytes", default_value = "1K", value_parser = parse_size, global = true)]
    pub min_bytes: usize,

    /// Largest message size.
    #[arg(short = 'e', long = "maxbytes", default_value = "16M", value_parser = parse_size, global = true)]
    pub max_bytes: usize,

    /// Multiplication factor between sizes.
    #[arg(short = 'f', long = "stepfactor", default_value_t = 2, global = true)]
    pub step_factor: usize,

    /// Timed iterations per size.
    #[arg(short = 'n', long = "iters", default_value_t = 20, global = true)]
    pub iters: usize,

    /// Warm-up iterations per size.
    #[arg(short = 'w', long = "warmup_iters", default_value_t = 5, global = true)]
    pub warmup: usize,

    /// Check results (0 disables the check).
    #[arg(short = 'c', long = "check", default_value_t = 1, global = true)]
    pub check: u8,

    /// Number of ranks when run standalone (default: one per GPU; 2 on the host backend).
    #[arg(long, global = true)]
    pub ranks: Option<usize>,

    /// Simulated hosts when run standalone: the ranks split into this many groups of
    /// consecutive ranks, each with its own `MSCCLPP_HOSTID`, so that the paths between hosts
    /// (the hierarchical collectives, multi-node plans) run on one machine. Must divide the
    /// ranks.
    #[arg(long, global = true)]
    pub hosts: Option<usize>,

    /// JSON output, as nccl-tests' `-J FILE`: one JSON document written to FILE (never over an
    /// existing file: FILE.0, FILE.1, ... instead), the table still on standard output;
    /// `mscclpp-perf report` reads it. `-J -`: one JSON object per row on standard output
    /// instead of the table (comments on standard error).
    #[arg(short = 'J', long = "json", value_name = "FILE", global = true)]
    pub json: Option<String>,

    /// Element type of the collectives (the list comes from the parser's own list).
    #[arg(short = 'd', long = "datatype", default_value = "float", global = true, help = datatype_help())]
    pub datatype: String,

    /// Reduction operator (the list comes from the parser's own list).
    #[arg(short = 'o', long = "op", default_value = "sum", global = true, help = op_help())]
    pub op: String,

    /// Root rank (broadcast).
    #[arg(short = 'r', long = "root", default_value_t = 0, global = true)]
    pub root: usize,

    /// Also run this library on the same buffers, in the same run (only `nccl`).
    #[arg(long, global = true)]
    pub baseline: Option<String>,

    /// Register the input buffer with our collectives (`Collectives::register`) on every rank
    /// and say so in each call (`CollectiveCall::registered`), so that all-reduces of 2 to 4 MiB
    /// per rank read the peers' inputs in place (the benchmark never runs in place, so the output
    /// needs no window); the NCCL baseline is not told. Compare with a run without it.
    #[arg(long, global = true)]
    pub register: bool,

    /// Time calls replayed from a graph of this many captured calls (0: eager launches); the
    /// NCCL baseline is captured the same way.
    #[arg(short = 'G', long = "cudagraph", default_value_t = 0, global = true)]
    pub cudagraph: u32,

    /// Run the ranks as threads of this one process instead of one process each (collectives
    /// and bootstrap). On one GPU the ranks then share one context, so their kernels run
    /// concurrently instead of time-sliced between processes: latency on one GPU means
    /// something.
    #[arg(long, global = true)]
    pub threads: bool,

    /// Accepted for older command lines: our collectives always run over the backend's own
    /// types now (the typed HAL: every launch a static call down to the vendor).
    #[arg(long, global = true, hide = true)]
    pub typed: bool,

    /// The global flags given on the command line (their field names), to refuse those a
    /// benchmark would ignore.
    #[arg(skip)]
    pub given: Vec<&'static str>,
}

/// `-d`'s help: every type the parser serves, by the names it prints (from the same list,
/// `DataType::ALL`, so that the help cannot fall behind the parser).
fn datatype_help() -> String {
    let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
    format!("Element type of the collectives: {}", names.join(", "))
}

/// `-o`'s help, from `ReduceOp::ALL` as the parser.
fn op_help() -> String {
    let names: Vec<&str> = mscclpp::hal::ReduceOp::ALL
        .iter()
        .map(|o| o.name())
        .collect();
    format!("Reduction operator: {}", names.join(", "))
}

/// The global flags: their ids (field names) and how the errors spell them.
const GLOBAL_FLAGS: [(&str, &str); 16] = [
    ("min_bytes", "-b"),
    ("max_bytes", "-e"),
    ("step_factor", "-f"),
    ("iters", "-n"),
    ("warmup", "-w"),
    ("check", "-c"),
    ("ranks", "--ranks"),
    ("json", "-J"),
    ("datatype", "-d"),
    ("op", "-o"),
    ("root", "-r"),
    ("baseline", "--baseline"),
    ("register", "--register"),
    ("cudagraph", "-G"),
    ("threads", "--threads"),
    ("typed", "--typed"),
];

/// The benchmarks.
#[derive(Debug, Subcommand, Clone, PartialEq, Eq)]
pub enum Bench {
    /// Each rank copies into the next rank's buffer through an IPC mapping (the CudaIpc path),
    /// plus bootstrap latencies.
    P2p,
    /// All-reduce (the default benchmark).
    Allreduce,
    /// All-gather.
    Allgather,
    /// Reduce-scatter.
    Reducescatter,
    /// Broadcast from `--root`.
    Broadcast,
    /// All-to-all.
    Alltoall,
    /// Both ranks put into each other through memory channels (the device copies).
    MemoryChannel,
    /// Both ranks put into each other through port channels (the proxy copies).
    PortChannel {
        /// CudaIpc or Ethernet.
        #[arg(long, default_value = "CudaIpc")]
        transport: String,
    },
    /// MSCCL++ execution plans (JSON, as its DSL emits them) run by the executor, beside the
    /// built-in algorithm of the same collective (and NCCL with `--baseline nccl`) on the same
    /// buffers; sizes within each plan's min/max message size.
    Plan {
        /// Plan files.
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
    },
    /// Communication beside compute: a GEMM-like kernel on every SM (about `--compute-us` per
    /// launch) on one stream while all-gathers and reduce-scatters run on another; per size and
    /// path (our SM kernels, our copy-engine path, NCCL with `--baseline nccl`): compute alone,
    /// communication alone, both, efficiency and the compute's slowdown.
    Overlap {
        /// Target time of one compute launch, microseconds.
        #[arg(long, default_value_t = 1000)]
        compute_us: u64,
        /// Collectives, comma-separated: allgather, reducescatter, broadcast, alltoall,
        /// allreduce.
        #[arg(long, default_value = "allgather,reducescatter")]
        collectives: String,
    },
    /// An HTML page of SVG plots (bus bandwidth, latency, the ratio to NCCL against size) from
    /// the JSON of one or more runs (`-J`): ours, NCCL's baseline, several runs or machines.
    Report {
        /// Files written by `mscclpp-perf ... -J FILE` (one JSON document) or by
        /// `mscclpp-perf ... -J - > FILE` (JSON lines).
        #[arg(required = true)]
        files: Vec<std::path::PathBuf>,
        /// Where the page goes (default: mscclpp-perf-report.html beside the first file).
        #[arg(long)]
        output: Option<std::path::PathBuf>,
        /// The page's title.
        #[arg(long)]
        title: Option<String>,
    },
    /// Asks a job's status service (started on its rank 0 by `MSCCLPP_STATUS`, which prints
    /// the address and token) for every rank's last call and who is behind.
    Status {
        /// The service's address (`HOST:PORT`).
        addr: std::net::SocketAddr,
        /// Its token (hex).
        token: String,
    },
    /// Expert-parallel dispatch and combine (the all-to-all of mixture-of-experts layers) of
    /// random top-k routings of bf16 rows, per token count: time and received GB/s of each.
    Moe {
        /// Hidden size: bf16 elements of a token's row.
        #[arg(long, default_value_t = 7168)]
        hidden: usize,
        /// Experts in all (spread evenly over the ranks).
        #[arg(long, default_value_t = 256)]
        experts: usize,
        /// Experts per token.
        #[arg(long, default_value_t = 8)]
        topk: usize,
        /// Tokens per rank, comma-separated (DeepSeek-V3's decode and prefill batches).
        #[arg(long, default_value = "128,4096")]
        tokens: String,
    },
    /// The bootstrap at scale: first barrier, barrier, all-gather, split, connections, RSS.
    Bootstrap {
        /// Timed repetitions of each operation.
        #[arg(long, default_value_t = 20)]
        reps: u32,
    },
}

impl Bench {
    /// The collective it measures, if it is one.
    pub fn collective(&self) -> Option<CollectiveKind> {
        match self {
            Bench::Allreduce => Some(CollectiveKind::AllReduce),
            Bench::Allgather => Some(CollectiveKind::AllGather),
            Bench::Reducescatter => Some(CollectiveKind::ReduceScatter),
            Bench::Broadcast => Some(CollectiveKind::Broadcast),
            Bench::Alltoall => Some(CollectiveKind::AllToAll),
            Bench::P2p
            | Bench::MemoryChannel
            | Bench::PortChannel { .. }
            | Bench::Plan { .. }
            | Bench::Overlap { .. }
            | Bench::Report { .. }
            | Bench::Status { .. }
            | Bench::Moe { .. }
            | Bench::Bootstrap { .. } => None,
        }
    }

    /// Its name: the subcommand, and the `bench` of its JSON lines.
    pub fn name(&self) -> &'static str {
        match self.collective() {
            Some(kind) => kind.name(),
            None => match self {
                Bench::MemoryChannel => "memory-channel",
                Bench::PortChannel { .. } => "port-channel",
                Bench::Bootstrap { .. } => "bootstrap",
                Bench::Moe { .. } => "moe",
                Bench::Plan { .. } => "plan",
                Bench::Overlap { .. } => "overlap",
                Bench::Report { .. } => "report",
                Bench::Status { .. } => "status",
                _ => "p2p",
            },
        }
    }
}

/// The token counts of `moe --tokens` (a comma list of positive numbers).
pub fn moe_tokens(list: &str) -> Result<Vec<usize>, String> {
    let counts: Vec<usize> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| match s.parse::<usize>() {
            Ok(v) if v > 0 && v <= i32::MAX as usize => Ok(v),
            _ => Err(format!(
                "--tokens {list}: {s} is not a positive token count"
            )),
        })
        .collect::<Result<_, _>>()?;
    if counts.is_empty() {
        return Err(format!("--tokens {list}: no token count"));
    }
    Ok(counts)
}

/// The collectives of `overlap --collectives` (a comma list of their names).
pub fn overlap_kinds(list: &str) -> Result<Vec<CollectiveKind>, String> {
    let kinds: Vec<CollectiveKind> = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            CollectiveKind::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    format!(
                        "--collectives: {name:?} is not one of allreduce, allgather, reducescatter, broadcast, alltoall"
                    )
                })
        })
        .collect::<Result<_, _>>()?;
    if kinds.is_empty() {
        return Err("--collectives: name at least one collective".into());
    }
    Ok(kinds)
}

/// Bytes as a short figure: `512 B`, `64 KiB`, `1.5 GiB`.
pub fn human(bytes: u128) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// Memory this host can still give (Linux's `MemAvailable`), bytes; `None` where unknown.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Parses `4096`, `64K`, `1M`, `1G` (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mul) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 1usize << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size: expected e.g. 4096, 64K, 1M or 1G"))?;
    n.checked_mul(mul)
        .filter(|&v| v > 0)
        .ok_or_else(|| format!("{s:?} is zero or too large"))
}

impl Args {
    /// Parses the command line (exits with clap's message on a bad one).
    pub fn parse_with_sources() -> Args {
        Args::try_parse_with_sources(std::env::args_os()).unwrap_or_else(|e| e.exit())
    }

    /// Parses `argv` (its first item is the program's name).
    pub fn try_parse_with_sources<I, T>(argv: I) -> Result<Args, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let matches = Args::command().try_get_matches_from(argv)?;
        Args::from_matches(&matches)
    }

    fn from_matches(matches: &ArgMatches) -> Result<Args, clap::Error> {
        let mut args = Args::from_arg_matches(matches)?;
        // Global flags may stand before or after the subcommand: look in both matches.
        let sub = matches.subcommand().map(|(_, m)| m);
        for (id, _) in GLOBAL_FLAGS {
            let given = [Some(matches), sub]
                .into_iter()
                .flatten()
                .any(|m| matches!(m.value_source(id), Some(ValueSource::CommandLine)));
            if given {
                args.given.push(id);
            }
        }
        Ok(args)
    }

    /// Refuses the global flags given that `bench` would ignore (they are offered to every
    /// subcommand, so a user could believe they took effect).
    fn refuse_ignored(&self, bench: &Bench) -> Result<(), String> {
        let applies = |id: &str| -> bool {
            match bench {
                Bench::Report { .. } | Bench::Status { .. } => false,
                Bench::Bootstrap { .. } => matches!(id, "ranks" | "threads"),
                Bench::Moe { .. } => {
                    matches!(id, "iters" | "warmup" | "check" | "ranks" | "threads")
                }
                _ if id == "typed" => matches!(
                    bench,
                    Bench::Allreduce
                        | Bench::Allgather
                        | Bench::Reducescatter
                        | Bench::Broadcast
                        | Bench::Alltoall
                ),
                Bench::MemoryChannel | Bench::PortChannel { .. } => matches!(
                    id,
                    "min_bytes"
                        | "max_bytes"
                        | "step_factor"
                        | "iters"
                        | "warmup"
                        | "ranks"
                        | "json"
                ),
                Bench::P2p => !matches!(id, "datatype" | "op" | "root" | "threads"),
                Bench::Overlap { .. } => !matches!(id, "root" | "threads"),
                Bench::Plan { .. } => id != "threads",
                Bench::Broadcast | Bench::Allgather | Bench::Alltoall => match id {
                    "op" => false,
                    "root" => *bench == Bench::Broadcast,
                    _ => true,
                },
                Bench::Allreduce | Bench::Reducescatter => id != "root",
            }
        };
        for (id, flag) in GLOBAL_FLAGS {
            // The three below have their own messages.
            if matches!(id, "baseline" | "register" | "cudagraph") {
                continue;
            }
            if self.given.contains(&id) && !applies(id) {
                return Err(match (bench, id) {
                    (Bench::Report { .. }, _) => {
                        format!("{flag} does not apply to report (it reads what a run wrote)")
                    }
                    (_, "op") if bench.collective().is_some() => {
                        format!("{flag}: {} does not reduce", bench.name())
                    }
                    (_, "root") if bench.collective().is_some() => {
                        format!("{flag}: {} has no root", bench.name())
                    }
                    _ => format!("{flag} does not apply to {}", bench.name()),
                });
            }
        }
        Ok(())
    }

    /// Refuses sizes whose buffers this machine cannot hold (the allocation would abort the
    /// process): about four buffers of the largest size per rank on the host backend (two
    /// device buffers in shared memory, two host copies), two host copies per rank on GPUs.
    /// `local_ranks` is the number of ranks on this host.
    pub fn check_memory(
        &self,
        local_ranks: usize,
        backend: BackendKind,
        available: Option<u64>,
    ) -> Result<(), String> {
        let bench = self.bench();
        if matches!(
            bench,
            Bench::Bootstrap { .. } | Bench::Report { .. } | Bench::Moe { .. }
        ) {
            return Ok(());
        }
        let Some(available) = available else {
            return Ok(());
        };
        let Some(&max) = self.sizes().last() else {
            return Ok(());
        };
        let per_rank = if backend == BackendKind::Host { 4 } else { 2 };
        let need = (max as u128) * per_rank * local_ranks.max(1) as u128;
        if need > u128::from(available) {
            return Err(format!(
                "-e {}: {} ranks need about {} of memory on this host ({per_rank} buffers of {} per rank{}), {} is available; use a smaller -e",
                human(max as u128),
                local_ranks.max(1),
                human(need),
                human(max as u128),
                if backend == BackendKind::Host {
                    ", the host backend's device buffers included"
                } else {
                    ": the staging copies of inputs and results"
                },
                human(u128::from(available)),
            ));
        }
        Ok(())
    }

    /// How calls are timed, as the tables' header says it.
    pub fn timing(&self) -> String {
        if self.cudagraph > 0 {
            format!("graph-timed ({} calls per graph)", self.cudagraph)
        } else {
            "eager launches".to_string()
        }
    }

    /// Checks relations between flags.
    pub fn validate(&self) -> Result<(), String> {
        if self.min_bytes > self.max_bytes {
            return Err(format!(
                "-b {} is larger than -e {}",
                self.min_bytes, self.max_bytes
            ));
        }
        if self.step_factor < 2 {
            return Err(format!("-f {} must be at least 2", self.step_factor));
        }
        if self.iters == 0 {
            return Err("-n must be at least 1".into());
        }
        if let Some(b) = &self.baseline {
            if b != "nccl" {
                return Err(format!("--baseline {b}: only `nccl` is supported"));
            }
        }
        self.datatype
            .parse::<mscclpp::hal::DataType>()
            .map_err(|e| e.to_string())?;
        self.op
            .parse::<mscclpp::hal::ReduceOp>()
            .map_err(|e| e.to_string())?;
        if let Some(n) = self.ranks {
            if n < 2 {
                return Err(format!("--ranks {n}: at least 2 ranks are needed"));
            }
        }
        self.validate_json()
    }

    /// `-J`'s value: `-` or a file whose directory exists. A subcommand's name is refused: the
    /// old `-J` took no value, and `-J allreduce` would write a file named `allreduce` and run
    /// the default benchmark.
    fn validate_json(&self) -> Result<(), String> {
        let Some(v) = &self.json else {
            return Ok(());
        };
        if v.is_empty() {
            return Err(
                "-J: name a file (nccl-tests' -J FILE) or - for JSON lines on standard output"
                    .into(),
            );
        }
        if Args::command().find_subcommand(v).is_some() {
            return Err(format!(
                "-J {v}: -J takes a file (nccl-tests' -J FILE) or - for JSON lines on standard output; write e.g. -J {v}.json, or -J - {v}"
            ));
        }
        if v != "-" {
            let path = std::path::Path::new(v);
            let dir = match path.parent() {
                Some(d) if !d.as_os_str().is_empty() => d,
                _ => std::path::Path::new("."),
            };
            if !dir.is_dir() {
                return Err(format!("-J {v}: no directory {}", dir.display()));
            }
        }
        Ok(())
    }

    /// Where `-J` sends JSON.
    pub fn json_out(&self) -> crate::report::JsonOut {
        use crate::report::JsonOut;
        match self.json.as_deref() {
            None => JsonOut::Off,
            Some("-") => JsonOut::Lines,
            Some(f) => JsonOut::File(f.into()),
        }
    }

    /// Whether standard output carries JSON lines only (`-J -`): comments go to standard error.
    pub fn json_lines(&self) -> bool {
        self.json.as_deref() == Some("-")
    }

    /// The benchmark to run.
    pub fn bench(&self) -> Bench {
        self.bench.clone().unwrap_or(Bench::Allreduce)
    }

    /// Checks what depends on the rank count and the backend: run in the launcher before any
    /// rank starts.
    pub fn validate_for(&self, nranks: usize, backend: BackendKind) -> Result<(), String> {
        let bench = self.bench();
        self.refuse_ignored(&bench)?;
        if let Bench::Plan { files } = &bench {
            return self.validate_plans(files, nranks, backend);
        }
        if let Bench::Overlap {
            compute_us,
            collectives,
        } = &bench
        {
            return self.validate_overlap(*compute_us, collectives, nranks, backend);
        }
        let Some(kind) = bench.collective() else {
            // The expert exchange has an NCCL baseline of its own (an all-to-all of the same
            // rows); the other flags are the collectives'.
            let moe = matches!(bench, Bench::Moe { .. });
            if moe && self.baseline.is_some() && backend == BackendKind::Host {
                return Err(
                    "--baseline nccl: the host backend has no vendor stream to run NCCL on".into(),
                );
            }
            for (set, flag) in [
                (self.baseline.is_some() && !moe, "--baseline"),
                (self.register, "--register"),
                (self.cudagraph > 0, "-G/--cudagraph"),
            ] {
                if set {
                    return Err(format!(
                        "{flag} applies to the collective benchmarks, not {}",
                        bench.name()
                    ));
                }
            }
            if let Bench::PortChannel { transport } = &bench {
                transport
                    .parse::<mscclpp::transports::Transport>()
                    .map_err(|e| format!("--transport {transport}: {e}"))?;
            }
            if let Bench::Moe {
                hidden,
                experts,
                topk,
                tokens,
            } = &bench
            {
                moe_tokens(tokens)?;
                if nranks > MAX_RANKS {
                    return Err(format!("moe serves 2 to {MAX_RANKS} ranks, not {nranks}"));
                }
                if *experts == 0 || experts % nranks != 0 {
                    return Err(format!(
                        "--experts {experts}: every one of the {nranks} ranks must hold the same number of experts"
                    ));
                }
                if *topk == 0 || topk > experts {
                    return Err(format!("--topk {topk}: 1 to --experts ({experts})"));
                }
                if *hidden == 0 {
                    return Err("--hidden 0: a row needs at least one element".into());
                }
            }
            if matches!(bench, Bench::MemoryChannel | Bench::PortChannel { .. }) && nranks != 2 {
                return Err(format!(
                    "{} runs between 2 ranks, not {nranks} (use --ranks 2)",
                    bench.name()
                ));
            }
            return Ok(());
        };
        if nranks > MAX_RANKS {
            return Err(format!(
                "{}: collectives serve 2 to {MAX_RANKS} ranks of one node, not {nranks}",
                kind.name()
            ));
        }
        if self.root >= nranks {
            return Err(format!(
                "--root {} is not a rank of {nranks} (ranks 0 to {})",
                self.root,
                nranks - 1
            ));
        }
        let dtype: DataType = self.datatype.parse().map_err(|e| format!("{e}"))?;
        let per = match kind {
            CollectiveKind::AllReduce | CollectiveKind::Broadcast => 1,
            _ => nranks,
        };
        let smallest = dtype.size() * per;
        if self.max_bytes < smallest {
            return Err(format!(
                "-e {}: {} needs at least {smallest} bytes (one {dtype} per rank block on {nranks} ranks)",
                self.max_bytes,
                kind.name()
            ));
        }
        if self.baseline.is_some() && backend == BackendKind::Host {
            return Err(
                "--baseline nccl: the host backend has no vendor stream to run NCCL on".into(),
            );
        }
        Ok(())
    }

    /// `overlap`: the compute time, the collectives, and the flags that apply.
    fn validate_overlap(
        &self,
        compute_us: u64,
        collectives: &str,
        nranks: usize,
        backend: BackendKind,
    ) -> Result<(), String> {
        if !(1..=1_000_000).contains(&compute_us) {
            return Err(format!(
                "--compute-us {compute_us}: expected 1 to 1000000 microseconds"
            ));
        }
        let kinds = overlap_kinds(collectives)?;
        for (set, flag) in [
            (self.register, "--register"),
            (self.cudagraph > 0, "-G/--cudagraph"),
        ] {
            if set {
                return Err(format!("{flag} does not apply to overlap"));
            }
        }
        if self.baseline.is_some() && backend == BackendKind::Host {
            return Err(
                "--baseline nccl: the host backend has no vendor stream to run NCCL on".into(),
            );
        }
        if !(2..=MAX_RANKS).contains(&nranks) {
            return Err(format!(
                "overlap: collectives serve 2 to {MAX_RANKS} ranks of one node, not {nranks}"
            ));
        }
        let dtype: DataType = self.datatype.parse().map_err(|e| format!("{e}"))?;
        if kinds.iter().any(|k| k.reduces())
            && matches!(self.op.parse(), Ok(mscclpp::hal::ReduceOp::Avg))
        {
            return Err("-o avg: overlap checks exact sums; use sum, prod, min or max".into());
        }
        let smallest = dtype.size() * nranks;
        if self.max_bytes < smallest {
            return Err(format!(
                "-e {}: overlap needs at least {smallest} bytes (one {dtype} per rank block on {nranks} ranks)",
                self.max_bytes
            ));
        }
        Ok(())
    }

    /// `plan`: every file is a valid plan for `nranks`, and the flags apply.
    fn validate_plans(
        &self,
        files: &[std::path::PathBuf],
        nranks: usize,
        backend: BackendKind,
    ) -> Result<(), String> {
        if self.register {
            return Err("--register does not apply to plan".into());
        }
        // The built-in algorithm is always beside the plan; NCCL joins it where it can run.
        if self.baseline.is_some() && backend == BackendKind::Host {
            return Err(
                "--baseline nccl: the host backend has no vendor stream to run NCCL on".into(),
            );
        }
        if matches!(self.op.parse(), Ok(mscclpp::hal::ReduceOp::Avg)) {
            return Err("-o avg: execution plans sum where asked to average".into());
        }
        for f in files {
            mscclpp::executor::Plan::from_file(f, nranks)
                .map_err(|e| format!("{}: {e}", f.display()))?;
        }
        Ok(())
    }

    /// The sizes to measure.
    pub fn sizes(&self) -> Vec<usize> {
        let mut v = Vec::new();
        let mut s = self.min_bytes;
        while s <= self.max_bytes {
            v.push(s);
            match s.checked_mul(self.step_factor) {
                Some(n) => s = n,
                None => break,
            }
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_and_step() {
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("0").is_err());
        let a = Args::try_parse_from(["mscclpp-perf", "-b", "1K", "-e", "8K", "-f", "2"]).unwrap();
        assert_eq!(a.sizes(), vec![1024, 2048, 4096, 8192]);
        let bad = Args::try_parse_from(["mscclpp-perf", "-b", "8K", "-e", "1K"]).unwrap();
        assert!(bad.validate().is_err());
    }

    fn check(argv: &[&str], nranks: usize, backend: BackendKind) -> Result<(), String> {
        let mut all = vec!["mscclpp-perf"];
        all.extend_from_slice(argv);
        Args::try_parse_with_sources(all)
            .unwrap()
            .validate_for(nranks, backend)
    }

    #[test]
    fn the_launcher_refuses_what_no_rank_could_run() {
        use BackendKind::{Cuda, Host};
        let e = check(&["broadcast", "-r", "5"], 2, Host).unwrap_err();
        assert!(e.contains("--root 5 is not a rank of 2"), "{e}");
        assert!(check(&["broadcast", "-r", "1"], 2, Host).is_ok());
        let e = check(&["allgather", "-b", "1", "-e", "4"], 2, Host).unwrap_err();
        assert!(e.contains("at least 8 bytes"), "{e}");
        let e = check(&["allreduce", "--baseline", "nccl"], 2, Host).unwrap_err();
        assert!(e.contains("host backend"), "{e}");
        assert!(check(&["allreduce", "--baseline", "nccl"], 2, Cuda).is_ok());
        let e = check(&["moe", "--baseline", "nccl"], 2, Host).unwrap_err();
        assert!(e.contains("host backend"), "{e}");
        assert!(check(&["moe", "--baseline", "nccl"], 2, Cuda).is_ok());
        let e = check(&["moe", "-G", "2"], 2, Cuda).unwrap_err();
        assert!(e.contains("collective benchmarks, not moe"), "{e}");
        let e = check(&["memory-channel"], 3, Host).unwrap_err();
        assert!(e.contains("2 ranks, not 3"), "{e}");
        let e = check(&["p2p", "-G", "4"], 2, Host).unwrap_err();
        assert!(e.contains("collective benchmarks, not p2p"), "{e}");
        let e = check(&["port-channel", "--transport", "Carrier"], 2, Host).unwrap_err();
        assert!(e.contains("--transport Carrier"), "{e}");
        let e = check(&["allreduce"], 9, Cuda).unwrap_err();
        assert!(e.contains("2 to 8 ranks"), "{e}");
        let e = check(&["overlap", "--compute-us", "0"], 2, Host).unwrap_err();
        assert!(e.contains("--compute-us 0"), "{e}");
        let e = check(&["overlap", "--collectives", "allgather,gemm"], 2, Host).unwrap_err();
        assert!(e.contains("\"gemm\" is not one of"), "{e}");
        let e = check(&["overlap", "--baseline", "nccl"], 2, Host).unwrap_err();
        assert!(e.contains("host backend"), "{e}");
        let e = check(&["overlap", "-G", "2"], 2, Cuda).unwrap_err();
        assert!(e.contains("does not apply to overlap"), "{e}");
        assert!(
            check(
                &["overlap", "--baseline", "nccl", "-d", "bfloat16"],
                2,
                Cuda
            )
            .is_ok()
        );
        assert!(check(&["overlap", "-b", "1K", "-e", "64K"], 2, Host).is_ok());
        let e = check(&["plan", "/nonexistent/plan.json"], 2, Host).unwrap_err();
        assert!(e.contains("/nonexistent/plan.json"), "{e}");
        let e = check(&["plan", "-o", "avg", "x.json"], 2, Host).unwrap_err();
        assert!(e.contains("-o avg"), "{e}");
    }

    /// Flags every subcommand lists but some ignore are refused where ignored (issue 32:
    /// `port-channel -o max -r 5` ran without a word).
    #[test]
    fn flags_a_benchmark_ignores_are_refused() {
        use BackendKind::Host;
        let e = check(&["port-channel", "-o", "max", "-r", "5"], 2, Host).unwrap_err();
        assert_eq!(e, "-o does not apply to port-channel");
        let e = check(&["-d", "half", "memory-channel"], 2, Host).unwrap_err();
        assert_eq!(e, "-d does not apply to memory-channel");
        let e = check(&["allgather", "-o", "max"], 2, Host).unwrap_err();
        assert_eq!(e, "-o: allgather does not reduce");
        let e = check(&["allreduce", "-r", "1"], 2, Host).unwrap_err();
        assert_eq!(e, "-r: allreduce has no root");
        let e = check(&["bootstrap", "-b", "1K"], 2, Host).unwrap_err();
        assert_eq!(e, "-b does not apply to bootstrap");
        let e = check(&["report", "-n", "5", "x.jsonl"], 2, Host).unwrap_err();
        assert!(e.starts_with("-n does not apply to report"), "{e}");
        // What applies still passes, before or after the subcommand.
        assert!(check(&["-o", "max", "allreduce"], 2, Host).is_ok());
        assert!(check(&["broadcast", "-r", "1", "-d", "half"], 2, Host).is_ok());
        assert!(
            check(
                &["port-channel", "-b", "1K", "-e", "4K", "-J", "-"],
                2,
                Host
            )
            .is_ok()
        );
        assert!(check(&["allgather", "-d", "int32"], 2, Host).is_ok());
    }

    /// Sizes the machine cannot hold are refused naming the size (issue 32: `-b 64G -e 64G`
    /// aborted in `Vec::with_capacity`).
    #[test]
    fn sizes_beyond_memory_are_refused() {
        let a = Args::try_parse_with_sources(["mscclpp-perf", "-b", "64G", "-e", "64G"]).unwrap();
        let e = a
            .check_memory(2, BackendKind::Host, Some(16 << 30))
            .unwrap_err();
        assert!(
            e.starts_with("-e 64 GiB: 2 ranks need about 512 GiB"),
            "{e}"
        );
        assert!(e.contains("16 GiB is available"), "{e}");
        assert!(a.check_memory(2, BackendKind::Cuda, Some(1 << 40)).is_ok());
        let small = Args::try_parse_with_sources(["mscclpp-perf", "-e", "1M"]).unwrap();
        assert!(
            small
                .check_memory(2, BackendKind::Host, available_memory())
                .is_ok()
        );
        assert_eq!(human(1536 << 20), "1.5 GiB");
        assert_eq!(human(512), "512 B");
    }

    #[test]
    fn plan_takes_the_nccl_baseline_where_nccl_can_run() {
        use BackendKind::{Cuda, Host, Rocm};
        // A valid 2-rank plan, written where this test alone writes.
        let dir = std::env::temp_dir().join(format!("mscclpp-perf-args-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("allreduce.json");
        std::fs::write(
            &file,
            mscclpp::executor::testgen::allreduce_simple(2, true).to_string(),
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let result = (|| {
            check(&["plan", "--baseline", "nccl", path], 2, Cuda)?;
            check(&["plan", path, "--baseline", "nccl", "-G", "4"], 2, Rocm)?;
            check(&["plan", path], 2, Host)
        })();
        let host = check(&["plan", "--baseline", "nccl", path], 2, Host);
        let other = Args::try_parse_from(["mscclpp-perf", "plan", "--baseline", "rccl", path])
            .unwrap()
            .validate();
        let register = check(&["plan", "--register", path], 2, Cuda);
        // A plan for 2 ranks is still checked against the rank count with the baseline on.
        let three = check(&["plan", "--baseline", "nccl", path], 3, Cuda);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(result, Ok(()));
        let e = host.unwrap_err();
        assert_eq!(
            e,
            "--baseline nccl: the host backend has no vendor stream to run NCCL on"
        );
        let e = other.unwrap_err();
        assert!(e.contains("only `nccl`"), "{e}");
        let e = register.unwrap_err();
        assert!(e.contains("--register does not apply to plan"), "{e}");
        let e = three.unwrap_err();
        assert!(e.contains(path), "{e}");
    }

    /// `-J FILE` as nccl-tests takes it, `-J -` for JSON lines; a bare `-J` or a subcommand
    /// after it is refused with a message (it would swallow the name as a file).
    #[test]
    fn json_takes_a_file_or_a_dash() {
        use crate::report::JsonOut;
        let parse = |argv: &[&str]| {
            let mut all = vec!["mscclpp-perf"];
            all.extend_from_slice(argv);
            Args::try_parse_with_sources(all)
        };
        let a = parse(&["allreduce", "-J", "out.json"]).unwrap();
        assert_eq!(a.json_out(), JsonOut::File("out.json".into()));
        assert!(a.validate().is_ok());
        assert_eq!(a.bench(), Bench::Allreduce);
        let a = parse(&["-J", "-", "allgather"]).unwrap();
        assert_eq!(a.json_out(), JsonOut::Lines);
        assert!(a.json_lines());
        assert_eq!(a.bench(), Bench::Allgather);
        assert_eq!(parse(&[]).unwrap().json_out(), JsonOut::Off);
        assert!(parse(&["allreduce", "-J"]).is_err());
        let e = parse(&["-J", "allreduce"]).unwrap().validate().unwrap_err();
        assert!(e.contains("-J allreduce.json"), "{e}");
        let e = parse(&["-J", "/no/such/dir/x.json"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.contains("no directory /no/such/dir"), "{e}");
    }

    /// `--help` lists every type and operator the parser serves, and every listed name parses
    /// back to its own type (the list and the parser cannot drift).
    #[test]
    fn help_lists_every_served_type_and_operator() {
        let help = Args::command().render_help().to_string();
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for d in DataType::ALL {
            assert!(flat.contains(d.name()), "{} missing from --help", d.name());
            assert_eq!(d.name().parse::<DataType>().ok(), Some(d));
        }
        for o in mscclpp::hal::ReduceOp::ALL {
            assert!(flat.contains(o.name()), "{} missing from --help", o.name());
        }
        let listed = datatype_help();
        assert_eq!(listed.matches(", ").count() + 1, DataType::ALL.len());
    }
}
