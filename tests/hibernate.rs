//! Hibernation (docs/runtimes.md, "Hibernation") against the real engine with gVisor's runsc
//! registered and the engine in experimental mode (`.ci/runsc`): an idle kernel is
//! checkpointed and stopped by the reaper instead of removed, and its owner's next call
//! restores it with its memory, its variables and its files; a kernel that cannot hibernate
//! is reported lost as before; two racing calls restore once; another tenant never gets it;
//! the bounds on kept checkpoints hold; a runc server refuses hibernation at start; and
//! `kernelbox serve --hibernate` does it over real HTTP, its reaper on its own schedule, its
//! hibernated kernels outliving a `kill -9` (the watchdog spares them) and a clean stop (which
//! hibernates its idle kernels), restored by the restarted server.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/http.rs"]
mod http;

use std::time::Duration;

use common::Case;
use kernelbox::config::HibernateConfig;
use kernelbox::{CellStatus, ExecuteRequest, KernelRuntime, LossReason, Orchestrator, Scope};

const IDLE: Duration = Duration::from_millis(1500);

/// Hibernation into `dir`, its checkpoints discarded at stop (a restart is the serve test's).
fn discarded_at_stop(dir: &std::path::Path) -> HibernateConfig {
    HibernateConfig {
        dir: Some(dir.to_path_buf()),
        across_restarts: false,
        ..HibernateConfig::default()
    }
}

/// A runsc case whose idle kernels hibernate into `dir` after [`IDLE`].
async fn case(name: &str, dir: &std::path::Path, tweak: impl FnOnce(&mut HibernateConfig)) -> Case {
    let mut hibernate = discarded_at_stop(dir);
    tweak(&mut hibernate);
    logs();
    Case::with(name, |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runsc;
        c.kernels.idle_timeout = IDLE;
        c.pool.size = 0;
        c.hibernate = Some(hibernate);
    })
    .await
}

/// kernelbox's log in the test's output, at `RUST_LOG`'s level.
fn logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Waits past the idle timeout and runs the reaper once.
async fn idle_and_reap(case: &Case) {
    tokio::time::sleep(IDLE + Duration::from_millis(300)).await;
    case.kb.reap_once().await;
}

/// The state Docker gives the container whose id starts with `short`.
async fn state_of(case: &Case, short: &str) -> Option<String> {
    case.containers()
        .await
        .into_iter()
        .find(|c| c.id.starts_with(short))
        .map(|c| c.state)
}

/// Bytes of the checkpoints under `dir`.
fn bytes_under(dir: &std::path::Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok())
        .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum()
}

/// Runs `print('x' in dir())` for `session`, whose kernel was lost (`idle_reaped`): a new one
/// answers `False` and tells the loss.
async fn lost(case: &Case, session: &str) -> kernelbox::CellResult {
    let r = case.run(session, "print('x' in dir())").await;
    assert_eq!(r.output, "False\n", "{r:?}");
    assert_eq!(
        r.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::IdleReaped),
        "{r:?}"
    );
    r
}

const FILL: &str = "import hashlib, os\nx = 41\nbig = bytearray(os.urandom(50 << 20))\nopen('note.txt', 'w').write('kept')\nprint(hashlib.sha256(big).hexdigest())";
const CHECK: &str = "print(x, hashlib.sha256(big).hexdigest(), open('note.txt').read())";

