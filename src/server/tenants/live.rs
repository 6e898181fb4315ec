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

    /// The tenants as now.
    pub fn current(&self) -> Arc<Tenants> {
        self.0.load_full()
    }

    /// Replaces the tenants: from the return on, requests are authenticated against `tenants`.
    pub fn store(&self, tenants: Tenants) {
        self.0.store(Arc::new(tenants));
    }
}
