//! The registry: which kernel serves which key, who is attached, what is idle, what was lost.
//!
//! Pure bookkeeping under one short-held lock; the orchestrator does the Docker work (spawning,
//! disposing) outside it. A slot is registered before its kernel exists, so concurrent first
//! calls for one key find the same slot and wait on the same spawn (single flight).
//!
//! Caps and fair shares are in `admission.rs` (see its doc).
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
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Registry`], [`Slot`], attach/release/forget, idle reaping, losses and generations |
//! | `live.rs` | attach to an owner's live kernel without starting one (file transfers) |
//! | `admission.rs` | the two caps and fair shares: which idle kernel goes to admit a new one |
//! | `hibernated.rs` | hibernated kernels' checkpoints by key: pending, ready, bounded per tenant and host, taken by the key's next kernel |
//! | `losses.rs` | losses and generations: catalog seeds, losses recorded and owed |
//! | `migrated.rs` | migration on drain: the kernels a drain may move, a moved kernel's books closed here, one arriving seeded as the same generation |
//! | `pool.rs` | the warm pool's books: ready ownerless kernels, taken atomically with admission |
//! | `settings.rs` | sessions' settings (`src/settings.rs`): kept, bounded per tenant, recorded on new slots |
//! | `tests.rs` | unit tests |

mod admission;
mod hibernated;
mod live;
mod losses;
mod migrated;
mod pool;
mod settings;

pub use admission::{AtCapacity, Cap, ClusterShares, EvictionCounts, Refusal, TenantLimits};
pub use hibernated::HibernationBounds;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;
use tokio::time::{Duration, Instant};

use crate::catalog::{CatalogWriter, Change};
use crate::cell::{LossReason, StateLost};
use crate::config::KernelSpec;
use crate::kernel::Kernel;
use crate::owner::{KernelKey, Owner};
use crate::usage::TenantMeter;

/// Losses and generations are remembered for at most this many keys (as many as the catalog
/// keeps rows).
const MAX_REMEMBERED_KEYS: usize = crate::catalog::MAX_ENTRIES;

/// ... and for at most this many keys of one tenant.
const MAX_REMEMBERED_PER_TENANT: usize = crate::catalog::MAX_ENTRIES_PER_TENANT;

/// Most calls attached to one kernel at once: the one running a cell and those queued behind
/// it (each holds its whole request). One more is refused
/// ([`ExecuteError::SessionBusy`](crate::orchestrator::ExecuteError::SessionBusy)).
pub const MAX_ATTACHED_PER_SLOT: usize = 8;

/// One key's current kernel, spawned at most once.
pub struct Slot {
    /// The key whose kernel this is (owner, mode, image, tools).
    pub key: KernelKey,
    /// Which kernel of the key this is ([`Slot::generation`]).
    generation: AtomicU64,
    /// The kernel, once spawned.
    pub kernel: OnceCell<Arc<Kernel>>,
    /// Calls holding the slot (spawning or running a cell).
    attached: AtomicUsize,
    /// When a call last released the slot.
    last_used: Mutex<Instant>,
    /// The session's settings when the slot was made: what its kernel starts with.
    pub settings: Option<crate::settings::Shared>,
    /// Idle, its kernel hibernates rather than being reaped (`hibernated.rs`).
    pub hibernate: bool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("owner", &self.key.owner.to_string())
            .field("generation", &self.generation())
            .field("attached", &self.attached())
            .finish()
    }
}

impl Slot {
    /// Its kernel's short container id, once spawned.
    pub(crate) fn container(&self) -> Option<&str> {
        self.kernel.get().map(|k| k.short_id())
    }

    /// Which kernel of the key this is: counted from 1, one more for each new kernel (a
    /// hibernated kernel restored is the same one).
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Calls currently attached.
    pub fn attached(&self) -> usize {
        self.attached.load(Ordering::Acquire)
    }

    /// When the slot was last released (or created).
    pub fn last_used(&self) -> Instant {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// No call is attached and the kernel is not computing with no cell running (the runaway
    /// watch's finding, `docs/reliability.md` "Runaway kernels"): only then is it reaped or
    /// evicted as idle.
    pub fn is_idle(&self) -> bool {
        self.attached() == 0 && !self.kernel.get().is_some_and(|k| k.is_computing())
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
    /// The slot's kernel was taken from the warm pool (already set in `slot.kernel`).
    pub pooled: bool,
    /// Pooled kernels discarded to make room; dispose of them.
    pub discarded: Vec<Arc<Kernel>>,
}

/// The bookkeeping behind the orchestrator.
#[derive(Debug)]
pub struct Registry {
    max_kernels: usize,
    idle_timeout: Duration,
    inner: Mutex<Inner>,
    /// Told each time a call lets go of a slot: what waits for a kernel to be idle
    /// ([`Registry::released`]) wakes then instead of polling.
    released: tokio::sync::Notify,
}

/// Involuntary losses counted as they happen, by reason: `counts[i]` is the number of kernels
/// lost for `LossReason::ALL[i]` since the orchestrator started (losses by restart counted
/// once, at start). [`Stats::losses`](crate::orchestrator::Stats::losses) is one; named as
/// `kernelbox::orchestrator::LossCounts`.
pub type LossCounts = [u64; LossReason::ALL.len()];

#[derive(Debug, Default)]
struct Inner {
    slots: HashMap<KernelKey, Arc<Slot>>,
    generations: HashMap<KernelKey, u64>,
    losses: HashMap<KernelKey, StateLost>,
    /// Keys whose generation and owed loss are remembered, by tenant, oldest first.
    remembered: HashMap<String, VecDeque<KernelKey>>,
    /// Keys in `remembered`, across tenants.
    remembered_total: usize,
    released_children: HashSet<Owner>,
    loss_counts: LossCounts,
    /// Per-tenant counters for the metrics (losses counted here, the rest by the orchestrator).
    tenants: Arc<TenantMeter>,
    evictions: EvictionCounts,
    /// The limits each tenant holding kernels last asked with (its share depends on them).
    limits: HashMap<String, TenantLimits>,
    closed: bool,
    /// Where kernel starts and losses are recorded durably, if anywhere.
    journal: Option<Arc<CatalogWriter>>,
    /// What the catalog knew at start, by key hash: taken by a key's first attach.
    seeded: HashMap<String, losses::Seed>,
    /// Hibernated kernels by key (`hibernated.rs`).
    hibernated: HashMap<KernelKey, hibernated::Hibernated>,
    /// The warm pool's ready kernels (`pool.rs`).
    pool: Vec<pool::Pooled>,
    /// Pooled kernels being spawned (reserved, not yet offered).
    pool_pending: std::collections::BTreeMap<crate::wire::Language, usize>,
    /// On a cluster node: what the fair shares are of (`admission.rs`).
    cluster: Option<ClusterShares>,
    /// Sessions' settings by tenant, then session (`settings.rs`).
    settings: HashMap<String, settings::TenantSettings>,
    /// Counts settings changes (their order, for forgetting the oldest).
    settings_seq: u64,
    /// What a session of each tenant runs with where it sets nothing, for tenants whose
    /// `session_limits` are below the server's defaults (`settings.rs`).
    ceilings: HashMap<String, Arc<crate::settings::Settings>>,
    /// Sessions (tenant, session) whose settings and network policy a start here loaded
    /// before its kernel is registered (a cluster node's claim), with how many such starts:
    /// never forgotten to make room meanwhile (`settings.rs`).
    held_configs: HashMap<(String, String), usize>,
    /// The sessions' recent lifecycle events (`crate::lifecycle`): losses and ends recorded
    /// here, starts and hibernations through [`Registry::events`].
    events: Arc<crate::lifecycle::KernelEvents>,
}

impl Inner {
    /// Records a change in the catalog, unless shutdown closed the registry (the catalog then
    /// says every live kernel was lost by the restart).
    fn journal(&self, change: impl FnOnce() -> Change) {
        if let (Some(journal), false) = (&self.journal, self.closed) {
            journal.record(change());
        }
    }

    /// Unregisters the idle slots. Those whose kernel hibernates go to `hibernating` (marked
    /// pending, no loss recorded) when it is given; otherwise they stay registered (only the
    /// reaper hibernates kernels).
    fn take_idle(
        &mut self,
        now: Instant,
        idle: Duration,
        mut hibernating: Option<&mut Vec<Arc<Slot>>>,
    ) -> Vec<Arc<Slot>> {
        let stale: Vec<KernelKey> = self
            .slots
            .iter()
            .filter(|(k, s)| {
                // A session's own idle timeout, when it set one (`src/settings.rs`).
                let idle = self
                    .settings_of(&k.owner)
                    .and_then(|s| s.idle_timeout)
                    .unwrap_or(idle);
                s.is_idle()
                    && now.saturating_duration_since(s.last_used()) >= idle
                    && (!s.hibernate || hibernating.is_some())
            })
            .map(|(k, _)| k.clone())
            .collect();
        let mut reaped = Vec::new();
        for key in stale {
            let Some(slot) = self.slots.remove(&key) else {
                continue;
            };
            match hibernating.as_deref_mut() {
                Some(list) if slot.hibernate => {
                    self.hibernation_pending(&key);
                    list.push(slot);
                }
                _ => {
                    self.record_loss(&key, LossReason::IdleReaped, slot.container());
                    reaped.push(slot);
                }
            }
        }
        reaped
    }
}

impl Registry {
    /// An empty registry with the host's kernel cap and the idle timeout.
    pub fn new(max_kernels: usize, idle_timeout: Duration) -> Registry {
        Registry {
            max_kernels,
            idle_timeout,
            inner: Mutex::new(Inner::default()),
            released: tokio::sync::Notify::new(),
        }
    }

    /// The sessions' recent lifecycle events, where a kernel's start, restore and
    /// hibernation are recorded (its losses and ends are, by the registry).
    pub fn events(&self) -> Arc<crate::lifecycle::KernelEvents> {
        self.lock().events.clone()
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
    #[cfg(test)]
    pub fn attach(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
    ) -> Result<Attach, Refusal> {
        self.attach_from_pool(key, reset, limits, None)
    }

    /// [`Registry::attach`], taking a ready pooled kernel of `spec` (when given and one is
    /// ready) for a new slot, in the same critical section as its admission: the slot's
    /// kernel is set and assigned to the key's owner before the lock is released.
    pub fn attach_from_pool(
        &self,
        key: &KernelKey,
        reset: bool,
        limits: TenantLimits,
        spec: Option<&KernelSpec>,
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
        let mut victims = inner.take_idle(now, self.idle_timeout, None);
        let mut discarded = Vec::new();
        let new_slot = reset || !inner.slots.contains_key(key);
        // A session with its own environment, memory or CPU gets a kernel made for it.
        let spec = spec.filter(|_| {
            !inner
                .settings_of(&key.owner)
                .is_some_and(|s| s.shapes_the_container())
        });
        // A key whose kernel hibernated gets it back, never a pooled one (`hibernated.rs`).
        let spec = spec.filter(|_| !inner.hibernated.contains_key(key));
        let taking = spec
            .filter(|_| new_slot)
            .and_then(|s| inner.pool_find(s, key.context.language));
        if !inner.slots.contains_key(key) {
            match inner.admit(key, limits, self.max_kernels, taking) {
                Ok((evicted, gone)) => {
                    victims.extend(evicted);
                    discarded = gone;
                }
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
        let mut attach = self.attach_locked(&mut inner, key, reset, victims, now, limits);
        attach.discarded = discarded;
        // Found again: a discard may have moved it.
        let taking = spec
            .filter(|_| new_slot)
            .and_then(|s| inner.pool_find(s, key.context.language));
        if let Some(index) = taking {
            let kernel = inner.pool_take(index, &key.owner);
            // The slot is new, so its kernel is unset; were it not, the kernel goes.
            match attach.slot.kernel.set(kernel) {
                Ok(()) => attach.pooled = true,
                Err(
                    tokio::sync::SetError::AlreadyInitializedError(kernel)
                    | tokio::sync::SetError::InitializingError(kernel),
                ) => attach.discarded.push(kernel),
            }
        }
        Ok(attach)
    }

    /// The registration part of [`Registry::attach`], under the lock.
    fn attach_locked(
        &self,
        inner: &mut Inner,
        key: &KernelKey,
        reset: bool,
        victims: Vec<Arc<Slot>>,
        now: Instant,
        limits: TenantLimits,
    ) -> Attach {
        let reset_slot = if reset { inner.unregister(key) } else { None };
        if let Some(slot) = &reset_slot {
            inner.record_end(slot, "reset");
        }
        if key.owner.is_child() {
            inner.released_children.remove(&key.owner);
        }
        let slot = match inner.slots.get(key) {
            Some(slot) => slot.clone(),
            None => {
                inner.remember(key);
                inner.take_seed(key);
                // A hibernated kernel comes back as the same generation.
                let restoring = inner.hibernated.contains_key(key);
                let generation = {
                    let g = inner.generations.entry(key.clone()).or_insert(0);
                    if !restoring || *g == 0 {
                        *g += 1;
                    }
                    *g
                };
                let slot = Arc::new(Slot {
                    key: key.clone(),
                    generation: AtomicU64::new(generation),
                    kernel: OnceCell::new(),
                    attached: AtomicUsize::new(0),
                    last_used: Mutex::new(now),
                    settings: inner.settings_of(&key.owner),
                    hibernate: limits.hibernate,
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
            pooled: false,
            discarded: Vec::new(),
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
        drop(inner);
        if left == 0 {
            self.released.notify_waiters();
        }
        left == 0 && !registered
    }

    /// What a call letting go of a slot tells ([`Registry::release`]): a caller waiting for a
    /// kernel to be idle takes `released().notified()` before it looks, then waits on it.
    pub fn released(&self) -> &tokio::sync::Notify {
        &self.released
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
                Some(reason) => inner.record_loss(&slot.key, reason, slot.container()),
                None => inner.record_end(slot, "ended"),
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
        self.remove_keys(|k| matches(&k.owner), loss, only_idle)
    }

    /// [`Registry::remove_where`], matching the whole key (one context of an owner's).
    pub fn remove_keys(
        &self,
        matches: impl Fn(&KernelKey) -> bool,
        loss: Option<LossReason>,
        only_idle: bool,
    ) -> (usize, Vec<Arc<Slot>>) {
        let mut inner = self.lock();
        let keys: Vec<KernelKey> = inner
            .slots
            .iter()
            .filter(|(k, s)| matches(k) && (!only_idle || s.attached() == 0))
            .map(|(k, _)| k.clone())
            .collect();
        let mut removed = Vec::new();
        for key in &keys {
            if let Some(slot) = inner.unregister(key) {
                match loss {
                    Some(reason) => inner.record_loss(key, reason, slot.container()),
                    None => inner.record_end(&slot, "cleared"),
                }
                removed.push(slot);
            }
        }
        (keys.len(), removed)
    }

    /// Unregisters `slot` when no call is attached to it, recording `loss`; the caller disposes
    /// of its kernel. Returns false (and changes nothing) when a call is attached or the slot
    /// is no longer registered.
    pub fn forget_unattached(&self, slot: &Arc<Slot>, loss: LossReason) -> bool {
        let mut inner = self.lock();
        let registered = inner
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot));
        if !registered || slot.attached() > 0 {
            return false;
        }
        inner.unregister(&slot.key);
        inner.record_loss(&slot.key, loss, slot.container());
        true
    }

    /// True once [`Registry::drain`] ran: no new kernel may be registered.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// Evictions made to admit new kernels so far, by cap.
    pub fn eviction_counts(&self) -> EvictionCounts {
        self.lock().evictions
    }

    /// True while `slot` is the key's registered slot.
    pub fn is_registered(&self, slot: &Arc<Slot>) -> bool {
        self.lock()
            .slots
            .get(&slot.key)
            .is_some_and(|s| Arc::ptr_eq(s, slot))
    }

    /// One reaper pass over idle slots (no acquire needed): the slots to dispose of, and
    /// those whose kernels are to hibernate (each marked pending until
    /// [`Registry::hibernation_done`]).
    pub fn reap_idle(&self) -> (Vec<Arc<Slot>>, Vec<Arc<Slot>>) {
        let mut hibernating = Vec::new();
        let reaped =
            self.lock()
                .take_idle(Instant::now(), self.idle_timeout, Some(&mut hibernating));
        (reaped, hibernating)
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

    /// The per-tenant counters for the metrics (`docs/usage.md`, "Per-tenant metrics").
    pub fn tenants(&self) -> Arc<TenantMeter> {
        self.lock().tenants.clone()
    }

    /// Registered slots.
    pub fn len(&self) -> usize {
        self.lock().slots.len()
    }
}

#[cfg(test)]
mod tests;
