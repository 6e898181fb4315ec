//! Every endpoint and status code, tenant isolation, and a tenant's kernel cap.

use bytes::Bytes;
use hyper::header::{CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, StatusCode};
use serde_json::json;

use kernelbox::server;

use crate::common::INTERRUPTED;
use crate::http::{tenant, tenants, TestServer};

#[tokio::test(flavor = "multi_thread")]
async fn execute_keeps_state_and_every_error_is_json_with_the_right_status() {
    let srv = TestServer::start("srv-basic", tenants(vec![tenant("acme", "tok-a")]), |_| {}).await;
    let api = &srv.api;

    // Unauthenticated endpoints.
    let health = api.get("/healthz", None).await;
    assert_eq!(health.status, StatusCode::OK);
    assert_eq!(health.json()["status"], "ok");

    // 401 without a token, with a wrong one, with another scheme.
    let body = json!({"code": "1"});
    let r = api.post("/v1/sessions/s/execute", None, body.clone()).await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    let r = api
        .post("/v1/sessions/s/execute", Some("nope"), body.clone())
        .await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    let r = api.get("/v1/kernels", None).await;
    assert_eq!(r.error(StatusCode::UNAUTHORIZED), "unauthorized");
    assert!(r.headers.contains_key(hyper::header::WWW_AUTHENTICATE));

    // State persists across cells of a session.
    let first = api.run("tok-a", "s", "x = 41").await;
    assert_eq!(first["kernel"]["reused"], false);
    let second = api.run("tok-a", "s", "print(x + 1)").await;
    assert_eq!(second["output"], "42\n");
    assert_eq!(second["kernel"]["reused"], true);
    assert_eq!(second["kernel"]["execution_count"], 2);

    // A cell that raises is a 200 with status error.
    let r = api.execute("tok-a", "s", json!({"code": "1/0"})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["status"], "error");
    assert!(r.json()["error"]
        .as_str()
        .expect("traceback")
        .contains("ZeroDivisionError"));

    let kernels = api.kernels("tok-a").await;
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0]["session"], "s");
    assert_eq!(kernels[0]["tenant"], "acme");

    // 400: names that would break labels or paths, bad JSON, bad fields, bad timeouts.
    let r = api.execute("tok-a", "a%20b", body.clone()).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api.execute("tok-a", "a::child::b", body.clone()).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api
        .execute("tok-a", "s", json!({"code": "1", "child": "../etc"}))
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");
    let r = api
        .send_bytes(
            Method::POST,
            "/v1/sessions/s/execute",
            Some("tok-a"),
            false,
            Some(Bytes::from_static(b"{\"code\": ")),
        )
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_json");
    for bad in [
        json!({}),
        json!({"code": 1}),
        json!({"code": "1", "colour": "red"}),
    ] {
        let r = api.execute("tok-a", "s", bad.clone()).await;
        assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_json", "{bad}");
    }
    for timeout in [json!(-1), json!(0), json!(1e9), json!("soon")] {
        let r = api
            .execute("tok-a", "s", json!({"code": "1", "timeout": timeout}))
            .await;
        assert_eq!(
            r.error(StatusCode::BAD_REQUEST),
            "invalid_timeout",
            "{timeout}"
        );
    }
    let r = api
        .execute("tok-a", "s", json!({"code": "1", "tools": ["web_search"]}))
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "tool_not_allowed");

    // 413 for a body over 1 MiB.
    let big = json!({ "code": format!("s = '{}'", "x".repeat(2 * 1024 * 1024)) });
    let r = api.execute("tok-a", "s", big).await;
    assert_eq!(r.error(StatusCode::PAYLOAD_TOO_LARGE), "payload_too_large");

    // 404 for unknown routes, 405 for a wrong method; both JSON.
    let r = api.get("/v1/nope", Some("tok-a")).await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api.get("/v1/sessions/s/execute", Some("tok-a")).await;
    assert_eq!(
        r.error(StatusCode::METHOD_NOT_ALLOWED),
        "method_not_allowed"
    );

    // Nothing running: interrupt is 404. Release of an unknown child is 404.
    let r = api
        .post("/v1/sessions/s/interrupt", Some("tok-a"), json!({}))
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api.delete("/v1/sessions/s/children/c1", "tok-a").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .delete("/v1/sessions/s/children/bad%2Fname", "tok-a")
        .await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_name");

    // A delegated child gets its own kernel; releasing it disposes of it.
    let child = api
        .execute(
            "tok-a",
            "s",
            json!({"code": "print('x' in globals())", "child": "c1"}),
        )
        .await;
    assert_eq!(child.json()["output"], "False\n", "{}", child.json());
    assert_eq!(api.kernels("tok-a").await.len(), 2);
    let r = api.delete("/v1/sessions/s/children/c1", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["released"], 1);

    // Clear: the session's kernel goes; clearing again is 404; the next cell starts afresh.
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["cleared"], 1);
    assert!(api.kernels("tok-a").await.is_empty());
    let r = api.delete("/v1/sessions/s", "tok-a").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let fresh = api.run("tok-a", "s", "print('x' in globals())").await;
    assert_eq!(fresh["output"], "False\n");

    // Metrics: Prometheus text, every label value present, counts moved.
    let m = api.get("/metrics", Some("tok-a")).await;
    assert_eq!(m.status, StatusCode::OK);
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(m.headers[CONTENT_TYPE]
        .to_str()
        .expect("ct")
        .starts_with("text/plain"));
    assert!(text.contains("kernelbox_kernels_live 1"), "{text}");
    assert!(
        text.contains("kernelbox_cells_total{status=\"success\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cells_total{status=\"error\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cells_total{status=\"timeout\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_state_lost_total{reason=\"oom\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_tool_calls_total{outcome=\"ok\"} 0"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_cell_duration_seconds_bucket{status=\"success\",le=\"+Inf\"} 4"),
        "{text}"
    );

    // The OpenAPI document describes every route the server answers, and the server answers
    // every route the document describes (no route is "unknown").
    let spec = api.get("/openapi.json", None).await;
    assert_eq!(spec.status, StatusCode::OK);
    let spec = spec.json();
    assert_eq!(spec["openapi"], "3.1.0");
    for (method, path) in server::ROUTES {
        assert!(
            spec["paths"][path][method.to_ascii_lowercase()].is_object(),
            "{method} {path} is not in /openapi.json"
        );
        let concrete = path.replace("{session}", "zz").replace("{child}", "cc");
        let method = Method::from_bytes(method.as_bytes()).expect("method");
        let r = api
            .send_bytes(
                method.clone(),
                &concrete,
                Some("tok-a"),
                false,
                Some(Bytes::from_static(b"{}")),
            )
            .await;
        if r.status == StatusCode::NOT_FOUND {
            assert_ne!(
                r.json()["error"]["message"]
                    .as_str()
                    .map(|m| m.starts_with("no route")),
                Some(true),
                "{method} {path}"
            );
        }
    }
    assert_eq!(
        spec["paths"].as_object().expect("paths").len(),
        server::ROUTES
            .iter()
            .map(|r| r.1)
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    );

    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn tenants_never_see_reach_or_clear_each_others_kernels() {
    let srv = TestServer::start(
        "srv-isolation",
        tenants(vec![
            tenant("alpha", "tok-alpha"),
            tenant("beta", "tok-beta"),
        ]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    api.run("tok-alpha", "shared", "secret = 'alpha-only'")
        .await;

    // Beta sees nothing, and cannot clear, interrupt or release alpha's session.
    assert!(api.kernels("tok-beta").await.is_empty());
    let r = api.delete("/v1/sessions/shared", "tok-beta").await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .post("/v1/sessions/shared/interrupt", Some("tok-beta"), json!({}))
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");
    let r = api
        .delete("/v1/sessions/shared/children/c", "tok-beta")
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "not_found");

    // The same session name under beta is beta's own kernel.
    let b = api
        .run("tok-beta", "shared", "print(globals().get('secret'))")
        .await;
    assert_eq!(b["output"], "None\n");
    assert_eq!(b["kernel"]["reused"], false);

    // Alpha's state survived all of it, and each tenant lists only its own kernel.
    let a = api.run("tok-alpha", "shared", "print(secret)").await;
    assert_eq!(a["output"], "alpha-only\n");
    assert_eq!(a["kernel"]["reused"], true);
    let alpha = api.kernels("tok-alpha").await;
    let beta = api.kernels("tok-beta").await;
    assert_eq!(alpha.len(), 1);
    assert_eq!(beta.len(), 1);
    assert_eq!(alpha[0]["tenant"], "alpha");
    assert_eq!(beta[0]["tenant"], "beta");
    assert_ne!(alpha[0]["id"], beta[0]["id"]);

    // Beta clearing its own "shared" leaves alpha's alone.
    let r = api.delete("/v1/sessions/shared", "tok-beta").await;
    assert_eq!(r.json()["cleared"], 1);
    let a = api.run("tok-alpha", "shared", "print(secret)").await;
    assert_eq!(a["output"], "alpha-only\n");

    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_at_its_cap_gets_429_when_busy_and_evicts_when_idle() {
    let mut entry = tenant("small", "tok");
    entry["max_kernels"] = json!(1);
    let srv = TestServer::start("srv-capacity", tenants(vec![entry]), |_| {}).await;
    let api = &srv.api;

    let mut busy = api
        .stream(
            "tok",
            "s1",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(30)"}),
        )
        .await;
    busy.until_output("started").await;
    let r = api.execute("tok", "s2", json!({"code": "1"})).await;
    assert_eq!(r.error(StatusCode::TOO_MANY_REQUESTS), "at_capacity");
    assert_eq!(r.headers[RETRY_AFTER], "1");

    let r = api
        .post("/v1/sessions/s1/interrupt", Some("tok"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let result = busy.result().await;
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["error"], INTERRUPTED, "{result}");

    // Room again; and at the cap with an idle kernel, the idle one is evicted.
    api.run("tok", "s2", "y = 2").await;
    api.run("tok", "s3", "z = 3").await;
    let kernels = api.kernels("tok").await;
    assert_eq!(kernels.len(), 1, "{kernels:?}");
    assert_eq!(kernels[0]["session"], "s3");
    let m = api.get("/metrics", Some("tok")).await;
    let text = String::from_utf8_lossy(&m.body).to_string();
    assert!(
        text.contains("kernelbox_requests_rejected_total{reason=\"capacity\"} 1"),
        "{text}"
    );
    assert!(
        // s1's interrupted kernel is kept (idle), so s2 evicts it, and s3 evicts s2's.
        text.contains("kernelbox_tenant_evictions_total 2"),
        "{text}"
    );
    srv.finish().await;
}
