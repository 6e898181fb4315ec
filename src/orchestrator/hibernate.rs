//! Hibernation in the orchestrator (`docs/runtimes.md`, "Hibernation"): the reaper's idle
//! slots whose kernels hibernate are checkpointed (`Kernel::hibernate`) rather than disposed
//! of; a call for a key waits for its hibernation under way, and its next kernel is the
//! checkpoint restored (`Kernel::restore`) when there is one. A checkpoint that fails, or a
//! restore that fails, is the loss it would have been without hibernation (`idle_reaped`),
//! never a silent one.

use std::sync::Arc;

use super::Orchestrator;
use crate::cell::LossReason;
use crate::config::{HIBERNATE_ANSWER_LIMIT, HIBERNATE_WAIT_LIMIT};
use crate::kernel::{Checkpoint, Kernel, KernelError, Restore};
use crate::owner::KernelKey;
use crate::registry::{HibernationBounds, Slot, TenantLimits};

/// Kernels checkpointed at once (each writes its memory to disk).
const HIBERNATE_CONCURRENCY: usize = 4;

impl Orchestrator {
    /// Hibernated kernels (checkpointed, or being checkpointed).
    pub fn hibernated(&self) -> usize {
        self.inner.registry.hibernated_count()
    }

    /// `limits` with `hibernate` set when `key`'s idle kernel is to hibernate.
    pub(super) fn with_hibernation(&self, key: &KernelKey, limits: TenantLimits) -> TenantLimits {
        let hibernate = self
            .inner
            .config
            .hibernate
            .as_ref()
            .is_some_and(|h| h.applies(&key.owner.tenant, key.runtime));
        TenantLimits {
            hibernate,
            ..limits
        }
    }

    fn hibernation_bounds(&self) -> Option<HibernationBounds> {
        self.inner
            .config
            .hibernate
            .as_ref()
            .map(|h| HibernationBounds {
                max_kernels: h.max_kernels,
                max_per_tenant: h.max_per_tenant,
                max_bytes: h.max_bytes,
                max_age: h.max_age,
            })
    }

    /// Waits (bounded) for `key`'s hibernation under way, so the call then finds its
    /// checkpoint, or the loss it turned into.
    pub(super) async fn await_hibernation(&self, key: &KernelKey) {
        if let Some(done) = self.inner.registry.hibernation_of(key) {
            let _ = tokio::time::timeout(HIBERNATE_WAIT_LIMIT, done.cancelled()).await;
        }
    }

    /// Hibernates the kernels of `slots` (each marked pending in the registry), a few at a
    /// time; `from` is why: the idle reap or an eviction, the loss each would be without.
    pub(super) async fn hibernate_slots(&self, slots: Vec<Arc<Slot>>, from: LossReason) {
        use futures::StreamExt;
        futures::stream::iter(slots)
            .for_each_concurrent(HIBERNATE_CONCURRENCY, |slot| async move {
                self.hibernate_slot(&slot, from).await;
            })
            .await;
    }

    /// Of the slots an admission evicted, those whose kernels hibernate start doing so in the
    /// background (owned by the tracker; their owners' calls wait for it): the admitted call
    /// does not wait on their checkpoints.
    pub(super) fn hibernate_evicted(&self, doomed: &mut Vec<Arc<Slot>>) {
        let hibernating = self.inner.registry.take_hibernating(doomed);
        if hibernating.is_empty() {
            return;
        }
        let this = self.clone();
        self.inner.tracker.spawn(async move {
            this.hibernate_slots(hibernating, LossReason::Evicted).await;
        });
    }

