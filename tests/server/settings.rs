//! Per-session settings (`docs/http-api.md`, "Session settings"): environment, memory and CPU
//! limits, idle timeout and labels, honoured by the real engine's containers and bounded by
//! the tenant's `session_limits`.

use hyper::StatusCode;
use serde_json::{json, Value};

use crate::http::{tenant, tenants, TestServer};

const MIB: i64 = 1024 * 1024;

async fn docker() -> bollard::Docker {
    bollard::Docker::connect_with_defaults().expect("docker")
}

/// The full id of `tenant`'s `session`'s kernel container, as Docker lists it.
async fn container_of(srv: &TestServer, tenant: &str, session: &str) -> String {
    let list = crate::common::containers(&srv.engine, &srv.label).await;
    let found: Vec<_> = list
        .into_iter()
        .filter(|c| {
            c.labels.get("io.kernelbox.tenant").map(String::as_str) == Some(tenant)
                && c.labels.get("io.kernelbox.session").map(String::as_str) == Some(session)
        })
        .collect();
    assert_eq!(found.len(), 1, "one kernel of {tenant}/{session}");
    found[0].id.clone()
}

fn sessions(kernels: &Value) -> Vec<String> {
    let mut names: Vec<String> = kernels["kernels"]
        .as_array()
        .expect("kernels")
        .iter()
        .map(|k| k["session"].as_str().unwrap_or_default().to_string())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn session_settings_shape_its_kernels_within_the_tenants_maximums() {
    let mut rich = tenant("acme", "tok-a");
    rich["session_limits"] = json!({"memory": "1g", "cpus": 2, "idle_timeout": "1h"});
    let srv = TestServer::start(
        "settings-shape",
        tenants(vec![rich, tenant("other", "tok-o")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    let put = |token: &'static str, session: &'static str, body: Value| async move {
        api.put(
            &format!("/v1/sessions/{session}/settings"),
            token,
            body.to_string(),
            Some("application/json"),
        )
        .await
    };

    // Set before the session's first kernel: nothing to restart.
    let r = put(
        "tok-a",
        "s1",
        json!({"env": {"FOO": "bar-secret"}, "memory": "768m", "cpus": 1.5,
               "labels": {"team": "data"}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.json()["restart_required"], false);
    assert_eq!(r.json()["settings"]["memory"], 768 * MIB);
    assert_eq!(r.json()["settings"]["cpus"], 1.5);

    // The environment is the session's kernel's, and nobody else's.
    let code = "import os; print(os.environ.get('FOO'))";
    assert_eq!(api.run("tok-a", "s1", code).await["output"], "bar-secret\n");
    assert_eq!(api.run("tok-a", "s2", code).await["output"], "None\n");
    assert_eq!(api.run("tok-o", "s1", code).await["output"], "None\n");

    // The engine's own view of the container: limits set, labels carried, the environment
    // never in a label.
    let id = container_of(&srv, "acme", "s1").await;
    let info = docker()
        .await
        .inspect_container(&id, None)
        .await
        .expect("inspect");
    let host = info.host_config.expect("host config");
    assert_eq!(host.memory, Some(768 * MIB));
    assert_eq!(host.nano_cpus, Some(1_500_000_000));
    let labels = info.config.expect("config").labels.unwrap_or_default();
    assert_eq!(
        labels.get("io.kernelbox.meta.team").map(String::as_str),
        Some("data")
    );
    assert!(
        !labels.values().any(|v| v.contains("bar-secret")),
        "{labels:?}"
    );
    let plain = container_of(&srv, "acme", "s2").await;
    let plain = docker()
        .await
        .inspect_container(&plain, None)
        .await
        .expect("inspect");
    assert_ne!(plain.host_config.expect("host").memory, Some(768 * MIB));

    // Labels filter the tenant's kernels, and only its own.
    let r = api.get("/v1/kernels?label=team:data", Some("tok-a")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(sessions(&r.json()), vec!["s1"]);
    assert_eq!(r.json()["kernels"][0]["labels"]["team"], "data");
    let r = api.get("/v1/kernels?label=team:ops", Some("tok-a")).await;
    assert!(sessions(&r.json()).is_empty());
    let r = api.get("/v1/kernels?label=team:data", Some("tok-o")).await;
    assert!(sessions(&r.json()).is_empty());
    let r = api.get("/v1/kernels?label=team", Some("tok-a")).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_settings");
    let r = api.get("/v1/kernels?tenant=x", Some("tok-a")).await;
    assert_eq!(r.error(StatusCode::BAD_REQUEST), "invalid_query");
    // `kernelbox ps --session-label` reads the same labels from the engine.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args([
            "ps",
            "--tenant",
            "acme",
            "--session-label",
            "team=data",
            "--no-memory",
        ])
        .args(["--format", "json"])
        .output()
        .expect("kernelbox ps");
    assert!(out.status.success(), "{out:?}");
    let listed: Value = serde_json::from_slice(&out.stdout).expect("ps json");
    let listed = listed.as_array().cloned().unwrap_or_default();
    let mine: Vec<_> = listed
        .iter()
        .filter(|k| id.starts_with(k["container"].as_str().unwrap_or("-")))
        .collect();
    assert_eq!(mine.len(), 1, "{listed:?}");
    assert!(
        listed.iter().all(|k| k["owner"] == "s1"),
        "only labelled sessions: {listed:?}"
    );
    // The old spelling, `--label`, still filters the same, saying it is deprecated.
    let old = std::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args([
            "ps",
            "--tenant",
            "acme",
            "--label",
            "team=data",
            "--no-memory",
        ])
        .args(["--format", "json"])
        .output()
        .expect("kernelbox ps --label");
    assert!(old.status.success(), "{old:?}");
    let old_listed: Value = serde_json::from_slice(&old.stdout).expect("ps json");
    assert_eq!(old_listed.as_array().map(Vec::len), Some(listed.len()));
    let said = String::from_utf8_lossy(&old.stderr);
    assert!(
        said.contains("deprecated, use `ps --session-label`"),
        "{said}"
    );

    // GET answers them; another tenant's session of the same name has none.
    let r = api.get("/v1/sessions/s1/settings", Some("tok-a")).await;
    assert_eq!(r.json()["env"]["FOO"], "bar-secret");
    let r = api.get("/v1/sessions/s1/settings", Some("tok-o")).await;
    assert_eq!(r.json(), json!({}));

    // Beyond the tenant's maximums, or the server's defaults for a tenant without its own.
    for (token, body, code) in [
        ("tok-a", json!({"memory": "2g"}), "settings_not_allowed"),
        ("tok-a", json!({"cpus": 3}), "settings_not_allowed"),
        (
            "tok-a",
            json!({"idle_timeout": 7200}),
            "settings_not_allowed",
        ),
        (
            "tok-o",
            json!({"idle_timeout": 7200}),
            "settings_not_allowed",
        ),
        (
            "tok-a",
            json!({"env": {"KERNELBOX_STATUS": "/x"}}),
            "invalid_settings",
        ),
        ("tok-a", json!({"env": {"HOME": "/"}}), "invalid_settings"),
        ("tok-a", json!({"memory": "1m"}), "invalid_settings"),
        ("tok-a", json!({"nope": 1}), "invalid_json"),
    ] {
        let r = put(token, "s1", body.clone()).await;
        assert_eq!(r.error(StatusCode::BAD_REQUEST), code, "{body}");
    }
    // A refused change changed nothing.
    let r = api.get("/v1/sessions/s1/settings", Some("tok-a")).await;
    assert_eq!(r.json()["memory"], 768 * MIB);

    // A change of the environment of a live session says it needs a restart; the running
    // kernel keeps what it started with, the next one has the new value.
    let r = put(
        "tok-a",
        "s1",
        json!({"env": {"FOO": "baz"}, "memory": "768m", "cpus": 1.5, "labels": {"team": "data"}}),
    )
    .await;
    assert_eq!(r.json()["restart_required"], true);
    assert_eq!(api.run("tok-a", "s1", code).await["output"], "bar-secret\n");
    let r = api
        .execute("tok-a", "s1", json!({"code": code, "reset": true}))
        .await;
    assert_eq!(r.json()["output"], "baz\n");
    // Labels alone apply at once: no restart.
    let r = put(
        "tok-a",
        "s1",
        json!({"env": {"FOO": "baz"}, "memory": "768m", "cpus": 1.5, "labels": {"team": "ops"}}),
    )
    .await;
    assert_eq!(r.json()["restart_required"], false);
    let r = api.get("/v1/kernels?label=team:ops", Some("tok-a")).await;
    assert_eq!(sessions(&r.json()), vec!["s1"]);
    srv.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_own_idle_timeout_reaps_it_and_not_its_neighbours() {
    let srv = TestServer::start(
        "settings-idle",
        tenants(vec![tenant("acme", "tok-a")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    let r = api
        .put(
            "/v1/sessions/short/settings",
            "tok-a",
            json!({"idle_timeout": 1}).to_string(),
            Some("application/json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        api.run("tok-a", "short", "x = 1").await["status"],
        "success"
    );
    assert_eq!(api.run("tok-a", "long", "y = 2").await["status"], "success");
    // The short session's timeout has to pass (the server's own is 30 minutes); a new
    // session's admission then reaps what is idle past its timeout.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(api.run("tok-a", "third", "1").await["status"], "success");
    let r = api.get("/v1/kernels", Some("tok-a")).await;
    assert_eq!(sessions(&r.json()), vec!["long", "third"]);
    let r = api
        .execute("tok-a", "short", json!({"code": "print(x)"}))
        .await
        .json();
    assert_eq!(r["status"], "error");
    assert_eq!(r["kernel"]["state_lost"]["reason"], "idle_reaped");
    assert_eq!(api.run("tok-a", "long", "print(y)").await["output"], "2\n");
    srv.finish().await;
}

/// A tenant's `session_limits` below the server's defaults cap every session of the tenant,
/// also one that sets nothing or sets only its environment: its kernel runs with
/// min(session_limits, the server's default) (`docs/http-api.md`, "Session settings").
#[tokio::test(flavor = "multi_thread")]
async fn session_limits_below_the_defaults_cap_a_session_that_sets_nothing() {
    const TOKEN: &str = "tok-limits";
    let served = crate::http::Served::start(
        "settings-ceiling",
        TOKEN,
        &["--session-max-memory", "256m", "--session-max-cpus", "0.5"],
    )
    .await;
    let api = &served.api;
    // Nothing set: the pool's kernels (made with the server's defaults) are not for it.
    assert_eq!(api.run(TOKEN, "plain", "print(1)").await["output"], "1\n");
    // Only its environment set: the limits it left out are the tenant's too.
    let r = api
        .put(
            "/v1/sessions/env-only/settings",
            TOKEN,
            json!({"env": {"FOO": "x"}}).to_string(),
            Some("application/json"),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
    assert_eq!(r.json()["settings"], json!({"env": {"FOO": "x"}}));
    assert_eq!(
        api.run(TOKEN, "env-only", "print(2)").await["output"],
        "2\n"
    );
    let list = crate::common::containers(&served.engine, &served.label).await;
    for session in ["plain", "env-only"] {
        let found: Vec<_> = list
            .iter()
            .filter(|c| c.labels.get("io.kernelbox.session").map(String::as_str) == Some(session))
            .collect();
        assert_eq!(found.len(), 1, "one kernel of {session}: {list:?}");
        let info = docker()
            .await
            .inspect_container(&found[0].id, None)
            .await
            .expect("inspect");
        let host = info.host_config.expect("host config");
        assert_eq!(host.memory, Some(256 * MIB), "{session}");
        assert_eq!(host.nano_cpus, Some(500_000_000), "{session}");
    }
    served.finish().await;
}
