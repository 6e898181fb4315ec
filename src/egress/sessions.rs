//! Sessions' own network policies (`docs/reliability.md`, "Network egress"), kept per tenant
//! and session, each tenant's bytes counted as they change (never by scanning every tenant's
//! entries) and bounded by [`MAX_NETWORK_BYTES_PER_TENANT`].
//!
//! On one host this table is the policies' only home: a policy past the bound is refused
//! rather than an older session's narrowing forgotten (a forgotten narrowing would widen that
//! session's network). On a cluster node the catalog holds them (`docs/cluster.md`, "Session
//! policies and settings") and this table is what this node loaded of it: an entry of a session
//! with no kernel here may make room, since a session's next start here loads its policy from
//! the catalog again. Every entry carries the catalog's version (0 on one host), and an older
//! version never replaces a newer one.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Policy, SessionPolicyError};
pub use crate::settings::MAX_NETWORK_BYTES_PER_TENANT;
use crate::wire::NetworkPolicy;

/// What one session's policy counts besides its entries' text.
const POLICY_OVERHEAD_BYTES: usize = 256;
/// What each entry counts besides its text.
const ENTRY_OVERHEAD_BYTES: usize = 64;

/// The bytes [`MAX_NETWORK_BYTES_PER_TENANT`] counts for `wire`: its entries' text, a fixed
/// overhead per entry and per policy.
pub fn policy_bytes(wire: &NetworkPolicy) -> usize {
    wire.allow
        .iter()
        .chain(wire.deny.iter())
        .map(|e| e.len() + ENTRY_OVERHEAD_BYTES)
        .sum::<usize>()
        + POLICY_OVERHEAD_BYTES
}

/// One session's policy.
#[derive(Debug)]
struct Kept {
    policy: Arc<Policy>,
    bytes: usize,
    /// The catalog's version of the policy (0 on one host).
    version: u64,
    /// When it was kept here (an increasing count: the oldest make room first).
    kept_at: u64,
}

/// One tenant's sessions' policies and the bytes they hold.
#[derive(Debug, Default)]
struct TenantPolicies {
    sessions: HashMap<String, Kept>,
    bytes: usize,
}

/// Every tenant's sessions' policies (see the module documentation).
#[derive(Debug, Default)]
pub(super) struct SessionPolicies {
    tenants: HashMap<String, TenantPolicies>,
    seq: u64,
}

/// A policy to keep.
pub(super) struct Keep<'a> {
    pub(super) tenant: &'a str,
    pub(super) session: &'a str,
    /// `None`: the session has no policy of its own (any kept one goes).
    pub(super) policy: Option<(Arc<Policy>, usize)>,
    pub(super) version: u64,
    /// The most bytes the tenant may hold.
    pub(super) max_bytes: usize,
    /// True for a session whose entry may go to make room (`None`: none may; the new policy
    /// is refused instead).
    pub(super) evictable: Option<&'a dyn Fn(&str) -> bool>,
    /// Kept even past the bound once nothing more may go (what the catalog accepted).
    pub(super) forced: bool,
}

impl SessionPolicies {
    /// `tenant`'s `session`'s policy, if it has one.
    pub(super) fn get(&self, tenant: &str, session: &str) -> Option<Arc<Policy>> {
        self.tenants
            .get(tenant)?
            .sessions
            .get(session)
            .map(|k| k.policy.clone())
    }

    /// The bytes `tenant`'s sessions' policies hold.
    pub(super) fn bytes(&self, tenant: &str) -> usize {
        self.tenants.get(tenant).map_or(0, |t| t.bytes)
    }

    /// Forgets every policy of `tenant`'s sessions (the tenant was removed by a reload).
    pub(super) fn forget_tenant(&mut self, tenant: &str) {
        self.tenants.remove(tenant);
    }

