//! Hibernation under runsc (`docs/runtimes.md`, "Hibernation"): an idle kernel and one holding
//! 100 MB checkpointed by the reaper and restored by the owner's next call, that call's time
//! against a cold first cell under runsc measured in the same run.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kernelbox::config::HibernateConfig;
use kernelbox::{ExecuteRequest, KernelRuntime, Orchestrator};
use serde_json::json;

use super::{config, ok_cell, Bench};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

/// The idle timeout of the phase's own orchestrator.
const IDLE: Duration = Duration::from_millis(500);

impl Bench {
    /// Phase: hibernation, on an orchestrator of its own (runsc, hibernating, no pool).
    pub async fn hibernate(&mut self) -> Result<()> {
        let n = if self.args.quick { 2 } else { 4 };
        let mut cfg = config(&self.label);
        cfg.workspaces = None;
        cfg.spec.sandbox.runtime = KernelRuntime::Runsc;
        cfg.kernels.idle_timeout = IDLE;
        cfg.pool.size = 0;
        let dir = std::env::temp_dir().join(format!("kernelbox-{}-checkpoints", self.label));
        cfg.hibernate = Some(HibernateConfig {
            dir: Some(dir.clone()),
            // Discarded at stop: the bench leaves nothing behind.
            across_restarts: false,
            ..HibernateConfig::default()
        });
        if !self.engine.runtimes().await?.iter().any(|r| r == "runsc") {
            self.notes
                .push("hibernation: not measured, the engine has no runsc (`.ci/runsc`)".into());
            return Ok(());
        }
        let mut pooled_cfg = config(&self.label);
        pooled_cfg.workspaces = None;
        pooled_cfg.spec.sandbox.runtime = KernelRuntime::Runsc;
        pooled_cfg.pool.size = 1;
        let kb = Orchestrator::start(cfg, self.engine.clone()).await?;
        let result = measure(&kb, n, &dir).await;
        kb.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        let m = result?;
        // A pool hit under runsc: an orchestrator whose own runtime is runsc, so is its pool.
        let kb = Orchestrator::start(pooled_cfg, self.engine.clone()).await?;
        let hits = pool_hits(&kb, n).await;
        kb.shutdown().await;
        let hits = stats(&hits?);
        let cold = stats(&m.cold);
        for (what, c, r, call) in [
            (
                "an idle kernel",
                &m.idle_checkpoint,
                &m.idle_restore,
                &m.idle_call,
            ),
            (
                "a kernel holding 100 MB",
                &m.big_checkpoint,
                &m.big_restore,
                &m.big_call,
            ),
        ] {
            let (c, r, call) = (stats(c), stats(r), stats(call));
            self.rows.push(Row::new(
                format!("hibernation of {what} under runsc: checkpoint (n={n})"),
                pq(&c),
            ));
            self.rows.push(
                Row::new(
                    format!(
                        "first cell after the restore of {what} (n={n}; the restore alone {})",
                        pq(&r)
                    ),
                    pq(&call),
                )
                .floor(
                    format!("cold first cell under runsc: {}", pq(&cold)),
                    call.p50_ms / cold.p50_ms,
                ),
            );
            self.rows.push(
                Row::new(
                    format!("first cell after the restore of {what}, against a pool hit"),
                    pq(&call),
                )
                .floor(
                    format!(
                        "a new session's first cell from the runsc pool: {}",
                        pq(&hits)
                    ),
                    call.p50_ms / hits.p50_ms,
                ),
            );
        }
        self.notes.push(format!(
            "hibernation: the phase's own orchestrator (runsc, `HibernateConfig` defaults, idle \
             timeout {IDLE:?}, no pool); each sample runs a cell, waits past the idle timeout, \
             runs the reaper (the checkpoint, timed by kernelbox) and times the owner's next \
             call `print(x)` (the restore and the cell); the 100 MB kernel holds \
             `bytearray(os.urandom(100 << 20))`; checkpoints on {} ({} MB on disk for the \
             largest); the pool hit on another orchestrator whose runtime (so its pool's) is \
             runsc, pool of 1, each sample waiting for the refill first",
            std::env::temp_dir().display(),
            m.largest_bytes >> 20
        ));
        self.details.insert(
            "hibernate".into(),
            json!({
                "samples": n,
                "cold_runsc": cold,
                "pool_hit_runsc": hits,
                "idle": {"checkpoint": stats(&m.idle_checkpoint), "restore": stats(&m.idle_restore), "call": stats(&m.idle_call)},
                "holding_100mb": {"checkpoint": stats(&m.big_checkpoint), "restore": stats(&m.big_restore), "call": stats(&m.big_call)},
                "largest_checkpoint_bytes": m.largest_bytes,
            }),
        );
        Ok(())
    }
}

