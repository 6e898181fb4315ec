//! `GET /v1/usage` (`docs/usage.md`, "Reading the ledger"): a tenant reads its own usage; a
//! tenant marked `usage_admin` in the tenants file reads every tenant's, or one's.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::Caller;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{UsageQuery, UsageReport};

pub(super) async fn usage(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Query(query): Query<UsageQuery>,
) -> Response {
    let range = match query.range(crate::clock::unix_now()) {
        Ok(range) => range,
        Err(e) => return ApiError::bad_request("invalid", e.to_string()).into_response(),
    };
    let whose = match (&query.tenant, tenant.usage_admin) {
        (None, true) => None,
        (Some(other), true) => Some(other.as_str()),
        (None, false) => Some(tenant.name.as_str()),
        (Some(other), false) if *other == tenant.name => Some(tenant.name.as_str()),
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
