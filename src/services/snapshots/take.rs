//! Taking a session's kernel into a reservation's directory (`docs/snapshots.md`): the kernel
//! waited for until it is idle (a call that just ended lets go of it a moment later), then,
//! under runsc, checkpointed with its container left running and reconnected (or, hibernated,
//! its checkpoint linked as it is); under runc its working directory's files only
//! (`files_only.rs`). The source is handed back held when the caller forks from it, so no
//! fork's admission evicts it.

use std::time::{Duration, Instant};

use super::kernels::{Held, SnapshotKernels};
use super::{Reservation, SnapshotError, Snapshots};
use crate::config::{HIBERNATE_ANSWER_LIMIT, SNAPSHOT_BUSY_WAIT};
use crate::docker::KernelRuntime;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;
use crate::registry::{Slot, TenantLimits};

/// How long a wait for an idle kernel goes without looking again when no call released it
/// (`Snapshots::when_idle`): a kernel seen computing between cells turns idle unannounced.
const IDLE_RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// What `restored.from` says of a kernel restored from a snapshot.
pub(super) const FROM_SNAPSHOT: &str = "snapshot";

/// What a snapshot took of a kernel.
pub(crate) struct Taken {
    /// The kernel's checkpoint (its memory), its files under the reservation's directory;
    /// `None`: the working directory's files only (`store::FILES` there).
    pub(crate) checkpoint: Option<Checkpoint>,
    /// How long the checkpoint (or reading the files) took; 0 for a hibernated kernel's.
    pub(crate) seconds: f64,
    /// The source, held for a fork while its forks start (released by the caller).
    pub(super) source: Option<Held>,
}

impl Snapshots {
    /// Takes `key`'s kernel, idle or hibernated, into `reservation`'s directory. With `hold`,
    /// a live source is handed back held (a fork's: never evicted by its forks).
    pub(super) async fn take(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        reservation: &Reservation,
        hold: bool,
    ) -> Result<Taken, SnapshotError> {
        if key.runtime != KernelRuntime::Runsc {
            let (held, seconds) = self.take_files(kernels, key, reservation).await?;
            let source = if hold {
                Some(held)
            } else {
                kernels.release(held).await;
                None
            };
            return Ok(Taken {
                checkpoint: None,
                seconds,
                source,
            });
        }
        let dir = reservation.dir.as_path();
        let registry = &self.handles.registry;
        let hibernation = &self.handles.hibernation;
        hibernation.wait_for(key).await;
        if let Some(hibernated) = registry.ready_checkpoint(key) {
            self.link_into(&hibernated, reservation)
                .await
                .map_err(|e| {
                    SnapshotError::Checkpoint(format!(
                        "the hibernated kernel was restored meanwhile ({e}): try again"
                    ))
                })?;
            return Ok(Taken {
                checkpoint: Some(hibernated.kept_in(dir)),
                seconds: 0.0,
                source: None,
            });
        }
        let slot = self.when_idle(key, |k| registry.take_idle_slot(k)).await?;
        let Some(kernel) = slot.kernel.get().cloned() else {
            if let Some(slot) = registry.put_back(slot) {
                crate::services::dispose_slots(vec![slot]).await;
            }
            return Err(SnapshotError::NoKernel {
                session: key.owner.session.clone(),
            });
        };
        match kernel.snapshot(HIBERNATE_ANSWER_LIMIT, dir).await {
            Ok(mut source) => {
                source.from = FROM_SNAPSHOT.into();
                let seconds = source.checkpoint_seconds;
                let kept = source.kept_in(dir);
                let mut held = None;
                if let Some(gone) = registry.snapshot_done(key, source) {
                    // Cleared meanwhile: its kernel goes, the snapshot stays.
                    hibernation.discard(vec![gone]).await;
                } else {
                    // Reconnected now (what the owner's next call would do), so the kernel
                    // is counted and reaped as any live one.
                    match kernels.hold(key, limits).await {
                        Ok(source) if hold => held = Some(source),
                        Ok(source) => kernels.release(source).await,
                        Err(e) => {
                            tracing::warn!(owner = %key.owner, error = %e, "reconnecting a kernel after its snapshot failed")
                        }
                    }
                }
                Ok(Taken {
                    checkpoint: Some(kept),
                    seconds,
                    source: held,
                })
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

    /// `take(key)` once `key`'s live kernel is idle: a call that just answered lets go of it
    /// a moment later, a running cell when it ends. Waits on the registry's releases (no
    /// polling) for at most [`SNAPSHOT_BUSY_WAIT`]; `no_kernel` when the session has no live kernel,
    /// `session_busy` when it stayed busy.
    pub(super) async fn when_idle<T>(
        &self,
        key: &KernelKey,
        take: impl Fn(&KernelKey) -> Option<T>,
    ) -> Result<T, SnapshotError> {
        let registry = &self.handles.registry;
        let started = Instant::now();
        let deadline = tokio::time::Instant::now() + SNAPSHOT_BUSY_WAIT;
        loop {
            let released = registry.released().notified();
            tokio::pin!(released);
            released.as_mut().enable();
            if let Some(taken) = take(key) {
                return Ok(taken);
            }
            if !registry.has_live(&key.owner) {
                return Err(SnapshotError::NoKernel {
                    session: key.owner.session.clone(),
                });
            }
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Err(SnapshotError::Busy {
                    session: key.owner.session.clone(),
                    waited: round(started.elapsed()),
                });
            }
            // A release wakes the wait at once; a kernel the runaway watch saw computing
            // between cells turns idle with its next sample, which tells no one: looked at
            // again after [`IDLE_RECHECK`] at the latest.
            let _ = tokio::time::timeout_at(deadline.min(now + IDLE_RECHECK), released).await;
        }
    }

    /// Holds `key`'s live runc kernel once idle (as a file transfer holds it).
    pub(super) async fn hold_idle(&self, key: &KernelKey) -> Result<Held, SnapshotError> {
        let registry = &self.handles.registry;
        let slot = self
            .when_idle(key, |k| {
                idle_slot(registry, k).and_then(|_| attach(registry, k))
            })
            .await?;
        match slot.kernel.get().cloned() {
            Some(kernel) => Ok(Held {
                slot,
                kernel,
                restored: None,
            }),
            None => {
                let _ = registry.release(&slot);
                Err(SnapshotError::NoKernel {
                    session: key.owner.session.clone(),
                })
            }
        }
    }
}

/// `key`'s slot when its kernel is live and idle.
fn idle_slot(registry: &crate::registry::Registry, key: &KernelKey) -> Option<()> {
    registry
        .slots()
        .into_iter()
        .find(|s| &s.key == key && s.is_idle() && s.kernel.get().is_some_and(|k| k.is_alive()))
        .map(|_| ())
}

/// Attaches to `key`'s owner's live kernel (a busy slot's refusal is a `None`: waited on).
fn attach(registry: &crate::registry::Registry, key: &KernelKey) -> Option<std::sync::Arc<Slot>> {
    registry.attach_live(&key.owner).ok().flatten()
}

/// A wait as told: whole milliseconds.
fn round(waited: Duration) -> Duration {
    Duration::from_millis(waited.as_millis() as u64)
}