#[tokio::test]
async fn an_idle_kernel_hibernates_and_its_next_call_finds_its_memory_and_files() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-back", dir.path(), |_| {}).await;
    let first = case.run("s", FILL).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    let hash = first.output.trim().to_string();

    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    assert!(
        case.kb.list_kernels(None).is_empty(),
        "a hibernated kernel is not live"
    );
    assert_eq!(
        state_of(&case, &first.kernel.id).await.as_deref(),
        Some("exited"),
        "the container is kept, stopped"
    );
    let on_disk = bytes_under(dir.path());
    assert!(
        on_disk > 40 << 20,
        "the checkpoint holds the 50 MB: {on_disk} bytes"
    );
    // Reading a hibernated session's file is served by its kernel, restored for it.
    let path = kernelbox::FilePath::parse("note.txt").unwrap();
    let read = case
        .kb
        .read_file(
            &kernelbox::orchestrator::FileRequest::session("s"),
            &path,
            false,
        )
        .await
        .expect("the file of a hibernated kernel is read");
    assert!(matches!(read, kernelbox::Download::File { size: 4, .. }));
    drop(read);

    let back = case.run("s", CHECK).await;
    assert_eq!(back.status, CellStatus::Success, "{back:?}");
    assert_eq!(back.output, format!("41 {hash} kept\n"), "{back:?}");
    let restored = back
        .kernel
        .restored
        .clone()
        .expect("the result says it was restored");
    assert_eq!(restored.from, "idle");
    assert!(restored.checkpoint_seconds > 0.0 && restored.restore_seconds > 0.0);
    assert_eq!(back.kernel.id, first.kernel.id, "the same container");
    assert_eq!(back.kernel.generation, first.kernel.generation);
    assert_eq!(back.kernel.execution_count, 2, "{back:?}");
    assert!(
        back.kernel.reused && back.kernel.state_lost.is_none(),
        "{back:?}"
    );
    assert_eq!(case.kb.hibernated(), 0);
    assert_eq!(
        bytes_under(dir.path()),
        0,
        "the server's copy is gone once restored"
    );

    let again = case.run("s", "print(x + 1)").await;
    assert_eq!(again.output, "42\n");
    assert!(again.kernel.restored.is_none(), "told once");
    case.finish().await;
}

#[tokio::test]
async fn a_checkpoint_the_runtime_refuses_is_reported_lost_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-engine-refused", dir.path(), |_| {}).await;
    // Another process of the kernel holds a file of the staging volume open: the runner cannot
    // see it, the files move, and the runtime refuses to checkpoint an open file gone from
    // its mount.
    let held = "import subprocess, time, os\nx = 1\np = subprocess.Popen(['python3', '-c', \"f = open('held.txt', 'w'); f.write('x'); f.flush(); import time; time.sleep(600)\"])\nwhile not os.path.exists('held.txt'): time.sleep(0.05)";
    let first = case.run("held", held).await;
    assert_eq!(first.status, CellStatus::Success, "{first:?}");
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 0, "the checkpoint failed");
    assert!(case.containers().await.is_empty(), "its container went");
    assert_eq!(bytes_under(dir.path()), 0, "no checkpoint files left");
    lost(&case, "held").await;
    case.finish().await;
}

