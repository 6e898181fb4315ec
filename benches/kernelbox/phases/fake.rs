//! kernelbox's own cost per warm cell, on the in-memory fake engine (`test-util` feature): the
//! same orchestrator, registry and kernel code as the warm row, with the container replaced by
//! a task that answers the runner protocol in-process. What it measures is the host's share of
//! a warm cell; the warm row minus this is Docker's attach path and Python.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Result};
use kernelbox::docker::fake::FakeEngine;
use kernelbox::{Config, ExecuteRequest, Orchestrator};
use serde_json::json;

use super::{ok_cell, Bench};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

impl Bench {
    /// The warm cell `x = 1` through the library on the fake engine.
    pub async fn fake(&mut self) -> Result<()> {
        let n = self.sizes.warm;
        let mut config = Config::default();
        config.housekeeping.watchdog = None;
        config.housekeeping.sweep_on_start = false;
        let kb = Orchestrator::start(config, Arc::new(FakeEngine::default())).await?;
        let measured = async {
            for _ in 0..20 {
                ok_cell(
                    "fake warm-up",
                    &kb.execute(ExecuteRequest::new("fake", "x = 1")).await?,
                )?;
            }
            let mut wall = Vec::with_capacity(n);
            for _ in 0..n {
                let t = Instant::now();
                let r = kb.execute(ExecuteRequest::new("fake", "x = 1")).await?;
                wall.push(ms(t.elapsed()));
                ok_cell("fake warm cell", &r)?;
                if !r.kernel.reused {
                    bail!("a warm cell on the fake engine ran in a new kernel");
                }
            }
            Ok(wall)
        }
        .await;
        kb.shutdown().await;
        let w = stats(&measured?);
        let share = w.p50_ms / self.warm_p50;
        self.rows.push(Row::new(
            format!("warm cell `x = 1`, in-memory fake engine (n={n}): kernelbox's own cost"),
            format!("{} ({:.0}% of the warm cell's p50)", pq(&w), share * 100.0),
        ));
        self.details.insert(
            "fake_engine_warm".into(),
            json!({"wall": w, "share_of_warm_p50": share}),
        );
        Ok(())
    }
}
