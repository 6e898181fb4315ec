//! The registry: which kernel serves which key, who is attached, what is idle, what was lost.
//!
//! Pure bookkeeping under one short-held lock; the orchestrator does the Docker work (spawning,
//! disposing) outside it. A slot is registered before its kernel exists, so concurrent first
//! calls for one key find the same slot and wait on the same spawn (single flight).
//!
//! ## Capacity and fairness
//!
//! A new kernel is admitted under the lock, atomically with its registration, so a burst can
//! never overflow a cap. Two caps apply:
//!
//! - the tenant's own `max_kernels` (its delegated children included): at it, the tenant's
//!   least recently used idle, unpinned kernel is evicted, else the request is refused;
//! - the host's `max_kernels` (live delegated children are pinned: never evicted and not
//!   counted here; they have a pool of their own, below). At it, a victim is chosen among idle, unpinned kernels: while the requester
//!   holds less than its fair share, the least recently used kernel of a tenant holding more
//!   than its own share; otherwise (or when none is idle) the requester's own least recently
//!   used one. No victim: the request is refused. So a tenant holding no more than its fair
//!   share is never evicted by another tenant's demand.
//!
//! A tenant's fair share is its `reserved` count when it has one; otherwise the kernels left
//! by the reservations of the tenants holding kernels (the requester included), divided
//! evenly among those without one, rounded down. Rounding down keeps the shares' sum within
//! the cap, so every tenant can always reach its share; and since a tenant takes another's
//! kernel only to reach its own share, the remainder of an uneven division never bounces
//! between two tenants.
//!
//! Live (pinned) delegated children form a second pool of the same size: at most the host's
//! `max_kernels` of them are live at once, host-wide, first come first served; past it a new
//! child is refused (pinned kernels are never evicted). So at most twice the host's cap of
//! kernels are registered at once.
//!
//! ## No kernel outside the books
//!
//! Every slot removed from the registry is handed back for disposal at once, whether calls are
//! attached to it or not (clear, reset, release of a child): its running cell ends. So every
//! live kernel is registered, counted by the caps, and listed. A slot still spawning when it is
//! removed has no kernel yet: the call spawning it finds the slot unregistered once the kernel
//! is up and disposes of it (see the orchestrator's `acquire`).
//!
//! At most [`MAX_ATTACHED_PER_SLOT`] calls may be attached to one slot (the running cell and
//! those queued behind it); one more is refused at once, so callers that go away cannot pile
//! requests up on one kernel.

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

/// Most calls attached to one kernel at once: the one running a cell and those queued behind
/// it (each holds its whole request). One more is refused ([`Refusal::Busy`]).
pub const MAX_ATTACHED_PER_SLOT: usize = 8;

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

/// A tenant's own limits, carried by each of its requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Most kernels the tenant may hold at once, its delegated children included (`None`:
    /// only the host's cap applies).
    pub max_kernels: Option<usize>,
    /// Kernels the tenant keeps against other tenants' demand, in place of its fair share.
    pub reserved: Option<usize>,
}

/// Which cap refused a new kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cap {
    /// The tenant's own `max_kernels`.
    Tenant {
        /// The tenant's cap.
        max: usize,
    },
    /// The host-wide pool of live delegated children (as large as the host's cap).
    Children {
        /// Most live delegated children host-wide.
        max: usize,
    },
    /// The host's cap (`max_session_kernels`, `kernelbox serve --max-kernels`).
    Host {
        /// The host's cap.
        max: usize,
        /// The requesting tenant's fair share at the time.
        share: usize,
    },
}

/// A new kernel would pass a cap and no kernel may be evicted to make room.
#[derive(Debug)]
pub struct AtCapacity {
    /// The requesting tenant.
    pub tenant: String,
    /// The cap that refused it.
    pub cap: Cap,
    /// Kernels the tenant held (counted as the cap counts them).
    pub held: usize,
    /// Idle slots reaped on the way; dispose of their kernels.
    pub victims: Vec<Arc<Slot>>,
}

