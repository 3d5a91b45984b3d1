//! `mscclpp-perf report`: the JSON lines of one or more runs (`-J`) as one self-contained HTML
//! page of SVG plots — bus bandwidth and time per call against the message size (log axes), and
//! NCCL's time over ours where a run had the NCCL baseline — one line per run, benchmark and
//! library, with each run's machine and command in the caption. Drawn by `plotters` with its SVG
//! backend (text as SVG `<text>`, no font rendering).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use mscclpp::hal::{Error, Result};
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use serde_json::Value;

/// One file's run: what its meta line said and its rows.
#[derive(Debug, Default)]
struct Run {
    /// The name its series carry (the file's stem; the path where stems repeat).
    label: String,
    file: PathBuf,
    /// The `meta` object of `-J` output, where the file has one.
    meta: Option<Value>,
    /// (bench, library) -> points (size in bytes, busbw GB/s, time µs).
    series: BTreeMap<(String, String), Vec<Point>>,
    /// Lines that were not rows of a size (overlap's, bootstrap's, comments).
    skipped: usize,
}

#[derive(Debug, Clone, Copy)]
struct Point {
    size: f64,
    busbw: f64,
    time_us: f64,
}

/// One drawn line.
#[derive(Debug)]
struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Where the page goes without `--output`: `mscclpp-perf-report.html` beside the first file
/// (where the run's results are, rather than wherever the command is typed; the repository's
/// .gitignore names the file).
pub fn default_output(files: &[PathBuf]) -> PathBuf {
    let dir = files
        .first()
        .and_then(|f| f.parent())
        .filter(|d| !d.as_os_str().is_empty())
        .map_or_else(PathBuf::new, Path::to_path_buf);
    dir.join(DEFAULT_NAME)
}

/// The page's file name without `--output`.
pub const DEFAULT_NAME: &str = "mscclpp-perf-report.html";

/// The `report` subcommand: reads `files`, writes the page to `output`.
pub fn main(files: &[PathBuf], output: &Path, title: Option<&str>) -> Result<()> {
    let mut runs = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f)
            .map_err(|e| Error::invalid(format!("{}: {e}", f.display())))?;
        runs.push(parse(f, &text)?);
    }
    label_runs(&mut runs);
    let html = render(&runs, title.unwrap_or("mscclpp-perf report"))?;
    std::fs::write(output, &html)
        .map_err(|e| Error::invalid(format!("{}: {e}", output.display())))?;
    let rows: usize = runs
        .iter()
        .flat_map(|r| r.series.values())
        .map(Vec::len)
        .sum();
    println!(
        "mscclpp-perf report: {} ({} KiB) from {} file(s), {rows} points",
        output.display(),
        html.len().div_ceil(1024),
        runs.len()
    );
    Ok(())
}

/// Reads one file: the JSON document of `-J FILE` (its `meta` object and `results` list) or the
/// JSON lines of `-J -` (the meta line, then one row a line). Rows of the collective, channel,
/// p2p and plan benchmarks count (ours under the benchmark's name, each baseline — `nccl`,
/// `builtin` — under its own); other rows and lines are counted and skipped.
fn parse(file: &Path, text: &str) -> Result<Run> {
    let mut run = Run {
        file: file.to_path_buf(),
        ..Run::default()
    };
    // A document parses whole; JSON lines do not (more than one value), and go line by line.
    if let Ok(doc) = serde_json::from_str::<Value>(text) {
        if let Some(results) = doc.get("results").and_then(Value::as_array) {
            run.meta = doc.get("meta").cloned();
            for v in results {
                add_row(&mut run, v);
            }
            sort_points(&mut run);
            return Ok(run);
        }
    }
    for (k, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            run.skipped += usize::from(!line.is_empty());
            continue;
        }
        let v: Value = serde_json::from_str(line).map_err(|e| {
            Error::invalid(format!(
                "{}:{}: not a JSON line of mscclpp-perf -J: {e}",
                file.display(),
                k + 1
            ))
        })?;
        if let Some(meta) = v.get("meta") {
            run.meta.get_or_insert_with(|| meta.clone());
            continue;
        }
        add_row(&mut run, &v);
    }
    sort_points(&mut run);
    Ok(run)
}

fn sort_points(run: &mut Run) {
    for points in run.series.values_mut() {
        points.sort_by(|a, b| a.size.total_cmp(&b.size));
    }
}

