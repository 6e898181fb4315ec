//! Losses and generations: what the catalog knew at start (seeds), the losses recorded as
//! they happen and owed to an owner's next call, and the bound on remembered keys.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use super::{Inner, LossCounts, Registry, Slot, MAX_REMEMBERED_KEYS, MAX_REMEMBERED_PER_TENANT};
use crate::catalog::{CatalogWriter, Change, Entry, EntryState};
use crate::cell::{LossReason, StateLost};
use crate::owner::KernelKey;

/// A key known from the catalog: its owner (checked against the key), last generation, and
/// the loss still owed to it.
#[derive(Debug)]
pub(super) struct Seed {
    tenant: String,
    owner: String,
    generation: u64,
    loss: Option<StateLost>,
}

impl Seed {
    /// Whether a checkpoint of `key` at `generation` continues this seed: the same owner,
    /// and no newer kernel since.
    pub(super) fn continues(&self, key: &KernelKey, generation: u64) -> bool {
        self.tenant == key.owner.tenant
            && self.owner == key.owner.to_string()
            && self.generation == generation
    }
}

impl Inner {
    /// A key seen for the first time takes its generation and owed loss from the catalog.
    pub(super) fn take_seed(&mut self, key: &KernelKey) {
        if self.seeded.is_empty() || self.generations.contains_key(key) {
            return;
        }
        let Some(seed) = self.seeded.remove(&key.hash()) else {
            return;
        };
        if seed.tenant != key.owner.tenant || seed.owner != key.owner.to_string() {
            return;
        }
        self.generations.insert(key.clone(), seed.generation);
        if let Some(loss) = seed.loss {
            self.losses.insert(key.clone(), loss);
        }
    }

    /// Remembers a key seen for the first time, within the bounds: a tenant past its own
    /// bound forgets its own oldest key; past the bound in all, the tenant remembering the
    /// most keys forgets its oldest. So a tenant churning through session names never makes
    /// the server forget a loss owed to another tenant (docs/http-api.md, "State across a
    /// server restart"; the catalog keeps its rows by the same rule).
    pub(super) fn remember(&mut self, key: &KernelKey) {
        if self.generations.contains_key(key) {
            return;
        }
        let tenant = key.owner.tenant.as_str();
        let own = self.remembered.get(tenant).map_or(0, VecDeque::len);
        if own >= MAX_REMEMBERED_PER_TENANT {
            self.forget_oldest(tenant.to_string());
        } else if self.remembered_total >= MAX_REMEMBERED_KEYS {
            let most = self
                .remembered
                .iter()
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)))
                .map(|(t, _)| t.clone());
            if let Some(most) = most {
                self.forget_oldest(most);
            }
        }
        self.remembered
            .entry(tenant.to_string())
            .or_default()
            .push_back(key.clone());
        self.remembered_total += 1;
    }

    /// Forgets `tenant`'s oldest remembered key (its generation and owed loss, unless it has
    /// a kernel now).
    fn forget_oldest(&mut self, tenant: String) {
        let Some(keys) = self.remembered.get_mut(&tenant) else {
            return;
        };
        let old = keys.pop_front();
        if keys.is_empty() {
            self.remembered.remove(&tenant);
        }
        if let Some(old) = old {
            self.remembered_total = self.remembered_total.saturating_sub(1);
            if !self.slots.contains_key(&old) {
                self.generations.remove(&old);
                self.losses.remove(&old);
            }
        }
    }

    /// Records `slot`'s kernel ended on purpose (`why`: `cleared`, `reset`, `ended`): journaled,
    /// and logged as a lifecycle event when it had a container (`docs/logs.md`).
    pub(super) fn record_end(&mut self, slot: &Slot, why: &'static str) {
        if let Some(container) = slot.container() {
            self.events
                .ended(&slot.key.owner, container, slot.generation(), why);
        }
        self.journal(|| Change::Ended {
            key_hash: slot.key.hash(),
        });
    }

    /// Records `key`'s kernel (its container, when it had one) lost for `reason`: counted, owed
    /// to its next call, journaled, and logged as a lifecycle event (`docs/logs.md`).
    pub(super) fn record_loss(
        &mut self,
        key: &KernelKey,
        reason: LossReason,
        container: Option<&str>,
    ) {
        if let Some(i) = LossReason::ALL.iter().position(|r| *r == reason) {
            self.loss_counts[i] += 1;
        }
        self.tenants.loss(&key.owner.tenant, reason);
        self.remember(key);
        let generation = *self.generations.entry(key.clone()).or_insert(0);
        self.events.lost(&key.owner, container, generation, reason);
        let loss = StateLost {
            reason,
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            workspace_lost: false,
        };
        self.journal(|| Change::Lost {
            key_hash: key.hash(),
            tenant: key.owner.tenant.clone(),
            owner: key.owner.to_string(),
            generation,
            loss: loss.clone(),
        });
        self.losses.insert(key.clone(), loss);
    }
}

