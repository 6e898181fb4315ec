//! The graceful stop: new work is refused, running cells finish (or the drain deadline
//! passes), idle kernels that hibernate are checkpointed when checkpoints outlive the server,
//! every other kernel of the instance is removed, the catalog is flushed and the watchdog
//! released.

use std::time::Duration;

use super::start::restart_loss;
use super::Orchestrator;
use crate::catalog::Change;
use crate::cell::LossReason;
use crate::config::HIBERNATE_AT_STOP_LIMIT;

impl Orchestrator {
    /// Stops intake, kills every kernel, removes every container and volume of this instance,
    /// and stops the background tasks. Idempotent.
    pub async fn shutdown(&self) {
        let inner = &self.inner;
        inner.tasks.cancel.cancel();
        let hibernation = &inner.services.hibernation;
        let lasting = hibernation.lasts();
        if lasting {
            // Idle kernels that hibernate do so now, to come back after the restart
            // (`docs/runtimes.md`, "Hibernation"); those not done in time are lost as before.
            let stopping = inner.registry.take_for_stop();
            let hibernating = async {
                hibernation
                    .park(stopping, LossReason::ServerRestarted)
                    .await;
                // Those under way already (the reaper's, an eviction's) are kept too.
                let pending = inner.registry.pending_hibernations();
                futures::future::join_all(pending.iter().map(|done| done.cancelled())).await;
            };
            if tokio::time::timeout(HIBERNATE_AT_STOP_LIMIT, hibernating)
                .await
                .is_err()
            {
                tracing::warn!("hibernating idle kernels at stop: out of time, the rest are lost");
            }
        }
        let slots = inner.registry.drain();
        crate::services::dispose_slots(slots).await;
        if !lasting {
            // Hibernated kernels do not outlive this server.
            hibernation.discard_where(|_| true).await;
            hibernation.clear_dir().await;
        }
        // The pool's refills in flight dispose of their kernels; then the pool goes.
        self.stop_pool(Duration::from_secs(10)).await;
        // Anything the registry no longer knows (a spawn racing the shutdown) goes by label,
        // but the hibernated kernels that outlive it (their names say so).
        if let Err(e) =
            crate::instance::watchdog::remove_instance(inner.engine.as_ref(), &inner.instance.id)
                .await
        {
            tracing::warn!(error = %e, "final sweep of this instance failed");
        }
        if let Some(egress) = inner.services.sessions.egress() {
            egress.stop().await;
        }
        if let Some(catalog) = &inner.catalog {
            // Every kernel this instance had is gone: their owners learn it after a restart.
            catalog.record(Change::AllLiveLost {
                loss: restart_loss(),
            });
            let writer = catalog.clone();
            let closed = tokio::task::spawn_blocking(move || writer.close());
            if tokio::time::timeout(Duration::from_secs(10), closed)
                .await
                .is_err()
            {
                tracing::warn!("the catalog writer did not finish within 10s");
            }
        }
        // The kernels are gone, so their cells and commands have ended: what they recorded
        // is written before the trail closes.
        inner.services.audit.close().await;
        inner.tasks.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), inner.tasks.tracker.wait()).await;
        if let Some(w) = inner.watchdog.take() {
            let _ = tokio::task::spawn_blocking(move || w.finish()).await;
        }
    }
}
