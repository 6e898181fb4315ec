//! Admission: caps and fair shares.
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
//! Idle means no call attached and not computing with no cell running (the runaway watch,
//! `docs/reliability.md` "Runaway kernels"): such a kernel costs what a busy one does.
//!
//! On a cluster node ([`ClusterShares`], docs/cluster.md "Caps and fair shares") the shares are
//! of the cluster's capacity (every live node's cap summed) and a tenant's holding counts its
//! kernels on every node (its root kernels elsewhere, as the catalog last said, plus what this
//! host holds); the host's own cap and the victims stay local: only an idle kernel on this host
//! is evicted, of a tenant above its cluster-wide share. Before placing a session here when
//! the host is full, a node asks [`Registry::room_for`] whether such a victim exists; if not,
//! the session goes to a node with room.
//!
//! Warm-pool kernels (`pool.rs`) count toward the host's cap and no tenant's. A new session
//! that takes one adds nothing to the host's count; one that cannot (no pooled kernel of its
//! spec) at the cap discards pooled kernels before it evicts anyone's.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::{Inner, Registry, Slot};
use crate::cell::LossReason;
use crate::kernel::Kernel;
use crate::owner::{KernelKey, Owner};

/// A tenant's own limits, carried by each of its requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Most kernels the tenant may hold at once, its delegated children included (`None`:
    /// only the host's cap applies).
    pub max_kernels: Option<usize>,
    /// Kernels the tenant keeps against other tenants' demand, in place of its fair share.
    pub reserved: Option<usize>,
    /// Its idle kernels hibernate instead of being reaped (`docs/runtimes.md`,
    /// "Hibernation"); the orchestrator sets it for kernels on a runtime that can checkpoint.
    pub hibernate: bool,
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
    /// The host's cap (`kernels.max_session_kernels`, `kernelbox serve --max-kernels`).
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

/// Why [`Registry::attach`](super::Registry::attach) refused a call.
#[derive(Debug)]
pub enum Refusal {
    /// A new kernel would pass a cap.
    AtCapacity(AtCapacity),
    /// The key's kernel already has [`MAX_ATTACHED_PER_SLOT`](super::MAX_ATTACHED_PER_SLOT)
    /// calls attached.
    Busy {
        /// The owner, as a string.
        owner: String,
        /// Calls a slot may have attached ([`MAX_ATTACHED_PER_SLOT`](super::MAX_ATTACHED_PER_SLOT)).
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

/// Kernels evicted to admit another since the orchestrator started, by the cap that made room
/// (`docs/architecture.md`, "Lifecycle of a kernel"; the metrics
/// `kernelbox_tenant_evictions_total` and `kernelbox_host_cap_evictions_total{victim}`). [`Stats::evictions`](crate::orchestrator::Stats::evictions)
/// is one; named as `kernelbox::orchestrator::EvictionCounts`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionCounts {
    /// At the tenant's own `max_kernels`.
    pub tenant_cap: u64,
    /// At the host's cap, from the requester's own tenant.
    pub host_cap_own: u64,
    /// At the host's cap, from a tenant holding more than its fair share.
    pub host_cap_other: u64,
}

/// What a cluster node's fair shares are computed over (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterShares {
    /// The cluster's capacity: the caps of its live nodes, this one's included.
    pub capacity: usize,
    /// Each tenant's root kernels live on the other nodes (tenants with none are absent).
    pub elsewhere: HashMap<String, usize>,
}

/// An admission's plan: the slots to evict (and why), and how many pooled kernels to discard.
type Plan = (Vec<(KernelKey, Evict)>, usize);

/// What an admission took to make room: evicted slots and discarded pooled kernels.
pub(super) type Admitted = (Vec<Arc<Slot>>, Vec<Arc<Kernel>>);

/// The counts an admission plan works on, and the evictions planned so far.
struct Planning<'a> {
    /// The requesting tenant's kernels, pinned ones included (its own cap counts them).
    held_all: usize,
    /// Unpinned kernels per tenant: what the host's cap and the shares count.
    held: HashMap<&'a str, usize>,
    /// Unpinned kernels and pooled ones: what the host's cap counts.
    total: usize,
    /// Pooled kernels that may be discarded (not the one being taken).
    discardable: usize,
    /// Pooled kernels planned to be discarded.
    discarded: usize,
    /// Eviction candidates, least recently used first.
    idle: Vec<&'a Arc<Slot>>,
    /// The slots planned to go, and why.
    planned: Vec<(KernelKey, Evict)>,
    /// Each tenant's kernels on other nodes (a cluster node's; empty on one host).
    elsewhere: Option<&'a ClusterShares>,
}

