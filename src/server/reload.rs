//! Reloading the tenants without a restart (docs/http-api.md, "Reloading the tenants"):
//! `SIGHUP` or `POST /v1/admin/reload` (the admin token) re-reads the tenants source through
//! the loader `kernelbox serve` installed ([`Reloader`]), checks the result against the running
//! server, and applies it in one swap of the tenants and one of their settings
//! (`crate::tenancy`); a removed tenant's kernels go (`tenant_removed`), with its sessions'
//! own network policies and settings and its MCP sessions, live egress
//! connections are judged again. A source that cannot be used is refused whole: nothing
//! changes, the reason is logged and returned. What only a restart can change is listed in
//! `needs_restart`, never silently dropped.

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Serialize;
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::{AppState, Tenants};
use crate::config::KernelRuntime;
use crate::tenancy::TenantPolicies;

/// What a reload reads: the tenants, and the egress credentials' secrets and rules when the
/// server has them from a file.
pub struct Source {
    /// The tenants.
    pub tenants: Tenants,
    /// Every tenant's credential secrets and rules (`None`: the server has none from a file).
    pub secrets: Option<crate::egress::secrets::Secrets>,
    /// What the source changed that only a restart applies (a configuration file's keys
    /// outside the tenants: `crate::config::file::needs_restart`), reported as such.
    pub needs_restart: Vec<String>,
}

/// Reads the tenants source again (the tenants file and the egress secrets file today); the
/// error says what is wrong with it (the file and the field; never a secret).
pub type Loader = Box<dyn Fn() -> Result<Source, String> + Send + Sync>;

/// How this server reloads its tenants: the loader of its source and the admin token of the
/// reload route. Reloads run one at a time.
pub struct Reloader {
    load: Loader,
    admin_sha256: Option<[u8; 32]>,
    one_at_a_time: tokio::sync::Mutex<()>,
}

impl Reloader {
    /// Reloads with `load`; the route answers to `admin_token` (without one it is 404, and
    /// only `SIGHUP` reloads).
    pub fn new(load: Loader, admin_token: Option<&str>) -> Reloader {
        Reloader {
            load,
            admin_sha256: admin_token
                .filter(|t| !t.trim().is_empty())
                .map(|t| Sha256::digest(t.as_bytes()).into()),
            one_at_a_time: tokio::sync::Mutex::new(()),
        }
    }
}

/// The answer of a reload (the body of `POST /v1/admin/reload`, and the log line).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ReloadReport {
    /// True when the new tenants are in force; false when the reload was refused and the
    /// running tenants kept.
    pub applied: bool,
    /// Why it was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Tenants added.
    pub added: Vec<String>,
    /// Tenants removed (their kernels removed).
    pub removed: Vec<String>,
    /// Tenants whose entry changed (a token, a cap, a policy).
    pub changed: Vec<String>,
    /// Kernels of the removed tenants removed.
    pub kernels_removed: usize,
    /// Live egress connections closed because a narrowed policy no longer allows them.
    pub connections_closed: usize,
    /// Settings the source asks for that were not applied: only a restart can apply them.
    pub needs_restart: Vec<String>,
}

impl ReloadReport {
    fn refused(reason: String) -> ReloadReport {
        ReloadReport {
            reason: Some(reason),
            ..ReloadReport::default()
        }
    }
}

impl AppState {
    /// Serves reloads with `reloader` from now on (set once, before serving).
    pub fn reload_with(&self, reloader: Reloader) {
        if self.inner.reloader.set(Arc::new(reloader)).is_err() {
            tracing::warn!("this server already has a reloader");
        }
    }

    /// Re-reads the tenants source and applies it (see the module's documentation); the report
    /// is logged. Refused when the server has no reloadable source.
    ///
    /// The reload runs in a task of its own, to its end even when the caller goes away (the
    /// admin route's client cutting its connection): dropped half way, it would leave the
    /// tenants' settings swapped but not the tenants, or a removed tenant's kernels running.
    pub async fn reload(&self) -> ReloadReport {
        let state = self.clone();
        match tokio::spawn(async move { state.reload_to_end().await }).await {
            Ok(report) => report,
            Err(e) => ReloadReport::refused(format!("the reload failed: {e}")),
        }
    }

