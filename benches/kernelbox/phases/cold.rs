//! The first cell of a new owner, against `docker run --rm`, each split into segments by the
//! engine's event times.

use std::time::Duration;

use anyhow::{bail, Result};
use kernelbox::orchestrator::Scope;
use kernelbox::ExecuteRequest;
use serde_json::json;

use super::{ok_cell, Bench, WORKSPACE_TENANT};
use crate::events::{EventLog, Window};
use crate::floors::docker_run_once;
use crate::report::Row;
use crate::stats::{fmt_ms, pq, stats, Stats};

impl Bench {
    /// Phase 3: the cold first cell for a new owner, against `docker run --rm`.
    pub async fn cold(&mut self) -> Result<()> {
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
        let segments = |split: &[(String, Stats)]| -> Vec<_> {
            split
                .iter()
                .map(|(n, s)| json!({"segment": n, "stats": s}))
                .collect()
        };
        self.details.insert(
            "cold".into(),
            json!({
                "library": k,
                "docker_run_floor": f,
                "ratio_p50": ratio,
                "library_segments": segments(&kb_split),
                "docker_run_segments": segments(&floor_split),
            }),
        );
        self.cold_workspaces(n, k.p50_ms).await
    }

    /// The cold first cell of a session whose tenant has workspaces, beside the plain one
    /// (`plain_p50` ms): with a new workspace (its file system made) and with one restored
    /// (the session's kernel evicted, the next one mounting it).
    async fn cold_workspaces(&mut self, n: usize, plain_p50: f64) -> Result<()> {
        let (mut made, mut restored) = (Vec::new(), Vec::new());
        for i in 0..n {
            let session = format!("ws-cold-{i}");
            let scope = || Scope::session(session.as_str()).tenant(WORKSPACE_TENANT);
            for (samples, want_restored) in [(&mut made, false), (&mut restored, true)] {
                let w = Window::begin();
                let r = self.exec(ExecuteRequest::new(scope(), "x = 1")).await?;
                let w = w.end();
                ok_cell("workspace cold cell", &r)?;
                if r.kernel.reused
                    || r.kernel.workspace.as_ref().map(|ws| ws.restored) != Some(want_restored)
                {
                    bail!("workspace cold cell: {:?}", r.kernel);
                }
                samples.push(w.ms);
                self.kb
                    .evict_session(Some(WORKSPACE_TENANT), &session)
                    .await;
            }
            if let Some(ws) = self.kb.workspaces() {
                ws.delete(WORKSPACE_TENANT, &session).await?;
            }
        }
        if let Some(ws) = &self.kb.config().workspaces {
            let _ = std::fs::remove_dir(&ws.dir);
        }
        let (m, r) = (stats(&made), stats(&restored));
        for (what, s) in [("new workspace", &m), ("restored workspace", &r)] {
            self.rows.push(
                Row::new(format!("cold first cell, {what} (n={n})"), pq(s)).floor(
                    format!("plain cold first cell p50 {}", fmt_ms(plain_p50)),
                    s.p50_ms / plain_p50,
                ),
            );
        }
        self.details.insert(
            "cold_workspace".into(),
            json!({"new": m, "restored": r, "plain_p50_ms": plain_p50}),
        );
        Ok(())
    }

    /// One timed first cell of a new owner, whose kernel is then cleared.
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
}
