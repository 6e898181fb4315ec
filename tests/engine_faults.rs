//! The engine unreachable at start: the CLI exits with a clear error (exit code 3); the server
//! keeps retrying with backoff and comes up by itself once the engine answers.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

fn docker_socket() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .and_then(|h| h.strip_prefix("unix://").map(str::to_string))
        .unwrap_or_else(|| "/var/run/docker.sock".into())
}

#[tokio::test]
async fn the_cli_exits_clearly_when_the_engine_is_unreachable() {
    let out = Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["exec", "print(1)"])
        .env("DOCKER_HOST", "unix:///nonexistent/docker.sock")
        .output()
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("docker engine unreachable"), "{stderr}");
}

#[tokio::test]
async fn the_server_retries_until_the_engine_answers() {
    let dir = std::env::temp_dir().join(common::unique("kernelbox-sock"));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("docker.sock");
    let label = common::unique("late-engine");
    let state = tempfile::tempdir().expect("state dir");
    let mut server = Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(["serve", "--listen", "127.0.0.1:0", "--label"])
        .arg(format!("{}={label}", common::CASE))
        .env("KERNELBOX_STATE_DIR", state.path())
        .env("DOCKER_HOST", format!("unix://{}", socket.display()))
        .env("KERNELBOX_TOKEN", "late")
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let outcome = tokio::time::timeout(Duration::from_secs(60), async {
        let mut retries = 0;
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("retrying") {
                retries += 1;
                if retries == 2 {
                    // The engine "comes up": its socket appears where the server looks.
                    std::os::unix::fs::symlink(docker_socket(), &socket).unwrap();
                }
            }
            if line.contains("serving") {
                return retries;
            }
        }
        0
    })
    .await;
    assert!(matches!(outcome, Ok(n) if n >= 2), "{outcome:?}");
    // SIGTERM: a clean stop, exit 0.
    let status = common::terminate(&mut server, Duration::from_secs(30)).await;
    assert!(status.success(), "{status:?}");
    let _ = std::fs::remove_dir_all(&dir);
    common::assert_clean(&common::engine().await, &label).await;
}
