//! An OTLP/HTTP receiver for the trace tests (`docs/usage.md`, "Traces"): it collects the
//! JSON bodies POSTed to `/v1/traces` on loopback and reads the spans out of them. Include it
//! with `#[path = "common/otlp.rs"] mod otlp;` (`"../common/otlp.rs"` from a folder-style test).
#![allow(dead_code)]
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hyper::{HeaderMap, StatusCode};
use serde_json::Value;
use tokio::sync::Notify;

/// What a receiver collected: every JSON body POSTed to it, woken on each.
#[derive(Default)]
pub struct Collected {
    bodies: Mutex<Vec<Value>>,
    arrived: Notify,
}

/// One span as the OTLP JSON encoding has it.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    pub trace: String,
    pub id: String,
    pub parent: String,
    pub attributes: BTreeMap<String, Value>,
    pub service: String,
}

impl Span {
    pub fn attr(&self, key: &str) -> Option<&Value> {
        self.attributes.get(key)
    }
}

impl Collected {
    pub fn spans(&self) -> Vec<Span> {
        let bodies = self.bodies.lock().unwrap();
        let mut spans = Vec::new();
        for body in bodies.iter() {
            for resource in body["resourceSpans"].as_array().into_iter().flatten() {
                let service = resource["resource"]["attributes"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .find(|a| a["key"] == "service.name")
                    .and_then(|a| a["value"]["stringValue"].as_str())
                    .unwrap_or_default()
                    .to_string();
                for scope in resource["scopeSpans"].as_array().into_iter().flatten() {
                    for span in scope["spans"].as_array().into_iter().flatten() {
                        let attributes = span["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|a| {
                                let value = a["value"]
                                    .as_object()
                                    .and_then(|v| v.values().next().cloned());
                                (
                                    a["key"].as_str().unwrap().to_string(),
                                    value.unwrap_or(Value::Null),
                                )
                            })
                            .collect();
                        spans.push(Span {
                            name: span["name"].as_str().unwrap().to_string(),
                            trace: span["traceId"].as_str().unwrap().to_string(),
                            id: span["spanId"].as_str().unwrap().to_string(),
                            parent: span["parentSpanId"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            attributes,
                            service: service.clone(),
                        });
                    }
                }
            }
        }
        spans
    }

    /// The spans of `trace`, once those named `names` all arrived (bounded wait, woken by
    /// each export).
    pub async fn trace(&self, trace: &str, names: &[&str]) -> Vec<Span> {
        let what = format!("spans {names:?} of trace {trace}");
        self.until(
            &what,
            |s| s.trace == trace,
            |spans| names.iter().all(|n| spans.iter().any(|s| s.name == *n)),
        )
        .await
    }

    /// The spans `keep` keeps, once `done` says they are all there (bounded wait, woken by
    /// each export).
    pub async fn until(
        &self,
        what: &str,
        keep: impl Fn(&Span) -> bool,
        done: impl Fn(&[Span]) -> bool,
    ) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let arrived = self.arrived.notified();
            let spans: Vec<Span> = self.spans().into_iter().filter(|s| keep(s)).collect();
            if done(&spans) {
                return spans;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what} never arrived; got {spans:#?}");
            let _ = tokio::time::timeout(left, arrived).await;
        }
    }
}

/// An OTLP/HTTP receiver on loopback: collects the JSON bodies POSTed to `/v1/traces`.
pub async fn receiver() -> (SocketAddr, Arc<Collected>) {
    use axum::extract::State;
    use axum::routing::post;
    async fn export(
        State(collected): State<Arc<Collected>>,
        headers: HeaderMap,
        body: Bytes,
    ) -> (StatusCode, [(&'static str, &'static str); 1], &'static str) {
        assert_eq!(
            headers.get("content-type").and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "OTLP/HTTP with JSON"
        );
        let value: Value = serde_json::from_slice(&body).expect("an OTLP JSON body");
        collected.bodies.lock().unwrap().push(value);
        collected.arrived.notify_waiters();
        (StatusCode::OK, [("content-type", "application/json")], "{}")
    }
    let collected = Arc::new(Collected::default());
    let app = axum::Router::new()
        .route("/v1/traces", post(export))
        .with_state(collected.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, collected)
}

/// The one span named `name` among `spans`.
pub fn one<'a>(spans: &'a [Span], name: &str) -> &'a Span {
    let named: Vec<&Span> = spans.iter().filter(|s| s.name == name).collect();
    assert_eq!(named.len(), 1, "one {name} span: {spans:#?}");
    named[0]
}
