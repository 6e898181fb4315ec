//! The access log and the request id (`docs/logs.md`).
//!
//! Every request gets an id: the caller's `x-request-id` when it is sane (at most
//! [`MAX_REQUEST_ID`] visible ASCII characters), else a new one. It is set on the request (so a
//! cluster node forwarding it sends the same id on, `server/cluster/forward.rs`), returned as
//! the `x-request-id` header of every answer, errors included, set on the request's trace span,
//! and is the `request_id` of a `tracing` span the handler runs in (so a JSON log line from the
//! request's work carries it).
//!
//! One event on [`ACCESS_TARGET`] per request, when its response body ends, fails or is dropped
//! (a streamed execute is logged once its last event is handed over or its reader goes away,
//! with the bytes actually handed to the connection), or when the connection goes before an
//! answer was made. Its fields: `request_id`, `method`, `route` (the route template, never the
//! path), `tenant` (recorded by `authenticate` in a [`Who`] the layer put in the request),
//! `session` (a valid name from the path, or `/v1/mcp`'s header or query), `status`,
//! `duration_ms`, `bytes_in` (request body bytes read), `bytes_out`, `outcome`. Never a header
//! value but the id, never a body.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{MatchedPath, Request};
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::middleware::Next;
use axum::response::Response;
use hyper::body::{Frame, SizeHint};
use tokio::time::Instant;
use tracing::Instrument as _;

use crate::logging::ACCESS_TARGET;
use crate::owner::validate_name;

/// The request id's header, in and out.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Longest request id taken from a caller.
pub(crate) const MAX_REQUEST_ID: usize = 128;

/// Who a request is for, once known: made by the access layer, filled in by `authenticate`.
#[derive(Debug, Default)]
pub(crate) struct Who {
    tenant: OnceLock<String>,
}

impl Who {
    /// The authenticated tenant.
    pub(crate) fn set_tenant(&self, tenant: &str) {
        let _ = self.tenant.set(tenant.to_string());
    }
}

/// The caller's id when it is sane, else a new one (32 hex digits).
fn request_id(headers: &HeaderMap) -> String {
    headers
        .get(&REQUEST_ID)
        .map(HeaderValue::as_bytes)
        .filter(|id| is_sane(id))
        .and_then(|id| std::str::from_utf8(id).ok())
        .map_or_else(|| uuid::Uuid::new_v4().simple().to_string(), str::to_string)
}

/// 1 to [`MAX_REQUEST_ID`] visible ASCII characters (no space, no control, no quote or
/// backslash, which a text log line would show as they are).
fn is_sane(id: &[u8]) -> bool {
    !id.is_empty()
        && id.len() <= MAX_REQUEST_ID
        && id
            .iter()
            .all(|b| b.is_ascii_graphic() && *b != b'"' && *b != b'\\')
}

/// The session a request names, when it is a valid name: a `/v1/sessions/{session}/...`
/// route's path segment, or `/v1/mcp`'s header or query.
fn session_of(route: Option<&str>, request: &Request) -> Option<String> {
    let session = match route? {
        r if r.starts_with("/v1/sessions/{session}") => {
            crate::server::cluster::session_of(request.uri().path())
        }
        "/v1/mcp" => super::mcp_session::routed_session(request.headers(), request.uri().query())
            .map(|(session, _)| session),
        _ => None,
    }?;
    validate_name("session", &session).ok()?;
    Some(session)
}

/// The middleware: the id in and out, the span, the access event.
pub(super) async fn log_access(mut request: Request, next: Next) -> Response {
    let started = Instant::now();
    let id = request_id(request.headers());
    let value = HeaderValue::from_str(&id).ok();
    if let Some(value) = &value {
        request.headers_mut().insert(REQUEST_ID, value.clone());
    }
    crate::telemetry::set_current("http.request.id", || id.clone());
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|m| m.as_str().to_string());
    let session = session_of(route.as_deref(), &request);
    let who = Arc::new(Who::default());
    request.extensions_mut().insert(who.clone());
    let bytes_in = Arc::new(AtomicU64::new(0));
    let request = request.map(|body| {
        Body::new(CountIn {
            inner: body,
            read: bytes_in.clone(),
        })
    });
    let span = tracing::info_span!(target: ACCESS_TARGET, "request", request_id = %id);
    let mut entry = Entry {
        id,
        method: request.method().to_string(),
        route,
        session,
        who,
        started,
        bytes_in,
        bytes_out: 0,
        status: None,
        outcome: "no_response",
    };
    let mut response = next.run(request).instrument(span).await;
    entry.status = Some(response.status().as_u16());
    entry.outcome = "dropped";
    if let Some(value) = value {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    response.map(|inner| {
        Body::new(Logged {
            inner,
            entry: Some(entry),
        })
    })
}

/// One request's access event, emitted when dropped.
struct Entry {
    id: String,
    method: String,
    route: Option<String>,
    session: Option<String>,
    who: Arc<Who>,
    started: Instant,
    bytes_in: Arc<AtomicU64>,
    bytes_out: u64,
    status: Option<u16>,
    /// `complete` (the body ended), `error` (it failed: cut for a slow reader, or the node it
    /// was forwarded to went away), `dropped` (the connection went before its end),
    /// `no_response` (the connection went before an answer was made).
    outcome: &'static str,
}

impl Drop for Entry {
    fn drop(&mut self) {
        tracing::info!(
            target: ACCESS_TARGET,
            request_id = %self.id,
            method = %self.method,
            route = self.route.as_deref(),
            tenant = self.who.tenant.get().map(String::as_str),
            session = self.session.as_deref(),
            status = self.status,
            duration_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            bytes_in = self.bytes_in.load(Ordering::Relaxed),
            bytes_out = self.bytes_out,
            outcome = self.outcome,
            "request"
        );
    }
}

/// A request body counting the bytes read from it.
struct CountIn {
    inner: Body,
    read: Arc<AtomicU64>,
}

impl hyper::body::Body for CountIn {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.read.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body counting the bytes handed to the connection; logs its request when it
/// ends, fails or is dropped.
struct Logged {
    inner: Body,
    entry: Option<Entry>,
}

impl Logged {
    fn finish(&mut self, outcome: &'static str) {
        if let Some(mut entry) = self.entry.take() {
            entry.outcome = outcome;
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // A body hyper never had to poll (empty, or a HEAD's) ended all the same.
        if hyper::body::Body::is_end_stream(&self.inner) {
            self.finish("complete");
        }
    }
}

impl hyper::body::Body for Logged {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let (Some(data), Some(entry)) = (frame.data_ref(), this.entry.as_mut()) {
                    entry.bytes_out += data.len() as u64;
                }
            }
            Poll::Ready(Some(Err(_))) => this.finish("error"),
            Poll::Ready(None) => this.finish("complete"),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sane_id_is_kept_and_any_other_replaced() {
        let mut headers = HeaderMap::new();
        headers.insert(REQUEST_ID, HeaderValue::from_static("abc-123_x.Y:z"));
        assert_eq!(request_id(&headers), "abc-123_x.Y:z");
        for bad in ["has space", "quote\"d", &"x".repeat(MAX_REQUEST_ID + 1)] {
            headers.insert(REQUEST_ID, HeaderValue::from_str(bad).unwrap());
            let id = request_id(&headers);
            assert_ne!(id, bad);
            assert_eq!(id.len(), 32, "{id}");
        }
        assert_eq!(request_id(&HeaderMap::new()).len(), 32);
    }
}
