//! Kernels' lifecycle events (`docs/console.md`, "A kernel's events"): each one logged
//! (`logging.rs`'s `kernel_*`, `docs/logs.md`) and kept in a bounded ring per session, which
//! `GET /v1/sessions/{session}/events` and the admin's routes read: started (cold or from the
//! pool), restored, hibernated, interrupted, ended, and lost with its reason.
//!
//! The registry holds the one [`KernelEvents`] of an orchestrator (its losses and ends are
//! recorded there); the orchestrator's starts and the hibernation reach it through the
//! registry. It calls nothing back.
//!
//! What it makes the host hold, whatever tenants do: [`EVENTS_PER_SESSION`] events per
//! session, [`MAX_SESSIONS_PER_TENANT`] sessions per tenant (of which at most
//! [`MAX_ENDED_PER_TENANT`] with no kernel any more: the last ones to end), and
//! [`MAX_SESSIONS`] sessions in all. Past a bound, the oldest session goes: one that ended
//! first, of the same tenant, or past the host's bound of the tenant keeping the most.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::cell::LossReason;
use crate::owner::Owner;
use crate::wire::{KernelEvent, LifecycleKind, SessionEvents};

/// Events one session's ring keeps (the oldest go first).
pub const EVENTS_PER_SESSION: usize = 32;
/// Sessions of one tenant whose events are kept.
pub const MAX_SESSIONS_PER_TENANT: usize = 256;
/// Of those, sessions whose kernel ended or was lost (no kernel now) kept.
pub const MAX_ENDED_PER_TENANT: usize = 64;
/// Sessions whose events are kept on this host, every tenant's together.
pub const MAX_SESSIONS: usize = 4_096;

/// One event as kept.
#[derive(Debug, Clone)]
struct Event {
    at: SystemTime,
    kind: LifecycleKind,
    reason: Option<String>,
    generation: u64,
    container: Option<String>,
    child: Option<String>,
}

/// One session's ring.
#[derive(Debug, Default)]
struct Ring {
    events: VecDeque<Event>,
    /// When it was last written to (a counter, for the oldest).
    touched: u64,
    /// Its last event ended or lost its kernel.
    ended: bool,
}

#[derive(Debug, Default)]
struct Rings {
    sessions: HashMap<(String, String), Ring>,
    /// Rings per tenant: (all, ended).
    tenants: HashMap<String, (usize, usize)>,
    clock: u64,
}

/// The recent lifecycle events of one orchestrator's sessions, bounded (see the module's doc).
#[derive(Debug, Default)]
pub struct KernelEvents {
    rings: Mutex<Rings>,
}

impl KernelEvents {
    fn lock(&self) -> std::sync::MutexGuard<'_, Rings> {
        self.rings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kernel was started for `owner` (`how`: `cold`, or `pool`).
    pub(crate) fn started(
        &self,
        owner: &Owner,
        container: &str,
        generation: u64,
        how: &'static str,
    ) {
        crate::logging::kernel_started(owner, container, generation, how);
        self.record(
            owner,
            LifecycleKind::Started,
            Some(how),
            generation,
            Some(container),
        );
    }

    /// `owner`'s hibernated kernel was restored.
    pub(crate) fn restored(&self, owner: &Owner, container: &str, generation: u64) {
        crate::logging::kernel_restored(owner, container, generation);
        self.record(
            owner,
            LifecycleKind::Restored,
            None,
            generation,
            Some(container),
        );
    }

    /// `owner`'s idle kernel was hibernated (`why`: `idle`, `evicted`, `restart`).
    pub(crate) fn hibernated(
        &self,
        owner: &Owner,
        container: &str,
        generation: u64,
        why: &str,
        seconds: f64,
    ) {
        crate::logging::kernel_hibernated(owner, container, generation, why, seconds);
        self.record(
            owner,
            LifecycleKind::Hibernated,
            Some(why),
            generation,
            Some(container),
        );
    }

    /// `owner`'s kernel was removed on purpose (`why`: `cleared`, `reset`, `ended`).
    pub(crate) fn ended(&self, owner: &Owner, container: &str, generation: u64, why: &'static str) {
        crate::logging::kernel_ended(owner, container, generation, why);
        self.record(
            owner,
            LifecycleKind::Ended,
            Some(why),
            generation,
            Some(container),
        );
    }

