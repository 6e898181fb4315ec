//! Capacity and lifecycle holes, over real HTTP against the real engine: no kernel outlives
//! its registration (a reset or a clear during a running cell kills the old kernel at once, so
//! every live container is listed and counted by the caps), calls piling up on one kernel are
//! refused past a bound, live delegated children have a bounded pool, and SIGTERM waits for
//! cells whose client went away. Every count is checked through the Docker API.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;
#[path = "common/raw.rs"]
mod raw;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::process::Stdio;
use std::time::Duration;

use hyper::header::RETRY_AFTER;
use hyper::{Method, StatusCode};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use common::{assert_clean, containers, engine, unique, CASE};
use http::{tenant, tenants, Api, TestServer};
use kernelbox::MAX_ATTACHED_PER_SLOT;

const TOKEN: &str = "tok-holes";

fn addr_of(api: &Api) -> SocketAddr {
    api.base.trim_start_matches("http://").parse().unwrap()
}

/// Sends an execute on a connection of its own and returns the connection unread (the caller
/// drops it to go away).
async fn send_execute(addr: SocketAddr, session: &str, body: Value) -> tokio::net::TcpStream {
    let mut stream = raw::connect(addr).await;
    let path = format!("/v1/sessions/{session}/execute");
    let request = raw::request(
        "POST",
        &path,
        Some(TOKEN),
        body.to_string().as_bytes(),
        true,
    );
    stream.write_all(&request).await.unwrap();
    stream
}

