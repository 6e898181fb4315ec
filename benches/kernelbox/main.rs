//! kernelbox benchmarks (issue 6, and the tool-call round trip of issue 4), side by side with
//! the floors the engine physically allows, in one run against the real Docker engine.
//!
//! ```text
//! cargo bench --bench kernelbox -- [--quick] [--density N] [--json PATH] [--warm N] [--no-jupyter]
//! ```
//!
//! Measures, in order: the bare attach echo floor and the warm cell round trip; the cold first
//! cell against `docker run --rm IMAGE python3 -c pass`; a no-op tool call from inside a cell;
//! many owners times many cells concurrently; N idle kernels (start time, host memory,
//! kernelbox's RSS); and, when ipykernel installs quickly into `target/bench-venv`, a Jupyter
//! kernel as the reference users know. Prints a markdown table and writes the same data as
//! JSON (default `target/bench.json`). Everything created carries
//! `io.kernelbox-test.case=bench-<uuid>`; the run ends by asserting nothing labelled remains.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use bollard::query_parameters::EventsOptionsBuilder;
use bollard::Docker;
use futures::StreamExt;
use kernelbox::docker::{Chunk, ContainerSpec};
use kernelbox::{
    BollardEngine, CellResult, CellStatus, Config, Engine, ExecuteRequest, FnDispatcher,
    Orchestrator, Sandbox, ToolCall, ToolDispatcher,
};
use serde::Serialize;
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

const IMAGE: &str = "kernelbox/kernel:latest";
const CASE: &str = "io.kernelbox-test.case";
const MIB: f64 = 1024.0 * 1024.0;
/// Kernels started at once in the density phase.
const DENSITY_CONCURRENCY: usize = 8;
/// Containers in the density floor (at most; fewer when fewer kernels are measured).
const DENSITY_FLOOR_MAX: usize = 200;
const USAGE: &str =
    "cargo bench --bench kernelbox -- [--quick] [--density N] [--json PATH] [--warm N] [--no-jupyter]";

struct Args {
    quick: bool,
    density: usize,
    json: PathBuf,
    jupyter: bool,
    /// Overrides the number of warm cells (and attach echoes), e.g. for profiling.
    warm: Option<usize>,
}

impl Args {
    fn parse() -> Result<Args> {
        let mut args = Args {
            quick: false,
            density: 50,
            json: target_dir().join("bench.json"),
            jupyter: true,
            warm: None,
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
        c
    }
}

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
            }
        }
    }
}

/// Latency summary in milliseconds (nearest-rank percentiles).
#[derive(Debug, Clone, Serialize)]
struct Stats {
    n: usize,
    mean_ms: f64,
    p50_ms: f64,
    p99_ms: f64,
    min_ms: f64,
    max_ms: f64,
}

