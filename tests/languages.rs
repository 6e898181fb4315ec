//! Kernels in other languages than Python, against the real engine (`docs/contract.md`,
//! "Languages"): the seed's contract tests ported to Bash and JavaScript (state across cells,
//! reset, a failing command or an exception keeps the kernel, timeout kills and is reported,
//! the process exiting, subprocess output, interrupt), TypeScript's annotations stripped, one
//! kernel per language in a session with its own state and losses, the hostile cells per
//! language, and the HTTP API's `language`.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use common::Case;
use kernelbox::wire::Language;
use kernelbox::{CellResult, CellStatus, ExecuteRequest, LossReason, Scope};
use serde_json::json;

/// `code` as a Bash cell of `session`.
fn bash(session: &str, code: &str) -> ExecuteRequest {
    ExecuteRequest::new(Scope::session(session).language(Language::Bash), code)
}

/// Runs `code` as a Bash cell of `session`.
async fn run_bash(case: &Case, session: &str, code: &str) -> CellResult {
    case.exec(bash(session, code)).await
}

#[tokio::test]
async fn bash_state_persists_across_cells_beside_the_python_kernel() {
    let case = Case::new("bash-state").await;
    let py = case.run("s", "x = 41").await;
    assert_eq!(py.status, CellStatus::Success, "{py:?}");
    let first = run_bash(
        &case,
        "s",
        "x=7; greet() { echo \"hello $1\"; }; mkdir -p /tmp/d && cd /tmp/d",
    )
    .await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert!(!first.kernel.reused);
    assert_ne!(first.kernel.id, py.kernel.id, "a kernel of its own");
    let second = run_bash(&case, "s", "echo \"x=$x\"; greet you; pwd").await;
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert_eq!(second.output, "x=7\nhello you\n/tmp/d\n");
    assert!(second.kernel.reused);
    assert_eq!(second.kernel.execution_count, 2);
    assert_eq!(second.kernel.id, first.kernel.id);
    // The Python kernel kept its own state.
    let back = case.run("s", "print(x + 1)").await;
    assert_eq!(back.output, "42\n", "{back:?}");
    assert_eq!(back.kernel.id, py.kernel.id);
    // Both are listed, each with its language and context; both are containers.
    let mut listed: Vec<(String, Language, String)> = case
        .kb
        .list_kernels(None)
        .into_iter()
        .map(|k| (k.id, k.language, k.context))
        .collect();
    listed.sort_by_key(|(_, l, _)| *l);
    assert_eq!(
        listed,
        vec![
            (py.kernel.id.clone(), Language::Python, "python".into()),
            (first.kernel.id.clone(), Language::Bash, "bash".into()),
        ]
    );
    let mut ids = case.container_ids().await;
    ids.sort();
    let mut want = vec![py.kernel.id.clone(), first.kernel.id.clone()];
    want.sort();
    assert_eq!(ids, want);
    case.finish().await;
}

#[tokio::test]
async fn a_failing_bash_command_is_an_error_with_its_status_and_keeps_the_kernel() {
    let case = Case::new("bash-error").await;
    run_bash(&case, "s", "a=7").await;
    let failed = run_bash(&case, "s", "echo out; ls /nonexistent").await;
    assert_eq!(failed.status, CellStatus::Error, "{failed:?}");
    assert_eq!(failed.exit_code, 2, "ls's own status: {failed:?}");
    assert_eq!(failed.error.as_deref(), Some("exit status 2"));
    assert!(failed.output.starts_with("out\n"), "{failed:?}");
    assert!(
        failed.output.contains("No such file"),
        "stderr too: {failed:?}"
    );
    let after = run_bash(&case, "s", "echo $a").await;
    assert_eq!(after.output, "7\n", "{after:?}");
    assert!(after.kernel.reused);
    assert!(after.kernel.state_lost.is_none());
    case.finish().await;
}

#[tokio::test]
async fn bash_subprocess_output_and_background_jobs_arrive() {
    let case = Case::new("bash-sub").await;
    let r = run_bash(
        &case,
        "s",
        "python3 -c 'print(\"from python\")'; sh -c 'echo to-stderr >&2'; (echo in-subshell); \
         { sleep 0.2; echo late; } & wait",
    )
    .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    for want in ["from python\n", "to-stderr\n", "in-subshell\n", "late\n"] {
        assert!(r.output.contains(want), "{want:?} in {r:?}");
    }
    case.finish().await;
}

#[tokio::test]
async fn a_bash_reset_discards_only_the_bash_state() {
    let case = Case::new("bash-reset").await;
    case.run("s", "x = 41").await;
    let first = run_bash(&case, "s", "y=5").await;
    let reset = case
        .exec(ExecuteRequest {
            reset: true,
            ..bash("s", "echo \"y=${y:-unset}\"")
        })
        .await;
    assert_eq!(reset.output, "y=unset\n", "{reset:?}");
    assert!(reset.kernel.state_reset);
    assert_eq!(reset.kernel.generation, 2);
    assert_ne!(reset.kernel.id, first.kernel.id);
    let py = case.run("s", "print(x)").await;
    assert_eq!(py.output, "41\n", "the Python kernel is untouched: {py:?}");
    assert!(py.kernel.reused);
    case.finish().await;
}