/// Polls `/v1/kernels` until `check` holds for the session's entry (deadline 60s).
async fn wait_kernel(api: &Api, session: &str, what: &str, check: impl Fn(&Value) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let kernels = api.kernels(TOKEN).await;
        if kernels
            .iter()
            .any(|k| k["session"] == session && k.get("child").is_none() && check(k))
        {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: not seen within 60s: {kernels:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Every live container of the case is a kernel `/v1/kernels` lists, and their number is
/// within `max`.
async fn books_match_docker(srv: &TestServer, max: usize) {
    let listed: BTreeSet<String> = srv
        .api
        .kernels(TOKEN)
        .await
        .iter()
        .map(|k| k["id"].as_str().unwrap().to_string())
        .collect();
    let live: BTreeSet<String> = srv.tenant_containers("t").await.into_iter().collect();
    assert!(
        live.len() <= max,
        "{} live containers, cap {max}",
        live.len()
    );
    assert_eq!(
        live, listed,
        "every live container is listed, and only those"
    );
}

const LONG: &str = "print('started', flush=True)\nimport time\ntime.sleep(60)";

#[tokio::test(flavor = "multi_thread")]
async fn reset_or_clear_during_a_running_cell_leaves_no_kernel_outside_the_caps() {
    let srv = TestServer::start("holes-reset", tenants(vec![tenant("t", TOKEN)]), |c| {
        c.kernels.max_session_kernels = 2
    })
    .await;
    let api = &srv.api;
    let addr = addr_of(api);

    // Resets during long cells whose clients went away: one kernel at a time, the listed one.
    for generation in 1..=4u64 {
        let body = json!({"code": LONG, "timeout": 60, "reset": true});
        let conn = send_execute(addr, "r1", body).await;
        wait_kernel(api, "r1", "the reset's kernel busy", |k| {
            k["generation"] == generation && k["state"] == "busy"
        })
        .await;
        drop(conn);
        books_match_docker(&srv, 1).await;
    }

    // A clear between long cells: the kernel goes with the answer, and its cell says why.
    let mut events = api.stream(TOKEN, "d1", json!({"code": LONG})).await;
    events.until_output("started").await;
    let cleared = api
        .send(Method::DELETE, "/v1/sessions/d1", TOKEN, false, None)
        .await;
    assert_eq!(cleared.status, StatusCode::OK);
    assert_eq!(cleared.json(), json!({"cleared": 1}));
    books_match_docker(&srv, 1).await;
    let result = events.result().await;
    assert_eq!(result["status"], "error", "{result}");
    assert!(
        result["error"]
            .as_str()
            .unwrap()
            .contains("cleared or reset by another request"),
        "{result}"
    );
    // r1's abandoned cell goes with its session.
    let cleared = api
        .send(Method::DELETE, "/v1/sessions/r1", TOKEN, false, None)
        .await;
    assert_eq!(cleared.json(), json!({"cleared": 1}));
    books_match_docker(&srv, 0).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_queued_on_one_kernel_are_bounded() {
    let srv = TestServer::start("holes-busy", tenants(vec![tenant("t", TOKEN)]), |_| {}).await;
    let api = &srv.api;
    let addr = addr_of(api);
    api.run(TOKEN, "s", "x = 1").await;
    // One long cell, then abandoned requests with large bodies queued behind it.
    let padding = format!("# {}\n", "x".repeat(200_000));
    let mut held = Vec::new();
    for n in 1..=MAX_ATTACHED_PER_SLOT {
        let body = json!({"code": format!("{padding}import time\ntime.sleep(60)"), "timeout": 60});
        held.push(send_execute(addr, "s", body).await);
        wait_kernel(api, "s", "the call attached", |k| k["attached"] == n).await;
    }
    drop(held);
    // One more is refused at once, not queued.
    let body = json!({"code": format!("{padding}1")});
    let mut conn = send_execute(addr, "s", body).await;
    let refused = raw::read_response(&mut conn).await;
    let (code, message) = refused.error(429);
    assert_eq!(code, "session_busy", "{message}");
    assert!(refused.head.to_ascii_lowercase().contains("retry-after: 1"));
    assert!(message.contains("8 calls running or queued"), "{message}");
    // Another session is not affected.
    api.run(TOKEN, "other", "y = 2").await;
    let metrics = api.metrics(TOKEN).await;
    assert!(
        metrics.contains("kernelbox_requests_rejected_total{reason=\"session_busy\"} 1"),
        "{metrics}"
    );
    books_match_docker(&srv, 2).await;
    // The clear ends the running cell and every queued one at once.
    let cleared = api
        .send(Method::DELETE, "/v1/sessions/s", TOKEN, false, None)
        .await;
    assert_eq!(cleared.json(), json!({"cleared": 1}));
    books_match_docker(&srv, 1).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn live_children_are_bounded_host_wide_and_released_ones_leave_the_pool() {
    let srv = TestServer::start("holes-children", tenants(vec![tenant("t", TOKEN)]), |c| {
        c.kernels.max_session_kernels = 2
    })
    .await;
    let api = &srv.api;
    let child = |c: &str| json!({"code": "x = 1", "child": c});
    for c in ["c0", "c1"] {
        let r = api.execute(TOKEN, "s", child(c)).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    }
    // The pool of live children is as large as the host's cap: the third is refused.
    let refused = api.execute(TOKEN, "s", child("c2")).await;
    assert_eq!(refused.error(StatusCode::TOO_MANY_REQUESTS), "at_capacity");
    assert_eq!(refused.headers[RETRY_AFTER], "1");
    let message = refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("delegated children is full (2 children"),
        "{message}"
    );
    // Sessions keep the host's cap of their own.
    api.run(TOKEN, "s", "y = 1").await;
    books_match_docker(&srv, 3).await;
    // A released child leaves the pool; releasing a child that never ran is 404 and costs
    // nothing.
    let released = api
        .send(
            Method::DELETE,
            "/v1/sessions/s/children/c0",
            TOKEN,
            false,
            None,
        )
        .await;
    assert_eq!(released.json(), json!({"released": 1}));
    for i in 0..200 {
        let path = format!("/v1/sessions/s/children/never-{i}");
        let reply = api.send(Method::DELETE, &path, TOKEN, false, None).await;
        assert_eq!(reply.error(StatusCode::NOT_FOUND), "not_found");
    }
    let r = api.execute(TOKEN, "s", child("c2")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    books_match_docker(&srv, 3).await;
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_a_cell_whose_client_went_away_finish() {
    let label = unique("holes-drain");
    let engine = engine().await;
    let state = tempfile::tempdir().unwrap();
    let project = tempfile::tempdir().unwrap();
    // The kernel's user writes the proof of its cell's end here.
    std::fs::set_permissions(
        project.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o777),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        // No warm pool: this test counts the session's one container.
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--drain-timeout",
            "60s",
            "--pool",
            "0",
        ])
        .arg("--state-dir")
        .arg(state.path())
        .arg("--project")
        .arg(project.path())
        .arg("--label")
        .arg(format!("{CASE}={label}"))
        .env("KERNELBOX_TOKEN", TOKEN)
        .env_remove("KERNELBOX_TENANTS")
        .env_remove("KERNELBOX_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr = common::serving_addr(&mut lines).await;
    let stderr = tokio::spawn(async move {
        let mut rest = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            rest.push(line);
        }
        rest
    });
    let api = Api::new(addr);

    // A cell that outlives its client by a few seconds, then leaves a file.
    let code = "import time\ntime.sleep(5)\nopen('finished', 'w').write('yes')";
    let conn = send_execute(addr, "s", json!({"code": code, "timeout": 60})).await;
    wait_kernel(&api, "s", "the cell running", |k| k["state"] == "busy").await;
    drop(conn);
    assert_eq!(containers(&engine, &label).await.len(), 1);

    let status = common::terminate(&mut child, Duration::from_secs(90)).await;
    let stderr = stderr.await.unwrap_or_default().join("\n");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let proof = std::fs::read_to_string(project.path().join("finished")).unwrap_or_default();
    assert_eq!(
        proof, "yes",
        "the cell ran to its end before the exit: {stderr}"
    );
    assert_clean(&engine, &label).await;
}