    /// `owner`'s kernel is gone with its state, for `reason`.
    pub(crate) fn lost(
        &self,
        owner: &Owner,
        container: Option<&str>,
        generation: u64,
        reason: LossReason,
    ) {
        crate::logging::kernel_lost(owner, container, generation, reason);
        self.record(
            owner,
            LifecycleKind::Lost,
            Some(reason.as_str()),
            generation,
            container,
        );
    }

    /// `count` running cells of a session were interrupted (none: nothing is recorded).
    pub(crate) fn interrupted(&self, tenant: &str, session: &str, count: usize) {
        if count == 0 {
            return;
        }
        let Ok(owner) = Owner::new(tenant, session, None) else {
            return;
        };
        let generation = self
            .lock()
            .sessions
            .get(&(owner.tenant.clone(), owner.session.clone()))
            .and_then(|r| r.events.back())
            .map_or(0, |e| e.generation);
        let cells = format!("{count} cell{}", if count == 1 { "" } else { "s" });
        self.record(
            &owner,
            LifecycleKind::Interrupted,
            Some(&cells),
            generation,
            None,
        );
    }

    fn record(
        &self,
        owner: &Owner,
        kind: LifecycleKind,
        reason: Option<&str>,
        generation: u64,
        container: Option<&str>,
    ) {
        let event = Event {
            at: SystemTime::now(),
            kind,
            reason: reason.map(str::to_string),
            generation,
            container: container.map(str::to_string),
            child: owner.child.clone(),
        };
        let ends = matches!(kind, LifecycleKind::Ended | LifecycleKind::Lost);
        let mut rings = self.lock();
        rings.clock += 1;
        let clock = rings.clock;
        let key = (owner.tenant.clone(), owner.session.clone());
        if !rings.sessions.contains_key(&key) {
            rings.make_room(&owner.tenant);
            rings.tenants.entry(owner.tenant.clone()).or_default().0 += 1;
        }
        let ring = rings.sessions.entry(key).or_default();
        let was_ended = ring.ended;
        ring.ended = ends;
        ring.touched = clock;
        ring.events.push_back(event);
        while ring.events.len() > EVENTS_PER_SESSION {
            ring.events.pop_front();
        }
        let counts = rings.tenants.entry(owner.tenant.clone()).or_default();
        match (was_ended, ends) {
            (false, true) => counts.1 += 1,
            (true, false) => counts.1 = counts.1.saturating_sub(1),
            _ => {}
        }
        if counts.1 > MAX_ENDED_PER_TENANT {
            rings.evict_oldest(&owner.tenant, true);
        }
    }

    /// One session's events, oldest first (none kept: `None`).
    pub fn session(&self, tenant: &str, session: &str) -> Option<SessionEvents> {
        let rings = self.lock();
        let ring = rings
            .sessions
            .get(&(tenant.to_string(), session.to_string()))?;
        Some(answer(tenant, session, ring))
    }

    /// The sessions with events, of `tenant` when given, the most recently changed first, at
    /// most `limit` of them.
    pub fn recent(&self, tenant: Option<&str>, limit: usize) -> Vec<SessionEvents> {
        let rings = self.lock();
        let mut picked: Vec<_> = rings
            .sessions
            .iter()
            .filter(|((t, _), _)| tenant.is_none_or(|want| want == t))
            .collect();
        picked.sort_by_key(|r| std::cmp::Reverse(r.1.touched));
        picked
            .into_iter()
            .take(limit)
            .map(|((t, s), ring)| answer(t, s, ring))
            .collect()
    }

    /// Sessions whose events are kept: (all, of `tenant`).
    pub fn counts(&self, tenant: &str) -> (usize, usize) {
        let rings = self.lock();
        (
            rings.sessions.len(),
            rings.tenants.get(tenant).map_or(0, |c| c.0),
        )
    }
}

impl Rings {
    /// Makes room for one more ring of `tenant`: past its own bound its oldest goes; past the
    /// host's, the oldest of the tenant keeping the most.
    fn make_room(&mut self, tenant: &str) {
        let own = self.tenants.get(tenant).map_or(0, |c| c.0);
        if own >= MAX_SESSIONS_PER_TENANT {
            self.evict_oldest(tenant, false);
        } else if self.sessions.len() >= MAX_SESSIONS {
            let most = self
                .tenants
                .iter()
                .max_by(|a, b| a.1 .0.cmp(&b.1 .0).then_with(|| b.0.cmp(a.0)))
                .map(|(t, _)| t.clone());
            if let Some(most) = most {
                self.evict_oldest(&most, false);
            }
        }
    }

