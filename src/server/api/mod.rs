//! Routes and handlers.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the router, authentication, body and name checks, the handlers |
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
//! | `usage.rs` | `GET /v1/usage`: a tenant's usage ledger, every tenant's for a usage admin (docs/usage.md) |
//! | `tests.rs` | unit tests |

mod access;
mod admin;
pub(crate) mod files;
pub(crate) mod mcp;
mod mcp_backend;
pub(crate) mod mcp_session;
pub(crate) use files::file_request;
mod middleware;
pub(crate) mod pending;
mod processes;
mod routing;
pub(crate) mod settings;
mod snapshots;
pub(crate) mod stream;
mod usage;
mod workspaces;

use stream::stream_execute;

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use http_body_util::BodyExt;

use super::error::ApiError;
use super::tenants::Tenant;
use super::tools::CellDispatcher;
use super::{AppState, MAX_BODY_BYTES};
use crate::authority::ToolDispatcher;
use crate::orchestrator::{CommandRequest, ExecuteRequest, Scope};
use crate::owner::validate_name;
use crate::wire::{self, CommandBody, CommandResult, ExecuteBody, MAX_TASK_ID};

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
pub(super) fn router(state: AppState, metrics_route: MetricsRoute, console: bool) -> Router {
    // A cluster node sends a session's requests to the node holding it (docs/cluster.md).
    let sessions = Router::new()
        .route("/v1/sessions/{session}/execute", post(execute))
        .route("/v1/sessions/{session}/interrupt", post(interrupt))
        .route(
            "/v1/sessions/{session}/network",
            axum::routing::put(network),
        )
        .route(
            "/v1/sessions/{session}/settings",
            axum::routing::put(settings::put).get(settings::get),
        )
        .route("/v1/sessions/{session}/commands", post(command))
        .route(
            "/v1/sessions/{session}/processes",
            post(processes::start).get(processes::list),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}",
            get(processes::get).delete(processes::kill),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/output",
            get(processes::output),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/stdin",
            post(processes::write_stdin).delete(processes::close_stdin),
        )
        .route(
            "/v1/sessions/{session}/processes/{id}/signal",
            post(processes::signal),
        )
        .route("/v1/sessions/{session}", delete(clear))
        .route(
            "/v1/sessions/{session}/children/{child}",
            delete(release_child),
        )
        .route(
            "/v1/sessions/{session}/files/{*path}",
            get(files::get_file)
                .put(files::put_file)
                .delete(files::delete_file),
        )
        .route(
            "/v1/sessions/{session}/files",
            get(files::get_root).put(files::put_root),
        )
        .route(
            "/v1/sessions/{session}/workspace",
            get(files::get_workspace).put(files::put_workspace),
        )
        .route(
            "/v1/sessions/{session}/files/",
            get(files::get_root).put(files::put_root),
        )
        .route("/v1/sessions/{session}/snapshots", post(snapshots::create))
        .route("/v1/sessions/{session}/restore", post(snapshots::restore))
        .route("/v1/sessions/{session}/fork", post(snapshots::fork))
        .route("/v1/mcp", mcp_routes(&state))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            routing::route,
        ));
    let router = Router::new()
        .merge(sessions)
        .route("/v1/admin/reload", post(super::reload::reload_route))
        .route("/v1/whoami", get(admin::whoami))
        .route("/v1/admin/kernels", get(admin::kernels))
        .route("/v1/admin/tenants", get(admin::tenants))
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
            "/v1/nodes/{node}/kernels",
            get(super::cluster::node_kernels),
        )
        .route(
            "/v1/nodes/{node}/migrations",
            post(super::cluster::receive_migration),
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
fn mcp_routes(state: &AppState) -> axum::routing::MethodRouter<AppState> {
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

/// The authenticated caller's tenant.
pub(crate) struct Caller(pub(crate) Arc<Tenant>);

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Caller, ApiError> {
        match authenticate(state, &parts.headers, &parts.extensions) {
            Some(tenant) => Ok(Caller(tenant)),
            None => {
                state.inner.metrics.rejected("unauthorized");
                Err(ApiError::unauthorized())
            }
        }
    }
}

/// The tenant whose token the request carries, if any. The connection then leaves the
/// unauthenticated pool (docs/http-api.md, "Slow and idle clients cannot hold the server")
/// and the response's bytes count against the tenant's budget.
pub(crate) fn authenticate(
    state: &AppState,
    headers: &HeaderMap,
    extensions: &axum::http::Extensions,
) -> Option<Arc<Tenant>> {
    let token = super::tenants::bearer(headers)?;
    authenticate_token(state, token, extensions)
}

/// The tenant whose token is `token`, if any, as [`authenticate`] (the E2B API's `X-API-Key`
/// comes here too).
pub(crate) fn authenticate_token(
    state: &AppState,
    token: &str,
    extensions: &axum::http::Extensions,
) -> Option<Arc<Tenant>> {
    let tenant = state.inner.tenants.authenticate(token)?;
    Some(admit_tenant(tenant, extensions))
}

/// Marks the request as `tenant`'s: its connection leaves the unauthenticated pool, its
/// response's bytes count against the tenant, the access log and the trace name it.
pub(crate) fn admit_tenant(
    tenant: Arc<Tenant>,
    extensions: &axum::http::Extensions,
) -> Arc<Tenant> {
    if let Some(slot) = extensions.get::<super::slots::Promote>() {
        slot.authenticated();
    }
    if let Some(meter) = extensions.get::<Arc<pending::Meter>>() {
        meter.set_tenant(&tenant.name);
    }
    if let Some(who) = extensions.get::<Arc<access::Who>>() {
        who.set_tenant(&tenant.name);
    }
    crate::telemetry::set_current("kernelbox.tenant", || tenant.name.clone());
    tenant
}

pub(crate) fn invalid(state: &AppState, error: ApiError) -> ApiError {
    state.inner.metrics.rejected(match error.status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        _ => "invalid",
    });
    error
}

fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request("invalid_path", e.body_text())
}

fn name(what: &'static str, value: &str) -> Result<(), ApiError> {
    validate_name(what, value).map_err(|e| ApiError::bad_request("invalid_name", e.to_string()))
}

fn one_name(
    state: &AppState,
    path: Result<Path<String>, PathRejection>,
) -> Result<String, ApiError> {
    let Path(session) = path.map_err(|e| invalid(state, path_error(e)))?;
    name("session", &session).map_err(|e| invalid(state, e))?;
    Ok(session)
}

/// Past the limit, the rest of a body is still read (and discarded) up to this size, so the
/// client finishes sending and sees the 413 instead of a reset connection.
const DRAIN_BYTES: usize = 64 * MAX_BODY_BYTES;

/// [`read_body`] for `tenant`, whose token is checked again once the body is in: a reload may
/// have removed the tenant or rotated its token while the body was still arriving
/// (docs/http-api.md, "Reloading the tenants"), and its work must not start then (401).
pub(crate) async fn read_body_of(
    state: &AppState,
    tenant: &Tenant,
    headers: &HeaderMap,
    body: Body,
) -> Result<Bytes, ApiError> {
    let bytes = read_body(headers, body)
        .await
        .map_err(|e| invalid(state, e))?;
    if !state.inner.tenants.holds(tenant) {
        state.inner.metrics.rejected("unauthorized");
        return Err(ApiError::unauthorized());
    }
    Ok(bytes)
}

/// Reads a request body of at most [`MAX_BODY_BYTES`] (413 beyond it).
async fn read_body(headers: &HeaderMap, body: Body) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("request bodies are limited to {MAX_BODY_BYTES} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > DRAIN_BYTES as u64) {
        return Err(too_large());
    }
    let mut body = body;
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let frame = frame
            .map_err(|e| ApiError::bad_request("invalid_body", format!("reading the body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        total += data.len();
        if total <= MAX_BODY_BYTES {
            buf.extend_from_slice(&data);
        } else if total > DRAIN_BYTES {
            break;
        }
    }
    if total > MAX_BODY_BYTES {
        return Err(too_large());
    }
    Ok(Bytes::from(buf))
}

/// A request body, which must be a JSON object: serde would also read a struct from an array
/// of its fields, so anything that does not start with `{` is refused up front.
pub(crate) fn json_object<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let got = match bytes.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => {
            return serde_json::from_slice(bytes)
                .map_err(|e| ApiError::bad_request("invalid_json", format!("request body: {e}")))
        }
        None => "an empty body",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'-' | b'0'..=b'9') => "a number",
        Some(_) => "something that is not JSON",
    };
    Err(ApiError::bad_request(
        "invalid_json",
        format!("the request body must be a JSON object, got {got}"),
    ))
}

