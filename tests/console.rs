//! The operator's console (docs/console.md) and the Grafana dashboard
//! (deploy/grafana/kernelbox.json), over real HTTP:
//!
//! - every PromQL expression of the dashboard names a metric a real `kernelbox serve` exports
//!   (its `/metrics` scraped, with egress on so that the egress families are there);
//! - on an in-process server with the fake engine and 1,000 kernels of two tenants: the token
//!   exchanged for a cookie (HttpOnly, SameSite=Strict, a redirect without the token), the
//!   cookie a bearer token only with the console's header, the admin routes' bounds and pages;
//!   and the kernels page's weight and time to first render in Debian's headless chromium
//!   (tests/console_browser/first_render.py, Selenium), under a second.
//!
//! The browser tests against real kernels are tests/console_browser (pytest, `.ci/run`).

mod common;
#[path = "common/http.rs"]
mod http;

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, StatusCode};
use kernelbox::docker::fake::FakeEngine;
use kernelbox::server::{self, AppState, ServeOptions};
use kernelbox::{Config, ExecuteRequest, Orchestrator, Scope};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

const ADMIN: &str = "admin-token-console";
const ACME: &str = "acme-token-console";
const GLOBEX: &str = "globex-token-console";
const KERNELS: usize = 1000;

/// The families a Prometheus exposition declares (`# TYPE name kind`), with their kinds.
fn families(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.to_string()))
        })
        .collect()
}

/// Every series name a PromQL expression can name for `families`: a histogram's `_bucket`,
/// `_sum` and `_count` too.
fn series_names(families: &[(String, String)]) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (name, kind) in families {
        names.insert(name.clone());
        if kind == "histogram" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The metric names (`kernelbox_...`) in a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("kernelbox_") {
        let start = i + at;
        let before_ok =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        let end = expr[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(expr.len(), |n| start + n);
        if before_ok {
            out.push(expr[start..end].to_string());
        }
        i = end;
    }
    out
}

/// Every `expr` of the dashboard: its panels' targets and its variables' queries.
fn dashboard_expressions() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/kernelbox.json");
    let text = std::fs::read_to_string(path).expect("deploy/grafana/kernelbox.json");
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    for panel in dashboard["panels"].as_array().expect("panels") {
        for target in panel["targets"].as_array().expect("targets") {
            exprs.push(target["expr"].as_str().expect("expr").to_string());
        }
    }
    for var in dashboard["templating"]["list"]
        .as_array()
        .expect("variables")
    {
        if let Some(q) = var["query"]["query"].as_str() {
            exprs.push(q.to_string());
        }
    }
    exprs
}

#[tokio::test]
async fn grafana_dashboard_names_only_metrics_the_server_exports() {
    let served = http::Served::start(
        "console-grafana",
        "token",
        &["--pool", "0", "--network-allow", "pypi"],
    )
    .await;
    let text = served.api.metrics("token").await;
    let exported = series_names(&families(&text));
    assert!(
        exported.contains("kernelbox_egress_refusals_total"),
        "{text}"
    );
    let exprs = dashboard_expressions();
    assert!(exprs.len() >= 12, "{exprs:?}");
    let mut named = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{expr:?} names no kernelbox metric");
        for name in names {
            assert!(
                exported.contains(&name),
                "{expr:?} names {name}, which the server does not export"
            );
            named.insert(name);
        }
    }
    // What the dashboard is for (docs/console.md, "Grafana").
    for needed in [
        "kernelbox_tenant_kernels_live",
        "kernelbox_kernel_start_seconds_bucket",
        "kernelbox_cell_duration_seconds_bucket",
        "kernelbox_kernel_losses_total",
        "kernelbox_pool_ready",
        "kernelbox_response_bytes_pending",
        "kernelbox_egress_bytes_total",
        "kernelbox_egress_refusals_total",
    ] {
        assert!(named.contains(needed), "the dashboard shows no {needed}");
    }
    served.finish().await;
}

