//! docs/cluster.md, "Draining and upgrades": a drained node's sessions still live at its
//! `--drain-deadline` are ended and reported `node_drained` (never silently lost), and a stop
//! (SIGTERM) of a node with a deadline drains first: it keeps serving the sessions it holds,
//! places no new one, and what is left at the deadline is reported `node_drained`.

use serde_json::json;

use crate::admin::admin_cli;
use crate::harness::{generation, lost, poll, success, Cluster, Options, SLOW, TOKEN};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drained_nodes_sessions_live_at_the_deadline_are_reported_node_drained() {
    let cluster = Cluster::start(
        "cl-drain-deadline",
        Options {
            drain_deadline: Some("2s"),
            ..Options::default()
        },
    )
    .await;
    let drained = 1;
    let node = &cluster.nodes[drained];
    success(
        &node
            .api
            .execute(TOKEN, "kept", json!({"code": "x = 41"}))
            .await,
    );
    assert_eq!(cluster.holder("kept").await, Some(drained));

    admin_cli(&cluster.nodes[0].api.base, &["drain", &node.name]).await;
    // At the deadline the node ends the kernel (seen through the Docker API).
    poll("the drained node's kernel ended", SLOW, || async {
        cluster
            .session_containers("kept")
            .await
            .is_empty()
            .then_some(())
    })
    .await;
    assert!(cluster.node_containers(drained).await.is_empty());

    // The session's next call, through another node, is told why its state is gone.
    let result = success(
        &cluster.nodes[0]
            .api
            .execute(TOKEN, "kept", json!({"code": "print(1)"}))
            .await,
    );
    assert_eq!(lost(&result).as_deref(), Some("node_drained"), "{result}");
    assert_eq!(generation(&result), 2, "{result}");
    assert_ne!(cluster.holder("kept").await, Some(drained));
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stop_with_a_deadline_drains_first_then_reports_node_drained() {
    let mut cluster = Cluster::start(
        "cl-drain-stop",
        Options {
            drain_deadline: Some("6s"),
            ..Options::default()
        },
    )
    .await;
    let stopped = 2;
    let (first, second) = (&cluster.nodes[0], &cluster.nodes[stopped]);
    success(
        &second
            .api
            .execute(TOKEN, "busy", json!({"code": "x = 41"}))
            .await,
    );
    assert_eq!(cluster.holder("busy").await, Some(stopped));

    second.signal("TERM").await;
    // While it drains, the session it holds is still served there, state intact (the call
    // enters through another node and is forwarded).
    let result = success(
        &first
            .api
            .execute(TOKEN, "busy", json!({"code": "print(x + 1)"}))
            .await,
    );
    assert!(
        result["output"].as_str().unwrap_or("").contains("42"),
        "{result}"
    );
    assert_eq!(lost(&result), None, "{result}");
    // A new session sent to the draining node is placed elsewhere.
    success(
        &second
            .api
            .execute(TOKEN, "fresh", json!({"code": "y = 1"}))
            .await,
    );
    assert_ne!(cluster.holder("fresh").await, Some(stopped));

    // It exits after the deadline (0), its kernel gone.
    cluster.stop(stopped).await;
    assert!(cluster.session_containers("busy").await.is_empty());
    // (Until the other nodes' view shows it gone, a call may be refused 503, retryable.)
    let first = &cluster.nodes[0];
    let reply = poll("the session's next call answered", SLOW, || async {
        let reply = first
            .api
            .execute(TOKEN, "busy", json!({"code": "print(1)"}))
            .await;
        (reply.status != hyper::StatusCode::SERVICE_UNAVAILABLE).then_some(reply)
    })
    .await;
    let result = success(&reply);
    assert_eq!(lost(&result).as_deref(), Some("node_drained"), "{result}");
    assert_eq!(generation(&result), 2, "{result}");
    cluster.finish().await;
}