    /// Keeps (or forgets) a session's policy. False when a newer version was kept already
    /// (nothing changes); refused past the tenant's bound.
    pub(super) fn keep(&mut self, keep: Keep<'_>) -> Result<bool, SessionPolicyError> {
        let Keep {
            tenant,
            session,
            policy,
            version,
            max_bytes,
            evictable,
            forced,
        } = keep;
        self.seq += 1;
        let kept_at = self.seq;
        let mine = self.tenants.entry(tenant.to_string()).or_default();
        let old = mine.sessions.get(session);
        if old.is_some_and(|k| k.version > version) {
            return Ok(false);
        }
        let replaced = old.map_or(0, |k| k.bytes);
        let Some((policy, size)) = policy else {
            mine.sessions.remove(session);
            mine.bytes -= replaced;
            if mine.sessions.is_empty() {
                self.tenants.remove(tenant);
            }
            return Ok(true);
        };
        let mut bytes = mine.bytes - replaced + size;
        if bytes > max_bytes {
            if let Some(evictable) = evictable {
                let mut spare: Vec<(u64, String, usize)> = mine
                    .sessions
                    .iter()
                    .filter(|(s, _)| s.as_str() != session && evictable(s))
                    .map(|(s, k)| (k.kept_at, s.clone(), k.bytes))
                    .collect();
                spare.sort();
                for (_, name, held) in spare {
                    if bytes <= max_bytes {
                        break;
                    }
                    mine.sessions.remove(&name);
                    mine.bytes -= held;
                    bytes -= held;
                }
            }
        }
        if bytes > max_bytes && !forced {
            if mine.sessions.is_empty() {
                self.tenants.remove(tenant);
            }
            return Err(SessionPolicyError::TooMany {
                tenant: tenant.to_string(),
                max_bytes,
            });
        }
        mine.bytes = bytes;
        mine.sessions.insert(
            session.to_string(),
            Kept {
                policy,
                bytes: size,
                version,
                kept_at,
            },
        );
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keep<'a>(tenant: &'a str, session: &'a str, size: usize, version: u64) -> Keep<'a> {
        let policy = Arc::new(Policy::parse(&NetworkPolicy::default()).expect("policy"));
        Keep {
            tenant,
            session,
            policy: Some((policy, size)),
            version,
            max_bytes: 1_000,
            evictable: None,
            forced: false,
        }
    }

    #[test]
    fn a_tenants_policies_are_bounded_in_bytes_and_another_tenant_is_not_touched() {
        let mut kept = SessionPolicies::default();
        for i in 0..3 {
            kept.keep(keep("a", &format!("s{i}"), 300, 0))
                .expect("kept");
        }
        assert!(matches!(
            kept.keep(keep("a", "s3", 300, 0)),
            Err(SessionPolicyError::TooMany {
                max_bytes: 1_000,
                ..
            })
        ));
        assert_eq!(kept.bytes("a"), 900);
        // Replacing a session's own policy counts only the difference; another tenant has
        // its own room.
        kept.keep(keep("a", "s1", 400, 0)).expect("replaced");
        assert_eq!(kept.bytes("a"), 1_000);
        kept.keep(keep("b", "s0", 900, 0)).expect("other tenant");
        // Forgetting gives the bytes back.
        kept.keep(Keep {
            policy: None,
            ..keep("a", "s0", 0, 0)
        })
        .expect("forgotten");
        assert_eq!(kept.bytes("a"), 700);
        assert!(kept.get("a", "s0").is_none());
        kept.keep(keep("a", "s3", 300, 0)).expect("room again");
    }

    #[test]
    fn an_older_version_never_replaces_a_newer_and_spare_entries_make_room() {
        let mut kept = SessionPolicies::default();
        kept.keep(keep("a", "s", 100, 5)).expect("kept");
        assert!(!kept.keep(keep("a", "s", 200, 4)).expect("older"));
        assert_eq!(kept.bytes("a"), 100);
        kept.keep(keep("a", "t", 800, 6)).expect("kept");
        let spare = |s: &str| s == "s";
        kept.keep(Keep {
            evictable: Some(&spare),
            ..keep("a", "u", 150, 7)
        })
        .expect("room made");
        assert!(kept.get("a", "s").is_none());
        assert_eq!(kept.bytes("a"), 950);
    }
}
