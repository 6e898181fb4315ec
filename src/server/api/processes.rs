//! Background processes (`docs/processes.md`): `POST /v1/sessions/{session}/processes` starts
//! one in the session's kernel container (started when it has none); `GET` lists them;
//! `GET|DELETE .../processes/{id}` one of them, or kills it; `GET .../{id}/output` streams its
//! output (NDJSON: what is kept, then live, then `exit`); `POST|DELETE .../{id}/stdin` writes
//! its stdin (the raw body) or closes it; `POST .../{id}/signal` signals it. The service
//! (`src/services/processes/`) owns them; these handlers only parse and answer.

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequestParts, Path, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::stream::{line, Utf8Stream};
use super::{admit, invalid, json_object, one_name, path_error, read_body_of, Caller};
use crate::kernel::CommandStream;
use crate::orchestrator::ProcessRequest;
use crate::owner::Owner;
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::AppState;
use crate::services::OutputItem;
use crate::wire::{ProcessBody, ProcessEvent, ProcessInfo, ProcessList, SignalBody, StdinWritten};

/// The owner a session path names for `tenant`.
fn owner(state: &AppState, tenant: &Tenant, session: String) -> Result<Owner, ApiError> {
    let scope = super::files::kernel_scope(tenant, session, None);
    Ok(state.inner.orchestrator.owner_of_scope(&scope)?)
}

/// What every `.../processes/{id}...` handler starts from: the caller (authenticated first,
/// so a request without a token is a 401 whatever its path), the owner the session path names
/// for the caller's tenant, and the process id.
pub(super) struct OneProcess {
    tenant: Arc<Tenant>,
    owner: Owner,
    id: u64,
}

impl FromRequestParts<AppState> for OneProcess {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let Caller(tenant) = Caller::from_request_parts(parts, state).await?;
        let Path((session, id)) = Path::<(String, u64)>::from_request_parts(parts, state)
            .await
            .map_err(|e| invalid(state, path_error(e)))?;
        let session = one_name(state, Ok(Path(session)))?;
        let owner = owner(state, &tenant, session)?;
        Ok(OneProcess { tenant, owner, id })
    }
}

