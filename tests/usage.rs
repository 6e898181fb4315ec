//! Per-tenant usage over real HTTP against the real engine (`docs/usage.md`): the metrics
//! carry tenant labels and never session ones; the usage ledger counts a known workload for
//! its tenant only and survives a `kill -9` of the server.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::path::Path;
use std::time::Duration;

use hyper::StatusCode;
use serde_json::{json, Value};

use http::{files, tenant, tenants, Api, TestServer};

/// The value of the one metrics line starting with `series ` (0 when absent).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{series} ")))
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_cells_and_kernels_per_tenant_and_never_name_a_session() {
    let srv = TestServer::start(
        "usage-metrics",
        tenants(vec![tenant("ua", "tok-a"), tenant("ub", "tok-b")]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    api.run("tok-a", "sess-secret-1", "x = 1").await;
    let failed = api
        .execute("tok-a", "sess-secret-1", json!({"code": "1/0"}))
        .await;
    assert_eq!(failed.json()["status"], "error");
    api.run("tok-a", "sess-secret-2", "y = 2").await;
    let failed = api
        .execute(
            "tok-b",
            "sess-secret-3",
            json!({"code": "raise ValueError()"}),
        )
        .await;
    assert_eq!(failed.json()["status"], "error");
    let text = api.metrics("tok-a").await;

    let cells = |t: &str, s: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_cells_total{{tenant=\"{t}\",status=\"{s}\"}}"),
        )
    };
    assert_eq!(cells("ua", "success"), 2.0, "{text}");
    assert_eq!(cells("ua", "error"), 1.0, "{text}");
    assert_eq!(cells("ub", "success"), 0.0, "{text}");
    assert_eq!(cells("ub", "error"), 1.0, "{text}");
    let cold = |t: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_new_kernels_total{{tenant=\"{t}\",how=\"cold_start\"}}"),
        )
    };
    assert_eq!(cold("ua"), 2.0, "{text}");
    assert_eq!(cold("ub"), 1.0, "{text}");
    let live = |t: &str| {
        value(
            &text,
            &format!("kernelbox_tenant_kernels_live{{tenant=\"{t}\"}}"),
        )
    };
    assert_eq!(live("ua"), 2.0, "{text}");
    assert_eq!(live("ub"), 1.0, "{text}");
    assert_eq!(srv.tenant_containers("ua").await.len(), 2);
    assert!(
        !text.contains("sess-secret"),
        "a session became a label: {text}"
    );
    assert!(!text.contains("session="), "{text}");

    // A cleared session is not a loss; an OOM-free workload loses nothing.
    let lost = value(
        &text,
        "kernelbox_tenant_kernel_losses_total{tenant=\"ua\",reason=\"idle_reaped\"}",
    );
    assert_eq!(lost, 0.0, "{text}");
    srv.finish().await;
}

/// A cell that burns about `seconds` of CPU in the kernel.
fn burn(seconds: f64) -> String {
    format!("import time\nt = time.process_time()\nwhile time.process_time() - t < {seconds}: pass")
}

/// `GET /v1/usage?...` as `token`, answered 200; its rows.
async fn usage_rows(api: &Api, token: &str, query: &str) -> Vec<Value> {
    let reply = api.get(&format!("/v1/usage?{query}"), Some(token)).await;
    assert_eq!(reply.status, StatusCode::OK, "{}", reply.json());
    reply.json()["rows"].as_array().expect("rows").clone()
}

