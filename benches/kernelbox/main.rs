//! kernelbox benchmarks: the figures of the docs/performance.md (warm and cold cells,
//! the tool-call round trip, throughput, idle density, a Jupyter reference), side by side with
//! the floors the engine physically allows, in one run against the real Docker engine.
//!
//! ```text
//! cargo bench --bench kernelbox -- [--quick] [--density N] [--json PATH] [--warm N] [--no-jupyter]
//! ```
//!
//! Measures, in order: the bare attach echo floor and the warm cell round trip; the cold first
//! cell against `docker run --rm IMAGE python3 -c pass`; the warm pool (a new owner's first
//! cell on a hit and a miss, a burst of new owners, refill, idle memory); a no-op tool call from
//! inside a cell; many owners times many cells concurrently; the plain and data-science images
//! side by side (size, cold start, idle memory; the latter only when built); N idle kernels
//! (start time, the start rate at 50 to 1000 live kernels against `docker run -d`, host
//! memory, one kernel's processes, kernelbox's RSS, and the shutdown that removes them against
//! `docker rm -f`); and, when ipykernel installs quickly into `target/bench-venv`, a Jupyter
//! kernel as the reference users know. Prints a markdown table and writes the same data as
//! JSON (default `target/bench.json`). Everything created carries
//! `io.kernelbox-test.case=bench-<uuid>`; the run ends by asserting nothing labelled remains.
//!
//! Layout:
//!
//! - `main.rs`: the flags, the sample sizes, the order of the phases, the check that nothing
//!   labelled is left behind.
//! - `phases/`: the state of a run ([`phases::Bench`]) and one file per phase (warm, HTTP,
//!   cold, tools, throughput, density, Jupyter), each adding its rows, notes and details.
//! - `floors.rs`: what the engine allows on the same machine: the attach echo, `docker run
//!   --rm`, and idle `sleep` containers with a kernel's sandbox.
//! - `events.rs`: timed samples with wall-clock bounds, and the Docker event log that splits
//!   them into segments (create, attach, start, ...).
//! - `host.rs`: host measurements from `free` and `/proc`: used memory, the engine's helper
//!   processes, cgroup memory, this process's RSS, the machine's description.
//! - `stats.rs`: latency summaries (nearest-rank percentiles) and their formatting.
//! - `report.rs`: the table's rows, the markdown table, and the printed and JSON report.

mod baseline;
mod events;
mod floors;
mod host;
mod phases;
mod report;
mod stats;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use bollard::Docker;
use kernelbox::{BollardEngine, Engine, Orchestrator};

use phases::Bench;

/// The kernel image every phase runs.
const IMAGE: &str = "kernelbox/kernel:latest";
/// The label key on everything the bench creates.
const CASE: &str = "io.kernelbox-test.case";
const USAGE: &str =
    "cargo bench --bench kernelbox -- [--quick] [--density N] [--json PATH] [--warm N] [--no-jupyter] [--only PHASE,...] [--baseline SAVED.json]... [--write-docs FILE]";