#[tokio::test]
async fn a_restore_that_fails_is_reported_lost_and_the_next_kernel_is_a_new_generation() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-restore-fails", dir.path(), |_| {}).await;
    let first = case.run("s", "x = 1").await;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    // Its container removed behind kernelbox's back: the restore cannot start it.
    for c in case.containers().await {
        case.engine.remove_container(&c.id).await.unwrap();
    }
    let next = case.run("s", "print('x' in dir())").await;
    assert_eq!(next.output, "False\n", "{next:?}");
    assert!(next.kernel.restored.is_none());
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::IdleReaped),
        "{next:?}"
    );
    assert_eq!(next.kernel.generation, first.kernel.generation + 1);
    assert_eq!(case.kb.hibernated(), 0);
    assert_eq!(bytes_under(dir.path()), 0, "its checkpoint went");
    case.finish().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stop_while_the_reaper_checkpoints_keeps_that_checkpoint_for_the_next_start() {
    let dir = tempfile::tempdir().unwrap();
    let lasting = |h: &mut HibernateConfig| h.across_restarts = true;
    let first = case("hibernate-stop-race", dir.path(), lasting).await;
    let filled = first
        .run(
            "s",
            "import os\nx = 7\nbig = bytearray(os.urandom(200 << 20))",
        )
        .await;
    assert_eq!(filled.status, CellStatus::Success, "{filled:?}");
    tokio::time::sleep(IDLE + Duration::from_millis(300)).await;
    let kb = first.kb.clone();
    let reaping = tokio::spawn(async move { kb.reap_once().await });
    // The engine's checkpoint is under way once its directory appears (it takes seconds).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .any(|e| e.path().is_dir())
    {
        assert!(std::time::Instant::now() < deadline, "no checkpoint began");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.kb.shutdown().await;
    let _ = reaping.await;
    let cs = first.containers().await;
    assert_eq!(cs.len(), 1, "{cs:?}");
    assert_eq!(cs[0].state, "exited");
    assert!(
        cs[0].name.trim_start_matches('/').starts_with("kbh."),
        "named hibernated: {cs:?}"
    );
    // The next start on the same directory takes it over.
    let second = case("hibernate-stop-race-next", dir.path(), lasting).await;
    let back = second.run("s", "print(x, len(big))").await;
    assert_eq!(back.output, format!("7 {}\n", 200 << 20), "{back:?}");
    assert_eq!(
        back.kernel.restored.as_ref().map(|r| r.from.as_str()),
        Some("idle")
    );
    assert_eq!(second.kb.clear_session(None, "s").await, 1);
    second.finish().await;
    common::assert_clean(&first.engine, &first.label).await;
}

#[tokio::test]
async fn two_racing_calls_restore_a_hibernated_kernel_once() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-race", dir.path(), |_| {}).await;
    case.run("s", "x = 41").await;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    let (a, b) = tokio::join!(case.run("s", "print(x)"), case.run("s", "print(x)"));
    assert_eq!(
        (a.output.as_str(), b.output.as_str()),
        ("41\n", "41\n"),
        "{a:?} {b:?}"
    );
    assert_eq!(
        [&a, &b]
            .iter()
            .filter(|r| r.kernel.restored.is_some())
            .count(),
        1,
        "restored once: {a:?} {b:?}"
    );
    assert_eq!(a.kernel.id, b.kernel.id);
    assert_eq!(case.containers().await.len(), 1);
    case.finish().await;
}

#[tokio::test]
async fn another_tenant_never_gets_a_hibernated_kernel() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-tenants", dir.path(), |_| {}).await;
    let of = |tenant: &str, code: &str| ExecuteRequest {
        scope: Scope::session("s").tenant(tenant),
        ..ExecuteRequest::new("s", code)
    };
    case.exec(of("a", "secret = 'a-only'")).await;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    let other = case.exec(of("b", "print('secret' in dir())")).await;
    assert_eq!(other.output, "False\n", "{other:?}");
    assert!(other.kernel.restored.is_none());
    let owner = case.exec(of("a", "print(secret)")).await;
    assert_eq!(owner.output, "a-only\n", "{owner:?}");
    assert!(owner.kernel.restored.is_some());
    case.finish().await;
}

#[tokio::test]
async fn a_kernel_that_cannot_hibernate_is_reported_lost_and_a_cleared_one_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-refused", dir.path(), |_| {}).await;
    // A file held open in the staging volume could not be there at restore: no hibernation.
    case.run("held", "f = open('held.txt', 'w')\nx = 1").await;
    case.run("cleared", "x = 1").await;
    idle_and_reap(&case).await;
    assert_eq!(
        case.kb.hibernated(),
        1,
        "only the kernel holding no file hibernated"
    );
    let next = case.run("held", "print('x' in dir())").await;
    assert_eq!(next.output, "False\n", "{next:?}");
    assert!(next.kernel.restored.is_none());
    assert_eq!(
        next.kernel.state_lost.as_ref().map(|l| l.reason),
        Some(LossReason::IdleReaped),
        "{next:?}"
    );
    // Clearing a hibernated session removes its container and checkpoint.
    assert_eq!(case.kb.clear_session(None, "cleared").await, 1);
    assert_eq!(case.kb.hibernated(), 0);
    assert_eq!(bytes_under(dir.path()), 0);
    assert_eq!(
        case.containers().await.len(),
        1,
        "only the live kernel is left"
    );
    case.finish().await;
}

