//! The E2B-compatible API (`kernelbox serve --e2b-listen`, docs/e2b.md): E2B's unmodified
//! SDKs (`e2b`, `e2b-code-interpreter`) talk to kernelbox when `E2B_API_URL` and
//! `E2B_SANDBOX_URL` name this listener and `E2B_API_KEY` is a tenant's token.
//!
//! It is a translation onto the server's own paths, never a second implementation: a sandbox is
//! a kernelbox session of the caller's tenant (its id the session's name), its code runs through
//! the execute path of `POST /v1/sessions/{session}/execute` (`api::run_cell`), its files
//! through the orchestrator's file calls, its environment and metadata are the session's
//! settings (`api::settings::apply`); tenancy, caps, the pool, egress, usage and audit apply
//! unchanged.
//!
//! With `E2B_SANDBOX_URL` set, the SDK sends every per-sandbox request to this one listener
//! and names its target with `E2b-Sandbox-Id` and `E2b-Sandbox-Port` (49983 envd, 49999 the
//! code interpreter). The three surfaces' paths do not overlap, so one router serves them all.
//!
//! | route | does |
//! |---|---|
//! | `POST /sandboxes`, `POST /v2/sandboxes` | create a sandbox (`control.rs`) |
//! | `GET /sandboxes/{id}`, `DELETE /sandboxes/{id}` | a sandbox's info; kill it |
//! | `GET /sandboxes`, `GET /v2/sandboxes` | the tenant's sandboxes (metadata query, state, pagination) |
//! | `POST /sandboxes/{id}/timeout` | a new end of life |
//! | `POST /sandboxes/{id}/connect`, `POST /v2/sandboxes/{id}/connect`, `POST /sandboxes/{id}/resume` | reconnect (and extend) |
//! | `POST /sandboxes/{id}/pause`, `.../snapshots`, `.../fork` | E2B-shaped refusals (not available) |
//! | `POST /execute`, `GET`, `POST /contexts`, `DELETE /contexts/{id}`, `POST /contexts/{id}/restart` | the code interpreter (port 49999; `interpreter.rs`) |
//! | `GET`, `POST /files`, `GET /health` | envd's HTTP part (port 49983; `envd.rs`) |
//! | `POST /process.Process/{method}` | envd's process service over Connect: every command a background process of the session (start, connect, list, stdin, signals; `connect.rs`) |
//! | `POST /filesystem.Filesystem/{method}` | envd's filesystem service over Connect: stat, list, mkdir, move, remove, watchers (`filesystem.rs`, `watch.rs`) |
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the router, who calls (`X-API-Key`, a sandbox's access token) |
//! | `error.rs` | [`E2bError`]: an error in E2B's shape, `{"code", "message"}` |
//! | `sandboxes.rs` | [`Facade`]: the sandboxes (id, tenant, metadata, end of life, access token), bounded per tenant and host, and the task that kills them at their end |
//! | `wire.rs` | E2B's request and answer bodies, as its SDKs send and read them |
//! | `control.rs` | the control plane (REST) |
//! | `interpreter.rs` | the code interpreter: a cell's result as E2B's NDJSON lines |
//! | `connect.rs` | envd's process service over Connect RPC: envd's messages (prost), a process's output as frames |
//! | `envd.rs` | envd: files (paths under `/home/user` are the session's `/work`), health |
//! | `rpc.rs` | Connect RPC's plumbing: errors, envelopes, a unary call's JSON |
//! | `filesystem.rs` | envd's `filesystem.Filesystem`, through the kernel's file helper |
//! | `entries.rs` | what the filesystem calls and the watchers share: envd's entries, a stat, a bounded walk |
//! | `watch.rs` | watching a directory by polling its listing: the watchers, their bounds |

mod connect;
mod control;
mod entries;
mod envd;
mod error;
mod filesystem;
mod interpreter;
mod rpc;
mod sandboxes;
mod watch;
mod wire;

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{Method, Uri};
use axum::routing::{delete, get, post};
use axum::{Extension, Router};

pub(crate) use error::E2bError;
pub(crate) use sandboxes::Facade;

use super::tenants::Tenant;
use super::AppState;

/// The header carrying an E2B API key (a tenant's token here).
const API_KEY_HEADER: &str = "x-api-key";
/// The headers carrying a sandbox's access token (envd's, and the code interpreter's
/// traffic token; kernelbox hands out one token for both).
const ACCESS_TOKEN_HEADERS: [&str; 2] = ["x-access-token", "e2b-traffic-access-token"];
/// The header naming the sandbox of a per-sandbox request.
const SANDBOX_ID_HEADER: &str = "e2b-sandbox-id";

/// The E2B API as an axum router, on its own listener.
pub(crate) fn router(state: AppState, facade: Facade) -> Router {
    let router = Router::new()
        .route("/sandboxes", post(control::create).get(control::list_v1))
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes/{id}", get(control::info).delete(control::kill))
        .route("/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::connect))
        .route("/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/snapshots", post(control::snapshot))
        .route("/sandboxes/{id}/fork", post(control::fork))
        .route("/execute", post(interpreter::execute))
        .route(
            "/contexts",
            get(interpreter::list_contexts).post(interpreter::create_context),
        )
        .route("/contexts/{id}", delete(interpreter::remove_context))
        .route("/contexts/{id}/restart", post(interpreter::restart_context))
        .route("/files", get(envd::read).post(envd::write))
        .route("/health", get(envd::health))
        .route(
            "/filesystem.Filesystem/{method}",
            post(filesystem::filesystem),
        )
        .route("/process.Process/{method}", post(connect::process))
        .fallback(unknown_route)
        .layer(Extension(facade))
        .layer(Extension(watch::Watchers::default()));
    super::api::layers(
        router.method_not_allowed_fallback(method_not_allowed),
        state,
    )
}

async fn unknown_route(method: Method, uri: Uri) -> E2bError {
    E2bError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> E2bError {
    E2bError::new(
        axum::http::StatusCode::METHOD_NOT_ALLOWED,
        format!("{method} is not allowed on {}", uri.path()),
    )
}

fn header<'a>(parts: &'a Parts, name: &str) -> Option<&'a str> {
    parts.headers.get(name).and_then(|v| v.to_str().ok())
}

/// The caller of the control plane: the tenant whose token is the request's `X-API-Key`.
pub(crate) struct ApiKey(pub(crate) Arc<Tenant>);

impl FromRequestParts<AppState> for ApiKey {
    type Rejection = E2bError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<ApiKey, E2bError> {
        header(parts, API_KEY_HEADER)
            .and_then(|key| super::api::authenticate_token(state, key, &parts.extensions))
            .map(ApiKey)
            .ok_or_else(|| {
                state.metrics().rejected("unauthorized");
                E2bError::unauthorized()
            })
    }
}

/// The caller of a per-sandbox request (envd, the code interpreter): the sandbox named by
/// `E2b-Sandbox-Id`, which the request's access token opens (or its owner's `X-API-Key`),
/// and its tenant as now (a tenant a reload removed is refused).
pub(crate) struct InSandbox {
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) id: String,
}