#[tokio::test]
async fn a_bash_timeout_kills_only_the_bash_kernel_and_is_reported() {
    let case = Case::new("bash-timeout").await;
    let py = case.run("s", "x = 41").await;
    let slow = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(1)),
            ..bash("s", "echo started; sleep 30")
        })
        .await;
    assert_eq!(slow.status, CellStatus::Timeout, "{slow:?}");
    assert_eq!(slow.exit_code, -1);
    assert!(slow.output.contains("started"), "{slow:?}");
    assert_eq!(
        case.container_ids().await,
        vec![py.kernel.id.clone()],
        "only the Python kernel's container is left"
    );
    let fresh = run_bash(&case, "s", "echo alive").await;
    assert_eq!(fresh.output, "alive\n", "{fresh:?}");
    assert_eq!(
        fresh.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    let kept = case.run("s", "print(x + 1)").await;
    assert_eq!(kept.output, "42\n", "{kept:?}");
    assert!(kept.kernel.state_lost.is_none(), "{kept:?}");
    assert_eq!(kept.kernel.id, py.kernel.id);
    case.finish().await;
}

#[tokio::test]
async fn bash_exit_ends_the_kernel_like_sys_exit() {
    let case = Case::new("bash-exit").await;
    let r = run_bash(&case, "s", "echo bye; exit 3").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.kernel.ended, "{r:?}");
    assert_eq!(r.output, "bye\n");
    assert!(case.containers().await.is_empty(), "the kernel is gone");
    let next = run_bash(&case, "s", "echo again").await;
    assert_eq!(next.output, "again\n", "{next:?}");
    assert!(!next.kernel.reused);
    assert!(next.kernel.state_lost.is_none(), "asked for: {next:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_bash_interrupt_stops_the_cell_and_keeps_the_shell() {
    let case = Case::with("bash-interrupt", |c| {
        c.cells.interrupt_grace = Duration::from_secs(10)
    })
    .await;
    let first = run_bash(&case, "s", "x=41").await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let sink: kernelbox::OutputSink = std::sync::Arc::new(move |_s, _b: &[u8]| {
        let _ = tx.send(());
    });
    let kb = case.kb.clone();
    let cell = tokio::spawn(async move {
        kb.execute(ExecuteRequest {
            sink: Some(sink),
            ..bash("s", "echo started; sleep 30; echo not-reached")
        })
        .await
    });
    rx.recv().await.expect("the cell started");
    assert_eq!(case.kb.interrupt(None, "s").await, 1);
    let r = cell.await.unwrap().expect("execute");
    assert_eq!(r.status, CellStatus::Interrupted, "{r:?}");
    assert!(!r.output.contains("not-reached"), "{r:?}");
    let next = run_bash(&case, "s", "echo $((x + 1))").await;
    assert_eq!(next.output, "42\n", "the state survived: {next:?}");
    assert_eq!(next.kernel.id, first.kernel.id);
    assert!(next.kernel.state_lost.is_none(), "{next:?}");
    case.finish().await;
}

/// Runs a hostile Bash cell while the session's Python kernel and a bystander session hold
/// state; both are untouched and the session's next Bash cell works.
async fn survive_bash(case: &Case, code: &str, timeout: u64) -> CellResult {
    case.run("s", "kept = 'py'").await;
    case.run("other", "kept = 'safe'").await;
    let result = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(timeout)),
            ..bash("s", code)
        })
        .await;
    let next = run_bash(case, "s", "echo next call works").await;
    assert_eq!(next.status, CellStatus::Success, "after {code:?}: {next:?}");
    assert_eq!(next.output, "next call works\n", "{next:?}");
    for (session, want) in [("s", "py"), ("other", "safe")] {
        let r = case.run(session, "print(kept)").await;
        assert!(
            r.output.contains(want) && r.kernel.reused,
            "{session}: {r:?}"
        );
    }
    result
}

#[tokio::test]
async fn hostile_bash_cells_are_contained() {
    let case = Case::with("bash-hostile", |c| c.spec.sandbox.pids_limit = 64).await;
    // Endless output: cut, and the timeout still kills.
    let r = survive_bash(&case, "yes xxxxxxxxxxxxxxxx", 3).await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    assert_eq!(r.stdout_truncated, Some(true), "{r:?}");
    // A fork bomb meets the pids limit; the timeout ends it.
    let r = survive_bash(&case, "b() { b | b & }; b; sleep 20", 5).await;
    assert_ne!(r.status, CellStatus::Success, "{r:?}");
    // A memory bomb in the shell itself: the kernel's memory limit, reported.
    let r = survive_bash(&case, "s=x; while :; do s=$s$s$s$s; done", 60).await;
    assert_ne!(r.status, CellStatus::Success, "{r:?}");
    // Closing the shell's descriptors, its private ones included, wedges nothing.
    let r = survive_bash(
        &case,
        "exec 0<&- 1>&- 2>&- 60>&- 61>&- 62<&- 63>&-; echo gone",
        10,
    )
    .await;
    assert_ne!(r.status, CellStatus::Timeout, "{r:?}");
    // Killing the shell, then the runner: the kernel is lost and the loss reported.
    for code in ["kill -9 $$", "kill -9 $PPID"] {
        let r = survive_bash(&case, code, 10).await;
        assert_eq!(r.status, CellStatus::Error, "{code}: {r:?}");
        assert!(r.error.is_some(), "{r:?}");
    }
    case.finish().await;
}

