//! Routes and handlers.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the router: every route, and whether it may start the session's kernel (`routing.rs` claims the session for those) |
//! | `auth.rs` | authentication, once per request on a node: [`Caller`] |
//! | `extract.rs` | what a handler takes from a request, checked at the edge: the session name, a JSON body within its bound, a stream or not |
//! | `execute.rs` | `POST .../execute`: an execute body into the orchestrator's request, run or streamed (MCP and the E2B API share the path) |
//! | `command.rs` | `POST .../commands`: a command, run or streamed (MCP shares the path) |
//! | `sessions.rs` | a session's own routes: interrupt, network policy, end, release a child, list and end its contexts |
//! | `health.rs` | `/healthz`, `/metrics`, `/openapi.json` |
//! | `admin.rs` | the operator's routes: `GET /v1/whoami`, `/v1/admin/kernels` (a page of every tenant's), `/v1/admin/tenants`, an admin ending any tenant's session (docs/console.md) |
//! | `access.rs` | the request id (in, out, forwarded, on the spans) and the access log (docs/logs.md) |
//! | `routing.rs` | a cluster node's middleware on `/v1/sessions/...`: a session held by another node is forwarded there (docs/cluster.md, "Routing") |
//! | `middleware.rs` | what wraps every route: panics become 500s, refusals of requests with a body close the connection |
//! | `files.rs` | files in and out of a session's kernel: PUT, GET (file, listing, tar), DELETE |
//! | `stream.rs` | a streaming (NDJSON) execute or command: its events (`src/wire/event.rs`) under a backlog cap, then the result |
//! | `mcp.rs` | `/v1/mcp`: MCP over streamable HTTP behind the tenant's bearer token, MCP sessions bound to tenants, their kernels cleared when they end |
//! | `mcp_session.rs` | which kernelbox session a `/v1/mcp` request runs in |
//! | `pending.rs` | response bytes in flight per tenant and for the host, and the minimum rate every response body is read at |
//! | `mcp_backend.rs` | the MCP tools' backend on `/v1/mcp`: the execute and command paths and file calls below, for the caller's tenant |
//! | `processes.rs` | background processes (`docs/processes.md`): start, list, one, kill, output (NDJSON), stdin, signal |
//! | `workspaces.rs` | a tenant's workspaces: list, delete (`docs/workspaces.md`) |
//! | `settings.rs` | a session's settings (`PUT`/`GET .../settings`) and `GET /v1/kernels?label=` |
//! | `snapshots.rs` | snapshots, restore and fork: `POST .../snapshots`, `GET`/`DELETE /v1/snapshots[/{id}]`, `POST .../restore`, `POST .../fork` (`docs/snapshots.md`) |
//! | `recent.rs` | what happened lately: sessions' kernel events (`GET /v1/events`, `.../sessions/{session}/events`), the audit trail's tail (`GET /v1/audit`), egress refusals (`GET /v1/egress/refusals`) (docs/console.md) |
//! | `usage.rs` | `GET /v1/usage`: a tenant's usage ledger, every tenant's for a usage admin (docs/usage.md) |
//! | `tests.rs` | unit tests |

mod access;
mod admin;
mod auth;
mod command;
mod execute;
mod extract;
pub(crate) mod files;
mod health;
pub(crate) mod mcp;
mod mcp_backend;
pub(crate) mod mcp_session;
pub(crate) use files::file_request;
mod middleware;
pub(crate) mod pending;
mod processes;
mod recent;
mod routing;
mod sessions;
pub(crate) mod settings;
mod snapshots;
pub(crate) mod stream;
mod usage;
mod workspaces;

pub(crate) use auth::{admit_tenant, authenticate, authenticate_token, Caller};
pub(crate) use command::run_command;
pub(crate) use execute::{admit, parse_execute, refused, run_cell};
pub(crate) use extract::{invalid, json_object, read_body_of};
use extract::{name, one_name, path_error};
pub(crate) use sessions::end_session;

use axum::extract::DefaultBodyLimit;
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{delete, get, post, put, MethodRouter};
use axum::Router;

use super::error::ApiError;
use super::{AppState, MAX_BODY_BYTES};
use health::{healthz, metrics, openapi, tenant_metrics};
use routing::Declared;

/// How the API listener serves `/metrics` (docs/http-api.md, "Metrics").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MetricsRoute {
    /// Left out (404): it is served on a listener of its own.
    Absent,
    /// To a caller with a tenant's token (401 otherwise).
    Authenticated,
    /// To anyone.
    Public,
}