fn stats(samples: &[f64]) -> Stats {
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let rank = |p: f64| -> f64 {
        if n == 0 {
            return f64::NAN;
        }
        let i = ((p * n as f64).ceil() as usize).clamp(1, n) - 1;
        s[i]
    };
    Stats {
        n,
        mean_ms: if n == 0 {
            f64::NAN
        } else {
            s.iter().sum::<f64>() / n as f64
        },
        p50_ms: rank(0.50),
        p99_ms: rank(0.99),
        min_ms: s.first().copied().unwrap_or(f64::NAN),
        max_ms: s.last().copied().unwrap_or(f64::NAN),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn fmt_ms(v: f64) -> String {
    if v < 10.0 {
        format!("{v:.3} ms")
    } else if v < 1000.0 {
        format!("{v:.1} ms")
    } else {
        format!("{:.2} s", v / 1e3)
    }
}

fn pq(s: &Stats) -> String {
    format!("p50 {} / p99 {}", fmt_ms(s.p50_ms), fmt_ms(s.p99_ms))
}

/// One line of the table.
#[derive(Debug, Serialize)]
struct Row {
    measure: String,
    value: String,
    floor: String,
    ratio: Option<f64>,
    target: String,
    /// Whether the target is met; `None` when the row has no target.
    met: Option<bool>,
}

impl Row {
    fn new(measure: impl Into<String>, value: impl Into<String>) -> Row {
        Row {
            measure: measure.into(),
            value: value.into(),
            floor: "—".into(),
            ratio: None,
            target: "—".into(),
            met: None,
        }
    }
    fn floor(mut self, floor: impl Into<String>, ratio: f64) -> Row {
        self.floor = floor.into();
        self.ratio = Some(ratio);
        self
    }
    fn target(mut self, target: impl Into<String>, met: bool) -> Row {
        self.target = target.into();
        self.met = Some(met);
        self
    }
}

struct Bench {
    args: Args,
    sizes: Sizes,
    label: String,
    engine: Arc<dyn Engine>,
    docker: Docker,
    kb: Orchestrator,
    rows: Vec<Row>,
    details: Map<String, Value>,
    notes: Vec<String>,
    /// Attach floor p50, for ratios of later rows.
    attach_p50: f64,
    /// Warm cell p50, for the Jupyter ratio.
    warm_p50: f64,
    cold_p50: f64,
    rss_at_start: u64,
}

fn ok_cell(what: &str, r: &CellResult) -> Result<()> {
    if r.status != CellStatus::Success {
        bail!(
            "{what}: cell ended {} ({:?}): {}",
            r.status.as_str(),
            r.error,
            r.output
        );
    }
    Ok(())
}

impl Bench {
    async fn exec(&self, request: ExecuteRequest) -> Result<CellResult> {
        let r = self.kb.execute(request).await?;
        Ok(r)
    }

    /// 1. Warm cell round trip, and the bare attach echo floor.
    async fn warm(&mut self) -> Result<()> {
        let n = self.sizes.warm;
        let mut echo = EchoFloor::start(&self.engine, &self.label).await?;
        let session = "warm";
        for _ in 0..20 {
            let r = self.exec(ExecuteRequest::new(session, "x = 1")).await?;
            ok_cell("warm-up", &r)?;
        }
        // Floor and kernel alternate in blocks of 10, so both see the same machine: on a small
        // shared machine either can drift by 2x over a run.
        let mut floor_samples = Vec::with_capacity(n);
        let mut wall = Vec::with_capacity(n);
        let mut inner = Vec::with_capacity(n);
        let measured = async {
            while wall.len() < n {
                for _ in 0..10 {
                    floor_samples.push(echo.sample().await?);
                }
                for _ in 0..10.min(n - wall.len()) {
                    let t = Instant::now();
                    let r = self.exec(ExecuteRequest::new(session, "x = 1")).await?;
                    wall.push(ms(t.elapsed()));
                    ok_cell("warm cell", &r)?;
                    if !r.kernel.reused {
                        bail!("warm cell ran in a new kernel");
                    }
                    inner.push(r.duration_seconds * 1e3);
                }
            }
            Ok(())
        }
        .await;
        echo.stop().await;
        measured?;
        let floor = stats(&floor_samples);
        let w = stats(&wall);
        let d = stats(&inner);
        let ratio = w.p50_ms / floor.p50_ms;
        self.attach_p50 = floor.p50_ms;
        self.warm_p50 = w.p50_ms;
        self.rows.push(
            Row::new(format!("warm cell `x = 1`, library (n={n})"), pq(&w))
                .floor(format!("attach echo: {}", pq(&floor)), ratio)
                .target(
                    "p50 ≤ 2x floor and < 0.5 ms",
                    ratio <= 2.0 && w.p50_ms < 0.5,
                ),
        );
        self.notes.push(format!(
            "warm cell: CellResult.duration_seconds (inside execute, from owner lookup to result) \
             p50 {}; the rest of the wall time ({}) is the call around it",
            fmt_ms(d.p50_ms),
            fmt_ms(w.p50_ms - d.p50_ms)
        ));
        self.details.insert(
            "warm".into(),
            json!({"library_wall": w, "library_duration_seconds": d, "attach_floor": floor, "ratio_p50": ratio}),
        );
        Ok(())
    }

    /// 1b. Warm cell round trip through the HTTP API on loopback (keep-alive connection), on
    /// an in-process server with its own orchestrator.
    async fn http(&mut self) -> Result<()> {
        use http_body_util::{BodyExt, Full};
        use hyper_util::client::legacy::Client;
        use hyper_util::rt::TokioExecutor;
        use kernelbox::server::{AppState, Tenant, Tenants};

        let n = self.sizes.warm;
        let config = Config {
            extra_labels: [(CASE.to_string(), self.label.clone())].into(),
            watchdog: None,
            sweep_on_start: false,
            ..Config::default()
        };
        let kb = Orchestrator::start(config, self.engine.clone()).await?;
        let tenants = Tenants::new(vec![Tenant::with_token("default", "bench-token")])?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(kernelbox::server::serve(
            listener,
            AppState::new(kb, tenants),
            shutdown.clone(),
            Duration::from_secs(5),
        ));
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let uri = format!("http://{addr}/v1/sessions/http/execute");
        let mut samples = Vec::with_capacity(n);
        for i in 0..n + 20 {
            let request = hyper::Request::post(&uri)
                .header("authorization", "Bearer bench-token")
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from_static(
                    br#"{"code": "x = 1"}"#,
                )))?;
            let t = Instant::now();
            let response = client.request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            let elapsed = ms(t.elapsed());
            if !status.is_success() || !body.starts_with(br#"{"status":"success""#) {
                bail!(
                    "http cell failed: {status} {}",
                    String::from_utf8_lossy(&body)
                );
            }
            // The first 20 include the kernel's start and connection set-up.
            if i >= 20 {
                samples.push(elapsed);
            }
        }
        shutdown.cancel();
        server.await??;
        let h = stats(&samples);
        let ratio = h.p50_ms / self.attach_p50;
        self.rows.push(
            Row::new(
                format!("warm cell `x = 1`, HTTP on loopback (n={n})"),
                pq(&h),
            )
            .floor(
                format!("attach echo p50 {}", fmt_ms(self.attach_p50)),
                ratio,
            ),
        );
        self.details
            .insert("http".into(), json!({"http_wall": h, "ratio_p50": ratio}));
        Ok(())
    }

    /// 2. Cold first cell for a new owner, against `docker run --rm`.
    async fn cold(&mut self) -> Result<()> {
        let (n, nf) = (self.sizes.cold, self.sizes.cold_floor);
        let events = EventLog::start(&self.docker, &self.label);
        // One untimed round of each, so neither side pays for a cold page cache (and the
        // event subscription is live before the timed samples).
        self.cold_once("cold-warmup").await?;
        docker_run_once(&self.label).await?;
        let mut kb = Vec::new();
        let mut floor = Vec::new();
        for i in 0..n.max(nf) {
            if i < n {
                kb.push(self.cold_once(&format!("cold-{i}")).await?);
            }
            if i < nf {
                floor.push(docker_run_once(&self.label).await?);
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let kb_split = events.split(&kb, &["create", "attach", "start"]);
        let floor_split = events.split(&floor, &["create", "start", "die"]);
        events.stop();
        let k = stats(&kb.iter().map(|w| w.ms).collect::<Vec<_>>());
        let f = stats(&floor.iter().map(|w| w.ms).collect::<Vec<_>>());
        let ratio = k.p50_ms / f.p50_ms;
        self.cold_p50 = k.p50_ms;
        self.rows.push(
            Row::new(format!("cold first cell, new owner (n={n})"), pq(&k))
                .floor(format!("`docker run --rm`: {}", pq(&f)), ratio)
                .target("p50 ≤ 1.3x floor", ratio <= 1.3),
        );
        let show = |split: &[(String, Stats)]| -> String {
            split
                .iter()
                .map(|(name, s)| format!("{name} {}", fmt_ms(s.p50_ms)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        self.notes.push(format!(
            "cold path split by Docker event times (p50 per segment): kernelbox: {}; \
             `docker run --rm`: {}",
            show(&kb_split),
            show(&floor_split)
        ));
        self.details.insert(
            "cold".into(),
            json!({
                "library": k,
                "docker_run_floor": f,
                "ratio_p50": ratio,
                "library_segments": kb_split.iter().map(|(n, s)| json!({"segment": n, "stats": s})).collect::<Vec<_>>(),
                "docker_run_segments": floor_split.iter().map(|(n, s)| json!({"segment": n, "stats": s})).collect::<Vec<_>>(),
            }),
        );
        Ok(())
    }

    async fn cold_once(&self, session: &str) -> Result<Window> {
        let w = Window::begin();
        let r = self.exec(ExecuteRequest::new(session, "x = 1")).await?;
        let w = w.end();
        ok_cell("cold cell", &r)?;
        if r.kernel.reused {
            bail!("cold cell reused a kernel");
        }
        self.kb.clear_session(None, session).await;
        Ok(w)
    }

    /// 3. No-op tool call round trip, measured inside Python.
    async fn tools(&mut self) -> Result<()> {
        let n = self.sizes.tool_calls;
        let tools: BTreeSet<String> = BTreeSet::from(["noop".to_string()]);
        let dispatcher: Arc<dyn ToolDispatcher> =
            Arc::new(FnDispatcher(|_call: ToolCall| Ok(Value::Null)));
        let request = |code: String| ExecuteRequest {
            session: "tools".into(),
            code,
            tools: tools.clone(),
            dispatcher: Some(dispatcher.clone()),
            ..ExecuteRequest::default()
        };
        let r = self
            .exec(request(
                "import json, time, kernel_tools\nkernel_tools.noop()".into(),
            ))
            .await?;
        ok_cell("tool warm-up", &r)?;
        let code = format!(
            "n = {n}\n\
             ts = []\n\
             start = time.perf_counter()\n\
             for _ in range(n):\n    \
                 t = time.perf_counter()\n    \
                 kernel_tools.noop()\n    \
                 ts.append(time.perf_counter() - t)\n\
             total = time.perf_counter() - start\n\
             ts.sort()\n\
             print(json.dumps({{'n': n, 'mean_ms': total / n * 1e3, 'p50_ms': ts[n // 2] * 1e3, \
             'p99_ms': ts[min(n - 1, int(n * 0.99))] * 1e3, 'max_ms': ts[-1] * 1e3}}))\n"
        );
        let t = Instant::now();
        let r = self.exec(request(code)).await?;
        let cell_ms = ms(t.elapsed());
        ok_cell("tool cell", &r)?;
        if r.tool_calls_made as usize != n {
            bail!("tool_calls_made = {}, expected {n}", r.tool_calls_made);
        }
        let line = r
            .output
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| anyhow!("no figures in the tool cell's output: {}", r.output))?;
        let v: Value = serde_json::from_str(line)?;
        let get = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        let (mean, p50, p99) = (get("mean_ms"), get("p50_ms"), get("p99_ms"));
        self.rows.push(
            Row::new(
                format!("no-op tool call from a cell (n={n}, timed in Python)"),
                format!(
                    "mean {} / p50 {} / p99 {}",
                    fmt_ms(mean),
                    fmt_ms(p50),
                    fmt_ms(p99)
                ),
            )
            .floor(
                format!("attach echo p50 {}", fmt_ms(self.attach_p50)),
                p50 / self.attach_p50,
            ),
        );
        self.details.insert(
            "tool_call".into(),
            json!({"in_python": v, "cell_wall_ms": cell_ms, "tool_calls_made": r.tool_calls_made}),
        );
        Ok(())
    }

    /// 5. Throughput: owners x cells concurrently (each owner's cells in sequence).
    async fn throughput(&mut self) -> Result<()> {
        let (owners, cells) = (self.sizes.owners, self.sizes.cells_per_owner);
        let warmups: Vec<_> = (0..owners)
            .map(|o| {
                self.kb
                    .execute(ExecuteRequest::new(format!("tp-{o}"), "x = 0"))
            })
            .collect();
        for r in futures::future::join_all(warmups).await {
            ok_cell("throughput warm-up", &r?)?;
        }
        let t0 = Instant::now();
        let tasks: Vec<_> = (0..owners)
            .map(|o| {
                let kb = self.kb.clone();
                tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(cells);
                    for c in 0..cells {
                        let t = Instant::now();
                        let r = kb
                            .execute(ExecuteRequest::new(format!("tp-{o}"), format!("x = {c}")))
                            .await?;
                        lat.push(ms(t.elapsed()));
                        ok_cell("throughput cell", &r)?;
                    }
                    Ok::<_, anyhow::Error>(lat)
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await??);
        }
        let wall = t0.elapsed().as_secs_f64();
        let s = stats(&all);
        let rate = all.len() as f64 / wall;
        self.rows.push(Row::new(
            format!("throughput, {owners} owners x {cells} cells concurrently"),
            format!("{rate:.0} cells/s; {}", pq(&s)),
        ));
        self.details.insert(
            "throughput".into(),
            json!({"owners": owners, "cells_per_owner": cells, "wall_s": wall, "cells_per_second": rate, "latency": s}),
        );
        Ok(())
    }

    /// 4. Density: N idle kernels.
    async fn density(&mut self) -> Result<()> {
        let n = self.args.density;
        for s in ["warm", "tools"] {
            self.kb.clear_session(None, s).await;
        }
        for o in 0..self.sizes.owners {
            self.kb.clear_session(None, &format!("tp-{o}")).await;
        }
        let leftover = self.kb.list_kernels(None).len();
        if leftover != 0 {
            bail!("{leftover} kernels still live before the density phase");
        }
        let floor_n = n.min(DENSITY_FLOOR_MAX);
        let floor = container_floor(&self.engine, &self.label, floor_n).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let used0 = host_used_bytes().await?;
        let helpers0 = helper_memory();
        let rss0 = vm_rss_bytes()?;
        let t0 = Instant::now();
        let kb = self.kb.clone();
        let starts: Vec<Result<f64>> = futures::stream::iter(0..n)
            .map(|i| {
                let kb = kb.clone();
                async move {
                    let t = Instant::now();
                    let r = kb
                        .execute(ExecuteRequest::new(format!("dense-{i}"), "pass"))
                        .await?;
                    ok_cell("density cell", &r)?;
                    Ok(ms(t.elapsed()))
                }
            })
            .buffer_unordered(DENSITY_CONCURRENCY)
            .collect()
            .await;
        let start_wall = t0.elapsed();
        let lat: Vec<f64> = starts.into_iter().collect::<Result<_>>()?;
        let live = self.kb.list_kernels(None).len();
        let containers = self
            .engine
            .list_containers(&[format!("{CASE}={}", self.label)])
            .await?;
        let running = containers.iter().filter(|c| c.state == "running").count();
        if live != n || running != n {
            bail!("expected {n} live kernels, registry has {live}, docker runs {running}");
        }
        // Let the kernels settle into idle before reading memory.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let used1 = host_used_bytes().await?;
        let helpers1 = helper_memory();
        let rss1 = vm_rss_bytes()?;
        let mut helper_rows = Vec::new();
        let mut helper_json = Map::new();
        for (kind, (count1, pss1)) in &helpers1 {
            let (count0, pss0) = helpers0.get(kind).copied().unwrap_or_default();
            let extra = count1.saturating_sub(count0);
            let per = (*pss1 as f64 - pss0 as f64) / n as f64 / MIB;
            helper_rows.push(if extra > 0 {
                format!("{kind} {per:.2} MiB (+{extra} processes)")
            } else {
                format!("{kind} {per:.2} MiB")
            });
            helper_json.insert(
                kind.to_string(),
                json!({"processes_added": extra, "pss_delta_bytes": *pss1 as i64 - pss0 as i64}),
            );
        }
        let mut cg_usage = 0u64;
        let mut cg_anon = 0u64;
        let mut cg_found = 0usize;
        for c in &containers {
            if let Some((usage, anon)) = cgroup_memory(&c.id) {
                cg_usage += usage;
                cg_anon += anon;
                cg_found += 1;
            }
        }
        let per_kernel = (used1 as f64 - used0 as f64) / n as f64 / MIB;
        let lat_s = stats(&lat);
        let rate = n as f64 / start_wall.as_secs_f64();
        self.rows.push(Row::new(
            format!("start {n} idle kernels ({DENSITY_CONCURRENCY} at a time)"),
            format!(
                "{:.1} s ({rate:.1} kernels/s); per kernel {}",
                start_wall.as_secs_f64(),
                pq(&lat_s)
            ),
        ));
        let mut row = Row::new(
            format!("host memory per idle kernel (`free -b` used delta / {n})"),
            format!("{per_kernel:.1} MiB"),
        )
        .target("≤ 10 MiB", per_kernel <= 10.0);
        // With a handful of containers the host's noise can outweigh them: no ratio then.
        if floor.per_container_mib > 0.5 {
            row = row.floor(
                format!(
                    "idle `sleep` container, same sandbox ({floor_n}): {:.1} MiB",
                    floor.per_container_mib
                ),
                per_kernel / floor.per_container_mib,
            );
        }
        self.rows.push(row);
        if cg_found > 0 {
            self.rows.push(Row::new(
                format!("container cgroup memory per kernel (mean of {cg_found})"),
                format!(
                    "{:.1} MiB charged ({:.1} MiB anon)",
                    cg_usage as f64 / cg_found as f64 / MIB,
                    cg_anon as f64 / cg_found as f64 / MIB
                ),
            ));
        }
        if !helper_rows.is_empty() {
            self.rows.push(Row::new(
                "host processes per kernel (PSS delta / N)",
                helper_rows.join("; "),
            ));
        }
        let slope = (rss1 as f64 - rss0 as f64).max(0.0) / n as f64;
        let at_1000 = rss1 as f64 + slope * 1000usize.saturating_sub(n) as f64;
        let rss_target = if n >= 1000 { rss1 as f64 } else { at_1000 };
        self.rows.push(
            Row::new(
                format!("kernelbox RSS with {n} kernels (VmRSS)"),
                format!(
                    "{:.1} MiB ({:.1} KiB per kernel; {:.1} MiB at 1000{})",
                    rss1 as f64 / MIB,
                    slope / 1024.0,
                    at_1000 / MIB,
                    if n >= 1000 { "" } else { " extrapolated" }
                ),
            )
            .target("< 150 MiB at 1000 kernels", rss_target < 150.0 * MIB),
        );
        self.notes.push(format!(
            "memory method: host memory per kernel = (`free -b` \"used\" after the {n} kernels \
             idled 5 s − before) / {n}; it includes everything the host spends on a kernel \
             (python, docker-init, the containerd shim, daemon bookkeeping, kernel structures) \
             and also any noise from other processes on the host. Cgroup figures sum each \
             container's memory cgroup (v1 memory.usage_in_bytes / memory.stat total_rss, v2 \
             memory.current / anon) and exclude the shim; helper processes are the containerd \
             shims and fuse-overlayfs mounts, by proportional set size (smaps_rollup Pss). \
             kernelbox RSS is this bench process's \
             VmRSS (the library runs in it): {:.1} MiB after start, {:.1} MiB before the \
             density phase, {:.1} MiB after it",
            self.rss_at_start as f64 / MIB,
            rss0 as f64 / MIB,
            rss1 as f64 / MIB
        ));
        self.details.insert(
            "density".into(),
            json!({
                "kernels": n,
                "concurrency": DENSITY_CONCURRENCY,
                "start_wall_s": start_wall.as_secs_f64(),
                "kernels_per_second": rate,
                "start_latency": lat_s,
                "host_used_before_bytes": used0,
                "host_used_after_bytes": used1,
                "host_mib_per_kernel": per_kernel,
                "floor_containers": floor_n,
                "floor_host_mib_per_container": floor.per_container_mib,
                "floor_helpers": floor.helpers,
                "cgroup_containers_found": cg_found,
                "helper_processes": helper_json,
                "cgroup_usage_bytes_total": cg_usage,
                "cgroup_anon_bytes_total": cg_anon,
                "rss_at_start_bytes": self.rss_at_start,
                "rss_before_bytes": rss0,
                "rss_after_bytes": rss1,
                "rss_per_kernel_bytes": slope,
                "rss_at_1000_bytes": at_1000,
            }),
        );
        Ok(())
    }

    /// Optional: ipykernel through jupyter_client, as the reference users know.
    async fn jupyter(&mut self) -> Result<()> {
        if !self.args.jupyter {
            self.notes
                .push("Jupyter comparison skipped (--no-jupyter)".into());
            return Ok(());
        }
        let python = match jupyter_venv().await {
            Ok(p) => p,
            Err(e) => {
                self.notes
                    .push(format!("Jupyter comparison skipped: {e:#}"));
                return Ok(());
            }
        };
        let script = target_dir().join("bench-jupyter.py");
        std::fs::write(&script, JUPYTER_SCRIPT)?;
        let run = Command::new(&python)
            .arg(&script)
            .arg(self.sizes.jupyter_warm.to_string())
            .arg(self.sizes.jupyter_cold.to_string())
            .kill_on_drop(true)
            .output();
        let out = match tokio::time::timeout(Duration::from_secs(300), run).await {
            Ok(Ok(out)) if out.status.success() => out,
            Ok(Ok(out)) => {
                self.notes.push(format!(
                    "Jupyter comparison skipped: the script failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                        .lines()
                        .last()
                        .unwrap_or("")
                ));
                return Ok(());
            }
            Ok(Err(e)) => {
                self.notes.push(format!("Jupyter comparison skipped: {e}"));
                return Ok(());
            }
            Err(_) => {
                self.notes
                    .push("Jupyter comparison skipped: the script took over 300 s".into());
                return Ok(());
            }
        };
        let text = String::from_utf8_lossy(&out.stdout);
        let line = text
            .lines()
            .rev()
            .find(|l| l.starts_with('{'))
            .ok_or_else(|| anyhow!("no figures from the Jupyter script"))?;
        let v: Value = serde_json::from_str(line)?;
        let series = |k: &str| -> Vec<f64> {
            v.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_f64)
                        .map(|s| s * 1e3)
                        .collect()
                })
                .unwrap_or_default()
        };
        let warm = stats(&series("warm_s"));
        let cold = stats(&series("cold_s"));
        self.rows.push(
            Row::new(
                format!(
                    "Jupyter warm exec, ipykernel {} on the host, no container (n={}); ratio = kernelbox ÷ Jupyter",
                    v.get("ipykernel").and_then(Value::as_str).unwrap_or("?"),
                    warm.n
                ),
                pq(&warm),
            )
            .floor(
                format!("kernelbox warm p50 {}", fmt_ms(self.warm_p50)),
                self.warm_p50 / warm.p50_ms,
            ),
        );
        self.rows.push(
            Row::new(
                format!(
                    "Jupyter cold start + first exec (n={}); ratio = kernelbox ÷ Jupyter",
                    cold.n
                ),
                pq(&cold),
            )
            .floor(
                format!("kernelbox cold p50 {}", fmt_ms(self.cold_p50)),
                self.cold_p50 / cold.p50_ms,
            ),
        );
        self.details.insert(
            "jupyter".into(),
            json!({"warm": warm, "cold": cold, "versions": v.get("versions")}),
        );
        Ok(())
    }
}

const JUPYTER_SCRIPT: &str = r#"import json, sys, time
import ipykernel, jupyter_client
from jupyter_client.manager import start_new_kernel

n_warm, n_cold = int(sys.argv[1]), int(sys.argv[2])

def run(kc, code):
    reply = kc.execute_interactive(code, timeout=30, output_hook=lambda m: None)
    assert reply["content"]["status"] == "ok", reply

cold = []
for _ in range(n_cold):
    t = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3")
    run(kc, "x = 1")
    cold.append(time.perf_counter() - t)
    kc.stop_channels()
    km.shutdown_kernel(now=True)

km, kc = start_new_kernel(kernel_name="python3")
for _ in range(20):
    run(kc, "x = 1")
warm = []
for _ in range(n_warm):
    t = time.perf_counter()
    run(kc, "x = 1")
    warm.append(time.perf_counter() - t)
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps({"warm_s": warm, "cold_s": cold, "ipykernel": ipykernel.__version__,
                  "versions": {"ipykernel": ipykernel.__version__,
                               "jupyter_client": jupyter_client.__version__,
                               "python": sys.version.split()[0]}}))
