//! An error as E2B's API answers it: `{"code": <HTTP status>, "message": "..."}` with that
//! status (E2B's `Error` schema; the SDKs raise by the status: 401 `AuthenticationException`,
//! 404 `NotFoundException`, 429 `RateLimitException`, ...). A kernelbox error keeps its own
//! code at the head of the message, so nothing it said is lost.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::server::error::ApiError;

/// An error of the E2B API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct E2bError {
    pub(crate) status: StatusCode,
    pub(crate) message: String,
}

impl E2bError {
    pub(crate) fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }

    pub(crate) fn unauthorized() -> E2bError {
        E2bError::new(
            StatusCode::UNAUTHORIZED,
            "Invalid API key or sandbox access token: E2B_API_KEY must be a kernelbox tenant's token",
        )
    }

    pub(crate) fn not_found(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, message)
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::BAD_REQUEST, message)
    }

    pub(crate) fn internal(message: impl Into<String>) -> E2bError {
        E2bError::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    /// What kernelbox does not provide (yet) through this API: 501, naming it.
    pub(crate) fn not_available(what: &str) -> E2bError {
        E2bError::new(
            StatusCode::NOT_IMPLEMENTED,
            format!("{what} is not available on kernelbox's E2B API (docs/e2b.md, \"What is not there\")"),
        )
    }

    pub(crate) fn sandbox_not_found(id: &str) -> E2bError {
        E2bError::not_found(format!("sandbox {id:?} not found"))
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> E2bError {
        E2bError::new(e.status, format!("{}: {}", e.code, e.message))
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({
            "code": self.status.as_u16(),
            "message": self.message,
        });
        (self.status, Json(body)).into_response()
    }
}
