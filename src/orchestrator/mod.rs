//! The orchestrator: the library's front door. Resolves owners to kernels through the
//! registry, runs cells, turns outcomes into [`CellResult`](crate::CellResult)s, and owns every background task
//! (event monitor, reaper, the pool's refill) and the watchdog. Features with state of their
//! own are services it builds at start and calls at named points (`services/`: hibernation,
//! the usage ledger, the audit trail, workspace transfers, the runaway watch).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Orchestrator`] and its shared `Inner`, accessors, stats |
//! | `start.rs` | the start: the config validated once, the catalog restored, the engine checked, sweep, watchdog, then the background tasks |
//! | `request.rs` | what callers hand in and get back: [`Scope`] (whose kernel, made how), [`ExecuteRequest`], [`AdmissionNotice`], errors, [`KernelSummary`], [`Stats`] |
//! | `lease.rs` | what an execute and an upload share: `acquire` (admission, then the kernel reused, taken from the pool or spawned), its steps on an `Acquisition`, the `Lease` it gives, the catalog's confirmation of a new kernel |
//! | `execute.rs` | one execute in steps on its `Call`: resolve the request, acquire, run the cell, settle its [`CellResult`](crate::CellResult) (the kernel's `cell::Ending` refined with what only the orchestrator sees, output capped) |
//! | `command.rs` | a shell command in an owner's kernel container ([`CommandRequest`]): the kernel held or started, the per-session limit, adopted if its caller goes |
//! | `files.rs` | files in and out of an owner's kernel: write, read, list, remove ([`FileRequest`]); the kernel held for one (`Hold`); bytes counted and slow downloads cut by `services::FileMeter` |
//! | `lifecycle.rs` | interrupt, clear, evict, release a child, list, a reaper pass (`services::Reaper`) |
//! | `migration.rs` | migration on drain, as functions (no methods): the migration service handed the registry and the engine to take an idle kernel's checkpoint out, close its books, and seed an arriving one |
//! | `node.rs` | what a cluster node asks: whether a session has a kernel here, a claimed session's catalog rows taken over, the fence, the watchdog told how long the node's lease is trusted (`WatchdogSlot`; docs/cluster.md) |
//! | `pool.rs` | the warm pool: the refill task, pooled kernels' disposal, naming a taken kernel after its owner |
//! | `process.rs` | a background process started on an owner's kernel, handed to the processes service |
//! | `spawner.rs` | what every kernel start shares: labels, the event monitor, the file channels' refusal, the starts counted; the common [`SpawnRequest`](crate::kernel::SpawnRequest) |
//! | `running.rs` | the calls running now, by owner: what an interrupt cancels and waits for, what the drain counts |
//! | `adopt.rs` | work driven by its caller that the tracker adopts if the caller goes away (an upload, a cell) |
//! | `workspace_files.rs` | a workspace's files as a tar without its session's kernel: through a transfer kernel made for one transfer (counted by `services::WorkspaceTransfers`) |
//! | `tenancy.rs` | the tenants' settings swapped by a reload (`crate::tenancy`): applied to the registry's ceilings and to egress, a removed tenant's kernels removed (`tenant_removed`) |
//! | `snapshots.rs` | snapshots, restore and fork handed to the snapshots service (`services/snapshots/`): [`Snapshotting`] resolves a call's scope to kernel keys; the orchestrator's kernel starts are the service's handle |
//! | `shutdown.rs` | the graceful stop: refuse new work, drain, remove every kernel |
//! | `tests.rs`, `pool_tests.rs` | unit tests against the fake engine in paused time |

mod adopt;
mod command;
mod execute;
mod files;
mod lease;
mod lifecycle;
pub(crate) mod migration;
mod node;
mod pool;
#[cfg(test)]
mod pool_tests;
mod process;
mod request;
mod running;
mod shutdown;
mod snapshots;
mod spawner;
mod start;
mod tenancy;
#[cfg(test)]
mod tests;
mod workspace_files;

