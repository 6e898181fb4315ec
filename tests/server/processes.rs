//! Background processes (`docs/processes.md`) over real HTTP against the real engine: start,
//! list, stdin written and closed, output kept and read after the fact, a signal, a kill that
//! takes the process's children, a process flooding output (its kept output bounded), and the
//! per-session bound (the 17th start refused while the kernel and a cell's state stay).

use hyper::{Method, StatusCode};
use serde_json::{json, Value};

use crate::http::{tenant, tenants, TestServer};

const TOKEN: &str = "tok";

async fn start(srv: &TestServer, body: Value) -> Value {
    let reply = srv
        .api
        .post("/v1/sessions/s/processes", Some(TOKEN), body)
        .await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    reply.json()
}

/// The NDJSON events of a process's output, read to the end (the process must end).
async fn output(srv: &TestServer, id: u64) -> Vec<Value> {
    let reply = srv
        .api
        .get(
            &format!("/v1/sessions/s/processes/{id}/output"),
            Some(TOKEN),
        )
        .await;
    assert_eq!(reply.status, StatusCode::OK);
    reply
        .body
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice(l).expect("an event is JSON"))
        .collect()
}

fn text(events: &[Value], kind: &str) -> String {
    events
        .iter()
        .filter(|e| e["event"] == kind)
        .map(|e| e["data"].as_str().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_process_reads_its_stdin_and_its_output_and_exit_stay_readable() {
    let srv = TestServer::start("proc-stdin", tenants(vec![tenant("acme", TOKEN)]), |_| {}).await;
    let p = start(
        &srv,
        json!({"command": "cat; echo done >&2; exit 3", "stdin": true}),
    )
    .await;
    let id = p["id"].as_u64().expect("id");
    assert_eq!(p["running"], true);
    assert_eq!(p["stdin_open"], true);
    let path = format!("/v1/sessions/s/processes/{id}/stdin");
    let written = srv
        .api
        .send_bytes(
            Method::POST,
            &path,
            Some(TOKEN),
            false,
            Some("héllo\n".into()),
        )
        .await;
    assert_eq!(written.status, StatusCode::OK, "{}", written.json());
    assert_eq!(written.json()["written"], 7);
    let closed = srv.api.delete(&path, TOKEN).await;
    assert_eq!(closed.status, StatusCode::OK, "{}", closed.json());
    // The output stream ends once the process did: kept output, then the exit.
    let events = output(&srv, id).await;
    assert_eq!(text(&events, "stdout"), "héllo\n");
    assert_eq!(text(&events, "stderr"), "done\n");
    assert_eq!(events.last().expect("events")["event"], "exit");
    assert_eq!(events.last().expect("events")["exit_code"], 3);
    let list = srv
        .api
        .get("/v1/sessions/s/processes", Some(TOKEN))
        .await
        .json();
    let listed = &list["processes"][0];
    assert_eq!(
        (listed["id"].as_u64(), &listed["running"]),
        (Some(id), &json!(false))
    );
    assert_eq!(listed["exit_code"], 3);
    assert!(listed["pid"].as_u64().is_some(), "{listed}");
    // Read again: the same (a reader that comes late gets what is kept).
    assert_eq!(text(&output(&srv, id).await, "stdout"), "héllo\n");
    // A closed stdin refuses writes.
    let refused = srv
        .api
        .send_bytes(Method::POST, &path, Some(TOKEN), false, Some("x".into()))
        .await;
    assert_eq!(refused.error(StatusCode::CONFLICT), "stdin_closed");
    // Clearing the session forgets its processes: a later conversation of the same name
    // cannot read them.
    let cleared = srv.api.delete("/v1/sessions/s", TOKEN).await;
    assert_eq!(cleared.status, StatusCode::OK, "{}", cleared.json());
    let list = srv
        .api
        .get("/v1/sessions/s/processes", Some(TOKEN))
        .await
        .json();
    assert_eq!(list["processes"], json!([]), "{list}");
    let gone = srv
        .api
        .get(
            &format!("/v1/sessions/s/processes/{id}/output"),
            Some(TOKEN),
        )
        .await;
    assert_eq!(gone.status, StatusCode::NOT_FOUND);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_signal_ends_a_process_and_a_kill_takes_its_children() {
    let srv = TestServer::start("proc-signal", tenants(vec![tenant("acme", TOKEN)]), |_| {}).await;
    srv.api.run(TOKEN, "s", "x = 41").await;
    let p = start(&srv, json!({"command": ["sleep", "1000"]})).await;
    let id = p["id"].as_u64().expect("id");
    // The pid comes on the leader's first line: retry while it is still starting.
    let signal = format!("/v1/sessions/s/processes/{id}/signal");
    let mut reply = srv
        .api
        .post(&signal, Some(TOKEN), json!({"signal": "TERM"}))
        .await;
    for _ in 0..50 {
        if reply.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        reply = srv
            .api
            .post(&signal, Some(TOKEN), json!({"signal": "TERM"}))
            .await;
    }
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    let events = output(&srv, id).await;
    assert_eq!(
        events.last().expect("events")["exit_code"],
        143,
        "{events:?}"
    );
    let bad = srv
        .api
        .post(&signal, Some(TOKEN), json!({"signal": "SEGV"}))
        .await;
    assert_eq!(bad.error(StatusCode::BAD_REQUEST), "invalid_signal");

    // A process whose child runs in the background: the kill takes both.
    let p = start(&srv, json!({"command": "sleep 1001 & sleep 1002"})).await;
    let id = p["id"].as_u64().expect("id");
    let path = format!("/v1/sessions/s/processes/{id}");
    let mut killed = srv.api.delete(&path, TOKEN).await;
    for _ in 0..50 {
        if killed.status != StatusCode::CONFLICT {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        killed = srv.api.delete(&path, TOKEN).await;
    }
    assert_eq!(killed.status, StatusCode::OK, "{}", killed.json());
    assert_eq!(killed.json()["running"], false, "{}", killed.json());
    let left = srv
        .api
        .run(
            TOKEN,
            "s",
            "import os\nprint(sum('sleep' in open('/proc/%s/cmdline' % p).read() for p in os.listdir('/proc') if p.isdigit()), x)",
        )
        .await;
    assert_eq!(left["output"], "0 41\n", "{left}");
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flooding_process_keeps_a_bounded_tail_and_the_session_bound_holds() {
    let srv = TestServer::start("proc-flood", tenants(vec![tenant("acme", TOKEN)]), |_| {}).await;
    // 20 MiB of output: what is kept is the last 256 KiB, the rest is counted.
    let p = start(
        &srv,
        json!({"command": "head -c 20971520 /dev/zero | tr '\\0' 'y'; echo THE-END"}),
    )
    .await;
    let id = p["id"].as_u64().expect("id");
    // A reader that keeps up gets it all; one that comes after the end gets the kept tail.
    let live = output(&srv, id).await;
    assert_eq!(live.last().expect("events")["exit_code"], 0);
    let events = output(&srv, id).await;
    let dropped: u64 = events
        .iter()
        .filter(|e| e["event"] == "output_truncated")
        .map(|e| e["bytes"].as_u64().unwrap_or(0))
        .sum();
    let kept = text(&events, "stdout");
    assert!(kept.len() <= 256 * 1024, "{}", kept.len());
    assert!(
        kept.ends_with("yyyTHE-END\n"),
        "{}",
        &kept[kept.len() - 20..]
    );
    assert_eq!(dropped + kept.len() as u64, 20 * 1024 * 1024 + 8);
    let info = srv
        .api
        .get(&format!("/v1/sessions/s/processes/{id}"), Some(TOKEN))
        .await
        .json();
    assert_eq!(info["output_bytes"], 20 * 1024 * 1024 + 8);

    // 16 running processes per session; the 17th is refused, the kernel is fine.
    for _ in 0..16 {
        start(&srv, json!({"command": ["sleep", "1000"]})).await;
    }
    let refused = srv
        .api
        .post(
            "/v1/sessions/s/processes",
            Some(TOKEN),
            json!({"command": ["sleep", "1000"]}),
        )
        .await;
    assert_eq!(
        refused.error(StatusCode::TOO_MANY_REQUESTS),
        "too_many_processes"
    );
    let cell = srv.api.run(TOKEN, "s", "print('alive')").await;
    assert_eq!(cell["output"], "alive\n");
    // The session's clear ends them all with the kernel.
    let cleared = srv.api.delete("/v1/sessions/s", TOKEN).await;
    assert_eq!(cleared.status, StatusCode::OK);
    srv.finish().await;
}
