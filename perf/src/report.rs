//! Output of every benchmark: the nccl-tests table, JSON lines with `-J -`, or the table and one
//! JSON document in a file with `-J FILE` (nccl-tests' `-J FILE`; one key scheme for all of
//! them). Comments — the preamble and the footer — go to standard output with the table and to
//! standard error under `-J -`, so that standard output stays pure JSON. Comments are wrapped at
//! [`WIDTH`] characters. Rows are flushed as measured; rank 0 prints.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value};

/// The widest comment line (legends and headers are wrapped to it; a terminal of 100 columns
/// shows them whole).
pub const WIDTH: usize = 100;

/// Where `-J` sends JSON.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum JsonOut {
    /// No `-J`: the table on standard output.
    #[default]
    Off,
    /// `-J -`: one JSON object per line on standard output, comments on standard error.
    Lines,
    /// `-J FILE`: the table on standard output as without `-J`, and one JSON document in the
    /// file (see [`JsonDoc`]).
    File(PathBuf),
}

/// `text` as `#` comment lines of at most [`WIDTH`] characters, broken at spaces (a word longer
/// than a line — a path, a command — stays whole on its own line); continuation lines are
/// indented so that a reader sees where an item ends.
pub fn wrap_comment(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::from("#");
    let mut empty = true;
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        if !empty && line.chars().count() + 1 + word.chars().count() > WIDTH {
            lines.push(std::mem::replace(&mut line, String::from("#  ")));
        }
        line.push(' ');
        line.push_str(word);
        empty = false;
    }
    lines.push(line);
    lines
}

/// A baseline's figures for one row.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    /// Time per operation (slowest rank), microseconds.
    pub time_us: f64,
    /// Host time per operation spent in the calls (slowest rank), where measured.
    pub cpu_us: Option<f64>,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements over all ranks.
    pub wrong: u64,
}

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Benchmark name (the subcommand).
    pub bench: &'static str,
    /// Message size in bytes (of the larger buffer).
    pub bytes: usize,
    /// Element count.
    pub count: usize,
    /// Element type.
    pub dtype: &'static str,
    /// Operation.
    pub op: &'static str,
    /// Root rank, where the benchmark has one.
    pub root: Option<usize>,
    /// Ranks taking part.
    pub nranks: usize,
    /// Time per operation (slowest rank), microseconds.
    pub time_us: f64,
    /// Host time per operation spent in the calls (slowest rank), where measured (a column of
    /// tables made `with_cpu`).
    pub cpu_us: Option<f64>,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements over all ranks, when checked.
    pub wrong: Option<u64>,
    /// The baseline's figures, when one runs.
    pub baseline: Option<Baseline>,
    /// The algorithm our library chose, where known (a column of tables made `with_algo`).
    pub algo: Option<&'static str>,
}

/// What a run was, for the reader of its JSON lines (`mscclpp-perf report`'s caption): under
/// `-J` the first line is `{"meta":{...}}`.
#[derive(Debug, Clone)]
pub struct Meta {
    /// The benchmark (subcommand).
    pub bench: &'static str,
    /// The backend's name.
    pub backend: String,
    /// The device's name.
    pub device: String,
    /// Ranks taking part.
    pub nranks: usize,
    /// How calls were timed, in words.
    pub timing: String,
}

/// The command line as typed (the program by its file name), each argument with spaces quoted.
pub fn command_line() -> String {
    let mut words: Vec<String> = std::env::args().collect();
    if let Some(first) = words.first_mut() {
        if let Some(name) = std::path::Path::new(first.as_str()).file_name() {
            *first = name.to_string_lossy().into_owned();
        }
    }
    words
        .iter()
        .map(|w| {
            if w.is_empty() || w.contains(char::is_whitespace) {
                format!("'{w}'")
            } else {
                w.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// This host in words: its name, the CPU model and cores, the memory.
pub fn machine() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split_once(':'))
        .map(|(_, m)| m.trim().to_string());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let line = t.lines().find(|l| l.starts_with("MemTotal:"))?.to_string();
            line.split_whitespace().nth(1)?.parse::<u128>().ok()
        })
        .map(|kib| crate::args::human(kib * 1024));
    let mut out = host;
    if let Some(m) = model {
        out += &format!(", {m}");
    }
    out += &format!(", {cores} cores");
    if let Some(m) = memory {
        out += &format!(", {m} memory");
    }
    out
}

