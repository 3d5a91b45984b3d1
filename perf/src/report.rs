//! Output of every benchmark: the nccl-tests table, or JSON lines with `-J` (one key scheme for
//! all of them). Comments — the preamble and the footer — go to standard output with the table
//! and to standard error under `-J`, so that standard output stays pure JSON. Rows are flushed
//! as measured; rank 0 prints.

use std::io::Write;

/// The baseline library's figures for one row.
#[derive(Debug, Clone, Copy)]
pub struct Baseline {
    /// Time per operation (slowest rank), microseconds.
    pub time_us: f64,
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
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements over all ranks, when checked.
    pub wrong: Option<u64>,
    /// The baseline's figures, when one runs.
    pub baseline: Option<Baseline>,
}

/// Prints rows on rank 0 only.
#[derive(Debug)]
pub struct Table {
    json: bool,
    enabled: bool,
    /// Whether rows carry a baseline (its columns are shown only then).
    baseline: bool,
    /// The baseline's name: its time column's title and its JSON key.
    baseline_name: &'static str,
    wrong_total: u64,
}

fn or_null<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

impl Table {
    /// A table that prints only when `enabled`; `baseline` adds the baseline's columns.
    pub fn new(json: bool, enabled: bool, baseline: bool) -> Self {
        Table {
            json,
            enabled,
            baseline,
            baseline_name: "nccl",
            wrong_total: 0,
        }
    }

    /// Names the baseline (`nccl` by default).
    pub fn with_baseline_name(mut self, name: &'static str) -> Self {
        self.baseline_name = name;
        self
    }

    fn out(&self, line: &str) {
        if self.enabled {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        }
    }

    /// A `#` comment line.
    pub fn comment(&self, text: &str) {
        if !self.enabled {
            return;
        }
        if self.json {
            eprintln!("# {text}");
        } else {
            self.out(&format!("# {text}"));
        }
    }

    /// Column titles (table mode only).
    pub fn header(&self) {
        if self.json {
            return;
        }
        let mut titles = format!(
            "# {:>12} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8}",
            "size(B)", "count", "type", "op", "time(us)", "algbw", "busbw", "#wrong"
        );
        let mut units = format!(
            "# {:>12} {:>12} {:>9} {:>6} {:>10} {:>9} {:>9} {:>8}",
            "", "(elements)", "", "", "", "(GB/s)", "(GB/s)", ""
        );
        if self.baseline {
            titles += &format!(
                " | {:>10} {:>9} {:>9} {:>8} {:>8}",
                format!("{}(us)", self.baseline_name),
                "algbw",
                "busbw",
                "#wrong",
                "speedup"
            );
            units += &format!(
                " | {:>10} {:>9} {:>9} {:>8} {:>8}",
                "", "(GB/s)", "(GB/s)", "", "(x)"
            );
        }
        self.out(&titles);
        self.out(&units);
    }

    /// One row.
    pub fn row(&mut self, r: &Row) {
        self.wrong_total += r.wrong.unwrap_or(0) + r.baseline.map_or(0, |b| b.wrong);
        if self.json {
            let baseline = r.baseline.map_or("null".to_string(), |b| {
                format!(
                    "{{\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{}}}",
                    b.time_us, b.algbw_gbps, b.busbw_gbps, b.wrong
                )
            });
            self.out(&format!(
                "{{\"bench\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{}\",\"op\":\"{}\",\"root\":{},\"nranks\":{},\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{},\"{}\":{baseline}}}",
                r.bench,
                r.bytes,
                r.count,
                r.dtype,
                r.op,
                or_null(r.root),
                r.nranks,
                r.time_us,
                r.algbw_gbps,
                r.busbw_gbps,
                or_null(r.wrong),
                self.baseline_name,
            ));
            return;
        }
        let mut line = format!(
            "  {:>12} {:>12} {:>9} {:>6} {:>10.2} {:>9.2} {:>9.2} {:>8}",
            r.bytes,
            r.count,
            r.dtype,
            r.op,
            r.time_us,
            r.algbw_gbps,
            r.busbw_gbps,
            r.wrong.map_or("N/A".to_string(), |w| w.to_string())
        );
        if self.baseline {
            line += &match r.baseline {
                Some(b) => format!(
                    " | {:>10.2} {:>9.2} {:>9.2} {:>8} {:>8.2}",
                    b.time_us,
                    b.algbw_gbps,
                    b.busbw_gbps,
                    b.wrong,
                    b.time_us / r.time_us
                ),
                None => format!(" | {:>10} {:>9} {:>9} {:>8} {:>8}", "-", "-", "-", "-", "-"),
            };
        }
        self.out(&line);
    }

    /// The closing line: wrong values over every row and rank (the baseline's included).
    pub fn footer(&self) {
        self.comment(&format!(
            "wrong values (all ranks{}): {} {}",
            if self.baseline {
                ", ours and the baseline's"
            } else {
                ""
            },
            self.wrong_total,
            if self.wrong_total == 0 {
                "OK"
            } else {
                "FAILED"
            }
        ));
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
