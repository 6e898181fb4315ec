//! A session's own routes: interrupt its cells, set its network policy, end it, release a
//! delegated child's kernel, list and end its contexts (`docs/contract.md`, "Languages").

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::extract::{invalid, name, path_error, JsonBody, SessionName};
use super::Caller;
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;
use crate::wire;

/// `POST /v1/sessions/{session}/interrupt`: interrupts the session's running cells.
pub(super) async fn interrupt(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
) -> Result<Json<wire::Interrupted>, ApiError> {
    // The orchestrator counts the cells that really ended as interrupted.
    match state
        .inner
        .orchestrator
        .interrupt(Some(&tenant.name), &session)
        .await
    {
        0 => Err(ApiError::not_found(format!(
            "session {session:?} has no running cell"
        ))),
        n => {
            let events = state.inner.orchestrator.kernel_events();
            events.interrupted(&tenant.name, &session, n);
            Ok(Json(wire::Interrupted { interrupted: n }))
        }
    }
}

/// A session policy that cannot be set, as the API answers it.
fn policy_error(state: &AppState, e: crate::egress::SessionPolicyError) -> ApiError {
    use crate::egress::SessionPolicyError;
    let e = match e {
        SessionPolicyError::Invalid(e) => ApiError::bad_request("invalid_network", e.to_string()),
        e @ SessionPolicyError::TenantHasNone { .. } => {
            ApiError::bad_request("network_not_allowed", e.to_string())
        }
        e @ SessionPolicyError::TooMany { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_session_policies",
            e.to_string(),
        ),
    };
    invalid(state, e)
}

/// Sets a session's network policy within its tenant's (`docs/reliability.md`, "Network
/// egress"): kept for the session's kernels, applied at once to the running one and to one
/// starting meanwhile. On a cluster node the catalog keeps it first (docs/cluster.md,
/// "Session policies and settings"), so the session's kernel gets it on any node.
pub(crate) async fn set_session_network(
    state: &AppState,
    tenant: &Tenant,
    session: &str,
    wire: &crate::wire::NetworkPolicy,
) -> Result<usize, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    let policy = orchestrator
        .sessions()
        .check_network(&tenant.name, wire)
        .map_err(|e| policy_error(state, e))?;
    let version = match state.cluster() {
        None => None,
        Some(node) => {
            let text = policy
                .as_ref()
                .map(|_| serde_json::to_string(wire))
                .transpose();
            let text = text.map_err(|e| {
                ApiError::bad_request("invalid_network", format!("the policy as JSON: {e}"))
            })?;
            let bytes = policy.as_ref().map_or(0, |(_, bytes)| *bytes);
            let field = crate::cluster::ConfigField::Network(text.as_deref(), bytes);
            let written = node
                .put_session_config(
                    &tenant.name,
                    session,
                    field,
                    crate::egress::MAX_NETWORK_BYTES_PER_TENANT,
                )
                .await?;
            let Some(version) = written else {
                return Err(policy_error(
                    state,
                    crate::egress::SessionPolicyError::TooMany {
                        tenant: tenant.name.clone(),
                        max_bytes: crate::egress::MAX_NETWORK_BYTES_PER_TENANT,
                    },
                ));
            };
            Some(version)
        }
    };
    orchestrator
        .sessions()
        .apply_network(&tenant.name, session, policy, version)
        .map_err(|e| policy_error(state, e))
}

/// `PUT /v1/sessions/{session}/network`: the session's policy, applied at once; answers how
/// many of its connections the new policy closed.
pub(super) async fn network(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    JsonBody(policy): JsonBody<wire::NetworkPolicy>,
) -> Result<Json<wire::NetworkApplied>, ApiError> {
    let closed = set_session_network(&state, &tenant, &session, &policy).await?;
    Ok(Json(wire::NetworkApplied { closed }))
}

/// `DELETE /v1/sessions/{session}`: ends the session ([`end_session`]).
pub(super) async fn clear(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
) -> Result<Json<wire::Cleared>, ApiError> {
    Ok(Json(end_session(&state, &tenant.name, &session).await?))
}

/// Ends `tenant`'s `session`: its kernels, then its own network policy and settings (the
/// session's `DELETE`, and the admin's, `admin.rs`).
pub(crate) async fn end_session(
    state: &AppState,
    tenant: &str,
    session: &str,
) -> Result<wire::Cleared, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    let cleared = orchestrator.clear_session(Some(tenant), session).await;
    // A deleted session's own network policy and settings go with it, once its kernels are
    // gone (docs/http-api.md, "Network policy"): from the catalog too on a cluster node.
    if let Some(node) = state.cluster() {
        node.forget_session_config(tenant, session).await?;
    }
    orchestrator.sessions().forget(tenant, session);
    match cleared {
        0 => Err(ApiError::not_found(format!(
            "session {session:?} has no kernel"
        ))),
        n => Ok(wire::Cleared { cleared: n }),
    }
}

/// `DELETE /v1/sessions/{session}/children/{child}`: ends a delegated child's kernel.
pub(super) async fn release_child(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<wire::Released>, ApiError> {
    let Path((_, child)) = path.map_err(|e| invalid(&state, path_error(e)))?;
    name("child", &child).map_err(|e| invalid(&state, e))?;
    match state
        .inner
        .orchestrator
        .release_child(Some(&tenant.name), &session, &child)
        .await
    {
        0 => Err(ApiError::not_found(format!(
            "child {child:?} of session {session:?} has no kernel"
        ))),
        n => Ok(Json(wire::Released { released: n })),
    }
}

/// `GET /v1/sessions/{session}/contexts`: the session's contexts with a kernel.
pub(super) async fn list_contexts(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
) -> Result<Json<wire::ContextList>, ApiError> {
    let contexts = state
        .inner
        .orchestrator
        .list_kernels(Some(&tenant.name))
        .into_iter()
        .filter(|k| k.session == session && k.child.is_none())
        .collect();
    Ok(Json(wire::ContextList { contexts }))
}

/// `DELETE /v1/sessions/{session}/contexts/{context}`: ends one context of a session: its
/// kernel goes, the others and their `/work` stay.
pub(super) async fn end_context(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<wire::Released>, ApiError> {
    let Path((_, context)) = path.map_err(|e| invalid(&state, path_error(e)))?;
    name("context", &context).map_err(|e| invalid(&state, e))?;
    match state
        .inner
        .orchestrator
        .end_context(Some(&tenant.name), &session, &context)
        .await
    {
        0 => Err(ApiError::not_found(format!(
            "context {context:?} of session {session:?} has no kernel"
        ))),
        n => Ok(Json(wire::Released { released: n })),
    }
}