#[tokio::test]
async fn a_file_written_by_bash_is_read_by_python_in_the_same_session() {
    let case = Case::new("ctx-files").await;
    let w = run_bash(
        &case,
        "s",
        "mkdir -p out && echo from-bash > out/b.txt; pwd",
    )
    .await;
    assert_eq!(w.output, "/work\n", "{w:?}");
    let r = case
        .run("s", "print(open('out/b.txt').read(), end='')")
        .await;
    assert_eq!(r.output, "from-bash\n", "{r:?}");
    assert_ne!(r.kernel.id, w.kernel.id, "two kernels, one /work");
    // And the other way, through a named context too.
    case.run("s", "open('p.txt', 'w').write('from-python')")
        .await;
    let named = case
        .exec(ExecuteRequest::new(
            Scope {
                context: kernelbox::wire::Context {
                    name: "second".into(),
                    language: Language::Bash,
                },
                ..Scope::session("s")
            },
            "cat p.txt",
        ))
        .await;
    assert_eq!(named.output, "from-python", "{named:?}");
    // Another session sees none of it.
    let other = run_bash(&case, "o", "ls /work").await;
    assert!(!other.output.contains("p.txt"), "{other:?}");
    case.finish().await;
}

#[tokio::test]
async fn one_context_timeout_or_reset_keeps_the_shared_files() {
    let case = Case::new("ctx-keep").await;
    case.run("s", "open('kept.txt', 'w').write('kept')").await;
    let slow = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(1)),
            ..bash("s", "echo more >> kept.txt; sleep 30")
        })
        .await;
    assert_eq!(slow.status, CellStatus::Timeout, "{slow:?}");
    let r = case
        .run("s", "print(open('kept.txt').read(), end='')")
        .await;
    assert_eq!(r.output, "keptmore\n", "{r:?}");
    // The Python kernel reset while the Bash one lives: the files stay, and the new Python
    // kernel (its /work the shared volume) sees them.
    let b = run_bash(&case, "s", "echo bash-side > b.txt").await;
    assert_eq!(b.status, CellStatus::Success, "{b:?}");
    let fresh = case
        .exec(ExecuteRequest {
            reset: true,
            ..ExecuteRequest::new("s", "print(open('b.txt').read(), end='')")
        })
        .await;
    assert_eq!(fresh.output, "bash-side\n", "{fresh:?}");
    assert_ne!(fresh.kernel.id, r.kernel.id, "a new Python kernel");
    let seen = run_bash(&case, "s", "cat kept.txt").await;
    assert_eq!(seen.output, "keptmore\n", "{seen:?}");
    case.finish().await;
}

#[tokio::test]
async fn the_shared_files_volume_is_removed_when_the_session_ends() {
    let case = Case::new("ctx-gone").await;
    case.run("s", "open('x', 'w').write('x')").await;
    run_bash(&case, "s", "cat x").await;
    case.run("keep", "1").await;
    // Three kernels, three volumes: the session's two contexts share one /work, and each has
    // its own kernelbox files.
    assert_eq!(case.volumes().await.len(), 3);
    assert_eq!(case.kb.clear_session(None, "s").await, 2);
    let left = case.volumes().await;
    assert_eq!(left.len(), 1, "only the other session's volume: {left:?}");
    // A session whose first kernel goes while another context lives keeps its files until the
    // last one goes.
    case.run("t", "open('y', 'w').write('y')").await;
    run_bash(&case, "t", "true").await;
    let r = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(1)),
            ..ExecuteRequest::new("t", "import time; time.sleep(30)")
        })
        .await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    let y = run_bash(&case, "t", "cat y").await;
    assert_eq!(y.output, "y", "{y:?}");
    assert_eq!(case.kb.clear_session(None, "t").await, 1);
    assert_eq!(case.volumes().await.len(), 1, "{:?}", case.volumes().await);
    case.finish().await;
}

