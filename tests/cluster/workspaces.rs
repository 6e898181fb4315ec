//! Workspaces across the nodes (docs/workspaces.md, "In a cluster"): the catalog says which
//! node holds each workspace at which generation, so an image a node kept of an earlier
//! generation is never served as the workspace; a tenant's workspaces are counted, listed
//! and deleted cluster-wide.

use hyper::StatusCode;
use serde_json::json;

use crate::failures::served;
use crate::harness::{lost, poll, success, Cluster, Options, SLOW, TOKEN};

const WRITE_V1: &str = "open('/work/v.txt', 'w').write('v1')";
const WRITE_V2: &str = "open('/work/v.txt', 'w').write('v2')";
const READ: &str =
    "import os\nprint(open('/work/v.txt').read() if os.path.exists('/work/v.txt') else 'missing')";

/// v1 written on A; A stopped past its lease; the session moves to B (told its workspace is
/// lost) and writes v2; A comes back; B dies; the session returns to A: it must not get v1
/// back as if it were its workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_coming_back_never_serves_an_earlier_generation_of_a_workspace() {
    let options = Options {
        workspaces: true,
        ..Options::default()
    };
    let mut cluster = Cluster::start("cl-ws-gen", options).await;
    let (a, b) = (0, 1);
    let first = cluster.nodes[a]
        .api
        .execute(TOKEN, "roll", json!({ "code": WRITE_V1 }))
        .await;
    assert_eq!(success(&first)["kernel"]["workspace"]["restored"], false);
    assert_eq!(cluster.holder("roll").await, Some(a));

    cluster.nodes[a].signal("STOP").await;
    let (moved, _) = served(&cluster.nodes[b], "roll", WRITE_V2).await;
    assert_eq!(lost(&moved).as_deref(), Some("node_lost"), "{moved}");
    assert_eq!(
        moved["kernel"]["state_lost"]["workspace_lost"], true,
        "{moved}"
    );
    assert_eq!(moved["kernel"]["workspace"]["restored"], false, "{moved}");
    cluster.nodes[a].signal("CONT").await;
    // A fences itself, removes its old kernel and rejoins.
    let stopped_instance = cluster.nodes[a].instance.clone();
    poll("the stopped node's old kernel removed", SLOW, || async {
        let left = cluster
            .containers()
            .await
            .into_iter()
            .filter(|c| c.labels.get(kernelbox::labels::INSTANCE) == Some(&stopped_instance))
            .count();
        (left == 0).then_some(())
    })
    .await;
    poll("the stopped node serves again", SLOW, || async {
        (cluster.nodes[a].health().await.0 == StatusCode::OK).then_some(())
    })
    .await;
    assert_eq!(cluster.holder("roll").await, Some(b));

    cluster.kill9(b).await;
    let (back, _) = served(&cluster.nodes[a], "roll", READ).await;
    assert_eq!(cluster.holder("roll").await, Some(a));
    assert_eq!(lost(&back).as_deref(), Some("node_lost"), "{back}");
    assert_eq!(back["kernel"]["workspace"]["restored"], false, "{back}");
    assert_eq!(
        back["kernel"]["state_lost"]["workspace_lost"], true,
        "{back}"
    );
    assert_eq!(back["output"], "missing\n", "{back}");
    cluster.finish().await;
}

/// A tenant's workspace `max` is counted across the nodes; any node lists all of the
/// tenant's workspaces and deletes one held by another node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_workspaces_are_counted_listed_and_deleted_across_the_nodes() {
    let options = Options {
        workspaces: true,
        workspace_max: Some(3),
        ..Options::default()
    };
    let cluster = Cluster::start("cl-ws-count", options).await;
    let run = |i: usize, session: &'static str| {
        let api = &cluster.nodes[i].api;
        async move {
            api.execute(TOKEN, session, json!({"code": "print(1)"}))
                .await
        }
    };
    for (i, s) in [(0, "w1"), (0, "w2"), (1, "w3")] {
        success(&run(i, s).await);
        assert_eq!(cluster.holder(s).await, Some(i));
    }
    // A fourth, on a node holding one: refused, as on one node.
    let fourth = run(1, "w4").await;
    assert_eq!(
        fourth.error(StatusCode::TOO_MANY_REQUESTS),
        "too_many_workspaces",
        "{}",
        fourth.json()
    );
    // Any node lists the three.
    for node in &cluster.nodes {
        let listed = node.api.get("/v1/workspaces", Some(TOKEN)).await;
        assert_eq!(listed.status, StatusCode::OK, "{}", listed.json());
        let names: Vec<String> = listed.json()["workspaces"]
            .as_array()
            .expect("a list")
            .iter()
            .filter_map(|w| w["name"].as_str().map(str::to_string))
            .collect();
        assert_eq!(names, ["w1", "w2", "w3"], "through {}", node.name);
    }
    // A delete through another node is served by the node holding it: in use, then gone.
    let r = cluster.nodes[2]
        .api
        .delete("/v1/workspaces/w1", TOKEN)
        .await;
    assert_eq!(r.error(StatusCode::CONFLICT), "workspace_in_use");
    let r = cluster.nodes[0].api.delete("/v1/sessions/w1", TOKEN).await;
    assert!(r.status.is_success(), "{:?}", r.status);
    let r = cluster.nodes[2]
        .api
        .delete("/v1/workspaces/w1", TOKEN)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.json());
    assert_eq!(r.json(), json!({"deleted": "w1"}));
    let r = cluster.nodes[2]
        .api
        .delete("/v1/workspaces/w1", TOKEN)
        .await;
    assert_eq!(r.error(StatusCode::NOT_FOUND), "workspace_not_found");
    // Room for one more now.
    success(&run(1, "w4").await);
    let listed = cluster.nodes[2]
        .api
        .get("/v1/workspaces", Some(TOKEN))
        .await;
    let names: Vec<String> = listed.json()["workspaces"]
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|w| w["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names, ["w2", "w3", "w4"]);
    cluster.finish().await;
}