"#;

/// `target/bench-venv` with ipykernel and jupyter_client, created when missing (bounded).
async fn jupyter_venv() -> Result<PathBuf> {
    let venv = target_dir().join("bench-venv");
    let python = venv.join("bin").join("python");
    let importable = || async {
        Command::new(&python)
            .args(["-c", "import ipykernel, jupyter_client"])
            .output()
            .await
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if python.exists() && importable().await {
        return Ok(python);
    }
    let step = |what: &'static str, mut cmd: Command, limit: u64| async move {
        cmd.kill_on_drop(true);
        match tokio::time::timeout(Duration::from_secs(limit), cmd.output()).await {
            Ok(Ok(o)) if o.status.success() => Ok(()),
            Ok(Ok(o)) => Err(anyhow!(
                "{what} failed: {}",
                String::from_utf8_lossy(&o.stderr)
                    .lines()
                    .last()
                    .unwrap_or("")
            )),
            Ok(Err(e)) => Err(anyhow!("{what}: {e}")),
            Err(_) => Err(anyhow!("{what} took over {limit} s")),
        }
    };
    let mut venv_cmd = Command::new("python3");
    venv_cmd.arg("-m").arg("venv").arg(&venv);
    step("python3 -m venv", venv_cmd, 60).await?;
    let mut pip = Command::new(venv.join("bin").join("pip"));
    pip.args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "ipykernel",
        "jupyter_client",
    ]);
    step("pip install ipykernel jupyter_client", pip, 180).await?;
    if !importable().await {
        bail!("ipykernel installed but does not import");
    }
    Ok(python)
}

