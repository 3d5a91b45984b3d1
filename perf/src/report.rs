//! Output: the nccl-tests table, or JSON lines with `-J`. Rows are flushed as measured.

use std::io::Write;

/// One measured row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Benchmark name.
    pub bench: &'static str,
    /// Message size in bytes.
    pub bytes: usize,
    /// Element count.
    pub count: usize,
    /// Element type.
    pub dtype: &'static str,
    /// Operation.
    pub op: &'static str,
    /// Time per operation (slowest rank), microseconds.
    pub time_us: f64,
    /// Algorithm bandwidth, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s.
    pub busbw_gbps: f64,
    /// Wrong elements over all ranks, when checked.
    pub wrong: Option<u64>,
}

/// Prints rows on rank 0 only.
#[derive(Debug)]
pub struct Table {
    json: bool,
    enabled: bool,
    wrong_total: u64,
}

impl Table {
    /// A table that prints only when `enabled`.
    pub fn new(json: bool, enabled: bool) -> Self {
        Table {
            json,
            enabled,
            wrong_total: 0,
        }
    }

    fn out(&self, line: &str) {
        if self.enabled {
            let mut o = std::io::stdout().lock();
            let _ = writeln!(o, "{line}");
            let _ = o.flush();
        }
    }

    /// A `#` comment line (table mode only).
    pub fn preamble(&self, text: &str) {
        if !self.json {
            self.out(&format!("# {text}"));
        }
    }

    /// Column titles.
    pub fn header(&self) {
        if !self.json {
            self.out(&format!(
                "#\n# {:>12} {:>12} {:>6} {:>6} {:>10} {:>9} {:>9} {:>8}",
                "size(B)", "count", "type", "op", "time(us)", "algbw", "busbw", "#wrong"
            ));
            self.out(&format!(
                "# {:>12} {:>12} {:>6} {:>6} {:>10} {:>9} {:>9} {:>8}",
                "", "(elements)", "", "", "", "(GB/s)", "(GB/s)", ""
            ));
        }
    }

    /// One row.
    pub fn row(&mut self, r: &Row) {
        self.wrong_total += r.wrong.unwrap_or(0);
        let wrong = r.wrong.map_or("N/A".to_string(), |w| w.to_string());
        if self.json {
            self.out(&format!(
                "{{\"bench\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{}\",\"op\":\"{}\",\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{}}}",
                r.bench,
                r.bytes,
                r.count,
                r.dtype,
                r.op,
                r.time_us,
                r.algbw_gbps,
                r.busbw_gbps,
                r.wrong.map_or("null".to_string(), |w| w.to_string())
            ));
        } else {
            self.out(&format!(
                "  {:>12} {:>12} {:>6} {:>6} {:>10.2} {:>9.2} {:>9.2} {:>8}",
                r.bytes, r.count, r.dtype, r.op, r.time_us, r.algbw_gbps, r.busbw_gbps, wrong
            ));
        }
    }

    /// Closing line.
    pub fn footer(&self) {
        if !self.json {
            self.out(&format!(
                "# Out of bounds values : {} {}",
                self.wrong_total,
                if self.wrong_total == 0 {
                    "OK"
                } else {
                    "FAILED"
                }
            ));
        }
    }

    /// Wrong elements over all rows.
    pub fn wrong_total(&self) -> u64 {
        self.wrong_total
    }
}