/// One row's points: ours, and every baseline object in it.
fn add_row(run: &mut Run, v: &Value) {
    let (Some(bench), Some(size)) = (v["bench"].as_str(), v["size"].as_f64()) else {
        run.skipped += 1;
        return;
    };
    let Some(ours) = point(size, v) else {
        run.skipped += 1;
        return;
    };
    let ours_name = if bench == "plan" { "plan" } else { "mscclpp" };
    run.series
        .entry((bench.to_string(), ours_name.to_string()))
        .or_default()
        .push(ours);
    if let Some(obj) = v.as_object() {
        for (key, b) in obj {
            if let Some(p) = b.is_object().then(|| point(size, b)).flatten() {
                run.series
                    .entry((bench.to_string(), key.clone()))
                    .or_default()
                    .push(p);
            }
        }
    }
}

fn point(size: f64, v: &Value) -> Option<Point> {
    Some(Point {
        size,
        busbw: v.get("busbw")?.as_f64()?,
        time_us: v.get("time_us")?.as_f64()?,
    })
}

/// Names every run by its file's stem, or by its path where stems repeat.
fn label_runs(runs: &mut [Run]) {
    let stem = |r: &Run| {
        r.file.file_stem().map_or_else(
            || r.file.display().to_string(),
            |s| s.to_string_lossy().into(),
        )
    };
    let stems: Vec<String> = runs.iter().map(stem).collect();
    for (k, r) in runs.iter_mut().enumerate() {
        r.label = if stems.iter().filter(|s| **s == stems[k]).count() > 1 {
            r.file.display().to_string()
        } else {
            stems[k].clone()
        };
    }
}