#[test]
fn a_metric_name_is_found_whole_in_an_expression() {
    assert_eq!(
        metric_names(
            "sum by (le) (rate(kernelbox_a_bucket{x=\"kernelbox_no\"}[5m])) / kernelbox_b"
        ),
        ["kernelbox_a_bucket", "kernelbox_no", "kernelbox_b"]
    );
    assert!(metric_names("rate(xkernelbox_a[5m])").is_empty());
}

/// An in-process `serve --console` on the fake engine with [`KERNELS`] kernels: two thirds
/// acme's, a third globex's.
struct Fleet {
    api: http::Api,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Fleet {
    async fn start() -> Fleet {
        let mut config = Config::default();
        config.housekeeping.watchdog = None;
        config.housekeeping.sweep_on_start = false;
        config.kernels.max_session_kernels = KERNELS + 10;
        config.pool.size = 0;
        let kb = Orchestrator::start(config, Arc::new(FakeEngine::default()))
            .await
            .expect("orchestrator on the fake engine");
        let runs = (0..KERNELS).map(|i| {
            let tenant = if i % 3 == 2 { "globex" } else { "acme" };
            let kb = kb.clone();
            async move {
                let scope = Scope::session(format!("{tenant}-s{i:04}")).tenant(tenant);
                kb.execute(ExecuteRequest::new(scope, "x = 1")).await
            }
        });
        for r in futures::future::join_all(runs).await {
            assert!(r.expect("a cell on the fake engine").error.is_none());
        }
        let tenants = http::tenants(vec![
            http::tenant("acme", ACME),
            http::tenant("globex", GLOBEX),
        ]);
        let state = AppState::new(kb, tenants);
        state.admin_with(ADMIN);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let shutdown = CancellationToken::new();
        let options = ServeOptions {
            console: true,
            ..ServeOptions::default()
        };
        let task = tokio::spawn(server::serve_with(
            listener,
            state,
            shutdown.clone(),
            options,
        ));
        Fleet {
            api: http::Api::new(addr),
            shutdown,
            task,
        }
    }

    /// A GET with the console's header and `cookie`, as the page's script sends it.
    async fn console_get(&self, path: &str, cookie: &str) -> http::Reply {
        let req = self
            .api
            .build(Method::GET, path, None, false, false)
            .header("x-kernelbox-console", "1")
            .header("cookie", cookie)
            .body(Full::new(Bytes::new()))
            .expect("request");
        http::Reply::read(self.api.http.request(req).await.expect("GET")).await
    }

    async fn finish(self) {
        self.shutdown.cancel();
        self.task.await.expect("server task").expect("served");
    }
}

#[tokio::test]
async fn the_console_exchanges_its_token_for_a_cookie_and_pages_a_thousand_kernels() {
    let fleet = Fleet::start().await;
    let api = &fleet.api;

    // The token is exchanged for an HttpOnly, SameSite=Strict cookie and a redirect without it.
    let r = api.get(&format!("/console?token={ADMIN}"), None).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.headers["location"], "/console");
    let cookie = r.headers["set-cookie"].to_str().expect("cookie");
    assert!(
        cookie.starts_with(&format!("kernelbox_console={ADMIN};")),
        "{cookie}"
    );
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    let csp = r.headers["content-security-policy"].to_str().expect("csp");
    assert!(csp.contains("default-src 'none'"), "{csp}");
    // A refused token: 401, nothing set.
    let r = api.get("/console?token=nobody", None).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(!r.headers.contains_key("set-cookie"));
    // The page holds no secret.
    let page = api.get("/console", None).await;
    assert_eq!(page.status, StatusCode::OK);
    assert!(!String::from_utf8_lossy(&page.body).contains(ADMIN));