/// A new session's first cell from a ready pool of one, `n` times.
async fn pool_hits(kb: &Orchestrator, n: usize) -> Result<Vec<f64>> {
    let mut hits = Vec::new();
    for i in 0..n {
        if !kb.wait_pool_ready(1, Duration::from_secs(120)).await {
            bail!("the runsc pool did not fill within 120 s");
        }
        let session = format!("hib-pool-{i}");
        let t = Instant::now();
        let r = kb.execute(ExecuteRequest::new(&session, "x = 1")).await?;
        hits.push(ms(t.elapsed()));
        ok_cell("pool hit under runsc", &r)?;
        kb.clear_session(None, &session).await;
    }
    Ok(hits)
}

#[derive(Default)]
struct Measured {
    cold: Vec<f64>,
    idle_checkpoint: Vec<f64>,
    idle_restore: Vec<f64>,
    idle_call: Vec<f64>,
    big_checkpoint: Vec<f64>,
    big_restore: Vec<f64>,
    big_call: Vec<f64>,
    largest_bytes: u64,
}

/// Bytes of the checkpoints under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok())
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

async fn measure(kb: &Orchestrator, n: usize, dir: &std::path::Path) -> Result<Measured> {
    let mut m = Measured::default();
    for i in 0..n {
        let t = Instant::now();
        let r = kb
            .execute(ExecuteRequest::new(format!("hib-cold-{i}"), "x = 1"))
            .await?;
        ok_cell("cold runsc cell", &r)?;
        m.cold.push(ms(t.elapsed()));
        kb.clear_session(None, &format!("hib-cold-{i}")).await;
        for (big, code) in [
            (false, "x = 1"),
            (
                true,
                "import os\nx = 1\nbig = bytearray(os.urandom(100 << 20))",
            ),
        ] {
            let session = format!("hib-{big}-{i}");
            let r = kb.execute(ExecuteRequest::new(&session, code)).await?;
            ok_cell("hibernation's first cell", &r)?;
            tokio::time::sleep(IDLE + Duration::from_millis(200)).await;
            kb.reap_once().await;
            if kb.hibernated() != 1 {
                bail!("the idle kernel did not hibernate");
            }
            m.largest_bytes = m.largest_bytes.max(bytes_under(dir));
            let t = Instant::now();
            let r = kb
                .execute(ExecuteRequest::new(&session, "print(x)"))
                .await?;
            let call = ms(t.elapsed());
            ok_cell("the cell after restore", &r)?;
            let Some(restored) = r.kernel.restored else {
                bail!("the kernel was not restored: {:?}", r.kernel);
            };
            let (c, rs, calls) = match big {
                false => (
                    &mut m.idle_checkpoint,
                    &mut m.idle_restore,
                    &mut m.idle_call,
                ),
                true => (&mut m.big_checkpoint, &mut m.big_restore, &mut m.big_call),
            };
            c.push(restored.checkpoint_seconds * 1000.0);
            rs.push(restored.restore_seconds * 1000.0);
            calls.push(call);
            kb.clear_session(None, &session).await;
        }
    }
    Ok(m)
}
