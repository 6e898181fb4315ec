//! The hop (docs/cluster.md, "Routing"): a request for a session held by another node is
//! sent there as it came (method, path, query, headers, body streamed as it arrives), marked
//! with [`FORWARDED_HEADER`] so that node never forwards it again, and the answer streamed
//! back as it is produced (NDJSON events in order, downloads), so the forwarding node holds
//! no more than a few buffers of either whatever their size.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{header, HeaderName, HeaderValue, StatusCode, Uri};
use axum::response::Response;
use futures::StreamExt;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use crate::server::error::ApiError;
use crate::telemetry::Span;
use opentelemetry::trace::SpanKind;

use super::{ClusterNode, Target, FORWARDED_HEADER};

/// How long connecting to another node may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Headers that belong to one connection, not to the request (RFC 9110, section 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "host",
];

/// A pooled HTTP/1.1 client for the other nodes.
#[derive(Debug, Clone)]
pub(super) struct Forwarder {
    pub(super) client: Client<HttpConnector, Body>,
}

impl Forwarder {
    pub(super) fn new() -> Forwarder {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(CONNECT_TIMEOUT));
        connector.set_nodelay(true);
        Forwarder {
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(connector),
        }
    }
}

impl ClusterNode {
    /// Sends `request` to `target` and streams its answer back. The answer's head must come
    /// within the longest a cell may run plus the time to start its kernel and a minute
    /// (the target enforces its own deadlines; this one only bounds a target that hangs).
    pub(crate) async fn forward(
        self: &Arc<Self>,
        target: &Target,
        request: Request,
        head_deadline: Duration,
    ) -> Result<Response, ApiError> {
        let (mut parts, body) = request.into_parts();
        let path = parts
            .uri
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_string();
        let uri: Uri = format!("{}{path}", target.advertise.trim_end_matches('/'))
            .parse()
            .map_err(|e| unreachable(target, &format!("its address: {e}")))?;
        parts.uri = uri;
        for name in HOP_BY_HOP {
            parts.headers.remove(name);
        }
        if let (Ok(me), Ok(secret)) = (
            HeaderValue::from_str(&self.options.node),
            HeaderValue::from_str(&self.hop_secret),
        ) {
            parts
                .headers
                .insert(HeaderName::from_static(FORWARDED_HEADER), me);
            parts
                .headers
                .insert(HeaderName::from_static(super::HOP_HEADER), secret);
        }
        // The node holding the session continues this request's trace under the hop's span
        // (docs/usage.md, "Traces").
        let span = Span::start_kind("forward", SpanKind::Client);
        if span.is_on() {
            span.set("kernelbox.node", target.node.clone());
            span.inject(&mut parts.headers);
        }
        let started = Instant::now();
        let sent = self
            .forwarder
            .client
            .request(Request::from_parts(parts, body));
        // A node stopped but not dead (a frozen VM, SIGSTOP) accepts and never answers: the
        // wait ends when the view shows its lease gone, not only at the deadline.
        let waited = tokio::select! {
            answer = tokio::time::timeout(head_deadline, sent) => answer,
            () = self.lost(target) => {
                self.counters.forward_failures.fetch_add(1, Ordering::Relaxed);
                span.fail("the node's lease expired while it was to answer");
                return Err(unreachable(target, "its lease expired while it was to answer"));
            }
        };
        let response = match waited {
            Ok(Ok(response)) => response,
            Ok(Err(e)) => {
                self.counters
                    .forward_failures
                    .fetch_add(1, Ordering::Relaxed);
                let why = error_chain(&e);
                span.fail(why.clone());
                return Err(unreachable(target, &why));
            }
            Err(_) => {
                self.counters
                    .forward_failures
                    .fetch_add(1, Ordering::Relaxed);
                span.fail("no answer before the deadline");
                return Err(ApiError::new(
                    StatusCode::GATEWAY_TIMEOUT,
                    "node_timeout",
                    format!(
                        "node {:?} holding this session did not answer within {head_deadline:?}",
                        target.node
                    ),
                ));
            }
        };
        span.set(
            "http.response.status_code",
            i64::from(response.status().as_u16()),
        );
        self.counters.forwarded.fetch_add(1, Ordering::Relaxed);
        self.counters
            .forward_seconds
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .observe(started.elapsed().as_secs_f64());
        let (mut parts, body) = response.into_parts();
        for name in HOP_BY_HOP {
            parts.headers.remove(name);
        }
        parts.headers.remove(header::CONNECTION);
        Ok(Response::from_parts(parts, self.cut_if_lost(target, body)))
    }

    /// The answer's body as it streams, cut with an error if its node's lease goes while it
    /// streams (a client then sees a broken answer, never a hang or a short one that looks
    /// whole).
    fn cut_if_lost(self: &Arc<Self>, target: &Target, body: hyper::body::Incoming) -> Body {
        let node = self.clone();
        let target = target.clone();
        let lost: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> =
            Box::pin(async move { node.lost(&target).await });
        let stream = Body::new(body).into_data_stream();
        let cut = futures::stream::unfold(
            (stream, lost, false),
            |(mut stream, mut lost, done)| async move {
                if done {
                    return None;
                }
                tokio::select! {
                    item = stream.next() => item.map(|i| (i, (stream, lost, false))),
                    () = &mut lost => Some((
                        Err(axum::Error::new(std::io::Error::other(
                            "the node holding this session lost its lease while answering",
                        ))),
                        (stream, lost, true),
                    )),
                }
            },
        );
        Body::from_stream(cut)
    }
}

/// The node holding the session did not answer: retry later (if it died, its sessions are
/// reported `node_lost` once its lease expires).
fn unreachable(target: &Target, why: &str) -> ApiError {
    ApiError {
        retry_after: Some(1),
        ..ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "node_unavailable",
            format!(
                "node {:?} holding this session did not answer ({why}); if it is gone, its sessions are reported node_lost once its lease expires",
                target.node
            ),
        )
    }
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
