//! A tenant's workspaces across the cluster (docs/workspaces.md, "In a cluster"):
//! `GET /v1/workspaces` on any node lists the tenant's workspaces of every live node (this
//! node's own, and each other node's as it answers the same call forwarded to it), and
//! `DELETE /v1/workspaces/{name}` is served by the node holding the workspace (forwarded
//! there), as the catalog's `kb_workspaces` places it.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::response::Response;

use super::route::catalog_unavailable;
use super::{ClusterNode, Target};
use crate::server::error::ApiError;
use crate::workspace::{Ledger, WorkspaceSummary};

/// How long another node may take to answer a forwarded workspace call (a delete waits up to
/// 10 s for the workspace's transfer kernels).
pub const WORKSPACE_HOP_DEADLINE: Duration = Duration::from_secs(30);

/// Largest listing read from another node (a tenant's `max` of 100,000 workspaces at about
/// 120 bytes each fits).
pub const MAX_WORKSPACE_LIST_BYTES: usize = 32 << 20;

/// Where a workspace delete is served.
pub(crate) enum DeleteRoute {
    /// Here (this node holds it, or nobody does).
    Here,
    /// At the node holding it.
    Forward(Target),
    /// Its node is not live: the catalog forgot it (that node drops its image when it comes
    /// back); answered as deleted.
    Forgotten,
}

impl ClusterNode {
    /// The workspaces' ledger of this node (`src/cluster/workspaces.rs`).
    pub fn workspace_ledger(&self) -> Arc<dyn Ledger> {
        Arc::new(crate::cluster::WorkspaceLedger::new(
            self.store.clone(),
            self.options.node.clone(),
        ))
    }

    /// The tenant's workspaces on the other live nodes holding any, each node asked with the
    /// caller's own credentials (a forwarded `GET /v1/workspaces`, answered from that node's
    /// disk).
    pub(crate) async fn workspaces_elsewhere(
        self: &Arc<Self>,
        tenant: &str,
        headers: &HeaderMap,
    ) -> Result<Vec<WorkspaceSummary>, ApiError> {
        let nodes = self
            .store
            .workspace_nodes(tenant)
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        let mut all = Vec::new();
        for home in nodes.into_iter().filter(|h| h.node != self.options.node) {
            let target = Target {
                node: home.node,
                epoch: home.epoch,
                advertise: home.advertise,
            };
            let mut request = Request::new(Body::empty());
            *request.method_mut() = Method::GET;
            *request.uri_mut() = axum::http::Uri::from_static("/v1/workspaces");
            if let Some(auth) = headers.get(header::AUTHORIZATION) {
                request
                    .headers_mut()
                    .insert(header::AUTHORIZATION, auth.clone());
            }
            let answer = self
                .forward(&target, request, WORKSPACE_HOP_DEADLINE)
                .await?;
            let status = answer.status();
            let body = axum::body::to_bytes(answer.into_body(), MAX_WORKSPACE_LIST_BYTES)
                .await
                .map_err(|e| node_failed(&target, &format!("its listing: {e}")))?;
            if status != StatusCode::OK {
                return Err(node_failed(
                    &target,
                    &format!(
                        "it answered {status}: {}",
                        String::from_utf8_lossy(&body[..body.len().min(512)])
                    ),
                ));
            }
            #[derive(serde::Deserialize)]
            struct Listing {
                workspaces: Vec<WorkspaceSummary>,
            }
            let listing: Listing = serde_json::from_slice(&body)
                .map_err(|e| node_failed(&target, &format!("its listing: {e}")))?;
            all.extend(listing.workspaces);
        }
        Ok(all)
    }

    /// Where `tenant`'s workspace `name` is deleted.
    pub(crate) async fn delete_route(
        &self,
        tenant: &str,
        name: &str,
    ) -> Result<DeleteRoute, ApiError> {
        let home = self
            .store
            .workspace_home(tenant, name)
            .await
            .map_err(|e| catalog_unavailable(&e.to_string()))?;
        match home {
            Some(home) if home.node != self.options.node && home.live => {
                Ok(DeleteRoute::Forward(Target {
                    node: home.node,
                    epoch: home.epoch,
                    advertise: home.advertise,
                }))
            }
            Some(home) if home.node != self.options.node => {
                self.store
                    .forget_workspace(tenant, name, &home.node, None)
                    .await
                    .map_err(|e| catalog_unavailable(&e.to_string()))?;
                Ok(DeleteRoute::Forgotten)
            }
            _ => Ok(DeleteRoute::Here),
        }
    }

    /// Sends a workspace call to the node holding the workspace.
    pub(crate) async fn forward_workspace(
        self: &Arc<Self>,
        target: &Target,
        request: Request,
    ) -> Response {
        self.forward(target, request, WORKSPACE_HOP_DEADLINE)
            .await
            .unwrap_or_else(axum::response::IntoResponse::into_response)
    }
}

/// Another node's answer to a forwarded workspace call was not usable.
fn node_failed(target: &Target, why: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!(
                "node {:?} holding some of this tenant's workspaces could not list them ({why})",
                target.node
            ),
        )
    }
}