#[tokio::test]
async fn past_a_tenants_most_the_oldest_checkpoint_goes_and_its_loss_is_told() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-bound", dir.path(), |h| h.max_per_tenant = 1).await;
    case.run("old", "x = 1").await;
    idle_and_reap(&case).await;
    case.run("new", "x = 2").await;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    assert_eq!(
        case.containers().await.len(),
        1,
        "the oldest container went"
    );
    let new = case.run("new", "print(x)").await;
    assert_eq!(new.output, "2\n");
    assert!(new.kernel.restored.is_some());
    lost(&case, "old").await;
    case.finish().await;
}

#[tokio::test]
async fn past_a_tenants_bytes_a_checkpoint_alone_too_large_is_not_kept_and_the_oldest_goes() {
    let dir = tempfile::tempdir().unwrap();
    let case = case("hibernate-bytes", dir.path(), |h| {
        h.max_tenant_bytes = 36 << 20;
    })
    .await;
    let fill = |mib: u32| format!("import os\nx = bytearray(os.urandom({mib} << 20))");
    // Checkpoints are the bytes held plus about 2 MiB of the idle runner's.
    case.run("small", &fill(10)).await;
    case.run("huge", &fill(60)).await;
    idle_and_reap(&case).await;
    // The huge one alone is past the tenant's bytes: not kept, and it pushed out nothing.
    assert_eq!(case.kb.hibernated(), 1);
    assert_eq!(
        case.containers().await.len(),
        1,
        "the huge one's container went"
    );
    lost(&case, "huge").await;
    assert_eq!(case.kb.clear_session(None, "huge").await, 1);
    // Another that fits alone, but not beside the small one: the small one goes, told.
    case.run("big", &fill(30)).await;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    assert!(bytes_under(dir.path()) > 30 << 20, "the big one is kept");
    lost(&case, "small").await;
    let big = case.run("big", "print(len(x))").await;
    assert_eq!(big.output, format!("{}\n", 30 << 20));
    assert!(big.kernel.restored.is_some());
    case.finish().await;
}

#[tokio::test]
async fn hibernation_with_kernels_under_runc_is_refused_at_start() {
    let mut config = common::config(&common::unique("hibernate-runc"));
    config.spec.sandbox.runtime = KernelRuntime::Runc;
    config.hibernate = Some(HibernateConfig::default());
    let err = Orchestrator::start(config, common::engine().await)
        .await
        .expect_err("refused");
    assert!(err.to_string().contains("runsc"), "{err}");
}

/// `kernelbox serve --runtime runsc --idle-timeout 1s --pool 0` on `state`, hibernating
/// when asked.
async fn serve(
    label: &str,
    state: &std::path::Path,
    hibernate: bool,
) -> (tokio::process::Child, std::net::SocketAddr) {
    let mut cmd = common::serve_command(label, "tok");
    cmd.args(["--runtime", "runsc", "--idle-timeout", "1s", "--pool", "0"])
        .arg("--state-dir")
        .arg(state)
        .env_remove("KERNELBOX_STATE_DIR")
        .env_remove("KERNELBOX_RUNTIME");
    if hibernate {
        cmd.arg("--hibernate");
    }
    common::spawn_serving(cmd).await
}

async fn run(addr: std::net::SocketAddr, session: &str, code: &str) -> serde_json::Value {
    let body = serde_json::json!({"code": code, "timeout": 300});
    http::Api::new(addr)
        .post(
            &format!("/v1/sessions/{session}/execute"),
            Some("tok"),
            body,
        )
        .await
        .json()
}

