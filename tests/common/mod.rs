//! Shared helpers for the integration tests: every test labels what it creates with a unique
//! case label, asserts through the Docker API, and removes whatever is left by that label.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kernelbox::docker::{ContainerInfo, Engine, VolumeInfo};
use kernelbox::{BollardEngine, CellResult, Config, ExecuteRequest, Orchestrator};

/// The exact error of an interrupted cell that stopped on its KeyboardInterrupt
/// (docs/contract.md "Exact messages").
pub const INTERRUPTED: &str =
    "Interrupted (KeyboardInterrupt); the session kernel and its state were kept.";
/// The exact error of an interrupted cell that had not stopped after a grace of 2 s.
pub const INTERRUPT_KILLED_2S: &str = "Interrupted, but the cell did not stop within 2s of its \
     KeyboardInterrupt; the session kernel was killed and its state was lost.";
/// The exact message of a cell interrupted while it waited behind an earlier cell.
pub const INTERRUPTED_QUEUED: &str =
    "Interrupted before it ran: the cell was waiting for an earlier cell of this session and never executed.";

/// The label key tests put on everything they create.
pub const CASE: &str = "io.kernelbox-test.case";

/// One test's world: a unique label, a real engine, an orchestrator.
pub struct Case {
    pub label: String,
    pub engine: Arc<dyn Engine>,
    pub kb: Orchestrator,
}

/// A unique case label value.
pub fn unique(name: &str) -> String {
    format!("{name}-{}", &uuid::Uuid::new_v4().simple().to_string()[..8])
}

/// Connects to the real engine; a missing engine fails the test (never skips).
pub async fn engine() -> Arc<dyn Engine> {
    let engine = BollardEngine::connect()
        .await
        .expect("the Docker engine must be running for integration tests");
    engine.ping().await.expect("the Docker engine must answer");
    Arc::new(engine)
}

/// The variable naming the runtime the tests' kernels run under (`runc` when unset): `.ci/run`
/// runs the contract and hostile tests again with `runsc` (docs/runtimes.md).
pub const RUNTIME_ENV: &str = "KERNELBOX_TEST_RUNTIME";

/// The runtime the tests' kernels run under ([`RUNTIME_ENV`]); a bad value fails the test.
pub fn runtime() -> kernelbox::KernelRuntime {
    match std::env::var(RUNTIME_ENV) {
        Ok(name) => kernelbox::KernelRuntime::parse(&name).expect(RUNTIME_ENV),
        Err(_) => kernelbox::KernelRuntime::Runc,
    }
}

/// The config tests start from: labelled, with the watchdog, a short default timeout, the
/// runtime [`RUNTIME_ENV`] names.
pub fn config(label: &str) -> Config {
    let mut config = Config::default();
    config.spec.sandbox.runtime = runtime();
    config.housekeeping.extra_labels = BTreeMap::from([(CASE.to_string(), label.to_string())]);
    config.housekeeping.watchdog = Some(env!("CARGO_BIN_EXE_kernelbox").into());
    config.cells.timeout = Duration::from_secs(60);
    config
}

impl Case {
    /// A case with the default test config.
    pub async fn new(name: &str) -> Case {
        Case::with(name, |_| {}).await
    }

    /// A case with a tweaked config.
    pub async fn with(name: &str, tweak: impl FnOnce(&mut Config)) -> Case {
        let label = unique(name);
        let engine = engine().await;
        let mut config = config(&label);
        tweak(&mut config);
        let kb = Orchestrator::start(config, engine.clone())
            .await
            .expect("orchestrator starts");
        Case { label, engine, kb }
    }

    /// Runs `code` for `session`.
    pub async fn run(&self, session: &str, code: &str) -> CellResult {
        self.kb
            .execute(ExecuteRequest::new(session, code))
            .await
            .expect("execute")
    }

    /// Runs a request.
    pub async fn exec(&self, request: ExecuteRequest) -> CellResult {
        self.kb.execute(request).await.expect("execute")
    }

    /// This case's containers, as Docker sees them.
    pub async fn containers(&self) -> Vec<ContainerInfo> {
        containers(&self.engine, &self.label).await
    }

    /// This case's volumes, as Docker sees them.
    pub async fn volumes(&self) -> Vec<VolumeInfo> {
        volumes(&self.engine, &self.label).await
    }

    /// Short ids of this case's containers.
    pub async fn container_ids(&self) -> Vec<String> {
        self.containers()
            .await
            .into_iter()
            .map(|c| c.id[..12].to_string())
            .collect()
    }

    /// Shuts the orchestrator down and asserts nothing of this case is left in Docker.
    pub async fn finish(self) {
        self.kb.shutdown().await;
        assert_clean(&self.engine, &self.label).await;
    }
}

pub async fn containers(engine: &Arc<dyn Engine>, label: &str) -> Vec<ContainerInfo> {
    engine
        .list_containers(&[format!("{CASE}={label}")])
        .await
        .expect("list containers")
}

pub async fn volumes(engine: &Arc<dyn Engine>, label: &str) -> Vec<VolumeInfo> {
    engine
        .list_volumes(&[format!("{CASE}={label}")], false)
        .await
        .expect("list volumes")
}