/// A floor container: the kernel image and a kernel's sandbox, running `cmd` instead of the
/// runner, labelled with the run's case label.
fn floor_spec(label: &str, cmd: &[&str]) -> ContainerSpec {
    ContainerSpec {
        image: IMAGE.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        user: Sandbox::default().user,
        working_dir: "/".into(),
        labels: BTreeMap::from([(CASE.to_string(), label.to_string())]),
        mounts: Vec::new(),
        sandbox: Sandbox::default(),
    }
}

/// The floor of a warm round trip: one line echoed by python3 through a docker attach, in a
/// container created through the same [`Engine`] with the same sandbox as a kernel's (limits,
/// read-only root, no network, no log driver), so only kernelbox's own work differs.
struct EchoFloor {
    engine: Arc<dyn Engine>,
    id: String,
    output: futures::stream::BoxStream<'static, Result<Chunk, kernelbox::EngineError>>,
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    buf: Vec<u8>,
}

impl EchoFloor {
    async fn start(engine: &Arc<dyn Engine>, label: &str) -> Result<EchoFloor> {
        let script = "import sys\nfor l in sys.stdin: sys.stdout.write(l); sys.stdout.flush()";
        let spec = floor_spec(label, &["python3", "-u", "-c", script]);
        let id = engine
            .create_container(&spec)
            .await
            .context("creating the attach floor container")?;
        let started = async {
            let attached = engine.attach(&id).await?;
            engine.start(&id).await?;
            Ok::<_, anyhow::Error>(attached)
        }
        .await;
        let attached = match started {
            Ok(a) => a,
            Err(e) => {
                let _ = engine.remove_container(&id).await;
                return Err(e);
            }
        };
        let mut floor = EchoFloor {
            engine: engine.clone(),
            id,
            output: attached.output,
            input: attached.input,
            buf: Vec::new(),
        };
        for _ in 0..20 {
            floor.sample().await?;
        }
        Ok(floor)
    }

