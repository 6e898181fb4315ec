//! OpenTelemetry traces (`docs/usage.md`, "Traces"): off unless `kernelbox serve
//! --otlp-endpoint` is given, then spans are batched on the tokio runtime and sent to an OTLP
//! receiver over HTTP/JSON.
//!
//! The [`Tracer`] travels in the OpenTelemetry [`Context`] of a request, not in a global: the
//! server's request middleware puts it there with the request's span (a child of the caller's
//! W3C `traceparent`, when one came), and every [`Span`] below starts from the current context.
//! Where no tracer is in the context (tracing off, or work outside a request such as the warm
//! pool's refill) a [`Span`] is nothing, and making one costs a lookup in an empty context.
//!
//! | what | where |
//! |---|---|
//! | [`init`] | the exporter, the batch processor and the provider, behind a [`Guard`] that flushes and shuts them down |
//! | [`extract`], [`inject`] | W3C `traceparent` (and `tracestate`) in from a request's headers, out onto a request's headers |
//! | [`Span`], [`in_span`] | a child span of the current context, ended when dropped |

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use futures::future::Either;
use opentelemetry::context::FutureExt as _;
use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt as _, Tracer as _};
use opentelemetry::{Context, KeyValue, Value};
use opentelemetry_otlp::{Protocol, WithExportConfig as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::span_processor_with_async_runtime::BatchSpanProcessor;
use opentelemetry_sdk::trace::{SdkTracer, SdkTracerProvider};
use opentelemetry_sdk::Resource;

/// The instrumentation scope of every span kernelbox makes.
pub const SCOPE: &str = "kernelbox";

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Starting the trace pipeline failed.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The endpoint is not an `http://` URL.
    #[error("--otlp-endpoint {0:?} must be an http:// URL (an OTLP/HTTP receiver, e.g. http://collector:4318)")]
    Endpoint(String),
    /// The exporter could not be built.
    #[error("the OTLP exporter: {0}")]
    Exporter(String),
    /// Flushing or shutting the pipeline down failed.
    #[error("the trace pipeline: {0}")]
    Pipeline(String),
}

/// Makes spans; carried in a request's [`Context`].
#[derive(Debug, Clone)]
pub struct Tracer(SdkTracer);

impl Tracer {
    /// The context of a new server span `name` under `parent` (the caller's remote span, or
    /// none), with this tracer in it so that the [`Span`]s of the work below join the trace.
    pub fn server_span(
        &self,
        parent: &Context,
        name: &'static str,
        attributes: Vec<KeyValue>,
    ) -> Context {
        let span = self
            .0
            .span_builder(name)
            .with_kind(SpanKind::Server)
            .with_attributes(attributes)
            .start_with_context(&self.0, parent);
        parent.with_span(span).with_value(self.clone())
    }
}

/// The trace pipeline: flushed and shut down by [`Guard::shutdown`] (or, as a fallback, when
/// dropped).
#[derive(Debug)]
pub struct Guard {
    provider: Option<SdkTracerProvider>,
    tracer: Tracer,
}

/// Starts the pipeline sending spans of `service_name` to the OTLP/HTTP receiver at `endpoint`
/// (its base URL, e.g. `http://collector:4318`; `/v1/traces` is appended unless the URL ends
/// with it). Must be called within a tokio runtime: the batch processor is a task on it.
pub fn init(endpoint: &str, service_name: &str) -> Result<Guard, TelemetryError> {
    let url = traces_url(endpoint)?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpJson)
        .with_endpoint(url)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| TelemetryError::Exporter(e.to_string()))?;
    let processor =
        BatchSpanProcessor::builder(exporter, opentelemetry_sdk::runtime::Tokio).build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(
            Resource::builder()
                .with_service_name(service_name.to_string())
                .build(),
        )
        .build();
    let tracer = Tracer(opentelemetry::trace::TracerProvider::tracer(
        &provider, SCOPE,
    ));
    Ok(Guard {
        provider: Some(provider),
        tracer,
    })
}

/// The URL spans are POSTed to.
fn traces_url(endpoint: &str) -> Result<String, TelemetryError> {
    let trimmed = endpoint.trim_end_matches('/');
    let host = trimmed.strip_prefix("http://").unwrap_or_default();
    if host.is_empty() || host.starts_with('/') {
        return Err(TelemetryError::Endpoint(endpoint.to_string()));
    }
    Ok(if trimmed.ends_with("/v1/traces") {
        trimmed.to_string()
    } else {
        format!("{trimmed}/v1/traces")
    })
}

