//! Migration on drain (`docs/cluster.md`, "Migration on drain"): which kernels a draining
//! node may move (a session's only kernel, idle, under runsc), a moved kernel's books closed
//! on the node it left, and its checkpoint seeded on the node it reaches as the same
//! generation of the key (restored by the key's next call, like a hibernated kernel).

use crate::cell::LossReason;
use crate::docker::KernelRuntime;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;

use super::hibernated::Hibernated;
use super::Registry;

impl Registry {
    /// The keys a drain may migrate: idle runsc kernels that are their session's only kernel
    /// here (no delegated child, no other context, nothing hibernated of the session), at
    /// most `limit` of them.
    pub fn migratable(&self, limit: usize) -> Vec<KernelKey> {
        let inner = self.lock();
        let mut per_session: std::collections::HashMap<(&str, &str), usize> =
            std::collections::HashMap::new();
        for key in inner.slots.keys().chain(inner.hibernated.keys()) {
            *per_session
                .entry((key.owner.tenant.as_str(), key.owner.session.as_str()))
                .or_insert(0) += 1;
        }
        inner
            .slots
            .iter()
            .filter(|(key, slot)| {
                key.runtime == KernelRuntime::Runsc
                    && key.owner.child.is_none()
                    && per_session
                        .get(&(key.owner.tenant.as_str(), key.owner.session.as_str()))
                        .is_some_and(|n| *n == 1)
                    && slot.is_idle()
                    && slot.kernel.get().is_some()
            })
            .map(|(key, _)| key.clone())
            .take(limit)
            .collect()
    }

    /// Closes the books of `key`, taken out by [`Registry::take_idle_slot`]: `lost` `None`,
    /// it is now served by another node and nothing of it is owed here; else its migration
    /// failed after its checkpoint and it is lost for `lost` (owed to the owner's next call,
    /// and told to the catalog), as the drain's deadline would have.
    pub fn migration_over(&self, key: &KernelKey, lost: Option<LossReason>) {
        let mut inner = self.lock();
        if let Some(entry) = inner.hibernated.remove(key) {
            match entry {
                Hibernated::Pending(done) => done.cancel(),
                ready => {
                    inner.hibernated.insert(key.clone(), ready);
                }
            }
        }
        match lost {
            None => {
                inner.losses.remove(key);
            }
            Some(reason) if !inner.closed && !inner.slots.contains_key(key) => {
                inner.record_loss(key, reason, None);
            }
            Some(_) => {}
        }
    }

    /// Seeds `key` with a checkpoint migrated from another node as generation `generation`
    /// of the key (not a new one: the same kernel goes on). Refused, the checkpoint handed
    /// back, when the key has a kernel here, live or hibernated, or the registry closed.
    pub fn seed_migrated(
        &self,
        key: &KernelKey,
        checkpoint: Box<Checkpoint>,
        generation: u64,
    ) -> Result<(), Box<Checkpoint>> {
        let mut inner = self.lock();
        if inner.closed || inner.slots.contains_key(key) || inner.hibernated.contains_key(key) {
            return Err(checkpoint);
        }
        inner.remember(key);
        let known = inner.generations.entry(key.clone()).or_insert(0);
        *known = (*known).max(generation);
        inner.losses.remove(key);
        inner
            .hibernated
            .insert(key.clone(), Hibernated::Ready(checkpoint));
        Ok(())
    }
}
