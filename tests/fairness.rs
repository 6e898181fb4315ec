//! The host's kernel cap shared fairly between tenants, over real HTTP against the real engine:
//! one tenant's demand evicts another's idle kernels only while that tenant holds more than its
//! fair share (or its `reserved` count); past that a tenant pays with its own idle kernels, or
//! gets 429 with `Retry-After`. Every survivor is checked through the Docker API.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::collections::BTreeSet;

use hyper::header::RETRY_AFTER;
use hyper::StatusCode;
use serde_json::{json, Value};

use http::{tenant, tenants, Api, TestServer};

/// Short ids of a tenant's kernels as the API lists them, by session.
async fn kernel_ids(api: &Api, token: &str) -> BTreeSet<(String, String)> {
    api.kernels(token)
        .await
        .iter()
        .map(|k| {
            (
                k["session"].as_str().unwrap().to_string(),
                k["id"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn sessions(kernels: &BTreeSet<(String, String)>) -> Vec<String> {
    kernels.iter().map(|(s, _)| s.clone()).collect()
}

fn ids(kernels: &BTreeSet<(String, String)>) -> Vec<String> {
    let mut ids: Vec<String> = kernels.iter().map(|(_, id)| id.clone()).collect();
    ids.sort();
    ids
}

/// A cell's kernel must be the one it had, with its state and no loss reported.
async fn still_there(api: &Api, token: &str, session: &str, value: i64) {
    let r = api.run(token, session, "print(v)").await;
    assert_eq!(r["output"], format!("{value}\n"), "{r}");
    assert_eq!(r["kernel"]["reused"], true, "{r}");
    assert!(r["kernel"].get("state_lost").is_none(), "{r}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_at_its_fair_share_keeps_its_kernels_against_another_tenants_demand() {
    let srv = TestServer::start(
        "fair",
        tenants(vec![tenant("ta", "tok-a"), tenant("tb", "tok-b")]),
        |c| c.kernels.max_session_kernels = 4,
    )
    .await;
    let api = &srv.api;

    // A fills the host with idle sessions.
    for i in 0..4 {
        api.run("tok-a", &format!("a{i}"), &format!("v = {i}"))
            .await;
    }
    assert_eq!(srv.tenant_containers("ta").await.len(), 4);

    // B's new sessions take A's least recently used kernels while A holds more than its share
    // (4 kernels / 2 tenants = 2).
    api.run("tok-b", "b0", "v = 100").await;
    api.run("tok-b", "b1", "v = 101").await;
    let a = kernel_ids(api, "tok-a").await;
    assert_eq!(sessions(&a), vec!["a2", "a3"]);

    // A is at its share: B's next new session costs B its own least recently used kernel.
    let b2 = api.run("tok-b", "b2", "v = 102").await;
    assert!(b2["kernel"].get("state_lost").is_none(), "{b2}");
    assert_eq!(sessions(&kernel_ids(api, "tok-b").await), vec!["b1", "b2"]);
    assert_eq!(
        srv.tenant_containers("ta").await,
        ids(&a),
        "A's containers at its share survive, in Docker too"
    );
    assert_eq!(srv.tenant_containers("tb").await.len(), 2);

    // B's kernels all busy: B's next new session is refused (429, Retry-After), naming the
    // host's cap, whether it asks for a stream or not; A still loses nothing.
    let mut busy = Vec::new();
    for s in ["b1", "b2"] {
        let mut events = api
            .stream(
                "tok-b",
                s,
                json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(60)"}),
            )
            .await;
        events.until_output("started").await;
        busy.push(events);
    }
    let refused = api.execute("tok-b", "b3", json!({"code": "1"})).await;
    assert_eq!(refused.error(StatusCode::TOO_MANY_REQUESTS), "at_capacity");
    assert_eq!(refused.headers[RETRY_AFTER], "1");
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("kernel cap (4 kernels)"), "{message}");
    assert!(message.contains("fair share is 2"), "{message}");
    let refused = api
        .execute_ndjson("tok-b", "b4", json!({"code": "1"}))
        .await;
    assert_eq!(refused.error(StatusCode::TOO_MANY_REQUESTS), "at_capacity");
    assert_eq!(refused.headers[RETRY_AFTER], "1");
    assert_eq!(srv.tenant_containers("ta").await, ids(&a));

    // A's kernels at its share kept their state, with no loss reported.
    still_there(api, "tok-a", "a2", 2).await;
    still_there(api, "tok-a", "a3", 3).await;

    // B's busy cells end when interrupted; nothing else was touched.
    for (s, mut events) in ["b1", "b2"].into_iter().zip(busy) {
        let r = api.interrupt("tok-b", s).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.json());
        let result = events.result().await;
        assert_eq!(result["status"], "interrupted", "{result}");
        assert_eq!(result["error"], common::INTERRUPTED, "{result}");
    }
    let text = api.metrics("tok-b").await;
    assert!(
        text.contains("kernelbox_host_cap_evictions_total{victim=\"other_tenant\"} 2"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_host_cap_evictions_total{victim=\"own_tenant\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("kernelbox_requests_rejected_total{reason=\"capacity\"} 2"),
        "{text}"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reservation_overrides_the_fair_share() {
    let mut a: Value = tenant("ra", "tok-a");
    a["reserved"] = json!(3);
    let srv = TestServer::start("reserved", tenants(vec![a, tenant("rb", "tok-b")]), |c| {
        c.kernels.max_session_kernels = 4
    })
    .await;
    let api = &srv.api;
    for i in 0..4 {
        api.run("tok-a", &format!("a{i}"), &format!("v = {i}"))
            .await;
    }
    // A keeps 3 (not the even 2): B gets the one left, then pays with its own.
    api.run("tok-b", "b0", "v = 100").await;
    let kept = kernel_ids(api, "tok-a").await;
    assert_eq!(sessions(&kept), vec!["a1", "a2", "a3"]);
    let b1 = api.run("tok-b", "b1", "v = 101").await;
    assert!(b1["kernel"].get("state_lost").is_none(), "{b1}");
    assert_eq!(sessions(&kernel_ids(api, "tok-b").await), vec!["b1"]);
    assert_eq!(srv.tenant_containers("ra").await, ids(&kept));
    for i in 1..4 {
        still_there(api, "tok-a", &format!("a{i}"), i).await;
    }
    // The evicted session of B learns of its loss.
    let back = api.run("tok-b", "b0", "print('v' in dir())").await;
    assert_eq!(back["kernel"]["state_lost"]["reason"], "evicted", "{back}");
    srv.finish().await;
}

#[tokio::test]
async fn reservations_beyond_the_host_cap_fail_serve_with_exit_2() {
    let dir = std::env::temp_dir().join(common::unique("reserved"));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("tenants.json");
    let mut a = tenant("a", "tok-a");
    a["reserved"] = json!(2);
    let mut b = tenant("b", "tok-b");
    b["reserved"] = json!(2);
    std::fs::write(&file, json!({"tenants": [a, b]}).to_string()).expect("write");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--max-kernels", "3"])
        .arg("--tenants")
        .arg(&file)
        .output()
        .await
        .expect("run kernelbox serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(&file.display().to_string()), "{stderr}");
    assert!(stderr.contains("reserved"), "{stderr}");
    assert!(stderr.contains("--max-kernels 3"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
