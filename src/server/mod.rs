//! The multi-tenant HTTP API behind `kernelbox serve`.
//!
//! | route | does |
//! |---|---|
//! | `POST /v1/sessions/{session}/execute` | run a cell (`Accept: application/x-ndjson` streams) |
//! | `POST /v1/sessions/{session}/interrupt` | interrupt the session's running cells |
//! | `POST /v1/sessions/{session}/commands` | run a shell command in the session's kernel container (`Accept: application/x-ndjson` streams) |
//! | `PUT /v1/sessions/{session}/network` | the session's own network policy, narrowing its tenant's (`api/mod.rs`) |
//! | `PUT`, `GET /v1/sessions/{session}/settings` | the session's settings: environment, limits, idle timeout, labels (`api/settings.rs`) |
//! | `DELETE /v1/sessions/{session}` | clear the session's kernels |
//! | `DELETE /v1/sessions/{session}/children/{child}` | release a delegated child |
//! | `PUT`, `GET`, `DELETE /v1/sessions/{session}/files/{path}` | files in and out of the session's kernel (`api/files.rs`) |
//! | `PUT`, `GET /v1/sessions/{session}/files` | its whole working directory, as a tar |
//! | `PUT`, `GET /v1/sessions/{session}/workspace` | the session's workspace as a tar, without starting its kernel (`api/files.rs`) |
//! | `GET /v1/kernels` | the caller's tenant's kernels |
//! | `GET /v1/workspaces`, `DELETE /v1/workspaces/{name}` | the tenant's workspaces; deleting one (`api/workspaces.rs`) |
//! | `POST /v1/sessions/{session}/snapshots`, `GET /v1/snapshots`, `GET`, `DELETE /v1/snapshots/{id}` | snapshots of a session's kernel (`api/snapshots.rs`, docs/snapshots.md) |
//! | `POST /v1/sessions/{session}/restore`, `POST /v1/sessions/{session}/fork` | a new session from a snapshot; a session forked into new ones (`api/snapshots.rs`) |
//! | `POST`, `GET /v1/sessions/{session}/processes`, `GET`, `DELETE /v1/sessions/{session}/processes/{id}` | background processes: start, list, one, kill (`api/processes.rs`, docs/processes.md) |
//! | `GET /v1/sessions/{session}/processes/{id}/output`, `POST`, `DELETE /v1/sessions/{session}/processes/{id}/stdin`, `POST /v1/sessions/{session}/processes/{id}/signal` | a process's output (NDJSON), its stdin, a signal |
//! | `GET /v1/usage` | the usage ledger (`api/usage.rs`, docs/usage.md) |
//! | `GET /v1/sessions/{session}/contexts`, `DELETE /v1/sessions/{session}/contexts/{context}` | a session's contexts; ending one (`api/sessions.rs`, docs/contract.md "Languages") |
//! | `GET /v1/sessions/{session}/events`, `GET /v1/admin/tenants/{tenant}/sessions/{session}/events`, `GET /v1/events`, `GET /v1/audit`, `GET /v1/egress/refusals` | what happened lately: a session's kernel events, the sessions with recent events, the audit trail's tail, egress refusals (`api/recent.rs`, docs/console.md) |
//! | `GET /v1/nodes`, `POST`, `DELETE /v1/nodes/{node}/drain`, `GET /v1/nodes/{node}/kernels` | a cluster's nodes; draining one; one node's kernels (the admin token; `cluster/admin.rs`) |
//! | `POST`, `GET`, `DELETE /v1/mcp` | MCP over streamable HTTP (`api/mcp.rs`, docs/mcp.md "MCP") |
//! | `POST /v1/admin/reload` | re-read the tenants and apply them without a restart (the admin token; `reload.rs`) |
//! | `GET /v1/whoami`, `GET /v1/admin/kernels`, `GET /v1/admin/tenants`, `DELETE /v1/admin/tenants/{tenant}/sessions/{session}` | whom a token is; the operator's views and action (the admin token; `api/admin.rs`, docs/console.md) |
//! | `GET /console`, `/console/app.js`, `/console/app.css`, `POST /console/logout` | the operator's console, with `serve --console` (`console/`) |
//! | `GET /healthz`, `GET /openapi.json` | no authentication |
//! | `GET /metrics` | a tenant's token, unless [`ServeOptions::public_metrics`] |
//!
//! `/metrics` can instead be served, to anyone, on a listener of its own
//! ([`ServeOptions::metrics`]).
//!
//! Every authenticated call is namespaced by the caller's tenant (`Authorization: Bearer`),
//! so tenants never see, reach or clear each other's kernels. Errors are
//! `{"error": {"code", "message"}}`.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`ROUTES`], [`AppState`], [`serve_with`] and its [`ServeOptions`] |
//! | `api/` | the router and handlers, the streams and MCP over HTTP (its `mod.rs` says which file does what) |
//! | `cluster/` | the server as a cluster node: the lease and fence, routing, the forward hop, the admin routes (its `mod.rs` has the table) |
//! | `e2b/` | the E2B-compatible API on its own listener (`serve --e2b-listen`, docs/e2b.md; its `mod.rs` has the table) |
//! | `console/` | the operator's console: its page and assets, the token exchanged for a cookie (its `mod.rs` has the table) |
//! | `tenants/` | [`Tenants`]: who may call, with which token and limits (its `mod.rs` has the table) |
//! | `listen.rs` | connections accepted under their bounds ([`Limits`]) |
//! | `slots.rs` | who holds a connection slot: the unauthenticated share, per address, who gives way |
//! | `descriptors.rs` | the open-file limit raised and checked against what serving needs |
//! | `metrics.rs` | [`Metrics`]: the Prometheus exposition |
//! | `tools.rs` | tool calls from a cell forwarded to the tenant's tool endpoint |
//! | `openapi.rs` | `/openapi.json` |
//! | `error/` | [`ApiError`]: an error as the API answers it, and every domain error's answer (its `mod.rs` has the table) |