/// Turns an execute body into a checked execute request (everything but the sink).
pub(crate) fn parse_execute(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    body: ExecuteBody,
) -> Result<ExecuteRequest, ApiError> {
    if let Some(child) = &body.child {
        name("child", child)?;
    }
    let language = body.language.unwrap_or_default();
    if let Err(e) = language.check_served() {
        return Err(ApiError::bad_request("unsupported_language", e.to_string()));
    }
    let context = match &body.context {
        None => wire::Context::of(language),
        Some(context) => {
            name("context", context)?;
            wire::Context {
                name: context.clone(),
                language,
            }
        }
    };
    let config = state.inner.orchestrator.config();
    let timeout = match body.timeout {
        None => None,
        Some(serde_json::Value::Number(n)) => Some(
            n.as_f64()
                .ok_or_else(|| config.invalid_timeout(&n))
                .and_then(|secs| config.cell_timeout_from_secs(secs))?,
        ),
        Some(other) => return Err(config.invalid_timeout(other).into()),
    };
    if body.task_id.as_ref().is_some_and(|t| t.len() > MAX_TASK_ID) {
        return Err(ApiError::bad_request(
            "invalid_task_id",
            format!("task_id is limited to {MAX_TASK_ID} bytes"),
        ));
    }
    let allowed = tenant.tools.as_ref().map(|t| &t.allow);
    let tools: BTreeSet<String> = match body.tools {
        None => allowed.cloned().unwrap_or_default(),
        Some(list) => {
            for tool in &list {
                if !allowed.is_some_and(|a| a.contains(tool)) {
                    return Err(ApiError::bad_request(
                        "tool_not_allowed",
                        format!(
                            "tool {tool:?} is not on tenant {:?}'s allow-list",
                            tenant.name
                        ),
                    ));
                }
            }
            list.into_iter().collect()
        }
    };
    let dispatcher: Option<Arc<dyn ToolDispatcher>> = match &tenant.tools {
        Some(config) if !tools.is_empty() => Some(Arc::new(CellDispatcher::new(
            state.inner.client.clone(),
            config.clone(),
            state.inner.metrics.clone(),
        ))),
        _ => None,
    };
    Ok(ExecuteRequest {
        scope: Scope {
            tenant: Some(tenant.name.clone()),
            session,
            child: body.child,
            tools,
            tenant_limits: tenant.limits(),
            image: tenant.image.clone(),
            context,
        },
        task_id: body.task_id,
        code: body.code,
        reset: body.reset,
        timeout,
        dispatcher,
        cancel: None,
        sink: None,
        display_sink: None,
    })
}

fn wants_ndjson(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.to_ascii_lowercase().contains("application/x-ndjson"))
}

async fn execute(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
    meter: Option<axum::Extension<Arc<pending::Meter>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let session = one_name(&state, session)?;
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let body: ExecuteBody = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    if !wants_ndjson(&headers) {
        let result = run_cell(&state, &tenant, session, body).await?;
        return Ok(Json(result).into_response());
    }
    let network = body.network.clone().map(|n| (session.clone(), n));
    let request = parse_execute(&state, &tenant, session, body).map_err(|e| invalid(&state, e))?;
    if let Some((session, network)) = &network {
        set_session_network(&state, &tenant, session, network).await?;
    }
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(&state, &tenant)?;
    let meter = match meter {
        Some(axum::Extension(meter)) => meter,
        None => pending::Meter::new(state.inner.pending.clone()),
    };
    // A stream starts only once the request holds a kernel slot, so a refusal at a cap is
    // a 429 rather than a stream carrying only the error.
    let (notice, admitted) = crate::orchestrator::AdmissionNotice::new();
    let response = stream_execute(state.clone(), request, notice, meter);
    if let Ok(Err(e)) = admitted.await {
        return Err(refused(&state, e));
    }
    Ok(response)
}

/// A refusal of the orchestrator as an API error, counted. The caps are the orchestrator's
/// (its registry admits each new kernel); a refusal is 429.
pub(crate) fn refused(state: &AppState, e: crate::orchestrator::ExecuteError) -> ApiError {
    match e {
        crate::orchestrator::ExecuteError::AtCapacity { .. } => {
            state.inner.metrics.rejected("capacity");
        }
        crate::orchestrator::ExecuteError::SessionBusy { .. } => {
            state.inner.metrics.rejected("session_busy");
        }
        _ => {}
    }
    ApiError::from(e)
}

