//! State lost across a restart of the real `kernelbox serve` binary is reported: after a
//! `kill -9` (the watchdog removes the kernels) or a clean SIGTERM (shutdown removes them), a
//! new server on the same `--state-dir` tells each owner whose kernel was live
//! `state_lost: server_restarted` once, generations keep counting, and owners that had no
//! kernel are told nothing. A second server on the same state directory exits 2.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use common::{assert_clean, containers, engine, unique, volumes};
use kernelbox::Engine;

const TOKEN: &str = "restart-token";

/// One `kernelbox serve` process.
struct Server {
    child: Child,
    addr: SocketAddr,
    /// The rest of its stderr, drained so the server never blocks on it.
    stderr: tokio::task::JoinHandle<Vec<String>>,
}

fn serve_command(state: &Path, label: &str) -> Command {
    let mut cmd = common::serve_command(label, TOKEN);
    cmd.arg("--state-dir")
        .arg(state)
        .env_remove("KERNELBOX_STATE_DIR")
        .stdin(Stdio::null())
        .stdout(Stdio::null());
    cmd
}

impl Server {
    async fn start(state: &Path, label: &str) -> Server {
        let mut child = serve_command(state, label)
            .spawn()
            .expect("spawn kernelbox serve");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let addr = common::serving_addr(&mut lines).await;
        let stderr = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push(line);
            }
            rest
        });
        Server {
            child,
            addr,
            stderr,
        }
    }

    /// Runs a cell that must succeed and returns the result's `kernel` object.
    async fn run(&self, session: &str, code: &str) -> Value {
        let http = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let req = hyper::Request::builder()
            .method("POST")
            .uri(format!(
                "http://{}/v1/sessions/{session}/execute",
                self.addr
            ))
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(json!({ "code": code }).to_string())))
            .expect("request");
        let body = tokio::time::timeout(Duration::from_secs(90), async {
            let response = http.request(req).await.expect("HTTP request");
            assert_eq!(response.status(), 200);
            response
                .into_body()
                .collect()
                .await
                .expect("response body")
                .to_bytes()
        })
        .await
        .expect("the cell answers within 90s");
        let result: Value = serde_json::from_slice(&body).expect("JSON result");
        assert_eq!(result["status"], "success", "{result}");
        result["kernel"].clone()
    }

    /// `kill -9`: no shutdown runs; only the watchdog cleans up.
    async fn kill_9(mut self) {
        self.child.kill().await.expect("SIGKILL");
        self.stderr.abort();
    }

    /// SIGTERM; the server must exit 0.
    async fn terminate(mut self) {
        let status = common::terminate(&mut self.child, Duration::from_secs(60)).await;
        let stderr = self.stderr.await.unwrap_or_default().join("\n");
        assert_eq!(status.code(), Some(0), "{stderr}");
    }
}

/// Polls the engine until nothing of the case is left (the watchdog's or shutdown's work).
async fn wait_until_gone(engine: &Arc<dyn Engine>, label: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = containers(engine, label).await.len() + volumes(engine, label).await.len();
        if left == 0 {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{left} containers/volumes still there after 60s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn loss_reason(kernel: &Value) -> Option<&str> {
    kernel
        .get("state_lost")
        .map(|l| l["reason"].as_str().expect("reason"))
}

/// A session with a live kernel, a server that goes away by `stop`, and a second server on
/// the same state directory.
async fn restart_reports_the_loss(name: &str, clean: bool) {
    let label = unique(name);
    let engine = engine().await;
    let state = tempfile::tempdir().expect("state dir");

    let first = Server::start(state.path(), &label).await;
    let kernel = first.run("s", "x = 41").await;
    assert_eq!(kernel["generation"], 1, "{kernel}");
    assert_eq!(loss_reason(&kernel), None);
    // The server keeps a warm pool (its default): the session's kernel is one of the
    // containers, most likely one it took from the pool.
    let id = kernel["id"].as_str().expect("id");
    assert!(
        containers(&engine, &label)
            .await
            .iter()
            .any(|c| c.id.starts_with(id)),
        "{kernel}"
    );
    if clean {
        first.terminate().await;
    } else {
        first.kill_9().await;
    }
    wait_until_gone(&engine, &label).await;

    let second = Server::start(state.path(), &label).await;
    let kernel = second.run("s", "print('x' in globals())").await;
    assert_eq!(
        loss_reason(&kernel),
        Some("server_restarted"),
        "the first call after the restart is told: {kernel}"
    );
    assert_eq!(kernel["generation"], 2, "{kernel}");
    assert!(kernel["state_lost"]["at"]
        .as_str()
        .is_some_and(|a| !a.is_empty()));
    let again = second.run("s", "y = 1").await;
    assert_eq!(loss_reason(&again), None, "told once: {again}");
    assert_eq!(again["generation"], 2);
    assert_eq!(again["reused"], true);
    let never = second.run("never-used", "z = 1").await;
    assert_eq!(loss_reason(&never), None, "{never}");
    assert_eq!(never["generation"], 1);

    // A second server on the same state directory is refused while this one holds it.
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        serve_command(state.path(), &label).output(),
    )
    .await
    .expect("the second server gives up within 60s")
    .expect("run kernelbox serve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("in use by another kernelbox"), "{stderr}");
    assert!(
        stderr.contains(&state.path().display().to_string()),
        "{stderr}"
    );

    second.terminate().await;
    assert_clean(&engine, &label).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn after_kill_9_and_a_restart_the_loss_is_reported_and_generations_continue() {
    restart_reports_the_loss("restart-kill", false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn after_sigterm_and_a_restart_the_loss_is_reported_and_generations_continue() {
    restart_reports_the_loss("restart-term", true).await;
}