    /// One echo round trip, in milliseconds.
    async fn sample(&mut self) -> Result<f64> {
        let t = Instant::now();
        self.input.write_all(b"ping\n").await?;
        self.input.flush().await?;
        let (buf, output) = (&mut self.buf, &mut self.output);
        let echoed = async {
            loop {
                if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                    buf.drain(..=pos);
                    return Ok(());
                }
                match output.next().await {
                    Some(Ok(Chunk::Stdout(message))) => buf.extend_from_slice(&message),
                    Some(Ok(Chunk::Stderr(message))) => {
                        bail!("echo container: {}", String::from_utf8_lossy(&message))
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => bail!("echo container's attach stream ended"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), echoed)
            .await
            .context("echo timed out")??;
        Ok(ms(t.elapsed()))
    }

    async fn stop(self) {
        let _ = self.engine.remove_container(&self.id).await;
    }
}

/// One `docker run --rm IMAGE python3 -c pass` through the CLI.
async fn docker_run_once(label: &str) -> Result<Window> {
    let w = Window::begin();
    let out = Command::new("docker")
        .args(["run", "--rm", "--label", &format!("{CASE}={label}"), IMAGE])
        .args(["python3", "-c", "pass"])
        .kill_on_drop(true)
        .output()
        .await
        .context("spawning docker")?;
    let w = w.end();
    if !out.status.success() {
        bail!(
            "docker run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(w)
}

fn unix_ns() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
}

/// A timed sample: its duration, and its wall-clock bounds to match Docker events against.
#[derive(Debug, Clone, Copy)]
struct Window {
    ms: f64,
    from_ns: i64,
    to_ns: i64,
}

/// A sample under way.
struct Began(Instant, i64);

impl Window {
    fn begin() -> Began {
        Began(Instant::now(), unix_ns())
    }
}

impl Began {
    fn end(self) -> Window {
        Window {
            ms: ms(self.0.elapsed()),
            from_ns: self.1,
            to_ns: unix_ns(),
        }
    }
}

/// Container events carrying the bench label, with the engine's timestamps.
struct EventLog {
    events: Arc<std::sync::Mutex<Vec<(i64, String)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EventLog {
    fn start(docker: &Docker, label: &str) -> EventLog {
        let filters = HashMap::from([
            ("label".to_string(), vec![format!("{CASE}={label}")]),
            ("type".to_string(), vec!["container".to_string()]),
        ]);
        let options = EventsOptionsBuilder::default().filters(&filters).build();
        let mut stream = docker.events(Some(options));
        let events: Arc<std::sync::Mutex<Vec<(i64, String)>>> = Arc::default();
        let sink = events.clone();
        let task = tokio::spawn(async move {
            while let Some(Ok(e)) = stream.next().await {
                if let (Some(t), Some(action)) = (e.time_nano, e.action) {
                    sink.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((t, action));
                }
            }
        });
        EventLog { events, task }
    }

    /// Splits each window at the first event of each action, in order; p50 per segment.
    fn split(&self, windows: &[Window], actions: &[&str]) -> Vec<(String, Stats)> {
        let events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let mut names = vec![format!("request→{}", actions[0])];
        for pair in actions.windows(2) {
            names.push(format!("{}→{}", pair[0], pair[1]));
        }
        names.push(format!("{}→result", actions[actions.len() - 1]));
        let mut segments: Vec<Vec<f64>> = vec![Vec::new(); names.len()];
        for w in windows {
            let mut points = vec![w.from_ns];
            for a in actions {
                let after = *points.last().unwrap_or(&w.from_ns);
                match events
                    .iter()
                    .filter(|(t, act)| act == a && *t >= after && *t <= w.to_ns)
                    .map(|(t, _)| *t)
                    .min()
                {
                    Some(t) => points.push(t),
                    None => break,
                }
            }
            if points.len() != actions.len() + 1 {
                continue;
            }
            points.push(w.to_ns);
            for (i, pair) in points.windows(2).enumerate() {
                segments[i].push((pair[1] - pair[0]) as f64 / 1e6);
            }
        }
        names
            .into_iter()
            .zip(segments)
            .map(|(n, s)| (n, stats(&s)))
            .collect()
    }

    fn stop(self) {
        self.task.abort();
    }
}

/// The engine's own cost of an idle container, for the density floor.
struct ContainerFloor {
    per_container_mib: f64,
    helpers: Value,
}

/// Starts `n` containers that only sleep, with a kernel's sandbox (init, limits, read-only
/// root, no network) through the same [`Engine`], and measures host memory as for kernels:
/// what any container costs on this host before kernelbox runs Python in it.
async fn container_floor(
    engine: &Arc<dyn Engine>,
    label: &str,
    n: usize,
) -> Result<ContainerFloor> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let used0 = host_used_bytes().await?;
    let helpers0 = helper_memory();
    let spec = floor_spec(label, &["sleep", "infinity"]);
    let started: Vec<Result<String>> = futures::stream::iter(0..n)
        .map(|_| async {
            let id = engine.create_container(&spec).await?;
            engine.start(&id).await?;
            Ok(id)
        })
        .buffer_unordered(DENSITY_CONCURRENCY)
        .collect()
        .await;
    let ids: Vec<String> = started
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    let measured = async {
        if let Some(Err(e)) = started.into_iter().find(Result::is_err) {
            return Err(e.context("starting the density floor containers"));
        }
        // Let them settle into idle before reading memory, as the kernels do.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let used1 = host_used_bytes().await?;
        let helpers1 = helper_memory();
        let mut helpers = Map::new();
        for (kind, (_, pss1)) in &helpers1 {
            let pss0 = helpers0.get(kind).map(|h| h.1).unwrap_or_default();
            let per = (*pss1 as f64 - pss0 as f64) / n as f64 / MIB;
            helpers.insert(kind.to_string(), json!(per));
        }
        Ok(ContainerFloor {
            per_container_mib: (used1 as f64 - used0 as f64) / n as f64 / MIB,
            helpers: Value::Object(helpers),
        })
    }
    .await;
    futures::stream::iter(ids)
        .for_each_concurrent(32, |id| async move {
            let _ = engine.remove_container(&id).await;
        })
        .await;
    measured
}

/// `free -b` "used" (falls back to MemTotal − MemAvailable from /proc/meminfo).
async fn host_used_bytes() -> Result<u64> {
    if let Ok(out) = Command::new("free").arg("-b").output().await {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(used) = text
            .lines()
            .find(|l| l.starts_with("Mem:"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
        {
            return Ok(used);
        }
    }
    let info = std::fs::read_to_string("/proc/meminfo")?;
    let field = |name: &str| -> Option<u64> {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map(|kib| kib * 1024)
    };
    match (field("MemTotal:"), field("MemAvailable:")) {
        (Some(t), Some(a)) => Ok(t.saturating_sub(a)),
        _ => bail!("cannot read host memory"),
    }
}

/// Per-container host helpers (containerd shims, fuse-overlayfs) and the engine's daemons:
/// (processes, summed PSS).
fn helper_memory() -> BTreeMap<&'static str, (usize, u64)> {
    let mut out: BTreeMap<&'static str, (usize, u64)> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let kind = match comm.trim() {
            c if c.starts_with("containerd-shim") => "containerd-shim",
            "fuse-overlayfs" => "fuse-overlayfs",
            // The daemons themselves: their growth is per-kernel bookkeeping.
            "dockerd" => "dockerd",
            "containerd" => "containerd",
            _ => continue,
        };
        let pss = std::fs::read_to_string(path.join("smaps_rollup"))
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("Pss:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            })
            .unwrap_or(0)
            * 1024;
        let slot = out.entry(kind).or_default();
        slot.0 += 1;
        slot.1 += pss;
    }
    out
}

fn vm_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kib| kib * 1024)
        .ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))
}

