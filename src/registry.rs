//! The registry: which kernel serves which key, who is attached, what is idle, what was lost.
//!
//! Pure bookkeeping under one short-held lock; the orchestrator does the Docker work (spawning,
//! disposing) outside it. A slot is registered before its kernel exists, so concurrent first
//! calls for one key find the same slot and wait on the same spawn (single flight).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio::time::{Duration, Instant};

use crate::catalog::{CatalogWriter, Change, Entry, EntryState};
use crate::cell::{LossReason, StateLost};
use crate::kernel::Kernel;
use crate::owner::{KernelKey, Owner};

/// Losses and generations are remembered for at most this many keys.
const MAX_REMEMBERED_KEYS: usize = 65_536;

/// One key's current kernel, spawned at most once.
pub struct Slot {
    /// The key.
    pub key: KernelKey,
    /// Which kernel of the key this is.
    pub generation: u64,
    /// The kernel, once spawned.
    pub kernel: OnceCell<Arc<Kernel>>,
    /// Calls holding the slot (spawning or running a cell).
    attached: AtomicUsize,
    /// When a call last released the slot.
    last_used: Mutex<Instant>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("owner", &self.key.owner.to_string())
            .field("generation", &self.generation)
            .field("attached", &self.attached())
            .finish()
    }
}

impl Slot {
    /// Calls currently attached.
    pub fn attached(&self) -> usize {
        self.attached.load(Ordering::Acquire)
    }

    /// When the slot was last released (or created).
    pub fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn pinned(&self, released: &HashSet<Owner>) -> bool {
        self.key.owner.is_child() && !released.contains(&self.key.owner)
    }
}

/// What [`Registry::attach`] hands back.
#[derive(Debug)]
pub struct Attach {
    /// The slot to use.
    pub slot: Arc<Slot>,
    /// Slots evicted or reaped to make room; dispose of their kernels.
    pub victims: Vec<Arc<Slot>>,
    /// The previous slot discarded by `reset=true`, if one existed.
    pub reset: Option<Arc<Slot>>,
    /// The loss to report on this call, if any.
    pub state_lost: Option<StateLost>,
}

/// A tenant is at its kernel cap and every one of its kernels is busy or pinned.
#[derive(Debug)]
pub struct AtCapacity {
    /// The tenant.
    pub tenant: String,
    /// Its cap.
    pub cap: usize,
    /// Idle slots reaped on the way; dispose of their kernels.
    pub victims: Vec<Arc<Slot>>,
}

/// The bookkeeping behind the orchestrator.
#[derive(Debug)]
pub struct Registry {
    max_kernels: usize,
    idle_timeout: Duration,
    inner: Mutex<Inner>,
}

/// Involuntary losses counted as they happen, by reason (indexed as [`LossReason::ALL`]).
pub type LossCounts = [u64; LossReason::ALL.len()];

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<KernelKey, Arc<Slot>>,
    generations: HashMap<KernelKey, u64>,
    losses: HashMap<KernelKey, StateLost>,
    remembered: VecDeque<KernelKey>,
    released_children: HashSet<Owner>,
    loss_counts: LossCounts,
    closed: bool,
    /// Where kernel starts and losses are recorded durably, if anywhere.
    journal: Option<Arc<CatalogWriter>>,
    /// What the catalog knew at start, by key hash: taken by a key's first attach.
    seeded: HashMap<String, Seed>,
}

/// A key known from the catalog: its owner (checked against the key), last generation, and
/// the loss still owed to it.
#[derive(Debug)]
struct Seed {
    tenant: String,
    owner: String,
    generation: u64,
    loss: Option<StateLost>,
}

impl Inner {
    /// Records a change in the catalog, unless shutdown closed the registry (the catalog then
    /// says every live kernel was lost by the restart).
    fn journal(&self, change: impl FnOnce() -> Change) {
        if let (Some(journal), false) = (&self.journal, self.closed) {
            journal.record(change());
        }
    }