    // The cookie is a bearer token only with the console's header.
    let admin = format!("kernelbox_console={ADMIN}");
    let who = fleet.console_get("/v1/whoami", &admin).await;
    assert_eq!(who.status, StatusCode::OK);
    assert_eq!(who.json()["role"], "admin");
    let req = api
        .build(Method::GET, "/v1/whoami", None, false, false)
        .header("cookie", &admin)
        .body(Full::new(Bytes::new()))
        .expect("request");
    let bare = http::Reply::read(api.http.request(req).await.expect("GET")).await;
    assert_eq!(bare.status, StatusCode::UNAUTHORIZED);
    // A tenant's cookie sees what its token sees: not the admin routes.
    let acme = format!("kernelbox_console={ACME}");
    let who = fleet.console_get("/v1/whoami", &acme).await;
    assert_eq!(who.json()["tenant"], "acme");
    let refused = fleet.console_get("/v1/admin/kernels", &acme).await;
    assert_eq!(refused.status, StatusCode::UNAUTHORIZED);

    // Pages of every tenant's kernels: totals, filters, bounds.
    let page = api.get("/v1/admin/kernels", Some(ADMIN)).await.json();
    assert_eq!(page["total"], KERNELS);
    assert_eq!(page["kernels"].as_array().map(Vec::len), Some(50));
    let mut seen = BTreeSet::new();
    for offset in (0..KERNELS).step_by(500) {
        let page = api
            .get(
                &format!("/v1/admin/kernels?limit=500&offset={offset}"),
                Some(ADMIN),
            )
            .await
            .json();
        for k in page["kernels"].as_array().expect("kernels") {
            seen.insert(k["id"].as_str().expect("id").to_string());
        }
    }
    assert_eq!(seen.len(), KERNELS);
    let globex = api
        .get("/v1/admin/kernels?tenant=globex&limit=1", Some(ADMIN))
        .await
        .json();
    assert_eq!(globex["total"], KERNELS / 3);
    assert_eq!(globex["kernels"][0]["tenant"], "globex");
    let one = api
        .get("/v1/admin/kernels?q=acme-s0001", Some(ADMIN))
        .await
        .json();
    assert_eq!(one["total"], 1);
    for bad in [
        "limit=0",
        "limit=501",
        "color=red",
        &format!("q={}", "x".repeat(201)),
    ] {
        let r = api
            .get(&format!("/v1/admin/kernels?{bad}"), Some(ADMIN))
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(r.error(StatusCode::BAD_REQUEST).contains("invalid_query"));
    }
    let tenants = api.get("/v1/admin/tenants", Some(ADMIN)).await.json();
    let live: Vec<(String, u64)> = tenants["tenants"]
        .as_array()
        .expect("tenants")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().unwrap_or_default().to_string(),
                t["live_kernels"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        live,
        [("acme".to_string(), 667), ("globex".to_string(), 333)]
    );

    // The admin token reads every tenant's usage, as a usage admin does; a tenant only its own.
    let usage = api.get("/v1/usage?group_by=day", Some(ADMIN)).await;
    assert_eq!(usage.status, StatusCode::OK);
    // The chart's hourly rows: one per tenant and hour, summing to what the days say.
    let cells = |report: &serde_json::Value| -> Vec<(String, u64)> {
        let mut sums = std::collections::BTreeMap::<String, u64>::new();
        for r in report["rows"].as_array().expect("rows") {
            *sums
                .entry(r["tenant"].as_str().unwrap_or_default().to_string())
                .or_default() += r["cells"].as_u64().unwrap_or(0);
        }
        sums.into_iter().collect()
    };
    let hourly = api.get("/v1/usage?group_by=hour", Some(ADMIN)).await;
    assert_eq!(hourly.status, StatusCode::OK);
    let hourly = hourly.json();
    assert_eq!(hourly["group_by"], "hour");
    let mut keys = BTreeSet::new();
    for r in hourly["rows"].as_array().expect("rows") {
        assert_eq!(r["session"], "", "an hourly row sums sessions: {r}");
        let start = r["start"].as_u64().expect("start");
        assert_eq!(start % 3_600, 0, "{r}");
        let tenant = r["tenant"].as_str().expect("tenant").to_string();
        assert!(
            keys.insert((tenant, start)),
            "one row per tenant and hour: {r}"
        );
    }
    assert_eq!(
        cells(&hourly),
        [("acme".to_string(), 667), ("globex".to_string(), 333)]
    );
    assert_eq!(cells(&hourly), cells(&usage.json()));
    let mine = api
        .get("/v1/usage?group_by=hour", Some(GLOBEX))
        .await
        .json();
    assert_eq!(cells(&mine), [("globex".to_string(), 333)]);
    let other = api.get("/v1/usage?tenant=acme", Some(GLOBEX)).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    assert_eq!(
        api.get("/v1/usage", None).await.status,
        StatusCode::UNAUTHORIZED
    );

