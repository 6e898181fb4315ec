//! `POST /v1/sessions/{session}/interrupt` with cells queued behind a running one: every
//! cancelled cell ends `interrupted` (the queued ones without running), and the count
//! answered covers them all.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use hyper::StatusCode;
use serde_json::{json, Value};

use http::{tenant, tenants, TestServer};

/// Waits (bounded) until the session's kernel has `attached` calls and is busy.
async fn wait_attached(srv: &TestServer, attached: u64) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let kernels = srv.api.kernels("tok").await;
        if kernels
            .iter()
            .any(|k| k["session"] == "s" && k["state"] == "busy" && k["attached"] == attached)
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never {attached} attached: {kernels:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn queued_cells_of_an_interrupted_session_end_interrupted_without_running() {
    let srv = TestServer::start(
        "interrupt-queued",
        tenants(vec![tenant("acme", "tok")]),
        |_| {},
    )
    .await;
    let execute = |code: &'static str| {
        let api = srv.api.clone();
        tokio::spawn(async move {
            let reply = api
                .execute("tok", "s", json!({"code": code, "timeout": 300}))
                .await;
            assert_eq!(reply.status, StatusCode::OK);
            reply.json()
        })
    };
    let running = execute("import time\ntime.sleep(100)");
    wait_attached(&srv, 1).await;
    let queued = [execute("queued_one = 1"), execute("queued_two = 2")];
    wait_attached(&srv, 3).await;

    let reply = srv.api.interrupt("tok", "s").await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(
        reply.json(),
        json!({"interrupted": 3}),
        "every cancelled cell counts"
    );

    let first: Value = running.await.unwrap();
    assert_eq!(first["status"], "interrupted", "{first}");
    assert_eq!(first["kernel"]["execution_count"], 1, "{first}");
    for cell in queued {
        let r: Value = cell.await.unwrap();
        assert_eq!(r["status"], "interrupted", "{r}");
        assert_eq!(r["exit_code"], -1, "{r}");
        assert_eq!(r["kernel"]["execution_count"], 0, "it never ran: {r}");
        let error = r["error"].as_str().unwrap_or_default();
        assert!(error.starts_with("Interrupted before it ran"), "{r}");
    }
    // Nothing of the queued cells ran, and the interrupted kernel's loss is reported once.
    let next = srv
        .api
        .run("tok", "s", "print('queued_one' in dir())")
        .await;
    assert_eq!(next["output"], "False\n", "{next}");
    assert_eq!(next["kernel"]["state_lost"]["reason"], "killed", "{next}");
    assert!(common::containers(&srv.engine, &srv.label).await.len() == 1);
    srv.finish().await;
}
