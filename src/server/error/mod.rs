//! API errors: `{"error": {"code", "message"}}` with the matching status.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`ApiError`], its constructors for the server's own refusals, and its response |
//! | `domain.rs` | every library error as the API answers it (status, code, retry), in one place |

mod domain;

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::wire::ErrorBody;

/// An error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Stable machine-readable code.
    pub code: &'static str,
    /// Human-readable message.
    pub message: String,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    /// 400 with `code`.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 401 `unauthorized`: no bearer token, or one no tenant has.
    pub fn unauthorized() -> ApiError {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "a valid `Authorization: Bearer TOKEN` header is required",
        )
    }

    /// 404 `not_found`, saying what was not found.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found", message)
    }

    /// 503 while the server drains for shutdown.
    pub fn shutting_down() -> ApiError {
        ApiError {
            retry_after: Some(1),
            ..ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "kernelbox is shutting down",
            )
        }
    }

    /// The JSON body.
    pub fn body(&self) -> ErrorBody {
        ErrorBody::new(self.code, self.message.clone())
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if let Some(secs) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"kernelbox\""),
            );
        }
        response
    }
}