/// The command line.
struct Args {
    quick: bool,
    density: usize,
    json: PathBuf,
    jupyter: bool,
    /// Overrides the number of warm cells (and attach echoes), e.g. for profiling.
    warm: Option<usize>,
    /// Only these phases (`--only egress,cold`): the rest are skipped, and a row whose floor
    /// another phase measures shows NaN for its ratio.
    only: Option<Vec<String>>,
    /// Saved reports of an earlier commit to compare this run's ratios with (`baseline.rs`).
    baseline: Vec<PathBuf>,
    /// A document whose marked block gets this run's table (`baseline.rs`).
    write_docs: Option<PathBuf>,
}

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            quick: false,
            density: 50,
            json: target_dir().join("bench.json"),
            jupyter: true,
            warm: None,
            only: None,
            baseline: Vec::new(),
            write_docs: None,
        };
        let mut it = std::env::args().skip(1);
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with("--") => (f.to_string(), Some(v.to_string())),
                _ => (arg.clone(), None),
            };
            let mut value = |name: &str| -> Result<String> {
                inline
                    .clone()
                    .or_else(|| it.next())
                    .with_context(|| format!("{name} needs a value"))
            };
            match flag.as_str() {
                "--quick" => args.quick = true,
                "--density" => {
                    args.density = value("--density")?
                        .parse()
                        .context("--density takes a number")?
                }
                "--json" => args.json = value("--json")?.into(),
                "--warm" => {
                    args.warm = Some(value("--warm")?.parse().context("--warm takes a number")?)
                }
                "--no-jupyter" => args.jupyter = false,
                "--only" => {
                    args.only = Some(value("--only")?.split(',').map(str::to_string).collect())
                }
                "--baseline" => args
                    .baseline
                    .extend(value("--baseline")?.split(',').map(PathBuf::from)),
                "--write-docs" => args.write_docs = Some(value("--write-docs")?.into()),
                // `cargo bench` passes `--bench` to harness = false targets.
                "--bench" => {}
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => eprintln!("ignoring argument {other:?} (usage: {USAGE})"),
            }
        }
        if args.density == 0 {
            bail!("--density must be at least 1");
        }
        Ok(args)
    }

    /// The command that reproduces this run, for the report.
    fn command(&self) -> String {
        let mut c = String::from("cargo bench --bench kernelbox --");
        if self.quick {
            c.push_str(" --quick");
        }
        c.push_str(&format!(" --density {}", self.density));
        if let Some(n) = self.warm {
            c.push_str(&format!(" --warm {n}"));
        }
        if !self.jupyter {
            c.push_str(" --no-jupyter");
        }
        if let Some(only) = &self.only {
            c.push_str(&format!(" --only {}", only.join(",")));
        }
        c
    }

    /// True when the phase `name` runs in this run.
    fn runs(&self, name: &str) -> bool {
        self.only
            .as_ref()
            .is_none_or(|only| only.iter().any(|o| o == name))
    }
}

/// Cargo's target directory: the default JSON path, the Jupyter venv and script.
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Sample counts, full or `--quick`.
struct Sizes {
    warm: usize,
    cold: usize,
    cold_floor: usize,
    tool_calls: usize,
    owners: usize,
    cells_per_owner: usize,
    jupyter_warm: usize,
    jupyter_cold: usize,
    pool_hits: usize,
    pool_misses: usize,
}

impl Sizes {
    fn new(quick: bool) -> Sizes {
        if quick {
            Sizes {
                warm: 100,
                cold: 5,
                cold_floor: 10,
                tool_calls: 200,
                owners: 4,
                cells_per_owner: 10,
                jupyter_warm: 100,
                jupyter_cold: 2,
                pool_hits: 20,
                pool_misses: 5,
            }
        } else {
            Sizes {
                warm: 500,
                cold: 10,
                cold_floor: 10,
                tool_calls: 1000,
                owners: 8,
                cells_per_owner: 25,
                jupyter_warm: 500,
                jupyter_cold: 5,
                pool_hits: 50,
                pool_misses: 10,
            }
        }
    }
}

/// The phases that run on the bench's orchestrator, in order.
async fn run_phases(b: &mut Bench) -> Result<()> {
    if b.args.runs("warm") {
        eprintln!("[bench] warm cell and attach floor");
        b.warm().await?;
    }
    if b.args.runs("fake") {
        eprintln!("[bench] warm cell on the fake engine");
        b.fake().await?;
    }
    if b.args.runs("http") {
        eprintln!("[bench] warm cell over HTTP");
        b.http().await?;
    }
    if b.args.runs("cold") {
        eprintln!("[bench] cold first cell and docker run floor");
        b.cold().await?;
    }
    if b.args.runs("languages") {
        eprintln!("[bench] languages: warm and cold Bash cells against Python's, idle memory");
        b.languages().await?;
    }
    if b.args.runs("pool") {
        eprintln!("[bench] warm pool: hits, misses, a burst, refill, idle memory");
        b.pool().await?;
    }
    if b.args.runs("tools") {
        eprintln!("[bench] tool call round trip");
        b.tools().await?;
    }
    if b.args.runs("files") {
        eprintln!("[bench] file transfers and docker cp floor");
        b.files().await?;
    }
    if b.args.runs("throughput") {
        eprintln!("[bench] throughput");
        b.throughput().await?;
    }
    if b.args.runs("egress") {
        eprintln!("[bench] egress: HTTPS through the proxy and direct, a policy kernel's start");
        b.egress().await?;
    }
    if b.args.runs("cluster") {
        eprintln!("[bench] cluster: forward hop, PostgreSQL catalog, node death, three nodes");
        b.cluster().await?;
    }
    if b.args.runs("images") {
        eprintln!("[bench] images: plain and datascience side by side");
        b.images().await?;
    }
    if b.args.runs("hibernate") {
        eprintln!("[bench] hibernation under runsc: checkpoint, restore, the next call");
        b.hibernate().await?;
    }
    if b.args.runs("snapshots") {
        eprintln!("[bench] snapshots and fork under runsc: against checkpoint and restore");
        b.snapshots().await?;
    }
    if b.args.runs("density") {
        eprintln!("[bench] density: {} idle kernels", b.args.density);
        b.density().await?;
    }
    Ok(())
}