pub(crate) mod api;
pub mod cluster;
mod console;
pub mod descriptors;
mod e2b;
mod error;
mod listen;
mod metrics;
pub mod openapi;
pub mod reload;
mod slots;
pub mod tenants;
mod tools;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::server::graceful::GracefulShutdown;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use error::ApiError;
pub use listen::Limits;
pub use metrics::Metrics;
pub use tenants::{Tenant, Tenants, TenantsError, ToolsConfig};
pub use tools::CELL_TOKEN_HEADER;

pub use api::mcp::McpOptions;
pub use api::mcp_session::SESSION_HEADER as MCP_SESSION_HEADER;
pub use api::pending::ResponseLimits;

use crate::orchestrator::Orchestrator;

/// Largest request body accepted, in bytes (larger ones get 413).
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Every route the server answers, as (method, path template). The OpenAPI test checks each.
pub const ROUTES: &[(&str, &str)] = &[
    ("POST", "/v1/sessions/{session}/execute"),
    ("POST", "/v1/sessions/{session}/interrupt"),
    ("POST", "/v1/sessions/{session}/commands"),
    ("PUT", "/v1/sessions/{session}/network"),
    ("PUT", "/v1/sessions/{session}/settings"),
    ("GET", "/v1/sessions/{session}/settings"),
    ("DELETE", "/v1/sessions/{session}"),
    ("DELETE", "/v1/sessions/{session}/children/{child}"),
    ("GET", "/v1/sessions/{session}/contexts"),
    ("DELETE", "/v1/sessions/{session}/contexts/{context}"),
    ("PUT", "/v1/sessions/{session}/files/{path}"),
    ("GET", "/v1/sessions/{session}/files/{path}"),
    ("DELETE", "/v1/sessions/{session}/files/{path}"),
    ("PUT", "/v1/sessions/{session}/files"),
    ("GET", "/v1/sessions/{session}/files"),
    ("PUT", "/v1/sessions/{session}/workspace"),
    ("GET", "/v1/sessions/{session}/workspace"),
    ("GET", "/v1/sessions/{session}/events"),
    (
        "GET",
        "/v1/admin/tenants/{tenant}/sessions/{session}/events",
    ),
    ("GET", "/v1/events"),
    ("GET", "/v1/audit"),
    ("GET", "/v1/egress/refusals"),
    ("GET", "/v1/kernels"),
    ("GET", "/v1/workspaces"),
    ("DELETE", "/v1/workspaces/{name}"),
    ("GET", "/v1/usage"),
    ("POST", "/v1/sessions/{session}/snapshots"),
    ("GET", "/v1/snapshots"),
    ("GET", "/v1/snapshots/{id}"),
    ("DELETE", "/v1/snapshots/{id}"),
    ("POST", "/v1/sessions/{session}/restore"),
    ("POST", "/v1/sessions/{session}/fork"),
    ("POST", "/v1/sessions/{session}/processes"),
    ("GET", "/v1/sessions/{session}/processes"),
    ("GET", "/v1/sessions/{session}/processes/{id}"),
    ("DELETE", "/v1/sessions/{session}/processes/{id}"),
    ("GET", "/v1/sessions/{session}/processes/{id}/output"),
    ("POST", "/v1/sessions/{session}/processes/{id}/stdin"),
    ("DELETE", "/v1/sessions/{session}/processes/{id}/stdin"),
    ("POST", "/v1/sessions/{session}/processes/{id}/signal"),
    ("POST", "/v1/admin/reload"),
    ("GET", "/v1/whoami"),
    ("GET", "/v1/admin/kernels"),
    ("GET", "/v1/admin/tenants"),
    ("DELETE", "/v1/admin/tenants/{tenant}/sessions/{session}"),
    ("GET", "/v1/nodes"),
    ("POST", "/v1/nodes/{node}/drain"),
    ("DELETE", "/v1/nodes/{node}/drain"),
    ("GET", "/v1/nodes/{node}/kernels"),
    ("POST", "/v1/mcp"),
    ("GET", "/v1/mcp"),
    ("DELETE", "/v1/mcp"),
    ("GET", "/healthz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
];

struct Inner {
    orchestrator: Orchestrator,
    /// The tenants as now, swapped by a reload (`reload.rs`).
    tenants: tenants::live::LiveTenants,
    /// How the tenants are reloaded, when they can be (`reload.rs`).
    reloader: std::sync::OnceLock<Arc<reload::Reloader>>,
    metrics: Arc<Metrics>,
    client: tools::HttpClient,
    draining: AtomicBool,
    mcp: McpOptions,
    /// Response bytes built and not yet sent, per tenant and for the host.
    pending: Arc<api::pending::Pending>,
    /// Cancelled when the server stops: MCP sessions end and their event streams close.
    mcp_stop: CancellationToken,
    /// The MCP sessions of each `/v1/mcp` service built (`api/mcp.rs`), for a reload to end
    /// a removed tenant's.
    mcp_sessions: std::sync::Mutex<Vec<std::sync::Weak<api::mcp::TenantSessions>>>,
    /// This server as a node of a cluster, when it is one (docs/cluster.md).
    cluster: std::sync::OnceLock<Arc<cluster::ClusterNode>>,
    tracer: std::sync::OnceLock<crate::telemetry::Tracer>,
    /// The admin token's digest, when the server has one (`tenants/admin.rs`).
    admin: std::sync::OnceLock<tenants::AdminToken>,
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
            .field("tenants", &self.inner.tenants.current().names())
            .finish_non_exhaustive()
    }
}