/// A Bash cell owns its shell, and so can reach the loop that reports its status: shadow the
/// loop's `read` with a function that writes a status of its own, or keep a copy of the status
/// pipe (a DEBUG trap runs in the loop, where the pipe is open) and write on it mid-cell. Either
/// would end a cell early and hand its later output to the next cell; the runner checks each
/// status line against the running cell's nonce (`docs/contract.md`, "Languages").
#[tokio::test]
async fn a_bash_cell_cannot_put_its_results_out_of_step() {
    let case = Case::new("bash-step").await;
    // A function named like a builtin the loop uses is dropped before the loop uses it.
    let r = run_bash(&case, "s", "read() { builtin read \"$@\"; echo 0 >&63; }").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let r = run_bash(&case, "s", "sleep 1; echo a").await;
    assert_eq!(
        (r.status, r.output.as_str()),
        (CellStatus::Success, "a\n"),
        "{r:?}"
    );
    let r = run_bash(&case, "s", "echo b").await;
    assert_eq!(r.output, "b\n", "{r:?}");
    assert!(r.kernel.reused && r.kernel.state_lost.is_none(), "{r:?}");
    // A forged status on a saved copy of the pipe: the kernel is lost, never out of step.
    let r = run_bash(&case, "s", "trap 'exec 9>&63' DEBUG").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    let forged = run_bash(&case, "s", "echo 0 >&9; sleep 1; echo late").await;
    assert_ne!(forged.status, CellStatus::Success, "{forged:?}");
    let next = run_bash(&case, "s", "echo next").await;
    assert_eq!(next.output, "next\n", "{next:?}");
    assert!(next.kernel.state_lost.is_some(), "{next:?}");
    case.finish().await;
}