/// Removes anything still carrying the label; returns what was found.
async fn leftovers(engine: &Arc<dyn Engine>, label: &str) -> Result<(usize, usize)> {
    let filter = [format!("{CASE}={label}")];
    let cs = engine.list_containers(&filter).await?;
    let vs = engine.list_volumes(&filter, false).await?;
    for c in &cs {
        let _ = engine.remove_container(&c.id).await;
    }
    for v in &vs {
        let _ = kernelbox::docker::remove_volume_when_free(engine.as_ref(), &v.name).await;
    }
    Ok((cs.len(), vs.len()))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse()?;
    let load_at_start = host::loadavg();
    let mut sizes = Sizes::new(args.quick);
    if let Some(n) = args.warm {
        sizes.warm = n.max(1);
    }
    let label = format!("bench-{}", uuid::Uuid::new_v4().simple());
    let engine: Arc<dyn Engine> = Arc::new(
        BollardEngine::connect()
            .await
            .context("the Docker engine must be running")?,
    );
    let docker = Docker::connect_with_defaults()?.negotiate_version().await?;
    if !engine.image_exists(IMAGE).await? {
        bail!("{IMAGE} is missing: build it with `kernelbox image build`");
    }
    let docker_version = docker
        .version()
        .await
        .ok()
        .and_then(|v| v.version)
        .unwrap_or_default();
    let others_running = docker
        .list_containers(None::<bollard::query_parameters::ListContainersOptions>)
        .await
        .map(|c| c.len())
        .unwrap_or(0);
    let mut config = phases::config(&label);
    config.kernels.max_session_kernels = (args.density + phases::RATE_WINDOW).max(sizes.owners + 2);
    config.cells.max_tool_calls = u32::try_from(sizes.tool_calls + 10)?;
    let kb = Orchestrator::start(config, engine.clone()).await?;
    let rss_at_start = host::vm_rss_bytes()?;
    eprintln!("[bench] label {CASE}={label}");
    let mut b = Bench::new(
        args,
        sizes,
        label.clone(),
        engine.clone(),
        docker,
        kb,
        rss_at_start,
    );
    let outcome = run_phases(&mut b).await;
    let t = Instant::now();
    b.kb.shutdown().await;
    let shutdown_s = t.elapsed().as_secs_f64();
    let (cs, vs) = leftovers(&engine, &label).await?;
    outcome?;
    if cs + vs > 0 {
        bail!("left behind after shutdown: {cs} containers, {vs} volumes labelled {label}");
    }
    // The density phase times the shutdown with its N kernels (its row); this one is then a
    // second call, with nothing left to remove.
    let what = if b.args.runs("density") {
        "the final shutdown (after the density phase's)".to_string()
    } else {
        "shutdown".to_string()
    };
    b.notes.push(format!(
        "{what} took {shutdown_s:.1} s; afterwards docker lists 0 containers and 0 volumes \
         labelled {CASE}={label}"
    ));
    if others_running > 0 {
        b.notes.push(format!(
            "{others_running} other containers were running on the engine when the bench started"
        ));
    }
    if b.args.runs("jupyter") {
        eprintln!("[bench] jupyter reference");
        b.jupyter().await?;
    }
    let report = report::Report {
        args: &b.args,
        label: &b.label,
        rows: &b.rows,
        details: &b.details,
        notes: &b.notes,
    };
    let mut written = report::publish(report, &docker_version, load_at_start)?;
    let compared = baseline::compare(&written, &b.args.baseline)?;
    if !compared.is_null() {
        written["baseline"] = compared;
        std::fs::write(&b.args.json, serde_json::to_string_pretty(&written)?)?;
    }
    if let Some(doc) = &b.args.write_docs {
        let table = written["markdown"].as_str().unwrap_or_default();
        baseline::write_docs(doc, &b.args.command(), table)?;
    }
    Ok(())
}