impl AppState {
    /// State serving `tenants` with `orchestrator`.
    pub fn new(orchestrator: Orchestrator, tenants: Tenants) -> AppState {
        AppState::with_mcp(orchestrator, tenants, McpOptions::default())
    }

    /// State serving `tenants` with `orchestrator`, MCP sessions on `/v1/mcp` bounded by `mcp`.
    pub fn with_mcp(orchestrator: Orchestrator, tenants: Tenants, mcp: McpOptions) -> AppState {
        AppState::with_options(orchestrator, tenants, mcp, ResponseLimits::default())
    }

    /// State serving `tenants` with `orchestrator`, MCP sessions bounded by `mcp`, response
    /// bytes in flight and slow readers by `responses` (docs/reliability.md).
    pub fn with_options(
        orchestrator: Orchestrator,
        tenants: Tenants,
        mcp: McpOptions,
        responses: ResponseLimits,
    ) -> AppState {
        AppState {
            inner: Arc::new(Inner {
                orchestrator,
                tenants: tenants::live::LiveTenants::new(tenants),
                reloader: std::sync::OnceLock::new(),
                metrics: Arc::new(Metrics::default()),
                client: tools::client(),
                draining: AtomicBool::new(false),
                mcp,
                pending: Arc::new(api::pending::Pending::new(responses)),
                mcp_stop: CancellationToken::new(),
                mcp_sessions: std::sync::Mutex::new(Vec::new()),
                cluster: std::sync::OnceLock::new(),
                tracer: std::sync::OnceLock::new(),
                admin: std::sync::OnceLock::new(),
            }),
        }
    }

    pub(crate) fn mcp_options(&self) -> McpOptions {
        self.inner.mcp
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }

    pub(crate) fn mcp_stop(&self) -> &CancellationToken {
        &self.inner.mcp_stop
    }

    /// The orchestrator behind the API.
    pub fn orchestrator(&self) -> &Orchestrator {
        &self.inner.orchestrator
    }

    /// Makes this server a node of `node`'s cluster (before it serves; once).
    pub fn join_cluster(&self, node: Arc<cluster::ClusterNode>) {
        if self.inner.cluster.set(node).is_err() {
            tracing::warn!("this server is already a cluster node");
        }
    }

