//! The proxy's recent refusals (`docs/console.md`, "What happened lately"): who was refused
//! which destination, why and when, for `GET /v1/egress/refusals` and the console. Bounded:
//! [`REFUSALS_PER_TENANT`] per tenant, [`MAX_REFUSALS`] in all; past the host's bound the
//! tenant keeping the most forgets its oldest, so a kernel hammering refused destinations
//! never pushes another tenant's refusals out.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::wire::EgressRefusal;

/// Refusals kept per tenant (its oldest go first).
pub const REFUSALS_PER_TENANT: usize = 200;
/// Refusals kept on this host, every tenant's together.
pub const MAX_REFUSALS: usize = 2_000;

#[derive(Debug)]
struct Kept {
    seq: u64,
    at: SystemTime,
    session: String,
    host: String,
    port: u16,
    reason: &'static str,
}

#[derive(Debug, Default)]
struct Inner {
    tenants: HashMap<String, VecDeque<Kept>>,
    total: usize,
    seq: u64,
}

/// The recent refusals, by tenant.
#[derive(Debug, Default)]
pub struct Refusals {
    inner: Mutex<Inner>,
}

impl Refusals {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps one refusal of `tenant`'s `session` (`host` cut as audit lines cut it).
    pub(super) fn push(
        &self,
        tenant: &str,
        session: &str,
        host: &str,
        port: u16,
        reason: &'static str,
    ) {
        let mut inner = self.lock();
        inner.seq += 1;
        let kept = Kept {
            seq: inner.seq,
            at: SystemTime::now(),
            session: session.to_string(),
            host: super::audit::audit_host(host).into_owned(),
            port,
            reason,
        };
        let own = inner.tenants.get(tenant).map_or(0, VecDeque::len);
        if own >= REFUSALS_PER_TENANT {
            inner.forget_oldest(tenant.to_string());
        } else if inner.total >= MAX_REFUSALS {
            let most = inner
                .tenants
                .iter()
                .max_by(|a, b| a.1.len().cmp(&b.1.len()).then_with(|| b.0.cmp(a.0)))
                .map(|(t, _)| t.clone());
            if let Some(most) = most {
                inner.forget_oldest(most);
            }
        }
        inner
            .tenants
            .entry(tenant.to_string())
            .or_default()
            .push_back(kept);
        inner.total += 1;
    }

    /// The last `limit` refusals, of `tenant` when given, the most recent first.
    pub fn recent(&self, tenant: Option<&str>, limit: usize) -> Vec<EgressRefusal> {
        let inner = self.lock();
        let mut all: Vec<(&String, &Kept)> = inner
            .tenants
            .iter()
            .filter(|(t, _)| tenant.is_none_or(|want| want == *t))
            .flat_map(|(t, kept)| kept.iter().map(move |k| (t, k)))
            .collect();
        all.sort_by_key(|k| std::cmp::Reverse(k.1.seq));
        all.into_iter()
            .take(limit)
            .map(|(tenant, k)| EgressRefusal {
                at: humantime::format_rfc3339_millis(k.at).to_string(),
                tenant: tenant.clone(),
                session: k.session.clone(),
                host: k.host.clone(),
                port: k.port,
                reason: k.reason.to_string(),
            })
            .collect()
    }
}

impl Inner {
    fn forget_oldest(&mut self, tenant: String) {
        if let Some(kept) = self.tenants.get_mut(&tenant) {
            if kept.pop_front().is_some() {
                self.total = self.total.saturating_sub(1);
            }
            if kept.is_empty() {
                self.tenants.remove(&tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_bound_forgets_its_own_oldest_never_anothers() {
        let refusals = Refusals::default();
        refusals.push("quiet", "s", "example.com", 443, "denied");
        for i in 0..(MAX_REFUSALS * 2) {
            refusals.push(&format!("t{}", i % 20), "s", &format!("h{i}"), 80, "denied");
        }
        let quiet = refusals.recent(Some("quiet"), usize::MAX);
        assert_eq!(quiet.len(), 1);
        assert_eq!(quiet[0].host, "example.com");
        assert!(refusals.recent(None, usize::MAX).len() <= MAX_REFUSALS);
        assert!(refusals.recent(Some("t3"), usize::MAX).len() <= REFUSALS_PER_TENANT);
        let newest = refusals.recent(None, 1);
        assert_eq!(newest[0].host, format!("h{}", MAX_REFUSALS * 2 - 1));
        let long = "a".repeat(10_000);
        refusals.push("quiet", "s", &long, 443, "denied");
        assert!(refusals.recent(Some("quiet"), 1)[0].host.len() < 300);
    }
}
