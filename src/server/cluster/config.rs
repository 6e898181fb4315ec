//! Sessions' own network policies and settings on a cluster node (docs/cluster.md, "Session
//! policies and settings"): the catalog is their home (`crate::cluster::Store`'s
//! `kb_session_config`). A `PUT` writes there first, then applies here; a node that claims a
//! session loads them before the session's kernel starts; deleting a session forgets them.

use axum::http::StatusCode;

use crate::cluster::{ConfigField, ConfigWrite, SessionConfig};
use crate::server::error::ApiError;
use crate::server::AppState;

use super::ClusterNode;

/// The catalog did not answer: a policy or settings cannot be kept or read.
fn unavailable(why: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "catalog_unavailable",
            format!(
                "the cluster catalog is unavailable, so the session's network policy or settings cannot be kept or read; retry: {why}"
            ),
        )
    }
}

/// The session went live on another node between routing and the write: retried, it goes
/// there.
fn moved(node: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "session_moved",
            format!("the session's kernel is starting on node {node:?}; retry (the request then goes there)"),
        )
    }
}

impl ClusterNode {
    /// Writes one field of `tenant`'s `session`'s row (bounded by `max_bytes` per tenant):
    /// its version, or `None` when the tenant's rows would hold more than the bound.
    pub(crate) async fn put_session_config(
        &self,
        tenant: &str,
        session: &str,
        field: ConfigField<'_>,
        max_bytes: usize,
    ) -> Result<Option<u64>, ApiError> {
        let written = self
            .store
            .put_session_config(tenant, session, &self.options.node, field, max_bytes)
            .await
            .map_err(|e| unavailable(&e.to_string()))?;
        match written {
            ConfigWrite::Written { version } => Ok(Some(version)),
            ConfigWrite::TooMany => Ok(None),
            ConfigWrite::Held(p) => {
                self.forget(tenant, session);
                Err(moved(&p.node))
            }
        }
    }

    /// `tenant`'s `session`'s row, as the catalog has it now.
    pub(crate) async fn session_config(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<SessionConfig, ApiError> {
        self.store
            .load_session_config(tenant, session)
            .await
            .map_err(|e| unavailable(&e.to_string()))
    }

    /// Loads `tenant`'s `session`'s policy and settings from the catalog into this node, which
    /// just claimed the session (before its kernel starts here).
    pub(crate) async fn load_session_config(
        &self,
        state: &AppState,
        tenant: &str,
        session: &str,
    ) -> Result<(), ApiError> {
        let config = self.session_config(tenant, session).await?;
        let orchestrator = state.orchestrator();
        let unreadable = |what: &str, e: String| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "catalog_unreadable",
                format!("the session's {what} in the cluster catalog cannot be read: {e}"),
            )
        };
        let network = match &config.network {
            None => None,
            Some(text) => {
                let wire: crate::wire::NetworkPolicy = serde_json::from_str(text)
                    .map_err(|e| unreadable("network policy", e.to_string()))?;
                match orchestrator.sessions().check_network(tenant, &wire) {
                    Ok(policy) => policy,
                    // The tenant has no network (any more): nothing to keep.
                    Err(crate::egress::SessionPolicyError::TenantHasNone { .. }) => None,
                    Err(e) => return Err(unreadable("network policy", e.to_string())),
                }
            }
        };
        orchestrator
            .sessions()
            .apply_network(tenant, session, network, Some(config.version))
            .map_err(|e| unreadable("network policy", e.to_string()))?;
        let settings = match &config.settings {
            None => None,
            Some(text) => {
                let wire: crate::wire::SessionSettings = serde_json::from_str(text)
                    .map_err(|e| unreadable("settings", e.to_string()))?;
                Some(
                    crate::settings::Settings::check(&wire, &crate::settings::Bounds::unbounded())
                        .map_err(|e| unreadable("settings", e.to_string()))?,
                )
            }
        };
        orchestrator
            .sessions()
            .set_settings_at(tenant, session, settings, config.version)
            .map_err(|e| unreadable("settings", e.to_string()))?;
        Ok(())
    }

    /// Forgets the policies and settings of all of `tenant`'s sessions in the catalog (the
    /// tenant was removed by a reload).
    pub(crate) async fn forget_tenant_configs(
        &self,
        tenant: &str,
    ) -> Result<(), crate::cluster::ClusterError> {
        self.store.forget_tenant_configs(tenant).await
    }

    /// Forgets `tenant`'s `session`'s policy and settings in the catalog (the session was
    /// deleted).
    pub(crate) async fn forget_session_config(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<(), ApiError> {
        self.store
            .forget_session_config(tenant, session)
            .await
            .map_err(|e| unavailable(&e.to_string()))
    }
}
