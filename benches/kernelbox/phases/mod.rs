//! The phases of a run, each one `impl Bench` block that measures one thing and adds its table
//! rows, notes and JSON details to the run's [`Bench`]; `main.rs` runs them in order.
//!
//! - `warm.rs`: the warm cell `x = 1` through the library, alternating with the attach echo.
//! - `fake.rs`: the same warm cell on the in-memory fake engine: kernelbox's own share.
//! - `http.rs`: the warm cell through the HTTP API on loopback, on an in-process server.
//! - `cluster.rs`: the cluster: a warm cell through one forward hop, a cold cell with the
//!   PostgreSQL catalog, a node's death to its first `node_lost`, cells/s over three nodes.
//! - `egress.rs`: network egress: an HTTPS request and a 100 MiB download through the proxy
//!   against a bridge container's direct ones; a policy kernel's first cell (never pooled).
//! - `cold.rs`: the first cell of a new owner, against `docker run --rm`, split by Docker
//!   events.
//! - `files.rs`: file upload and download throughput over HTTP against `docker cp`.
//! - `pool.rs`: the warm pool: a new owner's first cell on a hit and on a miss, a burst of new
//!   owners against the pool and its refill, the idle pool's memory.
//! - `tools.rs`: a no-op tool call from inside a cell, timed in Python.
//! - `throughput.rs`: many owners times many cells concurrently.
//! - `images.rs`: the plain and data-science images side by side: size, cold first cell,
//!   idle memory, and the data-science image's first plot.
//! - `hibernate.rs`: hibernation under runsc: checkpoint, restore and the next call of an idle
//!   kernel and of one holding 100 MB, against a cold first cell under runsc.
//! - `snapshots.rs`: snapshots and fork under runsc: an idle kernel's snapshot against the
//!   hibernation's checkpoint, a fork into 4 until all answered against a checkpoint and two
//!   restores.
//! - `density.rs`: N idle kernels: start time, the start rate at 50 to 1000 live kernels
//!   against `docker run -d`, host memory against idle containers, cgroup memory, helper
//!   processes, kernelbox's RSS, and the shutdown that removes them against `docker rm -f`.
//! - `jupyter.rs` (+ `jupyter.py`): ipykernel through jupyter_client in `target/bench-venv`,
//!   the reference users know.

mod cluster;
mod cold;
mod density;
mod egress;
mod fake;
mod files;
mod hibernate;
mod http;
mod images;
mod jupyter;
mod languages;
mod pool;
mod snapshots;
mod throughput;
mod tools;
mod warm;

use std::sync::Arc;

use anyhow::{anyhow, bail, Result};
use bollard::Docker;
use kernelbox::{CellResult, CellStatus, Config, Engine, ExecuteRequest, Orchestrator};
use serde_json::{Map, Value};

use crate::report::Row;
use crate::stats::fmt_ms;
use crate::{Args, Sizes, CASE};

/// Kernels (and floor containers) started at once in the density phase.
pub const DENSITY_CONCURRENCY: usize = 8;

/// Starts in each window of the density phase's start-rate curve, kernelbox's and `docker run
/// -d`'s: kernels started on top of the N idle ones, so the host's cap is N plus this.
pub const RATE_WINDOW: usize = 40;

/// The state of a run: what the phases share, and what they report.
pub struct Bench {
    pub args: Args,
    sizes: Sizes,
    pub label: String,
    engine: Arc<dyn Engine>,
    docker: Docker,
    pub kb: Orchestrator,
    pub rows: Vec<Row>,
    pub details: Map<String, Value>,
    pub notes: Vec<String>,
    /// Attach floor p50, for ratios of later rows.
    attach_p50: f64,
    /// Warm cell p50, for the Jupyter ratio.
    warm_p50: f64,
    cold_p50: f64,
    rss_at_start: u64,
}

/// An orchestrator's config for the bench: everything labelled with the run's case label, no
/// watchdog and no sweep (the bench removes what it made, and checks that).
pub fn config(label: &str) -> Config {
    let mut config = Config::default();
    config.housekeeping.extra_labels = [(CASE.to_string(), label.to_string())].into();
    config.housekeeping.watchdog = None;
    config.housekeeping.sweep_on_start = false;
    // One tenant with workspaces, for the cold start of a workspace kernel (`cold.rs`).
    config.workspaces = Some(kernelbox::config::WorkspacesConfig {
        dir: std::env::temp_dir().join(format!("kernelbox-{label}-workspaces")),
        tenants: [(
            WORKSPACE_TENANT.to_string(),
            kernelbox::config::WorkspacePolicy {
                quota_bytes: 64 * 1024 * 1024,
                ttl: std::time::Duration::from_secs(3600),
                max: 64,
            },
        )]
        .into(),
        total_bytes: None,
    });
    config
}

/// The bench's tenant whose sessions have workspaces (`docs/workspaces.md`).
pub const WORKSPACE_TENANT: &str = "bench-ws";

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

/// The last line of `text` that holds a JSON object: the figures a Python script printed.
/// `whence` completes the error "no figures …".
fn last_json(text: &str, whence: impl std::fmt::Display) -> Result<Value> {
    let line = text
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or_else(|| anyhow!("no figures {whence}"))?;
    Ok(serde_json::from_str(line)?)
}

impl Bench {
    pub fn new(
        args: Args,
        sizes: Sizes,
        label: String,
        engine: Arc<dyn Engine>,
        docker: Docker,
        kb: Orchestrator,
        rss_at_start: u64,
    ) -> Bench {
        Bench {
            args,
            sizes,
            label,
            engine,
            docker,
            kb,
            rows: Vec::new(),
            details: Map::new(),
            notes: Vec::new(),
            attach_p50: f64::NAN,
            warm_p50: f64::NAN,
            cold_p50: f64::NAN,
            rss_at_start,
        }
    }

    async fn exec(&self, request: ExecuteRequest) -> Result<CellResult> {
        let r = self.kb.execute(request).await?;
        Ok(r)
    }

    /// `row` with the attach echo as its floor, for a measure whose p50 is `p50` ms.
    fn vs_attach(&self, row: Row, p50: f64) -> Row {
        row.floor(
            format!("attach echo p50 {}", fmt_ms(self.attach_p50)),
            p50 / self.attach_p50,
        )
    }
}
