//! docs/cluster.md, "Routing" (the tenant's cap across the cluster), "Caps and fair shares"
//! (a share of the cluster's capacity) and "Admin": draining a node with `kernelbox drain`,
//! seen in `kernelbox nodes`, and taking it back.

use std::time::Duration;

use hyper::StatusCode;
use serde_json::json;

use kernelbox::labels;

use crate::harness::{lost, poll, success, Cluster, Options, ADMIN, TOKEN};

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

const HOG: (&str, &str) = ("hog", "hog-token");
const SMALL: (&str, &str) = ("small", "small-token");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fair_shares_are_of_the_clusters_capacity_and_evict_only_here() {
    let cluster = Cluster::start(
        "cl-share",
        Options {
            max_kernels: Some("2"),
            more_tenants: &[HOG, SMALL],
            ..Options::default()
        },
    )
    .await;
    let [n1, n2, n3] = [&cluster.nodes[0], &cluster.nodes[1], &cluster.nodes[2]];
    let on = |session: &'static str| {
        let cluster = &cluster;
        async move {
            let held = cluster.session_containers(session).await;
            held.iter()
                .filter_map(|c| c.labels.get(labels::INSTANCE).cloned())
                .collect::<Vec<_>>()
        }
    };
    // Every host full (2 each, 6 in the cluster): hog holds one kernel on n1 and two on each
    // of n2 and n3, small one on n1.
    for (node, session) in [
        (n1, "h1"),
        (n2, "h2a"),
        (n2, "h2b"),
        (n3, "h3a"),
        (n3, "h3b"),
    ] {
        success(
            &node
                .api
                .execute(HOG.1, session, json!({"code": "x = 1"}))
                .await,
        );
    }
    success(
        &n1.api
            .execute(SMALL.1, "s1", json!({"code": "y = 41"}))
            .await,
    );
    assert_eq!(on("h1").await, [n1.instance.as_str()]);
    assert_eq!(on("s1").await, [n1.instance.as_str()]);
    poll(
        "the catalog and the leases count every kernel",
        Duration::from_secs(20),
        || async {
            let rows = cluster.node_rows(0).await;
            let full = rows.iter().all(|r| r["live_kernels"] == json!(2));
            (full && cluster.catalog_live_kernels().await == 6).then_some(())
        },
    )
    .await;

    // small asks n1 for a second session. Its share is half the cluster's capacity (3): it
    // holds 1, hog 5. hog's idle kernel on n1 goes, never small's own (by n1's cap of 2
    // alone, small would be at its share of 1 and lose s1).
    let reply = n1.api.execute(SMALL.1, "s2", json!({"code": "2"})).await;
    success(&reply);
    assert_eq!(on("s2").await, [n1.instance.as_str()]);
    poll(
        "hog's kernel on n1 evicted",
        Duration::from_secs(20),
        || async { on("h1").await.is_empty().then_some(()) },
    )
    .await;
    let again = success(
        &n1.api
            .execute(SMALL.1, "s1", json!({"code": "print(y + 1)"}))
            .await,
    );
    assert_eq!(lost(&again), None, "{again}");
    assert_eq!(again["output"], "42\n", "{again}");
    for session in ["h2a", "h2b", "h3a", "h3b"] {
        assert_eq!(on(session).await.len(), 1, "{session}");
    }

    // hog asks n1 for another session: it holds 4, above its share; small's two kernels on n1
    // are within small's share, and no node has room: 429 with Retry-After, nothing evicted.
    poll(
        "the leases count every kernel again",
        Duration::from_secs(20),
        || async {
            let rows = cluster.node_rows(0).await;
            rows.iter()
                .all(|r| r["live_kernels"] == json!(2))
                .then_some(())
        },
    )
    .await;
    let refused = n1.api.execute(HOG.1, "h4", json!({"code": "1"})).await;
    assert_eq!(
        refused.error(StatusCode::TOO_MANY_REQUESTS),
        "at_capacity",
        "{}",
        refused.json()
    );
    assert!(refused.headers.contains_key("retry-after"));
    assert!(on("h4").await.is_empty());
    assert_eq!(on("s1").await, [n1.instance.as_str()]);
    assert_eq!(on("s2").await, [n1.instance.as_str()]);
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
