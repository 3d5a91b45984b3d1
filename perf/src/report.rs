//! Output of every benchmark: the nccl-tests table, or JSON lines with `-J` (one key scheme for
//! all of them). Comments — the preamble and the footer — go to standard output with the table
//! and to standard error under `-J`, so that standard output stays pure JSON. Rows are flushed
//! as measured; rank 0 prints.

use std::io::Write;

/// A baseline's figures for one row.
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
    /// Whether rows carry baselines (their columns are shown only then).
    baseline: bool,
    /// The baselines' names, in column order: each one's time column title and JSON key. A
    /// table without baselines keeps its one name for the JSON key (`"nccl":null`), which
    /// readers of the collective benchmarks' lines expect.
    baseline_names: Vec<&'static str>,
    wrong_total: u64,
}

fn or_null<T: ToString>(v: Option<T>) -> String {
    v.map_or("null".to_string(), |v| v.to_string())
}

impl Table {
    /// A table that prints only when `enabled`; `baseline` adds the columns of one baseline,
    /// `nccl` (`with_baselines` names others).
    pub fn new(json: bool, enabled: bool, baseline: bool) -> Self {
        Table {
            json,
            enabled,
            baseline,
            baseline_names: vec!["nccl"],
            wrong_total: 0,
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
    }

    /// Counts the row's wrong elements and formats it.
    fn row_line(&mut self, r: &Row, more: &[Option<Baseline>]) -> String {
        let figures: Vec<Option<Baseline>> = std::iter::once(r.baseline)
            .chain(more.iter().copied())
            .collect();
        let figure = |k: usize| figures.get(k).copied().flatten();
        self.wrong_total += r.wrong.unwrap_or(0)
            + figures
                .iter()
                .map(|b| b.map_or(0, |b| b.wrong))
                .sum::<u64>();
        if self.json {
            let mut line = format!(
                "{{\"bench\":\"{}\",\"size\":{},\"count\":{},\"type\":\"{}\",\"op\":\"{}\",\"root\":{},\"nranks\":{},\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{}",
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
            );
            for (k, name) in self.baseline_names.iter().enumerate() {
                let value = figure(k).map_or("null".to_string(), |b| {
                    format!(
                        "{{\"time_us\":{:.3},\"algbw\":{:.3},\"busbw\":{:.3},\"wrong\":{}}}",
                        b.time_us, b.algbw_gbps, b.busbw_gbps, b.wrong
                    )
                });
                line += &format!(",\"{name}\":{value}");
            }
            line.push('}');
            return line;
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
            for k in 0..self.baseline_names.len() {
                line += &match figure(k) {
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
        }
        line
    }

    /// The closing line: wrong values over every row and rank (the baselines' included).
    pub fn footer(&self) {
        self.comment(&self.footer_text());
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
            algbw_gbps: 139.81,
            busbw_gbps: 139.81,
            wrong: Some(0),
            baseline,
        }
    }

    const B: Baseline = Baseline {
        time_us: 11.25,
        algbw_gbps: 93.21,
        busbw_gbps: 93.21,
        wrong: 3,
    };

    const N: Baseline = Baseline {
        time_us: 15.0,
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
            Table::new(false, true, true),
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
        let text = lines(Table::new(false, true, false), &[(row(None), vec![])]);
        assert_eq!(
            text,
            [
                "#      size(B)        count      type     op   time(us)     algbw     busbw   #wrong",
                "#                (elements)                                (GB/s)    (GB/s)         ",
                "       1048576       262144     float    sum       7.50    139.81    139.81        0",
                "# wrong values (all ranks): 0 OK",
            ]
        );
        let json = lines(Table::new(true, true, false), &[(row(None), vec![])]);
        assert_eq!(
            json,
            [
                r#"{"bench":"allreduce","size":1048576,"count":262144,"type":"float","op":"sum","root":0,"nranks":2,"time_us":7.500,"algbw":139.810,"busbw":139.810,"wrong":0,"nccl":null}"#,
                "# wrong values (all ranks): 0 OK",
            ]
        );
        let json = lines(
            Table::new(true, true, true).with_baselines(&["builtin"]),
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

    #[test]
    fn two_named_baselines_get_columns_and_keys_in_order() {
        let table = || Table::new(false, true, true).with_baselines(&["builtin", "nccl"]);
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
            Table::new(true, true, true).with_baselines(&["builtin", "nccl"]),
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
}
