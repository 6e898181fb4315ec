//! The multi-tenant HTTP API behind `kernelbox serve` (DESIGN section 7).
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/sessions/{session}/execute` | run a cell (`Accept: application/x-ndjson` streams) |
//! | `POST /v1/sessions/{session}/interrupt` | interrupt the session's running cells |
//! | `DELETE /v1/sessions/{session}` | clear the session's kernels |
//! | `DELETE /v1/sessions/{session}/children/{child}` | release a delegated child |
//! | `GET /v1/kernels` | the caller's tenant's kernels |
//! | `GET /healthz`, `GET /metrics`, `GET /openapi.json` | no authentication |
//!
//! Every authenticated call is namespaced by the caller's tenant (`Authorization: Bearer`),
//! so tenants never see, reach or clear each other's kernels. Errors are
//! `{"error": {"code", "message"}}`.

mod api;
mod error;
mod metrics;
pub mod openapi;
pub mod tenants;
mod tools;

use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tokio_util::sync::CancellationToken;

pub use error::ApiError;
pub use metrics::Metrics;
pub use tenants::{Tenant, Tenants, TenantsError, ToolsConfig};
pub use tools::CELL_TOKEN_HEADER;

use crate::orchestrator::Orchestrator;

/// Largest request body accepted, in bytes (larger ones get 413).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Every route the server answers, as (method, path template). The OpenAPI test checks each.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions/{session}/execute"),
    ("POST", "/v1/sessions/{session}/interrupt"),
    ("DELETE", "/v1/sessions/{session}"),
    ("DELETE", "/v1/sessions/{session}/children/{child}"),
    ("GET", "/v1/kernels"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

struct Inner {
    orchestrator: Orchestrator,
    tenants: Tenants,
    metrics: Arc<Metrics>,
    client: tools::HttpClient,
    draining: AtomicBool,
}

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("orchestrator", &self.inner.orchestrator)
            .field("tenants", &self.inner.tenants.names())
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State serving `tenants` with `orchestrator`.
    pub fn new(orchestrator: Orchestrator, tenants: Tenants) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                orchestrator,
                tenants,
                metrics: Arc::new(Metrics::default()),
                client: tools::client(),
                draining: AtomicBool::new(false),
            }),
        }
    }

    /// The orchestrator behind the API.
    pub fn orchestrator(&self) -> &Orchestrator {
        &self.inner.orchestrator
    }

    /// True once shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }
}

/// The API as an axum router.
pub fn router(state: AppState) -> Router {
    api::router(state)
}

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// in-flight requests finish for up to `drain`, stops whatever still runs, and removes every
/// container and volume of the orchestrator (`Orchestrator::shutdown`).
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    drain: Duration,
) -> std::io::Result<()> {
    let app = router(state.clone());
    let graceful = {
        let shutdown = shutdown.clone();
        let state = state.clone();
        async move {
            shutdown.cancelled().await;
            state.inner.draining.store(true, Ordering::Release);
        }
    };
    let server = axum::serve(listener, app)
        .with_graceful_shutdown(graceful)
        .into_future();
    tokio::pin!(server);
    let deadline = async {
        shutdown.cancelled().await;
        tokio::time::sleep(drain).await;
    };
    let result = tokio::select! {
        result = &mut server => result,
        _ = deadline => {
            tracing::warn!("drain deadline passed; stopping the cells still running");
            state.orchestrator().shutdown().await;
            tokio::time::timeout(Duration::from_secs(10), &mut server)
                .await
                .unwrap_or(Ok(()))
        }
    };
    state.inner.draining.store(true, Ordering::Release);
    state.orchestrator().shutdown().await;
    result
}
