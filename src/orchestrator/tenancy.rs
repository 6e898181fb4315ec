//! The tenants' settings swapped by a reload (`crate::tenancy`; docs/http-api.md,
//! "Reloading the tenants"): the registry's ceilings and egress follow the new value, and a
//! removed tenant's kernels go, their owners told `tenant_removed`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use super::Orchestrator;
use crate::cell::LossReason;
use crate::config::Config;
use crate::settings::{Limits, Settings};
use crate::tenancy::TenantPolicies;

/// What a session of each tenant runs with where it sets nothing, from the tenants'
/// `session_limits` ([`Limits::ceiling`]).
pub(super) fn ceilings(
    config: &Config,
    limits: &BTreeMap<String, Limits>,
) -> HashMap<String, Settings> {
    let defaults = config.session_defaults();
    limits
        .iter()
        .filter_map(|(t, l)| Some((t.clone(), l.ceiling(&defaults)?)))
        .collect()
}

impl Orchestrator {
    /// The tenants' settings as now.
    pub fn tenant_policies(&self) -> Arc<TenantPolicies> {
        self.inner.tenancy.load_full()
    }

    /// Replaces the tenants' settings from the next decision on: new kernels take the new
    /// runtimes, sessions the new limits, cells the new audit policies; with egress, every
    /// live kernel's connections are judged again against its tenant's new network policy
    /// and those it no longer allows are closed (their number is returned). A policy that
    /// does not parse changes nothing.
    pub fn set_tenant_policies(
        &self,
        policies: TenantPolicies,
    ) -> Result<usize, crate::egress::EgressError> {
        let closed = match self.inner.services.sessions.egress() {
            Some(egress) => egress.set_tenants(&policies.networks)?,
            None => 0,
        };
        self.inner
            .registry
            .set_ceilings(ceilings(&self.inner.config, &policies.session_limits));
        if let Some(workspaces) = self.inner.services.transfers.workspaces() {
            workspaces.set_policies(policies.workspaces.clone());
        }
        self.inner.tenancy.store(Arc::new(policies));
        Ok(closed)
    }

    /// Removes every kernel of `tenant`, a tenant a reload removed: a running cell in one
    /// ends, the containers go, hibernated checkpoints are discarded, and each owner is told
    /// `state_lost: tenant_removed` on its next call, should the tenant ever come back.
    /// Returns the kernels removed.
    pub async fn remove_tenant(&self, tenant: &str) -> usize {
        let (n, slots) = self.inner.registry.remove_where(
            |o| o.tenant == tenant,
            Some(LossReason::TenantRemoved),
            false,
        );
        crate::services::dispose_slots(slots).await;
        let hibernated = self
            .inner
            .registry
            .remove_hibernated(|k| k.owner.tenant == tenant);
        let n = n + hibernated.len();
        self.inner.services.hibernation.discard(hibernated).await;
        // Its sessions' own network policies and settings go too: a tenant added back under
        // the name (docs/http-api.md, "Reloading the tenants") must not inherit them.
        self.inner.services.sessions.forget_tenant(tenant);
        n
    }
}