/// A container's memory cgroup: (charged bytes, anonymous bytes), cgroup v1 or v2.
fn cgroup_memory(id: &str) -> Option<(u64, u64)> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let stat_field = |text: &str, key: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    };
    let v1 = Path::new("/sys/fs/cgroup/memory/docker").join(id);
    if let Some(usage) = read(v1.join("memory.usage_in_bytes")) {
        let stat = read(v1.join("memory.stat")).unwrap_or_default();
        let anon = stat_field(&stat, "total_rss").or_else(|| stat_field(&stat, "rss"))?;
        return Some((usage.trim().parse().ok()?, anon));
    }
    for dir in [
        PathBuf::from(format!("/sys/fs/cgroup/system.slice/docker-{id}.scope")),
        Path::new("/sys/fs/cgroup/docker").join(id),
    ] {
        if let Some(current) = read(dir.join("memory.current")) {
            let stat = read(dir.join("memory.stat")).unwrap_or_default();
            return Some((current.trim().parse().ok()?, stat_field(&stat, "anon")?));
        }
    }
    None
}

fn machine() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map(|kib| kib / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    json!({"cores": cores, "memory_gib": (mem * 10.0).round() / 10.0, "kernel": kernel, "loadavg": loadavg()})
}

/// The 1-minute load average: other work on the host (builds, tests) skews the figures.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
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

