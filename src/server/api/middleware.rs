//! What wraps every route: a panic becomes a 500 JSON error, a refusal of a request with a
//! body closes the connection, every response body is counted and read at a minimum rate
//! (`pending.rs`), and, with tracing on, every request is a span (`docs/usage.md`, "Traces").

use std::panic::AssertUnwindSafe;

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
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

/// Every response body is counted against its tenant's and the host's budgets of bytes in
/// flight, and cut when read too slowly (`pending.rs`): the request carries its [`Meter`],
/// which the handler's producers (a stream's events) charge too, and the tenant is set on it
/// once the caller is authenticated.
///
/// [`Meter`]: super::pending::Meter
pub(super) async fn count_responses(
    State(state): State<crate::server::AppState>,
    mut request: Request,
    next: Next,
) -> Response {
    let meter = super::pending::Meter::new(state.inner.pending.clone());
    request.extensions_mut().insert(Arc::clone(&meter));
    let response = next.run(request).await;
    response.map(|body| super::pending::counted(meter, body))
}

/// With tracing on, the request is an `http.request` span, a child of the caller's W3C
/// `traceparent` when it sent one, and the handler runs in it (so admission, the cold start,
/// the cell and its tool calls are its children). Its attributes: the method, the route
/// template, the path, the status, and the tenant once authenticated (`authenticate`).
pub(super) async fn trace_request(
    State(state): State<crate::server::AppState>,
    request: Request,
    next: Next,
) -> Response {
    use opentelemetry::context::FutureExt as _;
    use opentelemetry::trace::{Status, TraceContextExt as _};
    use opentelemetry::KeyValue;

    let Some(tracer) = state.tracer() else {
        return next.run(request).await;
    };
    let parent = crate::telemetry::extract(request.headers());
    let mut attributes = vec![
        KeyValue::new("http.request.method", request.method().as_str().to_string()),
        KeyValue::new("url.path", request.uri().path().to_string()),
    ];
    if let Some(route) = request.extensions().get::<MatchedPath>() {
        attributes.push(KeyValue::new("http.route", route.as_str().to_string()));
    }
    let cx = tracer.server_span(&parent, "http.request", attributes);
    let response = next.run(request).with_context(cx.clone()).await;
    let span = cx.span();
    let status = response.status();
    span.set_attribute(KeyValue::new(
        "http.response.status_code",
        i64::from(status.as_u16()),
    ));
    if status.is_server_error() {
        span.set_status(Status::error(status.to_string()));
    }
    span.end();
    response
}
