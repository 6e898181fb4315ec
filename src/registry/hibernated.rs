//! Hibernated kernels' checkpoints by key (`docs/runtimes.md`, "Hibernation"). The reaper marks
//! a key pending when it takes an idle slot whose kernel hibernates; the hibernation then
//! leaves the key's checkpoint (ready) or the loss it would have been without one. The key's
//! next kernel takes the checkpoint and restores it, in place of a new one. A call for a key
//! whose hibernation is pending waits for it first, so a restore never races a checkpoint.
//!
//! Bounded: past a tenant's most hibernated kernels or bytes, or the host's, the oldest
//! checkpoint goes, and one older than the age limit goes too: its owner is told the loss it
//! would have been (`idle_reaped`). Checkpoints recorded by an earlier run of the server are
//! taken over at start under the same bounds (`adopt_checkpoints`).

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::{Inner, Registry};
use crate::cell::LossReason;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;

/// A key's hibernation.
#[derive(Debug)]
pub(super) enum Hibernated {
    /// Being checkpointed: cancelled once it is resolved.
    Pending(CancellationToken),
    /// Checkpointed: the key's next kernel restores it.
    Ready(Box<Checkpoint>),
}

/// The most hibernated kernels kept, and for how long (`config::HibernateConfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HibernationBounds {
    /// On the host.
    pub max_kernels: usize,
    /// Of one tenant.
    pub max_per_tenant: usize,
    /// Bytes of checkpoints on the host.
    pub max_bytes: u64,
    /// Bytes of one tenant's checkpoints.
    pub max_tenant_bytes: u64,
    /// Age past which a checkpoint is discarded.
    pub max_age: Duration,
}

impl Inner {
    pub(super) fn hibernation_pending(&mut self, key: &KernelKey) {
        self.hibernated
            .insert(key.clone(), Hibernated::Pending(CancellationToken::new()));
    }

    /// The oldest ready checkpoint among the keys `pick` accepts.
    fn oldest_checkpoint(&self, pick: impl Fn(&KernelKey) -> bool) -> Option<KernelKey> {
        self.hibernated
            .iter()
            .filter_map(|(k, h)| match h {
                Hibernated::Ready(c) if pick(k) => Some((k, c.at)),
                _ => None,
            })
            .min_by_key(|(_, at)| *at)
            .map(|(k, _)| k.clone())
    }

    fn ready_bytes(&self, pick: impl Fn(&KernelKey) -> bool) -> u64 {
        self.hibernated
            .iter()
            .map(|(k, h)| match h {
                Hibernated::Ready(c) if pick(k) => c.bytes,
                _ => 0,
            })
            .sum()
    }

    fn ready_count(&self, pick: impl Fn(&KernelKey) -> bool) -> usize {
        self.hibernated
            .iter()
            .filter(|(k, h)| matches!(h, Hibernated::Ready(_)) && pick(k))
            .count()
    }

    /// Removes `key`'s checkpoint, if it has one ready (a pending hibernation stays).
    fn take_ready(&mut self, key: &KernelKey) -> Option<Checkpoint> {
        if !matches!(self.hibernated.get(key), Some(Hibernated::Ready(_))) {
            return None;
        }
        match self.hibernated.remove(key) {
            Some(Hibernated::Ready(c)) => Some(*c),
            _ => None,
        }
    }

    /// Discards the oldest checkpoints (their losses recorded) until one more of `tenant`'s,
    /// of `bytes`, fits the bounds; returns them to discard.
    fn make_room(
        &mut self,
        tenant: &str,
        bytes: u64,
        bounds: HibernationBounds,
    ) -> Vec<Checkpoint> {
        let mut gone = Vec::new();
        let mine = |k: &KernelKey| k.owner.tenant == tenant;
        while self.ready_count(mine) >= bounds.max_per_tenant.max(1)
            || (self.ready_count(mine) > 0
                && self.ready_bytes(mine) + bytes > bounds.max_tenant_bytes)
        {
            match self.oldest_checkpoint(mine) {
                Some(oldest) => gone.extend(self.drop_checkpoint(&oldest)),
                None => break,
            }
        }
        while self.ready_count(|_| true) >= bounds.max_kernels.max(1)
            || (self.ready_count(|_| true) > 0
                && self.ready_bytes(|_| true) + bytes > bounds.max_bytes)
        {
            match self.oldest_checkpoint(|_| true) {
                Some(oldest) => gone.extend(self.drop_checkpoint(&oldest)),
                None => break,
            }
        }
        gone
    }

