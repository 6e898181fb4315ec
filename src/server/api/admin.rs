//! The operator's routes (`docs/console.md`, "Routes"), which the console is made of and any
//! client may call: `GET /v1/whoami` (any token), and behind the admin token
//! (`serve --admin-token`; 404 without one) `GET /v1/admin/kernels` (every tenant's kernels,
//! a page at a time), `GET /v1/admin/tenants`, `DELETE /v1/admin/tenants/{tenant}/sessions/{session}`.
//!
//! What one call makes the host hold: a listing of this server's live kernels (bounded by the
//! host's cap), of which one page (at most [`MAX_KERNEL_PAGE`](crate::wire::MAX_KERNEL_PAGE))
//! is answered.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;

use super::{invalid, name, path_error};
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{
    Cleared, Identity, KernelPage, KernelPageQuery, Role, TenantEntry, TenantOverview,
};

/// Rejects a caller without the admin token: 404 when the server has none, 401 otherwise.
pub(super) fn admin(state: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if !state.has_admin() {
        return Err(ApiError::not_found(
            "no admin routes here: serve with --admin-token",
        ));
    }
    if state.is_admin(headers) {
        return Ok(());
    }
    state.metrics().rejected("unauthorized");
    Err(ApiError::unauthorized())
}

/// `GET /v1/whoami`: the admin token, or a tenant's.
pub(super) async fn whoami(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: axum::http::Extensions,
) -> Result<Json<Identity>, ApiError> {
    let cluster = state.cluster().is_some();
    if state.is_admin(&headers) {
        return Ok(Json(Identity {
            role: Role::Admin,
            tenant: None,
            cluster,
        }));
    }
    match super::authenticate(&state, &headers, &extensions) {
        Some(tenant) => Ok(Json(Identity {
            role: Role::Tenant,
            tenant: Some(tenant.name.clone()),
            cluster,
        })),
        None => {
            state.metrics().rejected("unauthorized");
            Err(ApiError::unauthorized())
        }
    }
}

/// `GET /v1/admin/kernels`: one page of every tenant's kernels on this server.
pub(super) async fn kernels(
    State(state): State<AppState>,
    headers: HeaderMap,
    query: Result<Query<KernelPageQuery>, QueryRejection>,
) -> Result<Json<KernelPage>, ApiError> {
    admin(&state, &headers)?;
    let Query(query) = query.map_err(|e| {
        invalid(
            &state,
            ApiError::bad_request("invalid_query", e.body_text()),
        )
    })?;
    let limit = query
        .check()
        .map_err(|e| invalid(&state, ApiError::bad_request("invalid_query", e)))?;
    let mut all: Vec<_> = state
        .orchestrator()
        .list_kernels(None)
        .into_iter()
        .filter(|k| query.matches(k))
        .collect();
    all.sort_by(|a, b| {
        (&a.tenant, &a.owner, a.generation).cmp(&(&b.tenant, &b.owner, b.generation))
    });
    let total = all.len();
    let kernels = all.into_iter().skip(query.offset).take(limit).collect();
    Ok(Json(KernelPage {
        kernels,
        total,
        offset: query.offset,
        limit,
    }))
}

/// `GET /v1/admin/tenants`: the tenants, their live kernels and caps.
pub(super) async fn tenants(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<TenantOverview>, ApiError> {
    admin(&state, &headers)?;
    let stats = state.orchestrator().tenant_stats();
    let current = state.tenants().current();
    let tenants = current
        .names()
        .iter()
        .filter_map(|n| current.get(n))
        .map(|t| TenantEntry {
            name: t.name.clone(),
            live_kernels: stats.live.get(&t.name).copied().unwrap_or(0),
            max_kernels: t.max_kernels,
            reserved: t.reserved,
            cells: stats
                .counts
                .get(&t.name)
                .map_or(0, |c| c.cells.iter().sum()),
        })
        .collect();
    Ok(Json(TenantOverview {
        tenants,
        max_kernels: state.orchestrator().config().kernels.max_session_kernels,
    }))
}

/// `DELETE /v1/admin/tenants/{tenant}/sessions/{session}`: ends a tenant's session, as its
/// own `DELETE /v1/sessions/{session}` would.
pub(super) async fn end_session(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Cleared>, ApiError> {
    admin(&state, &headers)?;
    let Path((tenant, session)) = path.map_err(|e| invalid(&state, path_error(e)))?;
    name("session", &session).map_err(|e| invalid(&state, e))?;
    if state.tenants().current().get(&tenant).is_none() {
        return Err(ApiError::not_found(format!("no tenant named {tenant:?}")));
    }
    let cleared = super::end_session(&state, &tenant, &session).await?;
    Ok(Json(cleared))
}