/// Runs `code` for `session` in the background and returns once the cell has written its
/// first output, so the caller knows it is in flight.
pub async fn start_cell(
    kb: &Orchestrator,
    session: &str,
    code: &str,
) -> tokio::task::JoinHandle<Result<CellResult, kernelbox::ExecuteError>> {
    let (started_tx, mut started_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let sink: kernelbox::OutputSink = Arc::new(move |_, _b: &[u8]| {
        let _ = started_tx.send(());
    });
    let request = ExecuteRequest {
        sink: Some(sink),
        ..ExecuteRequest::new(session, code)
    };
    let kb = kb.clone();
    let handle = tokio::spawn(async move { kb.execute(request).await });
    started_rx.recv().await.expect("the cell started writing");
    handle
}

/// Asserts no container or volume with the case label exists, removing any that do so that
/// a failure does not leak into other runs.
pub async fn assert_clean(engine: &Arc<dyn Engine>, label: &str) {
    let cs = containers(engine, label).await;
    let vs = volumes(engine, label).await;
    for c in &cs {
        let _ = engine.remove_container(&c.id).await;
    }
    for v in &vs {
        let _ = kernelbox::docker::remove_volume_when_free(engine.as_ref(), &v.name).await;
    }
    assert!(cs.is_empty(), "containers left behind: {cs:?}");
    assert!(vs.is_empty(), "volumes left behind: {vs:?}");
}

/// Waits (bounded) until Docker holds no container with the case label; returns how long.
pub async fn wait_gone(engine: &Arc<dyn Engine>, label: &str, limit: Duration) -> Option<Duration> {
    use futures::StreamExt;
    let start = std::time::Instant::now();
    let mut events = engine.events(&[format!("{CASE}={label}")], None);
    loop {
        if containers(engine, label).await.is_empty() {
            return Some(start.elapsed());
        }
        // Wake on the next event for this label (destroy), or re-check at the deadline.
        let remaining = limit.checked_sub(start.elapsed())?;
        let _ =
            tokio::time::timeout(remaining.min(Duration::from_millis(500)), events.next()).await;
        if start.elapsed() > limit {
            return if containers(engine, label).await.is_empty() {
                Some(start.elapsed())
            } else {
                None
            };
        }
    }
}

/// Sends SIGTERM to a `kernelbox serve` process (asserting the signal went).
pub async fn sigterm(child: &tokio::process::Child) {
    let pid = child.id().expect("the process is running").to_string();
    let kill = tokio::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .await
        .expect("kill");
    assert!(kill.success(), "kill -TERM {pid}");
}

/// Sends SIGTERM to a `kernelbox serve` process and waits, at most `limit`, for it to exit;
/// returns its status.
pub async fn terminate(
    child: &mut tokio::process::Child,
    limit: Duration,
) -> std::process::ExitStatus {
    sigterm(child).await;
    tokio::time::timeout(limit, child.wait())
        .await
        .expect("the server exits after SIGTERM")
        .expect("wait")
}

/// Reads a `kernelbox serve` process's stderr until its "serving ... on http://ADDR" line
/// (at most 60 s) and returns the address; the lines after it are left to the caller.
pub async fn serving_addr(
    lines: &mut tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStderr>>,
) -> std::net::SocketAddr {
    tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            let line = lines
                .next_line()
                .await
                .expect("stderr")
                .expect("the server exited before serving");
            if let Some(rest) = line.split("on http://").nth(1) {
                let addr = rest.split_whitespace().next().expect("address");
                return addr.parse().expect("socket address");
            }
        }
    })
    .await
    .expect("the server serves within 60 s")
}

/// Spawns a `kernelbox serve` command (from [`serve_command`], with the caller's flags) with
/// stdin and stdout closed, waits for its address ([`serving_addr`]) and drains the rest of
/// its stderr in the background.
pub async fn spawn_serving(
    mut cmd: tokio::process::Command,
) -> (tokio::process::Child, std::net::SocketAddr) {
    use tokio::io::AsyncBufReadExt;
    let mut child = cmd
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn kernelbox serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = tokio::io::BufReader::new(stderr).lines();
    let addr = serving_addr(&mut lines).await;
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, addr)
}

/// Bytes in a MiB, for printing memory figures.
pub const MIB: f64 = 1024.0 * 1024.0;

/// Resident and peak resident memory of a process, in bytes (`VmRSS` and `VmHWM` of
/// `/proc/PID/status`).
pub fn memory_of(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|kib| kib.parse::<u64>().ok())
            .map(|kib| kib * 1024)
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// `kernelbox serve` on a free loopback port, labelled `CASE=label`, with one bearer token
/// and no tenants file from the environment; its stderr piped (the address is read from it,
/// [`serving_addr`]) and the process killed when dropped. Callers add their own flags and
/// environment.
pub fn serve_command(label: &str, token: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"));
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--label"])
        .arg(format!("{CASE}={label}"))
        .env("KERNELBOX_TOKEN", token)
        .env("KERNELBOX_RUNTIME", runtime().name())
        .env_remove("KERNELBOX_TENANTS")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}
