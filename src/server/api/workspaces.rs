//! A tenant's workspaces (`docs/workspaces.md`): `GET /v1/workspaces` lists them (name, size,
//! last use), `DELETE /v1/workspaces/{name}` deletes one no kernel uses. Another tenant's
//! workspace of the same name is never this tenant's: names are scoped by tenant.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::Caller;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::workspace::{WorkspaceError, Workspaces};

impl From<WorkspaceError> for ApiError {
    fn from(e: WorkspaceError) -> ApiError {
        match &e {
            WorkspaceError::NotFound { .. } | WorkspaceError::Disabled { .. } => {
                ApiError::new(StatusCode::NOT_FOUND, "workspace_not_found", e.to_string())
            }
            WorkspaceError::InUse { .. } => {
                ApiError::new(StatusCode::CONFLICT, "workspace_in_use", e.to_string())
            }
            WorkspaceError::TooMany { .. } => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_workspaces",
                e.to_string(),
            ),
            WorkspaceError::HostFull { .. } => ApiError::new(
                StatusCode::INSUFFICIENT_STORAGE,
                "workspaces_full",
                e.to_string(),
            ),
            WorkspaceError::Io { .. } | WorkspaceError::Tool { .. } | WorkspaceError::Engine(_) => {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "workspace_unavailable",
                    e.to_string(),
                )
            }
        }
    }
}

fn workspaces<'a>(state: &'a AppState, tenant: &str) -> Result<&'a Workspaces, ApiError> {
    state.orchestrator().workspaces().ok_or_else(|| {
        WorkspaceError::Disabled {
            tenant: tenant.to_string(),
        }
        .into()
    })
}

/// `GET /v1/workspaces`.
pub(super) async fn list(State(state): State<AppState>, Caller(tenant): Caller) -> Response {
    let listed = match workspaces(&state, &tenant.name) {
        Ok(ws) => ws.list(&tenant.name).await.map_err(ApiError::from),
        Err(e) => Err(e),
    };
    match listed {
        Ok(list) => Json(json!({ "workspaces": list })).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `DELETE /v1/workspaces/{name}`.
pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Response {
    let deleted = state
        .orchestrator()
        .delete_workspace(&tenant.name, &name)
        .await
        .map_err(ApiError::from);
    match deleted {
        Ok(()) => Json(json!({ "deleted": name })).into_response(),
        Err(e) => e.into_response(),
    }
}
