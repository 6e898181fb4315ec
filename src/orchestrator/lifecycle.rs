//! Lifecycle verbs: interrupt a session's cells (found among the running calls, `lease.rs`),
//! clear or evict a session, release a delegated child, list kernels, reap idle ones, and sweep
//! leftovers; and the disposal of slots and kernels every part of the orchestrator uses.

use std::sync::Arc;

use super::{KernelSummary, Orchestrator, INTERRUPT_SETTLE};
use crate::cell::LossReason;
use crate::docker::EngineError;
use crate::instance::sweep::{self, SweepReport};
use crate::kernel::{Kernel, KernelState};
use crate::owner::Owner;
use crate::registry::Slot;

impl Orchestrator {
    /// Calls running now: acquiring a kernel or running a cell, whether or not their caller
    /// still waits.
    pub fn running_cells(&self) -> usize {
        self.inner.running.count()
    }

    /// Waits until no call is running (see [`Orchestrator::running_cells`]); event-driven.
    /// Returns at once when none is.
    pub async fn wait_no_running_cells(&self) {
        self.inner.running.wait_none().await;
    }

    /// Interrupts every running cell of a session (children included) and returns how many
    /// of them ended as `interrupted`: each gets KeyboardInterrupt and keeps its kernel, or is
    /// killed with it when it has not stopped within `cells.interrupt_grace`
    /// (`docs/contract.md`, "Statuses"). It waits for the cells it cancelled to settle, at
    /// most `spawn_timeout` plus the grace plus [`INTERRUPT_SETTLE`] (a cell still starting its
    /// kernel sees the interrupt once the kernel is up); a cell that finished first (success or
    /// error), or that has not settled by then, is not counted.
    pub async fn interrupt(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        let outcomes = self.inner.running.cancel_session(tenant, session);
        let limit = self.inner.config.kernels.spawn_timeout
            + self.inner.config.cells.interrupt_grace
            + INTERRUPT_SETTLE;
        let settled = outcomes.into_iter().map(|mut outcome| async move {
            match tokio::time::timeout(limit, outcome.wait_for(Option::is_some)).await {
                Ok(Ok(ended)) => *ended == Some(true),
                // Failed before it ran (the outcome was dropped unsent), or still unsettled.
                _ => false,
            }
        });
        futures::future::join_all(settled)
            .await
            .into_iter()
            .filter(|interrupted| *interrupted)
            .count()
    }

    pub(super) async fn release(&self, slot: &Arc<Slot>) {
        if self.inner.registry.release(slot) {
            crate::services::dispose_slots(vec![slot.clone()]).await;
        }
    }