    /// A key seen for the first time takes its generation and owed loss from the catalog.
    fn take_seed(&mut self, key: &KernelKey) {
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

    fn remember(&mut self, key: &KernelKey) {
        if !self.generations.contains_key(key) {
            if self.remembered.len() >= MAX_REMEMBERED_KEYS {
                if let Some(old) = self.remembered.pop_front() {
                    if !self.slots.contains_key(&old) {
                        self.generations.remove(&old);
                        self.losses.remove(&old);
                    }
                }
            }
            self.remembered.push_back(key.clone());
        }
    }

    fn record_loss(&mut self, key: &KernelKey, reason: LossReason) {
        if let Some(i) = LossReason::ALL.iter().position(|r| *r == reason) {
            self.loss_counts[i] += 1;
        }
        self.remember(key);
        let generation = *self.generations.entry(key.clone()).or_insert(0);
        let loss = StateLost {
            reason,
            at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
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

    fn take_idle(&mut self, now: Instant, idle: Duration) -> Vec<Arc<Slot>> {
        let stale: Vec<KernelKey> = self
            .slots
            .iter()
            .filter(|(_, s)| {
                s.attached() == 0 && now.saturating_duration_since(s.last_used()) >= idle
            })
            .map(|(k, _)| k.clone())
            .collect();
        stale
            .into_iter()
            .filter_map(|key| {
                let slot = self.slots.remove(&key)?;
                self.record_loss(&key, LossReason::IdleReaped);
                Some(slot)
            })
            .collect()
    }
}

impl Inner {
    /// Evicts least recently used, unpinned, unattached slots until the cap holds (or nothing
    /// more can go). Attached slots cannot go; pinned ones do not count.
    fn evict_over_cap(&mut self, max_kernels: usize) -> Vec<Arc<Slot>> {
        let mut victims = Vec::new();
        loop {
            let released = &self.released_children;
            let unpinned: Vec<&Arc<Slot>> = self
                .slots
                .values()
                .filter(|s| !s.pinned(released))
                .collect();
            if unpinned.len() <= max_kernels {
                return victims;
            }
            let Some(victim) = unpinned
                .into_iter()
                .filter(|s| s.attached() == 0)
                .min_by_key(|s| s.last_used())
                .map(|s| s.key.clone())
            else {
                return victims;
            };
            if let Some(slot) = self.slots.remove(&victim) {
                self.record_loss(&victim, LossReason::Evicted);
                victims.push(slot);
            }
        }
    }
}

impl Registry {
    /// An empty registry with the LRU cap and idle timeout.
    pub fn new(max_kernels: usize, idle_timeout: Duration) -> Registry {
        Registry {
            max_kernels,
            idle_timeout,
            inner: Mutex::new(Inner::default()),
        }
    }

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

    /// Counts losses that happened outside this registry's life (kernels lost by a restart),
    /// for the losses-as-they-happen counters.
    pub fn count_losses(&self, reason: LossReason, n: u64) {
        if let Some(i) = LossReason::ALL.iter().position(|r| *r == reason) {
            self.lock().loss_counts[i] += n;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Attaches a call to the key's slot (creating it), reaps idle slots, applies `reset`,
    /// and evicts least recently used unpinned idle slots past the cap.
    pub fn attach(&self, key: &KernelKey, reset: bool) -> Attach {
        let now = Instant::now();
        let mut inner = self.lock();
        let victims = inner.take_idle(now, self.idle_timeout);
        self.attach_locked(&mut inner, key, reset, victims, now)
    }

    /// [`Registry::attach`] under a per-tenant cap, checked atomically with the registration:
    /// a new kernel for a tenant at `tenant_cap` first evicts the tenant's least recently used
    /// idle, unpinned kernel, and is refused when every one of them is busy or pinned.
    pub fn attach_capped(
        &self,
        key: &KernelKey,
        reset: bool,
        tenant_cap: Option<usize>,
    ) -> Result<Attach, AtCapacity> {
        let now = Instant::now();
        let mut inner = self.lock();
        let mut victims = inner.take_idle(now, self.idle_timeout);
        if let (Some(cap), false) = (tenant_cap, inner.slots.contains_key(key)) {
            let tenant = &key.owner.tenant;
            while inner
                .slots
                .keys()
                .filter(|k| &k.owner.tenant == tenant)
                .count()
                >= cap
            {
                let released = &inner.released_children;
                let victim = inner
                    .slots
                    .values()
                    .filter(|s| &s.key.owner.tenant == tenant)
                    .filter(|s| s.attached() == 0 && !s.pinned(released))
                    .min_by_key(|s| s.last_used())
                    .map(|s| s.key.clone());
                let Some(victim) = victim else {
                    // Nothing was attached yet, so the reaped slots are returned with the error
                    // for disposal by the caller.
                    return Err(AtCapacity {
                        tenant: tenant.clone(),
                        cap,
                        victims,
                    });
                };
                if let Some(slot) = inner.slots.remove(&victim) {
                    inner.record_loss(&victim, LossReason::Evicted);
                    victims.push(slot);
                }
            }
        }
        Ok(self.attach_locked(&mut inner, key, reset, victims, now))
    }

    /// The common part of [`Registry::attach`] and [`Registry::attach_capped`], under the lock.
    fn attach_locked(
        &self,
        inner: &mut Inner,
        key: &KernelKey,
        reset: bool,
        mut victims: Vec<Arc<Slot>>,
        now: Instant,
    ) -> Attach {
        let reset_slot = if reset { inner.slots.remove(key) } else { None };
        if reset_slot.is_some() {
            inner.journal(|| Change::Ended {
                key_hash: key.hash(),
            });
        }
        if key.owner.is_child() {
            inner.released_children.remove(&key.owner);
        }
        let slot = match inner.slots.get(key) {
            Some(slot) => slot.clone(),
            None => {
                inner.remember(key);
                inner.take_seed(key);
                let generation = {
                    let g = inner.generations.entry(key.clone()).or_insert(0);
                    *g += 1;
                    *g
                };
                let slot = Arc::new(Slot {
                    key: key.clone(),
                    generation,
                    kernel: OnceCell::new(),
                    attached: AtomicUsize::new(0),
                    last_used: Mutex::new(now),
                });
                inner.slots.insert(key.clone(), slot.clone());
                slot
            }
        };
        slot.attached.fetch_add(1, Ordering::AcqRel);
        *slot.last_used.lock().unwrap_or_else(|p| p.into_inner()) = now;
        let state_lost = inner.losses.remove(key);
        victims.extend(inner.evict_over_cap(self.max_kernels));
        Attach {
            slot,
            victims,
            reset: reset_slot,
            state_lost,
        }
    }

    /// Releases a call's hold. Returns true when the slot is no longer registered and this
    /// was the last call out: the caller must dispose of its kernel.
    pub fn release(&self, slot: &Arc<Slot>) -> bool {
        self.release_and_trim(slot).0
    }

    /// Releases a call's hold and, now that one more slot may be idle, applies the LRU cap
    /// again (a burst of first calls can exceed it while everything is attached). Returns
    /// whether to dispose of this slot's kernel, and the evicted slots.
    pub fn release_and_trim(&self, slot: &Arc<Slot>) -> (bool, Vec<Arc<Slot>>) {
        let mut inner = self.lock();
        *slot.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let left = slot.attached.fetch_sub(1, Ordering::AcqRel) - 1;
        let registered = inner
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot));
        let victims = inner.evict_over_cap(self.max_kernels);
        (left == 0 && !registered, victims)
    }

    /// Unregisters a slot (its kernel died or ended); records `loss` when it was involuntary.
    /// Returns true when it was still registered.
    pub fn forget(&self, slot: &Arc<Slot>, loss: Option<LossReason>) -> bool {
        let mut inner = self.lock();
        let registered = inner
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot));
        if registered {
            inner.slots.remove(&slot.key);
            // Only the call that unregisters the slot records its loss: one death, one loss.
            match loss {
                Some(reason) => inner.record_loss(&slot.key, reason),
                None => inner.journal(|| Change::Ended {
                    key_hash: slot.key.hash(),
                }),
            }
        }
        registered
    }

    /// Unregisters every slot whose owner matches (only idle ones when `only_idle`), recording
    /// `loss` for each when given. Returns how many were unregistered, and those with no call
    /// attached (to dispose now); attached ones are disposed by their last call out.
    pub fn remove_where(
        &self,
        matches: impl Fn(&Owner) -> bool,
        loss: Option<LossReason>,
        only_idle: bool,
    ) -> (usize, Vec<Arc<Slot>>) {
        let mut inner = self.lock();
        let keys: Vec<KernelKey> = inner
            .slots
            .iter()
            .filter(|(k, s)| matches(&k.owner) && (!only_idle || s.attached() == 0))
            .map(|(k, _)| k.clone())
            .collect();
        let mut free = Vec::new();
        for key in &keys {
            if let Some(slot) = inner.slots.remove(key) {
                match loss {
                    Some(reason) => inner.record_loss(key, reason),
                    None => inner.journal(|| Change::Ended {
                        key_hash: key.hash(),
                    }),
                }
                if slot.attached() == 0 {
                    free.push(slot);
                }
            }
        }
        (keys.len(), free)
    }

    /// True once [`Registry::drain`] ran: no new kernel may be registered.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Losses so far, by reason.
    pub fn loss_counts(&self) -> LossCounts {
        self.lock().loss_counts
    }

    /// Marks a delegated child as finished: its kernels are no longer pinned.
    pub fn release_child(&self, owner: &Owner) {
        self.lock().released_children.insert(owner.clone());
    }

    /// One reaper pass over idle slots (no acquire needed).
    pub fn reap_idle(&self) -> Vec<Arc<Slot>> {
        self.lock().take_idle(Instant::now(), self.idle_timeout)
    }

    /// Every registered slot.
    pub fn slots(&self) -> Vec<Arc<Slot>> {
        self.lock().slots.values().cloned().collect()
    }

    /// Removes and returns every slot, and closes the registry (shutdown).
    pub fn drain(&self) -> Vec<Arc<Slot>> {
        let mut inner = self.lock();
        inner.closed = true;
        inner.slots.drain().map(|(_, s)| s).collect()
    }

    /// Registered slots.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }

    /// True when no slot is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkMode;
    use std::collections::BTreeSet;

    fn key(session: &str, child: Option<&str>) -> KernelKey {
        KernelKey {
            owner: Owner::new("t", session, child).unwrap(),
            mode: WorkMode::Strict,
            image: "img".into(),
            tools: BTreeSet::new(),
        }
    }

    fn use_once(reg: &Registry, k: &KernelKey) -> Attach {
        let a = reg.attach(k, false);
        assert!(!reg.release(&a.slot));
        a
    }

    #[tokio::test(start_paused = true)]
    async fn idle_slots_are_reaped_by_a_pass_or_any_acquire_but_not_when_attached() {
        let reg = Registry::new(4, Duration::from_secs(1));
        use_once(&reg, &key("idle", None));
        let busy = reg.attach(&key("busy", None), false);
        tokio::time::advance(Duration::from_millis(500)).await;
        assert!(reg.reap_idle().is_empty(), "fresh kernels survive a pass");
        tokio::time::advance(Duration::from_millis(600)).await;
        let reaped: Vec<_> = reg
            .reap_idle()
            .iter()
            .map(|s| s.key.owner.session.clone())
            .collect();
        assert_eq!(reaped, vec!["idle"]);
        assert_eq!(reg.len(), 1, "the attached kernel is spared");
        // Reaped by another owner's acquire too.
        reg.release(&busy.slot);
        tokio::time::advance(Duration::from_secs(2)).await;
        let other = reg.attach(&key("other", None), false);
        assert_eq!(other.victims.len(), 1);
        let back = reg.attach(&key("idle", None), false);
        assert_eq!(
            back.state_lost.map(|l| l.reason),
            Some(LossReason::IdleReaped)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn lru_cap_evicts_least_recently_used_unattached() {
        let reg = Registry::new(2, Duration::from_secs(3600));
        let keys: Vec<_> = (0..4).map(|i| key(&format!("conv-{i}"), None)).collect();
        let mut evicted = Vec::new();
        for k in &keys {
            tokio::time::advance(Duration::from_millis(10)).await;
            evicted.extend(
                use_once(&reg, k)
                    .victims
                    .into_iter()
                    .map(|s| s.key.owner.session.clone()),
            );
        }
        assert_eq!(evicted, vec!["conv-0", "conv-1"]);
        let live: BTreeSet<_> = reg
            .slots()
            .iter()
            .map(|s| s.key.owner.session.clone())
            .collect();
        assert_eq!(
            live,
            BTreeSet::from(["conv-2".to_string(), "conv-3".to_string()])
        );
        // The evicted key reports its loss once.
        let again = reg.attach(&keys[0], false);
        assert_eq!(
            again.state_lost.map(|l| l.reason),
            Some(LossReason::Evicted)
        );
        assert_eq!(again.slot.generation, 2);
        reg.release(&again.slot);
        assert!(reg.attach(&keys[0], false).state_lost.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn attached_and_pinned_slots_survive_the_cap() {
        let reg = Registry::new(1, Duration::from_secs(3600));
        let _busy = reg.attach(&key("busy", None), false);
        tokio::time::advance(Duration::from_millis(10)).await;
        let other = reg.attach(&key("other", None), false);
        assert!(other.victims.is_empty(), "attached slots are never evicted");
        for i in 0..5 {
            let a = use_once(&reg, &key("conv", Some(&format!("child-{i}"))));
            assert!(a.victims.is_empty(), "children are pinned");
        }
        assert_eq!(reg.len(), 7);
        reg.release_child(&Owner::new("t", "conv", Some("child-0")).unwrap());
        // Releasing trims to the cap again; the next acquire would too.
        let (dispose, trimmed) = reg.release_and_trim(&other.slot);
        assert!(!dispose);
        let next = reg.attach(&key("next", None), false);
        let gone: Vec<_> = trimmed
            .iter()
            .chain(next.victims.iter())
            .map(|s| s.key.owner.to_string())
            .collect();
        assert!(
            gone.contains(&"conv::child::child-0".to_string()),
            "{gone:?}"
        );
        assert!(reg.slots().iter().any(|s| s.key.owner.session == "busy"));
    }

    #[tokio::test(start_paused = true)]
    async fn release_of_a_forgotten_slot_asks_for_disposal() {
        let reg = Registry::new(4, Duration::from_secs(3600));
        let a = reg.attach(&key("s", None), false);
        let (count, free) = reg.remove_where(|o| o.session == "s", None, false);
        assert_eq!(count, 1);
        assert!(free.is_empty(), "attached: the last call out disposes");
        assert!(
            reg.release(&a.slot),
            "last call out of an unregistered slot disposes"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_cap_evicts_its_own_idle_kernels_then_refuses() {
        let reg = Registry::new(100, Duration::from_secs(3600));
        let other = use_once(&reg, &key("other-tenant", None));
        let mut k1 = key("a", None);
        k1.owner.tenant = "t2".into();
        let mut k2 = key("b", None);
        k2.owner.tenant = "t2".into();
        let mut k3 = key("c", None);
        k3.owner.tenant = "t2".into();
        let a = reg.attach_capped(&k1, false, Some(2)).unwrap();
        reg.release(&a.slot);
        tokio::time::advance(Duration::from_millis(5)).await;
        let b = reg.attach_capped(&k2, false, Some(2)).unwrap();
        // At the cap with `a` idle: `a` goes, not another tenant's kernel.
        let c = reg.attach_capped(&k3, false, Some(2)).unwrap();
        let gone: Vec<_> = c
            .victims
            .iter()
            .map(|s| s.key.owner.session.clone())
            .collect();
        assert_eq!(gone, vec!["a"]);
        assert!(reg.slots().iter().any(|s| Arc::ptr_eq(s, &other.slot)));
        // Both remaining kernels busy: refused.
        let refused = reg.attach_capped(&k1, false, Some(2)).unwrap_err();
        assert_eq!(refused.cap, 2);
        reg.release(&b.slot);
        reg.release(&c.slot);
    }

    #[tokio::test(start_paused = true)]
    async fn seeded_keys_take_their_generation_and_owed_loss_once_and_only_for_their_owner() {
        use crate::catalog::{Catalog, CatalogWriter, MemoryCatalog};
        let catalog = Arc::new(MemoryCatalog::default());
        let writer = Arc::new(CatalogWriter::start(catalog.clone()).expect("writer"));
        let lost = StateLost {
            reason: LossReason::ServerRestarted,
            at: "2026-01-01T00:00:00Z".into(),
        };
        let k = key("s", None);
        let mut forged = key("forged", None);
        let entries = vec![
            Entry {
                key_hash: k.hash(),
                tenant: "t".into(),
                owner: "s".into(),
                generation: 4,
                state: EntryState::Lost { loss: lost.clone() },
            },
            // A row whose owner does not match its hash is never handed to the key.
            Entry {
                key_hash: forged.hash(),
                tenant: "other".into(),
                owner: "forged".into(),
                generation: 9,
                state: EntryState::Lost { loss: lost.clone() },
            },
        ];
        let reg = Registry::new(4, Duration::from_secs(3600));
        assert_eq!(reg.use_catalog(writer.clone(), entries), 2);
        let a = use_once(&reg, &k);
        assert_eq!(a.state_lost, Some(lost));
        assert_eq!(a.slot.generation, 5);
        forged.owner.tenant = "t".into();
        let f = reg.attach(&forged, false);
        assert_eq!(f.state_lost, None);
        assert_eq!(f.slot.generation, 1);
        // Losses are recorded; a slot drained at shutdown records nothing.
        assert!(reg.forget(&a.slot, Some(LossReason::Oom)));
        reg.drain();
        assert!(!reg.forget(&f.slot, Some(LossReason::Oom)));
        writer.close();
        let rows = catalog.load().expect("load");
        assert_eq!(rows.len(), 1, "only the loss before closing: {rows:?}");
        assert!(rows.iter().any(|r| r.key_hash == k.hash()
            && matches!(&r.state, EntryState::Lost { loss } if loss.reason == LossReason::Oom)));
    }

    #[tokio::test(start_paused = true)]
    async fn reset_discards_the_slot_and_bumps_the_generation() {
        let reg = Registry::new(4, Duration::from_secs(3600));
        let k = key("s", None);
        let first = use_once(&reg, &k);
        let second = reg.attach(&k, true);
        assert!(second.reset.is_some_and(|s| Arc::ptr_eq(&s, &first.slot)));
        assert_eq!(second.slot.generation, 2);
        assert!(
            second.state_lost.is_none(),
            "a reset is not an involuntary loss"
        );
    }
}