#[tokio::test]
async fn the_http_api_takes_a_language_and_lists_it() {
    let srv = http::TestServer::start(
        "lang-http",
        http::tenants(vec![http::tenant("t", "tok")]),
        |_| {},
    )
    .await;
    let r = srv
        .api
        .execute(
            "tok",
            "s",
            json!({"code": "cd /tmp && v=1", "language": "bash"}),
        )
        .await
        .json();
    assert_eq!(r["status"], "success", "{r}");
    let r = srv
        .api
        .execute(
            "tok",
            "s",
            json!({"code": "echo $v $PWD", "language": "bash"}),
        )
        .await
        .json();
    assert_eq!(r["output"], "1 /tmp\n", "{r}");
    let python = srv.api.run("tok", "s", "print('py')").await;
    assert_eq!(python["output"], "py\n", "{python}");
    let mut kernels: Vec<(String, String)> = srv
        .api
        .kernels("tok")
        .await
        .iter()
        .map(|k| {
            (
                k["language"].as_str().unwrap_or_default().to_string(),
                k["context"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    kernels.sort();
    assert_eq!(
        kernels,
        vec![
            ("bash".to_string(), "bash".to_string()),
            ("python".to_string(), "python".to_string())
        ]
    );
    // A named context is a kernel of its own beside the language's default one.
    let named = srv
        .api
        .execute(
            "tok",
            "s",
            json!({"code": "echo ${v:-unset}; v=2", "language": "bash", "context": "ctx-1"}),
        )
        .await
        .json();
    assert_eq!(named["output"], "unset\n", "{named}");
    let default = srv
        .api
        .execute("tok", "s", json!({"code": "echo $v", "language": "bash"}))
        .await
        .json();
    assert_eq!(default["output"], "1\n", "{default}");
    let contexts: Vec<String> = srv
        .api
        .kernels("tok")
        .await
        .iter()
        .filter_map(|k| k["context"].as_str().map(str::to_string))
        .collect();
    assert!(contexts.contains(&"ctx-1".to_string()), "{contexts:?}");
    let bad = srv
        .api
        .execute("tok", "s", json!({"code": "1", "context": "a/b"}))
        .await;
    assert_eq!(bad.error(hyper::StatusCode::BAD_REQUEST), "invalid_name");
    // JavaScript is served; a name that is no language at all is refused before any kernel
    // starts.
    let js = srv
        .api
        .execute(
            "tok",
            "s",
            json!({"code": "const v = [1, 2].map(x => x * 21); v[1]", "language": "javascript"}),
        )
        .await
        .json();
    assert_eq!(js["status"], "success", "{js}");
    assert_eq!(js["results"][0]["data"]["text/plain"], "42", "{js}");
    let refused = srv
        .api
        .execute("tok", "s", json!({"code": "1", "language": "cobol"}))
        .await;
    assert_eq!(
        refused.error(hyper::StatusCode::BAD_REQUEST),
        "invalid_json"
    );
    assert_eq!(srv.tenant_containers("t").await.len(), 4);
    srv.finish().await;
}

// ---- JavaScript and TypeScript (docs/contract.md, "JavaScript and TypeScript") ----------------

/// `code` as a cell of `session` in `language`.
fn cell_in(language: Language, session: &str, code: &str) -> ExecuteRequest {
    ExecuteRequest::new(Scope::session(session).language(language), code)
}

/// Runs `code` as a JavaScript cell of `session`.
async fn run_js(case: &Case, session: &str, code: &str) -> CellResult {
    case.exec(cell_in(Language::Javascript, session, code))
        .await
}

/// The text/plain of the cell's main result (the value of its last expression).
fn value(r: &CellResult) -> Option<String> {
    r.results
        .iter()
        .find(|d| d.is_main_result)
        .and_then(|d| d.text("text/plain"))
}

#[tokio::test]
async fn javascript_state_persists_across_cells_with_await_streams_and_values() {
    let case = Case::new("js-state").await;
    let py = case.run("s", "x = 41").await;
    let first = run_js(
        &case,
        "s",
        "const base = 40; let counter = 1; function add(a, b) { return a + b }\n\
         class Acc { constructor() { this.n = 0 } inc() { return ++this.n } }\n\
         var acc = new Acc()",
    )
    .await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert_ne!(first.kernel.id, py.kernel.id, "a kernel of its own");
    assert!(
        value(&first).is_none(),
        "a declaration has no value: {first:?}"
    );
    // const, let, function and class persist; the last expression is the result.
    let second = run_js(&case, "s", "counter += 1; acc.inc(); add(base, counter)").await;
    assert_eq!(second.status, CellStatus::Success, "{second:?}");
    assert_eq!(value(&second).as_deref(), Some("42"), "{second:?}");
    assert!(second.kernel.reused);
    // Top-level await, and declarations made after an await persist too.
    let awaited = run_js(
        &case,
        "s",
        "const later = await new Promise(r => setTimeout(() => r(base + 2), 20));\n\
         later",
    )
    .await;
    assert_eq!(awaited.status, CellStatus::Success, "{awaited:?}");
    assert_eq!(value(&awaited).as_deref(), Some("42"), "{awaited:?}");
    // console.log is stdout, console.error is stderr; objects are shown as util.inspect does.
    let streams = run_js(
        &case,
        "s",
        "console.log('out', later); console.error('err'); process.stdout.write('raw\\n');\n\
         ({ later, list: [1, 2] })",
    )
    .await;
    assert_eq!(streams.status, CellStatus::Success, "{streams:?}");
    assert_eq!(streams.stdout, "out 42\nraw\n", "{streams:?}");
    assert_eq!(streams.stderr, "err\n", "{streams:?}");
    assert_eq!(
        value(&streams).as_deref(),
        Some("{ later: 42, list: [ 1, 2 ] }")
    );
    // A value offering HTML (the documented convention) is a rich result.
    let rich = run_js(
        &case,
        "s",
        "({ [Symbol.for('kernelbox.mime')]() { return { 'text/html': '<b>hi</b>', \
         'image/png': Buffer.from([137, 80, 78, 71]) } } })",
    )
    .await;
    let main = rich
        .results
        .iter()
        .find(|d| d.is_main_result)
        .expect("a result");
    assert_eq!(
        main.text("text/html").as_deref(),
        Some("<b>hi</b>"),
        "{rich:?}"
    );
    assert_eq!(
        main.text("image/png").as_deref(),
        Some("iVBORw=="),
        "{rich:?}"
    );
    // The Python kernel kept its own state.
    let back = case.run("s", "print(x + 1)").await;
    assert_eq!(back.output, "42\n", "{back:?}");
    let mut listed: Vec<(Language, String)> = case
        .kb
        .list_kernels(None)
        .into_iter()
        .map(|k| (k.language, k.context))
        .collect();
    listed.sort();
    assert_eq!(
        listed,
        vec![
            (Language::Python, "python".into()),
            (Language::Javascript, "javascript".into())
        ]
    );
    case.finish().await;
}

#[tokio::test]
async fn a_javascript_exception_is_an_error_with_name_value_traceback_and_keeps_the_kernel() {
    let case = Case::new("js-error").await;
    run_js(&case, "s", "const kept = 7").await;
    let failed = run_js(
        &case,
        "s",
        "console.log('before'); function deep() { throw new RangeError('too far') } deep()",
    )
    .await;
    assert_eq!(failed.status, CellStatus::Error, "{failed:?}");
    assert_eq!(failed.exit_code, 1);
    let exception = failed.exception.as_ref().expect("typed exception");
    assert_eq!(exception.name, "RangeError");
    assert_eq!(exception.value, "too far");
    assert!(
        exception.traceback.contains("RangeError: too far")
            && exception.traceback.contains("at deep (cell-"),
        "{exception:?}"
    );
    assert!(
        !exception.traceback.contains("node_kernel"),
        "the driver's frames are cut: {exception:?}"
    );
    assert_eq!(failed.stdout, "before\n");
    // A rejection nobody handled during the cell is the cell's error too.
    let rejected = run_js(
        &case,
        "s",
        "Promise.reject(new TypeError('nobody caught me')); 1",
    )
    .await;
    assert_eq!(rejected.status, CellStatus::Error, "{rejected:?}");
    assert_eq!(
        rejected.exception.as_ref().map(|e| e.value.as_str()),
        Some("nobody caught me")
    );
    // A syntax error too; a redeclared const is one (as in Node's REPL).
    let syntax = run_js(&case, "s", "const kept = 8").await;
    assert_eq!(
        syntax.exception.as_ref().map(|e| e.name.as_str()),
        Some("SyntaxError"),
        "{syntax:?}"
    );
    let after = run_js(&case, "s", "kept").await;
    assert_eq!(value(&after).as_deref(), Some("7"), "{after:?}");
    assert!(after.kernel.reused);
    assert!(after.kernel.state_lost.is_none());
    case.finish().await;
}

#[tokio::test]
async fn javascript_requires_builtins_and_modules_under_work_and_runs_subprocesses() {
    let case = Case::new("js-require").await;
    let r = run_js(
        &case,
        "s",
        "const fs = require('fs');\n\
         fs.writeFileSync('/work/helper.js', 'module.exports = { twice: n => n * 2 }');\n\
         fs.writeFileSync('/work/esm.mjs', 'export const three = 3;');\n\
         const { twice } = require('./helper');\n\
         const { three } = await import('./esm.mjs');\n\
         require('child_process').execSync('echo from-child; echo child-err >&2', { stdio: 'inherit' });\n\
         twice(20) + three - 1",
    )
    .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(value(&r).as_deref(), Some("42"), "{r:?}");
    assert_eq!(r.stdout, "from-child\n", "{r:?}");
    assert_eq!(r.stderr, "child-err\n", "{r:?}");
    case.finish().await;
}

#[tokio::test]
async fn typescript_strips_annotations_and_type_errors_do_not_block() {
    let case = Case::new("ts-cells").await;
    let ts = |code: &str| cell_in(Language::Typescript, "s", code);
    let first = case
        .exec(ts("import type { Stats } from 'fs';\n\
             import * as path from 'path';\n\
             interface Point { x: number; y: number }\n\
             type Pair<T> = readonly [T, T];\n\
             enum Color { Red = 'red', Green = 'green' }\n\
             abstract class Shape<T extends Point = Point> {\n\
               constructor(protected readonly origin: T) {}\n\
               abstract area(): number;\n\
             }\n\
             class Square extends Shape { constructor(o: Point, private side: number) { super(o) } area(): number { return this.side ** 2 } }\n\
             function mid<T extends Point>([a, b]: Pair<T>): Point { return { x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 } }\n\
             const stat: Stats | undefined = undefined;\n\
             const wrong: number = 'not checked' as unknown as number;\n\
             let shapes: Array<Shape> = [new Square({ x: 0, y: 0 }, 6)];\n\
             `${path.basename('/a/b.ts')} ${Color.Green} ${shapes[0]!.area()} ${mid([{ x: 0, y: 0 }, { x: 2, y: 4 }]).y}`"))
        .await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    assert_eq!(
        value(&first).as_deref(),
        Some("'b.ts green 36 2'"),
        "{first:?}"
    );
    // State persists, with await; a type error does not block.
    let second = case
        .exec(ts(
            "const n: string = await Promise.resolve(42 as any); shapes.length + (n as any)",
        ))
        .await;
    assert_eq!(value(&second).as_deref(), Some("43"), "{second:?}");
    // A syntax error is the cell's SyntaxError; the kernel stays.
    let bad = case.exec(ts("let broken: = 1")).await;
    assert_eq!(bad.status, CellStatus::Error, "{bad:?}");
    assert_eq!(
        bad.exception.as_ref().map(|e| e.name.as_str()),
        Some("SyntaxError")
    );
    let after = case.exec(ts("Color.Red")).await;
    assert_eq!(value(&after).as_deref(), Some("'red'"), "{after:?}");
    assert_eq!(after.kernel.id, first.kernel.id);
    case.finish().await;
}

#[tokio::test]
async fn a_javascript_timeout_kills_only_its_kernel_and_is_reported() {
    let case = Case::new("js-timeout").await;
    let py = case.run("s", "x = 41").await;
    run_js(&case, "s", "const lost = 1").await;
    let slow = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(2)),
            ..cell_in(
                Language::Javascript,
                "s",
                "console.log('started'); while (true) {}",
            )
        })
        .await;
    assert_eq!(slow.status, CellStatus::Timeout, "{slow:?}");
    assert_eq!(slow.exit_code, -1);
    assert!(slow.output.contains("started"), "{slow:?}");
    assert_eq!(case.container_ids().await, vec![py.kernel.id.clone()]);
    let fresh = run_js(&case, "s", "typeof lost").await;
    assert_eq!(value(&fresh).as_deref(), Some("'undefined'"), "{fresh:?}");
    assert_eq!(
        fresh.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::Timeout)
    );
    let kept = case.run("s", "print(x + 1)").await;
    assert_eq!(kept.output, "42\n", "{kept:?}");
    case.finish().await;
}

