//! The running server's tenants: one value, swapped whole by a reload
//! (docs/http-api.md, "Reloading the tenants"), so a request is authenticated against one
//! version or the next, never a mix; a removed or rotated token is refused from the swap on.

use std::sync::Arc;

use super::{Tenant, Tenants};

/// The tenants as now.
#[derive(Debug)]
pub struct LiveTenants(arc_swap::ArcSwap<Tenants>);

impl LiveTenants {
    /// Serves `tenants` until the next [`store`](Self::store).
    pub fn new(tenants: Tenants) -> LiveTenants {
        LiveTenants(arc_swap::ArcSwap::from_pointee(tenants))
    }

    /// The tenant whose token this is, now.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Tenant>> {
        self.0.load().authenticate(token)
    }

    /// True while `tenant`'s token is still its tenant's (not removed, not rotated).
    pub fn holds(&self, tenant: &Tenant) -> bool {
        self.0
            .load()
            .by_hash
            .get(&tenant.token_sha256)
            .is_some_and(|now| now.name == tenant.name)
    }

    /// The tenants as now.
    pub fn current(&self) -> Arc<Tenants> {
        self.0.load_full()
    }

    /// Replaces the tenants: from the return on, requests are authenticated against `tenants`.
    pub fn store(&self, tenants: Tenants) {
        self.0.store(Arc::new(tenants));
    }
}
