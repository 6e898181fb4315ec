//! Hibernation in the orchestrator (`docs/runtimes.md`, "Hibernation"): the reaper's idle
//! slots whose kernels hibernate are checkpointed (`Kernel::hibernate`) rather than disposed
//! of; a call for a key waits for its hibernation under way, and its next kernel is the
//! checkpoint restored (`Kernel::restore`) when there is one. A checkpoint that fails, or a
//! restore that fails, is the loss it would have been without hibernation (`idle_reaped`),
//! never a silent one.

use std::collections::HashSet;
use std::sync::Arc;

use super::Orchestrator;
use crate::cell::LossReason;
use crate::config::{HibernateConfig, ValidConfig, HIBERNATE_ANSWER_LIMIT, HIBERNATE_WAIT_LIMIT};
use crate::docker::{ContainerInfo, Engine, EngineError};
use crate::kernel::{Checkpoint, Kernel, KernelError, Record, Restore};
use crate::labels;
use crate::owner::KernelKey;
use crate::registry::{HibernationBounds, Slot, TenantLimits};

/// Hibernated kernels an earlier run of the server left, read at start.
#[derive(Default)]
pub(super) struct Recorded {
    /// The records to take over: their containers are still there, stopped, named hibernated.
    pub(super) records: Vec<Record>,
    /// The [`labels::CHECKPOINTS`] label this run's kernels carry, when checkpoints outlive
    /// it.
    pub(super) tag: Option<String>,
}

