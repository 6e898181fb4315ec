//! What happened lately (`docs/console.md`, "What happened lately"), read by the console and
//! any client: `GET /v1/events` (the sessions whose kernel events changed last),
//! `GET /v1/sessions/{session}/events` and, for the admin token,
//! `GET /v1/admin/tenants/{tenant}/sessions/{session}/events` (one session's events and why
//! its kernel was lost), `GET /v1/audit` (the audit trail's tail), `GET /v1/egress/refusals`
//! (the egress proxy's recent refusals). A tenant's token reads its own only; the admin token
//! reads every tenant's, or one's with `tenant`.
//!
//! What one call makes the host hold: at most [`MAX_RECENT`](crate::wire::MAX_RECENT) items;
//! the audit tail reads at most [`TAIL_BYTES`](crate::audit::TAIL_BYTES) of its file, off the
//! runtime.

use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::Json;

use super::{invalid, name, path_error, Caller};
use crate::audit::AuditSink;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{AuditTail, EgressRefusals, RecentQuery, RecentSessions, SessionEvents};

/// Whose items a call reads (`None`: every tenant's, the admin token's without `tenant`) and
/// how many; a tenant's token naming another tenant is `403`.
fn whose(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &Extensions,
    query: Result<Query<RecentQuery>, QueryRejection>,
) -> Result<(Option<String>, usize), ApiError> {
    let me = if state.is_admin(headers) {
        None
    } else {
        match super::authenticate(state, headers, extensions) {
            Some(tenant) => Some(tenant.name.clone()),
            None => {
                state.metrics().rejected("unauthorized");
                return Err(ApiError::unauthorized());
            }
        }
    };
    let Query(query) =
        query.map_err(|e| invalid(state, ApiError::bad_request("invalid_query", e.body_text())))?;
    let limit = query
        .limit()
        .map_err(|e| invalid(state, ApiError::bad_request("invalid_query", e)))?;
    match (me, query.tenant) {
        (None, tenant) => Ok((tenant, limit)),
        (Some(me), None) => Ok((Some(me), limit)),
        (Some(me), Some(other)) if other == me => Ok((Some(me), limit)),
        (Some(_), Some(_)) => Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "a tenant's token reads its own tenant's only",
        )),
    }
}

/// `GET /v1/events`: the sessions whose kernel events changed last, each with its events.
pub(super) async fn recent_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    query: Result<Query<RecentQuery>, QueryRejection>,
) -> Result<Json<RecentSessions>, ApiError> {
    let (tenant, limit) = whose(&state, &headers, &extensions, query)?;
    let events = state.orchestrator().kernel_events();
    Ok(Json(RecentSessions {
        sessions: events.recent(tenant.as_deref(), limit),
    }))
}

/// One session's events (none kept: an empty list).
fn session_events(state: &AppState, tenant: &str, session: &str) -> SessionEvents {
    state
        .orchestrator()
        .kernel_events()
        .session(tenant, session)
        .unwrap_or_else(|| SessionEvents {
            tenant: tenant.to_string(),
            session: session.to_string(),
            ended: false,
            lost: None,
            events: Vec::new(),
        })
}

/// `GET /v1/sessions/{session}/events`: the caller's session's events.
pub(super) async fn own_session_events(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<SessionEvents>, ApiError> {
    let session = super::one_name(&state, session)?;
    Ok(Json(session_events(&state, &tenant.name, &session)))
}

/// `GET /v1/admin/tenants/{tenant}/sessions/{session}/events`: any tenant's session's events.
pub(super) async fn admin_session_events(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<SessionEvents>, ApiError> {
    super::admin::admin(&state, &headers)?;
    let Path((tenant, session)) = path.map_err(|e| invalid(&state, path_error(e)))?;
    name("tenant", &tenant).map_err(|e| invalid(&state, e))?;
    name("session", &session).map_err(|e| invalid(&state, e))?;
    Ok(Json(session_events(&state, &tenant, &session)))
}

/// `GET /v1/audit`: the last records of the audit trail's file (`404 no_audit_file` when the
/// trail is not written to a file here).
pub(super) async fn audit_tail(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    query: Result<Query<RecentQuery>, QueryRejection>,
) -> Result<Json<AuditTail>, ApiError> {
    let (tenant, limit) = whose(&state, &headers, &extensions, query)?;
    let path = match state
        .orchestrator()
        .config()
        .audit
        .as_ref()
        .map(|a| &a.sink)
    {
        Some(AuditSink::File { path, .. }) => path.clone(),
        _ => {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "no_audit_file",
                "this server writes no audit trail file (serve --audit FILE)",
            ))
        }
    };
    let read = tokio::task::spawn_blocking(move || {
        crate::audit::tail(&path, limit, |r| {
            tenant.as_ref().is_none_or(|t| *t == r.tenant)
        })
    })
    .await;
    match read {
        Ok(Ok(tail)) => Ok(Json(AuditTail {
            records: tail.records,
            scanned_bytes: tail.scanned,
            whole_file: tail.whole,
        })),
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "reading the audit trail's tail");
            Err(unavailable())
        }
        Err(e) => {
            tracing::warn!(error = %e, "reading the audit trail's tail");
            Err(unavailable())
        }
    }
}

fn unavailable() -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "audit_unavailable",
        "the audit trail's file could not be read",
    )
}

/// `GET /v1/egress/refusals`: the egress proxy's recent refusals, the most recent first.
pub(super) async fn egress_refusals(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    query: Result<Query<RecentQuery>, QueryRejection>,
) -> Result<Json<EgressRefusals>, ApiError> {
    let (tenant, limit) = whose(&state, &headers, &extensions, query)?;
    let egress = state.orchestrator().sessions().egress();
    Ok(Json(EgressRefusals {
        egress: egress.is_some(),
        refusals: egress.map_or_else(Vec::new, |e| e.refusals(tenant.as_deref(), limit)),
    }))
}
