//! Hibernation, a service of the orchestrator (`docs/runtimes.md`, "Hibernation"): the
//! reaper's idle slots whose kernels hibernate are parked (checkpointed, `Kernel::hibernate`)
//! rather than disposed of; a call for a key waits for its hibernation under way, and its next
//! kernel is the checkpoint restored (`Kernel::restore`) when there is one; checkpoints past
//! their bounds or age, of a reset, or of a stop that does not keep them are discarded. A
//! checkpoint that fails, or a restore that fails, is the loss it would have been without
//! hibernation (`idle_reaped`), never a silent one. The checkpoints themselves are kept by
//! the registry (`registry/hibernated.rs`), under its lock with the slots they replace.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Hibernation`]: park, wait, restore, discard, expire; the checkpoints' directory |
//! | `recorded.rs` | what an earlier run left at start ([`recorded`]), the directory's clearing |

mod recorded;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::task::TaskTracker;

use crate::cell::LossReason;
use crate::config::{HibernateConfig, ValidConfig, HIBERNATE_ANSWER_LIMIT, HIBERNATE_WAIT_LIMIT};
use crate::docker::monitor::EventMonitor;
use crate::docker::Engine;
use crate::instance::Instance;
use crate::kernel::{Checkpoint, Kernel, KernelError, Record, Restore};
use crate::owner::KernelKey;
use crate::registry::{HibernationBounds, Registry, Slot, TenantLimits};

pub(crate) use recorded::recorded;

/// Kernels checkpointed at once (each writes its memory to disk).
const HIBERNATE_CONCURRENCY: usize = 4;

/// What a restore needs besides the checkpoint.
struct Restoring {
    monitor: EventMonitor,
    helper_idle: Duration,
    spawn_timeout: Duration,
    instance: Instance,
}

/// The hibernation service: its settings, where its checkpoints go, and what it parks,
/// restores and discards them with. Built once at start; with kernels that do not hibernate
/// it parks nothing and only discards.
pub(crate) struct Hibernation {
    /// `None` when kernels do not hibernate.
    config: Option<HibernateConfig>,
    /// The checkpoints' directory of this instance, when kernels hibernate.
    dir: Option<PathBuf>,
    /// Checkpoints outlive this run (`HibernateConfig::lasts`).
    lasting: bool,
    /// The tenants' settings as now: which tenants hibernate (a reload swaps them).
    policies: Arc<crate::tenancy::LivePolicies>,
    registry: Arc<Registry>,
    engine: Arc<dyn Engine>,
    tracker: TaskTracker,
    restoring: Restoring,
}

impl Hibernation {
    pub(crate) fn new(
        config: &ValidConfig,
        registry: Arc<Registry>,
        engine: Arc<dyn Engine>,
        tracker: TaskTracker,
        monitor: EventMonitor,
        instance: &Instance,
        policies: Arc<crate::tenancy::LivePolicies>,
    ) -> Hibernation {
        let state_dir = config.housekeeping.state_dir.as_deref();
        let hibernate = config.hibernate.clone();
        Hibernation {
            dir: hibernate
                .as_ref()
                .map(|h| h.checkpoint_dir(state_dir, &instance.id)),
            lasting: hibernate.as_ref().is_some_and(|h| h.lasts(state_dir)),
            config: hibernate,
            policies,
            registry,
            engine,
            tracker,
            restoring: Restoring {
                monitor,
                helper_idle: config.files.helper_idle,
                spawn_timeout: config.kernels.spawn_timeout,
                instance: instance.clone(),
            },
        }
    }

    /// Whether `key`'s idle kernel is to hibernate (its tenant's policy, its runtime).
    pub(crate) fn applies(&self, key: &KernelKey) -> bool {
        // Which tenants hibernate is the tenants' setting as now (a reload swaps it:
        // `crate::tenancy`); whether the server hibernates at all, its configuration's.
        self.config.is_some()
            && self
                .policies
                .load()
                .hibernates(&key.owner.tenant, key.runtime)
    }