#[tokio::test]
async fn javascript_process_exit_ends_the_kernel_like_sys_exit() {
    let case = Case::new("js-exit").await;
    let r = run_js(&case, "s", "console.log('bye'); process.exit(3)").await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert!(r.kernel.ended, "{r:?}");
    assert_eq!(r.output, "bye\n");
    assert!(case.containers().await.is_empty(), "the kernel is gone");
    let next = run_js(&case, "s", "1 + 1").await;
    assert_eq!(value(&next).as_deref(), Some("2"), "{next:?}");
    assert!(!next.kernel.reused);
    assert!(next.kernel.state_lost.is_none(), "asked for: {next:?}");
    case.finish().await;
}

#[tokio::test]
async fn a_javascript_interrupt_stops_busy_and_awaiting_cells_and_keeps_state() {
    let case = Case::with("js-interrupt", |c| {
        c.cells.interrupt_grace = Duration::from_secs(10)
    })
    .await;
    let first = run_js(&case, "s", "let kept = 41").await;
    for code in [
        "console.log('started'); while (true) {}",
        "console.log('started'); await new Promise(() => {})",
    ] {
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        let sink: kernelbox::OutputSink = std::sync::Arc::new(move |_s, _b: &[u8]| {
            let _ = tx.send(());
        });
        let kb = case.kb.clone();
        let cell = tokio::spawn(async move {
            kb.execute(ExecuteRequest {
                sink: Some(sink),
                ..cell_in(Language::Javascript, "s", code)
            })
            .await
        });
        rx.recv().await.expect("the cell started");
        assert_eq!(case.kb.interrupt(None, "s").await, 1);
        let r = cell.await.unwrap().expect("execute");
        assert_eq!(r.status, CellStatus::Interrupted, "{code}: {r:?}");
        let next = run_js(&case, "s", "kept + 1").await;
        assert_eq!(value(&next).as_deref(), Some("42"), "{code}: {next:?}");
        assert_eq!(next.kernel.id, first.kernel.id);
        assert!(next.kernel.state_lost.is_none(), "{next:?}");
    }
    case.finish().await;
}