    /// Removes `key`'s checkpoint, recording the loss it stands for.
    fn drop_checkpoint(&mut self, key: &KernelKey) -> Option<Checkpoint> {
        let checkpoint = self.take_ready(key)?;
        let container = crate::docker::short_id(&checkpoint.id);
        self.record_loss(key, LossReason::IdleReaped, Some(container));
        Some(checkpoint)
    }
}

impl Registry {
    /// Of `slots`, those whose kernels are to hibernate (their keys pending: evicted to make
    /// room, see `admission.rs`), taken out.
    pub fn take_hibernating(
        &self,
        slots: &mut Vec<std::sync::Arc<super::Slot>>,
    ) -> Vec<std::sync::Arc<super::Slot>> {
        let inner = self.lock();
        let (pending, rest): (Vec<_>, Vec<_>) = slots
            .drain(..)
            .partition(|s| matches!(inner.hibernated.get(&s.key), Some(Hibernated::Pending(_))));
        *slots = rest;
        pending
    }

    /// Every pending hibernation: each cancelled once it is resolved.
    pub fn pending_hibernations(&self) -> Vec<CancellationToken> {
        self.lock()
            .hibernated
            .values()
            .filter_map(|h| match h {
                Hibernated::Pending(done) => Some(done.clone()),
                Hibernated::Ready(_) => None,
            })
            .collect()
    }

    /// The pending hibernation of `key`'s kernel: cancelled once it is resolved.
    pub fn hibernation_of(&self, key: &KernelKey) -> Option<CancellationToken> {
        match self.lock().hibernated.get(key) {
            Some(Hibernated::Pending(done)) => Some(done.clone()),
            _ => None,
        }
    }

    /// Resolves `key`'s pending hibernation: its checkpoint kept, or (`Err`) the loss
    /// recorded. Returns the checkpoints to discard: those past the bounds (their losses
    /// recorded), and this one when its key stopped waiting for it (the session was cleared
    /// meanwhile, or the registry closed).
    pub fn hibernation_done(
        &self,
        key: &KernelKey,
        result: Result<Checkpoint, LossReason>,
        bounds: HibernationBounds,
    ) -> Vec<Checkpoint> {
        let mut inner = self.lock();
        let waited = match inner.hibernated.remove(key) {
            Some(Hibernated::Pending(done)) => {
                done.cancel();
                true
            }
            Some(ready) => {
                inner.hibernated.insert(key.clone(), ready);
                false
            }
            None => false,
        };
        let checkpoint = match result {
            Ok(checkpoint) => checkpoint,
            Err(reason) => {
                if waited {
                    inner.record_loss(key, reason, None);
                }
                return Vec::new();
            }
        };
        if !waited || inner.closed {
            return vec![checkpoint];
        }
        if checkpoint.bytes > bounds.max_bytes.min(bounds.max_tenant_bytes) {
            // Alone past the bound: it is not kept (and pushes out no other).
            let container = crate::docker::short_id(&checkpoint.id);
            inner.record_loss(key, LossReason::IdleReaped, Some(container));
            return vec![checkpoint];
        }
        let gone = inner.make_room(&key.owner.tenant, checkpoint.bytes, bounds);
        inner
            .hibernated
            .insert(key.clone(), Hibernated::Ready(Box::new(checkpoint)));
        gone
    }

