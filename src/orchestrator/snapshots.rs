//! Snapshots, restore and fork, as the orchestrator drives them (`docs/snapshots.md`): the
//! snapshots service (`services/snapshots/`) keeps the snapshots; here a session's idle kernel
//! is taken out of the registry, checkpointed with its container left running and reconnected
//! (or, hibernated, its checkpoint linked as it is), and a snapshot's checkpoint is restored
//! into a new session's container through the hibernation's books (`registry/hibernated.rs`),
//! so admission, generations and the first call's answer are a hibernated kernel's.

use super::{ExecuteError, Orchestrator, Scope};
use crate::config::{HIBERNATE_ANSWER_LIMIT, MAX_FORKS_PER_REQUEST};
use crate::docker::KernelRuntime;
use crate::kernel::{Checkpoint, Kernel, SpawnRequest};
use crate::owner::KernelKey;
use crate::services::{Reservation, SnapshotError, Stored};
use crate::wire::{ErrorDetail, ForkOutcome, RestoredKernel};

/// What `restored.from` says of a kernel restored from a snapshot.
const FROM_SNAPSHOT: &str = "snapshot";

impl From<ExecuteError> for SnapshotError {
    fn from(e: ExecuteError) -> Self {
        SnapshotError::Execute(Box::new(e))
    }
}

impl Orchestrator {
    /// The key of the kernel `scope` names (its tenant the default when it names none).
    fn snapshot_key(&self, scope: &Scope) -> Result<KernelKey, SnapshotError> {
        let owner = scope
            .owner(&self.inner.config)
            .map_err(ExecuteError::from)?;
        Ok(scope.kernel_key(owner, &self.inner.config, &self.inner.tenancy.load())?)
    }

