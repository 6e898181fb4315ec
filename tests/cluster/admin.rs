//! docs/cluster.md, "Routing" (the tenant's cap across the cluster) and "Admin": draining a
//! node with `kernelbox drain`, seen in `kernelbox nodes`, and taking it back.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use crate::harness::{poll, success, Cluster, Options, ADMIN, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_cap_holds_across_nodes() {
    let cluster = Cluster::start(
        "cl-cap",
        Options {
            tenant_cap: Some(2),
            ..Options::default()
        },
    )
    .await;
    let [a, b, c] = [&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]];
    success(&a.api.execute(TOKEN, "c1", json!({"code": "1"})).await);
    success(&b.api.execute(TOKEN, "c2", json!({"code": "1"})).await);
    assert_eq!(a.sessions().await, ["c1"]);
    assert_eq!(b.sessions().await, ["c2"]);
    // A third session is refused on the node with none of the tenant's kernels, and on a
    // node with one (below its own cap), whichever node it asks.
    for node in [c, a] {
        let reply = node.api.execute(TOKEN, "c3", json!({"code": "1"})).await;
        assert_eq!(
            reply.error(StatusCode::TOO_MANY_REQUESTS),
            "at_capacity",
            "on {}",
            node.name
        );
    }
    assert_eq!(cluster.containers().await.len(), 2);
    // A session ended gives its room back.
    assert_eq!(
        a.api.delete("/v1/sessions/c1", TOKEN).await.status,
        StatusCode::OK
    );
    // Requests that start no kernel (a body that is not JSON, a bad timeout) leave no live
    // session behind: each is given back, so the tenant keeps its room.
    for (i, node) in [a, b, c].into_iter().enumerate() {
        let reply = node
            .api
            .send_bytes(
                hyper::Method::POST,
                &format!("/v1/sessions/junk{i}/execute"),
                Some(TOKEN),
                false,
                Some(bytes::Bytes::from_static(b"garbage")),
            )
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST);
    }
    poll(
        "c3 admitted once the junk claims are given back",
        Duration::from_secs(10),
        || async {
            let reply = c.api.execute(TOKEN, "c3", json!({"code": "1"})).await;
            (reply.status == StatusCode::OK).then_some(())
        },
    )
    .await;
    assert_eq!(
        b.api.delete("/v1/sessions/c2", TOKEN).await.status,
        StatusCode::OK
    );
    // The junk requests' claims were given back (in the background: wait for it).
    poll(
        "the failed requests' claims given back",
        Duration::from_secs(10),
        || async {
            let reply = a.api.execute(TOKEN, "c4", json!({"code": "1"})).await;
            (reply.status == StatusCode::OK).then_some(())
        },
    )
    .await;
    cluster.finish().await;
}

/// Runs `kernelbox ARGS --url URL --admin-token ADMIN`; returns its stdout (it must exit 0).
pub(crate) async fn admin_cli(url: &str, args: &[&str]) -> String {
    let output = tokio::time::timeout(
        Duration::from_secs(30),
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args(args)
            .args(["--url", url, "--admin-token", ADMIN])
            .env_remove("KERNELBOX_URL")
            .env_remove("KERNELBOX_ADMIN_TOKEN")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the command ends within 30 s")
    .expect("run kernelbox");
    let stdout = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "kernelbox {args:?}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// The DRAINING column of `node` in `kernelbox nodes`' table.
fn draining_in_table(table: &str, node: &str) -> String {
    let header: Vec<&str> = table
        .lines()
        .next()
        .expect("a header")
        .split_whitespace()
        .collect();
    let column = header
        .iter()
        .position(|h| *h == "DRAINING")
        .expect("a DRAINING column");
    let row = table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(node))
        .unwrap_or_else(|| panic!("no row for {node} in\n{table}"));
    row.split_whitespace()
        .nth(column)
        .expect("the column")
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_places_new_sessions_elsewhere_until_undone() {
    let cluster = Cluster::start("cl-drain", Options::default()).await;
    let drained = 1;
    let node = &cluster.nodes[drained];
    let url = cluster.nodes[0].api.base.clone();

    admin_cli(&url, &["drain", &node.name]).await;
    let table = admin_cli(&url, &["nodes"]).await;
    assert_eq!(draining_in_table(&table, &node.name), "yes", "{table}");
    assert_eq!(
        draining_in_table(&table, &cluster.nodes[0].name),
        "no",
        "{table}"
    );

    // New sessions sent to the drained node are placed on another node once it has read
    // the drain (its view of the catalog is refreshed with its lease): then always. (It has
    // room: a full node places new sessions elsewhere anyway.)
    let mut n = 0;
    let placed = |session: String| {
        let cluster = &cluster;
        async move {
            let result = success(
                &node
                    .api
                    .execute(TOKEN, &session, json!({"code": "x = 1"}))
                    .await,
            );
            let holder = cluster.holder(&session).await.expect("a holder");
            let containers = cluster.session_containers(&session).await;
            assert_eq!(containers.len(), 1, "{containers:?}");
            let on = &cluster.nodes[holder];
            assert_eq!(
                containers[0].labels.get(kernelbox::labels::INSTANCE),
                Some(&on.instance)
            );
            (holder, result)
        }
    };
    poll(
        "a new session on the drained node placed elsewhere",
        Duration::from_secs(30),
        || {
            n += 1;
            let placed = &placed;
            let session = format!("early{n}");
            async move {
                if placed(session.clone()).await.0 != drained {
                    return Some(());
                }
                // Placed before the node read the drain: ended, so the node keeps its room.
                let reply = node
                    .api
                    .delete(&format!("/v1/sessions/{session}"), TOKEN)
                    .await;
                assert_eq!(reply.status, StatusCode::OK);
                None
            }
        },
    )
    .await;
    for i in 0..3 {
        let (holder, _) = placed(format!("d{i}")).await;
        assert_ne!(holder, drained, "d{i} placed on the drained node");
    }
    // Calls through the drained node reach them.
    let result = success(
        &node
            .api
            .execute(TOKEN, "d0", json!({"code": "print(x)"}))
            .await,
    );
    assert_eq!(result["output"], "1\n");
    // `kernelbox ps --url` lists every node's kernels: d0 on its holder.
    let holder = cluster.holder("d0").await.expect("a holder");
    let listing = admin_cli(&url, &["ps"]).await;
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with(&cluster.nodes[holder].name)
                && l.split_whitespace().nth(2) == Some("d0")),
        "d0 on {} in:\n{listing}",
        cluster.nodes[holder].name
    );

    admin_cli(&url, &["drain", &node.name, "--undo"]).await;
    let table = admin_cli(&url, &["nodes"]).await;
    assert_eq!(draining_in_table(&table, &node.name), "no", "{table}");
    let mut m = 0;
    poll(
        "a new session on the undrained node placed on it",
        Duration::from_secs(30),
        || {
            m += 1;
            let placed = &placed;
            let session = format!("u{m}");
            async move { (placed(session).await.0 == drained).then_some(()) }
        },
    )
    .await;
    cluster.finish().await;
}