/// Runs a hostile JavaScript cell while the session's Python kernel and a bystander session
/// hold state; both are untouched and the session's next JavaScript cell works.
async fn survive_js(case: &Case, code: &str, timeout: u64) -> CellResult {
    case.run("s", "kept = 'py'").await;
    case.run("other", "kept = 'safe'").await;
    // The JavaScript kernel is up before the hostile cell's timeout starts counting.
    run_js(case, "s", "1").await;
    let result = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(timeout)),
            ..cell_in(Language::Javascript, "s", code)
        })
        .await;
    let next = run_js(case, "s", "console.log('next call works')").await;
    assert_eq!(next.status, CellStatus::Success, "after {code:?}: {next:?}");
    assert_eq!(next.output, "next call works\n", "{next:?}");
    for (session, want) in [("s", "py"), ("other", "safe")] {
        let r = case.run(session, "print(kept)").await;
        assert!(
            r.output.contains(want) && r.kernel.reused,
            "{session}: {r:?}"
        );
    }
    result
}

#[tokio::test]
async fn hostile_javascript_cells_are_contained() {
    let case = Case::with("js-hostile", |c| c.spec.sandbox.pids_limit = 64).await;
    // Endless output: cut, and the timeout still kills.
    let r = survive_js(&case, "for (;;) console.log('xxxxxxxxxxxxxxxx')", 3).await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    assert_eq!(r.stdout_truncated, Some(true), "{r:?}");
    // A busy loop under a timeout.
    let r = survive_js(&case, "while (true) {}", 2).await;
    assert_eq!(r.status, CellStatus::Timeout, "{r:?}");
    // A memory bomb: the kernel's memory limit (or V8's heap limit), reported.
    let r = survive_js(
        &case,
        "const hog = []; for (;;) hog.push(Buffer.alloc(1 << 20, 1), new Array(1 << 16).fill({}))",
        60,
    )
    .await;
    assert_ne!(r.status, CellStatus::Success, "{r:?}");
    // A fork bomb meets the pids limit; the timeout ends it.
    let r = survive_js(
        &case,
        "const cp = require('child_process'); for (;;) { try { cp.spawn('sleep', ['30']) } catch (e) {} }",
        5,
    )
    .await;
    assert_ne!(r.status, CellStatus::Success, "{r:?}");
    // Closing every descriptor, the driver's included, wedges nothing.
    let r = survive_js(
        &case,
        "const fs = require('fs'); for (let fd = 0; fd < 64; fd++) { try { fs.closeSync(fd) } catch (e) {} } 'closed'",
        10,
    )
    .await;
    assert_ne!(r.status, CellStatus::Timeout, "{r:?}");
    // A forged end of cell on the driver's descriptors is ignored or ends the kernel.
    let r = survive_js(
        &case,
        "const fs = require('fs'); for (let fd = 3; fd < 32; fd++) { try { fs.writeSync(fd, '{\"op\":\"done\",\"status\":\"ok\"}\\n') } catch (e) {} } 'forged'",
        10,
    )
    .await;
    assert_ne!(r.status, CellStatus::Timeout, "{r:?}");
    // Killing Node, then the runner: the kernel is lost and the loss reported.
    for code in [
        "process.kill(process.pid, 'SIGKILL')",
        "process.kill(process.ppid, 'SIGKILL')",
    ] {
        let r = survive_js(&case, code, 10).await;
        assert_eq!(r.status, CellStatus::Error, "{code}: {r:?}");
        assert!(r.error.is_some(), "{r:?}");
    }
    case.finish().await;
}