    // In a real browser: the kernels page, paginated, renders in under a second.
    first_render(&format!("{}/console", api.base), ADMIN).await;
    fleet.finish().await;
}

#[tokio::test]
async fn admin_routes_are_absent_without_an_admin_token() {
    let kb = Orchestrator::start(
        {
            let mut c = Config::default();
            c.housekeeping.watchdog = None;
            c.housekeeping.sweep_on_start = false;
            c
        },
        Arc::new(FakeEngine::default()),
    )
    .await
    .expect("orchestrator");
    let state = AppState::new(kb, http::tenants(vec![http::tenant("acme", ACME)]));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api = http::Api::new(listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::serve_with(
        listener,
        state,
        shutdown.clone(),
        ServeOptions::default(),
    ));
    for path in ["/v1/admin/kernels", "/v1/admin/tenants"] {
        let r = api.get(path, Some(ACME)).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
    }
    let r = api
        .send_bytes(
            Method::DELETE,
            "/v1/admin/tenants/acme/sessions/s",
            Some(ACME),
            false,
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        api.get("/v1/whoami", Some(ACME)).await.json()["role"],
        "tenant"
    );
    // Without --console there is no console.
    assert_eq!(
        api.get("/console", None).await.status,
        StatusCode::NOT_FOUND
    );
    shutdown.cancel();
    task.await.expect("server task").expect("served");
}

/// The variable naming the Python that runs tests/console_browser/first_render.py (Selenium
/// installed); `.ci/run` sets it to its venv's.
const PYTHON_ENV: &str = "KERNELBOX_CONSOLE_PYTHON";

/// Runs the first-render measure in headless chromium and asserts its budget: the page
/// (HTML, script, style and its first API answers) rendered in under a second.
async fn first_render(url: &str, token: &str) {
    let python = std::env::var(PYTHON_ENV).unwrap_or_else(|_| {
        concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/target/console-venv/bin/python"
        )
        .to_string()
    });
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/console_browser/first_render.py"
    );
    let out = tokio::process::Command::new(&python)
        .arg(script)
        .arg(url)
        .env("KERNELBOX_CONSOLE_TOKEN", token)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("running {python} ({PYTHON_ENV}) with Selenium: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{script}: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let measured: Value = serde_json::from_str(stdout.trim()).expect("the measure as JSON");
    eprintln!("console first render with {KERNELS} kernels: {measured}");
    assert_eq!(measured["rows"], 50, "{measured}");
    assert_eq!(measured["count"], format!("({KERNELS})"), "{measured}");
    let ms = measured["first_render_ms"]
        .as_f64()
        .expect("first_render_ms");
    assert!(ms < 1000.0, "first render took {ms} ms: {measured}");
}

