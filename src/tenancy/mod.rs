//! The per-tenant settings the orchestrator reads at the moment of use, held in one value
//! that a reload swaps whole (`docs/http-api.md`, "Reloading the tenants").
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`TenantPolicies`]: each tenant's runtime, session limits, network policy, audit policy, workspaces and hibernation, as the orchestrator reads them; [`LivePolicies`], the swappable cell holding them |
//!
//! The value is built from the validated configuration at start
//! ([`TenantPolicies::of_config`]) and replaced by a reload; a reader loads it once per
//! decision (`LivePolicies::load`), so one decision never mixes two versions.

use std::collections::{BTreeMap, BTreeSet};

use crate::audit::AuditPolicy;
use crate::config::{Config, KernelRuntime, WorkspacePolicy};
use crate::settings::Limits;
use crate::wire::NetworkPolicy;

/// The swappable cell of the tenants' settings: one `load` per decision, one `store` per
/// reload.
pub type LivePolicies = arc_swap::ArcSwap<TenantPolicies>;

/// Each tenant's settings, by tenant name. A tenant absent from a map has that setting's
/// default (the server's runtime, its session limits, no network, not audited, no
/// workspaces).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TenantPolicies {
    /// The tenants that name their own runtime.
    pub runtimes: BTreeMap<String, KernelRuntime>,
    /// The tenants' `session_limits`, for those that set any.
    pub session_limits: BTreeMap<String, Limits>,
    /// The tenants' network policies that allow something.
    pub networks: BTreeMap<String, NetworkPolicy>,
    /// The audited tenants and how.
    pub audit: BTreeMap<String, AuditPolicy>,
    /// The tenants with workspaces and their policy.
    pub workspaces: BTreeMap<String, WorkspacePolicy>,
    /// The tenants whose idle kernels hibernate (`None`: every tenant's, when the server
    /// hibernates at all).
    pub hibernate: Option<BTreeSet<String>>,
}

impl TenantPolicies {
    /// The settings a server started with `config`.
    pub fn of_config(config: &Config) -> TenantPolicies {
        TenantPolicies {
            runtimes: config.tenant_runtimes.clone(),
            session_limits: config.tenant_session_limits.clone(),
            networks: config
                .egress
                .as_ref()
                .map(|e| e.tenants.clone())
                .unwrap_or_default(),
            audit: config
                .audit
                .as_ref()
                .map(|a| a.tenants.clone())
                .unwrap_or_default(),
            workspaces: config
                .workspaces
                .as_ref()
                .map(|w| w.tenants.clone())
                .unwrap_or_default(),
            hibernate: config.hibernate.as_ref().and_then(|h| h.tenants.clone()),
        }
    }

    /// Whether `tenant`'s idle kernels on `runtime` hibernate, on a server that hibernates
    /// (only under runsc: `docs/runtimes.md`, "Hibernation").
    pub fn hibernates(&self, tenant: &str, runtime: KernelRuntime) -> bool {
        runtime == KernelRuntime::Runsc
            && self.hibernate.as_ref().is_none_or(|t| t.contains(tenant))
    }

    /// The runtime `tenant`'s kernels run under: its own, else `server` (the server's).
    pub fn runtime_of(&self, tenant: &str, server: KernelRuntime) -> KernelRuntime {
        self.runtimes.get(tenant).copied().unwrap_or(server)
    }
}