/// The API, with `/metrics` as `metrics_route` says, and the console when `console`.
///
/// Every route of a session says whether it may start the session's kernel (`starts`: an
/// execute, a command, a process, an upload, a restore or a fork) or only finds the kernel
/// it names (`finds`): on a cluster node that decides whether the node claims the session
/// or forwards the request to the node holding it (`routing.rs`, docs/cluster.md "Routing").
pub(super) fn router(state: AppState, metrics_route: MetricsRoute, console: bool) -> Router {
    let starts = |route: MethodRouter<AppState>| routing::declare(route, &state, Declared::Starts);
    let finds = |route: MethodRouter<AppState>| routing::declare(route, &state, Declared::Finds);
    let sessions = Router::new()
        .route(
            "/v1/sessions/{session}/execute",
            starts(post(execute::execute)),
        )
        .route(
            "/v1/sessions/{session}/commands",
            starts(post(command::command)),
        )
        .route(
            "/v1/sessions/{session}/interrupt",
            finds(post(sessions::interrupt)),
        )
        .route(
            "/v1/sessions/{session}/events",
            finds(get(recent::own_session_events)),
        )
        .route(
            "/v1/sessions/{session}/network",
            finds(put(sessions::network)),
        )
        .route(
            "/v1/sessions/{session}/settings",
            finds(put(settings::put).get(settings::get)),
        )
        .route(
            "/v1/sessions/{session}/processes",
            starts(post(processes::start)).merge(finds(get(processes::list))),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}",
            finds(get(processes::get).delete(processes::kill)),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/output",
            finds(get(processes::output)),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/stdin",
            finds(post(processes::write_stdin).delete(processes::close_stdin)),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/signal",
            finds(post(processes::signal)),
        )
        .route("/v1/sessions/{session}", finds(delete(sessions::clear)))
        .route(
            "/v1/sessions/{session}/children/{child}",
            finds(delete(sessions::release_child)),
        )
        .route(
            "/v1/sessions/{session}/contexts",
            finds(get(sessions::list_contexts)),
        )
        .route(
            "/v1/sessions/{session}/contexts/{context}",
            finds(delete(sessions::end_context)),
        )
        .route(
            "/v1/sessions/{session}/files/{*path}",
            starts(put(files::put_file))
                .merge(finds(get(files::get_file).delete(files::delete_file))),
        )
        .route(
            "/v1/sessions/{session}/files",
            starts(put(files::put_root)).merge(finds(get(files::get_root))),
        )
        .route(
            "/v1/sessions/{session}/workspace",
            starts(put(files::put_workspace)).merge(finds(get(files::get_workspace))),
        )
        .route(
            "/v1/sessions/{session}/files/",
            starts(put(files::put_root)).merge(finds(get(files::get_root))),
        )
        .route(
            "/v1/sessions/{session}/snapshots",
            starts(post(snapshots::create)),
        )
        .route(
            "/v1/sessions/{session}/restore",
            starts(post(snapshots::restore)),
        )
        .route("/v1/sessions/{session}/fork", starts(post(snapshots::fork)))
        .route(
            "/v1/mcp",
            routing::declare(mcp_routes(&state), &state, Declared::Mcp),
        );
    let router = Router::new()
        .merge(sessions)
        .route("/v1/admin/reload", post(super::reload::reload_route))
        .route("/v1/whoami", get(admin::whoami))
        .route("/v1/admin/kernels", get(admin::kernels))
        .route("/v1/admin/tenants", get(admin::tenants))
        .route(
            "/v1/admin/tenants/{tenant}/sessions/{session}/events",
            get(recent::admin_session_events),
        )
        .route("/v1/events", get(recent::recent_events))
        .route("/v1/audit", get(recent::audit_tail))
        .route("/v1/egress/refusals", get(recent::egress_refusals))
        .route(
            "/v1/admin/tenants/{tenant}/sessions/{session}",
            delete(admin::end_session),
        )
        .route("/v1/nodes", get(super::cluster::list_nodes))
        .route(
            "/v1/nodes/{node}/drain",
            post(super::cluster::drain_node).delete(super::cluster::drain_node),
        )
        .route(
            "/v1/nodes/{node}/migrations",
            post(super::cluster::receive_migration),
        )
        .route(
            "/v1/nodes/{node}/kernels",
            get(super::cluster::node_kernels),
        )
        .route("/v1/kernels", get(settings::kernels))
        .route("/v1/workspaces", get(workspaces::list))
        .route("/v1/workspaces/{name}", delete(workspaces::delete))
        .route("/v1/usage", get(usage::usage))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{id}",
            get(snapshots::get).delete(snapshots::delete),
        )
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi));
    let router = match metrics_route {
        MetricsRoute::Absent => router,
        MetricsRoute::Authenticated => router.route("/metrics", get(tenant_metrics)),
        MetricsRoute::Public => router.route("/metrics", get(metrics)),
    };
    let router = match console {
        true => super::console::mount(router),
        false => router,
    };
    finish(router, state)
}

/// `/v1/mcp`: POST, GET and DELETE go to the MCP service (`mcp.rs`).
fn mcp_routes(state: &AppState) -> MethodRouter<AppState> {
    let service = mcp::service(state);
    let (get_service, delete_service) = (service.clone(), service.clone());
    post(move |state, caller, request| mcp::handle(service, state, caller, request))
        .get(move |state, caller, request| mcp::handle(get_service, state, caller, request))
        .delete(move |state, caller, request| mcp::handle(delete_service, state, caller, request))
}

/// The separate metrics listener: `/metrics` only.
pub(super) fn metrics_router(state: AppState) -> Router {
    finish(Router::new().route("/metrics", get(metrics)), state)
}

fn finish(router: Router<AppState>, state: AppState) -> Router {
    let router = router
        .fallback(unknown_route)
        .method_not_allowed_fallback(method_not_allowed);
    layers(router, state)
}

/// What wraps every route of every listener (the E2B API's too, `server/e2b/`): the body
/// limit, panics as 500s, closing after a refusal, the response count, the access log and
/// the request's trace.
pub(crate) fn layers(router: Router<AppState>, state: AppState) -> Router {
    router
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(middleware::catch_panic))
        .layer(axum::middleware::from_fn(middleware::close_after_refusal))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::count_responses,
        ))
        .layer(axum::middleware::from_fn(access::log_access))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            middleware::trace_request,
        ))
        .with_state(state)
}

async fn unknown_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{method} is not allowed on {}", uri.path()),
    )
}

#[cfg(test)]
mod tests;