/// The page: a caption per run, then the plots.
fn render(runs: &[Run], title: &str) -> Result<String> {
    // Series carry the run's label where two runs have the same benchmark and library.
    let mut seen: BTreeMap<(String, String), usize> = BTreeMap::new();
    for run in runs {
        for key in run.series.keys() {
            *seen.entry(key.clone()).or_default() += 1;
        }
    }
    let name = |run: &Run, bench: &str, lib: &str| {
        if seen.get(&(bench.to_string(), lib.to_string())).copied() > Some(1) {
            format!("{}: {bench} {lib}", run.label)
        } else {
            format!("{bench} {lib}")
        }
    };
    let mut busbw = Vec::new();
    let mut latency = Vec::new();
    let mut ratio = Vec::new();
    for run in runs {
        for ((bench, lib), points) in &run.series {
            busbw.push(Series {
                name: name(run, bench, lib),
                points: points.iter().map(|p| (p.size, p.busbw)).collect(),
            });
            latency.push(Series {
                name: name(run, bench, lib),
                points: points.iter().map(|p| (p.size, p.time_us)).collect(),
            });
            if lib == "nccl" {
                let ours_name = if bench == "plan" { "plan" } else { "mscclpp" };
                if let Some(ours) = run.series.get(&(bench.clone(), ours_name.to_string())) {
                    let points = points
                        .iter()
                        .filter_map(|n| {
                            let o = ours.iter().find(|o| o.size == n.size)?;
                            (o.time_us > 0.0).then(|| (n.size, n.time_us / o.time_us))
                        })
                        .collect();
                    ratio.push(Series {
                        name: name(run, bench, &format!("NCCL / {ours_name}")),
                        points,
                    });
                }
            }
        }
    }
    let mut html = String::new();
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{t}</title>\n<style>body{{font-family:sans-serif;max-width:1000px;margin:1em auto;color:#222}}figure{{margin:1.5em 0}}figcaption{{font-size:90%;color:#444}}code{{font-size:85%;background:#f4f4f4;padding:0 .2em}}table{{border-collapse:collapse;font-size:85%}}td,th{{border:1px solid #ccc;padding:.2em .5em;text-align:left}}</style></head><body>\n<h1>{t}</h1>\n",
        t = esc(title)
    );
    html += "<table><tr><th>run</th><th>machine</th><th>backend, device, ranks</th><th>timing</th><th>command</th></tr>\n";
    for run in runs {
        let m = run.meta.as_ref();
        let get = |k: &str| {
            m.and_then(|m| m.get(k))
                .map(|v| match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                })
                .unwrap_or_else(|| "?".into())
        };
        let _ = writeln!(
            html,
            "<tr><td>{}<br><small>{}</small></td><td>{}</td><td>{}, {}, {} ranks</td><td>{}</td><td><code>{}</code></td></tr>",
            esc(&run.label),
            esc(&run.file.display().to_string()),
            esc(&get("machine")),
            esc(&get("backend")),
            esc(&get("device")),
            esc(&get("nranks")),
            esc(&get("timing")),
            esc(&get("command")),
        );
    }
    html += "</table>\n";
    if runs.iter().any(|r| r.meta.is_none()) {
        html += "<p><small>? : the file has no meta line (written by an older mscclpp-perf, or its first line was cut).</small></p>\n";
    }
    if runs
        .iter()
        .any(|r| r.meta.as_ref().and_then(|m| m["backend"].as_str()) == Some("host"))
    {
        html += "<p><small>Host backend: the CPU reference implementation; its figures compare runs on that machine and are no measure of a GPU's or a network's speed.</small></p>\n";
    }
    let figure = |html: &mut String, svg: String, caption: &str| {
        let _ = write!(
            html,
            "<figure>\n{svg}\n<figcaption>{}</figcaption></figure>\n",
            esc(caption)
        );
    };
    figure(
        &mut html,
        plot(&busbw, "Bus bandwidth", "bus bandwidth (GB/s)", true)?,
        "Bus bandwidth against message size (nccl-tests' busbw: algbw x 2(n-1)/n for all-reduce, (n-1)/n for all-gather, reduce-scatter and all-to-all, 1 for broadcast; channels: both directions).",
    );
    figure(
        &mut html,
        plot(&latency, "Time per call", "time per call (us)", true)?,
        "Time per call against message size (the slowest rank's).",
    );
    if ratio.iter().any(|s| !s.points.is_empty()) {
        figure(
            &mut html,
            plot(&ratio, "NCCL's time / ours", "NCCL time / our time", false)?,
            "Ratio to NCCL: NCCL's time per call over ours on the same buffers and stream (above 1: ours is faster).",
        );
    } else {
        html += "<p>No run here has NCCL's baseline (<code>--baseline nccl</code>): no ratio plot.</p>\n";
    }
    let skipped: usize = runs.iter().map(|r| r.skipped).sum();
    if skipped > 0 {
        let _ = writeln!(
            html,
            "<p><small>{skipped} line(s) that are not rows of a size (comments, overlap or bootstrap rows) were left out.</small></p>"
        );
    }
    html += "</body></html>\n";
    Ok(html)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A size on the axis: 1K, 64K, 1M, 1G.
fn size_label(v: f64) -> String {
    let v = v.round() as u64;
    for (shift, unit) in [(30, "G"), (20, "M"), (10, "K")] {
        if v >= 1 << shift && v % (1 << shift) == 0 {
            return format!("{}{unit}", v >> shift);
        }
    }
    if v >= 1 << 10 {
        return format!("{:.1}K", v as f64 / 1024.0);
    }
    format!("{v}")
}

fn figure_label(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 10.0 {
        format!("{v:.0}")
    } else if a >= 1.0 {
        format!("{v:.1}")
    } else {
        let d = ((-a.log10()).floor() as usize + 1).min(9);
        format!("{v:.d$}")
    }
}

/// One plot of `series` against the size (log x; log y where `log_y`), as an SVG element.
fn plot(series: &[Series], title: &str, y_desc: &str, log_y: bool) -> Result<String> {
    let pts = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x > 0.0 && y.is_finite() && (!log_y || y > 0.0))
    };
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in pts() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 2.0, 1.0, 2.0);
    }
    let (x0, x1) = (x0 / 1.3, x1 * 1.3);
    let mut svg = String::new();
    let height = 480 + 18 * series.len().saturating_sub(6) as u32;
    {
        let root = SVGBackend::with_string(&mut svg, (960, height)).into_drawing_area();
        let fail = |e: &dyn std::fmt::Display| Error::Internal(format!("plot {title}: {e}"));
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        if log_y {
            draw(
                &root,
                series,
                title,
                y_desc,
                (x0..x1).log_scale().base(2.0),
                (y0 / 1.5..y1 * 1.5).log_scale(),
                None,
            )
            .map_err(|e| fail(&e))?;
        } else {
            let top = (y1 * 1.15).max(1.2);
            draw(
                &root,
                series,
                title,
                y_desc,
                (x0..x1).log_scale().base(2.0),
                0.0..top,
                Some(1.0),
            )
            .map_err(|e| fail(&e))?;
        }
        root.present().map_err(|e| fail(&e))?;
    }
    Ok(svg)
}

type DrawResult = std::result::Result<(), DrawingAreaErrorKind<std::io::Error>>;

