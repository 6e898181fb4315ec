//! Streaming executes: live output, interrupt, and a client that does not read.

use std::time::{Duration, Instant};

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::common::INTERRUPTED;
use crate::http::{tenant, tenants, TestServer};

#[tokio::test(flavor = "multi_thread")]
async fn streaming_delivers_output_before_the_cell_ends() {
    let srv = TestServer::start("srv-stream", tenants(vec![tenant("acme", "tok")]), |_| {}).await;
    let mut events = srv
        .api
        .stream(
            "tok",
            "s",
            json!({"code": "print('a', flush=True); import time; time.sleep(1); print('b')"}),
        )
        .await;
    let first = events.next().await.expect("an event");
    let first_at = Instant::now();
    assert_eq!(
        first,
        json!({"event": "output", "data": "a\n", "stream": "stdout"})
    );
    let mut output = String::from("a\n");
    let result = loop {
        let event = events.next().await.expect("more events");
        let at = Instant::now();
        match event["event"].as_str() {
            Some("output") => output.push_str(event["data"].as_str().expect("data")),
            Some("result") => break (event["result"].clone(), at),
            _ => panic!("unexpected event {event}"),
        }
    };
    assert_eq!(output, "a\nb\n");
    assert_eq!(result.0["status"], "success");
    assert_eq!(result.0["output"], "a\nb\n");
    // 'a' arrived while the cell was still sleeping, not with the result.
    assert!(
        result.1.duration_since(first_at) >= Duration::from_millis(700),
        "output was not live: {:?}",
        result.1.duration_since(first_at)
    );
    assert!(
        events.next().await.is_none(),
        "the stream ends after the result"
    );
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn interrupt_stops_a_running_cell_and_its_state_is_kept() {
    let srv = TestServer::start(
        "srv-interrupt",
        tenants(vec![tenant("acme", "tok")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    api.run("tok", "s", "x = 1").await;
    let mut events = api
        .stream(
            "tok",
            "s",
            json!({"code": "print('started', flush=True)\nimport time\ntime.sleep(30)"}),
        )
        .await;
    events.until_output("started").await;
    let started = Instant::now();
    let r = api
        .post("/v1/sessions/s/interrupt", Some("tok"), json!({}))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    assert_eq!(r.json()["interrupted"], 1);
    let result = events.result().await;
    let at = Instant::now();
    assert_eq!(result["status"], "interrupted", "{result}");
    assert_eq!(result["error"], INTERRUPTED, "{result}");
    assert_eq!(result["exit_code"], -1);
    assert!(at.duration_since(started) < Duration::from_secs(20));

    // The cell stopped on KeyboardInterrupt: the kernel and its state are kept.
    let next = api.run("tok", "s", "print('x' in globals())").await;
    assert_eq!(next["output"], "True\n");
    assert_eq!(next["kernel"]["reused"], true);
    assert_eq!(next["kernel"]["state_lost"], Value::Null, "{next}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_streaming_client_that_does_not_read_loses_output_not_server_memory() {
    let srv = TestServer::start(
        "srv-stream-slow",
        tenants(vec![tenant("acme", "tok-a")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    // 4 MB of output (under the result's 5 MB cap) that becomes ~24 MB of NDJSON: far more
    // than the server's stream backlog and the loopback socket buffers together.
    let code =
        "import sys\nsys.stdout.write('\\x01' * 4_000_000)\nsys.stdout.flush()\nprint('END')";
    let mut events = api.stream("tok-a", "s", json!({ "code": code })).await;
    // The client reads nothing until the cell is over; the cell never waits for it.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let kernels = api.kernels("tok-a").await;
        if kernels
            .iter()
            .any(|k| k["session"] == "s" && k["attached"] == 0 && k["execution_count"] == 1)
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cell did not finish: {kernels:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mut streamed, mut dropped, mut result) = (0usize, 0usize, None);
    while let Some(event) = events.next().await {
        match event["event"].as_str() {
            Some("output") => streamed += event["data"].as_str().expect("data").len(),
            Some("output_truncated") => dropped += event["bytes"].as_u64().expect("bytes") as usize,
            Some("result") => result = Some(event["result"].clone()),
            _ => panic!("unexpected event {event}"),
        }
    }
    let result = result.expect("the result arrives after the dropped output");
    assert_eq!(result["status"], "success", "{result}");
    assert!(
        dropped > 0,
        "output was dropped, not buffered ({streamed} streamed)"
    );
    assert_eq!(
        streamed + dropped,
        4_000_004,
        "every byte is streamed or counted"
    );
    srv.finish().await;
}