async fn run_phases(b: &mut Bench) -> Result<()> {
    eprintln!("[bench] warm cell and attach floor");
    b.warm().await?;
    eprintln!("[bench] warm cell over HTTP");
    b.http().await?;
    eprintln!("[bench] cold first cell and docker run floor");
    b.cold().await?;
    eprintln!("[bench] tool call round trip");
    b.tools().await?;
    eprintln!("[bench] throughput");
    b.throughput().await?;
    eprintln!("[bench] density: {} idle kernels", b.args.density);
    b.density().await?;
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
        let _ = kernelbox::kernel::remove_volume_when_free(engine.as_ref(), &v.name).await;
    }
    Ok((cs.len(), vs.len()))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse()?;
    let load_at_start = loadavg();
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
    let config = Config {
        extra_labels: [(CASE.to_string(), label.clone())].into(),
        watchdog: None,
        sweep_on_start: false,
        max_session_kernels: args.density.max(sizes.owners + 2),
        max_tool_calls: u32::try_from(sizes.tool_calls + 10)?,
        ..Config::default()
    };
    let kb = Orchestrator::start(config, engine.clone()).await?;
    let rss_at_start = vm_rss_bytes()?;
    eprintln!("[bench] label {CASE}={label}");
    let mut b = Bench {
        sizes,
        label: label.clone(),
        engine: engine.clone(),
        docker,
        kb,
        rows: Vec::new(),
        details: Map::new(),
        notes: Vec::new(),
        attach_p50: f64::NAN,
        warm_p50: f64::NAN,
        cold_p50: f64::NAN,
        rss_at_start,
        args,
    };
    let outcome = run_phases(&mut b).await;
    let t = Instant::now();
    b.kb.shutdown().await;
    let shutdown_s = t.elapsed().as_secs_f64();
    let (cs, vs) = leftovers(&engine, &label).await?;
    outcome?;
    if cs + vs > 0 {
        bail!("left behind after shutdown: {cs} containers, {vs} volumes labelled {label}");
    }
    b.notes.push(format!(
        "shutdown with {} kernels took {shutdown_s:.1} s; afterwards docker lists 0 containers \
         and 0 volumes labelled {CASE}={label}",
        b.args.density
    ));
    if others_running > 0 {
        b.notes.push(format!(
            "{others_running} other containers were running on the engine when the bench started"
        ));
    }
    eprintln!("[bench] jupyter reference");
    b.jupyter().await?;

    let table = markdown(&b.rows);
    let m = machine();
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
    for n in &b.notes {
        println!("- {n}");
    }
    let report = json!({
        "command": b.args.command(),
        "machine": m,
        "loadavg_at_start": load_at_start,
        "docker": docker_version,
        "image": IMAGE,
        "label": format!("{CASE}={label}"),
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
    Ok(())
}