/// Draws the chart on `root` with the given axes; `unity` adds a dashed line at that value.
fn draw<X, Y>(
    root: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    series: &[Series],
    title: &str,
    y_desc: &str,
    x: X,
    y: Y,
    unity: Option<f64>,
) -> DrawResult
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 26))
        .margin(12)
        .x_label_area_size(48)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("message size (bytes)")
        // Powers of two: with at most 12 labels, no tick between two of them.
        .x_labels(12)
        .y_desc(y_desc)
        .label_style(("sans-serif", 15))
        .axis_desc_style(("sans-serif", 16))
        .x_label_formatter(&|v| size_label(*v))
        .y_label_formatter(&|v| figure_label(*v))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    if let Some(u) = unity {
        let (lo, hi) = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.0))
            .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
        if lo <= hi {
            chart.draw_series(LineSeries::new(
                [(lo / 1.3, u), (hi * 1.3, u)],
                BLACK.mix(0.4).stroke_width(1),
            ))?;
        }
    }
    for (k, s) in series.iter().enumerate() {
        let color = Palette99::pick(k).to_rgba();
        let points: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|&(x, y)| x > 0.0 && y.is_finite() && (unity.is_some() || y > 0.0))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
        chart.draw_series(PointSeries::of_element(
            points,
            3,
            color.filled(),
            &|c, s, st| Circle::new(c, s, st),
        ))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run with NCCL's baseline and one without, as `-J` writes them.
    fn fixture(dir: &Path) -> Vec<PathBuf> {
        let meta = r#"{"meta":{"bench":"allreduce","backend":"cuda","device":"NVIDIA H200","nranks":8,"timing":"eager launches","command":"mscclpp-perf -b 1K -e 4K --baseline nccl -J","machine":"gpu-box, 8 GPUs","version":"0.1.0","unix_time":0,"title":"t"}}"#;
        let mut a = String::from(meta);
        a.push('\n');
        for (k, size) in [1024, 2048, 4096].into_iter().enumerate() {
            let t = 10.0 + k as f64;
            let _ = writeln!(
                a,
                r#"{{"bench":"allreduce","size":{size},"count":{},"type":"float","op":"sum","root":null,"nranks":8,"time_us":{t},"algbw":0.1,"busbw":0.175,"wrong":0,"algo":"ll-short","nccl":{{"time_us":{},"algbw":0.05,"busbw":0.0875,"wrong":0}}}}"#,
                size / 4,
                t * 2.0
            );
        }
        let mut b = String::from("# a comment\n");
        b += r#"{"bench":"allreduce","size":1024,"count":256,"type":"float","op":"sum","root":null,"nranks":2,"time_us":30.0,"algbw":0.03,"busbw":0.03,"wrong":0,"nccl":null}"#;
        b.push('\n');
        b += r#"{"bench":"allgather","size":1024,"count":128,"type":"float","op":"none","root":null,"nranks":2,"time_us":20.0,"algbw":0.05,"busbw":0.025,"wrong":0,"nccl":null}"#;
        b.push('\n');
        let (fa, fb) = (dir.join("h200.jsonl"), dir.join("laptop.jsonl"));
        std::fs::write(&fa, a).unwrap();
        std::fs::write(&fb, b).unwrap();
        vec![fa, fb]
    }

    #[test]
    fn page_has_an_svg_per_plot_the_series_and_the_caption() {
        let dir = std::env::temp_dir().join(format!("mscclpp-perf-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let files = fixture(&dir);
        let out = dir.join("report.html");
        let done = main(&files, &out, Some("two machines"));
        let html = std::fs::read_to_string(&out).unwrap_or_default();
        let one = main(&files[1..], &dir.join("one.html"), None);
        let single = std::fs::read_to_string(dir.join("one.html")).unwrap_or_default();
        let _ = std::fs::remove_dir_all(&dir);
        done.unwrap();
        one.unwrap();
        // Bus bandwidth, time, ratio to NCCL.
        assert_eq!(html.matches("<svg").count(), 3, "{html}");
        for name in [
            "h200: allreduce mscclpp",
            "allreduce nccl",
            "laptop: allreduce mscclpp",
            "allgather mscclpp",
            "NCCL&apos;s time / ours",
            "gpu-box, 8 GPUs",
            "mscclpp-perf -b 1K -e 4K --baseline nccl -J",
            "<h1>two machines</h1>",
            "no meta line",
        ] {
            assert!(
                html.contains(name) || html.contains(&name.replace("&apos;", "'")),
                "{name} missing"
            );
        }
        // Without NCCL: two plots, and the page says why there is no third.
        assert_eq!(single.matches("<svg").count(), 2);
        assert!(single.contains("allgather mscclpp"));
        assert!(single.contains("no ratio plot"));
    }

    #[test]
    fn a_line_that_is_not_json_is_named() {
        let e = parse(
            Path::new("x.jsonl"),
            "{\"bench\":\"allreduce\"}\nsize(B) count\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("x.jsonl:2: not a JSON line"), "{e}");
        assert_eq!(size_label(1048576.0), "1M");
        assert_eq!(size_label(1536.0), "1.5K");
        assert_eq!(figure_label(0.0123), "0.01");
    }
}