/// `POST /v1/sessions/{session}/processes`: starts a background process.
pub(super) async fn start(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ProcessInfo>, ApiError> {
    let session = one_name(&state, session)?;
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let body: ProcessBody = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    let scope = super::files::kernel_scope(&tenant, session, None);
    let request = ProcessRequest::from_body(scope, body).map_err(|e| invalid(&state, e.into()))?;
    if state.is_draining() {
        return Err(ApiError::shutting_down());
    }
    admit(&state, &tenant)?;
    let info = state.inner.orchestrator.start_process(request).await?;
    Ok(Json(info))
}

/// `GET /v1/sessions/{session}/processes`: the session's processes.
pub(super) async fn list(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    session: Result<Path<String>, PathRejection>,
) -> Result<Json<ProcessList>, ApiError> {
    let session = one_name(&state, session)?;
    let owner = owner(&state, &tenant, session)?;
    Ok(Json(ProcessList {
        processes: state.inner.orchestrator.processes().list(&owner),
    }))
}

/// `GET /v1/sessions/{session}/processes/{id}`: one process.
pub(super) async fn get(
    State(state): State<AppState>,
    OneProcess { owner, id, .. }: OneProcess,
) -> Result<Json<ProcessInfo>, ApiError> {
    Ok(Json(
        state.inner.orchestrator.processes().get(&owner, id)?.info(),
    ))
}

/// `DELETE /v1/sessions/{session}/processes/{id}`: kills a process and what it started.
pub(super) async fn kill(
    State(state): State<AppState>,
    OneProcess { owner, id, .. }: OneProcess,
) -> Result<Json<ProcessInfo>, ApiError> {
    Ok(Json(
        state
            .inner
            .orchestrator
            .processes()
            .kill(&owner, id)
            .await?,
    ))
}

/// `POST /v1/sessions/{session}/processes/{id}/signal`: signals a process's command.
pub(super) async fn signal(
    State(state): State<AppState>,
    OneProcess { tenant, owner, id }: OneProcess,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<ProcessInfo>, ApiError> {
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let body: SignalBody = json_object(&bytes).map_err(|e| invalid(&state, e))?;
    let number = body
        .number()
        .map_err(|e| invalid(&state, ApiError::bad_request("invalid_signal", e)))?;
    Ok(Json(
        state
            .inner
            .orchestrator
            .processes()
            .signal(&owner, id, number)
            .await?,
    ))
}

/// `POST /v1/sessions/{session}/processes/{id}/stdin`: the body, as it is, on its stdin.
pub(super) async fn write_stdin(
    State(state): State<AppState>,
    OneProcess { tenant, owner, id }: OneProcess,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<StdinWritten>, ApiError> {
    let bytes = read_body_of(&state, &tenant, &headers, body).await?;
    let written = state
        .inner
        .orchestrator
        .processes()
        .write_stdin(&owner, id, &bytes)
        .await?;
    Ok(Json(StdinWritten { written }))
}

/// `DELETE /v1/sessions/{session}/processes/{id}/stdin`: closes its stdin (end of file).
pub(super) async fn close_stdin(
    State(state): State<AppState>,
    OneProcess { owner, id, .. }: OneProcess,
) -> Result<Json<ProcessInfo>, ApiError> {
    Ok(Json(
        state
            .inner
            .orchestrator
            .processes()
            .close_stdin(&owner, id)
            .await?,
    ))
}

/// `GET /v1/sessions/{session}/processes/{id}/output`: its output as NDJSON, what is kept
/// first, then live, then `exit`. The stream produces a line only when the client reads one,
/// so a reader that does not read holds a cursor and nothing more; one that goes away stops
/// reading, not the process.
pub(super) async fn output(
    State(state): State<AppState>,
    OneProcess { owner, id, .. }: OneProcess,
) -> Result<Response, ApiError> {
    let attach = state.inner.orchestrator.processes().attach(&owner, id)?;
    let decoders = || Utf8Stream {
        carry: Vec::new(),
        sent: 0,
        cap: usize::MAX,
        dropped: 0,
    };
    let stream = futures::stream::unfold(
        (attach, decoders(), decoders()),
        |(mut attach, mut out, mut err)| async move {
            let items = attach.next().await?;
            let mut lines = Vec::new();
            for item in items {
                match item {
                    OutputItem::Chunk(CommandStream::Stdout, bytes) => {
                        let text = out.push(&bytes);
                        if !text.is_empty() {
                            lines.extend_from_slice(&line(&ProcessEvent::stdout(&text)));
                        }
                    }
                    OutputItem::Chunk(CommandStream::Stderr, bytes) => {
                        let text = err.push(&bytes);
                        if !text.is_empty() {
                            lines.extend_from_slice(&line(&ProcessEvent::stderr(&text)));
                        }
                    }
                    OutputItem::Missed(bytes) => {
                        lines.extend_from_slice(&line(&ProcessEvent::truncated(bytes)));
                    }
                    OutputItem::Exit(code) => {
                        for (text, stdout) in [(out.finish(), true), (err.finish(), false)] {
                            if !text.is_empty() {
                                let event = if stdout {
                                    ProcessEvent::stdout(&text)
                                } else {
                                    ProcessEvent::stderr(&text)
                                };
                                lines.extend_from_slice(&line(&event));
                            }
                        }
                        lines.extend_from_slice(&line(&ProcessEvent::exit(code)));
                    }
                }
            }
            Some((
                Ok::<_, Infallible>(axum::body::Bytes::from(lines)),
                (attach, out, err),
            ))
        },
    );
    let mut response = Body::from_stream(stream).into_response();
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(response)
}