    /// Traces every request with `tracer` from now on (`docs/usage.md`, "Traces"); set once.
    pub fn trace_with(&self, tracer: crate::telemetry::Tracer) {
        if self.inner.tracer.set(tracer).is_err() {
            tracing::warn!("this server already traces its requests");
        }
    }

    /// Answers the admin token (`--admin-token`) on the operator's routes from now on (set
    /// once, before serving; a blank token is none).
    pub fn admin_with(&self, token: &str) {
        if let Some(admin) = tenants::AdminToken::new(token) {
            if self.inner.admin.set(admin).is_err() {
                tracing::warn!("this server already has an admin token");
            }
        }
    }

    /// True when the server has an admin token.
    pub(crate) fn has_admin(&self) -> bool {
        self.inner.admin.get().is_some()
    }

    /// True when `headers` carry the admin token.
    pub(crate) fn is_admin(&self, headers: &axum::http::HeaderMap) -> bool {
        tenants::bearer(headers).is_some_and(|token| self.admin_token_is(token))
    }

    /// True when `token` is the admin token.
    pub(crate) fn admin_token_is(&self, token: &str) -> bool {
        self.inner.admin.get().is_some_and(|admin| admin.is(token))
    }

    /// The tenants as now.
    pub(crate) fn tenants(&self) -> &tenants::live::LiveTenants {
        &self.inner.tenants
    }

    pub(crate) fn tracer(&self) -> Option<&crate::telemetry::Tracer> {
        self.inner.tracer.get()
    }

    /// The cluster this server is a node of, if any.
    pub fn cluster(&self) -> Option<&Arc<cluster::ClusterNode>> {
        self.inner.cluster.get()
    }

    /// How long a forwarded request may wait for its answer's head: the longest a cell may
    /// run, plus the time to start its kernel, plus a minute.
    pub(crate) fn forward_deadline(&self) -> Duration {
        let config = self.inner.orchestrator.config();
        config.cells.max_timeout + config.kernels.spawn_timeout + Duration::from_secs(60)
    }

    /// True once shutdown has begun.
    pub fn is_draining(&self) -> bool {
        self.inner.draining.load(Ordering::Acquire)
    }
}

/// The API as an axum router (with `/metrics`, for callers with a tenant's token).
pub fn router(state: AppState) -> Router {
    api::router(state, api::MetricsRoute::Authenticated, false)
}

/// [`router`] with the operator's console at `/console` (`serve --console`, docs/console.md).
pub fn router_with_console(state: AppState) -> Router {
    api::router(state, api::MetricsRoute::Authenticated, true)
}

/// How [`serve_with`] runs: the drain deadline, connection bounds, and an optional separate
/// listener for `/metrics`.
#[derive(Debug)]
pub struct ServeOptions {
    /// On shutdown, how long in-flight requests may take to finish.
    pub drain: Duration,
    /// Header, body, keep-alive and connection-count bounds, shared by every listener.
    pub limits: Limits,
    /// When set, `/metrics` is served only on this listener, to anyone (every other path
    /// there is 404), and answers 404 on the API listener.
    pub metrics: Option<tokio::net::TcpListener>,
    /// Without a metrics listener, whether `/metrics` on the API listener is served to anyone
    /// (`true`) or only with a tenant's token (`false`, the default: it shows every tenant's
    /// activity).
    pub public_metrics: bool,
    /// When set, the E2B-compatible API (`e2b/`, docs/e2b.md) on a listener of its own,
    /// under the same connection bounds and slots as the API listener.
    pub e2b: Option<tokio::net::TcpListener>,
    /// Serve the operator's console at `/console` (docs/console.md; default `false`).
    pub console: bool,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            drain: Duration::from_secs(30),
            limits: Limits::default(),
            metrics: None,
            public_metrics: false,
            e2b: None,
            console: false,
        }
    }
}

/// Serves the API on `listener` until `shutdown` is cancelled, then stops accepting, lets
/// in-flight requests and running cells (those whose client went away included) finish for up
/// to `drain`, stops whatever still runs, and removes every
/// container and volume of the orchestrator (`Orchestrator::shutdown`). Connection bounds are
/// [`Limits::default`]; see [`serve_with`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    drain: Duration,
) -> std::io::Result<()> {
    let options = ServeOptions {
        drain,
        ..ServeOptions::default()
    };
    serve_with(listener, state, shutdown, options).await
}