/// Prints rows on rank 0 only.
#[derive(Debug)]
pub struct Table {
    /// JSON lines on standard output instead of the table (`-J -`).
    json: bool,
    /// Where `-J FILE` goes: created by the preamble (rank 0 only), rewritten after each row.
    json_file: Option<PathBuf>,
    doc: Option<JsonDoc>,
    enabled: bool,
    /// Whether rows carry baselines (their columns are shown only then).
    baseline: bool,
    /// The baselines' names, in column order: each one's time column title and JSON key. A
    /// table without baselines keeps its one name for the JSON key (`"nccl":null`), which
    /// readers of the collective benchmarks' lines expect.
    baseline_names: Vec<&'static str>,
    /// Whether rows carry the algorithm (a column after #wrong, an `algo` key).
    algo: bool,
    /// Whether rows carry host times (a column after each time, a `cpu_us` key).
    cpu: bool,
    wrong_total: u64,
    /// Bus bandwidth of our rows, summed, and their number (nccl-tests' average).
    busbw_sum: f64,
    rows: usize,
}

/// The `{"meta":...}` line.
fn meta_line(text: &str, meta: &Meta, command: &str, machine: &str) -> String {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    serde_json::json!({
        "meta": {
            "bench": meta.bench,
            "backend": meta.backend,
            "device": meta.device,
            "nranks": meta.nranks,
            "timing": meta.timing,
            "command": command,
            "machine": machine,
            "version": env!("CARGO_PKG_VERSION"),
            "unix_time": unix,
            "title": text,
        }
    })
    .to_string()
}

/// A figure with three significant digits at least (0.000123, 1.23, 123.45): small bandwidths
/// and times do not print as 0.00.
pub fn fig(v: f64, width: usize) -> String {
    let a = v.abs();
    let decimals = if a == 0.0 || a >= 1.0 {
        2
    } else {
        // Digits after the point up to three significant ones.
        ((-a.log10()).floor() as usize + 3).min(9)
    };
    format!("{v:>width$.decimals$}")
}

/// A JSON number: three decimals, or four significant digits below 1.
fn jnum(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 || a >= 1.0 || !a.is_finite() {
        format!("{v:.3}")
    } else {
        let decimals = ((-a.log10()).floor() as usize + 4).min(12);
        format!("{v:.decimals$}")
    }
}

fn or_null<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

/// A number as C's `printf("%g")` prints it (what nccl-tests' `Avg bus bandwidth` line uses):
/// six significant digits, trailing zeros dropped, an exponent below 1e-4 and from 1e6.
pub fn c_g(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_nan() {
            "nan".into()
        } else if v.is_infinite() {
            if v > 0.0 { "inf".into() } else { "-inf".into() }
        } else {
            "0".into()
        };
    }
    // The exponent after rounding to six significant digits (9.999995 is 10 in `%g`).
    let sci = format!("{v:.5e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let trim = |t: &str| -> String {
        if t.contains('.') {
            t.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            t.to_string()
        }
    };
    if !(-4..6).contains(&exp) {
        format!(
            "{}e{}{:02}",
            trim(mantissa),
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        )
    } else {
        let decimals = (5 - exp).max(0) as usize;
        trim(&format!("{v:.decimals$}"))
    }
}

/// The document `-J FILE` writes: nccl-tests' top-level shape (a `results` list, then
/// `out_of_bounds` and `average_bus_bandwidth`), with this tool's `meta` object and its row keys.
/// Each result carries nccl-tests' keys as well (`redop`, `out_of_place` with `time`, `alg_bw`,
/// `bus_bw`, `nwrong`; `in_place` null: we measure out of place only), so that scripts written
/// for nccl-tests' files read ours. The file is rewritten after every row: a run cut short
/// leaves a valid document of the rows so far (without `end_unix_time`).
#[derive(Debug)]
pub struct JsonDoc {
    path: PathBuf,
    root: Map<String, Value>,
    results: Vec<Value>,
    /// The first write error, said once (a run does not stop for its report).
    failed: bool,
}

