//! Random requests: never a 5xx, never a dropped connection, never a cell run (a file upload
//! that was accepted is the one request that may start a kernel: its session's).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{ACCEPT, AUTHORIZATION};
use hyper::Method;
use serde_json::{json, Value};

use kernelbox::server;

use crate::http::{tenant, tenants, TestServer};

/// A random path segment: printable junk, percent-escapes (some invalid), long or empty.
fn junk_segment(rng: &mut rand::rngs::StdRng) -> String {
    use rand::Rng;
    const PIECES: &[&str] = &[
        "a", "Z", "0", ".", "..", "_", "-", "@", ":", "::", "%20", "%2F", "%00", "%ff", "%", "%zz",
        "%C3%A9", "é", "~", "'", "\"", "<", "{", "}", ";", "child", "\\", "+",
    ];
    match rng.random_range(0..10) {
        0 => String::new(),
        1 => "x".repeat(rng.random_range(100..300)),
        _ => (0..rng.random_range(1..8))
            .map(|_| PIECES[rng.random_range(0..PIECES.len())])
            .collect(),
    }
}

/// A random execute body that never names a runnable cell: either not a valid request at all,
/// or a `code` string with at least one invalid field next to it.
fn junk_body(rng: &mut rand::rngs::StdRng) -> Bytes {
    use rand::Rng;
    let weird = [
        json!(null),
        json!(-1),
        json!(0),
        json!(1e308),
        json!(-0.0),
        json!("NaN"),
        json!(true),
        json!([]),
        json!({}),
        json!("x".repeat(300)),
        json!("a b"),
        json!("../.."),
        json!(["nope", 1]),
    ];
    let pick = |rng: &mut rand::rngs::StdRng| weird[rng.random_range(0..weird.len())].clone();
    match rng.random_range(0..6) {
        0 => Bytes::from(
            (0..rng.random_range(0..64))
                .map(|_| rng.random::<u8>())
                .collect::<Vec<u8>>(),
        ),
        1 => {
            let text = json!({"code": "pass", "timeout": 5}).to_string();
            let cut = rng.random_range(0..text.len());
            Bytes::from(text[..cut].to_string())
        }
        2 => Bytes::from(json!({"code": pick(rng), "reset": "maybe"}).to_string()),
        _ => {
            let mut body = json!({"code": "pass"});
            // One field certainly invalid, others random.
            let fields = ["timeout", "child", "tools", "task_id", "reset", "unknown"];
            let bad = fields[rng.random_range(0..fields.len())];
            body[bad] = match bad {
                "timeout" => json!(-1),
                "child" => json!("a b"),
                "tools" => json!(["not_allowed"]),
                "task_id" => json!("t".repeat(300)),
                "reset" => json!("yes"),
                _ => json!(1),
            };
            for field in fields {
                if field != bad && rng.random_bool(0.3) {
                    body[field] = pick(rng);
                }
            }
            Bytes::from(body.to_string())
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn random_requests_never_get_a_5xx_or_a_dropped_connection() {
    use rand::{Rng, SeedableRng};
    let seed: u64 = rand::random();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let srv = TestServer::start("srv-fuzz", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let methods = [
        Method::GET,
        Method::POST,
        Method::DELETE,
        Method::PUT,
        Method::PATCH,
    ];
    // Sessions whose kernel an accepted upload (201) started.
    let mut uploaded = std::collections::BTreeSet::new();
    for i in 0..400 {
        let (method, template) = server::ROUTES[rng.random_range(0..server::ROUTES.len())];
        let mut method = Method::from_bytes(method.as_bytes()).expect("method");
        if rng.random_bool(0.1) {
            method = methods[rng.random_range(0..methods.len())].clone();
        }
        let session = junk_segment(&mut rng);
        let mut path = template
            .replace("{session}", &session)
            .replace("{child}", &junk_segment(&mut rng))
            .replace("{path}", &junk_segment(&mut rng));
        if rng.random_bool(0.05) {
            path = format!("/{}/{}", junk_segment(&mut rng), junk_segment(&mut rng));
        }
        // The path must stay a valid URI for the client to send it at all.
        if path.parse::<hyper::Uri>().is_err() {
            continue;
        }
        let token = match rng.random_range(0..10) {
            0 => None,
            1 => Some(junk_segment(&mut rng)),
            _ => Some("tok".to_string()),
        };
        let body = junk_body(&mut rng);
        let mut req = srv.api.build(method.clone(), &path, None, false, true);
        if let Some(t) = &token {
            req = req.header(AUTHORIZATION, format!("Bearer {t}"));
        }
        if rng.random_bool(0.3) {
            req = req.header(ACCEPT, "application/x-ndjson");
        }
        let req = req.body(Full::new(body.clone())).expect("request");
        let response = srv.api.http.request(req).await.unwrap_or_else(|e| {
            panic!("seed {seed}, request {i}: {method} {path}: connection failed: {e}")
        });
        let status = response.status();
        if status == hyper::StatusCode::CREATED && template.contains("/files") {
            uploaded.insert(session.clone());
        }
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("body")
            .to_bytes();
        assert!(
            !status.is_server_error(),
            "seed {seed}, request {i}: {method} {path} {body:?} -> {status} {}",
            String::from_utf8_lossy(&bytes)
        );
        if status.is_client_error() {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                panic!("seed {seed}: {method} {path} -> {status} without a JSON error body")
            });
            assert!(v["error"]["code"].is_string(), "seed {seed}: {v}");
        }
    }
    let kernels = srv.api.kernels("tok").await;
    assert!(
        kernels
            .iter()
            .all(|k| uploaded.contains(k["session"].as_str().unwrap_or_default())),
        "no junk request ran a cell: {kernels:?}, uploads to {uploaded:?}"
    );
    srv.finish().await;
}
