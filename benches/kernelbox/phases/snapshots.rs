//! Snapshots and fork under runsc (`docs/snapshots.md`): the snapshot of an idle kernel
//! against the hibernation's checkpoint of one, and a fork into 4 until all 4 answered their
//! first cell against a checkpoint and two restores, all measured in the same run.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use kernelbox::config::HibernateConfig;
use kernelbox::{ExecuteRequest, KernelRuntime, Orchestrator, Scope};
use serde_json::json;

use super::{config, ok_cell, Bench};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

/// The idle timeout of the hibernating orchestrator (the floors').
const IDLE: Duration = Duration::from_millis(800);

/// Forks of one fork call.
const FORKS: usize = 4;

#[derive(Default)]
struct Measured {
    /// The hibernation's checkpoint of an idle kernel, and its restore (kernelbox's timing).
    checkpoint: Vec<f64>,
    restore: Vec<f64>,
    /// A snapshot of an idle kernel: the kernel's pause (the checkpoint), and the whole call
    /// (the checkpoint, the snapshot kept, the kernel reconnected).
    snapshot_pause: Vec<f64>,
    snapshot_call: Vec<f64>,
    /// A fork into [`FORKS`] until each answered its first cell.
    fork: Vec<f64>,
    snapshot_bytes: u64,
}

impl Bench {
    /// Phase: snapshots and forks, on orchestrators of their own (runsc, no pool).
    pub async fn snapshots(&mut self) -> Result<()> {
        let n = if self.args.quick { 2 } else { 4 };
        if !self.engine.runtimes().await?.iter().any(|r| r == "runsc") {
            self.notes
                .push("snapshots: not measured, the engine has no runsc (`.ci/runsc`)".into());
            return Ok(());
        }
        let dir = std::env::temp_dir().join(format!("kernelbox-{}-snapshots", self.label));
        let mut hib = config(&self.label);
        hib.workspaces = None;
        hib.spec.sandbox.runtime = KernelRuntime::Runsc;
        hib.kernels.idle_timeout = IDLE;
        hib.pool.size = 0;
        hib.hibernate = Some(HibernateConfig {
            dir: Some(dir.join("checkpoints")),
            across_restarts: false,
            ..HibernateConfig::default()
        });
        let mut snap = config(&self.label);
        snap.workspaces = None;
        snap.spec.sandbox.runtime = KernelRuntime::Runsc;
        snap.pool.size = 0;
        snap.snapshots.dir = Some(dir.join("snapshots"));
        let mut m = Measured::default();
        let kb = Orchestrator::start(hib, self.engine.clone()).await?;
        let floors = hibernations(&kb, n, &mut m).await;
        kb.shutdown().await;
        floors?;
        let kb = Orchestrator::start(snap, self.engine.clone()).await?;
        let measured = snapshots_and_forks(&kb, n, &mut m).await;
        kb.shutdown().await;
        let _ = std::fs::remove_dir_all(&dir);
        measured?;
        let (c, r) = (stats(&m.checkpoint), stats(&m.restore));
        let (pause, call, fork) = (
            stats(&m.snapshot_pause),
            stats(&m.snapshot_call),
            stats(&m.fork),
        );
        let floor = format!("hibernation checkpoint of an idle runsc kernel: {}", pq(&c));
        self.rows.push(
            Row::new(
                format!("snapshot of an idle runsc kernel: its pause (n={n})"),
                pq(&pause),
            )
            .floor(floor.clone(), pause.p50_ms / c.p50_ms)
            .target("p50 <= 1.2x", pause.p50_ms <= 1.2 * c.p50_ms),
        );
        self.rows.push(
            Row::new(
                format!("snapshot call of an idle runsc kernel, reconnected (n={n})"),
                pq(&call),
            )
            .floor(floor, call.p50_ms / c.p50_ms),
        );
        let budget = c.p50_ms + 2.0 * r.p50_ms;
        self.rows.push(
            Row::new(
                format!("fork of an idle runsc kernel into {FORKS}: all answered their first cell (n={n})"),
                pq(&fork),
            )
            .floor(
                format!(
                    "checkpoint + 2 x restore, p50: {budget:.0} ms (restore {})",
                    pq(&r)
                ),
                fork.p50_ms / budget,
            )
            .target("p50 <= 1x", fork.p50_ms <= budget),
        );
        self.notes.push(format!(
            "snapshots: two orchestrators of the phase's own (runsc, no pool): one hibernating \
             (idle timeout {IDLE:?}) for the floors, the checkpoint and restore of an idle \
             kernel timed by kernelbox; one snapshotting into {}: a snapshot's pause is the \
             engine's checkpoint left running, its call adds keeping it and reconnecting the \
             kernel; a fork is timed from the call to the last of its {FORKS} forks' first \
             `print(x)`, the forks' cells run in parallel; a snapshot of an idle kernel holds \
             {} MB, a fork's files are hard links of it (0 bytes each)",
            std::env::temp_dir().display(),
            m.snapshot_bytes >> 20
        ));
        self.details.insert(
            "snapshots".into(),
            json!({
                "samples": n,
                "hibernation_checkpoint": c,
                "hibernation_restore": r,
                "snapshot_pause": pause,
                "snapshot_call": call,
                "fork_into_4": fork,
                "snapshot_bytes": m.snapshot_bytes,
            }),
        );
        Ok(())
    }
}

