//! Lifecycle verbs: interrupt a session's cells (found among the running calls,
//! `running.rs`), clear or evict a session, release a delegated child, list kernels, a reaper
//! pass (the reaper is `services/reaper.rs`), and a slot's release.

use std::sync::Arc;

use super::{KernelSummary, Orchestrator, INTERRUPT_SETTLE};
use crate::cell::LossReason;
use crate::kernel::{Kernel, KernelState};
use crate::owner::Owner;

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

    /// One reaper pass (`services/reaper.rs`): retire idle kernels, expire checkpoints,
    /// snapshots and workspaces, sweep staging volumes no container uses. Returns how many
    /// kernels were reaped.
    pub async fn reap_once(&self) -> usize {
        self.inner.services.reaper.reap_once().await
    }
}
