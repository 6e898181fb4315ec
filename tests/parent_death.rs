//! No container outlives the kernelbox process that owns it: the binary is run as a child
//! process and SIGKILLed mid-cell, idle, and mid-spawn; its containers and volumes must be
//! gone within 10 seconds (asserted through the Docker API). And with no watchdog at all, the
//! runner ends its own kernel when its stdin closes.

#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use common::CASE;
use futures::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};

fn kernelbox(label: &str, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(args)
        .arg("--label")
        .arg(format!("{CASE}={label}"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kernelbox")
}

/// Waits for the first container event `action` for the label.
async fn wait_event(engine: &std::sync::Arc<dyn kernelbox::Engine>, label: &str, action: &str) {
    let since = kernelbox::clock::unix_now() as i64 - 5;
    let mut events = engine.events(&[format!("{CASE}={label}")], Some(since));
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(Ok(event)) = events.next().await {
            if event.action == action {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no {action} event for {label}");
}

async fn assert_gone_within_10s(engine: &std::sync::Arc<dyn kernelbox::Engine>, label: &str) {
    let took = common::wait_gone(engine, label, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "a container outlived its kernelbox by more than 10 s"
    );
    // The watchdog removes the staging volume right after the container; wait for it the
    // same bounded way before the strict check.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !common::volumes(engine, label).await.is_empty() && std::time::Instant::now() < deadline {
        tokio::task::yield_now().await;
        let _ =
            tokio::time::timeout(Duration::from_millis(200), std::future::pending::<()>()).await;
    }
    common::assert_clean(engine, label).await;
}

#[tokio::test]
async fn kernel_exits_when_its_backend_parent_dies_mid_cell() {
    let engine = common::engine().await;
    let label = common::unique("death-midcell");
    // The repl streams a cell's output as it is written: once `running` arrives, the cell is
    // executing (and sleeps for five minutes), so the kill lands mid-cell.
    let mut child = kernelbox(
        &label,
        &["repl", "--session", "parent-death", "--timeout", "10m"],
    );
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"import time\nprint('running', flush=True)\ntime.sleep(300)\n\n")
        .await
        .expect("write cell");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), out.next_line()).await;
    assert!(
        matches!(line, Ok(Ok(Some(ref l))) if l == "running"),
        "the cell did not start: {line:?}"
    );
    assert_eq!(common::containers(&engine, &label).await.len(), 1);
    child.kill().await.expect("SIGKILL");
    child.wait().await.expect("reaped");
    drop(stdin);
    assert_gone_within_10s(&engine, &label).await;
}

/// With no watchdog, the runner alone ends its kernel when the host's end of its stdin closes,
/// even mid-cell (docs/reliability.md "How it works": a watcher thread exits the process the moment stdin
/// closes). The orchestrator runs in a runtime of its own; shutting that runtime down drops
/// every task and so the attach connection, while this process, the instance named on the
/// container, stays alive: no sweep of a dead instance, no watchdog and no `docker rm` is
/// what ends the container. The engine's events show it exit with code 0, never killed.
#[test]
fn the_runner_exits_on_its_own_when_its_stdin_closes_with_no_watchdog() {
    let label = common::unique("stdin-closed");
    let since = kernelbox::clock::unix_now() as i64 - 1;
    let orchestrator_runtime = tokio::runtime::Runtime::new().expect("runtime");
    let kernel = orchestrator_runtime.block_on(async {
        let engine = common::engine().await;
        let mut config = common::config(&label);
        config.housekeeping.watchdog = None;
        let kb = kernelbox::Orchestrator::start(config, engine)
            .await
            .expect("orchestrator starts");
        let cell = common::start_cell(
            &kb,
            "s",
            "import time\nprint('running', flush=True)\ntime.sleep(300)",
        )
        .await;
        let kernel = kb.list_kernels(None)[0].id.clone();
        // The cell stays in flight: dropping its handle detaches it, and dropping `kb` leaves
        // the orchestrator's tasks running until the runtime shuts down.
        drop(cell);
        kernel
    });
    let check = tokio::runtime::Runtime::new().expect("runtime");
    check.block_on(async {
        let engine = common::engine().await;
        let ids: Vec<String> = common::containers(&engine, &label)
            .await
            .into_iter()
            .map(|c| c.id)
            .collect();
        assert!(
            ids.len() == 1 && ids[0].starts_with(&kernel),
            "the kernel runs before its connection closes: {ids:?}"
        );
    });
    orchestrator_runtime.shutdown_timeout(Duration::from_secs(5));
    check.block_on(async {
        let engine = common::engine().await;
        let mut events = engine.events(&[format!("{CASE}={label}")], Some(since));
        let seen = tokio::time::timeout(Duration::from_secs(30), async {
            let mut seen = Vec::new();
            while let Some(Ok(event)) = events.next().await {
                // Only the kernel's (the orchestrator's start-up check creates a container too).
                if !event.id.starts_with(&kernel) {
                    continue;
                }
                seen.push((event.action.clone(), event.exit_code));
                if event.action == "destroy" {
                    break;
                }
            }
            seen
        })
        .await
        .expect("the container exits within 30 s of its stdin closing");
        assert!(
            seen.contains(&("die".to_string(), Some(0))),
            "the runner exited with 0: {seen:?}"
        );
        assert!(
            !seen.iter().any(|(action, _)| action == "kill"),
            "nothing killed it: {seen:?}"
        );
        assert!(common::containers(&engine, &label).await.is_empty());
        // The staging volume stays (removing it is the watchdog's job); this test removes it.
        for v in common::volumes(&engine, &label).await {
            kernelbox::docker::remove_volume_when_free(engine.as_ref(), &v.name)
                .await
                .expect("remove the staging volume");
        }
        common::assert_clean(&engine, &label).await;
    });
}

