//! Snapshots taken and restored (`docs/snapshots.md`): a snapshot kept, a snapshot restored
//! into a new session, and a fork: the source taken once (its checkpoint counted by the
//! bounds like a snapshot's, never kept) and restored into each fork in parallel. A
//! checkpoint (runsc) is restored into a new container of the source's spec through the
//! hibernation's books (`registry/hibernated.rs`), so admission, generations and the first
//! call's answer are a hibernated kernel's; a files-only snapshot (runc) into a fresh kernel
//! (`files_only.rs`). While forks start, the source and the forks already started are held:
//! no fork's admission evicts them (one that does not fit is `at_capacity`).

use super::kernels::{Held, SnapshotKernels};
use super::store::Stored;
use super::take::FROM_SNAPSHOT;
use super::{SnapshotError, Snapshots};
use crate::config::MAX_FORKS_PER_REQUEST;
use crate::docker::KernelRuntime;
use crate::kernel::{Checkpoint, Created, Kernel, SpawnRequest};
use crate::owner::KernelKey;
use crate::registry::TenantLimits;
use crate::wire::{ErrorDetail, ForkOutcome, ForkResult, RestoredKernel, SnapshotInfo};

/// What a snapshot is restored from.
enum Source<'a> {
    /// A checkpoint (the kernel's memory).
    Checkpoint(&'a Checkpoint),
    /// A files-only snapshot's tar of the working directory.
    Files(std::path::PathBuf),
}

impl Snapshots {
    /// Snapshots `key`'s kernel, idle or hibernated, kept as the tenant's snapshot `name`
    /// (`POST /v1/sessions/{session}/snapshots`).
    pub(crate) async fn snapshot(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        name: Option<String>,
    ) -> Result<SnapshotInfo, SnapshotError> {
        if let Some(name) = &name {
            if name.chars().count() > crate::wire::MAX_SNAPSHOT_NAME {
                return Err(SnapshotError::Invalid(format!(
                    "a snapshot's name has at most {} characters",
                    crate::wire::MAX_SNAPSHOT_NAME
                )));
            }
        }
        let reservation = self.reserve(&key.owner.tenant).await?;
        let taken = match self.take(kernels, key, limits, &reservation, false).await {
            Ok(taken) => taken,
            Err(e) => {
                self.abort(reservation).await;
                return Err(e);
            }
        };
        let stored = self.commit(reservation, key, name, &taken).await?;
        tracing::info!(owner = %key.owner, snapshot = %stored.id, bytes = stored.bytes, memory = stored.memory, "kernel snapshotted");
        Ok(self.info(&stored))
    }