/// Why [`Registry::attach`] refused a call.
#[derive(Debug)]
pub enum Refusal {
    /// A new kernel would pass a cap.
    AtCapacity(AtCapacity),
    /// The key's kernel already has [`MAX_ATTACHED_PER_SLOT`] calls attached.
    Busy {
        /// The owner, as a string.
        owner: String,
        /// The bound.
        max: usize,
    },
}

/// Why an admission evicts a slot.
#[derive(Debug, Clone, Copy)]
enum Evict {
    TenantCap,
    HostOwn,
    HostOther,
}

/// Kernels evicted to admit another, by the cap that made room.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    /// At the tenant's own `max_kernels`.
    pub tenant_cap: u64,
    /// At the host's cap, from the requester's own tenant.
    pub host_cap_own: u64,
    /// At the host's cap, from a tenant holding more than its fair share.
    pub host_cap_other: u64,
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
    evictions: EvictionCounts,
    /// The limits each tenant holding kernels last asked with (its share depends on them).
    limits: HashMap<String, TenantLimits>,
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
    /// Removes a key's slot. A released child's mark goes with its owner's last slot, so the
    /// set of marks never outgrows the slots.
    fn unregister(&mut self, key: &KernelKey) -> Option<Arc<Slot>> {
        let slot = self.slots.remove(key)?;
        if key.owner.is_child()
            && self.released_children.contains(&key.owner)
            && !self.slots.keys().any(|k| k.owner == key.owner)
        {
            self.released_children.remove(&key.owner);
        }
        Some(slot)
    }

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
                let slot = self.unregister(&key)?;
                self.record_loss(&key, LossReason::IdleReaped);
                Some(slot)
            })
            .collect()
    }
}

impl Inner {
    /// Decides which idle slots go so that one more kernel for `key` fits both caps. Nothing
    /// is changed when the answer is no: a refused request costs nobody a kernel.
    fn plan_admission(
        &self,
        key: &KernelKey,
        limits: TenantLimits,
        host_max: usize,
    ) -> Result<Vec<(KernelKey, Evict)>, (Cap, usize)> {
        let tenant = key.owner.tenant.as_str();
        let released = &self.released_children;
        if key.owner.is_child() {
            // Pinned kernels are never evicted: a full pool of children refuses.
            let pinned = self.slots.values().filter(|s| s.pinned(released)).count();
            if pinned >= host_max {
                let mine = self
                    .slots
                    .values()
                    .filter(|s| s.pinned(released) && s.key.owner.tenant == tenant)
                    .count();
                return Err((Cap::Children { max: host_max }, mine));
            }
        }
        let mut held_all = 0usize;
        // Unpinned kernels per tenant: what the host's cap and the shares count.
        let mut held: HashMap<&str, usize> = HashMap::new();
        let mut total = 0usize;
        for s in self.slots.values() {
            if s.key.owner.tenant == tenant {
                held_all += 1;
            }
            if !s.pinned(released) {
                *held.entry(s.key.owner.tenant.as_str()).or_default() += 1;
                total += 1;
            }
        }
        let tenant_full = limits.max_kernels.is_some_and(|max| held_all >= max);
        let host_full = !key.owner.is_child() && total >= host_max;
        if !tenant_full && !host_full {
            return Ok(Vec::new());
        }
        // Eviction candidates, least recently used first.
        let mut idle: Vec<&Arc<Slot>> = self
            .slots
            .values()
            .filter(|s| s.attached() == 0 && !s.pinned(released))
            .collect();
        idle.sort_by_cached_key(|s| s.last_used());
        let mut planned: Vec<(KernelKey, Evict)> = Vec::new();
        let is_planned =
            |planned: &[(KernelKey, Evict)], s: &Slot| planned.iter().any(|(k, _)| *k == s.key);
        let take = |victim: &Arc<Slot>,
                    why: Evict,
                    planned: &mut Vec<(KernelKey, Evict)>,
                    held: &mut HashMap<&str, usize>| {
            planned.push((victim.key.clone(), why));
            if let Some(n) = held.get_mut(victim.key.owner.tenant.as_str()) {
                *n -= 1;
            }
        };
        if let Some(max) = limits.max_kernels {
            while held_all >= max {
                let victim = idle
                    .iter()
                    .find(|s| s.key.owner.tenant == tenant && !is_planned(&planned, s));
                let Some(victim) = victim else {
                    return Err((Cap::Tenant { max }, held_all));
                };
                take(victim, Evict::TenantCap, &mut planned, &mut held);
                held_all -= 1;
                total -= 1;
            }
        }
        // A live delegated child is pinned: outside the host's cap.
        if key.owner.is_child() {
            return Ok(planned);
        }
        while total >= host_max {
            let mine = held.get(tenant).copied().unwrap_or(0);
            let shares = self.shares(&held, tenant, limits, host_max);
            let share = |t: &str| shares.get(t).copied().unwrap_or(0);
            let from_others = if mine < share(tenant) {
                idle.iter().find(|s| {
                    let t = s.key.owner.tenant.as_str();
                    t != tenant
                        && held.get(t).copied().unwrap_or(0) > share(t)
                        && !is_planned(&planned, s)
                })
            } else {
                None
            };
            let victim = match from_others {
                Some(v) => Some((v, Evict::HostOther)),
                None => idle
                    .iter()
                    .find(|s| s.key.owner.tenant == tenant && !is_planned(&planned, s))
                    .map(|v| (v, Evict::HostOwn)),
            };
            let Some((victim, why)) = victim else {
                return Err((
                    Cap::Host {
                        max: host_max,
                        share: share(tenant),
                    },
                    mine,
                ));
            };
            take(victim, why, &mut planned, &mut held);
            total -= 1;
        }
        Ok(planned)
    }

