//! Edges of the request format over real HTTP against the real engine: every JSON body must
//! be an object, every bad `timeout` gets the same 400 `invalid_timeout`, and `.` and `..`
//! (percent-encoded or not) are no session or child names, before any container exists.
//!
//! Each test labels what it creates with a unique `io.kernelbox-test.case` and ends by
//! asserting through the Docker API that nothing with that label is left.

mod common;
#[path = "common/raw.rs"]
mod raw;

use std::time::Duration;

use tokio_util::sync::CancellationToken;

use kernelbox::server::{self, AppState, Tenant, Tenants};
use kernelbox::Orchestrator;

const TOKEN: &str = "tok-edge";

#[tokio::test(flavor = "multi_thread")]
async fn bodies_must_be_objects_and_bad_timeouts_get_one_error() {
    let label = common::unique("edge-bodies");
    let engine = common::engine().await;
    let config = common::config(&label);
    assert_eq!(config.cells.max_timeout, Duration::from_secs(3600));
    let orchestrator = Orchestrator::start(config, engine.clone())
        .await
        .expect("orchestrator starts");
    let tenants = Tenants::new(vec![Tenant::with_token("acme", TOKEN)]).expect("valid tenants");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::serve(
        listener,
        AppState::new(orchestrator, tenants),
        shutdown.clone(),
        Duration::from_secs(10),
    ));
    let path = "/v1/sessions/edge/execute";

    // Not an object: refused, whatever serde could make of it (an array of the fields
    // would otherwise run `print(1)`).
    for body in [
        "[]",
        "[\"print(1)\"]",
        "[\"print(1)\", false, 5]",
        "\"x\"",
        "1",
        "null",
    ] {
        let reply = raw::post(addr, path, TOKEN, body.as_bytes()).await;
        let (code, message) = reply.error(400);
        assert_eq!(code, "invalid_json", "{body}: {message}");
        assert!(
            message.starts_with("the request body must be a JSON object, got "),
            "{body}: {message}"
        );
    }

    // Every bad timeout: the same code, the same message shape.
    for (timeout, shown) in [
        ("0", "0.0"),
        ("-1", "-1.0"),
        ("1e300", "1e300"),
        ("3601", "3601.0"),
        ("\"abc\"", "\"abc\""),
        ("\"30\"", "\"30\""),
        ("true", "true"),
        ("[1]", "[1]"),
    ] {
        let body = format!("{{\"code\": \"print(1)\", \"timeout\": {timeout}}}");
        let reply = raw::post(addr, path, TOKEN, body.as_bytes()).await;
        let (code, message) = reply.error(400);
        assert_eq!(code, "invalid_timeout", "{timeout}: {message}");
        assert_eq!(
            message,
            format!("timeout {shown} is not a number of seconds in (0, 3600]"),
            "{timeout}"
        );
    }
    assert!(
        common::containers(&engine, &label).await.is_empty(),
        "a refused request created a container"
    );

    // null is "no timeout given": the default applies and the cell runs.
    let reply = raw::post(
        addr,
        path,
        TOKEN,
        b"{\"code\": \"print(1)\", \"timeout\": null}",
    )
    .await;
    let result = reply.json();
    assert_eq!(reply.status, 200, "{result}");
    assert_eq!(result["output"], "1\n", "{result}");

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the server stops")
        .expect("server task")
        .expect("server ran cleanly");
    common::assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn the_library_refuses_a_timeout_out_of_range_with_the_same_error() {
    let case = common::Case::new("edge-lib-timeout").await;
    for timeout in [Duration::ZERO, Duration::from_secs(3601)] {
        let err = case
            .kb
            .execute(kernelbox::ExecuteRequest {
                timeout: Some(timeout),
                ..kernelbox::ExecuteRequest::new("s", "print(1)")
            })
            .await
            .expect_err("out of range");
        let kernelbox::ExecuteError::InvalidTimeout(invalid) = &err else {
            panic!("not the timeout error: {err}");
        };
        assert_eq!(invalid.max, Duration::from_secs(3600));
        // The HTTP edge maps it to the code and message a bad HTTP `timeout` gets.
        let api = server::ApiError::from(err);
        assert_eq!(api.status, 400);
        assert_eq!(api.code, "invalid_timeout");
        let shown = format!("{:?}", timeout.as_secs_f64());
        assert_eq!(
            api.message,
            format!("timeout {shown} is not a number of seconds in (0, 3600]")
        );
    }
    assert!(case.containers().await.is_empty());
    case.finish().await;
}

/// `--max-timeout` lowers the longest timeout a request may ask for: a default above it is a
/// configuration error (exit 2) before any container exists.
#[tokio::test]
async fn max_timeout_bounds_the_timeout_a_request_may_ask_for() {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["exec", "--max-timeout", "1s", "--timeout", "2s", "pass"])
        .output()
        .await
        .expect("run kernelbox");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("timeout 2.0 is not a number of seconds in (0, 1]"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn dot_and_dot_dot_are_no_names_on_any_route_encoded_or_not() {
    let label = common::unique("edge-dots");
    let engine = common::engine().await;
    let orchestrator = Orchestrator::start(common::config(&label), engine.clone())
        .await
        .expect("orchestrator starts");
    let tenants = Tenants::new(vec![Tenant::with_token("acme", TOKEN)]).expect("valid tenants");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::serve(
        listener,
        AppState::new(orchestrator, tenants),
        shutdown.clone(),
        Duration::from_secs(10),
    ));

    let cell = b"{\"code\": \"print(1)\"}".as_slice();
    for dots in ["..", ".", "%2E%2E", "%2e%2e", ".%2E", "%2E"] {
        // Sent as is: nothing on the way resolves the dot segments.
        for (method, path, body) in [
            ("POST", format!("/v1/sessions/{dots}/execute"), cell),
            ("POST", format!("/v1/sessions/{dots}/interrupt"), b"{}"),
            ("DELETE", format!("/v1/sessions/{dots}"), b""),
            ("DELETE", format!("/v1/sessions/s/children/{dots}"), b""),
            ("GET", format!("/v1/sessions/{dots}/files/a.txt"), b""),
            ("GET", format!("/v1/sessions/{dots}/files"), b""),
        ] {
            let request = raw::request(method, &path, Some(TOKEN), body, true);
            let reply = raw::roundtrip(addr, &request).await;
            let (code, message) = reply.error(400);
            assert_eq!(code, "invalid_name", "{method} {path}: {message}");
            assert!(
                message.starts_with("invalid "),
                "{method} {path}: {message}"
            );
        }
    }
    for child in ["..", "."] {
        let body = format!("{{\"code\": \"print(1)\", \"child\": \"{child}\"}}");
        let reply = raw::post(addr, "/v1/sessions/s/execute", TOKEN, body.as_bytes()).await;
        assert_eq!(reply.error(400).0, "invalid_name", "child {child}");
    }
    assert!(
        common::containers(&engine, &label).await.is_empty(),
        "a refused request created a container"
    );

    shutdown.cancel();
    tokio::time::timeout(Duration::from_secs(60), task)
        .await
        .expect("the server stops")
        .expect("server task")
        .expect("server ran cleanly");
    common::assert_clean(&engine, &label).await;
}