impl JsonDoc {
    /// Creates the file as nccl-tests does: never over an existing file — `FILE.0`, `FILE.1`, …
    /// instead — and says which (the caller prints `# Writing JSON output to …`).
    pub fn create(path: &Path, meta: Value) -> Result<JsonDoc, String> {
        let mut candidate = path.to_path_buf();
        let mut k = 0u32;
        let file = loop {
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&candidate)
            {
                Ok(f) => break f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && k < 1000 => {
                    let mut name = path.as_os_str().to_owned();
                    name.push(format!(".{k}"));
                    candidate = PathBuf::from(name);
                    k += 1;
                }
                Err(e) => return Err(format!("-J {}: {e}", candidate.display())),
            }
        };
        drop(file);
        let mut root = Map::new();
        root.insert("tool".into(), "mscclpp-perf".into());
        root.insert(
            "args".into(),
            Value::from(std::env::args().collect::<Vec<_>>()),
        );
        if let Some(m) = meta.get("meta") {
            root.insert("meta".into(), m.clone());
        }
        let doc = JsonDoc {
            path: candidate,
            root,
            results: Vec::new(),
            failed: false,
        };
        let mut doc = doc;
        doc.write();
        if doc.failed {
            return Err(format!("-J {}: cannot write", doc.path.display()));
        }
        Ok(doc)
    }

    /// Where it is written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Adds a row (its JSON-lines object) with nccl-tests' keys beside ours.
    pub fn push(&mut self, json_line: &str, r: &Row) {
        let mut v: Value = match serde_json::from_str(json_line) {
            Ok(v) => v,
            Err(_) => return,
        };
        if let Some(o) = v.as_object_mut() {
            o.insert("redop".into(), r.op.into());
            o.insert(
                "out_of_place".into(),
                serde_json::json!({
                    "time": r.time_us,
                    "alg_bw": r.algbw_gbps,
                    "bus_bw": r.busbw_gbps,
                    "nwrong": r.wrong,
                }),
            );
            o.insert("in_place".into(), Value::Null);
        }
        self.results.push(v);
        self.write();
    }

    /// Adds a row as it is (benchmarks of their own keys: overlap).
    pub fn push_value(&mut self, v: Value) {
        self.results.push(v);
        self.write();
    }

    /// nccl-tests' closing keys, the end time, and the last write.
    pub fn finish(&mut self, wrong: u64, avg_busbw: f64) {
        self.root.insert(
            "out_of_bounds".into(),
            serde_json::json!({"count": wrong, "okay": wrong == 0}),
        );
        self.root.insert(
            "average_bus_bandwidth".into(),
            serde_json::json!({"bandwidth": avg_busbw, "okay": "unchecked"}),
        );
        let unix = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        self.root.insert("end_unix_time".into(), unix.into());
        self.write();
    }

    fn write(&mut self) {
        let mut root = self.root.clone();
        root.insert("results".into(), Value::from(self.results.clone()));
        let text = serde_json::to_string_pretty(&Value::Object(root)).unwrap_or_default();
        if let Err(e) = std::fs::write(&self.path, text + "\n") {
            if !self.failed {
                eprintln!("mscclpp-perf: -J {}: {e}", self.path.display());
            }
            self.failed = true;
        }
    }
}

impl Table {
    /// A table that prints only when `enabled`; `baseline` adds the columns of one baseline,
    /// `nccl` (`with_baselines` names others).
    pub fn new(json: JsonOut, enabled: bool, baseline: bool) -> Self {
        let (lines, json_file) = match json {
            JsonOut::Off => (false, None),
            JsonOut::Lines => (true, None),
            JsonOut::File(f) => (false, Some(f)),
        };
        Table {
            json: lines,
            json_file,
            doc: None,
            enabled,
            baseline,
            baseline_names: vec!["nccl"],
            algo: false,
            cpu: false,
            wrong_total: 0,
            busbw_sum: 0.0,
            rows: 0,
        }
    }

    /// Adds the algorithm column (`Row::algo`).
    pub fn with_algo(mut self) -> Self {
        self.algo = true;
        self
    }

    /// Adds the host-time columns (`Row::cpu_us`, `Baseline::cpu_us`).
    pub fn with_cpu(mut self) -> Self {
        self.cpu = true;
        self
    }

    /// The run's description: a comment, and under `-J -` the `{"meta":...}` line first on
    /// standard output (the command, the machine, the backend and device, the timing); under
    /// `-J FILE` the file is created here (an error if it cannot be) with the same meta object.
    pub fn preamble(&mut self, text: &str, meta: &Meta) -> mscclpp::hal::Result<()> {
        if !self.enabled {
            return Ok(());
        }
        let line = meta_line(text, meta, &command_line(), &machine());
        if self.json {
            self.out(&line);
        }
        if let Some(file) = &self.json_file {
            let meta: Value = serde_json::from_str(&line)
                .map_err(|e| mscclpp::hal::Error::Internal(format!("meta line: {e}")))?;
            let doc = JsonDoc::create(file, meta).map_err(mscclpp::hal::Error::invalid)?;
            self.comment(&format!("Writing JSON output to {}", doc.path().display()));
            self.doc = Some(doc);
        }
        self.comment(text);
        // Two comments: wrapped, the command then starts a line of its own.
        self.comment(&format!("machine: {}", machine()));
        self.comment(&format!("command: {}", command_line()));
        Ok(())
    }

