//! The warm pool against the real engine: a pool hit is a fresh kernel never shared between
//! owners, the pool refills to its size, a burst larger than the pool mixes hits and cold
//! starts, old pooled kernels are replaced, the admin verbs see who took a kernel, a
//! `kernelbox serve --pool N` killed with SIGKILL leaves nothing behind, and the first cell of
//! a Bash, JavaScript or TypeScript context is a hit of its language's pool.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::collections::HashSet;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use common::{Case, CASE};
use futures::StreamExt;
use kernelbox::docker::ContainerInfo;
use kernelbox::wire::Language;
use kernelbox::{
    labels, CellStatus, Engine, ExecuteRequest, FnDispatcher, Scope, ToolCall, ToolDispatcher,
};
use serde_json::Value;

const READY: Duration = Duration::from_secs(60);

/// The case's containers made for the pool and not taken (no owner in their name).
fn untaken(list: &[ContainerInfo]) -> Vec<String> {
    list.iter()
        .filter(|c| c.labels.contains_key(labels::POOL))
        .filter(|c| labels::parse_owner_name(&c.name).is_none())
        .map(|c| c.id[..12].to_string())
        .collect()
}

/// Waits (bounded) for the first engine event `action` on `id`.
async fn wait_event_on(engine: &Arc<dyn Engine>, label: &str, id: &str, action: &str) {
    let since = kernelbox::clock::unix_now() as i64 - 30;
    let mut events = engine.events(&[format!("{CASE}={label}")], Some(since));
    let seen = tokio::time::timeout(READY, async {
        while let Some(Ok(event)) = events.next().await {
            if event.id.starts_with(id) && event.action == action {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(seen, Ok(true), "no {action} event for {id}");
}

async fn kernelbox_cli(args: &[&str]) -> (i32, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
        .args(args)
        .output()
        .await
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

/// What a fresh kernel has: no globals but `os`, nothing in its working directory but
/// kernelbox's own `.kernelbox/status`.
const FRESH: &str = "import os\nprint(sorted(k for k in globals() if not k.startswith('_')), \
                     sorted(os.listdir('.')), sorted(os.listdir('.kernelbox')))";
const FRESH_OUTPUT: &str = "['os'] ['.kernelbox'] ['status']\n";

#[tokio::test]
async fn a_pool_hit_is_a_fresh_kernel_never_shared_between_owners() {
    let case = Case::with("pool-hit", |c| {
        c.pool.size = 2;
        c.kernels.max_session_kernels = 8;
    })
    .await;
    assert!(case.kb.wait_pool_ready(2, READY).await, "the pool fills");
    let before = case.containers().await;
    let pooled = untaken(&before);
    assert_eq!(pooled.len(), 2, "{before:?}");
    for c in &before {
        // Created without an owner: nothing names a tenant, an owner or a key.
        for key in [labels::TENANT, labels::OWNER, labels::SESSION, labels::KEY] {
            assert!(!c.labels.contains_key(key), "{key} on a pooled kernel");
        }
    }

    let a = case.run("owner-a", FRESH).await;
    assert_eq!(a.status, CellStatus::Success, "{a:?}");
    // The runner counts cells itself: 1 means no cell ever ran in this kernel before.
    assert_eq!(a.kernel.execution_count, 1);
    assert!(!a.kernel.reused);
    assert_eq!(a.output, FRESH_OUTPUT);
    assert!(pooled.contains(&a.kernel.id), "a hit: {a:?} {pooled:?}");
    case.run("owner-a", "secret = 42\nopen('mine.txt', 'w').write('a')")
        .await;

    let b = case.run("owner-b", FRESH).await;
    assert_eq!(b.kernel.execution_count, 1);
    assert!(!b.kernel.reused);
    assert_eq!(b.output, FRESH_OUTPUT, "no state from owner a");
    assert!(pooled.contains(&b.kernel.id), "a hit: {b:?} {pooled:?}");
    assert_ne!(a.kernel.id, b.kernel.id, "one kernel, one owner");
    let stats = case.kb.stats().pool;
    assert_eq!((stats.hits, stats.misses), (2, 0));

    // A reset never gets its old kernel back either: a fresh pooled one or a cold start.
    let reset = case
        .exec(ExecuteRequest {
            reset: true,
            ..ExecuteRequest::new("owner-a", FRESH)
        })
        .await;
    assert!(reset.kernel.state_reset);
    assert_eq!(reset.output, FRESH_OUTPUT);
    assert_ne!(reset.kernel.id, a.kernel.id);
    assert_ne!(reset.kernel.id, b.kernel.id);

    // The pool refills to its size in the background.
    assert!(case.kb.wait_pool_ready(2, READY).await, "the pool refills");
    let after = case.containers().await;
    let refilled = untaken(&after);
    assert_eq!(refilled.len(), 2);
    assert!(refilled.iter().all(|id| !pooled.contains(id)));
    assert_eq!(after.len(), 4, "two owners and two pooled: {after:?}");
    case.finish().await;
}

/// A pooled kernel is created before anyone's tool set or owner is known: both are applied
/// at the take, so a tool call from it goes out for its owner, with its tools.
#[tokio::test]
async fn a_taken_kernel_calls_tools_as_its_owner_with_its_tool_set() {
    let case = Case::with("pool-tools", |c| c.pool.size = 1).await;
    assert!(case.kb.wait_pool_ready(1, READY).await);
    let pooled = untaken(&case.containers().await);
    let seen: Arc<std::sync::Mutex<Vec<ToolCall>>> = Arc::default();
    let log = seen.clone();
    let dispatcher: Arc<dyn ToolDispatcher> = Arc::new(FnDispatcher(move |call: ToolCall| {
        log.lock().unwrap().push(call);
        Ok(serde_json::json!("found"))
    }));
    let r = case
        .exec(ExecuteRequest {
            task_id: Some("turn-1".into()),
            dispatcher: Some(dispatcher),
            ..ExecuteRequest::new(
                Scope::session("conv-t")
                    .tenant("acme")
                    .child("helper")
                    .tools(["web_search"]),
                "import kernel_tools\nprint(kernel_tools.web_search(q=1))\n\
                 try:\n    kernel_tools.other()\nexcept kernel_tools.ToolError as e:\n    print(e)",
            )
        })
        .await;
    assert_eq!(r.kernel.id, pooled[0], "a hit");
    assert_eq!(r.tool_calls_made, 1, "{r:?}");
    assert!(
        r.output.starts_with("found\nUnknown tool \"other\""),
        "{r:?}"
    );
    let calls = seen.lock().unwrap().clone();
    assert_eq!(calls.len(), 1);
    assert_eq!(
        (calls[0].tenant.as_str(), calls[0].session.as_str()),
        ("acme", "conv-t")
    );
    assert_eq!(calls[0].child.as_deref(), Some("helper"));
    assert_eq!(calls[0].task_id.as_deref(), Some("turn-1"));
    case.finish().await;
}

#[tokio::test]
async fn a_burst_larger_than_the_pool_mixes_hits_and_cold_starts_and_all_succeed() {
    let case = Case::with("pool-burst", |c| {
        c.pool.size = 3;
        c.kernels.max_session_kernels = 16;
    })
    .await;
    assert!(case.kb.wait_pool_ready(3, READY).await);
    let calls = (0..8).map(|i| {
        let kb = case.kb.clone();
        async move {
            kb.execute(ExecuteRequest::new(format!("burst-{i}"), FRESH))
                .await
                .unwrap()
        }
    });
    let results = futures::future::join_all(calls).await;
    let mut ids = HashSet::new();
    for r in &results {
        assert_eq!(r.status, CellStatus::Success, "{r:?}");
        assert_eq!(r.kernel.execution_count, 1);
        assert!(!r.kernel.reused);
        assert_eq!(r.output, FRESH_OUTPUT);
        ids.insert(r.kernel.id.clone());
    }
    assert_eq!(ids.len(), 8, "eight owners, eight kernels");
    let stats = case.kb.stats().pool;
    assert!(stats.hits >= 1 && stats.misses >= 1, "{stats:?}");
    assert_eq!(stats.hits + stats.misses, 8);
    assert!(case.kb.wait_pool_ready(3, READY).await, "the pool refills");
    assert_eq!(case.containers().await.len(), 11);
    case.finish().await;
}

#[tokio::test]
async fn a_pooled_kernel_past_its_maximum_age_is_replaced() {
    let case = Case::with("pool-age", |c| {
        c.pool.size = 1;
        c.pool.max_age = Duration::from_secs(3);
    })
    .await;
    assert!(case.kb.wait_pool_ready(1, READY).await);
    let first = untaken(&case.containers().await);
    assert_eq!(first.len(), 1);
    // Past its age the kernel is removed and a fresh one takes its place.
    wait_event_on(&case.engine, &case.label, &first[0], "destroy").await;
    assert!(case.kb.wait_pool_ready(1, READY).await);
    let second = untaken(&case.containers().await);
    assert_eq!(second.len(), 1);
    assert_ne!(first, second);
    assert!(case.kb.stats().pool.refills.count() >= 2);
    case.finish().await;
}

#[tokio::test]
async fn the_admin_verbs_see_the_owner_of_a_taken_kernel() {
    let case = Case::with("pool-admin", |c| c.pool.size = 1).await;
    let tenant = format!("t{}", &case.label[case.label.len() - 8..]);
    let session = format!("s{}", &case.label[case.label.len() - 8..]);
    assert!(case.kb.wait_pool_ready(1, READY).await);
    let pooled = untaken(&case.containers().await);
    let (code, out) = kernelbox_cli(&["inspect", &pooled[0], "--format", "table"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("pooled"), "{out}");

    let r = case
        .exec(ExecuteRequest::new(
            Scope::session(session.clone()).tenant(tenant.clone()),
            "x = 1",
        ))
        .await;
    assert_eq!(r.kernel.id, pooled[0]);
    // The server names the kernel after its owner just after the take.
    wait_event_on(&case.engine, &case.label, &r.kernel.id, "rename").await;

    let (code, out) = kernelbox_cli(&["ps", "--tenant", &tenant, "--format", "json"]).await;
    assert_eq!(code, 0);
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["container"], r.kernel.id.as_str());
    assert_eq!(rows[0]["owner"], session.as_str());
    assert_eq!(rows[0]["tenant"], tenant.as_str());
    assert_eq!(rows[0]["from_pool"], true);
    assert_eq!(rows[0]["state"], "running");
    assert_eq!(rows[0]["cells"], 1);
    // Its labels were fixed in the pool, with no generation: its name at the take says it.
    assert_eq!(
        rows[0]["generation"],
        r.kernel.generation.to_string(),
        "{out}"
    );
    let named = case
        .containers()
        .await
        .into_iter()
        .find(|c| c.id.starts_with(&r.kernel.id))
        .unwrap();
    assert!(
        named.name.starts_with("kb.")
            && named.name.ends_with(&format!(".g{}", r.kernel.generation)),
        "{}",
        named.name
    );

    let (code, out) = kernelbox_cli(&["inspect", &r.kernel.id]).await;
    assert_eq!(code, 0);
    let inspected: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(inspected["kernel"]["owner"], session.as_str());

    let (code, out) = kernelbox_cli(&["kill", "--owner", &session, "--format", "json"]).await;
    assert_eq!(code, 0);
    let killed: Vec<Value> = serde_json::from_str(&out).unwrap();
    assert_eq!(killed.len(), 1, "{out}");
    assert_eq!(killed[0]["tenant"], tenant.as_str());
    let next = case
        .exec(ExecuteRequest::new(
            Scope::session(session.clone()).tenant(tenant.clone()),
            "print('x' in dir())",
        ))
        .await;
    assert_eq!(next.output, "False\n");
    assert_eq!(
        next.kernel.state_lost.map(|l| l.reason),
        Some(kernelbox::LossReason::Killed)
    );
    case.finish().await;
}

/// A `kernelbox serve --pool 3` with one kernel taken: metrics show the pool, and SIGKILL of
/// the server leaves no kernel (pooled or taken) and no volume behind.
#[tokio::test]
async fn kill_9_of_a_server_with_a_pool_leaves_no_pooled_kernel_behind() {
    use tokio::io::{AsyncBufReadExt, BufReader};

    let engine = common::engine().await;
    let label = common::unique("pool-serve");
    let state = tempfile::tempdir().unwrap();
    let mut server = common::serve_command(&label, "pool-token")
        .args(["--pool", "3"])
        .env("KERNELBOX_STATE_DIR", state.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stderr.take().unwrap()).lines();
    let addr = common::serving_addr(&mut lines).await;
    let api = http::Api::new(addr);
    let token = Some("pool-token");
    let metrics =
        || async { String::from_utf8_lossy(&api.get("/metrics", token).await.body).into_owned() };

    // The pool fills: three pooled kernels, as the server's metrics say.
    let filled = tokio::time::timeout(READY, async {
        loop {
            let text = metrics().await;
            if text.contains("kernelbox_pool_ready 3") {
                return text;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), std::future::pending::<()>())
                .await;
        }
    })
    .await
    .expect("the pool fills");
    assert!(filled.contains("kernelbox_pool_size 3"), "{filled}");
    assert!(
        filled.contains("kernelbox_pool_refill_seconds_count 3"),
        "{filled}"
    );

    let r = api
        .post(
            "/v1/sessions/served/execute",
            token,
            serde_json::json!({"code": "print(1)"}),
        )
        .await
        .json();
    assert_eq!(r["kernel"]["reused"], false, "{r}");
    assert_eq!(r["kernel"]["execution_count"], 1, "{r}");
    let text = metrics().await;
    assert!(
        text.contains("kernelbox_pool_takes_total{outcome=\"hit\"} 1"),
        "{text}"
    );
    let listed = api.get("/v1/kernels", token).await.json();
    assert_eq!(listed["kernels"][0]["owner"], "served", "{listed}");
    assert_eq!(
        listed["kernels"][0]["id"], r["kernel"]["id"],
        "the taken kernel is the owner's, listed"
    );

    // Wait for the refill to replace the taken kernel, so a pooled kernel and the taken one
    // are both live at the kill.
    let refilled = tokio::time::timeout(READY, async {
        loop {
            if metrics().await.contains("kernelbox_pool_ready 3") {
                return;
            }
            let _ = tokio::time::timeout(Duration::from_millis(200), std::future::pending::<()>())
                .await;
        }
    })
    .await;
    assert!(refilled.is_ok(), "the pool refills");
    assert_eq!(common::containers(&engine, &label).await.len(), 4);
    server.kill().await.unwrap();
    server.wait().await.unwrap();
    let took = common::wait_gone(&engine, &label, Duration::from_secs(10)).await;
    assert!(
        took.is_some(),
        "a kernel outlived its server by more than 10 s"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !common::volumes(&engine, &label).await.is_empty() && std::time::Instant::now() < deadline
    {
        let _ =
            tokio::time::timeout(Duration::from_millis(200), std::future::pending::<()>()).await;
    }
    common::assert_clean(&engine, &label).await;
}

/// What a cell sees of the preload: which modules are loaded, which names its namespace has.
const PRELOADED: &str = "import sys\nprint([m in sys.modules for m in \
    ('decimal', 'email.mime.text', 'no_such_module_kernelbox')], \
    sorted(k for k in globals() if not k.startswith('_')))";

#[tokio::test]
async fn a_preloading_pool_hands_out_kernels_with_the_modules_loaded_and_a_clean_namespace() {
    let case = Case::with("pool-preload", |c| {
        c.pool.size = 1;
        c.kernels.max_session_kernels = 4;
        // A module that does not exist is skipped; the others still load.
        c.pool.preload = ["decimal", "no_such_module_kernelbox", "email.mime.text"]
            .map(String::from)
            .to_vec();
    })
    .await;
    assert!(case.kb.wait_pool_ready(1, READY).await, "the pool fills");
    let pooled = untaken(&case.containers().await);
    let hit = case.run("preloaded", PRELOADED).await;
    assert_eq!(hit.status, CellStatus::Success, "{hit:?}");
    assert!(pooled.contains(&hit.kernel.id), "a hit: {hit:?} {pooled:?}");
    assert_eq!(hit.output, "[True, True, False] ['sys']\n");
    // The preload ran no cell of the owner's.
    assert_eq!(hit.kernel.execution_count, 1);
    case.finish().await;

    // A kernel started cold for an owner is never preloaded (the same preload, no pool).
    let cold = Case::with("pool-preload-cold", |c| {
        c.pool.size = 0;
        c.pool.preload = vec!["decimal".into(), "email.mime.text".into()];
    })
    .await;
    let r = cold.run("cold", PRELOADED).await;
    assert_eq!(r.output, "[False, False, False] ['sys']\n", "{r:?}");
    cold.finish().await;
}

#[tokio::test]
async fn a_bad_preload_module_name_is_refused_at_start() {
    let mut config = common::config(&common::unique("pool-preload-bad"));
    config.pool.preload = vec!["os; import shutil".into()];
    let err = kernelbox::Orchestrator::start(config, common::engine().await)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("pool_preload"), "{err}");
}

/// A cell of `session`'s `language` context.
fn cell_in(session: &str, language: Language, code: &str) -> ExecuteRequest {
    ExecuteRequest::new(Scope::session(session).language(language), code)
}

#[tokio::test]
async fn the_first_cell_of_a_bash_javascript_or_typescript_context_is_a_pool_hit() {
    let case = Case::with("pool-languages", |c| {
        c.pool.size = 1;
        c.pool.languages = [
            (Language::Bash, 1),
            (Language::Javascript, 1),
            (Language::Typescript, 1),
        ]
        .into();
        c.kernels.max_session_kernels = 8;
    })
    .await;
    assert!(
        case.kb.wait_pool_ready(4, READY).await,
        "every language's pool fills"
    );
    let pooled = untaken(&case.containers().await);
    assert_eq!(pooled.len(), 4, "{pooled:?}");

    // Each hit runs its language: the pooled kernel was started with that language's runner
    // (a Python kernel would fail these cells as syntax errors).
    let bash = case
        .exec(cell_in(
            "b",
            Language::Bash,
            "x=7; echo \"bash $((x * 6))\"",
        ))
        .await;
    assert_eq!(bash.status, CellStatus::Success, "{bash:?}");
    assert_eq!(bash.output, "bash 42\n");
    assert_eq!(bash.kernel.execution_count, 1);
    assert!(
        pooled.contains(&bash.kernel.id),
        "a hit: {bash:?} {pooled:?}"
    );
    let js = case
        .exec(cell_in(
            "j",
            Language::Javascript,
            "console.log(typeof process.versions.node)",
        ))
        .await;
    assert_eq!(js.status, CellStatus::Success, "{js:?}");
    assert_eq!(js.output, "string\n");
    assert!(pooled.contains(&js.kernel.id), "a hit: {js:?} {pooled:?}");
    assert_ne!(bash.kernel.id, js.kernel.id);
    let ts = case
        .exec(cell_in(
            "t",
            Language::Typescript,
            "const n: number = 21;\nconsole.log(n * 2)",
        ))
        .await;
    assert_eq!(ts.output, "42\n", "{ts:?}");
    assert!(pooled.contains(&ts.kernel.id), "a hit: {ts:?} {pooled:?}");
    let stats = case.kb.stats().pool;
    assert_eq!((stats.hits, stats.misses), (3, 0));
    assert_eq!(stats.languages[&Language::Typescript].hits, 1);
    assert_eq!(stats.languages[&Language::Bash].hits, 1);
    assert_eq!(stats.languages[&Language::Javascript].hits, 1);
    assert_eq!(stats.languages[&Language::Python].hits, 0);
    // The metrics say so per language.
    let text = kernelbox::server::Metrics::default().render(0, false, &case.kb.stats());
    let line = "kernelbox_pool_language_takes_total{language=\"bash\",outcome=\"hit\"} 1";
    assert!(text.contains(line), "{text}");

    // A second context of a session shares the first one's /work, so it never takes a
    // pooled kernel (whose /work is its own): the Python pool's kernel stays, unused.
    let python = case.run("b", "print('py')").await;
    assert_eq!(python.output, "py\n", "{python:?}");
    assert!(!pooled.contains(&python.kernel.id), "not a hit: {python:?}");
    let stats = case.kb.stats().pool;
    assert_eq!(stats.languages[&Language::Python].hits, 0);
    assert_eq!(stats.languages[&Language::Python].misses, 1);
    case.finish().await;
}