impl FromRequestParts<AppState> for InSandbox {
    type Rejection = E2bError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<InSandbox, E2bError> {
        let refuse = || {
            state.metrics().rejected("unauthorized");
            E2bError::unauthorized()
        };
        let Some(facade) = parts.extensions.get::<Facade>().cloned() else {
            return Err(E2bError::internal("the E2B API has no sandboxes table"));
        };
        let Some(id) = header(parts, SANDBOX_ID_HEADER).map(str::to_owned) else {
            return Err(E2bError::bad_request(
                "the E2b-Sandbox-Id header is missing: set E2B_SANDBOX_URL to this address",
            ));
        };
        let tokens: Vec<&str> = ACCESS_TOKEN_HEADERS
            .iter()
            .filter_map(|name| header(parts, name))
            .collect();
        let by_key =
            header(parts, API_KEY_HEADER).and_then(|k| state.inner.tenants.authenticate(k));
        let owner = facade
            .open(&id, &tokens, by_key.as_ref().map(|t| t.name.as_str()))
            .ok_or_else(refuse)?;
        let tenant = state
            .inner
            .tenants
            .current()
            .get(&owner)
            .cloned()
            .ok_or_else(refuse)?;
        let tenant = super::api::admit_tenant(tenant, &parts.extensions);
        Ok(InSandbox { tenant, id })
    }
}