    /// Disposes of every kernel of a session, its delegated children's included, at once: a
    /// cell running in one of them ends with an error saying the session was cleared.
    pub async fn clear_session(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session,
            None,
            false,
        );
        self.inner
            .services
            .processes
            .forget_session(&tenant, session);
        crate::services::dispose_slots(slots).await;
        let hibernated = self
            .inner
            .registry
            .remove_hibernated(|k| k.owner.tenant == tenant && k.owner.session == session);
        let n = n + hibernated.len();
        self.inner.services.hibernation.discard(hibernated).await;
        n
    }

    /// Evicts a session's kernels (its children's included) to make room, as the LRU cap
    /// would: the loss is reported to the session's next call as `evicted`.
    pub async fn evict_session(&self, tenant: Option<&str>, session: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        // Only idle kernels go: a call that attached meanwhile keeps its kernel.
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session,
            Some(LossReason::Evicted),
            true,
        );
        crate::services::dispose_slots(slots).await;
        n
    }

    /// Disposes of a finished delegated child's kernels at once (a cell running in one ends)
    /// and unpins it.
    pub async fn release_child(&self, tenant: Option<&str>, session: &str, child: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        if let Ok(owner) = Owner::new(&tenant, session, Some(child)) {
            self.inner.registry.release_child(&owner);
        }
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant && o.session == session && o.child.as_deref() == Some(child),
            None,
            false,
        );
        crate::services::dispose_slots(slots).await;
        let hibernated = self.inner.registry.remove_hibernated(|k| {
            let o = &k.owner;
            o.tenant == tenant && o.session == session && o.child.as_deref() == Some(child)
        });
        self.inner.services.hibernation.discard(hibernated).await;
        n
    }

    /// Disposes of one context's kernel of a session (not its children's; a cell running in it
    /// ends), as `DELETE` of the session does for all of them; the session's other contexts
    /// and their shared `/work` stay (`docs/contract.md`, "Languages"). Returns how many
    /// kernels went (0 or 1, a hibernated one included).
    pub async fn end_context(&self, tenant: Option<&str>, session: &str, context: &str) -> usize {
        let tenant = tenant
            .unwrap_or(&self.inner.config.default_tenant)
            .to_string();
        let ours = |k: &crate::owner::KernelKey| {
            k.owner.tenant == tenant
                && k.owner.session == session
                && k.owner.child.is_none()
                && k.context.name == context
        };
        let (n, slots) = self.inner.registry.remove_keys(ours, None, false);
        crate::services::dispose_slots(slots).await;
        let hibernated = self.inner.registry.remove_hibernated(ours);
        let n = n + hibernated.len();
        self.inner.services.hibernation.discard(hibernated).await;
        n
    }

    /// The live kernels, optionally of one tenant.
    pub fn list_kernels(&self, tenant: Option<&str>) -> Vec<KernelSummary> {
        let now = tokio::time::Instant::now();
        let mut list: Vec<KernelSummary> = self
            .inner
            .registry
            .slots()
            .into_iter()
            .filter(|s| tenant.is_none_or(|t| s.key.owner.tenant == t))
            .map(|s| {
                let kernel = s.kernel.get();
                KernelSummary {
                    id: kernel.map(|k| k.short_id().to_string()).unwrap_or_default(),
                    tenant: s.key.owner.tenant.clone(),
                    owner: s.key.owner.to_string(),
                    session: s.key.owner.session.clone(),
                    child: s.key.owner.child.clone(),
                    language: s.key.context.language,
                    context: s.key.context.name.clone(),
                    generation: s.generation(),
                    state: match kernel.map(|k| k.state()) {
                        None | Some(KernelState::Starting) => "starting",
                        Some(KernelState::Idle) if kernel.is_some_and(|k| k.is_computing()) => {
                            "busy"
                        }
                        Some(KernelState::Idle) => "idle",
                        Some(KernelState::Busy) => "busy",
                        Some(KernelState::Dead(_)) => "dead",
                    }
                    .to_string(),
                    execution_count: kernel.map(|k| k.execution_count()).unwrap_or(0),
                    idle_seconds: now.saturating_duration_since(s.last_used()).as_secs_f64(),
                    attached: s.attached(),
                    labels: self
                        .inner
                        .registry
                        .settings(&s.key.owner.tenant, &s.key.owner.session)
                        .map(|set| set.labels.clone())
                        .unwrap_or_default(),
                }
            })
            .collect();
        list.sort_by(|a, b| (&a.tenant, &a.owner).cmp(&(&b.tenant, &b.owner)));
        list
    }

    /// Sets `tenant`'s `session`'s settings, checked by the caller against the tenant's
    /// maximums ([`Settings::check`](crate::settings::Settings::check)); they apply to its
    /// next kernel (environment, memory, CPU) or at once (idle timeout, labels). Returns true
    /// when a live kernel of the session runs with another environment, memory or CPU.
    pub fn set_settings(
        &self,
        tenant: Option<&str>,
        session: &str,
        settings: crate::settings::Settings,
    ) -> Result<bool, crate::settings::SettingsError> {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        self.inner.registry.set_settings(tenant, session, settings)
    }

    /// `tenant`'s `session`'s settings as a cluster node keeps them (`None`: forgotten) at the
    /// catalog's `version`: an older version never replaces a newer, and the catalog (their
    /// home) bounded them (`Registry::set_settings_at`).
    pub fn set_settings_at(
        &self,
        tenant: &str,
        session: &str,
        settings: Option<crate::settings::Settings>,
        version: u64,
    ) -> Result<bool, crate::settings::SettingsError> {
        self.inner
            .registry
            .set_settings_at(tenant, session, settings, version, true)
    }

    /// Holds `tenant`'s `session`'s network policy and settings on this node while the guard
    /// lives: a cluster node's claim loaded them and the session's kernel is not registered
    /// yet, so they are not forgotten meanwhile to make room for another session's
    /// (`crate::registry::Registry::hold_config`).
    pub fn hold_session_config(&self, tenant: &str, session: &str) -> ConfigHold {
        self.inner.registry.hold_config(tenant, session);
        ConfigHold {
            orchestrator: self.clone(),
            tenant: tenant.to_string(),
            session: session.to_string(),
        }
    }

    /// Forgets `tenant`'s `session`'s own network policy and settings (the session was
    /// deleted: `DELETE /v1/sessions/{session}`).
    pub fn forget_session_config(&self, tenant: &str, session: &str) {
        if let Some(egress) = &self.inner.egress {
            // Forgetting is never refused.
            let _ = egress.set_session(tenant, session, None, u64::MAX, None, true);
        }
        let _ = self
            .inner
            .registry
            .set_settings_at(tenant, session, None, u64::MAX, true);
    }

    /// `tenant`'s `session`'s settings (the server's defaults when it set none).
    pub fn settings(&self, tenant: Option<&str>, session: &str) -> crate::settings::Settings {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        self.inner
            .registry
            .settings(tenant, session)
            .map(|s| crate::settings::Settings::clone(&s))
            .unwrap_or_default()
    }

    /// The kernel currently serving a key's owner (for tests and admin), if any.
    pub fn kernel_for(
        &self,
        tenant: Option<&str>,
        session: &str,
        child: Option<&str>,
    ) -> Option<Arc<Kernel>> {
        let owner = super::request::owner_of(&self.inner.config, tenant, session, child).ok()?;
        self.inner
            .registry
            .slots()
            .into_iter()
            .find(|s| s.key.owner == owner)
            .and_then(|s| s.kernel.get().cloned())
    }

    /// One reaper pass: retire idle kernels, and sweep staging volumes older than
    /// `housekeeping.staging_max_age` that no container uses, of this instance or of instances known dead
    /// (never a live neighbour's). Returns how many kernels were reaped.
    pub async fn reap_once(&self) -> usize {
        let (slots, hibernating) = self.inner.registry.reap_idle();
        let n = slots.len();
        crate::services::dispose_slots(slots).await;
        let hibernation = &self.inner.services.hibernation;
        hibernation
            .park(hibernating, crate::cell::LossReason::IdleReaped)
            .await;
        hibernation.expire().await;
        self.inner.services.snapshots.expire().await;
        if let Some(workspaces) = self.inner.services.transfers.workspaces() {
            match workspaces.sweep_expired().await {
                Ok(removed) if !removed.is_empty() => {
                    tracing::info!(workspaces = removed.len(), "expired workspaces deleted");
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "workspace sweep failed"),
            }
        }
        match sweep::sweep_stale_staging_of_dead(
            self.inner.engine.as_ref(),
            &self.inner.instance,
            self.inner.config.housekeeping.staging_max_age,
        )
        .await
        {
            Ok(removed) if !removed.is_empty() => {
                tracing::info!(volumes = removed.len(), "stale staging volumes swept");
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "staging sweep failed"),
        }
        super::start::sweep_expired_hibernated(self.inner.engine.as_ref(), &self.inner.instance)
            .await;
        n
    }

    /// Removes staging volumes older than `housekeeping.staging_max_age` (any instance's) no container uses.
    pub async fn sweep_stale_staging(&self) -> Result<Vec<String>, EngineError> {
        sweep::sweep_stale_staging(
            self.inner.engine.as_ref(),
            self.inner.config.housekeeping.staging_max_age,
            &[],
            false,
        )
        .await
    }

    /// Removes leftovers of dead instances.
    pub async fn sweep_orphans(&self, dry_run: bool) -> Result<SweepReport, EngineError> {
        sweep::sweep_orphans(self.inner.engine.as_ref(), &self.inner.instance, dry_run).await
    }

    pub(super) async fn reap_forever(&self) {
        let interval = self.inner.config.reap_interval();
        loop {
            tokio::select! {
                _ = self.inner.tasks.cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            // Each kernel reaped is a lifecycle event of its own (`crate::logging`).
            self.reap_once().await;
        }
    }
}

/// A session's network policy and settings held on this node
/// ([`Orchestrator::hold_session_config`]); released when dropped.
#[derive(Debug)]
pub struct ConfigHold {
    orchestrator: Orchestrator,
    tenant: String,
    session: String,
}

impl Drop for ConfigHold {
    fn drop(&mut self) {
        self.orchestrator
            .inner
            .registry
            .release_config(&self.tenant, &self.session);
    }
}