    /// Fair shares of the tenants holding unpinned kernels and of the requester (see the
    /// module documentation).
    fn shares<'a>(
        &self,
        held: &HashMap<&'a str, usize>,
        requester: &'a str,
        requester_limits: TenantLimits,
        host_max: usize,
    ) -> HashMap<&'a str, usize> {
        let limits_of = |t: &str| {
            if t == requester {
                requester_limits
            } else {
                self.limits.get(t).copied().unwrap_or_default()
            }
        };
        let mut active: Vec<&'a str> = held
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, _)| *t)
            .collect();
        if !active.contains(&requester) {
            active.push(requester);
        }
        let reserved: usize = active.iter().filter_map(|t| limits_of(t).reserved).sum();
        let unreserved = active
            .iter()
            .filter(|t| limits_of(t).reserved.is_none())
            .count();
        let even = host_max
            .saturating_sub(reserved)
            .checked_div(unreserved)
            .unwrap_or(0);
        active
            .into_iter()
            .map(|t| (t, limits_of(t).reserved.unwrap_or(even)))
            .collect()
    }

    /// Admits one more kernel for `key`: evicts the planned victims, or refuses.
    fn admit(
        &mut self,
        key: &KernelKey,
        limits: TenantLimits,
        host_max: usize,
    ) -> Result<Vec<Arc<Slot>>, (Cap, usize)> {
        let tenant = key.owner.tenant.clone();
        // Remembered only for tenants holding kernels (the requester included).
        {
            let holding: HashSet<&str> =
                self.slots.keys().map(|k| k.owner.tenant.as_str()).collect();
            self.limits.retain(|t, _| holding.contains(t.as_str()));
        }
        self.limits.insert(tenant.clone(), limits);
        let plan = self.plan_admission(key, limits, host_max)?;
        let mut victims = Vec::with_capacity(plan.len());
        for (victim, why) in plan {
            if let Some(slot) = self.unregister(&victim) {
                self.record_loss(&victim, LossReason::Evicted);
                *match why {
                    Evict::TenantCap => &mut self.evictions.tenant_cap,
                    Evict::HostOwn => &mut self.evictions.host_cap_own,
                    Evict::HostOther => &mut self.evictions.host_cap_other,
                } += 1;
                victims.push(slot);
            }
        }
        Ok(victims)
    }
}

impl Registry {
    /// An empty registry with the host's kernel cap and the idle timeout.
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

