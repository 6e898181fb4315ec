//! docs/cluster.md, "Routing": the balancer's hash is a hint, never the truth. A node that
//! stops (SIGTERM) has its sessions moved by HAProxy to the others; when it comes back under
//! the same name HAProxy maps those sessions to it again, and it forwards each one to the
//! node that really holds it, state intact.

use std::collections::BTreeMap;

use serde_json::json;

use crate::harness::{generation, lost, served_by, success, Cluster, Options, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_balancers_mapping_snaps_back_and_sessions_still_reach_their_node() {
    let mut cluster = Cluster::start(
        "cl-snap",
        Options {
            balancer: true,
            ..Options::default()
        },
    )
    .await;
    let sessions: Vec<String> = (0..12).map(|i| format!("m{i}")).collect();
    // session -> (the node HAProxy picked, its generation)
    let mut picked = BTreeMap::new();
    for (i, s) in sessions.iter().enumerate() {
        let reply = cluster
            .balancer()
            .api
            .execute(TOKEN, s, json!({ "code": format!("x = {i}") }))
            .await;
        let result = success(&reply);
        let node = served_by(&reply);
        // The node a new session reaches first claims it (it has room).
        let holder = cluster.holder(s).await.expect("a holder");
        assert_eq!(cluster.nodes[holder].name, node, "{s}");
        picked.insert(s.clone(), (node, generation(&result)));
    }
    // The node HAProxy maps the most sessions to leaves.
    let mut counts = BTreeMap::<String, usize>::new();
    for (node, _) in picked.values() {
        *counts.entry(node.clone()).or_default() += 1;
    }
    let (victim_name, moved) = counts
        .iter()
        .max_by_key(|(_, n)| **n)
        .map(|(name, n)| (name.clone(), *n))
        .expect("a node");
    eprintln!("12 sessions through HAProxy: {counts:?}; {victim_name} stops");
    let victim = cluster.index(&victim_name);
    let theirs: Vec<(usize, &String)> = sessions
        .iter()
        .enumerate()
        .filter(|(_, s)| picked[*s].0 == victim_name)
        .collect();
    assert_eq!(theirs.len(), moved);

    cluster.stop(victim).await;
    cluster.balancer().wait_server(&victim_name, "DOWN").await;
    for (i, s) in &theirs {
        let reply = cluster
            .balancer()
            .api
            .execute(TOKEN, s, json!({ "code": format!("y = {i} * 10") }))
            .await;
        let result = success(&reply);
        assert_ne!(served_by(&reply), victim_name, "{s} moved");
        // A graceful stop removed the kernel and said so (docs/cluster.md, "Leases and
        // fencing": `server_restarted`).
        assert_eq!(
            lost(&result).as_deref(),
            Some("server_restarted"),
            "{s}: {result}"
        );
        assert_eq!(generation(&result), picked[*s].1 + 1, "{result}");
        let holder = cluster.holder(s).await.expect("a holder");
        assert_ne!(holder, victim);
    }

    cluster.restart(victim).await;
    cluster.balancer().wait_server(&victim_name, "UP").await;
    for (i, s) in &theirs {
        let reply = cluster
            .balancer()
            .api
            .execute(TOKEN, s, json!({"code": "print(y)"}))
            .await;
        let result = success(&reply);
        assert_eq!(
            served_by(&reply),
            victim_name,
            "{s} mapped back to its first node"
        );
        assert_eq!(
            result["output"],
            format!("{}\n", i * 10),
            "{s}: state intact"
        );
        assert_eq!(lost(&result), None, "{result}");
        let holder = cluster.holder(s).await.expect("a holder");
        assert_ne!(holder, victim, "{s} is still held where it moved");
    }
    // The sessions that never moved are where they were.
    for (i, s) in sessions.iter().enumerate() {
        if picked[s].0 == victim_name {
            continue;
        }
        let reply = cluster
            .balancer()
            .api
            .execute(TOKEN, s, json!({"code": "print(x)"}))
            .await;
        let result = success(&reply);
        assert_eq!(served_by(&reply), picked[s].0);
        assert_eq!(result["output"], format!("{i}\n"));
    }
    cluster.finish().await;
}