async fn hibernations(kb: &Orchestrator, n: usize, m: &mut Measured) -> Result<()> {
    for i in 0..n {
        let session = format!("snap-hib-{i}");
        ok_cell(
            "the hibernated kernel's first cell",
            &kb.execute(ExecuteRequest::new(&session, "x = 1")).await?,
        )?;
        tokio::time::sleep(IDLE + Duration::from_millis(200)).await;
        kb.reap_once().await;
        let r = kb
            .execute(ExecuteRequest::new(&session, "print(x)"))
            .await?;
        ok_cell("the cell after the restore", &r)?;
        let Some(restored) = r.kernel.restored else {
            bail!("the kernel was not restored: {:?}", r.kernel);
        };
        m.checkpoint.push(restored.checkpoint_seconds * 1000.0);
        m.restore.push(restored.restore_seconds * 1000.0);
        kb.clear_session(None, &session).await;
    }
    Ok(())
}

async fn snapshots_and_forks(kb: &Orchestrator, n: usize, m: &mut Measured) -> Result<()> {
    for i in 0..n {
        let source = format!("snap-src-{i}");
        ok_cell(
            "the source's first cell",
            &kb.execute(ExecuteRequest::new(&source, "x = 1")).await?,
        )?;
        let t = Instant::now();
        let snap = kb.snapshots().take(&Scope::session(&source), None).await?;
        m.snapshot_call.push(ms(t.elapsed()));
        m.snapshot_pause.push(snap.checkpoint_seconds * 1000.0);
        m.snapshot_bytes = m.snapshot_bytes.max(snap.bytes);
        kb.snapshots().delete(None, &snap.id).await?;
        let names: Vec<String> = (0..FORKS).map(|f| format!("snap-fork-{i}-{f}")).collect();
        let t = Instant::now();
        let forks = kb
            .snapshots()
            .fork(&Scope::session(&source), names.clone())
            .await?;
        if let Some(failed) = forks.forks.iter().find(|f| f.kernel.is_none()) {
            bail!("a fork failed: {failed:?}");
        }
        let cells = names
            .iter()
            .map(|s| kb.execute(ExecuteRequest::new(s, "print(x)")));
        for r in futures::future::join_all(cells).await {
            ok_cell("a fork's first cell", &r?)?;
        }
        m.fork.push(ms(t.elapsed()));
        for s in names.iter().chain([&source]) {
            kb.clear_session(None, s).await;
        }
    }
    Ok(())
}