impl Guard {
    /// The tracer to hand to the server ([`crate::server::AppState::trace_with`]).
    pub fn tracer(&self) -> Tracer {
        self.tracer.clone()
    }

    /// Sends every span ended so far.
    pub async fn flush(&self) -> Result<(), TelemetryError> {
        let Some(provider) = self.provider.clone() else {
            return Ok(());
        };
        // The processor blocks its caller until its task on the runtime has exported: off the
        // runtime's threads, so that a current-thread runtime can run that task meanwhile.
        blocking(move || provider.force_flush()).await
    }

    /// Sends what is left and stops the batch processor's task.
    pub async fn shutdown(mut self) -> Result<(), TelemetryError> {
        let Some(provider) = self.provider.take() else {
            return Ok(());
        };
        blocking(move || provider.shutdown()).await
    }
}

async fn blocking(
    work: impl FnOnce() -> opentelemetry_sdk::error::OTelSdkResult + Send + 'static,
) -> Result<(), TelemetryError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| TelemetryError::Pipeline(e.to_string()))?
        .map_err(|e| TelemetryError::Pipeline(e.to_string()))
}

impl Drop for Guard {
    fn drop(&mut self) {
        // Not shut down explicitly: the shutdown blocks until the processor's task answers,
        // which a runtime thread must not wait for, so it runs on a thread of its own.
        if let Some(provider) = self.provider.take() {
            let shutdown = move || {
                let _ = provider.shutdown();
            };
            if tokio::runtime::Handle::try_current().is_ok() {
                drop(std::thread::spawn(shutdown));
            } else {
                shutdown();
            }
        }
    }
}

/// The caller's trace context from a request's `traceparent` (and `tracestate`) headers: an
/// empty context when there is none or it is invalid.
pub fn extract(headers: &hyper::http::HeaderMap) -> Context {
    TraceContextPropagator::new().extract(&opentelemetry_http::HeaderExtractor(headers))
}

/// Puts the current span's `traceparent` (and `tracestate`) on an outgoing request's headers;
/// nothing when tracing is off.
pub fn inject(headers: &mut hyper::http::HeaderMap) {
    Context::map_current(|cx| {
        if cx.get::<Tracer>().is_some() {
            TraceContextPropagator::new()
                .inject_context(cx, &mut opentelemetry_http::HeaderInjector(headers));
        }
    });
}

/// Whether the current context traces (a request's work with tracing on).
pub fn is_on() -> bool {
    Context::map_current(|cx| cx.get::<Tracer>().is_some())
}

/// `future` run in the current context, for work that may be moved to another task (a cell
/// that outlives its caller, a streaming execute): its spans stay in the request's trace.
pub fn carry<F: Future>(future: F) -> Either<opentelemetry::context::WithContext<F>, F> {
    if is_on() {
        Either::Left(future.with_context(Context::current()))
    } else {
        Either::Right(future)
    }
}

/// Sets an attribute on the current span (the request's, in a handler); nothing when off
/// (`value` is then not called).
pub fn set_current<V: Into<Value>>(key: &'static str, value: impl FnOnce() -> V) {
    Context::map_current(|cx| {
        if cx.get::<Tracer>().is_some() {
            cx.span().set_attribute(KeyValue::new(key, value()));
        }
    });
}

/// A child span of the current context, ended when dropped; nothing when tracing is off. Work
/// awaited through [`Span::within`] runs in it, so its own spans are its children.
#[derive(Debug)]
#[must_use = "a span ends when dropped"]
pub struct Span {
    cx: Option<Context>,
}

impl Span {
    /// A span `name` under the current one.
    pub fn start(name: &'static str) -> Span {
        Span::start_kind(name, SpanKind::Internal)
    }

    /// A span `name` of `kind` (a client span for a request kernelbox makes).
    pub fn start_kind(name: &'static str, kind: SpanKind) -> Span {
        let cx = Context::map_current(|parent| {
            let tracer = parent.get::<Tracer>()?;
            let span = tracer
                .0
                .span_builder(name)
                .with_kind(kind)
                .start_with_context(&tracer.0, parent);
            Some(parent.with_span(span))
        });
        Span { cx }
    }

    /// Whether the span is recorded (tracing is on for this request).
    pub fn is_on(&self) -> bool {
        self.cx.is_some()
    }