/// The hibernated kernels an earlier run left in the checkpoints' directory, when checkpoints
/// outlive a run (`HibernateConfig::lasts`): the records whose containers are still there,
/// stopped and named hibernated. What no record claims (a record unreadable or not written,
/// a kill between the rename and the record) is discarded: the stopped containers labelled
/// with this directory's tag, with their volumes. A server whose checkpoints do not outlive
/// it (one that does not hibernate, on the state directory's `checkpoints`) discards every
/// one, and clears the directory: their owners are told `server_restarted`.
pub(super) async fn recorded(
    config: &ValidConfig,
    engine: &dyn Engine,
) -> Result<Recorded, EngineError> {
    let state_dir = config.housekeeping.state_dir.as_deref();
    let (dir, lasting) = match (&config.hibernate, state_dir) {
        (Some(h), _) if h.lasts(state_dir) => (h.checkpoint_dir(state_dir, ""), true),
        (_, Some(state)) => (
            HibernateConfig::default().checkpoint_dir(Some(state), ""),
            false,
        ),
        (_, None) => return Ok(Recorded::default()),
    };
    let reading = dir.clone();
    let (records, tag) = tokio::task::spawn_blocking(move || {
        (
            Record::read_all(&reading),
            labels::checkpoints_tag(&reading),
        )
    })
    .await
    .unwrap_or_default();
    let hibernated: Vec<ContainerInfo> = engine
        .list_containers(&[labels::managed(), labels::filter(labels::CHECKPOINTS, &tag)])
        .await?
        .into_iter()
        .filter(|c| {
            c.state == "exited"
                && matches!(
                    labels::name_claim(&c.name),
                    labels::NameClaim::Hibernated { .. }
                )
        })
        .collect();
    let (records, unclaimed): (Vec<Record>, Vec<Record>) = records
        .into_iter()
        .partition(|r| lasting && hibernated.iter().any(|c| c.id == r.checkpoint.id));
    for record in &unclaimed {
        record.checkpoint.discard(engine).await;
    }
    for c in &hibernated {
        if records.iter().any(|r| r.checkpoint.id == c.id) {
            continue;
        }
        tracing::warn!(container = %crate::docker::short_id(&c.id), "a hibernated kernel no record claims: discarded");
        let _ = engine.remove_container(&c.id).await;
        if let Some(volume) = c.labels.get(labels::VOLUME) {
            let _ = crate::docker::remove_volume_when_free(engine, volume).await;
        }
    }
    if !lasting {
        let _ = tokio::task::spawn_blocking(move || clear_dir(&dir, &HashSet::new())).await;
        return Ok(Recorded::default());
    }
    Ok(Recorded {
        records,
        tag: Some(tag),
    })
}

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
                max_tenant_bytes: h.max_tenant_bytes,
                max_age: h.max_age,
            })
    }

    /// Takes over the hibernated kernels an earlier run recorded ([`recorded`]): their owners'
    /// next calls restore them (their containers carry an earlier instance's labels: the
    /// event monitor then follows every kernelbox container). Those the registry refuses
    /// (moved on since, past the bounds) are discarded. Returns how many were taken over.
    pub(super) fn adopt_recorded(&self, records: Vec<Record>) -> u64 {
        let inner = &self.inner;
        let Some(bounds) = self.hibernation_bounds() else {
            return 0;
        };
        if records.is_empty() {
            return 0;
        }
        // A tenant that no longer hibernates (the tenants file changed) gets none back.
        let (records, unwanted): (Vec<Record>, Vec<Record>) = records.into_iter().partition(|r| {
            inner
                .config
                .hibernate
                .as_ref()
                .is_some_and(|h| h.applies(&r.key.owner.tenant, r.key.runtime))
        });
        let mut gone = inner.registry.adopt_checkpoints(
            records
                .into_iter()
                .map(|r| (r.key, r.generation, r.checkpoint))
                .collect(),
            bounds,
        );
        gone.extend(unwanted.into_iter().map(|r| r.checkpoint));
        // Past this run's age bound already: discarded now, not restored first.
        gone.extend(inner.registry.expired_checkpoints(bounds.max_age));
        let adopted = inner.registry.hibernated_count() as u64;
        tracing::info!(
            kernels = adopted,
            discarded = gone.len(),
            "hibernated kernels of an earlier run taken over"
        );
        let this = self.clone();
        inner
            .tracker
            .spawn(async move { this.discard_checkpoints(gone).await });
        adopted
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
            (Some(kernel), Ok(dir)) => {
                let lasting = self.checkpoints_last();
                kernel
                    .hibernate(HIBERNATE_ANSWER_LIMIT, &dir, lasting)
                    .await
            }
            (None, _) => Err(KernelError::Hibernate("no kernel".into())),
            (_, Err(e)) => Err(KernelError::Hibernate(format!(
                "the checkpoints' directory: {e}"
            ))),
        };
        match result {
            Ok(mut checkpoint) => {
                checkpoint.from = match from {
                    LossReason::Evicted => "evicted",
                    LossReason::ServerRestarted => "restart",
                    _ => "idle",
                }
                .into();
                if self.checkpoints_last() {
                    // Its record, for a restarted server to take it over (`record.rs`).
                    let record =
                        Record::new(slot.key.clone(), slot.generation(), checkpoint.clone());
                    if let Err(e) = record.write().await {
                        tracing::warn!(error = %e, "a hibernated kernel's record could not be written: it will not outlive this server");
                    }
                }
                crate::logging::kernel_hibernated(
                    &slot.key.owner,
                    crate::docker::short_id(&checkpoint.id),
                    slot.generation(),
                    &checkpoint.from,
                    checkpoint.checkpoint_seconds,
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

    /// Removes what is in the checkpoints' directory (`kb-*`) but the files of the
    /// checkpoints kept: at start, those no record claims (or whose record was not taken
    /// over), and at a stop that does not keep them, all.
    pub(super) async fn clear_checkpoints(&self) {
        let Some(dir) = self.checkpoint_path() else {
            return;
        };
        let keep = self.inner.registry.checkpoint_files();
        let _ = tokio::task::spawn_blocking(move || clear_dir(&dir, &keep)).await;
    }

    /// Whether checkpoints outlive this run (`HibernateConfig::lasts`).
    pub(super) fn checkpoints_last(&self) -> bool {
        let config = &self.inner.config;
        config
            .hibernate
            .as_ref()
            .is_some_and(|h| h.lasts(config.housekeeping.state_dir.as_deref()))
    }

    /// The checkpoints' directory, when kernels hibernate.
    pub(super) fn checkpoint_path(&self) -> Option<std::path::PathBuf> {
        let config = &self.inner.config;
        config.hibernate.as_ref().map(|h| {
            h.checkpoint_dir(
                config.housekeeping.state_dir.as_deref(),
                &self.inner.instance.id,
            )
        })
    }

    /// Where checkpoints are written, created (mode 0700) if missing.
    async fn checkpoint_dir(&self) -> std::io::Result<std::path::PathBuf> {
        let dir = self
            .checkpoint_path()
            .ok_or_else(|| std::io::Error::other("kernels do not hibernate"))?;
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
                instance: &inner.instance,
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

/// Removes the `kb-*` entries of `dir` whose names are not in `keep`. Blocking.
pub(super) fn clear_dir(dir: &std::path::Path, keep: &std::collections::HashSet<String>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("kb-") || keep.contains(&name) {
            continue;
        }
        let path = entry.path();
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
    }
}
