//! [`Reaper`]: the periodic housekeeping pass (`docs/architecture.md`, "Lifecycle of a
//! kernel"): idle kernels retired (or parked by the hibernation), expired checkpoints,
//! snapshots and workspaces removed, staging volumes no container uses swept (of this instance
//! or of instances known dead, never a live neighbour's), and hibernated kernels past their
//! spare time swept whatever server made them.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Hibernation, Snapshots};
use crate::cell::LossReason;
use crate::docker::Engine;
use crate::instance::sweep;
use crate::instance::Instance;
use crate::registry::Registry;
use crate::workspace::Workspaces;

/// The reaper's pass and its task: what it retires and sweeps, and how often.
pub(crate) struct Reaper {
    pub(crate) registry: Arc<Registry>,
    pub(crate) engine: Arc<dyn Engine>,
    pub(crate) instance: Instance,
    pub(crate) hibernation: Arc<Hibernation>,
    pub(crate) snapshots: Arc<Snapshots>,
    pub(crate) workspaces: Option<Arc<Workspaces>>,
    /// `housekeeping.staging_max_age`.
    pub(crate) staging_max_age: Duration,
    /// How often a pass runs (`ValidConfig::reap_interval`).
    pub(crate) interval: Duration,
}

impl Reaper {
    /// One pass: retire idle kernels, and sweep staging volumes older than
    /// `housekeeping.staging_max_age` that no container uses, of this instance or of instances
    /// known dead (never a live neighbour's). Returns how many kernels were reaped.
    pub(crate) async fn reap_once(&self) -> usize {
        let (slots, hibernating) = self.registry.reap_idle();
        let n = slots.len();
        super::dispose_slots(slots).await;
        self.hibernation
            .park(hibernating, LossReason::IdleReaped)
            .await;
        self.hibernation.expire().await;
        self.snapshots.expire().await;
        if let Some(workspaces) = &self.workspaces {
            match workspaces.sweep_expired().await {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(workspaces = removed.len(), "expired workspaces deleted");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "workspace sweep failed"),
            }
        }
        match sweep::sweep_stale_staging_of_dead(
            self.engine.as_ref(),
            &self.instance,
            self.staging_max_age,
        )
        .await
        {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(volumes = removed.len(), "stale staging volumes swept");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "staging sweep failed"),
        }
        sweep_expired_hibernated(self.engine.as_ref(), &self.instance).await;
        n
    }

    /// A pass every `interval` until `cancel`.
    pub(crate) async fn run(self: Arc<Self>, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            // Each kernel reaped is a lifecycle event of its own (`crate::logging`).
            self.reap_once().await;
        }
    }
}

/// Removes hibernated kernels past [`crate::config::HIBERNATED_SPARED_FOR`], whatever server
/// made them (`docs/runtimes.md`, "Across a restart of the server"): at start and with each
/// reap, so a state directory that never comes back does not keep them.
pub(crate) async fn sweep_expired_hibernated(engine: &dyn Engine, instance: &Instance) {
    let spare = crate::config::HIBERNATED_SPARED_FOR;
    match sweep::sweep_hibernated(engine, instance, spare, false).await {
        Ok(report) if !report.containers.is_empty() => tracing::info!(
            containers = report.containers.len(),
            "swept hibernated kernels past their spare time"
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "sweeping hibernated kernels failed"),
    }
}
