//! The usage ledger (`docs/usage.md`, "The usage ledger"): every
//! [`LEDGER_FLUSH`] one task samples each registered kernel's cgroup (alive time, CPU time,
//! peak memory: `docker/cpu.rs`) into the pending usage, then writes the pending usage (cells,
//! commands, file bytes and pool hits recorded as they happen) to the catalog and prunes hours
//! past [`LEDGER_RETENTION_SECONDS`]. At shutdown it samples and flushes once more. A kernel
//! that dies (OOM, kill, node loss) is accounted up to its last sample; a `kill -9` of the
//! server loses at most one interval.

use std::collections::HashMap;

use tokio::time::Instant;

use super::Orchestrator;
use crate::catalog::CatalogError;
use crate::docker::cpu::{memory_peak, CpuFile};
use crate::usage::{group, hour_of, GroupBy, UsageRow, LEDGER_FLUSH, LEDGER_RETENTION_SECONDS};

/// What the ledger knows of one kernel between samples.
struct Seen {
    /// Its CPU time file, once found.
    file: Option<CpuFile>,
    /// CPU time at the last sample, in nanoseconds.
    cpu_ns: u64,
    /// When it was last sampled.
    at: Instant,
}

/// One kernel to sample.
struct Due {
    id: String,
    tenant: String,
    session: String,
    file: Option<CpuFile>,
}

impl Orchestrator {
    /// Samples and flushes every [`LEDGER_FLUSH`] until shutdown, then once more.
    pub(super) async fn keep_ledger(&self) {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        loop {
            let stopping = tokio::select! {
                _ = self.inner.cancel.cancelled() => true,
                _ = tokio::time::sleep(LEDGER_FLUSH) => false,
            };
            self.sample_usage(&mut seen).await;
            self.flush_usage(true).await;
            if stopping {
                return;
            }
        }
    }

    /// One round: each registered kernel's alive time since its last sample (or since the
    /// previous round, for one new since), CPU time since its last sample (all of it, for a
    /// new one) and peak memory added to its session's pending usage.
    async fn sample_usage(&self, seen: &mut HashMap<String, Seen>) {
        let due: Vec<Due> = self
            .inner
            .registry
            .slots()
            .into_iter()
            .filter_map(|slot| {
                let kernel = slot.kernel.get()?;
                Some(Due {
                    id: kernel.id.clone(),
                    tenant: slot.key.owner.tenant.clone(),
                    session: slot.key.owner.session.clone(),
                    file: seen.get(&kernel.id).and_then(|s| s.file.clone()),
                })
            })
            .collect();
        let live: std::collections::HashSet<String> = due.iter().map(|d| d.id.clone()).collect();
        seen.retain(|id, _| live.contains(id));
        let wanted: Vec<(String, Option<CpuFile>)> =
            due.iter().map(|d| (d.id.clone(), d.file.clone())).collect();
        let Ok(read) = tokio::task::spawn_blocking(move || {
            wanted
                .into_iter()
                .map(|(id, file)| {
                    let file = file.or_else(|| CpuFile::find(&id).ok());
                    let cpu = file.as_ref().and_then(|f| f.read_ns().ok());
                    (file, cpu, memory_peak(&id))
                })
                .collect::<Vec<_>>()
        })
        .await
        else {
            return;
        };
        let now = Instant::now();
        for (due, (file, cpu, peak)) in due.into_iter().zip(read) {
            let previous = seen.get(&due.id);
            let since = previous.map_or(LEDGER_FLUSH, |s| now.saturating_duration_since(s.at));
            let cpu_ns = cpu.unwrap_or(previous.map_or(0, |s| s.cpu_ns));
            let cpu_delta = cpu_ns.saturating_sub(previous.map_or(0, |s| s.cpu_ns));
            self.inner.ledger.record(&due.tenant, &due.session, |r| {
                r.kernel_seconds += since.as_secs_f64();
                r.cpu_seconds += cpu_delta as f64 / 1e9;
                r.peak_memory_bytes = r.peak_memory_bytes.max(peak.unwrap_or(0));
            });
            seen.insert(
                due.id,
                Seen {
                    file,
                    cpu_ns,
                    at: now,
                },
            );
        }
    }

    /// Writes the pending usage to the ledger and (with `prune`) prunes old hours; rows that fail are kept
    /// for the next flush (logged).
    async fn flush_usage(&self, prune: bool) {
        // Open connections' bytes so far count in the hour they moved in (docs/usage.md).
        if let Some(egress) = &self.inner.egress {
            egress.settle_usage();
        }
        let rows = self.inner.ledger.take();
        if rows.is_empty() && !prune {
            return;
        }
        let store = self.inner.ledger_store.clone();
        let keep_from = hour_of(crate::clock::unix_now().saturating_sub(LEDGER_RETENTION_SECONDS));
        let written = tokio::task::spawn_blocking(move || {
            let result = store.add_usage(&rows, keep_from);
            (rows, result)
        })
        .await;
        match written {
            Ok((_, Ok(()))) => {}
            Ok((rows, Err(e))) => {
                tracing::warn!(error = %e, "writing the usage ledger");
                self.inner.ledger.restore(rows);
            }
            Err(e) => tracing::warn!(error = %e, "the usage ledger's write task failed"),
        }
    }

    /// The usage ledger over `[from, to)` (seconds since the epoch, widened to whole hours),
    /// of `tenant` only when given, grouped as asked; what is pending is flushed first, so a
    /// report includes every cell ended before it.
    pub async fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
        group_by: GroupBy,
    ) -> Result<Vec<UsageRow>, CatalogError> {
        self.flush_usage(false).await;
        let store = self.inner.ledger_store.clone();
        let tenant = tenant.map(str::to_string);
        let (from, to) = (
            hour_of(from),
            hour_of(to.saturating_add(crate::usage::HOUR - 1)),
        );
        let rows = tokio::task::spawn_blocking(move || store.usage(tenant.as_deref(), from, to))
            .await
            .map_err(|e| CatalogError::Shared {
                reason: format!("the usage read task failed: {e}"),
            })??;
        Ok(group(rows, group_by))
    }
}
