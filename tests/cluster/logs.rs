//! docs/logs.md, "Request ids", across the hop (docs/cluster.md, "Routing"): a request reaching
//! a node that does not hold its session is logged by both nodes, under the one request id the
//! forwarding node gave it and returned to the caller.

use std::time::Duration;

use hyper::Method;
use serde_json::json;

use crate::harness::{poll, success, Cluster, Node, Options, TENANT, TOKEN};
use crate::http::Reply;

/// The node's access line of request `id`, once it is logged.
async fn access_line(node: &Node, id: &str) -> String {
    let wanted = format!("request_id={id} ");
    poll(
        &format!("node {}'s access line of {id}", node.name),
        Duration::from_secs(30),
        || {
            let line = node
                .log()
                .lines()
                .find(|l| l.contains("kernelbox::access") && l.contains(&wanted))
                .map(str::to_string);
            async move { line }
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_nodes_log_a_forwarded_request_under_one_request_id() {
    let cluster = Cluster::start("cl-logs", Options::default()).await;
    let (owner, other) = (&cluster.nodes[0], &cluster.nodes[1]);
    success(
        &owner
            .api
            .execute(TOKEN, "held", json!({"code": "x = 1"}))
            .await,
    );
    assert_eq!(cluster.holder("held").await, Some(0));

    // No id from the caller: the forwarding node makes one and sends it on.
    let body = bytes::Bytes::from(json!({"code": "print(x)"}).to_string());
    let request = other
        .api
        .build(
            Method::POST,
            "/v1/sessions/held/execute",
            Some(TOKEN),
            false,
            true,
        )
        .body(http_body_util::Full::new(body))
        .expect("request");
    let reply = Reply::read(other.api.http.request(request).await.expect("HTTP")).await;
    assert_eq!(success(&reply)["output"], "1\n");
    let id = reply
        .headers
        .get("x-request-id")
        .expect("x-request-id")
        .to_str()
        .expect("ASCII")
        .to_string();

    for node in [other, owner] {
        let line = access_line(node, &id).await;
        for field in [
            "route=\"/v1/sessions/{session}/execute\"".to_string(),
            format!("tenant=\"{TENANT}\""),
            "session=\"held\"".to_string(),
            "status=200".to_string(),
        ] {
            assert!(
                line.contains(&field),
                "node {}: {field} in {line}",
                node.name
            );
        }
        assert!(!line.contains(TOKEN), "{line}");
    }
    cluster.finish().await;
}
