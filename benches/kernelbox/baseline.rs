//! `--baseline FILE` (repeatable): this run's ratios to their floors beside a saved run's
//! (`target/bench.json` of an earlier commit), row by row, flagging a row whose ratio moved
//! beyond the run-to-run noise. The noise of a row is the spread of its ratio across the
//! baseline files given (two or more runs of the same commit measure it), at least
//! [`MIN_NOISE`]; with one file it is [`DEFAULT_NOISE`]. A ratio is a measure against its
//! floor in the same run, so a busier or quieter host moves both and the ratio less.
//!
//! `--write-docs FILE` puts this run's table (and the command that made it) between the
//! `<!-- bench-table:begin -->` and `<!-- bench-table:end -->` markers of FILE, so the
//! documented figures come from a run, not from hand.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// The least relative noise assumed for any row.
const MIN_NOISE: f64 = 0.10;
/// The relative noise assumed when one baseline file gives no spread to measure.
const DEFAULT_NOISE: f64 = 0.25;

/// Where the table goes in a document.
const BEGIN: &str = "<!-- bench-table:begin -->";
const END: &str = "<!-- bench-table:end -->";

/// One row compared.
struct Compared {
    measure: String,
    now: f64,
    then: Vec<f64>,
    noise: f64,
    /// `now` against the mean of `then`, oriented so that above 1 is worse.
    change: f64,
    verdict: &'static str,
}

/// The ratio of a row, and whether a higher one is better, from a report's `rows`.
fn ratios(report: &Value) -> Vec<(String, f64, bool)> {
    report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let ratio = r["ratio"].as_f64().filter(|x| x.is_finite() && *x > 0.0)?;
            Some((
                same_measure(r["measure"].as_str()?),
                ratio,
                r["higher_is_better"].as_bool().unwrap_or(false),
            ))
        })
        .collect()
}

/// A row's measure without its sample count (`(n=10)`, `(n=5; run F)` keeps `run F`), so a
/// `--quick` run's rows meet a full run's.
fn same_measure(measure: &str) -> String {
    let mut out = String::with_capacity(measure.len());
    let mut rest = measure;
    while let Some(at) = rest.find("n=") {
        let digits = rest[at + 2..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 2);
        let starts_count = at == 0 || rest[..at].ends_with(['(', ' ']);
        if digits > 0 && starts_count {
            out.push_str(&rest[..at]);
            out.push('n');
            rest = &rest[at + 2 + digits..];
        } else {
            out.push_str(&rest[..at + 2]);
            rest = &rest[at + 2..];
        }
    }
    out.push_str(rest);
    out
}

fn read(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the baseline {}", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not a bench report", path.display()))
}

/// Compares `now` (this run's report) with the baseline reports in `files`; prints the
/// comparison and returns it as JSON for the report.
pub fn compare(now: &Value, files: &[PathBuf]) -> Result<Value> {
    if files.is_empty() {
        return Ok(Value::Null);
    }
    let baselines: Vec<Value> = files.iter().map(|f| read(f)).collect::<Result<_>>()?;
    let mut compared = Vec::new();
    for (measure, ratio, higher_better) in ratios(now) {
        let then: Vec<f64> = baselines
            .iter()
            .filter_map(|b| {
                ratios(b)
                    .into_iter()
                    .find(|(m, _, _)| *m == measure)
                    .map(|(_, r, _)| r)
            })
            .collect();
        if then.is_empty() {
            continue;
        }
        let mean = then.iter().sum::<f64>() / then.len() as f64;
        let noise = if then.len() >= 2 {
            let (lo, hi) = then
                .iter()
                .fold((f64::MAX, f64::MIN), |(lo, hi), x| (lo.min(*x), hi.max(*x)));
            ((hi - lo) / mean).max(MIN_NOISE)
        } else {
            DEFAULT_NOISE
        };
        let change = if higher_better {
            mean / ratio
        } else {
            ratio / mean
        };
        let verdict = if change > 1.0 + noise {
            "worse"
        } else if change < 1.0 / (1.0 + noise) {
            "better"
        } else {
            "within noise"
        };
        compared.push(Compared {
            measure,
            now: ratio,
            then,
            noise,
            change,
            verdict,
        });
    }
    println!(
        "\nAgainst the baseline ({}):\n",
        files
            .iter()
            .map(|f| f.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    println!("| measure | ratio now | ratio then | change (>1 worse) | noise | verdict |");
    println!("|---|---|---|---|---|---|");
    for c in &compared {
        let then = c
            .then
            .iter()
            .map(|x| format!("{x:.2}x"))
            .collect::<Vec<_>>()
            .join(", ");
        let verdict = if c.verdict == "worse" {
            "**worse**"
        } else {
            c.verdict
        };
        println!(
            "| {} | {:.2}x | {then} | {:.2} | ±{:.0}% | {verdict} |",
            c.measure,
            c.now,
            c.change,
            c.noise * 100.0
        );
    }
    let worse = compared.iter().filter(|c| c.verdict == "worse").count();
    println!(
        "\n{} rows compared, {worse} worse beyond the noise",
        compared.len()
    );
    Ok(json!({
        "files": files,
        "rows": compared.iter().map(|c| json!({
            "measure": c.measure, "ratio_now": c.now, "ratio_then": c.then,
            "noise": c.noise, "change": c.change, "verdict": c.verdict,
        })).collect::<Vec<_>>(),
        "worse": worse,
    }))
}

/// Puts `command` and `table` between the markers of the document at `path`.
pub fn write_docs(path: &Path, command: &str, table: &str) -> Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (Some(begin), Some(end)) = (text.find(BEGIN), text.find(END)) else {
        bail!("{} has no {BEGIN} ... {END} block", path.display());
    };
    if end < begin {
        bail!("{}: {END} comes before {BEGIN}", path.display());
    }
    let block = format!("{BEGIN}\n`{command}`\n\n{table}");
    let updated = format!("{}{block}{}", &text[..begin], &text[end..]);
    std::fs::write(path, updated).with_context(|| format!("writing {}", path.display()))?;
    println!("table written to {}", path.display());
    Ok(())
}