    /// Sets an attribute.
    pub fn set(&self, key: &'static str, value: impl Into<Value>) {
        if let Some(cx) = &self.cx {
            cx.span().set_attribute(KeyValue::new(key, value));
        }
    }

    /// Marks the span failed with `message`.
    pub fn fail(&self, message: impl Into<Cow<'static, str>>) {
        if let Some(cx) = &self.cx {
            cx.span().set_status(Status::error(message));
        }
    }

    /// Puts this span's `traceparent` (and `tracestate`) on an outgoing request's headers, in
    /// place of any there; nothing when off.
    pub fn inject(&self, headers: &mut hyper::http::HeaderMap) {
        if let Some(cx) = &self.cx {
            TraceContextPropagator::new()
                .inject_context(cx, &mut opentelemetry_http::HeaderInjector(headers));
        }
    }

    /// `future` run with this span as the current one.
    pub fn within<F: Future>(
        &self,
        future: F,
    ) -> Either<opentelemetry::context::WithContext<F>, F> {
        match &self.cx {
            Some(cx) => Either::Left(future.with_context(cx.clone())),
            None => Either::Right(future),
        }
    }
}

/// `future` in a span `name` under the current one, failed with the error if it fails.
pub async fn in_span<T, E: std::fmt::Display>(
    name: &'static str,
    future: impl Future<Output = Result<T, E>>,
) -> Result<T, E> {
    let span = Span::start(name);
    let result = span.within(future).await;
    if let Err(e) = &result {
        span.fail(e.to_string());
    }
    result
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(cx) = &self.cx {
            cx.span().end();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;

    #[test]
    fn the_endpoint_is_an_http_base_url_or_the_traces_url() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").ok().as_deref(),
            Some("http://127.0.0.1:4318/v1/traces")
        );
        assert_eq!(
            traces_url("http://c:4318/v1/traces/").ok().as_deref(),
            Some("http://c:4318/v1/traces")
        );
        for bad in ["", "c:4318", "https://c:4318", "http://", "http:///x"] {
            assert!(traces_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn without_a_tracer_spans_are_nothing_and_nothing_is_injected() {
        let span = Span::start("cell");
        assert!(!span.is_on());
        let mut headers = hyper::http::HeaderMap::new();
        inject(&mut headers);
        assert!(headers.is_empty());
    }

    #[test]
    fn a_traceparent_is_extracted_and_a_malformed_one_ignored() {
        let mut headers = hyper::http::HeaderMap::new();
        headers.insert(
            "traceparent",
            hyper::http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        let cx = extract(&headers);
        let span = cx.span();
        let remote = span.span_context();
        assert!(remote.is_valid() && remote.is_remote());
        assert_eq!(
            remote.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        headers.insert(
            "traceparent",
            hyper::http::HeaderValue::from_static("00-zz-01"),
        );
        assert!(!extract(&headers).span().span_context().is_valid());
    }

    /// The traceparent a tool call would carry under `caller` (a request's `cell` span).
    fn outgoing(caller: &'static str) -> String {
        let provider = SdkTracerProvider::builder().build();
        let tracer = Tracer(opentelemetry::trace::TracerProvider::tracer(
            &provider, SCOPE,
        ));
        let mut incoming = hyper::http::HeaderMap::new();
        incoming.insert("traceparent", hyper::http::HeaderValue::from_static(caller));
        let cx = tracer.server_span(&extract(&incoming), "http.request", Vec::new());
        let _attached = cx.attach();
        let cell = Span::start("cell");
        assert!(cell.is_on());
        let mut headers = hyper::http::HeaderMap::new();
        cell.within(async {
            inject(&mut headers);
        })
        .now_or_never()
        .expect("ready");
        drop(cell);
        let _ = provider.shutdown();
        headers["traceparent"].to_str().expect("ASCII").to_string()
    }

    #[test]
    fn a_callers_trace_id_and_sampling_decision_go_out_under_a_span_of_ours() {
        let trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-";
        let sampled = outgoing("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        assert!(
            sampled.starts_with(trace) && sampled.ends_with("-01"),
            "{sampled}"
        );
        assert!(!sampled.contains("00f067aa0ba902b7"), "{sampled}");
        let unsampled = outgoing("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
        assert!(
            unsampled.starts_with(trace) && unsampled.ends_with("-00"),
            "{unsampled}"
        );
    }
}
