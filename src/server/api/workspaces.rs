//! A tenant's workspaces (`docs/workspaces.md`): `GET /v1/workspaces` lists them (name, size,
//! last use), `DELETE /v1/workspaces/{name}` deletes one no kernel uses. Another tenant's
//! workspace of the same name is never this tenant's: names are scoped by tenant.

use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::Caller;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::workspace::{WorkspaceError, Workspaces};

fn workspaces<'a>(state: &'a AppState, tenant: &str) -> Result<&'a Workspaces, ApiError> {
    state.orchestrator().workspaces().ok_or_else(|| {
        WorkspaceError::Disabled {
            tenant: tenant.to_string(),
        }
        .into()
    })
}

/// True when `headers` mark a request forwarded by a node of this cluster (it is served from
/// this node's own disk, never sent on).
fn hop(state: &AppState, headers: &axum::http::HeaderMap) -> bool {
    state.cluster().is_some_and(|node| {
        headers.contains_key(crate::server::cluster::FORWARDED_HEADER) && node.is_hop(headers)
    })
}

/// `GET /v1/workspaces`: this node's, and on a cluster node the tenant's workspaces on every
/// other live node (docs/workspaces.md, "In a cluster").
pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    headers: axum::http::HeaderMap,
) -> Response {
    let listed = match workspaces(&state, &tenant.name) {
        Ok(ws) => ws.list(&tenant.name).await.map_err(ApiError::from),
        Err(e) => Err(e),
    };
    let mut list = match listed {
        Ok(list) => list,
        Err(e) => return e.into_response(),
    };
    if let Some(node) = state.cluster().filter(|_| !hop(&state, &headers)) {
        match node.workspaces_elsewhere(&tenant.name, &headers).await {
            Ok(more) => list.extend(more),
            Err(e) => return e.into_response(),
        }
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list.dedup_by(|a, b| a.name == b.name);
    }
    Json(crate::wire::WorkspaceList { workspaces: list }).into_response()
}

/// `DELETE /v1/workspaces/{name}`: on a cluster node, served by the node holding it.
pub(super) async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    request: axum::extract::Request,
) -> Response {
    if let Some(node) = state
        .cluster()
        .cloned()
        .filter(|_| !hop(&state, request.headers()))
    {
        if workspaces(&state, &tenant.name).is_ok() {
            use crate::server::cluster::DeleteRoute;
            match node.delete_route(&tenant.name, &name).await {
                Err(e) => return e.into_response(),
                Ok(DeleteRoute::Forward(target)) => {
                    return node.forward_workspace(&target, request).await
                }
                Ok(DeleteRoute::Forgotten) => {
                    return Json(crate::wire::Deleted { deleted: name }).into_response()
                }
                Ok(DeleteRoute::Here) => {}
            }
        }
    }
    let deleted = state
        .orchestrator()
        .delete_workspace(&tenant.name, &name)
        .await
        .map_err(ApiError::from);
    match deleted {
        Ok(()) => Json(crate::wire::Deleted { deleted: name }).into_response(),
        Err(e) => e.into_response(),
    }
}