/// Polls Docker (bounded) until `done` holds of the case's containers and volumes.
async fn wait_for(
    engine: &std::sync::Arc<dyn kernelbox::Engine>,
    label: &str,
    what: &str,
    done: impl Fn(&[kernelbox::docker::ContainerInfo], &[kernelbox::docker::VolumeInfo]) -> bool,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let (cs, vs) = (
            common::containers(engine, label).await,
            common::volumes(engine, label).await,
        );
        if done(&cs, &vs) {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "{what}: {cs:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn state_in(cs: &[kernelbox::docker::ContainerInfo], id: &str) -> Option<String> {
    cs.iter()
        .find(|c| c.id.starts_with(id))
        .map(|c| c.state.clone())
}

/// The checkpoints' directory's `kb-*` entries, sorted.
fn kept(state: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("checkpoints"))
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("kb-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hibernated_kernel_outlives_kill_9_and_a_stop_and_the_restarted_server_restores_it() {
    use std::os::unix::fs::PermissionsExt;
    let label = common::unique("hibernate-restart");
    let engine = common::engine().await;
    let state = tempfile::tempdir().unwrap();
    let (mut first, addr) = serve(&label, state.path(), true).await;
    let filled = run(addr, "s", FILL).await;
    assert_eq!(filled["status"], "success", "{filled}");
    let id = filled["kernel"]["id"].as_str().unwrap().to_string();
    // A kernel busy when the server dies is not idle: it is lost, as without hibernation.
    let busy = tokio::spawn(async move { run(addr, "busy", "import time; time.sleep(600)").await });
    // The server's reaper runs every 30 s at the shortest (`Config::reap_interval`): wait for
    // the container to be kept, stopped, and its record written.
    wait_for(&engine, &label, "hibernated", |cs, _| {
        state_in(cs, &id).as_deref() == Some("exited")
            && cs.iter().any(|c| c.state == "running")
            && kept(state.path()).len() == 2
    })
    .await;
    let files = kept(state.path());
    assert!(
        files[1].ends_with(".json"),
        "a checkpoint and its record: {files:?}"
    );
    let record = state.path().join("checkpoints").join(&files[1]);
    assert_eq!(
        std::fs::metadata(&record).unwrap().permissions().mode() & 0o777,
        0o600,
        "only kernelbox reads the record"
    );
    let busy_volume = common::containers(&engine, &label)
        .await
        .into_iter()
        .find(|c| !c.id.starts_with(&id))
        .and_then(|c| c.labels.get(kernelbox::labels::VOLUME).cloned())
        .expect("the busy kernel's volume");

    // kill -9: the watchdog removes the busy kernel (its volume last) and spares the
    // hibernated one.
    first.kill().await.unwrap();
    busy.abort();
    wait_for(&engine, &label, "the watchdog's sweep", |_, vs| {
        !vs.iter().any(|v| v.name == busy_volume)
    })
    .await;
    let cs = common::containers(&engine, &label).await;
    assert_eq!(cs.len(), 1, "{cs:?}");
    assert_eq!(state_in(&cs, &id).as_deref(), Some("exited"));

    // The restarted server restores it on its owner's next call: memory, files, generation
    // (the state directory reached by another path is the same).
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("state");
    std::os::unix::fs::symlink(state.path(), &link).unwrap();
    let (mut second, addr) = serve(&label, &link, true).await;
    let back = run(addr, "s", CHECK).await;
    let hash = filled["output"].as_str().unwrap().trim();
    assert_eq!(back["output"], format!("41 {hash} kept\n"), "{back}");
    assert_eq!(back["kernel"]["restored"]["from"], "idle", "{back}");
    assert!(back["kernel"].get("state_lost").is_none(), "{back}");
    assert_eq!(back["kernel"]["id"], filled["kernel"]["id"]);
    assert_eq!(back["kernel"]["generation"], filled["kernel"]["generation"]);
    assert_eq!(back["kernel"]["execution_count"], 2, "{back}");
    let lost = run(addr, "busy", "print(1)").await;
    assert_eq!(
        lost["kernel"]["state_lost"]["reason"], "server_restarted",
        "{lost}"
    );

    // A clean stop hibernates the idle kernels; the next server restores them (`restart`).
    common::terminate(&mut second, Duration::from_secs(120)).await;
    let cs = common::containers(&engine, &label).await;
    assert_eq!(cs.len(), 2, "both hibernated at the stop: {cs:?}");
    assert!(cs.iter().all(|c| c.state == "exited"), "{cs:?}");
    // A record damaged: its kernel is discarded at the start (not left behind), the other
    // restored.
    for name in kept(state.path()) {
        let path = state.path().join("checkpoints").join(name);
        if std::fs::read_to_string(&path).is_ok_and(|r| r.contains("\"busy\"")) {
            std::fs::write(&path, "{").unwrap();
        }
    }
    let (mut third, addr) = serve(&label, state.path(), true).await;
    let cs = common::containers(&engine, &label).await;
    assert_eq!(cs.len(), 1, "the unclaimed one went: {cs:?}");
    assert_eq!(state_in(&cs, &id).as_deref(), Some("exited"));
    let again = run(addr, "s", "print(x + 1, len(big))").await;
    assert_eq!(again["output"], "42 52428800\n", "{again}");
    assert_eq!(again["kernel"]["restored"]["from"], "restart", "{again}");
    assert_eq!(
        again["kernel"]["generation"],
        filled["kernel"]["generation"]
    );
    common::terminate(&mut third, Duration::from_secs(120)).await;

    // A server without hibernation drops what was kept, and the owner is told.
    let (mut fourth, addr) = serve(&label, state.path(), false).await;
    assert!(kept(state.path()).is_empty(), "{:?}", kept(state.path()));
    let gone = run(addr, "s", "print('x' in globals())").await;
    assert_eq!(gone["output"], "False\n", "{gone}");
    assert_eq!(
        gone["kernel"]["state_lost"]["reason"], "server_restarted",
        "{gone}"
    );
    common::terminate(&mut fourth, Duration::from_secs(60)).await;
    common::assert_clean(&engine, &label).await;
}

#[tokio::test]
async fn a_kernel_evicted_to_make_room_hibernates_and_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let case = Case::with("hibernate-evict", |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runsc;
        c.kernels.max_session_kernels = 1;
        c.pool.size = 0;
        c.hibernate = Some(discarded_at_stop(dir.path()));
    })
    .await;
    case.run("a", "x = 'a'").await;
    // Room for b's kernel: a's is evicted, and hibernates instead of being lost.
    let b = case.run("b", "x = 'b'").await;
    assert_eq!(b.status, CellStatus::Success, "{b:?}");
    // a's call waits for its hibernation under way, then restores it (evicting b's in turn).
    let a = case.run("a", "print(x)").await;
    assert_eq!(a.output, "a\n", "{a:?}");
    let restored = a.kernel.restored.clone().expect("restored");
    assert_eq!(restored.from, "evicted");
    assert!(a.kernel.state_lost.is_none(), "{a:?}");
    let b = case.run("b", "print(x)").await;
    assert_eq!(b.output, "b\n", "{b:?}");
    assert_eq!(
        b.kernel.restored.map(|r| r.from).as_deref(),
        Some("evicted")
    );
    case.finish().await;
}

