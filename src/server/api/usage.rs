//! `GET /v1/usage` (`docs/usage.md`, "Reading the ledger"): a tenant reads its own usage; a
//! tenant marked `usage_admin` in the tenants file, or the admin token (`--admin-token`, the
//! console's admin view: docs/console.md), reads every tenant's, or one's.

use axum::extract::{Query, State};
use axum::http::{Extensions, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{UsageQuery, UsageReport};

pub(super) async fn usage(
    State(state): State<AppState>,
    headers: HeaderMap,
    extensions: Extensions,
    Query(query): Query<UsageQuery>,
) -> Response {
    // The caller: the admin token reads as a usage admin; otherwise a tenant's token.
    let (me, usage_admin) = if state.is_admin(&headers) {
        (String::new(), true)
    } else {
        match super::authenticate(&state, &headers, &extensions) {
            Some(tenant) => (tenant.name.clone(), tenant.usage_admin),
            None => {
                state.metrics().rejected("unauthorized");
                return ApiError::unauthorized().into_response();
            }
        }
    };
    let range = match query.range(crate::clock::unix_now()) {
        Ok(range) => range,
        Err(e) => return ApiError::bad_request("invalid", e.to_string()).into_response(),
    };
    let whose = match (&query.tenant, usage_admin) {
        (None, true) => None,
        (Some(other), true) => Some(other.as_str()),
        (None, false) => Some(me.as_str()),
        (Some(other), false) if *other == me => Some(me.as_str()),
        (Some(_), false) => {
            return ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "a tenant reads only its own usage (usage_admin in the tenants file reads all)",
            )
            .into_response()
        }
    };
    match state
        .inner
        .orchestrator
        .usage(whose, range.from, range.to, range.group_by)
        .await
    {
        Ok(rows) => Json(UsageReport {
            from: range.from,
            to: range.to,
            group_by: range.group_by,
            rows,
        })
        .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "reading the usage ledger");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "usage_unavailable",
                "the usage ledger could not be read",
            )
            .into_response()
        }
    }
}