/// An in-process `serve` on the fake engine with two tenants audited (acme with its code,
/// globex hashes only) into `audit`, and the admin token.
async fn recent_server(
    audit: &std::path::Path,
) -> (
    http::Api,
    Orchestrator,
    CancellationToken,
    tokio::task::JoinHandle<std::io::Result<()>>,
) {
    use kernelbox::audit::{AuditConfig, AuditPolicy, AuditSink};
    let mut config = Config::default();
    config.housekeeping.watchdog = None;
    config.housekeeping.sweep_on_start = false;
    config.pool.size = 0;
    config.kernels.max_session_kernels = 400;
    config.audit = Some(AuditConfig {
        sink: AuditSink::File {
            path: audit.to_path_buf(),
            rotate_bytes: kernelbox::audit::DEFAULT_AUDIT_ROTATE_BYTES,
            keep: 1,
        },
        tenants: [
            ("acme".to_string(), AuditPolicy { code: true }),
            ("globex".to_string(), AuditPolicy { code: false }),
        ]
        .into_iter()
        .collect(),
    });
    let kb = Orchestrator::start(config, Arc::new(FakeEngine::default()))
        .await
        .expect("orchestrator on the fake engine");
    let tenants = http::tenants(vec![
        http::tenant("acme", ACME),
        http::tenant("globex", GLOBEX),
    ]);
    let state = AppState::new(kb.clone(), tenants);
    state.admin_with(ADMIN);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let api = http::Api::new(listener.local_addr().expect("addr"));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(server::serve_with(
        listener,
        state,
        shutdown.clone(),
        ServeOptions {
            console: true,
            ..ServeOptions::default()
        },
    ));
    (api, kb, shutdown, task)
}

/// The tenants named by a list of items (`tenant` of each).
fn tenants_of(items: &Value) -> BTreeSet<String> {
    items
        .as_array()
        .expect("a list")
        .iter()
        .map(|i| i["tenant"].as_str().expect("tenant").to_string())
        .collect()
}

