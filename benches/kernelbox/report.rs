//! The report: the table's [`Row`]s, the markdown table, and [`publish`], which prints the
//! heading, the table and the notes and writes the same data as JSON (`--json`, default
//! `target/bench.json`).

use anyhow::Result;
use serde::Serialize;
use serde_json::json;

use crate::{host, Args, CASE, IMAGE};

/// One line of the table.
#[derive(Debug, Serialize)]
pub struct Row {
    measure: String,
    value: String,
    floor: String,
    ratio: Option<f64>,
    target: String,
    /// Whether the target is met; `None` when the row has no target.
    met: Option<bool>,
    /// The ratio is a speed-up (higher is better); most are a cost against the floor.
    higher_is_better: bool,
}

impl Row {
    pub fn new(measure: impl Into<String>, value: impl Into<String>) -> Row {
        Row {
            measure: measure.into(),
            value: value.into(),
            floor: "—".into(),
            ratio: None,
            target: "—".into(),
            met: None,
            higher_is_better: false,
        }
    }
    /// The ratio is a speed-up: `--baseline` counts a lower one as worse.
    pub fn higher_is_better(mut self) -> Row {
        self.higher_is_better = true;
        self
    }
    pub fn floor(mut self, floor: impl Into<String>, ratio: f64) -> Row {
        self.floor = floor.into();
        self.ratio = Some(ratio);
        self
    }
    pub fn target(mut self, target: impl Into<String>, met: bool) -> Row {
        self.target = target.into();
        self.met = Some(met);
        self
    }
}

fn markdown(rows: &[Row]) -> String {
    let mut t =
        String::from("| measure | value | floor | ratio | target |\n|---|---|---|---|---|\n");
    for r in rows {
        let ratio = r.ratio.map_or("—".to_string(), |x| format!("{x:.2}x"));
        let target = match r.met {
            Some(true) => format!("{} — met", r.target),
            Some(false) => format!("{} — **not met**", r.target),
            None => r.target.clone(),
        };
        t.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.measure, r.value, r.floor, ratio, target
        ));
    }
    t
}

/// What a run reports: its table rows, the JSON details and the notes.
pub struct Report<'a> {
    pub args: &'a Args,
    pub label: &'a str,
    pub rows: &'a [Row],
    pub details: &'a serde_json::Map<String, serde_json::Value>,
    pub notes: &'a [String],
}

/// Prints the heading, the table and the notes, and writes the JSON report (returned).
pub fn publish(
    b: Report<'_>,
    docker_version: &str,
    load_at_start: f64,
) -> Result<serde_json::Value> {
    let table = markdown(b.rows);
    let m = host::machine();
    println!(
        "\n`{}` — {} cores, {} GiB, Linux {}, Docker {docker_version}, image {IMAGE}; \
         load average {load_at_start:.2} at start, {} at end\n",
        b.args.command(),
        m["cores"],
        m["memory_gib"],
        m["kernel"].as_str().unwrap_or(""),
        m["loadavg"]
    );
    println!("{table}");
    for n in b.notes {
        println!("- {n}");
    }
    let report = json!({
        "command": b.args.command(),
        "machine": m,
        "loadavg_at_start": load_at_start,
        "docker": docker_version,
        "image": IMAGE,
        "label": format!("{CASE}={}", b.label),
        "rows": b.rows,
        "details": b.details,
        "notes": b.notes,
        "markdown": table,
    });
    if let Some(dir) = b.args.json.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(&b.args.json, serde_json::to_string_pretty(&report)?)?;
    println!("\nJSON written to {}", b.args.json.display());
    Ok(report)
}