pub use crate::histogram::Histogram;
pub use crate::registry::{EvictionCounts, LossCounts};
pub use crate::services::{
    ConfigHold, FileBytes, ProcessError, SessionConfigs, SnapshotError, MAX_PROCESSES,
    MAX_PROCESSES_PER_SESSION, MAX_PROCESSES_PER_TENANT, MAX_STDIN_WRITE, MAX_TRANSFERS,
    MAX_TRANSFERS_PER_TENANT, OUTPUT_BUFFER_BYTES,
};
pub use command::{CommandError, CommandRequest};
pub use files::{FileError, FileRequest};
pub use pool::{LanguagePool, PoolStats, POOL_REFILL_CONCURRENCY, REFILL_BUCKETS};
pub use process::{ProcessRequest, ProcessStartError};
pub use request::{
    AdmissionNotice, ExecuteError, ExecuteRequest, KernelSummary, Scope, StartError, StartStats,
    Stats, TenantStats, START_BUCKETS,
};
pub use snapshots::Snapshotting;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::catalog::CatalogWriter;
use crate::config::{Config, ValidConfig};
use crate::docker::Engine;
use crate::instance::Instance;
use crate::registry::Registry;
use crate::services::{AuditTrail, Hibernation, UsageLedger, WorkspaceTransfers};

/// How long past `spawn_timeout` an interrupt waits for the cells it cancelled to settle.
pub const INTERRUPT_SETTLE: Duration = Duration::from_secs(10);

struct Inner {
    config: ValidConfig,
    engine: Arc<dyn Engine>,
    instance: Instance,
    registry: Arc<Registry>,
    /// What every kernel start shares (`spawner.rs`).
    spawner: spawner::Spawner,
    /// The tasks it owns, and what stops them.
    tasks: Tasks,
    /// The calls running now (acquiring a kernel or running a cell), by owner.
    running: running::RunningCalls,
    /// Commands running per owner (`command.rs`).
    commands: Arc<command::CommandCounts>,
    /// The watchdog, when one runs (`node.rs`).
    watchdog: node::WatchdogSlot,
    catalog: Option<Arc<CatalogWriter>>,
    pool: pool::PoolState,
    /// The services it owns and calls at named points (`services/`).
    services: Services,
    /// The tenants' settings as read at the moment of use, swapped by a reload (`tenancy.rs`).
    tenancy: Arc<crate::tenancy::LivePolicies>,
}

/// The background work the orchestrator owns: every task it spawns is tracked, and the
/// token stops intake and the tasks at shutdown.
struct Tasks {
    tracker: TaskTracker,
    cancel: CancellationToken,
}

/// The orchestrator's services (`services/`), built at start.
struct Services {
    /// Parks idle kernels and restores them (`services/hibernation/`).
    hibernation: Arc<Hibernation>,
    /// The usage ledger (`services/usage.rs`, `docs/usage.md`).
    usage: Arc<UsageLedger>,
    /// The audit trail (`services/audit.rs`, `docs/usage.md`, "Audit trail").
    audit: AuditTrail,
    /// The workspaces and their transfer kernels (`services/transfers.rs`).
    transfers: WorkspaceTransfers,
    /// Kernels' snapshots (`services/snapshots/`, `docs/snapshots.md`).
    snapshots: Arc<crate::services::Snapshots>,
    /// Background processes (`services/processes/`).
    processes: crate::services::Processes,
    /// Sessions' own settings and network policies, and network egress
    /// (`services/sessions.rs`).
    sessions: SessionConfigs,
    /// File transfers' bytes counted and slow downloads cut (`services/file_meter.rs`).
    files: crate::services::FileMeter,
    /// The periodic housekeeping pass (`services/reaper.rs`).
    reaper: Arc<crate::services::Reaper>,
    /// Migration on drain (`services/migration/`, driven through `migration.rs`).
    migrations: crate::services::Migrations,
}