#[tokio::test]
async fn recent_events_and_the_audit_tail_are_bounded_and_each_tenant_sees_its_own() {
    let dir = tempfile::tempdir().expect("temp dir");
    let audit = dir.path().join("audit.log");
    let (api, kb, shutdown, task) = recent_server(&audit).await;
    for (tenant, session, code) in [
        ("acme", "a1", "x = 'acme-secret'"),
        ("acme", "a2", "y = 2"),
        ("globex", "g1", "z = 'globex-secret'"),
    ] {
        let scope = Scope::session(session).tenant(tenant);
        let r = kb.execute(ExecuteRequest::new(scope, code)).await;
        assert!(r.expect("a cell").error.is_none());
    }
    kb.clear_session(Some("acme"), "a2").await;
    kb.sync_catalog().await;

    // A session's events: its start and its end, each tenant its own.
    let a2 = api.get("/v1/sessions/a2/events", Some(ACME)).await.json();
    let kinds: Vec<&str> = a2["events"]
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["event"].as_str().expect("event"))
        .collect();
    assert_eq!(kinds, ["started", "ended"], "{a2}");
    assert_eq!(a2["ended"], true);
    assert_eq!(a2["events"][1]["reason"], "cleared");
    // globex asking for acme's session name reads its own (none), never acme's.
    let theirs = api.get("/v1/sessions/a2/events", Some(GLOBEX)).await.json();
    assert_eq!(theirs["tenant"], "globex");
    assert_eq!(theirs["events"].as_array().map(Vec::len), Some(0));
    let admin = api
        .get("/v1/admin/tenants/acme/sessions/a2/events", Some(ADMIN))
        .await
        .json();
    assert_eq!(admin, a2);
    assert_eq!(
        api.get("/v1/admin/tenants/acme/sessions/a2/events", Some(ACME))
            .await
            .status,
        StatusCode::UNAUTHORIZED
    );
    // The recent sessions: the admin's every tenant's; a tenant's its own only.
    let all = api.get("/v1/events", Some(ADMIN)).await.json();
    assert_eq!(
        tenants_of(&all["sessions"]),
        BTreeSet::from(["acme".to_string(), "globex".to_string()])
    );
    let mine = api.get("/v1/events", Some(GLOBEX)).await.json();
    assert_eq!(
        tenants_of(&mine["sessions"]),
        BTreeSet::from(["globex".to_string()])
    );
    let one = api
        .get("/v1/events?tenant=acme&limit=1", Some(ADMIN))
        .await
        .json();
    assert_eq!(one["sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(
        one["sessions"][0]["session"], "a2",
        "the latest first: {one}"
    );

    // The audit tail: acme's code (it records it), globex's hash only; each its own.
    // The trail's writer is a task of its own: its lines are awaited (at most 30 s).
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let tail = loop {
        let tail = api.get("/v1/audit", Some(ADMIN)).await;
        assert_eq!(tail.status, StatusCode::OK);
        let tail = tail.json();
        if tail["records"].as_array().map(Vec::len) == Some(3) {
            break tail;
        }
        assert!(tokio::time::Instant::now() < deadline, "{tail}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(tail["whole_file"], true);
    let globex = api.get("/v1/audit", Some(GLOBEX)).await.json();
    assert_eq!(
        tenants_of(&globex["records"]),
        BTreeSet::from(["globex".to_string()])
    );
    assert!(globex["records"][0]["code"].is_null(), "{globex}");
    assert_eq!(
        globex["records"][0]["code_sha256"].as_str().map(str::len),
        Some(64)
    );
    assert!(!globex.to_string().contains("acme-secret"));
    let acme = api.get("/v1/audit?limit=1", Some(ACME)).await.json();
    assert_eq!(acme["records"].as_array().map(Vec::len), Some(1));
    assert_eq!(acme["records"][0]["code"], "y = 2", "the latest: {acme}");

    // Egress is off here: nothing refused, and it says so.
    let refusals = api.get("/v1/egress/refusals", Some(ACME)).await.json();
    assert_eq!(refusals["egress"], false);
    assert_eq!(refusals["refusals"].as_array().map(Vec::len), Some(0));

    // Bounds and names: another tenant's, a limit out of bounds, an unknown parameter, a
    // path trick; no token at all.
    for path in ["/v1/events", "/v1/audit", "/v1/egress/refusals"] {
        let r = api.get(&format!("{path}?tenant=acme"), Some(GLOBEX)).await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}");
        for bad in [
            "limit=0",
            "limit=201",
            "limit=99999999999999999999",
            "color=red",
        ] {
            let r = api.get(&format!("{path}?{bad}"), Some(ADMIN)).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}?{bad}");
        }
        assert_eq!(
            api.get(path, None).await.status,
            StatusCode::UNAUTHORIZED,
            "{path}"
        );
    }
    for path in [
        "/v1/admin/tenants/acme/sessions/..%2Fa2/events",
        "/v1/admin/tenants/..%2Facme/sessions/a2/events",
        "/v1/sessions/a%2F2/events",
    ] {
        let token = if path.contains("admin") { ADMIN } else { ACME };
        let r = api.get(path, Some(token)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{path}");
    }

    // A tenant churning through session names keeps at most its bound of rings, and another
    // tenant's are kept.
    let events = kb.kernel_events();
    let many = kernelbox::lifecycle::MAX_SESSIONS_PER_TENANT + 20;
    let runs = (0..many).map(|i| {
        let kb = kb.clone();
        async move {
            let scope = Scope::session(format!("churn-{i}")).tenant("acme");
            kb.execute(ExecuteRequest::new(scope, "1")).await
        }
    });
    for r in futures::future::join_all(runs).await {
        assert!(r.expect("a cell").error.is_none());
    }
    let (_, acme_rings) = events.counts("acme");
    assert_eq!(acme_rings, kernelbox::lifecycle::MAX_SESSIONS_PER_TENANT);
    assert!(events.session("globex", "g1").is_some());
    let most = api.get("/v1/events?limit=200", Some(ADMIN)).await.json();
    assert_eq!(most["sessions"].as_array().map(Vec::len), Some(200));

    shutdown.cancel();
    task.await.expect("server task").expect("served");
}