    /// The wire form of a kept snapshot.
    pub(crate) fn info(&self, stored: &Stored) -> SnapshotInfo {
        let at = |secs: u64| {
            humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs),
            )
            .to_string()
        };
        SnapshotInfo {
            id: stored.id.clone(),
            name: stored.name.clone(),
            session: stored.key.owner.session.clone(),
            created: at(stored.created),
            expires: at(stored.created + self.config.ttl.as_secs()),
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

    /// Starts `target`'s session, which has no kernel, from its tenant's snapshot `id`
    /// (`POST /v1/sessions/{session}/restore`).
    pub(crate) async fn restore(
        &self,
        kernels: &dyn SnapshotKernels,
        target: &KernelKey,
        limits: TenantLimits,
        id: &str,
    ) -> Result<RestoredKernel, SnapshotError> {
        let stored = self.get(&target.owner.tenant, id)?;
        let key = KernelKey {
            owner: target.owner.clone(),
            ..stored.key.clone()
        };
        let source = match &stored.checkpoint {
            Some(checkpoint) => Source::Checkpoint(checkpoint),
            None => Source::Files(super::store::Stored::files_in(&self.root.join(&stored.id))),
        };
        let (restored, held) = self.restore_one(kernels, &key, limits, &source).await?;
        kernels.release(held).await;
        Ok(restored)
    }

    /// Takes `key`'s kernel once and starts each of `forks` (new keys of the same tenant)
    /// from it, in parallel (`POST /v1/sessions/{session}/fork`). The source's checkpoint
    /// is counted by the tenant's count and byte bounds while the forks start, never kept;
    /// each fork succeeds or fails on its own.
    pub(crate) async fn fork(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        forks: Vec<KernelKey>,
    ) -> Result<ForkResult, SnapshotError> {
        if forks.is_empty() || forks.len() > MAX_FORKS_PER_REQUEST {
            return Err(SnapshotError::Invalid(format!(
                "a fork makes 1 to {MAX_FORKS_PER_REQUEST} sessions"
            )));
        }
        let mut seen = std::collections::HashSet::new();
        for fork in &forks {
            if !seen.insert(&fork.owner.session) || fork.owner.session == key.owner.session {
                return Err(SnapshotError::Invalid(format!(
                    "fork sessions must be new and distinct: {}",
                    fork.owner.session
                )));
            }
        }
        // A reservation never committed: counted (its bytes too, once held) while it lives,
        // removed after (and, were the server killed meanwhile, at its next start).
        let mut reservation = self.reserve(&key.owner.tenant).await?;
        let taken = match self.take(kernels, key, limits, &reservation, true).await {
            Ok(taken) => taken,
            Err(e) => {
                self.abort(reservation).await;
                return Err(e);
            }
        };
        let mut holds: Vec<Held> = taken.source.into_iter().collect();
        if let Err(e) = self.hold(&mut reservation).await {
            for held in holds {
                kernels.release(held).await;
            }
            self.abort(reservation).await;
            return Err(e);
        }
        let source = match &taken.checkpoint {
            Some(checkpoint) => Source::Checkpoint(checkpoint),
            None => Source::Files(super::store::Stored::files_in(&reservation.dir)),
        };
        let started = forks.iter().map(|fork| {
            let source = &source;
            async move {
                let outcome = self.restore_one(kernels, fork, limits, source).await;
                (fork.owner.session.clone(), outcome)
            }
        });
        let started = futures::future::join_all(started).await;
        let mut outcomes = Vec::with_capacity(started.len());
        for (session, outcome) in started {
            outcomes.push(match outcome {
                Ok((kernel, held)) => {
                    holds.push(held);
                    ForkOutcome {
                        session,
                        kernel: Some(kernel),
                        error: None,
                    }
                }
                Err(e) => ForkOutcome {
                    session,
                    kernel: None,
                    error: Some(ErrorDetail {
                        code: e.code().into(),
                        message: e.to_string(),
                    }),
                },
            });
        }
        for held in holds {
            kernels.release(held).await;
        }
        self.abort(reservation).await;
        Ok(ForkResult {
            checkpoint_seconds: taken.seconds,
            forks: outcomes,
        })
    }

    /// Starts `key`'s session (no kernel yet) from `source`: held until the caller releases
    /// it.
    async fn restore_one(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        source: &Source<'_>,
    ) -> Result<(RestoredKernel, Held), SnapshotError> {
        let registry = &self.handles.registry;
        if registry.has_live(&key.owner) || registry.is_hibernated(key) {
            return Err(SnapshotError::SessionExists {
                session: key.owner.session.clone(),
            });
        }
        match source {
            Source::Checkpoint(checkpoint) => {
                self.restore_checkpoint(kernels, key, limits, checkpoint)
                    .await
            }
            Source::Files(tar) => self.restore_files(kernels, key, limits, tar.clone()).await,
        }
    }

    /// A new container of the checkpoint's spec is created, the snapshot's files linked for
    /// its one start, and the checkpoint seeded for `key`, whose hold restores it like a
    /// hibernated kernel.
    async fn restore_checkpoint(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        checkpoint: &Checkpoint,
    ) -> Result<(RestoredKernel, Held), SnapshotError> {
        let created: Created = Kernel::create_stopped(&SpawnRequest {
            owner: Some((key.clone(), 0)),
            ..kernels.spawn_request()
        })
        .await
        .map_err(|e| SnapshotError::Restore(e.to_string()))?;
        let engine = self.handles.engine.as_ref();
        let dir = match self.fork_files(checkpoint).await {
            Ok(dir) => dir,
            Err(e) => {
                created.remove(engine).await;
                return Err(e);
            }
        };
        let forked = checkpoint.forked(&created, &dir, FROM_SNAPSHOT);
        let started = match self.handles.registry.seed_fork(key, Box::new(forked)) {
            Err(refused) => {
                refused.discard(engine).await;
                Err(SnapshotError::SessionExists {
                    session: key.owner.session.clone(),
                })
            }
            Ok(()) => self.start_seeded(kernels, key, limits).await,
        };
        self.fork_done(dir).await;
        started
    }

    async fn start_seeded(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
    ) -> Result<(RestoredKernel, Held), SnapshotError> {
        let mut held = match kernels.hold(key, limits).await {
            Ok(held) => held,
            Err(e) => {
                // Refused before its restore: the seeded checkpoint (its container) goes.
                self.handles.hibernation.discard_where(|k| k == key).await;
                return Err(e);
            }
        };
        match held.restored.take() {
            Some(restored) => Ok((
                RestoredKernel {
                    id: held.kernel.short_id().to_string(),
                    generation: held.slot.generation(),
                    restore_seconds: restored.restore_seconds,
                },
                held,
            )),
            None => {
                // The restore failed and a new kernel started in its place: not a fork.
                kernels.release(held).await;
                kernels.clear(key).await;
                Err(SnapshotError::Restore(
                    "the engine could not start the snapshot's checkpoint".into(),
                ))
            }
        }
    }
}
