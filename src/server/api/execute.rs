//! `POST /v1/sessions/{session}/execute`: an execute body checked into the orchestrator's
//! request (the one path of a cell, shared by MCP's `execute_code` and the E2B API's
//! `run_code`), run and answered as JSON, or streamed (`stream.rs`).

use std::collections::BTreeSet;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::extract::{invalid, name, Accepts, JsonBody, SessionName};
use super::stream::stream_execute;
use super::{pending, Caller};
use crate::authority::ToolDispatcher;
use crate::orchestrator::{ExecuteRequest, Scope};
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::tools::CellDispatcher;
use crate::server::AppState;
use crate::wire::{self, ExecuteBody, MAX_TASK_ID};

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
    let (tools, dispatcher) = tools_of(state, tenant, body.tools)?;
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

/// The tools a cell may call (those asked for, each on the tenant's allow-list, or all of
/// them) and the dispatcher that forwards its calls, when it may call any.
#[allow(clippy::type_complexity)]
fn tools_of(
    state: &AppState,
    tenant: &Tenant,
    asked: Option<Vec<String>>,
) -> Result<(BTreeSet<String>, Option<Arc<dyn ToolDispatcher>>), ApiError> {
    let allowed = tenant.tools.as_ref().map(|t| &t.allow);
    let tools: BTreeSet<String> = match asked {
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
    Ok((tools, dispatcher))
}

/// `POST /v1/sessions/{session}/execute`: one cell in the session's kernel (started when it
/// has none), answered as JSON or streamed as NDJSON (`stream.rs`).
pub(super) async fn execute(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    SessionName(session): SessionName,
    accepts: Accepts,
    meter: Option<axum::Extension<Arc<pending::Meter>>>,
    JsonBody(body): JsonBody<ExecuteBody>,
) -> Result<Response, ApiError> {
    if accepts == Accepts::Json {
        let result = run_cell(&state, &tenant, session, body).await?;
        return Ok(Json(result).into_response());
    }
    let request = prepare_cell(&state, &tenant, session, body).await?;
    // A stream starts only once the request holds a kernel slot, so a refusal at a cap is
    // a 429 rather than a stream carrying only the error.
    let (notice, admitted) = crate::orchestrator::AdmissionNotice::new();
    let response = stream_execute(state.clone(), request, notice, meter_of(&state, meter));
    if let Ok(Err(e)) = admitted.await {
        return Err(refused(&state, e));
    }
    Ok(response)
}

/// The meter a streamed answer's bytes count on: the connection's, or one of its own.
pub(super) fn meter_of(
    state: &AppState,
    meter: Option<axum::Extension<Arc<pending::Meter>>>,
) -> Arc<pending::Meter> {
    match meter {
        Some(axum::Extension(meter)) => meter,
        None => pending::Meter::new(state.inner.pending.clone()),
    }
}

/// Whether a new cell or command may start now: not while the server drains (503), and only
/// while the tenant's unsent answers are within budget ([`admit`]).
pub(crate) fn ready(state: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(state, tenant)
}

/// An execute body as the orchestrator's request, checked, with the session's network policy
/// it carries set first, ready to run: the steps every execute takes, streamed or not.
async fn prepare_cell(
    state: &AppState,
    tenant: &Tenant,
    session: String,
    body: ExecuteBody,
) -> Result<ExecuteRequest, ApiError> {
    let network = body.network.clone().map(|n| (session.clone(), n));
    let request = parse_execute(state, tenant, session, body).map_err(|e| invalid(state, e))?;
    if let Some((session, network)) = &network {
        super::sessions::set_session_network(state, tenant, session, network).await?;
    }
    ready(state, tenant)?;
    Ok(request)
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
    let request = prepare_cell(state, tenant, session, body).await?;
    let result = state
        .inner
        .orchestrator
        .execute(request)
        .await
        .map_err(|e| refused(state, e))?;
    state.inner.metrics.cell(&result);
    Ok(result)
}
