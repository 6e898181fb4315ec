//! Migration on drain, as the orchestrator hands it what it owns (`docs/cluster.md`,
//! "Migration on drain"; the service is `services/migration/`). Functions, not methods: the
//! cluster node (`server/cluster/migrate.rs`) drives a migration through them, and each
//! reaches one of the orchestrator's parts (its registry, engine, spawner) at a named point.
//!
//! Leaving: [`checkpoint_out`] takes a session's idle kernel out of the registry (its calls
//! here wait; the cluster node also tells new ones to retry) and checkpoints it with its
//! container left running; [`finish_out`] then closes its books, moved or lost.
//! Arriving: [`create_in`] makes the container of the same spec, [`seed_in`] takes the
//! catalog's rows of the moved session and seeds the checkpoint as the same generation, so
//! the owner's next call restores it like a hibernated kernel.

use std::path::Path;
use std::sync::Arc;

use super::Orchestrator;
use crate::catalog::Entry;
use crate::cell::LossReason;
use crate::config::HIBERNATE_ANSWER_LIMIT;
use crate::kernel::{Checkpoint, Created, Kernel, SpawnRequest};
use crate::owner::KernelKey;
use crate::registry::Slot;
use crate::services::migration::{restored_from, Manifest};
use crate::services::{MigrationError, Migrations};

/// The orchestrator's migration service.
pub(crate) fn migrations(o: &Orchestrator) -> &Migrations {
    &o.inner.services.migrations
}

/// The keys a drain may migrate now, at most `limit` (`Registry::migratable`).
pub(crate) fn migratable(o: &Orchestrator, limit: usize) -> Vec<KernelKey> {
    o.inner.registry.migratable(limit)
}

/// A leaving kernel, checkpointed: its key stays pending in the registry until
/// [`finish_out`].
pub(crate) struct Outgoing {
    pub(crate) key: KernelKey,
    pub(crate) generation: u64,
    pub(crate) checkpoint: Checkpoint,
    _slot: Arc<Slot>,
}

/// Takes `key`'s idle kernel out and checkpoints it into `dir` (its container left
/// running). On failure the kernel is back as it was, or disposed of when the engine
/// failed (its next call finds it gone and says so), as for a snapshot.
pub(crate) async fn checkpoint_out(
    o: &Orchestrator,
    key: &KernelKey,
    dir: &Path,
) -> Result<Outgoing, MigrationError> {
    let registry = &o.inner.registry;
    let slot = registry
        .take_idle_slot(key)
        .ok_or_else(|| MigrationError::Checkpoint("the kernel is busy or gone".into()))?;
    let generation = slot.generation();
    let kernel = slot.kernel.get().cloned();
    let taken = match kernel {
        Some(kernel) => kernel
            .snapshot(HIBERNATE_ANSWER_LIMIT, dir)
            .await
            .map_err(|e| MigrationError::Checkpoint(e.to_string())),
        None => Err(MigrationError::Checkpoint("the kernel is gone".into())),
    };
    match taken {
        Ok(checkpoint) => Ok(Outgoing {
            key: key.clone(),
            generation,
            checkpoint,
            _slot: slot,
        }),
        Err(e) => {
            if let Some(slot) = registry.put_back(slot) {
                crate::services::dispose_slots(vec![slot]).await;
            }
            Err(e)
        }
    }
}

/// Closes a leaving kernel's books: moved, nothing of it is owed here; not moved, it is
/// lost `node_drained` now (its owner told at the next call) rather than at the deadline.
/// Its container goes either way (its files are the caller's directory's).
pub(crate) async fn finish_out(o: &Orchestrator, out: Outgoing, moved: bool) {
    let lost = (!moved).then_some(LossReason::NodeDrained);
    o.inner.registry.migration_over(&out.key, lost);
    out.checkpoint.discard(o.inner.engine.as_ref()).await;
}

/// A stopped container of `key`'s spec for an arriving kernel.
pub(crate) async fn create_in(
    o: &Orchestrator,
    key: &KernelKey,
    generation: u64,
) -> Result<Created, MigrationError> {
    Kernel::create_stopped(&SpawnRequest {
        owner: Some((key.clone(), generation)),
        ..o.spawn_request()
    })
    .await
    .map_err(|e| MigrationError::Restore(e.to_string()))
}

/// Removes a container [`create_in`] made that no kernel took.
pub(crate) async fn discard_created(o: &Orchestrator, created: &Created) {
    created.remove(o.inner.engine.as_ref()).await;
}

/// Seeds the arriving kernel: the catalog's `entries` of its session taken over, its
/// checkpoint (files under `dir`) to be restored into `created` by the key's next call, as
/// the manifest's generation. Refused when the key has a kernel here; then the session's
/// loss is owed (`node_drained`) and the caller removes the container.
pub(crate) fn seed_in(
    o: &Orchestrator,
    manifest: &Manifest,
    created: &Created,
    dir: &Path,
    entries: Vec<Entry>,
) -> Result<(), MigrationError> {
    let key = &manifest.key;
    let registry = &o.inner.registry;
    registry.adopt(&key.owner.tenant, &key.owner.session, entries);
    let checkpoint =
        manifest
            .checkpoint
            .kept_in(dir)
            .forked(created, dir, &restored_from(&manifest.from_node));
    registry
        .seed_migrated(key, Box::new(checkpoint), manifest.generation)
        .map_err(|_| {
            registry.migration_over(key, Some(LossReason::NodeDrained));
            MigrationError::Conflict {
                session: key.owner.session.clone(),
            }
        })
}