    /// Attaches a call to the key's slot, reaping idle slots first. A key with no slot gets a
    /// new one only if it fits the tenant's and the host's caps (see the module
    /// documentation), after evicting what must go; otherwise nothing is registered and the
    /// refusal says which cap. `reset` discards the key's current slot for a new one (in its
    /// place: no admission needed); the caller must dispose of the discarded slot's kernel at
    /// once. A key whose slot already has [`MAX_ATTACHED_PER_SLOT`] calls is refused.
    pub fn attach(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
    ) -> Result<Attach, Refusal> {
        let now = Instant::now();
        let mut inner = self.lock();
        if !reset
            && inner
                .slots
                .get(key)
                .is_some_and(|s| s.attached() >= MAX_ATTACHED_PER_SLOT)
        {
            return Err(Refusal::Busy {
                owner: key.owner.to_string(),
                max: MAX_ATTACHED_PER_SLOT,
            });
        }
        let mut victims = inner.take_idle(now, self.idle_timeout);
        if !inner.slots.contains_key(key) {
            match inner.admit(key, limits, self.max_kernels) {
                Ok(evicted) => victims.extend(evicted),
                Err((cap, held)) => {
                    // Nothing was attached, so the reaped slots go back with the refusal for
                    // disposal by the caller.
                    return Err(Refusal::AtCapacity(AtCapacity {
                        tenant: key.owner.tenant.clone(),
                        cap,
                        held,
                        victims,
                    }));
                }
            }
        }
        Ok(self.attach_locked(&mut inner, key, reset, victims, now))
    }

