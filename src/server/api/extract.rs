//! What a handler takes from a request, checked once at the edge: the session a path names
//! ([`SessionName`]), a JSON object body read within its bound ([`JsonBody`]), whether the
//! caller accepts a stream ([`Accepts`]). A bad one is a 400 (413 past the body limit),
//! counted as a refusal, before the handler runs.

use axum::body::{Body, Bytes};
use axum::extract::rejection::PathRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, RawPathParams, Request};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use http_body_util::BodyExt;

use super::auth::Authenticated;
use crate::owner::validate_name;
use crate::server::error::ApiError;
use crate::server::tenants::Tenant;
use crate::server::{AppState, MAX_BODY_BYTES};

/// The `{session}` a route's path names, a valid name.
pub(crate) struct SessionName(pub(crate) String);

impl FromRequestParts<AppState> for SessionName {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<SessionName, ApiError> {
        let params = RawPathParams::from_request_parts(parts, state)
            .await
            .map_err(|e| invalid(state, ApiError::bad_request("invalid_path", e.body_text())))?;
        let session = params
            .iter()
            .find(|(key, _)| *key == "session")
            .map(|(_, value)| value.to_owned())
            .ok_or_else(|| {
                invalid(
                    state,
                    ApiError::bad_request("invalid_path", "the route names no session"),
                )
            })?;
        name("session", &session).map_err(|e| invalid(state, e))?;
        Ok(SessionName(session))
    }
}

/// A request body that is a JSON object of `T`, read within [`MAX_BODY_BYTES`] as
/// [`read_body_of`] reads it (the caller's token checked again once it is in).
pub(crate) struct JsonBody<T>(pub(crate) T);

impl<T: serde::de::DeserializeOwned> FromRequest<AppState> for JsonBody<T> {
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &AppState) -> Result<JsonBody<T>, ApiError> {
        let bytes = body_of(request, state).await?;
        json_object(&bytes)
            .map(JsonBody)
            .map_err(|e| invalid(state, e))
    }
}

/// A request's body, read as [`read_body_of`] reads it for the caller [`Caller`](super::Caller)
/// authenticated on this request.
async fn body_of(request: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let (parts, body) = request.into_parts();
    let bytes = read_body(&parts.headers, body)
        .await
        .map_err(|e| invalid(state, e))?;
    if let Some(Authenticated(tenant)) = parts.extensions.get::<Authenticated>() {
        if !state.inner.tenants.holds(tenant) {
            state.inner.metrics.rejected("unauthorized");
            return Err(ApiError::unauthorized());
        }
    }
    Ok(bytes)
}

/// Whether the caller asked for a stream (`Accept: application/x-ndjson`) or one JSON answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Accepts {
    Json,
    Ndjson,
}

impl FromRequestParts<AppState> for Accepts {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &AppState,
    ) -> Result<Accepts, Self::Rejection> {
        let ndjson = parts
            .headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| v.to_ascii_lowercase().contains("application/x-ndjson"));
        Ok(if ndjson {
            Accepts::Ndjson
        } else {
            Accepts::Json
        })
    }
}

/// A refused request, counted (`too_large` or `invalid`).
pub(crate) fn invalid(state: &AppState, error: ApiError) -> ApiError {
    state.inner.metrics.rejected(match error.status {
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        _ => "invalid",
    });
    error
}

pub(super) fn path_error(e: PathRejection) -> ApiError {
    ApiError::bad_request("invalid_path", e.body_text())
}

pub(super) fn name(what: &'static str, value: &str) -> Result<(), ApiError> {
    validate_name(what, value).map_err(|e| ApiError::bad_request("invalid_name", e.to_string()))
}

pub(super) fn one_name(
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