    /// The legend: what each column means, once per run, after the preamble.
    pub fn legend(&self, lines: &[String]) {
        for l in lines {
            self.comment(l);
        }
    }

    /// Names every baseline, in column order, in place of the default one; a row gives their
    /// figures in the same order (`row_with`). None: no baseline columns and no JSON key.
    pub fn with_baselines(mut self, names: &[&'static str]) -> Self {
        self.baseline = !names.is_empty();
        self.baseline_names = names.to_vec();
        self
    }

    fn out(&self, line: &str) {
        if self.enabled {
            // Unit tests print through the harness's capture (it takes `print!` only).
            #[cfg(test)]
            println!("{line}");
            // A closed pipe (`| head`) is no reason to stop a run: errors are ignored.
            #[cfg(not(test))]
            {
                use std::io::Write;
                let mut o = std::io::stdout().lock();
                let _ = writeln!(o, "{line}");
                let _ = o.flush();
            }
        }
    }

    /// A `#` comment, wrapped at [`WIDTH`] characters.
    pub fn comment(&self, text: &str) {
        if !self.enabled {
            return;
        }
        for line in wrap_comment(text) {
            if self.json {
                eprintln!("{line}");
            } else {
                self.out(&line);
            }
        }
    }

    /// Column titles (table mode only).
    pub fn header(&self) {
        for line in self.header_lines() {
            self.out(&line);
        }
    }

    /// The two title lines of table mode (none under `-J`).
    fn header_lines(&self) -> Vec<String> {
        if self.json {
            return Vec::new();
        }
        let mut titles = format!(
            "# {:>12} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8}",
            "size(B)", "count", "type", "op", "time(us)", "algbw", "busbw", "#wrong"
        );
        let mut units = format!(
            "# {:>12} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8}",
            "", "(elements)", "", "", "", "(GB/s)", "(GB/s)", ""
        );
        if self.algo {
            titles += &format!(" {:>8}", "algo");
            units += &format!(" {:>8}", "");
        }
        if self.cpu {
            titles += &format!(" {:>8}", "cpu(us)");
            units += &format!(" {:>8}", "");
        }
        if self.baseline {
            for name in &self.baseline_names {
                titles += &format!(
                    " | {:>10} {:>9} {:>9} {:>8} {:>8}",
                    format!("{name}(us)"),
                    "algbw",
                    "busbw",
                    "#wrong",
                    "speedup"
                );
                units += &format!(
                    " | {:>10} {:>9} {:>9} {:>8} {:>8}",
                    "", "(GB/s)", "(GB/s)", "", "(x)"
                );
                if self.cpu {
                    titles += &format!(" {:>8}", "cpu(us)");
                    units += &format!(" {:>8}", "");
                }
            }
        }
        vec![titles, units]
    }

    /// One row; `r.baseline` fills the first baseline's columns.
    pub fn row(&mut self, r: &Row) {
        self.row_with(r, &[]);
    }

    /// One row of a table of several baselines: `r.baseline` fills the first one's columns,
    /// `more` the following ones' in their order (a missing one shows `-` and `null`).
    pub fn row_with(&mut self, r: &Row, more: &[Option<Baseline>]) {
        let line = self.row_line(r, more);
        self.out(&line);
        if self.enabled && self.doc.is_some() {
            let json = self.json_line(r, more);
            if let Some(doc) = self.doc.as_mut() {
                doc.push(&json, r);
            }
        }
    }

    /// Counts the row's wrong elements and bus bandwidth and formats it.
    fn row_line(&mut self, r: &Row, more: &[Option<Baseline>]) -> String {
        self.wrong_total += r.wrong.unwrap_or(0)
            + std::iter::once(r.baseline)
                .chain(more.iter().copied())
                .map(|b| b.map_or(0, |b| b.wrong))
                .sum::<u64>();
        self.busbw_sum += r.busbw_gbps;
        self.rows += 1;
        if self.json {
            self.json_line(r, more)
        } else {
            self.table_line(r, more)
        }
    }

    /// The row as one JSON object (a line of `-J -`, an element of `-J FILE`'s results).
    fn json_line(&self, r: &Row, more: &[Option<Baseline>]) -> String {
        let figures: Vec<Option<Baseline>> = std::iter::once(r.baseline)
            .chain(more.iter().copied())
            .collect();
        let figure = |k: usize| figures.get(k).copied().flatten();
        let mut line = format!(
            "{{\"bench\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{}\",\"op\":\"{}\",\"root\":{},\"nranks\":{},\"time_us\":{},\"algbw\":{},\"busbw\":{},\"wrong\":{}",
            r.bench,
            r.bytes,
            r.count,
            r.dtype,
            r.op,
            or_null(r.root),
            r.nranks,
            jnum(r.time_us),
            jnum(r.algbw_gbps),
            jnum(r.busbw_gbps),
            or_null(r.wrong),
        );
        if self.algo {
            line += &format!(",\"algo\":{}", or_null(r.algo.map(|a| format!("\"{a}\""))));
        }
        let cpu_key = |c: Option<f64>| {
            if self.cpu {
                format!(",\"cpu_us\":{}", or_null(c.map(jnum)))
            } else {
                String::new()
            }
        };
        line += &cpu_key(r.cpu_us);
        for (k, name) in self.baseline_names.iter().enumerate() {
            let value = figure(k).map_or("null".to_string(), |b| {
                format!(
                    "{{\"time_us\":{},\"algbw\":{},\"busbw\":{},\"wrong\":{}{}}}",
                    jnum(b.time_us),
                    jnum(b.algbw_gbps),
                    jnum(b.busbw_gbps),
                    b.wrong,
                    cpu_key(b.cpu_us)
                )
            });
            line += &format!(",\"{name}\":{value}");
        }
        line.push('}');
        line
    }

    /// The row as a line of the table.
    fn table_line(&self, r: &Row, more: &[Option<Baseline>]) -> String {
        let figures: Vec<Option<Baseline>> = std::iter::once(r.baseline)
            .chain(more.iter().copied())
            .collect();
        let figure = |k: usize| figures.get(k).copied().flatten();
        let mut line = format!(
            "  {:>12} {:>12} {:>9} {:>6} {} {} {} {:>8}",
            r.bytes,
            r.count,
            r.dtype,
            r.op,
            fig(r.time_us, 10),
            fig(r.algbw_gbps, 9),
            fig(r.busbw_gbps, 9),
            r.wrong.map_or("N/A".to_string(), |w| w.to_string())
        );
        if self.algo {
            line += &format!(" {:>8}", r.algo.unwrap_or("-"));
        }
        let cpu_col = |c: Option<f64>| {
            if self.cpu {
                c.map_or(format!(" {:>8}", "-"), |c| format!(" {}", fig(c, 8)))
            } else {
                String::new()
            }
        };
        line += &cpu_col(r.cpu_us);
        if self.baseline {
            for k in 0..self.baseline_names.len() {
                line += &match figure(k) {
                    Some(b) => format!(
                        " | {} {} {} {:>8} {:>8.2}{}",
                        fig(b.time_us, 10),
                        fig(b.algbw_gbps, 9),
                        fig(b.busbw_gbps, 9),
                        b.wrong,
                        b.time_us / r.time_us,
                        cpu_col(b.cpu_us)
                    ),
                    None => format!(
                        " | {:>10} {:>9} {:>9} {:>8} {:>8}{}",
                        "-",
                        "-",
                        "-",
                        "-",
                        "-",
                        cpu_col(None)
                    ),
                };
            }
        }
        line
    }

    /// The closing lines: wrong values over every row and rank (the baselines' included), then
    /// nccl-tests' two summary lines, spelled as nccl-tests prints them (scripts parse them):
    /// `# Out of bounds values : N OK|FAILED` and `# Avg bus bandwidth    : X` (the mean of our
    /// rows' busbw, GB/s, as `%g` prints it). Under `-J FILE` the document gets the same two
    /// figures (nccl-tests' keys) and is written a last time.
    pub fn footer(&mut self) {
        for line in self.footer_lines() {
            if !self.enabled {
                break;
            }
            if self.json {
                eprintln!("{line}");
            } else {
                self.out(&line);
            }
        }
        let (wrong, avg) = (self.wrong_total, self.avg_busbw());
        if let Some(doc) = self.doc.as_mut() {
            doc.finish(wrong, avg);
        }
    }

    /// nccl-tests' average bus bandwidth: the mean over the rows (0 without rows).
    fn avg_busbw(&self) -> f64 {
        if self.rows == 0 {
            0.0
        } else {
            self.busbw_sum / self.rows as f64
        }
    }

    fn footer_lines(&self) -> Vec<String> {
        let mut lines = wrap_comment(&self.footer_text());
        lines.push(format!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            self.wrong_total,
            if self.wrong_total == 0 {
                "OK"
            } else {
                "FAILED"
            }
        ));
        lines.push(format!(
            "# {:<20} : {}",
            "Avg bus bandwidth",
            c_g(self.avg_busbw())
        ));
        lines
    }