    /// Snapshots the kernel of the session `scope` names, idle or hibernated, kept as the
    /// tenant's snapshot `name` (`POST /v1/sessions/{session}/snapshots`).
    pub async fn snapshot(
        &self,
        scope: &Scope,
        name: Option<String>,
    ) -> Result<crate::wire::SnapshotInfo, SnapshotError> {
        if let Some(name) = &name {
            if name.chars().count() > crate::wire::MAX_SNAPSHOT_NAME {
                return Err(SnapshotError::Invalid(format!(
                    "a snapshot's name has at most {} characters",
                    crate::wire::MAX_SNAPSHOT_NAME
                )));
            }
        }
        let key = self.snapshot_key(scope)?;
        let snapshots = &self.inner.services.snapshots;
        let reservation = snapshots.reserve(&key.owner.tenant).await?;
        let checkpoint = match self
            .checkpoint_for_snapshot(scope, &key, &reservation)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                snapshots.abort(reservation).await;
                return Err(e);
            }
        };
        let stored = snapshots
            .commit(reservation, &key, name, &checkpoint)
            .await?;
        tracing::info!(owner = %key.owner, snapshot = %stored.id, bytes = stored.bytes, "kernel snapshotted");
        Ok(self.snapshot_info(&stored))
    }

    /// The caller's snapshots.
    pub fn snapshots(&self, tenant: Option<&str>) -> Vec<crate::wire::SnapshotInfo> {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        self.inner
            .services
            .snapshots
            .list(tenant)
            .iter()
            .map(|s| self.snapshot_info(s))
            .collect()
    }

    /// The caller's snapshot `id` (another tenant's is not found).
    pub fn snapshot_of(
        &self,
        tenant: Option<&str>,
        id: &str,
    ) -> Result<crate::wire::SnapshotInfo, SnapshotError> {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        let stored = self.inner.services.snapshots.get(tenant, id)?;
        Ok(self.snapshot_info(&stored))
    }

    /// Deletes the caller's snapshot `id` (another tenant's is not found).
    pub async fn delete_snapshot(
        &self,
        tenant: Option<&str>,
        id: &str,
    ) -> Result<(), SnapshotError> {
        let tenant = tenant.unwrap_or(&self.inner.config.default_tenant);
        self.inner.services.snapshots.delete(tenant, id).await
    }

    fn snapshot_info(&self, stored: &Stored) -> crate::wire::SnapshotInfo {
        let at = |secs: u64| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            )
            .to_string()
        };
        crate::wire::SnapshotInfo {
            id: stored.id.clone(),
            name: stored.name.clone(),
            session: stored.key.owner.session.clone(),
            created: at(stored.created),
            expires: at(stored.created + self.inner.config.snapshots.ttl.as_secs()),
            bytes: stored.bytes,
            memory: stored.memory,
            runtime: match stored.key.runtime {
                KernelRuntime::Runc => "runc",
                KernelRuntime::Runsc => "runsc",
            }
            .into(),
            checkpoint_seconds: stored.checkpoint_seconds,
        }
    }

    /// The checkpoint of `key`'s kernel, its files under `dir`: a hibernated kernel's linked
    /// (it stays hibernated), an idle live one's taken with its container left running and
    /// reconnected before this returns.
    async fn checkpoint_for_snapshot(
        &self,
        scope: &Scope,
        key: &KernelKey,
        reservation: &Reservation,
    ) -> Result<Checkpoint, SnapshotError> {
        let dir = reservation.dir.as_path();
        if key.runtime != KernelRuntime::Runsc {
            return Err(SnapshotError::Unsupported {
                runtime: "runc".into(),
            });
        }
        let session = key.owner.session.clone();
        let hibernation = &self.inner.services.hibernation;
        let registry = &self.inner.registry;
        hibernation.wait_for(key).await;
        if let Some(hibernated) = registry.ready_checkpoint(key) {
            self.inner
                .services
                .snapshots
                .link_into(&hibernated, reservation)
                .await
                .map_err(|e| {
                    SnapshotError::Checkpoint(format!(
                        "the hibernated kernel was restored meanwhile ({e}): try again"
                    ))
                })?;
            return Ok(hibernated.kept_in(dir));
        }
        let Some(slot) = registry.take_idle_slot(key) else {
            return Err(if registry.has_live(&key.owner) {
                SnapshotError::Busy { session }
            } else {
                SnapshotError::NoKernel { session }
            });
        };
        let Some(kernel) = slot.kernel.get().cloned() else {
            if let Some(slot) = registry.put_back(slot) {
                crate::services::dispose_slots(vec![slot]).await;
            }
            return Err(SnapshotError::NoKernel { session });
        };
        match kernel.snapshot(HIBERNATE_ANSWER_LIMIT, dir).await {
            Ok(mut source) => {
                source.from = FROM_SNAPSHOT.into();
                let kept = source.kept_in(dir);
                if let Some(gone) = registry.snapshot_done(key, source) {
                    // Cleared meanwhile: its kernel goes, the snapshot stays.
                    hibernation.discard(vec![gone]).await;
                } else {
                    self.reconnect(scope, key).await;
                }
                Ok(kept)
            }
            Err(e) => {
                // The runner refused (the kernel goes on as it was) or the engine failed
                // (the kernel is spent: its next call finds it dead and says so).
                if let Some(slot) = registry.put_back(slot) {
                    crate::services::dispose_slots(vec![slot]).await;
                }
                Err(SnapshotError::Checkpoint(e.to_string()))
            }
        }
    }

    /// Reconnects `key`'s kernel left running by its snapshot (its checkpoint waits in the
    /// registry): what the owner's next call would do, done now so the kernel is counted and
    /// reaped as any live one.
    async fn reconnect(&self, scope: &Scope, key: &KernelKey) {
        match self.acquire(key, false, scope.tenant_limits, None).await {
            Ok(mut lease) => {
                // The same kernel: its next call is told nothing of this, but a loss (the
                // reconnection failed and a new kernel started) is its to report.
                let _ = lease.kernel.take_restored();
                let lost = lease.take_state_lost();
                self.give_back_loss(key, lost);
                self.release(&lease.slot).await;
            }
            Err(e) => {
                tracing::warn!(owner = %key.owner, error = %e, "reconnecting a kernel after its snapshot failed")
            }
        }
    }

    /// Starts the session `scope` names, which has no kernel, from the caller's snapshot
    /// `id` (`POST /v1/sessions/{session}/restore`).
    pub async fn restore_snapshot(
        &self,
        scope: &Scope,
        id: &str,
    ) -> Result<RestoredKernel, SnapshotError> {
        let target = self.snapshot_key(scope)?;
        let stored = self
            .inner
            .services
            .snapshots
            .get(&target.owner.tenant, id)?;
        self.restore_into(scope, &stored.key, &stored.checkpoint)
            .await
    }

    /// Snapshots the session's kernel once and starts each of `sessions` (new sessions of
    /// the same tenant) from it, in parallel (`POST /v1/sessions/{session}/fork`). The
    /// snapshot is not kept; each fork succeeds or fails on its own.
    pub async fn fork(
        &self,
        scope: &Scope,
        sessions: Vec<String>,
    ) -> Result<crate::wire::ForkResult, SnapshotError> {
        if sessions.is_empty() || sessions.len() > MAX_FORKS_PER_REQUEST {
            return Err(SnapshotError::Invalid(format!(
                "a fork makes 1 to {MAX_FORKS_PER_REQUEST} sessions"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        let key = self.snapshot_key(scope)?;
        for session in &sessions {
            crate::owner::Owner::new(&key.owner.tenant, session, None)
                .map_err(ExecuteError::from)?;
            if !seen.insert(session) || *session == key.owner.session {
                return Err(SnapshotError::Invalid(format!(
                    "fork sessions must be new and distinct: {session}"
                )));
            }
        }
        let snapshots = &self.inner.services.snapshots;
        // The fork's snapshot is a reservation never committed: counted while it lives,
        // removed after (and, were the server killed meanwhile, at its next start).
        let reservation = snapshots.reserve(&key.owner.tenant).await?;
        let checkpoint = match self
            .checkpoint_for_snapshot(scope, &key, &reservation)
            .await
        {
            Ok(c) => c,
            Err(e) => {
                snapshots.abort(reservation).await;
                return Err(e);
            }
        };
        let hibernated = registry_hibernated_paused(&checkpoint);
        let forks = sessions.iter().map(|session| {
            let scope = Scope {
                session: session.clone(),
                child: None,
                ..scope.clone()
            };
            let (key, checkpoint) = (&key, &checkpoint);
            async move {
                let outcome = self.restore_into(&scope, key, checkpoint).await;
                fork_outcome(scope.session, outcome)
            }
        });
        let forks = futures::future::join_all(forks).await;
        snapshots.abort(reservation).await;
        Ok(crate::wire::ForkResult {
            checkpoint_seconds: if hibernated {
                0.0
            } else {
                checkpoint.checkpoint_seconds
            },
            forks,
        })
    }

    /// Starts `scope`'s session (no kernel yet) from `checkpoint`, a snapshot's taken of a
    /// kernel of key `source`: a new container of the same spec is created, the snapshot's
    /// files linked for its one start, and the checkpoint seeded for the new key, whose
    /// acquire restores it like a hibernated kernel.
    async fn restore_into(
        &self,
        scope: &Scope,
        source: &KernelKey,
        checkpoint: &Checkpoint,
    ) -> Result<RestoredKernel, SnapshotError> {
        let owner = scope
            .owner(&self.inner.config)
            .map_err(ExecuteError::from)?;
        let key = KernelKey {
            owner,
            ..source.clone()
        };
        let session = key.owner.session.clone();
        let registry = &self.inner.registry;
        if registry.has_live(&key.owner) || registry.is_hibernated(&key) {
            return Err(SnapshotError::SessionExists { session });
        }
        let created = Kernel::create_stopped(&SpawnRequest {
            owner: Some((key.clone(), 0)),
            ..self.spawn_request()
        })
        .await
        .map_err(|e| SnapshotError::Restore(e.to_string()))?;
        let dir = match self.inner.services.snapshots.fork_files(checkpoint).await {
            Ok(dir) => dir,
            Err(e) => {
                created.remove(self.inner.engine.as_ref()).await;
                return Err(e);
            }
        };
        let restored = self
            .start_fork(scope, &key, checkpoint, &created, &dir)
            .await;
        self.inner.services.snapshots.fork_done(dir).await;
        restored
    }

    async fn start_fork(
        &self,
        scope: &Scope,
        key: &KernelKey,
        checkpoint: &Checkpoint,
        created: &crate::kernel::Created,
        dir: &std::path::Path,
    ) -> Result<RestoredKernel, SnapshotError> {
        let session = key.owner.session.clone();
        let forked = checkpoint.forked(created, dir, FROM_SNAPSHOT);
        if let Err(refused) = self.inner.registry.seed_fork(key, Box::new(forked)) {
            refused.discard(self.inner.engine.as_ref()).await;
            return Err(SnapshotError::SessionExists { session });
        }
        let hibernation = &self.inner.services.hibernation;
        let mut lease = match self.acquire(key, false, scope.tenant_limits, None).await {
            Ok(lease) => lease,
            Err(e) => {
                // Refused before its restore: the seeded checkpoint (its container) goes.
                hibernation.discard_where(|k| k == key).await;
                return Err(e.into());
            }
        };
        lease.confirm_start().await;
        let restored = lease.kernel.take_restored();
        self.release(&lease.slot).await;
        match restored {
            Some(restored) => Ok(RestoredKernel {
                id: lease.kernel.short_id().to_string(),
                generation: lease.slot.generation(),
                restore_seconds: restored.restore_seconds,
            }),
            None => {
                // The restore failed and a new kernel started in its place: not a fork.
                self.clear_session(Some(&key.owner.tenant), &key.owner.session)
                    .await;
                Err(SnapshotError::Restore(
                    "the engine could not start the snapshot's checkpoint".into(),
                ))
            }
        }
    }
}

/// Whether a snapshot's checkpoint was a hibernated kernel's (no pause of its own).
fn registry_hibernated_paused(checkpoint: &Checkpoint) -> bool {
    checkpoint.from != FROM_SNAPSHOT
}

fn fork_outcome(session: String, outcome: Result<RestoredKernel, SnapshotError>) -> ForkOutcome {
    match outcome {
        Ok(kernel) => ForkOutcome {
            session,
            kernel: Some(kernel),
            error: None,
        },
        Err(e) => ForkOutcome {
            session,
            kernel: None,
            error: Some(ErrorDetail {
                code: e.code().into(),
                message: e.to_string(),
            }),
        },
    }
}

impl SnapshotError {
    /// The error's stable code in an answer (`docs/snapshots.md`).
    pub fn code(&self) -> &'static str {
        match self {
            SnapshotError::NotFound { .. } => "snapshot_not_found",
            SnapshotError::Limit { .. } => "snapshot_limit",
            SnapshotError::NoKernel { .. } => "no_kernel",
            SnapshotError::Busy { .. } => "session_busy",
            SnapshotError::Unsupported { .. } => "snapshot_unsupported",
            SnapshotError::SessionExists { .. } => "session_exists",
            SnapshotError::Invalid(_) => "invalid_request",
            SnapshotError::Checkpoint(_) => "snapshot_failed",
            SnapshotError::Restore(_) => "restore_failed",
            SnapshotError::Execute(_) => "refused",
            SnapshotError::Store(_) => "snapshot_store",
        }
    }
}