    /// Forgets `tenant`'s oldest ring whose session ended (or, unless `ended_only`, its
    /// oldest ring when none ended).
    fn evict_oldest(&mut self, tenant: &str, ended_only: bool) {
        let oldest = |ended: bool| {
            self.sessions
                .iter()
                .filter(|((t, _), r)| t == tenant && (!ended || r.ended))
                .min_by_key(|(_, r)| r.touched)
                .map(|(k, _)| k.clone())
        };
        let Some(key) = oldest(true).or_else(|| (!ended_only).then(|| oldest(false)).flatten())
        else {
            return;
        };
        if let Some(ring) = self.sessions.remove(&key) {
            if let Some(counts) = self.tenants.get_mut(tenant) {
                counts.0 = counts.0.saturating_sub(1);
                if ring.ended {
                    counts.1 = counts.1.saturating_sub(1);
                }
                if counts.0 == 0 {
                    self.tenants.remove(tenant);
                }
            }
        }
    }
}

fn answer(tenant: &str, session: &str, ring: &Ring) -> SessionEvents {
    let events: Vec<KernelEvent> = ring
        .events
        .iter()
        .map(|e| KernelEvent {
            at: humantime::format_rfc3339_millis(e.at).to_string(),
            event: e.kind,
            reason: e.reason.clone(),
            generation: e.generation,
            container: e.container.clone(),
            child: e.child.clone(),
        })
        .collect();
    let lost = ring
        .events
        .iter()
        .rev()
        .find(|e| e.kind == LifecycleKind::Lost)
        .and_then(|e| e.reason.clone());
    SessionEvents {
        tenant: tenant.to_string(),
        session: session.to_string(),
        ended: ring.ended,
        lost,
        events,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: &str, session: &str) -> Owner {
        Owner::new(tenant, session, None).expect("owner")
    }

    #[test]
    fn a_ring_keeps_its_last_events_and_the_loss_reason() {
        let events = KernelEvents::default();
        let o = owner("acme", "s1");
        for g in 0..(EVENTS_PER_SESSION as u64 + 5) {
            events.started(&o, "c", g, "cold");
        }
        events.lost(&o, Some("c"), 99, LossReason::Timeout);
        let s = events.session("acme", "s1").expect("kept");
        assert_eq!(s.events.len(), EVENTS_PER_SESSION);
        assert_eq!(s.lost.as_deref(), Some("timeout"));
        assert!(s.ended);
        assert!(events.session("other", "s1").is_none());
    }

    #[test]
    fn a_tenant_churning_sessions_keeps_its_bound_and_never_evicts_another() {
        let events = KernelEvents::default();
        events.started(&owner("quiet", "keep"), "c", 1, "cold");
        for i in 0..(MAX_SESSIONS_PER_TENANT * 2) {
            let o = owner("noisy", &format!("s{i}"));
            events.started(&o, "c", 1, "cold");
        }
        assert_eq!(events.counts("noisy").1, MAX_SESSIONS_PER_TENANT);
        assert!(events.session("quiet", "keep").is_some());
        // Ended sessions: at most the bound kept, the last ones to end.
        for i in 0..(MAX_ENDED_PER_TENANT * 2) {
            let o = owner("enders", &format!("e{i}"));
            events.started(&o, "c", 1, "cold");
            events.ended(&o, "c", 1, "cleared");
        }
        let ended = events.recent(Some("enders"), usize::MAX);
        assert_eq!(ended.len(), MAX_ENDED_PER_TENANT);
        let last = format!("e{}", MAX_ENDED_PER_TENANT * 2 - 1);
        assert!(events.session("enders", &last).is_some());
        assert!(events.session("enders", "e0").is_none());
        // The host's bound: the tenant keeping the most gives way.
        for t in 0..(MAX_SESSIONS / MAX_SESSIONS_PER_TENANT + 2) {
            for i in 0..MAX_SESSIONS_PER_TENANT {
                events.started(&owner(&format!("t{t}"), &format!("s{i}")), "c", 1, "cold");
            }
        }
        assert!(events.counts("quiet").0 <= MAX_SESSIONS);
        assert!(events.session("quiet", "keep").is_some());
    }
}