    /// [`Self::reload`], in its own task.
    async fn reload_to_end(&self) -> ReloadReport {
        let report = match self.inner.reloader.get().cloned() {
            None => ReloadReport::refused(
                "this server has no tenants source to reload (it serves one tenant from its flags)"
                    .into(),
            ),
            Some(reloader) => {
                let _one = reloader.one_at_a_time.lock().await;
                // The source is read off the runtime's workers: a slow disk or a FIFO blocks
                // only this reload.
                let loading = reloader.clone();
                match tokio::task::spawn_blocking(move || (loading.load)()).await {
                    Ok(Ok(source)) => self.apply_source(source).await,
                    Ok(Err(reason)) => ReloadReport::refused(reason),
                    Err(e) => ReloadReport::refused(format!("reading the tenants failed: {e}")),
                }
            }
        };
        if report.applied {
            tracing::info!(
                added = ?report.added,
                removed = ?report.removed,
                changed = ?report.changed,
                kernels_removed = report.kernels_removed,
                connections_closed = report.connections_closed,
                needs_restart = ?report.needs_restart,
                "tenants reloaded"
            );
        } else {
            tracing::error!(
                reason = report.reason.as_deref().unwrap_or_default(),
                "tenants reload refused; the running tenants are kept"
            );
        }
        report
    }

    /// Checks `source` against the running server and swaps it in.
    async fn apply_source(&self, source: Source) -> ReloadReport {
        let Source {
            tenants: new,
            secrets,
            needs_restart: unapplied,
        } = source;
        let orchestrator = self.orchestrator();
        let (policies, mut needs_restart) = match self.check_tenants(&new).await {
            Ok(checked) => checked,
            Err(reason) => return ReloadReport::refused(reason),
        };
        needs_restart.extend(unapplied);
        let old = self.inner.tenants.current();
        let old_names: BTreeSet<&String> = old.names().iter().collect();
        let new_names: BTreeSet<&String> = new.names().iter().collect();
        let added = new_names.difference(&old_names).map(|n| n.to_string());
        let removed: Vec<String> = old_names
            .difference(&new_names)
            .map(|n| n.to_string())
            .collect();
        let changed = new_names
            .intersection(&old_names)
            .filter(|n| old.get(n) != new.get(n))
            .map(|n| n.to_string())
            .collect();
        let added = added.collect();
        // Egress first: it is the one step that can still fail, and then nothing changed.
        let connections_closed = match orchestrator.set_tenant_policies(policies) {
            Ok(closed) => closed,
            Err(e) => return ReloadReport::refused(format!("network policies: {e}")),
        };
        // Credential rules: judged on every connection opened from now on.
        if let Some(secrets) = secrets {
            let applied = match orchestrator.sessions().egress() {
                Some(egress) => egress.set_secrets(secrets),
                None => secrets.is_empty(),
            };
            if !applied {
                needs_restart.push(
                    "credential rules: the server started with none, so its kernels do not trust the kernelbox CA; they apply after a restart".into(),
                );
            }
        }
        // From here a removed or rotated token is refused.
        self.inner.tenants.store(new);
        let mut kernels_removed = 0;
        for tenant in &removed {
            kernels_removed += orchestrator.remove_tenant(tenant).await;
            // Its MCP sessions end (their kernels go now, not at the idle timeout).
            self.end_mcp_sessions(tenant).await;
            // Its sessions' policies and settings: remove_tenant forgot this node's copies;
            // on a cluster node the catalog's rows go too, so that a tenant added back under
            // the name does not load them again. The reload is applied already: a failure is
            // logged, and the rows stay until the sessions are deleted.
            if let Some(node) = self.cluster() {
                if let Err(e) = node.forget_tenant_configs(tenant).await {
                    tracing::error!(tenant, error = %e, "forgetting a removed tenant's session policies and settings in the catalog failed");
                }
            }
        }
        ReloadReport {
            applied: true,
            reason: None,
            added,
            removed,
            changed,
            kernels_removed,
            connections_closed,
            needs_restart,
        }
    }

