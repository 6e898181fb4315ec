//! The orchestrator's services: features with their own state that the orchestrator
//! (`orchestrator/`) builds at start, owns, and calls at named points: parking an idle kernel
//! and restoring it, sampling usage and reporting it, recording what ran, counting workspace
//! transfers, watching for runaways. A service never calls the orchestrator back: it gets
//! the registry, the engine or the task tracker it needs when it is built.
//!
//! | file | what | the orchestrator calls it |
//! |---|---|---|
//! | `mod.rs` | this table; kernels' and slots' disposal, shared by the orchestrator and its services | wherever a kernel goes |
//! | `hibernation/` | [`Hibernation`]: park (checkpoint) idle kernels, restore them, discard checkpoints; what an earlier run left | at start, admission, the reap, eviction, reset, the stop |
//! | `migration/` | [`Migrations`]: migration on drain: the sessions moving, the transfers received at once, a checkpoint on the wire (`docs/cluster.md`, "Migration on drain") | a cluster node's drain and the hop that receives a kernel (`orchestrator/migration.rs`) |
//! | `snapshots/` | [`Snapshots`]: kernels' snapshots (runsc: memory; runc: files only) taken, kept on disk under bounds, listed, deleted, expired, loaded at start; restored; forks (`docs/snapshots.md`); the orchestrator's kernel starts are handed in with each call | a snapshot, fork or restore; at start; the reap (expiry) |
//! | `usage.rs` | [`UsageLedger`]: the pending usage, kernels' cgroups sampled into it, flushed to the catalog, reports | recording a cell, command, transfer; at start (its task); a report |
//! | `audit.rs` | [`AuditTrail`]: the audit trail's record of each cell and command of an audited tenant (`docs/usage.md`, "Audit trail") | a cell or command ended; the stop |
//! | `transfers.rs` | [`WorkspaceTransfers`]: the workspaces and the transfer kernels running per tenant and workspace | a transfer without a kernel; a workspace deleted |
//! | `processes/` | [`Processes`]: background processes per session (`docs/processes.md`): started on an owner's kernel, their output kept and streamed, stdin, signals, kill, under bounds per session, tenant and host | starting a process; its other verbs are the server's to call; the stop (its tasks) |
//! | `sessions.rs` | [`SessionConfigs`]: each session's own settings and network policy as this host keeps them; network egress | the settings and network routes; a kernel's start (its grant); a tenant removed; the stop (egress) |
//! | `file_meter.rs` | [`FileMeter`]: file transfers' bytes counted (metrics, usage ledger), slow downloads cut | each upload and download |
//! | `reaper.rs` | [`Reaper`]: the periodic pass retiring idle kernels and sweeping what expired | at start (its task); `reap_once` |
//! | `runaway.rs` | [`RunawayWatcher`]: kernels computing with no cell running, sampled from their cgroups, counted busy, killed past their last cell's timeout | at start (its task) |

mod audit;
mod file_meter;
mod hibernation;
pub(crate) mod migration;
mod processes;
mod reaper;
mod runaway;
mod sessions;
mod snapshots;
mod transfers;
mod usage;

use std::sync::Arc;

use futures::StreamExt;

use crate::kernel::Kernel;
use crate::registry::Slot;

pub(crate) use audit::{AuditTrail, Ran};
pub use file_meter::FileBytes;
pub(crate) use file_meter::FileMeter;
pub(crate) use hibernation::{recorded, Hibernation};
pub use migration::MigrationError;
pub(crate) use migration::Migrations;
pub(crate) use processes::{Attach, OutputItem, Processes};
pub use processes::{
    ProcessError, MAX_PROCESSES, MAX_PROCESSES_PER_SESSION, MAX_PROCESSES_PER_TENANT,
    MAX_STDIN_WRITE, OUTPUT_BUFFER_BYTES,
};
pub(crate) use reaper::{sweep_expired_hibernated, Reaper};
pub(crate) use runaway::RunawayWatcher;
pub use sessions::{ConfigHold, SessionConfigs};
pub use snapshots::SnapshotError;
pub(crate) use snapshots::{Handles as SnapshotHandles, Held, SnapshotKernels, Snapshots};
pub(crate) use transfers::{TransferSlot, WorkspaceTransfers};
pub use transfers::{MAX_TRANSFERS, MAX_TRANSFERS_PER_TENANT};
pub(crate) use usage::UsageLedger;

/// Removes a kernel's container (and its volume); a failure is logged.
pub(crate) async fn dispose_kernel(kernel: &Kernel) {
    if let Err(e) = kernel.dispose().await {
        tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a kernel");
    }
}

/// Disposes of the kernels of `slots`, a bounded number at once.
pub(crate) async fn dispose_slots(slots: Vec<Arc<Slot>>) {
    let kernels: Vec<Arc<Kernel>> = slots
        .iter()
        .filter_map(|s| s.kernel.get().cloned())
        .collect();
    // Bounded: a thousand concurrent force-removals overwhelm the engine (seen in the
    // 1000-kernel density run), while a few dozen keep it busy.
    let disposals = kernels.into_iter().map(|kernel| async move {
        if let Err(e) = kernel.dispose().await {
            tracing::warn!(container = %kernel.short_id(), error = %e, "disposing a kernel");
        }
    });
    futures::stream::iter(disposals)
        .buffer_unordered(crate::docker::REMOVAL_CONCURRENCY)
        .collect::<Vec<()>>()
        .await;
}
