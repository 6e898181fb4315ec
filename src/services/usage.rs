//! The usage ledger (`docs/usage.md`, "The usage ledger"): every
//! [`LEDGER_FLUSH`] one task samples each registered kernel's cgroup (alive time, CPU time,
//! peak memory: `docker/cpu.rs`) into the pending usage, then writes the pending usage (cells,
//! commands, file bytes and pool hits recorded as they happen) to the catalog and prunes hours
//! past [`LEDGER_RETENTION_SECONDS`]. At shutdown it samples and flushes once more. A kernel
//! that dies (OOM, kill, node loss) is accounted up to its last sample; a `kill -9` of the
//! server loses at most one interval. A service of the orchestrator: [`UsageLedger`] owns the
//! pending usage and the store it is flushed to; cells, commands, file transfers and pool
//! hits record into [`UsageLedger::pending`] as they happen.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::catalog::{Catalog, CatalogError};
use crate::docker::cpu::{memory_peak, CpuFile};
use crate::egress::Egress;
use crate::registry::Registry;
use crate::usage::{
    group, hour_of, GroupBy, Pending, UsageRow, LEDGER_FLUSH, LEDGER_RETENTION_SECONDS,
};

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

/// The usage ledger: the usage recorded since the last flush, where it is kept (the catalog,
/// or memory without one), and the egress whose open connections' bytes are settled into it
/// before each flush.
pub(crate) struct UsageLedger {
    pending: Arc<Pending>,
    store: Arc<dyn Catalog>,
    egress: Option<Arc<Egress>>,
    /// Held from taking the pending rows until they are written, so that a report made while
    /// another flush is writing (two reports at once, or the periodic flush) waits for it and
    /// reads every row taken before it.
    flushing: tokio::sync::Mutex<()>,
}

impl UsageLedger {
    /// A ledger kept in `store`; `egress` counts its bytes into it.
    pub(crate) fn new(store: Arc<dyn Catalog>, egress: Option<Arc<Egress>>) -> UsageLedger {
        let pending = Arc::new(Pending::default());
        if let Some(egress) = &egress {
            egress.count_usage_in(pending.clone());
        }
        UsageLedger {
            pending,
            store,
            egress,
            flushing: tokio::sync::Mutex::new(()),
        }
    }

    /// The usage recorded since the last flush, for a cell, command or transfer to add to.
    pub(crate) fn pending(&self) -> &Arc<Pending> {
        &self.pending
    }

    /// Samples `registry`'s kernels and flushes every [`LEDGER_FLUSH`] until `cancel`, then
    /// once more.
    pub(crate) async fn keep(&self, registry: &Registry, cancel: CancellationToken) {
        let mut seen: HashMap<String, Seen> = HashMap::new();
        loop {
            let stopping = tokio::select! {
                _ = cancel.cancelled() => true,
                _ = tokio::time::sleep(LEDGER_FLUSH) => false,
            };
            self.sample(registry, &mut seen).await;
            self.flush(true).await;
            if stopping {
                return;
            }
        }
    }

    /// One round: each registered kernel's alive time since its last sample (or since the
    /// previous round, for one new since), CPU time since its last sample (all of it, for a
    /// new one) and peak memory added to its session's pending usage.
    async fn sample(&self, registry: &Registry, seen: &mut HashMap<String, Seen>) {
        let due: Vec<Due> = registry
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
            self.pending.record(&due.tenant, &due.session, |r| {
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
    async fn flush(&self, prune: bool) {
        let _writing = self.flushing.lock().await;
        // Open connections' bytes so far count in the hour they moved in (docs/usage.md).
        if let Some(egress) = &self.egress {
            egress.settle_usage();
        }
        let rows = self.pending.take();
        if rows.is_empty() && !prune {
            return;
        }
        let store = self.store.clone();
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
                self.pending.restore(rows);
            }
            Err(e) => tracing::warn!(error = %e, "the usage ledger's write task failed"),
        }
    }

    /// The usage ledger over `[from, to)` (seconds since the epoch, widened to whole hours),
    /// of `tenant` only when given, grouped as asked; what is pending is flushed first, so a
    /// report includes every cell ended before it.
    pub(crate) async fn report(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
        group_by: GroupBy,
    ) -> Result<Vec<UsageRow>, CatalogError> {
        self.flush(false).await;
        let store = self.store.clone();
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
