//! Soak: mixed load (spawns, cells, evictions, timeouts, resets, hostile cells) for a while,
//! then no leaked containers, volumes or file descriptors, and flat memory.
//!
//! CI runs it for 30 s; the full run is 10 minutes:
//! `KERNELBOX_SOAK_SECS=600 cargo test --release --test soak -- --nocapture`.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::Case;
use kernelbox::{CellStatus, ExecuteRequest};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// The cell mix: mostly ordinary work, some errors, resets, timeouts and hostile output.
fn cell(i: u64) -> (ExecuteRequest, &'static str) {
    let (code, reset, timeout, kind) = match i % 10 {
        0 => ("import time\ntime.sleep(5)", false, 1, "timeout"),
        1 => ("raise ValueError('boom')", false, 30, "error"),
        2 => ("print('x' * 2_000_000)", false, 30, "big-output"),
        3 => ("n = globals().get('n', 0) + 1\nprint(n)", true, 30, "reset"),
        4 => ("import os\nos.write(1, b'fd\\n')\nimport subprocess, sys\nsubprocess.run([sys.executable, '-c', 'print(1)'])", false, 30, "subprocess"),
        _ => ("n = globals().get('n', 0) + 1\nprint(n)", false, 30, "ok"),
    };
    (
        ExecuteRequest {
            reset,
            timeout: Some(Duration::from_secs(timeout)),
            ..ExecuteRequest::new(format!("soak-{}", i % 8), code)
        },
        kind,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_load_leaks_nothing() {
    let secs: u64 = std::env::var("KERNELBOX_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let case = Case::with("soak", |c| c.kernels.max_session_kernels = 3).await;
    // Warm up so the baseline includes the runtime's and the client's steady state.
    for i in 0..8 {
        case.run(&format!("soak-{i}"), "pass").await;
    }
    let fds_before = open_fds();
    let rss_before = rss_kib();
    let deadline = Instant::now() + Duration::from_secs(secs);
    let workers = (0..4u64).map(|w| {
        let kb = case.kb.clone();
        async move {
            let mut counts = std::collections::BTreeMap::<&str, u64>::new();
            let mut i = w;
            while Instant::now() < deadline {
                let (request, kind) = cell(i);
                // Four workers over a cap of three: a worker whose session needs a new kernel
                // while the other three run is refused (the cap is hard); like any client told
                // to retry later, it backs off before its next cell.
                let r = match kb.execute(request).await {
                    Err(kernelbox::ExecuteError::AtCapacity { .. }) => {
                        *counts.entry("at_capacity").or_default() += 1;
                        i += 4;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    r => r.expect("execute"),
                };
                match kind {
                    "timeout" => assert_eq!(r.status, CellStatus::Timeout, "{r:?}"),
                    "error" => assert_eq!(r.status, CellStatus::Error, "{r:?}"),
                    _ => assert_eq!(r.status, CellStatus::Success, "{kind}: {r:?}"),
                }
                *counts.entry(kind).or_default() += 1;
                i += 4;
            }
            counts
        }
    });
    let totals = futures::future::join_all(workers).await;
    let cells: u64 = totals.iter().flat_map(|c| c.values()).sum();
    let rss_after = rss_kib();
    let fds_after = open_fds();
    let live = case.containers().await.len();
    println!(
        "soak {secs}s: {cells} cells {totals:?}; live kernels {live}; rss {rss_before} -> {rss_after} KiB; fds {fds_before} -> {fds_after}"
    );
    assert!(live <= 3, "the LRU cap holds in Docker: {live}");
    case.finish().await;
    // Idle connections in the Docker client's pool may come and go; kernels' streams must not.
    let fds_end = open_fds();
    assert!(
        fds_end <= fds_before + 8,
        "fd leak: {fds_before} -> {fds_end}"
    );
    assert!(
        rss_after < rss_before + 32 * 1024,
        "memory grew: {rss_before} -> {rss_after} KiB"
    );
}