    /// Takes over the checkpoints recorded by an earlier run of the server (oldest first),
    /// for their keys' next calls to restore: a key's generation continues from its record
    /// and the loss the restart left owed to it is dropped. A record whose key has moved on
    /// since (the catalog holds a newer generation, or another of its checkpoints was taken
    /// over already) is returned to discard, and so are the checkpoints past the bounds
    /// (their losses recorded).
    pub fn adopt_checkpoints(
        &self,
        mut records: Vec<(KernelKey, u64, Checkpoint)>,
        bounds: HibernationBounds,
    ) -> Vec<Checkpoint> {
        records.sort_by_key(|(_, _, c)| c.at);
        let mut inner = self.lock();
        let mut gone = Vec::new();
        for (key, generation, checkpoint) in records {
            let seed = inner.seeded.remove(&key.hash());
            let current = inner.generations.get(&key).copied();
            let stale = inner.hibernated.contains_key(&key)
                || inner.slots.contains_key(&key)
                || current.is_some_and(|g| g != generation)
                || seed
                    .as_ref()
                    .is_some_and(|s| !s.continues(&key, generation));
            if stale {
                if let Some(seed) = seed {
                    inner.seeded.insert(key.hash(), seed);
                }
                gone.push(checkpoint);
                continue;
            }
            if checkpoint.bytes > bounds.max_bytes.min(bounds.max_tenant_bytes) {
                gone.push(checkpoint);
                continue;
            }
            gone.extend(inner.make_room(&key.owner.tenant, checkpoint.bytes, bounds));
            inner.remember(&key);
            inner.generations.insert(key.clone(), generation);
            inner.losses.remove(&key);
            inner
                .hibernated
                .insert(key, Hibernated::Ready(Box::new(checkpoint)));
        }
        gone
    }

    /// The idle slots whose kernels hibernate, unregistered and marked pending: the server
    /// stops, and they are checkpointed to come back after its restart (`restored.from:
    /// restart`).
    pub fn take_for_stop(&self) -> Vec<std::sync::Arc<super::Slot>> {
        let mut inner = self.lock();
        let keys: Vec<KernelKey> = inner
            .slots
            .iter()
            .filter(|(_, s)| s.hibernate && s.is_idle())
            .map(|(k, _)| k.clone())
            .collect();
        let mut taken = Vec::new();
        for key in keys {
            if let Some(slot) = inner.slots.remove(&key) {
                inner.hibernation_pending(&key);
                taken.push(slot);
            }
        }
        taken
    }

    /// The names of the checkpoints kept (ready), each with its record's.
    pub fn checkpoint_files(&self) -> std::collections::HashSet<String> {
        self.lock()
            .hibernated
            .values()
            .filter_map(|h| match h {
                Hibernated::Ready(c) => Some(c.file_names()),
                Hibernated::Pending(_) => None,
            })
            .flatten()
            .collect()
    }

    /// The slot's kernel is a new one after all (its hibernated kernel's restore failed):
    /// its generation is counted, as for any new kernel.
    pub fn renew_generation(&self, slot: &super::Slot) {
        let mut inner = self.lock();
        let generation = inner.generations.entry(slot.key.clone()).or_insert(0);
        *generation = (*generation).max(slot.generation()) + 1;
        slot.generation
            .store(*generation, std::sync::atomic::Ordering::Release);
    }

    /// Takes `key`'s checkpoint, for its next kernel to restore.
    pub fn take_checkpoint(&self, key: &KernelKey) -> Option<Checkpoint> {
        self.lock().take_ready(key)
    }

    /// Forgets the hibernations of the keys `pick` accepts, without a loss (their session was
    /// cleared, or the server stops): the ready checkpoints are returned to discard, and a
    /// pending one is discarded when it resolves.
    pub fn remove_hibernated(&self, pick: impl Fn(&KernelKey) -> bool) -> Vec<Checkpoint> {
        let mut inner = self.lock();
        let keys: Vec<KernelKey> = inner
            .hibernated
            .keys()
            .filter(|k| pick(k))
            .cloned()
            .collect();
        let mut gone = Vec::new();
        for key in keys {
            match inner.hibernated.remove(&key) {
                Some(Hibernated::Ready(c)) => gone.push(*c),
                Some(Hibernated::Pending(done)) => done.cancel(),
                None => {}
            }
        }
        gone
    }

    /// Removes the checkpoints older than `max_age`, recording their losses; returned to
    /// discard.
    pub fn expired_checkpoints(&self, max_age: Duration) -> Vec<Checkpoint> {
        let mut inner = self.lock();
        let now = std::time::Instant::now();
        let old: Vec<KernelKey> = inner
            .hibernated
            .iter()
            .filter(|(_, h)| {
                matches!(h, Hibernated::Ready(c) if now.saturating_duration_since(c.at) >= max_age)
            })
            .map(|(k, _)| k.clone())
            .collect();
        old.iter()
            .filter_map(|k| inner.drop_checkpoint(k))
            .collect()
    }

    /// True when `key`'s kernel hibernated (or is hibernating).
    pub fn is_hibernated(&self, key: &KernelKey) -> bool {
        self.lock().hibernated.contains_key(key)
    }