/// Runs stateful Python kernels in containers, one per key. Cheap to clone.
#[derive(Clone)]
pub struct Orchestrator {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Orchestrator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Orchestrator")
            .field("instance", &self.inner.instance.id)
            .field("kernels", &self.inner.registry.len())
            .finish()
    }
}

impl Orchestrator {
    /// Workspaces, when configured (`docs/workspaces.md`): list, delete, the TTL sweep.
    pub fn workspaces(&self) -> Option<&crate::workspace::Workspaces> {
        self.inner
            .services
            .transfers
            .workspaces()
            .map(|w| w.as_ref())
    }

    /// Sessions' own settings and network policies, and network egress
    /// (`services/sessions.rs`): what `/v1/sessions/{session}/settings` and `/network` set.
    pub fn sessions(&self) -> &SessionConfigs {
        &self.inner.services.sessions
    }

    /// `tenant`'s workspace policy: its sessions' `/work` is a workspace.
    pub(crate) fn workspace_policy(&self, tenant: &str) -> Option<crate::config::WorkspacePolicy> {
        self.inner.services.transfers.policy(tenant)
    }

    /// The sessions' recent lifecycle events (`crate::lifecycle`, docs/console.md).
    pub fn kernel_events(&self) -> Arc<crate::lifecycle::KernelEvents> {
        self.inner.registry.events()
    }

    /// Hibernated kernels (checkpointed, or being checkpointed).
    pub fn hibernated(&self) -> usize {
        self.inner.services.hibernation.count()
    }

    /// The usage ledger over `[from, to)` (seconds since the epoch, widened to whole hours),
    /// of `tenant` only when given, grouped as asked; what is pending is flushed first, so a
    /// report includes every cell ended before it.
    pub async fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
        group_by: crate::usage::GroupBy,
    ) -> Result<Vec<crate::usage::UsageRow>, crate::catalog::CatalogError> {
        self.inner
            .services
            .usage
            .report(tenant, from, to, group_by)
            .await
    }

    /// The validated configuration.
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    /// This instance's id (its containers carry it as a label).
    pub fn instance_id(&self) -> &str {
        &self.inner.instance.id
    }

    /// The engine this orchestrator drives.
    pub fn engine(&self) -> &Arc<dyn Engine> {
        &self.inner.engine
    }

    /// Waits until every catalog change recorded so far is written (or has failed). Nothing
    /// to wait for without a catalog.
    pub async fn sync_catalog(&self) {
        if let Some(catalog) = &self.inner.catalog {
            let writer = catalog.clone();
            let _ = tokio::task::spawn_blocking(move || writer.flush()).await;
        }
    }

    /// Per-tenant counters for metrics, by label value (`docs/usage.md`, "Per-tenant
    /// metrics"), and the live kernels of each label value.
    pub fn tenant_stats(&self) -> TenantStats {
        let meter = self.inner.registry.tenants();
        let mut live = BTreeMap::<String, usize>::new();
        for slot in self.inner.registry.slots() {
            *live
                .entry(meter.label(&slot.key.owner.tenant).to_string())
                .or_default() += 1;
        }
        TenantStats {
            counts: meter.snapshot(),
            live,
        }
    }

    /// Lifecycle counters for metrics: kernel starts (by outcome, with durations) and
    /// involuntary losses as they happened, by reason.
    pub fn stats(&self) -> Stats {
        let starts = self.inner.spawner.starts();
        Stats {
            starts,
            losses: self.inner.registry.loss_counts(),
            evictions: self.inner.registry.eviction_counts(),
            catalog_failures: self.inner.catalog.as_ref().map_or(0, |c| c.failures()),
            pool: {
                let mut pool = self.inner.pool.stats().clone();
                pool.ready = self.inner.registry.pool_ready();
                for (language, share) in &mut pool.languages {
                    share.ready = self.inner.registry.pool_ready_of(*language);
                }
                pool
            },
            file_bytes: self.inner.services.files.snapshot(),
            audit: self.inner.services.audit.stats(),
        }
    }
}