/// A new cell of `tenant` runs only while its responses built and not yet sent are within its
/// budget and everyone's within the host's (docs/reliability.md, "Bounded host resources"):
/// otherwise 429 `too_many_pending_results`, counted.
pub(crate) fn admit(state: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    state.inner.pending.admit(&tenant.name).inspect_err(|_| {
        state.inner.metrics.rejected("pending_results");
    })
}

/// Runs one cell from an execute body (`POST /v1/sessions/{session}/execute`) for `tenant`
/// and returns its result: the one path of a non-streaming execute, shared by that route and
/// MCP's `execute_code` on `/v1/mcp`.
pub(crate) async fn run_cell(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    body: ExecuteBody,
) -> Result<crate::cell::CellResult, ApiError> {
    let network = body.network.clone().map(|n| (session.clone(), n));
    let request = parse_execute(state, tenant, session, body).map_err(|e| invalid(state, e))?;
    if let Some((session, network)) = &network {
        set_session_network(state, tenant, session, network).await?;
    }
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(state, tenant)?;
    let result = state
        .inner
        .orchestrator
        .execute(request)
        .await
        .map_err(|e| refused(state, e))?;
    state.inner.metrics.cell(&result);
    Ok(result)
}

/// `POST /v1/sessions/{session}/commands`: one shell command in the session's kernel
/// container (`docs/contract.md`, "Commands"), answered as JSON or streamed as NDJSON.
async fn command(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
    meter: Option<axum::Extension<Arc<pending::Meter>>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let session = one_name(&state, session)?;
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let body: CommandBody = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    if !wants_ndjson(&headers) {
        let result = run_command(&state, &tenant, session, body).await?;
        return Ok(Json(result).into_response());
    }
    let request = parse_command(&state, &tenant, session, body)?;
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(&state, &tenant)?;
    let meter = match meter {
        Some(axum::Extension(meter)) => meter,
        None => pending::Meter::new(state.inner.pending.clone()),
    };
    Ok(stream::stream_command(state, request, meter))
}

/// Runs one command from a command body (`POST /v1/sessions/{session}/commands`) for `tenant`
/// and returns its result: the one path of a non-streaming command, shared by that route and
/// MCP's `run_command` on `/v1/mcp`.
pub(crate) async fn run_command(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    body: CommandBody,
) -> Result<CommandResult, ApiError> {
    let request = parse_command(state, tenant, session, body)?;
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(state, tenant)?;
    Ok(state.inner.orchestrator.run_command(request).await?)
}

/// A command body as the orchestrator's request, for `tenant`'s session (its tenant limits and
/// image, as an execute's kernel gets them).
fn parse_command(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    body: CommandBody,
) -> Result<CommandRequest, ApiError> {
    let scope = files::kernel_scope(tenant, session, None);
    CommandRequest::from_body(scope, body, state.inner.orchestrator.config())
        .map_err(|e| invalid(state, e.into()))
}

async fn interrupt(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<wire::Interrupted>, ApiError> {
    let session = one_name(&state, session)?;
    // The orchestrator counts the cells that really ended as interrupted.
    match state
        .inner
        .orchestrator
        .interrupt(Some(&tenant.name), &session)
        .await
    {
        0 => Err(ApiError::not_found(format!(
            "session {session:?} has no running cell"
        ))),
        n => Ok(Json(wire::Interrupted { interrupted: n })),
    }
}

/// A session policy that cannot be set, as the API answers it.
fn policy_error(state: &AppState, e: crate::egress::SessionPolicyError) -> ApiError {
    use crate::egress::SessionPolicyError;
    let e = match e {
        SessionPolicyError::Invalid(e) => ApiError::bad_request("invalid_network", e.to_string()),
        e @ SessionPolicyError::TenantHasNone { .. } => {
            ApiError::bad_request("network_not_allowed", e.to_string())
        }
        e @ SessionPolicyError::TooMany { .. } => ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_session_policies",
            e.to_string(),
        ),
    };
    invalid(state, e)
}