    /// Hibernated kernels (checkpointed or being checkpointed).
    pub fn hibernated_count(&self) -> usize {
        self.lock().hibernated.len()
    }
}

/// Snapshots (`docs/snapshots.md`): a live kernel taken out to be checkpointed with its
/// container left running, and a fork's checkpoint seeded for a new key. Both go through the
/// hibernated kernels' books, so a call for the key waits for the checkpoint and its next
/// kernel is the checkpoint restored, exactly as for a hibernation.
impl Registry {
    /// Takes `key`'s slot out when its kernel is live and idle (no call attached, nothing
    /// computing), the key marked pending: calls for it wait until
    /// [`Registry::snapshot_done`] or [`Registry::put_back`] resolves it. `None` when the
    /// key has no such kernel.
    pub fn take_idle_slot(&self, key: &KernelKey) -> Option<std::sync::Arc<super::Slot>> {
        let mut inner = self.lock();
        if inner.closed || inner.hibernated.contains_key(key) {
            return None;
        }
        let idle = inner
            .slots
            .get(key)
            .is_some_and(|s| s.is_idle() && s.kernel.get().is_some());
        if !idle {
            return None;
        }
        let slot = inner.unregister(key)?;
        inner.hibernation_pending(key);
        Some(slot)
    }

    /// Resolves the pending `key` with its snapshot's source checkpoint (its container left
    /// running): the key's next kernel reconnects it. Returned to discard when the key
    /// stopped waiting for it (the session was cleared meanwhile, or the registry closed).
    pub fn snapshot_done(&self, key: &KernelKey, checkpoint: Checkpoint) -> Option<Checkpoint> {
        let mut inner = self.lock();
        match inner.hibernated.remove(key) {
            Some(Hibernated::Pending(done)) if !inner.closed => {
                inner
                    .hibernated
                    .insert(key.clone(), Hibernated::Ready(Box::new(checkpoint)));
                done.cancel();
                None
            }
            Some(Hibernated::Pending(done)) => {
                done.cancel();
                Some(checkpoint)
            }
            Some(other) => {
                inner.hibernated.insert(key.clone(), other);
                Some(checkpoint)
            }
            None => Some(checkpoint),
        }
    }

    /// Puts back the slot [`Registry::take_idle_slot`] took, its kernel not checkpointed (the
    /// runner refused): it serves its key again. Returned to dispose of when its key stopped
    /// waiting (cleared meanwhile) or has another kernel now.
    pub fn put_back(
        &self,
        slot: std::sync::Arc<super::Slot>,
    ) -> Option<std::sync::Arc<super::Slot>> {
        let mut inner = self.lock();
        let waited = match inner.hibernated.remove(&slot.key) {
            Some(Hibernated::Pending(done)) => {
                done.cancel();
                true
            }
            Some(other) => {
                inner.hibernated.insert(slot.key.clone(), other);
                false
            }
            None => false,
        };
        if !waited || inner.closed || inner.slots.contains_key(&slot.key) {
            return Some(slot);
        }
        inner.slots.insert(slot.key.clone(), slot);
        None
    }

    /// A copy of `key`'s ready checkpoint (its files stay the hibernation's).
    pub fn ready_checkpoint(&self, key: &KernelKey) -> Option<Checkpoint> {
        match self.lock().hibernated.get(key) {
            Some(Hibernated::Ready(c)) => Some((**c).clone()),
            _ => None,
        }
    }

    /// Seeds the new `key` with a fork's checkpoint: its next kernel is that checkpoint
    /// restored, a new generation of the key. Refused (the checkpoint handed back) when the
    /// key has a kernel, live or hibernated, or the registry closed.
    pub fn seed_fork(
        &self,
        key: &KernelKey,
        checkpoint: Box<Checkpoint>,
    ) -> Result<(), Box<Checkpoint>> {
        let mut inner = self.lock();
        if inner.closed || inner.slots.contains_key(key) || inner.hibernated.contains_key(key) {
            return Err(checkpoint);
        }
        inner.remember(key);
        *inner.generations.entry(key.clone()).or_insert(0) += 1;
        inner.losses.remove(key);
        inner
            .hibernated
            .insert(key.clone(), Hibernated::Ready(checkpoint));
        Ok(())
    }
}