/// [`serve`] with explicit options: connection bounds ([`Limits`]) and an optional separate
/// metrics listener.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: AppState,
    shutdown: CancellationToken,
    options: ServeOptions,
) -> std::io::Result<()> {
    let ServeOptions {
        drain,
        limits,
        metrics,
        public_metrics,
        e2b: e2b_listener,
        console,
    } = options;
    if let Some(problem) = limits.problem() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("serving HTTP: {problem}"),
        ));
    }
    let metrics_route = match (&metrics, public_metrics) {
        (Some(_), _) => api::MetricsRoute::Absent,
        (None, true) => api::MetricsRoute::Public,
        (None, false) => api::MetricsRoute::Authenticated,
    };
    let api = api::router(state.clone(), metrics_route, console);
    let metrics_app = api::metrics_router(state.clone());
    let e2b_facade = e2b_listener.as_ref().map(|_| e2b::Facade::start(&state));
    let e2b_app = match &e2b_facade {
        Some(facade) => e2b::router(state.clone(), facade.clone()),
        None => Router::new(),
    };
    let slots = slots::Slots::new(limits.caps());
    let graceful = GracefulShutdown::new();
    let tracker = TaskTracker::new();
    let stop = CancellationToken::new();
    loop {
        let (accepted, app) = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => (accepted, &api),
            accepted = accept(metrics.as_ref()) => (accepted, &metrics_app),
            accepted = accept(e2b_listener.as_ref()) => (accepted, &e2b_app),
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                if !is_connection_error(&e) {
                    // Out of descriptors or similar: back off briefly instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::select! {
                        _ = shutdown.cancelled() => break,
                        _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                    }
                }
                continue;
            }
        };
        let slot = match slots.admit(peer.ip()) {
            Ok((slot, evicted)) => {
                if evicted {
                    state.inner.metrics.rejected("connection_evicted");
                }
                slot
            }
            Err(refusal) => {
                state.inner.metrics.rejected(match refusal {
                    slots::Refusal::Full => "connections",
                    slots::Refusal::PerAddress => "connections_per_address",
                });
                listen::refuse(stream);
                continue;
            }
        };
        tracker.spawn(listen::drive(listen::Conn {
            stream,
            app: app.clone(),
            limits,
            watcher: graceful.watcher(),
            stop: stop.clone(),
            slot,
        }));
        // Let the new connection read what it was sent before the next accept: a burst of
        // accepts must not push it out of its slot before its driver first looked at its
        // head (src/server/slots.rs; docs/http-api.md, "Slow and idle clients cannot hold the
        // server").
        tokio::task::yield_now().await;
    }
    state.inner.draining.store(true, Ordering::Release);
    // MCP event streams would otherwise hold their connections through the whole drain.
    state.inner.mcp_stop.cancel();
    drop(listener);
    drop(metrics);
    drop(e2b_listener);
    // In-flight requests finish, and so do cells whose client went away (they run adopted,
    // with no connection to wait for): the orchestrator says when none is running.
    let orchestrator = state.orchestrator().clone();
    let drained = async move {
        graceful.shutdown().await;
        orchestrator.wait_no_running_cells().await;
    };
    tokio::pin!(drained);
    tokio::select! {
        _ = &mut drained => {}
        _ = tokio::time::sleep(drain) => {
            tracing::warn!("drain deadline passed; stopping the cells still running");
            state.orchestrator().shutdown().await;
            let _ = tokio::time::timeout(Duration::from_secs(10), &mut drained).await;
        }
    }
    stop.cancel();
    tracker.close();
    tracker.wait().await;
    if let Some(facade) = e2b_facade {
        facade.stop().await;
    }
    state.orchestrator().shutdown().await;
    if let Some(node) = state.cluster() {
        node.leave().await;
    }
    Ok(())
}

async fn accept(
    listener: Option<&tokio::net::TcpListener>,
) -> std::io::Result<(tokio::net::TcpStream, std::net::SocketAddr)> {
    match listener {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// Errors that concern one connection only, not the listener.
fn is_connection_error(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::ConnectionReset
    )
}

#[cfg(test)]
mod route_table_tests {
    /// Every route of [`super::ROUTES`] has its row in the module's route table: a row naming
    /// its path as a whole (the path closes a code span) and its method.
    #[test]
    fn the_route_table_lists_every_route() {
        let rows: Vec<&str> = include_str!("mod.rs")
            .lines()
            .filter(|l| l.starts_with("//! | `"))
            .collect();
        for (method, path) in super::ROUTES {
            let listed = rows.iter().any(|row| {
                let first = row.split(" | ").nth(1).unwrap_or_default();
                first.contains(&format!("{path}`")) && first.contains(method)
            });
            assert!(
                listed,
                "{method} {path} has no row in src/server/mod.rs's route table"
            );
        }
    }
}