/// Sets a session's network policy within its tenant's (`docs/reliability.md`, "Network
/// egress"): kept for the session's kernels, applied at once to the running one and to one
/// starting meanwhile. On a cluster node the catalog keeps it first (docs/cluster.md,
/// "Session policies and settings"), so the session's kernel gets it on any node.
pub(crate) async fn set_session_network(
    state: &AppState,
    tenant: &Tenant,
    session: &str,
    wire: &crate::wire::NetworkPolicy,
) -> Result<usize, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    let policy = orchestrator
        .check_network(&tenant.name, wire)
        .map_err(|e| policy_error(state, e))?;
    let version = match state.cluster() {
        None => None,
        Some(node) => {
            let text = policy
                .as_ref()
                .map(|_| serde_json::to_string(wire))
                .transpose();
            let text = text.map_err(|e| {
                ApiError::bad_request("invalid_network", format!("the policy as JSON: {e}"))
            })?;
            let bytes = policy.as_ref().map_or(0, |(_, bytes)| *bytes);
            let field = crate::cluster::ConfigField::Network(text.as_deref(), bytes);
            let written = node
                .put_session_config(
                    &tenant.name,
                    session,
                    field,
                    crate::egress::MAX_NETWORK_BYTES_PER_TENANT,
                )
                .await?;
            let Some(version) = written else {
                return Err(policy_error(
                    state,
                    crate::egress::SessionPolicyError::TooMany {
                        tenant: tenant.name.clone(),
                        max_bytes: crate::egress::MAX_NETWORK_BYTES_PER_TENANT,
                    },
                ));
            };
            Some(version)
        }
    };
    orchestrator
        .apply_network(&tenant.name, session, policy, version)
        .map_err(|e| policy_error(state, e))
}

/// `PUT /v1/sessions/{session}/network`: the session's policy, applied at once; answers how
/// many of its connections the new policy closed.
async fn network(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<wire::NetworkApplied>, ApiError> {
    let session = one_name(&state, session)?;
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let policy: crate::wire::NetworkPolicy = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    let closed = set_session_network(&state, &tenant, &session, &policy).await?;
    Ok(Json(wire::NetworkApplied { closed }))
}

async fn clear(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<wire::Cleared>, ApiError> {
    let session = one_name(&state, session)?;
    Ok(Json(end_session(&state, &tenant.name, &session).await?))
}

/// Ends `tenant`'s `session`: its kernels, then its own network policy and settings (the
/// session's `DELETE`, and the admin's, `admin.rs`).
async fn end_session(
    state: &AppState,
    tenant: &str,
    session: &str,
) -> Result<wire::Cleared, ApiError> {
    let orchestrator = &state.inner.orchestrator;
    let cleared = orchestrator.clear_session(Some(tenant), session).await;
    // A deleted session's own network policy and settings go with it, once its kernels are
    // gone (docs/http-api.md, "Network policy"): from the catalog too on a cluster node.
    if let Some(node) = state.cluster() {
        node.forget_session_config(tenant, session).await?;
    }
    orchestrator.forget_session_config(tenant, session);
    match cleared {
        0 => Err(ApiError::not_found(format!(
            "session {session:?} has no kernel"
        ))),
        n => Ok(wire::Cleared { cleared: n }),
    }
}

async fn release_child(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    path: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<wire::Released>, ApiError> {
    let Path((session, child)) = path.map_err(|e| invalid(&state, path_error(e)))?;
    name("session", &session).map_err(|e| invalid(&state, e))?;
    name("child", &child).map_err(|e| invalid(&state, e))?;
    match state
        .inner
        .orchestrator
        .release_child(Some(&tenant.name), &session, &child)
        .await
    {
        0 => Err(ApiError::not_found(format!(
            "child {child:?} of session {session:?} has no kernel"
        ))),
        n => Ok(Json(wire::Released { released: n })),
    }
}

async fn healthz(State(state): State<AppState>) -> Response {
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

async fn metrics(State(state): State<AppState>) -> Response {
    let live = state.inner.orchestrator.list_kernels(None).len();
    let stats = state.inner.orchestrator.stats();
    let mut text = state
        .inner
        .metrics
        .render(live, state.is_draining(), &stats);
    let _ = super::metrics::write_tenants(&mut text, &state.inner.orchestrator.tenant_stats());
    let pending = &state.inner.pending;
    let _ = super::metrics::write_responses(&mut text, pending.held(None).0, pending.cut_count());
    if let Some(egress) = state.inner.orchestrator.egress() {
        let _ = super::metrics::write_egress(&mut text, egress);
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
async fn tenant_metrics(state: State<AppState>, _caller: Caller) -> Response {
    metrics(state).await
}

async fn openapi() -> Json<serde_json::Value> {
    Json(super::openapi::spec())
}

#[cfg(test)]
mod tests;
