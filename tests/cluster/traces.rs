//! docs/usage.md, "Traces", across the hop (docs/cluster.md, "Routing"): a request reaching a
//! node that does not hold its session is forwarded under a `forward` span, and the holding
//! node's request span is that span's child, in the caller's trace.

use hyper::Method;
use serde_json::json;

use crate::harness::{success, Cluster, Options, TOKEN};
use crate::http::Reply;
use crate::otlp::{one, receiver};

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_holding_a_session_continues_the_trace_of_the_forwarding_node() {
    let (otlp, collected) = receiver().await;
    let options = Options {
        otlp_endpoint: Some(format!("http://{otlp}")),
        ..Options::default()
    };
    let cluster = Cluster::start("cl-traces", options).await;
    let (owner, other) = (&cluster.nodes[0], &cluster.nodes[1]);
    success(
        &owner
            .api
            .execute(TOKEN, "held", json!({"code": "x = 1"}))
            .await,
    );
    assert_eq!(cluster.holder("held").await, Some(0));

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
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .body(http_body_util::Full::new(body))
        .expect("request");
    let reply = Reply::read(other.api.http.request(request).await.expect("HTTP")).await;
    assert_eq!(success(&reply)["output"], "1\n");

    // Stopping the nodes sends their last spans.
    cluster.finish().await;
    let spans = collected
        .trace(CALLER_TRACE, &["http.request", "forward", "cell"])
        .await;
    let requests: Vec<_> = spans.iter().filter(|s| s.name == "http.request").collect();
    assert_eq!(requests.len(), 2, "one request span per node: {spans:#?}");
    let first = requests
        .iter()
        .find(|s| s.parent == CALLER_SPAN)
        .expect("the forwarding node's request span is the caller's span's child");
    let forward = one(&spans, "forward");
    assert_eq!(forward.parent, first.id, "{spans:#?}");
    assert_eq!(forward.attr("kernelbox.node"), Some(&json!("n1")));
    let second = requests
        .iter()
        .find(|s| s.parent == forward.id)
        .expect("the holding node's request span is the forward span's child");
    assert_eq!(one(&spans, "cell").parent, second.id, "{spans:#?}");
}