#[tokio::test]
async fn a_session_lists_its_contexts_and_ends_one_over_http() {
    let srv = http::TestServer::start(
        "ctx-http",
        http::tenants(vec![http::tenant("t", "tok"), http::tenant("u", "utok")]),
        |_| {},
    )
    .await;
    srv.api.run("tok", "s", "x = 1").await;
    let bash = |context: &str| json!({"code": "echo hi > from-bash.txt", "language": "bash", "context": context});
    for context in ["bash", "b2"] {
        let r = srv.api.execute("tok", "s", bash(context)).await.json();
        assert_eq!(r["status"], "success", "{r}");
    }
    srv.api.run("tok", "other", "1").await;
    let listed = |reply: http::Reply| {
        let mut names: Vec<(String, String)> = reply.json()["contexts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| {
                (
                    k["context"].as_str().unwrap().to_string(),
                    k["language"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        names.sort();
        names
    };
    let path = "/v1/sessions/s/contexts";
    assert_eq!(
        listed(srv.api.get(path, Some("tok")).await),
        [("b2", "bash"), ("bash", "bash"), ("python", "python")]
            .map(|(a, b)| (a.to_string(), b.to_string()))
    );
    // Another tenant's session of the same name has none of them.
    assert!(listed(srv.api.get(path, Some("utok")).await).is_empty());
    // Ending one context leaves the others, their state and the shared /work.
    let ended = srv
        .api
        .delete("/v1/sessions/s/contexts/b2", "tok")
        .await
        .json();
    assert_eq!(ended["released"], 1, "{ended}");
    assert_eq!(
        listed(srv.api.get(path, Some("tok")).await),
        [("bash", "bash"), ("python", "python")].map(|(a, b)| (a.to_string(), b.to_string()))
    );
    let kept = srv
        .api
        .run("tok", "s", "print(x, open('from-bash.txt').read(), end='')")
        .await;
    assert_eq!(kept["output"], "1 hi\n", "{kept}");
    let again = srv.api.delete("/v1/sessions/s/contexts/b2", "tok").await;
    assert_eq!(again.error(hyper::StatusCode::NOT_FOUND), "not_found");
    let bad = srv
        .api
        .delete("/v1/sessions/s/contexts/bad%20name", "tok")
        .await;
    assert_eq!(bad.error(hyper::StatusCode::BAD_REQUEST), "invalid_name");
    let foreign = srv.api.delete("/v1/sessions/s/contexts/bash", "utok").await;
    assert_eq!(foreign.error(hyper::StatusCode::NOT_FOUND), "not_found");
    srv.finish().await;
}

/// A JavaScript cell that replaces built-ins the driver uses (`Object.prototype.toJSON`,
/// `setImmediate`, `Promise.race`) or throws a huge message still ends, with its result,
/// and the kernel is kept (docs/contract.md, "JavaScript and TypeScript").
#[tokio::test]
async fn a_javascript_cell_replacing_builtins_or_throwing_huge_still_ends() {
    let case = Case::new("js-builtins").await;
    let first = run_js(&case, "s", "1").await;
    for (code, want) in [
        (
            "Object.prototype.toJSON = function () { return undefined }; 'one'",
            "'one'",
        ),
        (
            "globalThis.setImmediate = () => {}; Promise.race = () => new Promise(() => {}); 'two'",
            "'two'",
        ),
        ("await Promise.resolve(3)", "3"),
        ("display(4); 'four'", "'four'"),
    ] {
        let r = case
            .exec(ExecuteRequest {
                timeout: Some(Duration::from_secs(60)),
                ..cell_in(Language::Javascript, "s", code)
            })
            .await;
        assert_eq!(r.status, CellStatus::Success, "{code}: {r:?}");
        assert_eq!(value(&r).as_deref(), Some(want), "{code}: {r:?}");
        assert_eq!(r.kernel.id, first.kernel.id, "{code}: {r:?}");
    }
    let r = case
        .exec(ExecuteRequest {
            timeout: Some(Duration::from_secs(60)),
            ..cell_in(
                Language::Javascript,
                "s",
                "throw new Error('x'.repeat(80 * 1024 * 1024))",
            )
        })
        .await;
    assert_eq!(r.status, CellStatus::Error, "{:.2000}", format!("{r:?}"));
    let exception = r.exception.as_ref().expect("an exception");
    assert_eq!(exception.name, "Error", "{exception:?}");
    assert_eq!(r.kernel.id, first.kernel.id, "the kernel is kept");
    case.finish().await;
}

/// A process a JavaScript cell starts holds none of the driver's descriptors (commands,
/// messages, acknowledgements): only its own stdio (docs/contract.md, "JavaScript and
/// TypeScript").
#[tokio::test]
async fn a_javascript_cells_subprocess_inherits_none_of_the_drivers_descriptors() {
    let case = Case::new("js-fds").await;
    let r = run_js(
        &case,
        "s",
        "require('child_process').execSync('ls /proc/self/fd').toString().split('\\n').filter(Boolean).map(Number).filter(fd => fd > 3).join(',')",
    )
    .await;
    assert_eq!(r.status, CellStatus::Success, "{r:?}");
    assert_eq!(value(&r).as_deref(), Some("''"), "{r:?}");
    case.finish().await;
}