    /// What the running server must refuse in `new` (as its start would: the reservations
    /// against the host's cap, a missing image, a network under runsc, hibernation under
    /// runc), else the settings to swap in and those that need a restart.
    async fn check_tenants(&self, new: &Tenants) -> Result<(TenantPolicies, Vec<String>), String> {
        let orchestrator = self.orchestrator();
        let config = orchestrator.config();
        new.check_reserved(config.kernels.max_session_kernels)
            .map_err(|e| e.to_string())?;
        for image in new.images() {
            match orchestrator.engine().image_exists(image).await {
                Ok(true) => {}
                Ok(false) => {
                    return Err(format!(
                        "image {image} is not in the engine: pull or build it first"
                    ))
                }
                Err(e) => return Err(format!("checking image {image}: {e}")),
            }
        }
        let server_runtime = config.spec.sandbox.runtime;
        let current = orchestrator.tenant_policies();
        let mut needs_restart = Vec::new();
        let runtimes = new.runtimes();
        let runtime_of = |t: &str| runtimes.get(t).copied().unwrap_or(server_runtime);
        let known_runtimes = config.runtimes();
        for (tenant, runtime) in &runtimes {
            if !known_runtimes.contains(runtime) {
                needs_restart.push(format!(
                    "tenant {tenant}: runtime {} (the engine's runtimes are checked at start; its kernels keep {})",
                    runtime.name(),
                    current.runtime_of(tenant, server_runtime).name()
                ));
            }
        }
        let mut networks = new.networks();
        for tenant in networks.keys() {
            if runtime_of(tenant) == KernelRuntime::Runsc {
                return Err(format!(
                    "tenant {tenant} has a network policy, but its kernels run under runsc, which gives them no network stack (docs/runtimes.md); give it runtime runc or no network"
                ));
            }
        }
        if orchestrator.sessions().egress().is_none() && !networks.is_empty() {
            let names: Vec<&str> = networks.keys().map(String::as_str).collect();
            needs_restart.push(format!(
                "network of tenant(s) {}: the server started with no tenant network, so without its egress proxy; they have no network until a restart",
                names.join(", ")
            ));
            networks.clear();
        }
        let hibernating = new.hibernating();
        let hibernate = match &config.hibernate {
            None if !hibernating.is_empty() => {
                needs_restart.push(format!(
                    "hibernate of tenant(s) {}: the server started with no hibernation",
                    hibernating.into_iter().collect::<Vec<_>>().join(", ")
                ));
                None
            }
            None => None,
            // Every tenant's kernels hibernate (`--hibernate`): the tenants' own say nothing.
            Some(h) if h.tenants.is_none() => None,
            Some(_) => {
                if let Some(t) = hibernating
                    .iter()
                    .find(|t| runtime_of(t) != KernelRuntime::Runsc)
                {
                    return Err(format!(
                        "tenant {t}: hibernation checkpoints kernels under runsc only; give it runtime runsc (docs/runtimes.md)"
                    ));
                }
                Some(hibernating)
            }
        };
        let mut audit = new.audits();
        if config.audit.is_none() && !audit.is_empty() {
            needs_restart.push(format!(
                "audit of tenant(s) {}: the server started with no audit trail",
                audit.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            audit.clear();
        }
        // Workspaces apply live where the server has a workspace store (it started with
        // workspaces: its directory and host-wide bound are set up at start).
        let mut workspaces = new.workspaces();
        if orchestrator.workspaces().is_none() && !workspaces.is_empty() {
            needs_restart.push(format!(
                "workspaces of tenant(s) {}: the server started with no workspaces",
                workspaces.keys().cloned().collect::<Vec<_>>().join(", ")
            ));
            workspaces.clear();
        }
        let policies = TenantPolicies {
            runtimes: runtimes
                .into_iter()
                .filter(|(_, r)| known_runtimes.contains(r))
                .collect(),
            session_limits: new.session_limits(),
            networks,
            audit,
            workspaces,
            hibernate,
        };
        Ok((policies, needs_restart))
    }
}

/// `POST /v1/admin/reload`: the admin token; 404 when the server has none (or no tenants
/// source). 200 with the report when applied, 422 with it when refused.
pub(crate) async fn reload_route(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<(StatusCode, Json<ReloadReport>), ApiError> {
    let want = state
        .inner
        .reloader
        .get()
        .and_then(|r| r.admin_sha256)
        .ok_or_else(|| {
            ApiError::not_found(
                "no reload here: serve with --tenants and --admin-token (or send SIGHUP)",
            )
        })?;
    match super::tenants::bearer(&headers) {
        Some(token) if Sha256::digest(token.as_bytes()).as_slice() == want => {}
        _ => return Err(ApiError::unauthorized()),
    }
    let report = state.reload().await;
    let status = if report.applied {
        StatusCode::OK
    } else {
        StatusCode::UNPROCESSABLE_ENTITY
    };
    Ok((status, Json(report)))
}
