//! No container outlives the kernelbox process that owns it: the binary is run as a child
//! process and SIGKILLed mid-cell, idle, and mid-spawn; its containers and volumes must be
//! gone within 10 seconds (asserted through the Docker API).

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
    let since = kernelbox::kernel::unix_now() as i64 - 5;
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
    let mut child = kernelbox(
        &label,
        &[
            "exec",
            "--session",
            "parent-death",
            "--timeout",
            "10m",
            "import time\nprint('running', flush=True)\ntime.sleep(300)",
        ],
    );
    wait_event(&engine, &label, "start").await;
    assert_eq!(common::containers(&engine, &label).await.len(), 1);
    child.kill().await.expect("SIGKILL");
    child.wait().await.expect("reaped");
    assert_gone_within_10s(&engine, &label).await;
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
