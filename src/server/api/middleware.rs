//! What wraps every route: a panic becomes a 500 JSON error, and a refusal of a request with
//! a body closes the connection.

use std::panic::AssertUnwindSafe;

use axum::extract::Request;
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use futures::FutureExt;

use crate::server::error::ApiError;

/// A refusal of a request that carried a body (401, 413, 429, ...) is answered with
/// `Connection: close`. The handler may not have read the body, and hyper then closes the
/// connection rather than read what is left; without the header a client would send its next
/// request on a connection that is going away and see it dropped instead of answered.
pub(super) async fn close_after_refusal(request: Request, next: Next) -> Response {
    let headers = request.headers();
    let has_body = headers.contains_key(header::TRANSFER_ENCODING)
        || headers
            .get(header::CONTENT_LENGTH)
            .is_some_and(|len| len.as_bytes() != b"0");
    let mut response = next.run(request).await;
    if has_body && (response.status().is_client_error() || response.status().is_server_error()) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

/// No panic reaches a caller as a dropped connection: it becomes a 500 JSON error.
pub(super) async fn catch_panic(request: Request, next: Next) -> Response {
    match AssertUnwindSafe(next.run(request)).catch_unwind().await {
        Ok(response) => response,
        Err(_) => {
            tracing::error!("a request handler panicked");
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error",
            )
            .into_response()
        }
    }
}