#[tokio::test]
async fn a_restored_kernel_hibernates_again_and_neither_the_pool_nor_a_reset_brings_back_another() {
    logs();
    let dir = tempfile::tempdir().unwrap();
    let case = Case::with("hibernate-cycles", |c| {
        c.spec.sandbox.runtime = KernelRuntime::Runsc;
        c.kernels.idle_timeout = IDLE;
        c.pool.size = 1;
        c.hibernate = Some(discarded_at_stop(dir.path()));
    })
    .await;
    case.run("s", "x = 1").await;
    for round in 2..=3 {
        idle_and_reap(&case).await;
        assert_eq!(case.kb.hibernated(), 1, "round {round}");
        // A ready pooled kernel is there: the session still gets its own back.
        assert!(case.kb.wait_pool_ready(1, Duration::from_secs(60)).await);
        let r = case.run("s", "x += 1\nprint(x)").await;
        assert_eq!(r.output, format!("{round}\n"), "round {round}: {r:?}");
        assert!(r.kernel.restored.is_some(), "round {round}: {r:?}");
    }
    let generation = case.run("s", "pass").await.kernel.generation;
    idle_and_reap(&case).await;
    assert_eq!(case.kb.hibernated(), 1);
    let reset = case
        .exec(ExecuteRequest {
            reset: true,
            ..ExecuteRequest::new("s", "print('x' in dir())")
        })
        .await;
    assert_eq!(reset.output, "False\n", "{reset:?}");
    assert!(reset.kernel.restored.is_none());
    assert!(reset.kernel.generation > generation, "{reset:?}");
    assert_eq!(case.kb.hibernated(), 0);
    case.finish().await;
}
