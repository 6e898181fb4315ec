//! The Docker engine restarts while kernels run: the call in flight gets a clear error, later
//! calls report `state_lost: engine_restarted` and get fresh kernels, and kernelbox reconnects
//! by itself.
//!
//! Restarting the engine disturbs everything else on the machine, so this test is ignored by a
//! plain `cargo test`; `.ci/run` runs it on its own, last:
//! `cargo test --test engine_restart -- --ignored`. It needs root and a `dockerd` process.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Case;
use kernelbox::{CellStatus, LossReason};

fn dockerd_pid() -> Option<u32> {
    let out = std::process::Command::new("pgrep")
        .args(["-x", "dockerd"])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// Stops dockerd with SIGTERM, waits for it to exit, and starts it again with the same
/// command line. The new dockerd must outlive this test, so it is never waited for.
#[allow(clippy::zombie_processes)]
fn restart_dockerd() {
    let pid = dockerd_pid().expect("a dockerd process to restart");
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    let args: Vec<String> = cmdline
        .split(|&b| b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let status = std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "dockerd did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = std::fs::File::create("/tmp/kernelbox-test-dockerd.log").unwrap();
    std::process::Command::new("setsid")
        .args(&args)
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("restart dockerd");
}

#[tokio::test]
#[ignore = "restarts the Docker engine; run alone with --ignored (.ci/run does)"]
async fn an_engine_restart_is_survived_and_reported() {
    let case = Case::new("engine-restart").await;
    let first = case.run("idle", "x = 1").await;
    assert_eq!(first.status, CellStatus::Success);
    // A cell in flight while the engine goes down.
    let busy = common::start_cell(
        &case.kb,
        "busy",
        "import time\nprint('go', flush=True)\ntime.sleep(120)",
    )
    .await;

    tokio::task::spawn_blocking(restart_dockerd).await.unwrap();

    let in_flight = busy.await.unwrap().expect("a result, not a hang");
    assert_eq!(in_flight.exit_code, -1, "{in_flight:?}");
    let error = in_flight.error.clone().unwrap_or_default();
    assert!(error.contains("engine restarted"), "{in_flight:?}");

    // Wait for the engine to answer again (bounded), then use kernelbox without restarting it.
    let deadline = Instant::now() + Duration::from_secs(60);
    while case.engine.ping().await.is_err() {
        assert!(Instant::now() < deadline, "the engine did not come back");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let after = case.run("idle", "print('x' in dir())").await;
    assert_eq!(after.status, CellStatus::Success, "{after:?}");
    assert!(after.output.contains("False"));
    assert_eq!(
        after.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::EngineRestarted),
        "{after:?}"
    );
    let busy_again = case.run("busy", "print('fresh')").await;
    assert!(busy_again.output.contains("fresh"));
    case.finish().await;
}
