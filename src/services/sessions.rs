//! [`SessionConfigs`]: each session's own settings (environment, memory, CPU, idle timeout,
//! labels: `crate::settings`) and network policy (`crate::egress`) as this host keeps them,
//! and network egress itself. The registry keeps the settings and egress the policies; this
//! service is where the orchestrator's callers set, read, hold and forget them
//! (`docs/http-api.md`, "Sessions"; `docs/reliability.md`, "Network egress").

use std::sync::Arc;

use crate::egress::{Egress, Grant, Policy, SessionPolicyError};
use crate::owner::Owner;
use crate::registry::Registry;
use crate::settings::{Settings, SettingsError};

/// Sessions' own settings and network policies on this host; network egress, when configured.
pub struct SessionConfigs {
    registry: Arc<Registry>,
    egress: Option<Arc<Egress>>,
    /// The tenant of a call that names none.
    default_tenant: String,
}

impl std::fmt::Debug for SessionConfigs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionConfigs")
            .field("egress", &self.egress.is_some())
            .finish()
    }
}

impl SessionConfigs {
    pub(crate) fn new(
        registry: Arc<Registry>,
        egress: Option<Arc<Egress>>,
        default_tenant: String,
    ) -> SessionConfigs {
        SessionConfigs {
            registry,
            egress,
            default_tenant,
        }
    }

    /// Network egress, when configured (its counters for `/metrics`).
    pub fn egress(&self) -> Option<&Egress> {
        self.egress.as_deref()
    }

    /// Network egress, shared, when configured (what a kernel start registers with).
    pub(crate) fn egress_shared(&self) -> Option<&Arc<Egress>> {
        self.egress.as_ref()
    }

    /// Sets `tenant`'s `session`'s settings, checked by the caller against the tenant's
    /// maximums ([`Settings::check`]); they apply to its next kernel (environment, memory,
    /// CPU) or at once (idle timeout, labels). Returns true when a live kernel of the session
    /// runs with another environment, memory or CPU.
    pub fn set_settings(
        &self,
        tenant: Option<&str>,
        session: &str,
        settings: Settings,
    ) -> Result<bool, SettingsError> {
        let tenant = tenant.unwrap_or(&self.default_tenant);
        self.registry.set_settings(tenant, session, settings)
    }

    /// `tenant`'s `session`'s settings as a cluster node keeps them (`None`: forgotten) at the
    /// catalog's `version`: an older version never replaces a newer, and the catalog (their
    /// home) bounded them (`Registry::set_settings_at`).
    pub fn set_settings_at(
        &self,
        tenant: &str,
        session: &str,
        settings: Option<Settings>,
        version: u64,
    ) -> Result<bool, SettingsError> {
        self.registry
            .set_settings_at(tenant, session, settings, version, true)
    }

    /// `tenant`'s `session`'s settings (the server's defaults when it set none).
    pub fn settings(&self, tenant: Option<&str>, session: &str) -> Settings {
        let tenant = tenant.unwrap_or(&self.default_tenant);
        self.registry
            .settings(tenant, session)
            .map(|s| Settings::clone(&s))
            .unwrap_or_default()
    }

    /// Holds `tenant`'s `session`'s network policy and settings on this node while the guard
    /// lives: a cluster node's claim loaded them and the session's kernel is not registered
    /// yet, so they are not forgotten meanwhile to make room for another session's
    /// (`crate::registry::Registry::hold_config`).
    pub fn hold(&self, tenant: &str, session: &str) -> ConfigHold {
        self.registry.hold_config(tenant, session);
        ConfigHold {
            registry: self.registry.clone(),
            tenant: tenant.to_string(),
            session: session.to_string(),
        }
    }

    /// Forgets `tenant`'s `session`'s own network policy and settings (the session was
    /// deleted: `DELETE /v1/sessions/{session}`).
    pub fn forget(&self, tenant: &str, session: &str) {
        if let Some(egress) = &self.egress {
            // Forgetting is never refused.
            let _ = egress.set_session(tenant, session, None, u64::MAX, None, true);
        }
        let _ = self
            .registry
            .set_settings_at(tenant, session, None, u64::MAX, true);
    }

    /// Forgets the own network policies and settings of every session of `tenant` (a
    /// tenant a reload removed: one added back under its name must not inherit them).
    pub(crate) fn forget_tenant(&self, tenant: &str) {
        if let Some(egress) = &self.egress {
            egress.forget_tenant_sessions(tenant);
        }
        self.registry.forget_tenant_settings(tenant);
    }

    /// The network grant of `owner`'s kernels: `None` without egress or when its tenant
    /// allows nothing (its kernels have no network, exactly as without egress).
    pub(crate) fn grant_of(&self, owner: &Owner) -> Option<Grant> {
        self.egress
            .as_ref()
            .and_then(|e| e.grant(&owner.tenant, &owner.session))
    }

    /// `wire` checked as a policy of one of `tenant`'s sessions, and the bytes it counts
    /// (`crate::egress::Egress::check_session`): one with any entry is refused for a tenant
    /// with no network (without egress configured, every tenant); `None`: nothing to keep.
    pub fn check_network(
        &self,
        tenant: &str,
        wire: &crate::wire::NetworkPolicy,
    ) -> Result<Option<(Arc<Policy>, usize)>, SessionPolicyError> {
        match &self.egress {
            Some(egress) => egress.check_session(tenant, wire),
            None => crate::egress::check_session_policy(false, tenant, wire),
        }
    }

    /// Sets `tenant`'s `session`'s network policy on one host ([`Self::check_network`], then
    /// [`Self::apply_network`]); answers the connections it closed.
    pub fn set_network(
        &self,
        tenant: &str,
        session: &str,
        wire: &crate::wire::NetworkPolicy,
    ) -> Result<usize, SessionPolicyError> {
        let policy = self.check_network(tenant, wire)?;
        self.apply_network(tenant, session, policy, None)
    }

    /// Sets `tenant`'s `session`'s network policy (`None`: forgets it; intersected with the
    /// tenant's) and applies it at once to its running kernel, and to one starting meanwhile:
    /// connections the new policy refuses are closed (their number is returned). `version`:
    /// the catalog's version on a cluster node (an older one never replaces a newer; policies
    /// of sessions with no kernel here make room, the catalog being their home), `None` on
    /// one host (the policy is refused past the tenant's bound).
    pub fn apply_network(
        &self,
        tenant: &str,
        session: &str,
        policy: Option<(Arc<Policy>, usize)>,
        version: Option<u64>,
    ) -> Result<usize, SessionPolicyError> {
        let Some(egress) = &self.egress else {
            return Ok(0);
        };
        let registry = &self.registry;
        let spare = |s: &str| !registry.keeps_config(tenant, s);
        match version {
            Some(version) => {
                egress.set_session(tenant, session, policy, version, Some(&spare), true)
            }
            None => egress.set_session(tenant, session, policy, 0, None, false),
        }
    }
}

/// A session's network policy and settings held on this node ([`SessionConfigs::hold`]);
/// released when dropped.
#[derive(Debug)]
pub struct ConfigHold {
    registry: Arc<Registry>,
    tenant: String,
    session: String,
}

impl Drop for ConfigHold {
    fn drop(&mut self) {
        self.registry.release_config(&self.tenant, &self.session);
    }
}