    /// `limits` with `hibernate` set when `key`'s idle kernel is to hibernate.
    pub(crate) fn limits_for(&self, key: &KernelKey, limits: TenantLimits) -> TenantLimits {
        TenantLimits {
            hibernate: self.applies(key),
            ..limits
        }
    }

    /// Hibernated kernels (checkpointed, or being checkpointed).
    pub(crate) fn count(&self) -> usize {
        self.registry.hibernated_count()
    }

    /// Whether checkpoints outlive this run (`HibernateConfig::lasts`).
    pub(crate) fn lasts(&self) -> bool {
        self.lasting
    }

    fn bounds(&self) -> Option<HibernationBounds> {
        self.config.as_ref().map(|h| HibernationBounds {
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
    pub(crate) fn adopt(self: &Arc<Self>, records: Vec<Record>) -> u64 {
        let Some(bounds) = self.bounds() else {
            return 0;
        };
        if records.is_empty() {
            return 0;
        }
        // A tenant that no longer hibernates (the tenants file changed) gets none back.
        let (records, unwanted): (Vec<Record>, Vec<Record>) =
            records.into_iter().partition(|r| self.applies(&r.key));
        let registry = &self.registry;
        let mut gone = registry.adopt_checkpoints(
            records
                .into_iter()
                .map(|r| (r.key, r.generation, r.checkpoint))
                .collect(),
            bounds,
        );
        gone.extend(unwanted.into_iter().map(|r| r.checkpoint));
        // Past this run's age bound already: discarded now, not restored first.
        gone.extend(registry.expired_checkpoints(bounds.max_age));
        let adopted = registry.hibernated_count() as u64;
        tracing::info!(
            kernels = adopted,
            discarded = gone.len(),
            "hibernated kernels of an earlier run taken over"
        );
        let this = self.clone();
        self.tracker.spawn(async move { this.discard(gone).await });
        adopted
    }

    /// Waits (bounded) for `key`'s hibernation under way, so the call then finds its
    /// checkpoint, or the loss it turned into.
    pub(crate) async fn wait_for(&self, key: &KernelKey) {
        if let Some(done) = self.registry.hibernation_of(key) {
            let _ = tokio::time::timeout(HIBERNATE_WAIT_LIMIT, done.cancelled()).await;
        }
    }

    /// Parks the kernels of `slots` (each marked pending in the registry), a few at a time;
    /// `from` is why: the idle reap, an eviction or the stop, the loss each would be without.
    pub(crate) async fn park(&self, slots: Vec<Arc<Slot>>, from: LossReason) {
        use futures::StreamExt;
        futures::stream::iter(slots)
            .for_each_concurrent(HIBERNATE_CONCURRENCY, |slot| async move {
                self.park_one(&slot, from).await;
            })
            .await;
    }

    /// Of the slots an admission evicted, those whose kernels hibernate start doing so in the
    /// background (owned by the tracker; their owners' calls wait for it): the admitted call
    /// does not wait on their checkpoints.
    pub(crate) fn park_evicted(self: &Arc<Self>, doomed: &mut Vec<Arc<Slot>>) {
        let hibernating = self.registry.take_hibernating(doomed);
        if hibernating.is_empty() {
            return;
        }
        let this = self.clone();
        self.tracker.spawn(async move {
            this.park(hibernating, LossReason::Evicted).await;
        });
    }

    async fn park_one(&self, slot: &Slot, from: LossReason) {
        let registry = &self.registry;
        let Some(bounds) = self.bounds() else {
            return;
        };
        let result = match (slot.kernel.get(), self.created_dir().await) {
            (Some(kernel), Ok(dir)) => {
                kernel
                    .hibernate(HIBERNATE_ANSWER_LIMIT, &dir, self.lasting)
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
                if self.lasting {
                    // Its record, for a restarted server to take it over (`record.rs`).
                    let record =
                        Record::new(slot.key.clone(), slot.generation(), checkpoint.clone());
                    if let Err(e) = record.write().await {
                        tracing::warn!(error = %e, "a hibernated kernel's record could not be written: it will not outlive this server");
                    }
                }
                registry.events().hibernated(
                    &slot.key.owner,
                    crate::docker::short_id(&checkpoint.id),
                    slot.generation(),
                    &checkpoint.from,
                    checkpoint.checkpoint_seconds,
                );
                let gone = registry.hibernation_done(&slot.key, Ok(checkpoint), bounds);
                self.discard(gone).await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "an idle kernel could not hibernate: reaped instead");
                if let Some(kernel) = slot.kernel.get() {
                    super::dispose_kernel(kernel).await;
                }
                registry.hibernation_done(&slot.key, Err(from), bounds);
            }
        }
    }

    /// Removes what is in the checkpoints' directory (`kb-*`) but the files of the
    /// checkpoints kept: at start, those no record claims (or whose record was not taken
    /// over), and at a stop that does not keep them, all.
    pub(crate) async fn clear_dir(&self) {
        let Some(dir) = self.dir.clone() else {
            return;
        };
        let keep = self.registry.checkpoint_files();
        let _ = tokio::task::spawn_blocking(move || recorded::clear_dir(&dir, &keep)).await;
    }

    /// Where checkpoints are written, created (mode 0700) if missing.
    async fn created_dir(&self) -> std::io::Result<PathBuf> {
        let dir = self
            .dir
            .clone()
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
    pub(crate) async fn discard(&self, checkpoints: Vec<Checkpoint>) {
        use futures::StreamExt;
        let engine = self.engine.as_ref();
        futures::stream::iter(checkpoints)
            .for_each_concurrent(crate::docker::REMOVAL_CONCURRENCY, |c| async move {
                c.discard(engine).await;
            })
            .await;
    }

    /// Discards the checkpoints of the keys `pick` chooses (a reset, a clear, an eviction,
    /// a stop that does not keep them).
    pub(crate) async fn discard_where(&self, pick: impl Fn(&KernelKey) -> bool) {
        let gone = self.registry.remove_hibernated(pick);
        self.discard(gone).await;
    }

    /// Discards the checkpoints past their age (their losses recorded).
    pub(crate) async fn expire(&self) {
        if let Some(bounds) = self.bounds() {
            let old = self.registry.expired_checkpoints(bounds.max_age);
            if !old.is_empty() {
                tracing::info!(
                    checkpoints = old.len(),
                    "expired hibernated kernels discarded"
                );
            }
            self.discard(old).await;
        }
    }

    /// `key`'s hibernated kernel restored, when it has one: `None` when it has none; a
    /// failed restore discards the checkpoint and returns the loss it is, for the caller to
    /// report.
    pub(crate) async fn restore(&self, key: &KernelKey) -> Option<Result<Arc<Kernel>, LossReason>> {
        let checkpoint = self.registry.take_checkpoint(key)?;
        let restoring = &self.restoring;
        let restored = Kernel::restore(
            &checkpoint,
            Restore {
                engine: &self.engine,
                owner: &key.owner,
                helper_idle: restoring.helper_idle,
                tracker: &self.tracker,
                monitor: restoring.monitor.clone(),
                limit: restoring.spawn_timeout,
                instance: &restoring.instance,
            },
        )
        .await;
        match restored {
            Ok(kernel) => Some(Ok(kernel)),
            Err(e) => {
                tracing::warn!(container = %crate::docker::short_id(&checkpoint.id), error = %e, "restoring a hibernated kernel failed: its state is lost");
                checkpoint.discard(self.engine.as_ref()).await;
                Some(Err(LossReason::IdleReaped))
            }
        }
    }
}