    fn footer_text(&self) -> String {
        format!(
            "wrong values (all ranks{}): {} {}",
            match (self.baseline, self.baseline_names.len()) {
                (false, _) | (true, 0) => "",
                (true, 1) => ", ours and the baseline's",
                (true, _) => ", ours and the baselines'",
            },
            self.wrong_total,
            if self.wrong_total == 0 {
                "OK"
            } else {
                "FAILED"
            }
        )
    }

    /// Counts wrong elements found outside the rows (an untimed pass).
    pub fn count_wrong(&mut self, wrong: u64) {
        self.wrong_total += wrong;
    }

    /// Wrong elements over all rows.
    pub fn wrong_total(&self) -> u64 {
        self.wrong_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(baseline: Option<Baseline>) -> Row {
        Row {
            bench: "allreduce",
            bytes: 1048576,
            count: 262144,
            dtype: "float",
            op: "sum",
            root: Some(0),
            nranks: 2,
            time_us: 7.5,
            cpu_us: None,
            algbw_gbps: 139.81,
            busbw_gbps: 139.81,
            wrong: Some(0),
            baseline,
            algo: None,
        }
    }

    const B: Baseline = Baseline {
        time_us: 11.25,
        cpu_us: None,
        algbw_gbps: 93.21,
        busbw_gbps: 93.21,
        wrong: 3,
    };

    const N: Baseline = Baseline {
        time_us: 15.0,
        cpu_us: None,
        algbw_gbps: 69.9,
        busbw_gbps: 69.9,
        wrong: 0,
    };

    /// Everything a table prints, header to footer.
    fn lines(mut t: Table, rows: &[(Row, Vec<Option<Baseline>>)]) -> Vec<String> {
        let mut v = t.header_lines();
        for (r, more) in rows {
            v.push(t.row_line(r, more));
        }
        v.push(format!("# {}", t.footer_text()));
        v
    }

    /// The tables of one and of no baseline print what they printed before several baselines
    /// existed (the lines below were printed by that code).
    #[test]
    fn one_baseline_prints_as_before() {
        let text = lines(
            Table::new(JsonOut::Off, true, true),
            &[(row(Some(B)), vec![]), (row(None), vec![])],
        );
        assert_eq!(
            text,
            [
                "#      size(B)        count      type     op   time(us)     algbw     busbw   #wrong |   nccl(us)     algbw     busbw   #wrong  speedup",
                "#                (elements)                                (GB/s)    (GB/s)          |               (GB/s)    (GB/s)               (x)",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0 |      11.25     93.21     93.21        3     1.50",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0 |          -         -         -        -        -",
                "# wrong values (all ranks, ours and the baseline's): 3 FAILED",
            ]
        );
        let text = lines(
            Table::new(JsonOut::Off, true, false),
            &[(row(None), vec![])],
        );
        assert_eq!(
            text,
            [
                "#      size(B)        count      type     op   time(us)     algbw     busbw   #wrong",
                "#                (elements)                                (GB/s)    (GB/s)         ",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0",
                "# wrong values (all ranks): 0 OK",
            ]
        );
        let json = lines(
            Table::new(JsonOut::Lines, true, false),
            &[(row(None), vec![])],
        );
        assert_eq!(
            json,
            [
                r#"{"bench":"allreduce","size":1048576,"count":262144,"type":"float","op":"sum","root":0,"nranks":2,"time_us":7.500,"algbw":139.810,"busbw":139.810,"wrong":0,"nccl":null}"#,
                "# wrong values (all ranks): 0 OK",
            ]
        );
        let json = lines(
            Table::new(JsonOut::Lines, true, true).with_baselines(&["builtin"]),
            &[(
                Row {
                    root: None,
                    wrong: None,
                    ..row(Some(B))
                },
                vec![],
            )],
        );
        assert_eq!(
            json,
            [
                r#"{"bench":"allreduce","size":1048576,"count":262144,"type":"float","op":"sum","root":null,"nranks":2,"time_us":7.500,"algbw":139.810,"busbw":139.810,"wrong":null,"builtin":{"time_us":11.250,"algbw":93.210,"busbw":93.210,"wrong":3}}"#,
                "# wrong values (all ranks, ours and the baseline's): 3 FAILED",
            ]
        );
    }

    /// The algorithm column and key; small figures keep three significant digits (they printed
    /// as zero before); the meta line is one JSON object.
    #[test]
    fn algorithm_column_small_figures_and_meta() {
        let r = Row {
            algo: Some("ll-short"),
            time_us: 12.5,
            cpu_us: None,
            algbw_gbps: 0.000_82,
            busbw_gbps: 0.0164,
            ..row(None)
        };
        let text = lines(
            Table::new(JsonOut::Off, true, false).with_algo(),
            &[(r.clone(), vec![])],
        );
        assert_eq!(
            &text[..3],
            [
                "#      size(B)        count      type     op   time(us)     algbw     busbw   #wrong     algo",
                "#                (elements)                                (GB/s)    (GB/s)                  ",
                "       1048576       262144     float    sum      12.50  0.000820    0.0164        0 ll-short",
            ]
        );
        let json = lines(
            Table::new(JsonOut::Lines, true, false).with_algo(),
            &[(r, vec![])],
        );
        assert!(
            json[0].contains(r#""wrong":0,"algo":"ll-short","nccl":null}"#),
            "{}",
            json[0]
        );
        let meta = Meta {
            bench: "allreduce",
            backend: "host".into(),
            device: "cpu".into(),
            nranks: 2,
            timing: "eager launches".into(),
        };
        let line = meta_line("title", &meta, "mscclpp-perf -J", "box, 2 cores");
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["meta"]["command"], "mscclpp-perf -J");
        assert_eq!(v["meta"]["machine"], "box, 2 cores");
        assert_eq!(v["meta"]["nranks"], 2);
        assert_eq!(fig(0.0, 6), "  0.00");
        assert_eq!(fig(123.456, 8), "  123.46");
    }

    #[test]
    fn two_named_baselines_get_columns_and_keys_in_order() {
        let table = || Table::new(JsonOut::Off, true, true).with_baselines(&["builtin", "nccl"]);
        let text = lines(
            table(),
            &[(row(Some(B)), vec![Some(N)]), (row(Some(B)), vec![None])],
        );
        assert_eq!(
            text,
            [
                "#      size(B)        count      type     op   time(us)     algbw     busbw   #wrong | builtin(us)     algbw     busbw   #wrong  speedup |   nccl(us)     algbw     busbw   #wrong  speedup",
                "#                (elements)                                (GB/s)    (GB/s)          |               (GB/s)    (GB/s)               (x) |               (GB/s)    (GB/s)               (x)",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0 |      11.25     93.21     93.21        3     1.50 |      15.00     69.90     69.90        0     2.00",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0 |      11.25     93.21     93.21        3     1.50 |          -         -         -        -        -",
                "# wrong values (all ranks, ours and the baselines'): 6 FAILED",
            ]
        );
        // The second baseline's wrong values count too.
        let text = lines(
            table(),
            &[(row(Some(N)), vec![Some(Baseline { wrong: 5, ..N })])],
        );
        assert_eq!(
            text.last().map(String::as_str),
            Some("# wrong values (all ranks, ours and the baselines'): 5 FAILED")
        );
        let json = lines(
            Table::new(JsonOut::Lines, true, true).with_baselines(&["builtin", "nccl"]),
            &[(row(Some(B)), vec![Some(N)]), (row(Some(B)), vec![])],
        );
        assert_eq!(
            json,
            [
                r#"{"bench":"allreduce","size":1048576,"count":262144,"type":"float","op":"sum","root":0,"nranks":2,"time_us":7.500,"algbw":139.810,"busbw":139.810,"wrong":0,"builtin":{"time_us":11.250,"algbw":93.210,"busbw":93.210,"wrong":3},"nccl":{"time_us":15.000,"algbw":69.900,"busbw":69.900,"wrong":0}}"#,
                r#"{"bench":"allreduce","size":1048576,"count":262144,"type":"float","op":"sum","root":0,"nranks":2,"time_us":7.500,"algbw":139.810,"busbw":139.810,"wrong":0,"builtin":{"time_us":11.250,"algbw":93.210,"busbw":93.210,"wrong":3},"nccl":null}"#,
                "# wrong values (all ranks, ours and the baselines'): 6 FAILED",
            ]
        );
    }

    /// nccl-tests' two summary lines, spelled as it prints them; the average is the mean of
    /// our rows' busbw (139.81 and 69.9 here), as `%g` writes it.
    #[test]
    fn footer_has_nccl_tests_summary_lines() {
        let mut t = Table::new(JsonOut::Off, true, false);
        t.row_line(&row(None), &[]);
        t.row_line(
            &Row {
                busbw_gbps: 69.9,
                wrong: Some(2),
                ..row(None)
            },
            &[],
        );
        assert_eq!(
            t.footer_lines(),
            [
                "# wrong values (all ranks): 2 FAILED",
                "# Out of bounds values : 2 FAILED",
                "# Avg bus bandwidth    : 104.855",
            ]
        );
        let empty = Table::new(JsonOut::Off, true, false);
        assert_eq!(empty.footer_lines()[1], "# Out of bounds values : 0 OK");
        assert_eq!(empty.footer_lines()[2], "# Avg bus bandwidth    : 0");
        for (v, want) in [
            (104.855, "104.855"),
            (1.0, "1"),
            (0.000123456, "0.000123456"),
            (0.0000123456, "1.23456e-05"),
            (1234567.0, "1.23457e+06"),
            (999999.5, "1e+06"),
            (12.3456789, "12.3457"),
        ] {
            assert_eq!(c_g(v), want, "{v}");
        }
    }

    /// Comments wrap at WIDTH characters at spaces, continuation lines indented; a word longer
    /// than a line stays whole.
    #[test]
    fn comments_wrap_at_the_width() {
        let text = "word ".repeat(60);
        let lines = wrap_comment(text.trim());
        assert!(lines.len() > 2, "{lines:?}");
        assert!(
            lines.iter().all(|l| l.chars().count() <= WIDTH),
            "{lines:?}"
        );
        assert!(lines[1].starts_with("#   word"), "{lines:?}");
        let joined: Vec<&str> = lines
            .iter()
            .flat_map(|l| l.trim_start_matches('#').split_whitespace())
            .collect();
        assert_eq!(joined.len(), 60);
        let long = format!("a {} b", "x".repeat(150));
        let lines = wrap_comment(&long);
        assert_eq!(lines, ["# a", &format!("#   {}", "x".repeat(150)), "#   b"]);
        assert_eq!(wrap_comment("short"), ["# short"]);
    }

    /// `-J FILE`: one JSON document with the rows (our keys and nccl-tests'), the summary, and
    /// never over an existing file (nccl-tests' FILE.0, FILE.1).
    #[test]
    fn json_file_is_one_document_beside_the_table() {
        let dir = std::env::temp_dir().join(format!("mscclpp-perf-doc-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("out.json");
        let meta = Meta {
            bench: "allreduce",
            backend: "host".into(),
            device: "cpu".into(),
            nranks: 2,
            timing: "eager launches".into(),
        };
        let run = |t: &mut Table| {
            t.preamble("title", &meta).unwrap();
            t.row(&row(None));
            t.row(&Row {
                wrong: Some(3),
                ..row(None)
            });
            t.footer();
        };
        let mut first = Table::new(JsonOut::File(file.clone()), true, false);
        run(&mut first);
        let mut second = Table::new(JsonOut::File(file.clone()), true, false);
        run(&mut second);
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let again = std::fs::read_to_string(dir.join("out.json.0")).unwrap_or_default();
        let missing = Table::new(JsonOut::File(dir.join("no/such/dir/x.json")), true, false)
            .preamble("title", &meta);
        let _ = std::fs::remove_dir_all(&dir);
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["meta"]["bench"], "allreduce");
        assert_eq!(v["results"].as_array().map(Vec::len), Some(2));
        assert_eq!(v["results"][0]["busbw"], 139.81);
        assert_eq!(v["results"][0]["out_of_place"]["bus_bw"], 139.81);
        assert_eq!(v["results"][1]["out_of_place"]["nwrong"], 3);
        assert_eq!(v["results"][0]["redop"], "sum");
        assert_eq!(v["out_of_bounds"]["count"], 3);
        assert_eq!(v["out_of_bounds"]["okay"], false);
        assert_eq!(v["average_bus_bandwidth"]["bandwidth"], 139.81);
        let w: Value = serde_json::from_str(&again).unwrap();
        assert_eq!(w["results"].as_array().map(Vec::len), Some(2));
        let e = missing.unwrap_err().to_string();
        assert!(e.contains("no/such/dir/x.json"), "{e}");
    }
}
