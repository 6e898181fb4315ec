//! The cluster's admin routes (docs/cluster.md, "Admin"), behind the admin token
//! (`--admin-token`): `GET /v1/nodes` lists the nodes with their leases, kernels and
//! capacity; `POST /v1/nodes/{node}/drain` stops new sessions being placed on a node (its
//! sessions end by idle reap or on request; it reports 0 live kernels when empty), `DELETE`
//! takes that back; `GET /v1/nodes/{node}/kernels` lists a node's kernels, every tenant's
//! (served by that node: this one forwards it there), for `kernelbox ps --url`. Without a
//! cluster, or without an admin token, they are 404.

use axum::extract::{Path, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;

use crate::cluster::NodeState;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire::{NodeDrain, NodeEntry, NodeKernels, NodeList, NodeStatus};

use super::ClusterNode;

/// The node, when the request carries the admin token.
fn admin(state: &AppState, headers: &HeaderMap) -> Result<std::sync::Arc<ClusterNode>, ApiError> {
    let node = state
        .cluster()
        .filter(|n| n.admin_sha256.is_some())
        .cloned()
        .ok_or_else(|| {
            ApiError::not_found(
                "no cluster admin here: serve with --cluster and --admin-token".to_string(),
            )
        })?;
    match crate::server::tenants::bearer(headers) {
        Some(token) if node.is_admin(token) => Ok(node),
        _ => Err(ApiError::unauthorized()),
    }
}

/// `GET /v1/nodes`.
pub(crate) async fn list_nodes(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Json<NodeList>, ApiError> {
    let node = admin(&state, &headers)?;
    let rows = node.store.nodes().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "catalog_unavailable",
            e.to_string(),
        )
    })?;
    let nodes = rows
        .into_iter()
        .map(|r| NodeEntry {
            name: r.name,
            advertise: r.advertise,
            epoch: r.epoch,
            state: match r.state {
                NodeState::Live => NodeStatus::Live,
                NodeState::Expired => NodeStatus::Expired,
                NodeState::Left => NodeStatus::Left,
            },
            draining: r.draining,
            capacity: r.capacity,
            live_kernels: r.live_kernels,
            lease_age_seconds: r.lease_age.as_secs_f64(),
            lease_ttl_seconds: r.lease_ttl.as_secs_f64(),
        })
        .collect();
    Ok(Json(NodeList {
        this: node.name().to_owned(),
        nodes,
    }))
}

/// `POST` (drain) and `DELETE` (undrain) `/v1/nodes/{node}/drain`.
pub(crate) async fn drain_node(
    State(state): State<AppState>,
    method: axum::http::Method,
    headers: HeaderMap,
    Path(name): Path<String>,
) -> Result<Json<NodeDrain>, ApiError> {
    let node = admin(&state, &headers)?;
    let draining = method == axum::http::Method::POST;
    let found = node
        .store
        .set_draining(&name, draining)
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "catalog_unavailable",
                e.to_string(),
            )
        })?;
    if !found {
        return Err(ApiError::not_found(format!("no node named {name:?}")));
    }
    Ok(Json(NodeDrain {
        node: name,
        draining,
    }))
}

/// `GET /v1/nodes/{node}/kernels`: the node's live kernels, every tenant's.
pub(crate) async fn node_kernels(
    State(state): State<AppState>,
    Path(name): Path<String>,
    request: Request,
) -> Result<axum::response::Response, ApiError> {
    use axum::response::IntoResponse;
    let node = admin(&state, request.headers())?;
    if name == node.name() {
        let kernels = state.orchestrator().list_kernels(None);
        return Ok(Json(NodeKernels {
            node: name,
            kernels,
        })
        .into_response());
    }
    if request.headers().contains_key(super::FORWARDED_HEADER) {
        return Err(ApiError::new(
            StatusCode::MISDIRECTED_REQUEST,
            "second_hop_refused",
            format!("this node is {:?}, not {name:?}", node.name()),
        ));
    }
    let rows = node.store.nodes().await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "catalog_unavailable",
            e.to_string(),
        )
    })?;
    let row = rows
        .into_iter()
        .find(|r| r.name == name)
        .ok_or_else(|| ApiError::not_found(format!("no node named {name:?}")))?;
    let target = super::Target {
        node: row.name,
        epoch: row.epoch,
        advertise: row.advertise,
    };
    node.forward(&target, request, std::time::Duration::from_secs(10))
        .await
}