/// The one row of `session` in `rows`.
fn row<'a>(rows: &'a [Value], session: &str) -> &'a Value {
    let found: Vec<&Value> = rows.iter().filter(|r| r["session"] == session).collect();
    assert_eq!(found.len(), 1, "{rows:?}");
    found[0]
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_after_a_known_workload_is_counted_for_its_tenant_only() {
    let mut admin = tenant("uadmin", "tok-admin");
    admin["usage_admin"] = json!(true);
    let srv = TestServer::start(
        "usage-ledger",
        tenants(vec![tenant("ua", "tok-a"), tenant("ub", "tok-b"), admin]),
        |_| {},
    )
    .await;
    let api = &srv.api;
    for _ in 0..3 {
        api.run("tok-a", "work", &burn(1.0)).await;
    }
    let upload = vec![7u8; 100_000];
    let put = api
        .put(&files("work", "data.bin"), "tok-a", upload, None)
        .await;
    assert_eq!(put.status, StatusCode::CREATED, "{}", put.json());
    let got = api.get(&files("work", "data.bin"), Some("tok-a")).await;
    assert_eq!(got.body.len(), 100_000);
    let cmd = api
        .post(
            "/v1/sessions/work/commands",
            Some("tok-a"),
            json!({"command": ["true"]}),
        )
        .await;
    assert_eq!(cmd.status, StatusCode::OK, "{}", cmd.json());
    api.run("tok-b", "other", "x = 1").await;

    // CPU and alive time are sampled from the cgroups every flush interval: wait for the
    // samples to cover the burn (bounded).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let rows = loop {
        let rows = usage_rows(api, "tok-a", "group_by=session").await;
        if rows
            .iter()
            .any(|r| r["cpu_seconds"].as_f64().unwrap() >= 2.7)
        {
            break rows;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no CPU sample: {rows:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(rows.iter().all(|r| r["tenant"] == "ua"), "{rows:?}");
    let work = row(&rows, "work");
    assert_eq!(work["cells"], 3, "{work}");
    assert!(work["cell_seconds"].as_f64().unwrap() >= 3.0, "{work}");
    let cpu = work["cpu_seconds"].as_f64().unwrap();
    assert!((2.7..6.0).contains(&cpu), "{work}");
    assert!(work["kernel_seconds"].as_f64().unwrap() >= 3.0, "{work}");
    assert!(
        work["peak_memory_bytes"].as_u64().unwrap() > 1_000_000,
        "{work}"
    );
    assert_eq!(work["file_bytes_in"], 100_000, "{work}");
    assert_eq!(work["file_bytes_out"], 100_000, "{work}");
    assert_eq!(work["commands"], 1, "{work}");

    // By day: one row for the tenant, the same cells.
    let days = usage_rows(api, "tok-a", "group_by=day").await;
    assert_eq!(days.len(), 1, "{days:?}");
    assert_eq!(days[0]["cells"], 3);

    // Another tenant sees only its own, and may not ask for another's.
    let b = usage_rows(api, "tok-b", "").await;
    assert_eq!(b.len(), 1, "{b:?}");
    assert_eq!(row(&b, "other")["cells"], 1);
    let refused = api.get("/v1/usage?tenant=ua", Some("tok-b")).await;
    assert_eq!(refused.status, StatusCode::FORBIDDEN);
    // A usage admin sees both.
    let all = usage_rows(api, "tok-admin", "").await;
    let tenants: std::collections::BTreeSet<&str> =
        all.iter().map(|r| r["tenant"].as_str().unwrap()).collect();
    assert_eq!(tenants, ["ua", "ub"].into_iter().collect());
    let bad = api.get("/v1/usage?from=yesterday", Some("tok-a")).await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    srv.finish().await;
}

const TOKEN: &str = "usage-kill-token";

/// `kernelbox serve` on `state`, and its address.
async fn serve(state: &Path, label: &str) -> (tokio::process::Child, Api) {
    let mut cmd = common::serve_command(label, TOKEN);
    cmd.arg("--state-dir")
        .arg(state)
        .env_remove("KERNELBOX_STATE_DIR");
    let (child, addr) = common::spawn_serving(cmd).await;
    (child, Api::new(addr))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_ledger_survives_kill_9_and_a_restart() {
    let label = common::unique("usage-kill");
    let engine = common::engine().await;
    let state = tempfile::tempdir().expect("state dir");
    let (mut first, api) = serve(state.path(), &label).await;
    api.run(TOKEN, "kept", "x = 1").await;
    api.run(TOKEN, "kept", "y = 2").await;
    // A report flushes what is pending: from here the two cells are in the catalog.
    let before = usage_rows(&api, TOKEN, "").await;
    assert_eq!(row(&before, "kept")["cells"], 2, "{before:?}");
    first.kill().await.expect("SIGKILL");

    // The watchdog removes the kernel; a new server on the same state directory reads the
    // ledger back.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !common::containers(&engine, &label).await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the kernel outlived its server"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (mut second, api) = serve(state.path(), &label).await;
    let after = usage_rows(&api, TOKEN, "").await;
    assert_eq!(row(&after, "kept")["cells"], 2, "{after:?}");
    api.run(TOKEN, "kept", "z = 3").await;
    let more = usage_rows(&api, TOKEN, "").await;
    assert_eq!(row(&more, "kept")["cells"], 3, "{more:?}");
    let status = common::terminate(&mut second, Duration::from_secs(60)).await;
    assert!(status.success(), "{status}");
    common::assert_clean(&engine, &label).await;
}