#[tokio::test]
async fn kernel_exits_when_its_backend_parent_dies_while_idle() {
    let engine = common::engine().await;
    let label = common::unique("death-idle");
    let mut child = kernelbox(&label, &["repl", "--session", "idle"]);
    let mut stdin = child.stdin.take().expect("stdin");
    stdin
        .write_all(b"x = 1\nprint('ready')\n\n")
        .await
        .expect("write cell");
    let mut out = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(30), out.next_line()).await;
    assert!(
        matches!(line, Ok(Ok(Some(ref l))) if l == "ready"),
        "{line:?}"
    );
    // The kernel is idle now, waiting for the next cell.
    assert_eq!(common::containers(&engine, &label).await.len(), 1);
    child.kill().await.expect("SIGKILL");
    child.wait().await.expect("reaped");
    drop(stdin);
    assert_gone_within_10s(&engine, &label).await;
}

#[tokio::test]
async fn kernel_exits_when_its_backend_parent_dies_mid_spawn() {
    let engine = common::engine().await;
    let label = common::unique("death-spawn");
    let mut child = kernelbox(&label, &["exec", "--session", "spawn", "print(1)"]);
    // Kill as soon as the container exists, before it has started.
    wait_event(&engine, &label, "create").await;
    child.kill().await.expect("SIGKILL");
    child.wait().await.expect("reaped");
    assert_gone_within_10s(&engine, &label).await;
}

/// A serve process SIGKILLed while 20 kernels across 10 owners are mid-cell.
#[tokio::test]
async fn a_server_killed_with_twenty_busy_kernels_leaves_nothing() {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper_util::client::legacy::Client;
    use hyper_util::rt::TokioExecutor;

    let engine = common::engine().await;
    let label = common::unique("death-serve");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let state = tempfile::tempdir().expect("state dir");
    let mut server = Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--max-kernels",
            "40",
            // No warm pool: the test counts the twenty busy kernels.
            "--pool",
            "0",
            "--timeout",
            "10m",
        ])
        .arg("--label")
        .arg(format!("{CASE}={label}"))
        .env("KERNELBOX_TOKEN", "death-token")
        .env("KERNELBOX_STATE_DIR", state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn kernelbox serve");
    // The server says where it serves once it is listening.
    let mut err = BufReader::new(server.stderr.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = err.next_line().await {
            if line.contains("serving") {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "the server did not start");
    // Its log (an access line per request: docs/logs.md) drained, so it never blocks on a
    // full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = err.next_line().await {} });

    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let post = |session: String, child: Option<String>| {
        let client = client.clone();
        let uri = format!("{base}/v1/sessions/{session}/execute");
        async move {
            let mut body = serde_json::json!({"code": "import time\nprint('busy', flush=True)\ntime.sleep(300)"});
            if let Some(child) = child {
                body["child"] = serde_json::json!(child);
            }
            let request = hyper::Request::post(uri)
                .header("authorization", "Bearer death-token")
                .body(Full::new(Bytes::from(body.to_string())))
                .unwrap();
            // The connection dies with the server; the outcome does not matter here.
            let _ = client.request(request).await;
        }
    };
    let mut calls = tokio::task::JoinSet::new();
    for owner in 0..10 {
        calls.spawn(post(format!("owner-{owner}"), None));
        calls.spawn(post(format!("owner-{owner}"), Some("helper".into())));
    }
    // Wait until the server reports all 20 kernels busy.
    let busy = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            let request = hyper::Request::get(format!("{base}/v1/kernels"))
                .header("authorization", "Bearer death-token")
                .body(Full::new(Bytes::new()))
                .unwrap();
            if let Ok(response) = client.request(request).await {
                let body = response.into_body().collect().await.unwrap().to_bytes();
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let n = v["kernels"]
                    .as_array()
                    .map(|k| k.iter().filter(|k| k["state"] == "busy").count())
                    .unwrap_or(0);
                if n == 20 {
                    return;
                }
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert!(busy.is_ok(), "20 kernels never became busy");
    assert_eq!(common::containers(&engine, &label).await.len(), 20);
    server.kill().await.expect("SIGKILL");
    server.wait().await.expect("reaped");
    assert_gone_within_10s(&engine, &label).await;
    calls.abort_all();
}