    /// The registration part of [`Registry::attach`], under the lock.
    fn attach_locked(
        &self,
        inner: &mut Inner,
        key: &KernelKey,
        reset: bool,
        victims: Vec<Arc<Slot>>,
        now: Instant,
    ) -> Attach {
        let reset_slot = if reset { inner.unregister(key) } else { None };
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
        let inner = self.lock();
        *slot.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        let left = slot.attached.fetch_sub(1, Ordering::AcqRel) - 1;
        let registered = inner
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot));
        left == 0 && !registered
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
            inner.unregister(&slot.key);
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
    /// `loss` for each when given. Returns how many were unregistered, and the slots: the
    /// caller disposes of their kernels now, attached or not (their running cells end), so no
    /// kernel outlives its registration.
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
        let mut removed = Vec::new();
        for key in &keys {
            if let Some(slot) = inner.unregister(key) {
                match loss {
                    Some(reason) => inner.record_loss(key, reason),
                    None => inner.journal(|| Change::Ended {
                        key_hash: key.hash(),
                    }),
                }
                removed.push(slot);
            }
        }
        (keys.len(), removed)
    }

    /// True once [`Registry::drain`] ran: no new kernel may be registered.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Losses so far, by reason.
    pub fn loss_counts(&self) -> LossCounts {
        self.lock().loss_counts
    }

    /// Evictions made to admit new kernels so far, by cap.
    pub fn eviction_counts(&self) -> EvictionCounts {
        self.lock().evictions
    }

    /// Marks a delegated child as finished: its kernels are no longer pinned. Nothing is
    /// recorded for a child with no kernel (the mark lives only as long as its slots).
    pub fn release_child(&self, owner: &Owner) {
        let mut inner = self.lock();
        if inner.slots.keys().any(|k| k.owner == *owner) {
            inner.released_children.insert(owner.clone());
        }
    }

    /// Released children still marked (at most one per registered child).
    pub fn released_children(&self) -> usize {
        self.lock().released_children.len()
    }

    /// True while `slot` is the key's registered slot.
    pub fn is_registered(&self, slot: &Arc<Slot>) -> bool {
        self.lock()
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
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
        inner.released_children.clear();
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

    fn tkey(tenant: &str, session: &str, child: Option<&str>) -> KernelKey {
        KernelKey {
            owner: Owner::new(tenant, session, child).unwrap(),
            mode: WorkMode::Strict,
            image: "img".into(),
            tools: BTreeSet::new(),
        }
    }

    fn key(session: &str, child: Option<&str>) -> KernelKey {
        tkey("t", session, child)
    }

    /// Attaches with no tenant limits; the attach must be admitted.
    fn att(reg: &Registry, k: &KernelKey) -> Attach {
        reg.attach(k, false, TenantLimits::default())
            .expect("admitted")
    }

    fn at_cap(r: Result<Attach, Refusal>) -> AtCapacity {
        match r {
            Err(Refusal::AtCapacity(full)) => full,
            other => panic!("expected a refusal at a cap, got {other:?}"),
        }
    }

    fn use_once(reg: &Registry, k: &KernelKey) -> Attach {
        let a = att(reg, k);
        assert!(!reg.release(&a.slot));
        a
    }

    /// Attaches and releases at once (an idle kernel), with limits; returns the evicted
    /// owners.
    async fn idle_kernel(reg: &Registry, k: &KernelKey, limits: TenantLimits) -> Vec<String> {
        tokio::time::advance(Duration::from_millis(10)).await;
        let a = reg.attach(k, false, limits).expect("admitted");
        assert!(!reg.release(&a.slot));
        a.victims.iter().map(|s| s.key.owner.to_string()).collect()
    }

    fn held(reg: &Registry, tenant: &str) -> usize {
        reg.slots()
            .iter()
            .filter(|s| s.key.owner.tenant == tenant)
            .count()
    }

    #[tokio::test(start_paused = true)]
    async fn idle_slots_are_reaped_by_a_pass_or_any_acquire_but_not_when_attached() {
        let reg = Registry::new(4, Duration::from_secs(1));
        use_once(&reg, &key("idle", None));
        let busy = att(&reg, &key("busy", None));
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
        let other = att(&reg, &key("other", None));
        assert_eq!(other.victims.len(), 1);
        let back = att(&reg, &key("idle", None));
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
        let again = att(&reg, &keys[0]);
        assert_eq!(
            again.state_lost.map(|l| l.reason),
            Some(LossReason::Evicted)
        );
        assert_eq!(again.slot.generation, 2);
        reg.release(&again.slot);
        assert!(att(&reg, &keys[0]).state_lost.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn the_host_cap_is_hard_for_attached_slots_and_children_are_outside_it() {
        let reg = Registry::new(1, Duration::from_secs(3600));
        let busy = att(&reg, &key("busy", None));
        tokio::time::advance(Duration::from_millis(10)).await;
        // A burst cannot pass the cap: the attached kernel cannot go, so the next is refused
        // and nothing is registered for it.
        let refused = at_cap(reg.attach(&key("other", None), false, TenantLimits::default()));
        assert_eq!(refused.cap, Cap::Host { max: 1, share: 1 });
        assert_eq!(refused.held, 1);
        assert!(refused.victims.is_empty());
        assert_eq!(reg.len(), 1);
        // Live delegated children are pinned: admitted past the cap, never evicted, within a
        // pool of their own as large as the cap.
        let a = use_once(&reg, &key("conv", Some("child-0")));
        assert!(a.victims.is_empty(), "children are pinned");
        let refused = at_cap(reg.attach(
            &key("conv", Some("child-1")),
            false,
            TenantLimits::default(),
        ));
        assert_eq!(refused.cap, Cap::Children { max: 1 });
        assert_eq!(reg.len(), 2);
        // A released child counts again and is the first to go.
        reg.release_child(&Owner::new("t", "conv", Some("child-0")).unwrap());
        assert!(!reg.release(&busy.slot));
        let next = att(&reg, &key("next", None));
        let gone: BTreeSet<_> = next
            .victims
            .iter()
            .map(|s| s.key.owner.to_string())
            .collect();
        assert_eq!(
            gone,
            BTreeSet::from(["conv::child::child-0".to_string(), "busy".to_string()])
        );
        assert_eq!(reg.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cleared_slot_is_handed_back_for_disposal_even_when_attached() {
        let reg = Registry::new(4, Duration::from_secs(3600));
        let a = att(&reg, &key("s", None));
        let (count, removed) = reg.remove_where(|o| o.session == "s", None, false);
        assert_eq!(count, 1);
        assert!(
            removed.len() == 1 && Arc::ptr_eq(&removed[0], &a.slot),
            "attached or not, a removed slot is disposed of at once"
        );
        assert!(!reg.is_registered(&a.slot));
        assert!(reg.release(&a.slot), "the last call out disposes too");
    }

    #[tokio::test(start_paused = true)]
    async fn releasing_children_that_have_no_kernel_records_nothing() {
        let reg = Registry::new(4, Duration::from_secs(3600));
        for i in 0..80_000 {
            reg.release_child(&Owner::new("t", "s", Some(&format!("never-{i}"))).unwrap());
        }
        assert_eq!(reg.released_children(), 0);
        // A live child's mark lasts as long as its slot.
        let child = key("s", Some("c"));
        use_once(&reg, &child);
        reg.release_child(&child.owner);
        assert_eq!(reg.released_children(), 1);
        reg.remove_where(|o| o.child.as_deref() == Some("c"), None, false);
        assert_eq!(reg.released_children(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn live_children_have_a_host_wide_pool_as_large_as_the_cap() {
        let reg = Registry::new(2, Duration::from_secs(3600));
        for i in 0..2 {
            use_once(&reg, &tkey("a", "s", Some(&format!("c{i}"))));
        }
        // Pinned children are never evicted: a third is refused, from any tenant.
        let refused =
            at_cap(reg.attach(&tkey("b", "s", Some("c")), false, TenantLimits::default()));
        assert_eq!(refused.cap, Cap::Children { max: 2 });
        assert_eq!(refused.held, 0);
        assert_eq!(reg.len(), 2);
        // Sessions still have the host's cap of their own.
        use_once(&reg, &tkey("b", "s", None));
        use_once(&reg, &tkey("b", "t", None));
        assert_eq!(reg.len(), 4);
        // A released child leaves the pool.
        reg.release_child(&tkey("a", "s", Some("c0")).owner);
        use_once(&reg, &tkey("b", "s", Some("c")));
    }

    #[tokio::test(start_paused = true)]
    async fn at_most_max_attached_calls_per_slot() {
        let reg = Registry::new(4, Duration::from_secs(3600));
        let k = key("s", None);
        let held: Vec<Attach> = (0..MAX_ATTACHED_PER_SLOT).map(|_| att(&reg, &k)).collect();
        match reg.attach(&k, false, TenantLimits::default()) {
            Err(Refusal::Busy { owner, max }) => {
                assert_eq!((owner.as_str(), max), ("s", MAX_ATTACHED_PER_SLOT));
            }
            other => panic!("expected busy, got {other:?}"),
        }
        // A reset replaces the slot (the old one is disposed of by the caller).
        let fresh = reg.attach(&k, true, TenantLimits::default()).unwrap();
        assert!(fresh.reset.is_some());
        for a in &held {
            reg.release(&a.slot);
        }
        assert!(!reg.release(&fresh.slot));
        assert!(reg.attach(&k, false, TenantLimits::default()).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_cap_evicts_its_own_idle_kernels_then_refuses() {
        let reg = Registry::new(100, Duration::from_secs(3600));
        let other = use_once(&reg, &key("other-tenant", None));
        let capped = TenantLimits {
            max_kernels: Some(2),
            reserved: None,
        };
        let (k1, k2, k3) = (
            tkey("t2", "a", None),
            tkey("t2", "b", None),
            tkey("t2", "c", None),
        );
        let a = reg.attach(&k1, false, capped).unwrap();
        reg.release(&a.slot);
        tokio::time::advance(Duration::from_millis(5)).await;
        let b = reg.attach(&k2, false, capped).unwrap();
        // At the cap with `a` idle: `a` goes, not another tenant's kernel.
        let c = reg.attach(&k3, false, capped).unwrap();
        let gone: Vec<_> = c
            .victims
            .iter()
            .map(|s| s.key.owner.session.clone())
            .collect();
        assert_eq!(gone, vec!["a"]);
        assert!(reg.slots().iter().any(|s| Arc::ptr_eq(s, &other.slot)));
        // Both remaining kernels busy: refused, naming the tenant's cap.
        let refused = at_cap(reg.attach(&k1, false, capped));
        assert_eq!(refused.cap, Cap::Tenant { max: 2 });
        assert_eq!(refused.held, 2);
        assert_eq!(reg.eviction_counts().tenant_cap, 1);
        reg.release(&b.slot);
        reg.release(&c.slot);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_within_its_fair_share_is_never_evicted_by_another() {
        let none = TenantLimits::default();
        let reg = Registry::new(4, Duration::from_secs(3600));
        // A fills the host with idle kernels.
        for i in 0..4 {
            assert!(idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none)
                .await
                .is_empty());
        }
        // B's new kernels take A's least recently used while A holds more than its share
        // (4 / 2 tenants = 2) and B less than its own.
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b0", None), none).await,
            vec!["a0"]
        );
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b1", None), none).await,
            vec!["a1"]
        );
        // A is at its share: B's next new kernel costs B its own least recently used one.
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b2", None), none).await,
            vec!["b0"]
        );
        assert_eq!((held(&reg, "a"), held(&reg, "b")), (2, 2));
        // B's kernels all busy: refused, naming the host's cap and B's share; nobody evicted.
        let b1 = reg.attach(&tkey("b", "b1", None), false, none).unwrap();
        let b2 = reg.attach(&tkey("b", "b2", None), false, none).unwrap();
        let refused = at_cap(reg.attach(&tkey("b", "b3", None), false, none));
        assert_eq!(refused.cap, Cap::Host { max: 4, share: 2 });
        assert_eq!(refused.held, 2);
        assert_eq!((held(&reg, "a"), held(&reg, "b")), (2, 2));
        // A, within its share, may use its own room again at once.
        assert!(idle_kernel(&reg, &tkey("a", "a2", None), none)
            .await
            .is_empty());
        reg.release(&b1.slot);
        reg.release(&b2.slot);
        let counts = reg.eviction_counts();
        assert_eq!((counts.host_cap_other, counts.host_cap_own), (2, 1));
    }

    #[tokio::test(start_paused = true)]
    async fn the_remainder_of_an_uneven_share_does_not_bounce_between_tenants() {
        let none = TenantLimits::default();
        let reg = Registry::new(5, Duration::from_secs(3600));
        for i in 0..3 {
            idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none).await;
        }
        for i in 0..2 {
            idle_kernel(&reg, &tkey("b", &format!("b{i}"), None), none).await;
        }
        // Shares are 5 / 2 = 2 (rounded down). B at its share takes its own; so does A,
        // above its share: neither takes the other's.
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b2", None), none).await,
            vec!["b0"]
        );
        assert_eq!(
            idle_kernel(&reg, &tkey("a", "a3", None), none).await,
            vec!["a0"]
        );
        assert_eq!((held(&reg, "a"), held(&reg, "b")), (3, 2));
        // A newcomer's share is 5 / 3 = 1: it takes from the least recently used of the
        // tenants above their share (A's a1, older than B's b1).
        assert_eq!(
            idle_kernel(&reg, &tkey("c", "c0", None), none).await,
            vec!["a1"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reservation_overrides_the_fair_share() {
        let none = TenantLimits::default();
        let reserved = TenantLimits {
            max_kernels: None,
            reserved: Some(3),
        };
        let reg = Registry::new(4, Duration::from_secs(3600));
        for i in 0..4 {
            idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), reserved).await;
        }
        // A keeps 3; B's share is what is left (1).
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b0", None), none).await,
            vec!["a0"]
        );
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b1", None), none).await,
            vec!["b0"]
        );
        assert_eq!((held(&reg, "a"), held(&reg, "b")), (3, 1));
        // Without the reservation A's share would be 2 and B would take one more.
        let reg = Registry::new(4, Duration::from_secs(3600));
        for i in 0..4 {
            idle_kernel(&reg, &tkey("a", &format!("a{i}"), None), none).await;
        }
        idle_kernel(&reg, &tkey("b", "b0", None), none).await;
        assert_eq!(
            idle_kernel(&reg, &tkey("b", "b1", None), none).await,
            vec!["a1"]
        );
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
        let f = att(&reg, &forged);
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
        let second = reg.attach(&k, true, TenantLimits::default()).unwrap();
        assert!(second.reset.is_some_and(|s| Arc::ptr_eq(&s, &first.slot)));
        assert_eq!(second.slot.generation, 2);
        assert!(
            second.state_lost.is_none(),
            "a reset is not an involuntary loss"
        );
    }
}
