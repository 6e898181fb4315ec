//! docs/cluster.md, "Migration on drain": draining a node moves its idle runsc kernels to
//! other live nodes (checkpoint, stream over the hop, catalog move, restore there) instead
//! of ending them; the owner's next call, through the balancer, finds its variables and the
//! same generation, told `kernel.migrated {from_node}`. A kernel busy at the drain's
//! deadline is still ended and told `node_drained`. The hop route refuses a sender without
//! the cluster's secret and a stream cut in half, leaving no file behind.

use std::time::Instant;

use bytes::Bytes;
use serde_json::json;

use crate::admin::admin_cli;
use crate::harness::{
    generation, lost, poll, success, Cluster, Options, FORWARDED, HOP, SLOW, TOKEN,
};

/// The files under a node's migrations' working directory (`services/migration/`).
fn migration_files(cluster: &Cluster, i: usize) -> Vec<String> {
    let root = cluster.nodes[i]
        .state_dir()
        .join("snapshots")
        .join(".migrations");
    let mut found = Vec::new();
    let mut stack = vec![root];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn draining_a_node_migrates_its_idle_runsc_kernel_and_loses_the_busy_one_at_the_deadline() {
    let cluster = Cluster::start(
        "cl-migrate",
        Options {
            runtime: Some("runsc"),
            balancer: true,
            drain_deadline: Some("15s"),
            ..Options::default()
        },
    )
    .await;
    let drained = 0;
    let node = &cluster.nodes[drained];
    let first = success(
        &node
            .api
            .execute(
                TOKEN,
                "kept",
                json!({"code": "x = 41\nblob = bytes(8 << 20)\nprint('set')"}),
            )
            .await,
    );
    let before = generation(&first);
    assert_eq!(cluster.catalog_node("kept").await.as_deref(), Some("n1"));
    // A second session on the same node runs a cell past the drain's deadline.
    success(
        &node
            .api
            .execute(TOKEN, "busy", json!({"code": "y = 1"}))
            .await,
    );
    let api = node.api.clone();
    let busy = tokio::spawn(async move {
        api.execute(
            TOKEN,
            "busy",
            json!({"code": "import time\ntime.sleep(120)"}),
        )
        .await
    });
    poll("the busy session's cell running", SLOW, || async {
        let kernels = cluster.nodes[drained].kernels().await;
        kernels
            .iter()
            .any(|k| k["session"] == "busy" && k["state"] == "busy")
            .then_some(())
    })
    .await;

    // The hop route: without the cluster's secret it is not there; a stream cut in half is
    // refused, nothing of it kept.
    let target = &cluster.nodes[1];
    let path = format!("/v1/nodes/{}/migrations", target.name);
    let forged = target
        .api
        .send_bytes(
            hyper::Method::POST,
            &path,
            None,
            false,
            Some(Bytes::from_static(b"KBMIGR1\n")),
        )
        .await;
    assert_eq!(forged.error(hyper::StatusCode::NOT_FOUND), "not_found");
    let secret = cluster.hop_secret().await;
    let mut cut = b"KBMIGR1\n".to_vec();
    cut.extend_from_slice(&4096u32.to_be_bytes());
    cut.extend_from_slice(b"{\"key\":");
    let request = target
        .api
        .build(hyper::Method::POST, &path, None, false, false)
        .header(HOP, secret.as_str())
        .header(FORWARDED, "n9")
        .body(http_body_util::Full::new(Bytes::from(cut)))
        .expect("request");
    let reply =
        crate::http::Reply::read(target.api.http.request(request).await.expect("HTTP")).await;
    assert_eq!(
        reply.error(hyper::StatusCode::BAD_REQUEST),
        "migration_transfer"
    );
    assert!(migration_files(&cluster, 1).is_empty());

    // Drain: the idle kernel moves, the catalog places the session elsewhere.
    let drained_at = Instant::now();
    admin_cli(&cluster.nodes[1].api.base, &["drain", &node.name]).await;
    let to = poll(
        "the idle session moved off the drained node",
        SLOW,
        || async { cluster.catalog_node("kept").await.filter(|n| n != "n1") },
    )
    .await;
    let moved_after = drained_at.elapsed();
    // Its next call, through the balancer (any node), finds its variables.
    let call_at = Instant::now();
    let reply = poll("the migrated session's next call", SLOW, || async {
        let reply = cluster
            .balancer()
            .api
            .execute(TOKEN, "kept", json!({"code": "print(x + 1, len(blob))"}))
            .await;
        (reply.status != hyper::StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
    })
    .await;
    let first_call = call_at.elapsed();
    let result = success(&reply);
    eprintln!(
        "migration: drain to catalog move {moved_after:?}, first call after it {first_call:?}, to {to}"
    );
    assert!(
        result["stdout"]
            .as_str()
            .unwrap_or("")
            .contains("42 8388608"),
        "{result}"
    );
    assert_eq!(result["kernel"]["migrated"]["from_node"], "n1", "{result}");
    assert_eq!(lost(&result), None, "{result}");
    assert_eq!(generation(&result), before, "{result}");
    // Once told, never again.
    let again = success(
        &cluster
            .balancer()
            .api
            .execute(TOKEN, "kept", json!({"code": "print(x)"}))
            .await,
    );
    assert!(again["kernel"].get("migrated").is_none(), "{again}");

    // The busy kernel is ended at the deadline and told node_drained.
    let ended = tokio::time::timeout(SLOW, busy)
        .await
        .expect("the busy cell ended by the deadline")
        .expect("the busy call");
    let ended = ended.json();
    assert_ne!(ended["status"], "success", "{ended}");
    poll("the busy kernel removed", SLOW, || async {
        cluster
            .session_containers("busy")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    let reply = poll("the busy session's next call", SLOW, || async {
        let reply = cluster.nodes[1]
            .api
            .execute(TOKEN, "busy", json!({"code": "print(1)"}))
            .await;
        (reply.status != hyper::StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
    })
    .await;
    let result = success(&reply);
    assert_eq!(lost(&result).as_deref(), Some("node_drained"), "{result}");
    assert!(migration_files(&cluster, 0).is_empty());
    cluster.finish().await;
}
