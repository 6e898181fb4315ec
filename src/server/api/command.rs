//! `POST /v1/sessions/{session}/commands`: a command body checked into the orchestrator's
//! request (the one path of a command, shared by MCP's `run_command`), run and answered as
//! JSON, or streamed (`stream.rs`).

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::execute::{meter_of, ready};
use super::extract::{invalid, Accepts, JsonBody, SessionName};
use super::{pending, Caller};
use crate::orchestrator::CommandRequest;
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;
use crate::wire::{CommandBody, CommandResult};

/// `POST /v1/sessions/{session}/commands`: one shell command in the session's kernel
/// container (`docs/contract.md`, "Commands"), answered as JSON or streamed as NDJSON.
pub(super) async fn command(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    accepts: Accepts,
    meter: Option<axum::Extension<Arc<pending::Meter>>>,
    JsonBody(body): JsonBody<CommandBody>,
) -> Result<Response, ApiError> {
    if accepts == Accepts::Json {
        let result = run_command(&state, &tenant, session, body).await?;
        return Ok(Json(result).into_response());
    }
    let request = parse_command(&state, &tenant, session, body)?;
    ready(&state, &tenant)?;
    Ok(super::stream::stream_command(
        state.clone(),
        request,
        meter_of(&state, meter),
    ))
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
    ready(state, tenant)?;
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
    let scope = super::files::kernel_scope(tenant, session, None);
    CommandRequest::from_body(scope, body, state.inner.orchestrator.config())
        .map_err(|e| invalid(state, e.into()))
}
