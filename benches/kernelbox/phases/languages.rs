//! Kernels of other languages beside Python's (`docs/contract.md`, "Languages"): a warm Bash
//! and a warm JavaScript cell against a warm Python cell, a new owner's first Bash and
//! JavaScript cell against its first Python cell, and the idle memory of each kernel, in the
//! same run on the same machine.

use anyhow::{bail, Result};
use kernelbox::orchestrator::Scope;
use kernelbox::wire::Language;
use kernelbox::ExecuteRequest;
use serde_json::json;

use super::{ok_cell, Bench};
use crate::events::Window;
use crate::host::{cgroup_memory, MIB};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

/// A trivial cell in each language.
fn cell(language: Language) -> &'static str {
    match language {
        Language::Bash => "x=1",
        // A declaration: no value to show, as Python's assignment.
        Language::Javascript | Language::Typescript => "var x = 1",
        Language::Python => "x = 1",
    }
}

impl Bench {
    /// The languages phase: warm and cold cells and idle memory, Bash and JavaScript against
    /// Python.
    pub async fn languages(&mut self) -> Result<()> {
        let n = self.sizes.warm.min(500);
        let langs = [Language::Python, Language::Bash, Language::Javascript];
        let scope = |l: Language| Scope::session("languages").language(l);
        for l in langs {
            for _ in 0..20 {
                ok_cell(
                    "warm-up",
                    &self.exec(ExecuteRequest::new(scope(l), cell(l))).await?,
                )?;
            }
        }
        // The languages alternate in blocks of 10, so all see the same machine.
        let mut warm = langs.map(|_| Vec::with_capacity(n));
        while warm[langs.len() - 1].len() < n {
            for (i, l) in langs.into_iter().enumerate() {
                for _ in 0..10.min(n - warm[i].len()) {
                    let t = std::time::Instant::now();
                    let r = self.exec(ExecuteRequest::new(scope(l), cell(l))).await?;
                    warm[i].push(ms(t.elapsed()));
                    ok_cell("warm cell", &r)?;
                    if !r.kernel.reused {
                        bail!("warm {l} cell ran in a new kernel");
                    }
                }
            }
        }
        let wp = stats(&warm[0]);
        let mut warm_details = serde_json::Map::new();
        warm_details.insert("python".into(), json!(wp));
        for (i, l) in langs.into_iter().enumerate().skip(1) {
            let wl = stats(&warm[i]);
            let ratio = wl.p50_ms / wp.p50_ms;
            self.rows.push(
                Row::new(
                    format!("warm {l} cell `{}`, library (n={n})", cell(l)),
                    pq(&wl),
                )
                .floor(format!("warm Python cell `x = 1`: {}", pq(&wp)), ratio)
                .target("p50 ≤ 1.5x Python's", ratio <= 1.5),
            );
            warm_details.insert(l.name().into(), json!({"stats": wl, "ratio_p50": ratio}));
        }
        // Idle memory of the two kernels of the session, once both sat idle (the Python runner
        // trims its heap after a second with nothing to do; both had their last cell just now).
        let mut idle = Vec::new();
        for l in langs {
            let r = self.exec(ExecuteRequest::new(scope(l), cell(l))).await?;
            let info = self.docker.inspect_container(&r.kernel.id, None).await?;
            idle.push((l, info.id.unwrap_or_default()));
        }
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let mut memory = serde_json::Map::new();
        for (l, id) in &idle {
            if let Some((charged, anon)) = cgroup_memory(id) {
                let (c, a) = (charged as f64 / MIB, anon as f64 / MIB);
                self.rows.push(Row::new(
                    format!("idle {l} kernel memory (cgroup, after 21 cells)"),
                    format!("{c:.1} MiB charged ({a:.1} MiB anon)"),
                ));
                memory.insert(l.name().into(), json!({"charged_mib": c, "anon_mib": a}));
            }
        }
        self.kb.clear_session(None, "languages").await;
        // Cold first cells, alternating.
        let nc = self.sizes.cold;
        let mut cold = langs.map(|_| Vec::with_capacity(nc));
        for i in 0..nc {
            for (j, l) in langs.into_iter().enumerate() {
                let session = format!("languages-cold-{i}");
                let w = Window::begin();
                let r = self
                    .exec(ExecuteRequest::new(
                        Scope::session(session.as_str()).language(l),
                        cell(l),
                    ))
                    .await?;
                let w = w.end();
                ok_cell("cold cell", &r)?;
                if r.kernel.reused {
                    bail!("cold {l} cell reused a kernel");
                }
                cold[j].push(w.ms);
            }
            self.kb
                .clear_session(None, &format!("languages-cold-{i}"))
                .await;
        }
        let cp = stats(&cold[0]);
        let mut cold_details = serde_json::Map::new();
        cold_details.insert("python".into(), json!(cp));
        for (i, l) in langs.into_iter().enumerate().skip(1) {
            let cl = stats(&cold[i]);
            let cold_ratio = cl.p50_ms / cp.p50_ms;
            self.rows.push(
                Row::new(format!("cold first {l} cell, new owner (n={nc})"), pq(&cl))
                    .floor(format!("cold first Python cell: {}", pq(&cp)), cold_ratio)
                    .target("p50 ≤ 1.5x Python's", cold_ratio <= 1.5),
            );
            cold_details.insert(
                l.name().into(),
                json!({"stats": cl, "ratio_p50": cold_ratio}),
            );
        }
        self.details.insert(
            "languages".into(),
            json!({"warm": warm_details, "cold": cold_details, "idle_memory": memory}),
        );
        Ok(())
    }
}