impl Registry {
    /// Records kernel losses (and voluntary ends) in `journal` from now on, and seeds the
    /// generations and owed losses of keys from what the catalog held at start (rows still
    /// `live` must already be turned into losses by the caller). Returns the keys seeded.
    pub fn use_catalog(&self, journal: Arc<CatalogWriter>, entries: Vec<Entry>) -> usize {
        let mut inner = self.lock();
        inner.journal = Some(journal);
        for entry in entries {
            let loss = match entry.state {
                EntryState::Lost { loss } => Some(loss),
                EntryState::Live | EntryState::Ended => None,
            };
            inner.seeded.insert(
                entry.key_hash,
                Seed {
                    tenant: entry.tenant,
                    owner: entry.owner,
                    generation: entry.generation,
                    loss,
                },
            );
        }
        inner.seeded.len()
    }

    /// What a cluster's catalog says of a session this node just claimed (docs/cluster.md,
    /// "Routing"): each entry's key forgets what this registry remembered of it (unless a
    /// kernel of it is registered here) and takes the entry's generation and owed loss at
    /// its next attach, so a session that ran on another node since continues from there.
    /// Keys of the session the entries do not name keep what this registry knows. The seeds
    /// are bounded like remembered keys: past the bound, the oldest seeds are dropped first.
    pub fn adopt(&self, tenant: &str, session: &str, entries: Vec<Entry>) {
        if entries.is_empty() {
            return;
        }
        let mut inner = self.lock();
        let named: HashSet<&str> = entries.iter().map(|e| e.key_hash.as_str()).collect();
        let stale: Vec<KernelKey> = inner
            .generations
            .keys()
            .filter(|k| k.owner.tenant == tenant && k.owner.session == session)
            .filter(|k| named.contains(k.hash().as_str()))
            .cloned()
            .collect();
        for key in stale {
            if !inner.slots.contains_key(&key) {
                inner.generations.remove(&key);
                inner.losses.remove(&key);
            }
        }
        for entry in entries {
            if inner.seeded.len() >= MAX_REMEMBERED_KEYS {
                if let Some(any) = inner.seeded.keys().next().cloned() {
                    inner.seeded.remove(&any);
                }
            }
            let loss = match entry.state {
                EntryState::Lost { loss } => Some(loss),
                EntryState::Live | EntryState::Ended => None,
            };
            inner.seeded.insert(
                entry.key_hash,
                Seed {
                    tenant: entry.tenant,
                    owner: entry.owner,
                    generation: entry.generation,
                    loss,
                },
            );
        }
    }

    /// True when a kernel of the session (or of one of its delegated children) is
    /// registered here.
    pub fn has_session(&self, tenant: &str, session: &str) -> bool {
        self.lock()
            .slots
            .keys()
            .any(|k| k.owner.tenant == tenant && k.owner.session == session)
    }

    /// Counts losses that happened outside this registry's life (kernels lost by a restart),
    /// for the losses-as-they-happen counters.
    pub fn count_losses(&self, reason: LossReason, n: u64) {
        if let Some(i) = LossReason::ALL.iter().position(|r| *r == reason) {
            self.lock().loss_counts[i] += n;
        }
    }

    /// Losses so far, by reason.
    pub fn loss_counts(&self) -> LossCounts {
        self.lock().loss_counts
    }

    /// Gives back a loss taken by an attach whose call then failed before reporting it, unless
    /// a newer loss is owed already: a loss is never dropped unreported.
    pub fn restore_loss(&self, key: &KernelKey, loss: StateLost) {
        let mut inner = self.lock();
        if inner.closed || inner.losses.contains_key(key) {
            return;
        }
        inner.remember(key);
        inner.losses.insert(key.clone(), loss);
    }
}