    async fn hibernate_slot(&self, slot: &Slot, from: LossReason) {
        let registry = &self.inner.registry;
        let Some(bounds) = self.hibernation_bounds() else {
            return;
        };
        let result = match (slot.kernel.get(), self.checkpoint_dir().await) {
            (Some(kernel), Ok(dir)) => kernel.hibernate(HIBERNATE_ANSWER_LIMIT, &dir).await,
            (None, _) => Err(KernelError::Hibernate("no kernel".into())),
            (_, Err(e)) => Err(KernelError::Hibernate(format!(
                "the checkpoints' directory: {e}"
            ))),
        };
        match result {
            Ok(mut checkpoint) => {
                checkpoint.from = match from {
                    LossReason::Evicted => "evicted",
                    _ => "idle",
                };
                tracing::info!(
                    container = %crate::docker::short_id(&checkpoint.id),
                    seconds = checkpoint.checkpoint_seconds,
                    "idle kernel hibernated"
                );
                let gone = registry.hibernation_done(&slot.key, Ok(checkpoint), bounds);
                self.discard_checkpoints(gone).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "an idle kernel could not hibernate: reaped instead");
                if let Some(kernel) = slot.kernel.get() {
                    self.dispose_kernel(kernel).await;
                }
                registry.hibernation_done(&slot.key, Err(from), bounds);
            }
        }
    }

    /// Removes the checkpoints left in the checkpoints' directory (`kb-*`): at start (an
    /// earlier run's are never restored: their containers went with that run) and at
    /// shutdown, after the discards.
    pub(super) async fn clear_checkpoints(&self) {
        if self.inner.config.hibernate.is_none() {
            return;
        }
        let dir = self.checkpoint_path();
        let _ = tokio::task::spawn_blocking(move || {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if entry.file_name().to_string_lossy().starts_with("kb-") {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        })
        .await;
    }

    fn checkpoint_path(&self) -> std::path::PathBuf {
        let config = &self.inner.config;
        match (
            config.hibernate.as_ref().and_then(|h| h.dir.clone()),
            &config.housekeeping.state_dir,
        ) {
            (Some(dir), _) => dir,
            (None, Some(state)) => state.join("checkpoints"),
            (None, None) => std::env::temp_dir()
                .join(format!("kernelbox-checkpoints-{}", self.inner.instance.id)),
        }
    }

    /// Where checkpoints are written, created (mode 0700) if missing.
    async fn checkpoint_dir(&self) -> std::io::Result<std::path::PathBuf> {
        let dir = self.checkpoint_path();
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
            Ok(dir)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
    }

    /// Removes hibernated kernels' containers and volumes.
    pub(super) async fn discard_checkpoints(&self, checkpoints: Vec<Checkpoint>) {
        use futures::StreamExt;
        let engine = self.inner.engine.as_ref();
        futures::stream::iter(checkpoints)
            .for_each_concurrent(crate::docker::REMOVAL_CONCURRENCY, |c| async move {
                c.discard(engine).await;
            })
            .await;
    }

    /// Discards the checkpoints past their age (their losses recorded).
    pub(super) async fn expire_checkpoints(&self) {
        if let Some(bounds) = self.hibernation_bounds() {
            let old = self.inner.registry.expired_checkpoints(bounds.max_age);
            if !old.is_empty() {
                tracing::info!(
                    checkpoints = old.len(),
                    "expired hibernated kernels discarded"
                );
            }
            self.discard_checkpoints(old).await;
        }
    }

    /// `key`'s hibernated kernel restored, when it has one: `Ok(None)` when it has none, or
    /// its restore failed (then the checkpoint is discarded and its loss recorded, for the
    /// caller to report).
    pub(super) async fn restore_hibernated(
        &self,
        key: &KernelKey,
    ) -> Option<Result<Arc<Kernel>, LossReason>> {
        let inner = &self.inner;
        let checkpoint = inner.registry.take_checkpoint(key)?;
        let restored = Kernel::restore(
            &checkpoint,
            Restore {
                engine: &inner.engine,
                owner: &key.owner,
                helper_idle: inner.config.files.helper_idle,
                tracker: &inner.tracker,
                monitor: inner.monitor.clone(),
                limit: inner.config.kernels.spawn_timeout,
            },
        )
        .await;
        match restored {
            Ok(kernel) => Some(Ok(kernel)),
            Err(e) => {
                tracing::warn!(container = %crate::docker::short_id(&checkpoint.id), error = %e, "restoring a hibernated kernel failed: its state is lost");
                checkpoint.discard(inner.engine.as_ref()).await;
                Some(Err(LossReason::IdleReaped))
            }
        }
    }
}
