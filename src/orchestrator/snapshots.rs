//! Snapshots, restore and fork (`docs/snapshots.md`) as the orchestrator hands them to the
//! snapshots service (`services/snapshots/`, which does the work): [`Snapshotting`] resolves
//! a call's [`Scope`] to kernel keys and calls the service with the orchestrator's kernel
//! starts as its handle ([`SnapshotKernels`]: a kernel held through `acquire`, exactly as a
//! cell holds it, so admission, generations and the caps are a cell's).

use super::{ExecuteError, Orchestrator, Scope};
use crate::kernel::SpawnRequest;
use crate::owner::KernelKey;
use crate::registry::TenantLimits;
use crate::services::{Held, SnapshotError, SnapshotKernels};
use crate::wire::{ForkResult, RestoredKernel, SnapshotInfo};

impl From<ExecuteError> for SnapshotError {
    fn from(e: ExecuteError) -> Self {
        SnapshotError::Refused {
            code: e.code(),
            source: Box::new(e),
        }
    }
}

#[async_trait::async_trait]
impl SnapshotKernels for Orchestrator {
    async fn hold(&self, key: &KernelKey, limits: TenantLimits) -> Result<Held, SnapshotError> {
        let mut lease = self.acquire(key, false, limits, None).await?;
        lease.confirm_start().await;
        let restored = lease.kernel.take_restored();
        // The caller's next call reports a loss this hold found (a reconnection that failed
        // and started a new kernel).
        let lost = lease.take_state_lost();
        self.give_back_loss(key, lost);
        Ok(Held {
            slot: lease.slot.clone(),
            kernel: lease.kernel.clone(),
            restored,
        })
    }

    async fn release(&self, held: Held) {
        Orchestrator::release(self, &held.slot).await;
    }

    async fn clear(&self, key: &KernelKey) {
        self.clear_session(Some(&key.owner.tenant), &key.owner.session)
            .await;
    }

    fn spawn_request(&self) -> SpawnRequest<'_> {
        Orchestrator::spawn_request(self)
    }
}

/// The snapshot calls of an orchestrator ([`Orchestrator::snapshots`]).
pub struct Snapshotting<'a> {
    orchestrator: &'a Orchestrator,
}

impl Orchestrator {
    /// Snapshots, restore and fork (`docs/snapshots.md`).
    pub fn snapshots(&self) -> Snapshotting<'_> {
        Snapshotting { orchestrator: self }
    }
}

impl Snapshotting<'_> {
    /// The key of the kernel `scope` names (its tenant the default when it names none).
    fn key(&self, scope: &Scope) -> Result<KernelKey, SnapshotError> {
        let inner = &self.orchestrator.inner;
        let owner = scope.owner(&inner.config).map_err(ExecuteError::from)?;
        Ok(scope.kernel_key(owner, &inner.config, &inner.tenancy.load())?)
    }

    fn tenant<'t>(&'t self, tenant: Option<&'t str>) -> &'t str {
        tenant.unwrap_or(&self.orchestrator.inner.config.default_tenant)
    }

    fn service(&self) -> &crate::services::Snapshots {
        &self.orchestrator.inner.services.snapshots
    }

    /// Runs a snapshot, restore or fork to its end as a task the orchestrator owns, so a
    /// caller that goes away (its request dropped mid-way) never leaves a reservation, a
    /// half-made snapshot's directory or a held kernel behind: the service gives each back
    /// when the call ends (docs/snapshots.md, "Bounds"). The task is bounded by the call's
    /// own waits; shutdown waits for it as for any task of the orchestrator's.
    async fn owned<T, F, Fut>(&self, call: F) -> Result<T, SnapshotError>
    where
        T: Send + 'static,
        F: FnOnce(Orchestrator, std::sync::Arc<crate::services::Snapshots>) -> Fut,
        Fut: std::future::Future<Output = Result<T, SnapshotError>> + Send + 'static,
    {
        let inner = &self.orchestrator.inner;
        let task = call(self.orchestrator.clone(), inner.services.snapshots.clone());
        match inner.tasks.tracker.spawn(task).await {
            Ok(result) => result,
            Err(e) => Err(SnapshotError::Store(format!(
                "the snapshot call ended without an answer: {e}"
            ))),
        }
    }

    /// Snapshots the kernel of the session `scope` names, idle or hibernated, kept as the
    /// tenant's snapshot `name` (`POST /v1/sessions/{session}/snapshots`).
    pub async fn take(
        &self,
        scope: &Scope,
        name: Option<String>,
    ) -> Result<SnapshotInfo, SnapshotError> {
        let (key, limits) = (self.key(scope)?, scope.tenant_limits);
        self.owned(move |kernels, service| async move {
            service.snapshot(&kernels, &key, limits, name).await
        })
        .await
    }

    /// The caller's snapshots, oldest first.
    pub fn list(&self, tenant: Option<&str>) -> Vec<SnapshotInfo> {
        let service = self.service();
        service
            .list(self.tenant(tenant))
            .iter()
            .map(|s| service.info(s))
            .collect()
    }

    /// The caller's snapshot `id` (another tenant's is not found).
    pub fn get(&self, tenant: Option<&str>, id: &str) -> Result<SnapshotInfo, SnapshotError> {
        let service = self.service();
        Ok(service.info(&service.get(self.tenant(tenant), id)?))
    }

    /// Deletes the caller's snapshot `id` (another tenant's is not found).
    pub async fn delete(&self, tenant: Option<&str>, id: &str) -> Result<(), SnapshotError> {
        self.service().delete(self.tenant(tenant), id).await
    }

    /// Starts the session `scope` names, which has no kernel, from the caller's snapshot
    /// `id` (`POST /v1/sessions/{session}/restore`).
    pub async fn restore(&self, scope: &Scope, id: &str) -> Result<RestoredKernel, SnapshotError> {
        let (target, limits, id) = (self.key(scope)?, scope.tenant_limits, id.to_owned());
        self.owned(move |kernels, service| async move {
            service.restore(&kernels, &target, limits, &id).await
        })
        .await
    }

    /// Snapshots the session's kernel once and starts each of `sessions` (new sessions of
    /// the same tenant) from it, in parallel (`POST /v1/sessions/{session}/fork`). The
    /// snapshot is not kept; each fork succeeds or fails on its own.
    pub async fn fork(
        &self,
        scope: &Scope,
        sessions: Vec<String>,
    ) -> Result<ForkResult, SnapshotError> {
        let key = self.key(scope)?;
        let mut forks = Vec::with_capacity(sessions.len());
        for session in sessions {
            let owner = crate::owner::Owner::new(&key.owner.tenant, &session, None)
                .map_err(ExecuteError::from)?;
            forks.push(KernelKey {
                owner,
                ..key.clone()
            });
        }
        let limits = scope.tenant_limits;
        self.owned(move |kernels, service| async move {
            service.fork(&kernels, &key, limits, forks).await
        })
        .await
    }
}
