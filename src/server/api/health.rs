//! The server's own routes: `/healthz`, `/metrics` (public, behind a tenant's token, or on a
//! listener of its own: docs/http-api.md, "Metrics") and `/openapi.json`.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::Caller;
use crate::server::error::ApiError;
use crate::server::AppState;
use crate::wire;

/// `GET /healthz`: ready (200), draining (503), or a cluster node without its lease (503).
pub(super) async fn healthz(State(state): State<AppState>) -> Response {
    if state.is_draining() {
        return ApiError::shutting_down().into_response();
    }
    // A cluster node is ready while it holds its lease (a balancer's health check then
    // routes around a node that fenced itself).
    if let Some(node) = state.cluster() {
        if !node.serving() {
            return ApiError {
                retry_after: Some(1),
                ..ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "node_fenced",
                    "this node does not hold its cluster lease",
                )
            }
            .into_response();
        }
        return Json(wire::Health {
            status: wire::HealthStatus::Ok,
            instance: state.inner.orchestrator.instance_id().to_owned(),
            node: Some(node.name().to_owned()),
            epoch: Some(node.epoch()),
        })
        .into_response();
    }
    Json(wire::Health {
        status: wire::HealthStatus::Ok,
        instance: state.inner.orchestrator.instance_id().to_owned(),
        node: None,
        epoch: None,
    })
    .into_response()
}

/// `GET /metrics`: every tenant's activity, in Prometheus' text format.
pub(super) async fn metrics(State(state): State<AppState>) -> Response {
    let live = state.inner.orchestrator.list_kernels(None).len();
    let stats = state.inner.orchestrator.stats();
    let mut text = state
        .inner
        .metrics
        .render(live, state.is_draining(), &stats);
    let _ =
        crate::server::metrics::write_tenants(&mut text, &state.inner.orchestrator.tenant_stats());
    let pending = &state.inner.pending;
    let _ = crate::server::metrics::write_responses(
        &mut text,
        pending.held(None).0,
        pending.cut_count(),
    );
    if let Some(egress) = state.inner.orchestrator.sessions().egress() {
        let _ = crate::server::metrics::write_egress(&mut text, egress);
    }
    if let Some(node) = state.cluster() {
        let _ = node.render_metrics(&mut text);
        let _ = crate::orchestrator::migration::migrations(&state.inner.orchestrator)
            .render_metrics(&mut text, node.name());
    }
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `/metrics` for a caller with a tenant's token: it shows every tenant's activity.
pub(super) async fn tenant_metrics(state: State<AppState>, _caller: Caller) -> Response {
    metrics(state).await
}

/// `GET /openapi.json`: the API's description (`server/openapi.rs`).
pub(super) async fn openapi() -> Json<serde_json::Value> {
    Json(crate::server::openapi::spec())
}