impl<'a> Planning<'a> {
    fn new(inner: &'a Inner, tenant: &str, taking: bool) -> Planning<'a> {
        let released = &inner.released_children;
        let mut plan = Planning {
            held_all: 0,
            held: HashMap::new(),
            total: 0,
            // Pooled kernels count toward the host's cap, never toward a tenant's.
            discardable: inner.pool.len() - usize::from(taking),
            discarded: 0,
            idle: Vec::new(),
            planned: Vec::new(),
            elsewhere: inner.cluster.as_ref(),
        };
        for s in inner.slots.values() {
            if s.key.owner.tenant == tenant {
                plan.held_all += 1;
            }
            if !s.pinned(released) {
                *plan.held.entry(s.key.owner.tenant.as_str()).or_default() += 1;
                plan.total += 1;
                if s.is_idle() {
                    plan.idle.push(s);
                }
            }
        }
        plan.total += inner.pool.len();
        plan.idle.sort_by_cached_key(|s| s.last_used());
        plan
    }

    /// The tenant's kernels counted against its share: here, plus on other nodes.
    fn holding(&self, tenant: &str) -> usize {
        let here = self.held.get(tenant).copied().unwrap_or(0);
        let there = self
            .elsewhere
            .and_then(|c| c.elsewhere.get(tenant).copied())
            .unwrap_or(0);
        here + there
    }

    fn is_planned(&self, s: &Slot) -> bool {
        self.planned.iter().any(|(k, _)| *k == s.key)
    }

    fn take(&mut self, victim: &Arc<Slot>, why: Evict) {
        self.planned.push((victim.key.clone(), why));
        if let Some(n) = self.held.get_mut(victim.key.owner.tenant.as_str()) {
            *n -= 1;
        }
    }

    /// Plans evictions of the tenant's own idle kernels until one more fits its cap.
    fn within_tenant_cap(&mut self, tenant: &str, max: usize) -> Result<(), (Cap, usize)> {
        while self.held_all >= max {
            let victim = self
                .idle
                .iter()
                .copied()
                .find(|s| s.key.owner.tenant == tenant && !self.is_planned(s));
            let Some(victim) = victim else {
                return Err((Cap::Tenant { max }, self.held_all));
            };
            self.take(victim, Evict::TenantCap);
            self.held_all -= 1;
            self.total -= 1;
        }
        Ok(())
    }
}

impl Inner {
    /// Removes a key's slot. A released child's mark goes with its owner's last slot, so the
    /// set of marks never outgrows the slots.
    pub(super) fn unregister(&mut self, key: &KernelKey) -> Option<Arc<Slot>> {
        let slot = self.slots.remove(key)?;
        if key.owner.is_child()
            && self.released_children.contains(&key.owner)
            && !self.slots.keys().any(|k| k.owner == key.owner)
        {
            self.released_children.remove(&key.owner);
        }
        Some(slot)
    }

    /// Decides which idle slots go so that one more kernel for `key` fits both caps. Nothing
    /// is changed when the answer is no: a refused request costs nobody a kernel.
    /// `taking`: the new kernel comes out of the warm pool, whose kernels the host's cap
    /// already counts. Pooled kernels (but the one taken) go before any owner's kernel.
    /// Returns the slots to evict and how many pooled kernels to discard.
    fn plan_admission(
        &self,
        key: &KernelKey,
        limits: TenantLimits,
        host_max: usize,
        taking: bool,
    ) -> Result<Plan, (Cap, usize)> {
        self.plan_for(
            key.owner.tenant.as_str(),
            key.owner.is_child(),
            limits,
            host_max,
            taking,
            true,
        )
    }

    /// [`Inner::plan_admission`] for a new kernel of `tenant` (`child`: a delegated child's).
    /// `own_below_share`: the requester's own idle kernel may go while it is below its share
    /// (when no other tenant's may); a cluster node asks first without it.
    fn plan_for(
        &self,
        tenant: &str,
        child: bool,
        limits: TenantLimits,
        host_max: usize,
        taking: bool,
        own_below_share: bool,
    ) -> Result<Plan, (Cap, usize)> {
        if child {
            self.check_children(tenant, host_max)?;
        }
        let mut plan = Planning::new(self, tenant, taking);
        // What one more kernel adds to the host's count: nothing for a pooled kernel taken
        // by a session (it was counted already) or for a child (pinned, counted apart).
        let adds = usize::from(!taking && !child);
        let tenant_full = limits.max_kernels.is_some_and(|max| plan.held_all >= max);
        if !tenant_full && plan.total + adds <= host_max {
            return Ok((Vec::new(), 0));
        }
        if let Some(max) = limits.max_kernels {
            plan.within_tenant_cap(tenant, max)?;
        }
        // A live delegated child is pinned: outside the host's cap.
        if child {
            return Ok((plan.planned, 0));
        }
        while plan.total + adds > host_max {
            if plan.discardable > 0 {
                plan.discardable -= 1;
                plan.discarded += 1;
                plan.total -= 1;
                continue;
            }
            self.evict_for_host(&mut plan, tenant, limits, host_max, own_below_share)?;
        }
        Ok((plan.planned, plan.discarded))
    }

    /// Refuses a delegated child when pinned kernels fill the host (they are never evicted).
    fn check_children(&self, tenant: &str, host_max: usize) -> Result<(), (Cap, usize)> {
        let released = &self.released_children;
        let pinned = self.slots.values().filter(|s| s.pinned(released)).count();
        if pinned < host_max {
            return Ok(());
        }
        let mine = self
            .slots
            .values()
            .filter(|s| s.pinned(released) && s.key.owner.tenant == tenant)
            .count();
        Err((Cap::Children { max: host_max }, mine))
    }

    /// Plans one eviction toward the host's cap: from a tenant above its fair share when the
    /// requester is below its own, else one of the requester's own idle kernels (while it is
    /// below its share, only with `own_below_share`). Shares and holdings are cluster-wide on
    /// a cluster node; victims are always this host's.
    fn evict_for_host<'a>(
        &self,
        plan: &mut Planning<'a>,
        tenant: &str,
        limits: TenantLimits,
        host_max: usize,
        own_below_share: bool,
    ) -> Result<(), (Cap, usize)> {
        let mine = plan.holding(tenant);
        let shares = self.shares(plan, tenant, limits, host_max);
        let share = |t: &str| shares.get(t).copied().unwrap_or(0);
        let from_others = if mine < share(tenant) {
            plan.idle.iter().find(|s| {
                let t = s.key.owner.tenant.as_str();
                t != tenant && plan.holding(t) > share(t) && !plan.is_planned(s)
            })
        } else {
            None
        };
        let own_allowed = own_below_share || mine >= share(tenant);
        let victim = match from_others {
            Some(v) => Some((*v, Evict::HostOther)),
            None if own_allowed => plan
                .idle
                .iter()
                .find(|s| s.key.owner.tenant == tenant && !plan.is_planned(s))
                .map(|v| (*v, Evict::HostOwn)),
            None => None,
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
        plan.take(victim, why);
        plan.total -= 1;
        Ok(())
    }

    /// Fair shares of the tenants holding unpinned kernels (here, or on other nodes of a
    /// cluster) and of the requester, of the host's cap or the cluster's capacity (see the
    /// module documentation).
    fn shares<'a>(
        &self,
        plan: &Planning<'a>,
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
        let mut active: Vec<&'a str> = plan
            .held
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(t, _)| *t)
            .collect();
        if let Some(cluster) = plan.elsewhere {
            for (t, n) in &cluster.elsewhere {
                if *n > 0 && !active.contains(&t.as_str()) {
                    active.push(t.as_str());
                }
            }
        }
        if !active.contains(&requester) {
            active.push(requester);
        }
        let capacity = plan
            .elsewhere
            .map_or(host_max, |c| c.capacity.max(host_max));
        let reserved: usize = active.iter().filter_map(|t| limits_of(t).reserved).sum();
        let unreserved = active
            .iter()
            .filter(|t| limits_of(t).reserved.is_none())
            .count();
        let even = capacity
            .saturating_sub(reserved)
            .checked_div(unreserved)
            .unwrap_or(0);
        active
            .into_iter()
            .map(|t| (t, limits_of(t).reserved.unwrap_or(even)))
            .collect()
    }

    /// Admits one more kernel for `key` (`taking`: out of the warm pool): evicts the planned
    /// victims and discards the planned pooled kernels (returned for disposal), or refuses.
    pub(super) fn admit(
        &mut self,
        key: &KernelKey,
        limits: TenantLimits,
        host_max: usize,
        taking: Option<usize>,
    ) -> Result<Admitted, (Cap, usize)> {
        let tenant = key.owner.tenant.clone();
        // Remembered only for tenants holding kernels (the requester included).
        {
            let holding: HashSet<&str> =
                self.slots.keys().map(|k| k.owner.tenant.as_str()).collect();
            self.limits.retain(|t, _| holding.contains(t.as_str()));
        }
        self.limits.insert(tenant.clone(), limits);
        let (plan, discard) = self.plan_admission(key, limits, host_max, taking.is_some())?;
        let discarded = self.pool_discard(discard, taking);
        let mut victims = Vec::with_capacity(plan.len());
        for (victim, why) in plan {
            if let Some(slot) = self.unregister(&victim) {
                if slot.hibernate && slot.is_idle() {
                    // Its kernel hibernates instead (`hibernated.rs`): no loss yet.
                    self.hibernation_pending(&victim);
                } else {
                    self.record_loss(&victim, LossReason::Evicted, slot.container());
                }
                *match why {
                    Evict::TenantCap => &mut self.evictions.tenant_cap,
                    Evict::HostOwn => &mut self.evictions.host_cap_own,
                    Evict::HostOther => &mut self.evictions.host_cap_other,
                } += 1;
                victims.push(slot);
            }
        }
        Ok((victims, discarded))
    }
}

impl Registry {
    /// On a cluster node: the cluster's capacity and the tenants' kernels on other nodes, as
    /// the catalog last said; the fair shares are computed over them from now on.
    pub fn set_cluster_shares(&self, shares: ClusterShares) {
        self.lock().cluster = Some(shares);
    }

    /// True when one more session kernel of `tenant` fits this host now, at most by evicting
    /// an idle kernel of a tenant above its fair share (never the requester's own while it is
    /// below its share): changes nothing.
    pub fn room_for(&self, tenant: &str, limits: TenantLimits) -> bool {
        self.lock()
            .plan_for(tenant, false, limits, self.max_kernels, false, false)
            .is_ok()
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
    #[cfg(test)]
    pub fn released_children(&self) -> usize {
        self.lock().released_children.len()
    }
}
