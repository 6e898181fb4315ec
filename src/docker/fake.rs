//! An in-memory [`Engine`] for fast, deterministic unit tests of the orchestrator's logic.
//!
//! Containers are tasks that speak the runner protocol: `ready` on start, and for each `exec`
//! a line of output, the end marker and `done`. Cell code drives them: `sleep` never finishes,
//! `exit` ends the kernel, `raise` reports an error, `flood` writes output forever, `deaf`
//! succeeds and then never reads stdin again, anything else succeeds. An interrupt ends a
//! `sleep` cell as the runner's KeyboardInterrupt does (status `interrupted`); a `stubborn`
//! cell never finishes and ignores interrupts.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::{
    Attached, Chunk, ContainerInfo, ContainerSpec, Engine, EngineError, EngineEvent, ExecProcess,
    ExecSpec, VolumeInfo,
};

/// The runner protocol version the fake's containers speak. The fake sits below the kernel
/// layer, so it keeps its own copy; a unit test in `kernel::protocol_tests` checks that it
/// matches the protocol's `PROTOCOL_VERSION`.
pub const RUNNER_PROTOCOL: u64 = 3;

#[derive(Default)]
struct State {
    next: u64,
    containers: HashMap<String, Container>,
    volumes: BTreeMap<String, BTreeMap<String, String>>,
    created: usize,
    removed: usize,
    /// Containers being renamed now.
    renaming: std::collections::HashSet<String>,
    /// Removals that began while a rename of the same container was under way.
    overlaps: usize,
    /// Renames asked for.
    renames: usize,
}

struct Container {
    labels: BTreeMap<String, String>,
    mounts: Vec<super::Mount>,
    name: String,
    running: bool,
    io: Option<(mpsc::Sender<Chunk>, tokio::io::DuplexStream)>,
    stop: CancellationToken,
    /// Woken by [`Engine::interrupt`]: a `sleep` cell ends interrupted.
    interrupt: Arc<tokio::sync::Notify>,
}

/// The fake engine; cloning shares its state.
#[derive(Clone, Default)]
pub struct FakeEngine {
    state: Arc<Mutex<State>>,
    /// Images that exist (any image when empty).
    pub images: Arc<Mutex<Vec<String>>>,
    /// How long a container create takes (in the test's clock; zero by default).
    pub create_delay: Arc<Mutex<std::time::Duration>>,
    /// How long a container rename takes (in the test's clock; zero by default).
    pub rename_delay: Arc<Mutex<std::time::Duration>>,
    /// Host paths this engine does not see (an engine on another host): a container binding
    /// one is refused, as the real engine refuses a bind source that does not exist.
    pub unseen_paths: Arc<Mutex<Vec<std::path::PathBuf>>>,
}

impl FakeEngine {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The mounts a live container (its id or a prefix of it) was created with.
    pub fn mounts_of(&self, id: &str) -> Option<Vec<super::Mount>> {
        let state = self.lock();
        let found = state
            .containers
            .iter()
            .find(|(full, _)| full.starts_with(id));
        found.map(|(_, c)| c.mounts.clone())
    }

    /// Containers ever created.
    pub fn created(&self) -> usize {
        self.lock().created
    }

    /// Containers that exist now.
    pub fn live_containers(&self) -> usize {
        self.lock().containers.len()
    }

    /// Volumes that exist now.
    pub fn live_volumes(&self) -> usize {
        self.lock().volumes.len()
    }

    /// Removals that began while the same container was being renamed: the real engine can
    /// leave such a container listed ("Removal In Progress") until it restarts.
    pub fn rename_removal_overlaps(&self) -> usize {
        self.lock().overlaps
    }

    /// Container renames asked for.
    pub fn renames(&self) -> usize {
        self.lock().renames
    }

    /// Simulates `docker rm -f` from outside kernelbox.
    pub fn kill_from_outside(&self, id: &str) {
        if let Some(c) = self.lock().containers.remove(id) {
            c.stop.cancel();
        }
    }
}

fn frame(value: Value) -> Chunk {
    let mut line = value.to_string().into_bytes();
    line.push(b'\n');
    Chunk::Stderr(Bytes::from(line))
}

/// The fake runner: answers the protocol until stopped or its stdin closes.
async fn fake_runner(
    out: mpsc::Sender<Chunk>,
    input: tokio::io::DuplexStream,
    stop: CancellationToken,
    interrupt: Arc<tokio::sync::Notify>,
) {
    let _ = out
        .send(frame(
            json!({"op": "ready", "v": RUNNER_PROTOCOL, "python": "fake"}),
        ))
        .await;
    let mut lines = BufReader::new(input).lines();
    let mut count = 0u64;
    loop {
        let line = tokio::select! {
            _ = stop.cancelled() => return,
            line = lines.next_line() => match line {
                Ok(Some(line)) => line,
                _ => return,
            },
        };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        if msg["op"] != "exec" {
            continue;
        }
        count += 1;
        let code = msg["code"].as_str().unwrap_or_default().to_string();
        let marker = msg["marker"].as_str().unwrap_or_default().to_string();
        if code.starts_with("stubborn") {
            stop.cancelled().await;
            return;
        }
        let interrupted = if code.starts_with("sleep") {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = interrupt.notified() => true,
            }
        } else {
            false
        };
        if code.starts_with("flood") {
            // Output faster than anyone reads it, forever.
            let chunk = Bytes::from(vec![b'x'; 4096]);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    sent = out.send(Chunk::Stdout(chunk.clone())) => if sent.is_err() { return },
                }
            }
        }
        let status = match code.as_str() {
            _ if interrupted => "interrupted",
            "exit" => "exit",
            "raise" => "error",
            _ => "ok",
        };
        let done = json!({
            "op": "done", "cell": msg["cell"], "status": status,
            "traceback": match status {
                "error" => json!("Traceback: ValueError"),
                "interrupted" => json!("Traceback: KeyboardInterrupt"),
                _ => Value::Null,
            },
            "execution_count": count,
        });
        // Output, then the end marker and the done frame in one write, as the runner does.
        let output = format!("ran {code}\n{marker}{done}\n");
        let _ = out.send(Chunk::Stdout(Bytes::from(output))).await;
        if status == "exit" {
            return;
        }
        if code == "deaf" {
            // Answered, but never reads its stdin again (a wedged interpreter).
            stop.cancelled().await;
            return;
        }
    }
}

#[async_trait]
impl Engine for FakeEngine {
    async fn ping(&self) -> Result<(), EngineError> {
        Ok(())
    }

    async fn image_exists(&self, image: &str) -> Result<bool, EngineError> {
        let images = self.images.lock().unwrap_or_else(|p| p.into_inner());
        Ok(images.is_empty() || images.iter().any(|i| i == image))
    }

    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        _tmpfs: Option<super::TmpfsVolume>,
    ) -> Result<(), EngineError> {
        self.lock().volumes.insert(name.to_string(), labels.clone());
        Ok(())
    }

    async fn create_device_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        _device: &str,
        _fstype: &str,
    ) -> Result<(), EngineError> {
        self.lock().volumes.insert(name.to_string(), labels.clone());
        Ok(())
    }

    async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.lock().volumes.remove(name);
        Ok(())
    }

    async fn list_volumes(
        &self,
        _labels: &[String],
        _dangling: bool,
    ) -> Result<Vec<VolumeInfo>, EngineError> {
        Ok(self
            .lock()
            .volumes
            .iter()
            .map(|(name, labels)| VolumeInfo {
                name: name.clone(),
                labels: labels.clone(),
            })
            .collect())
    }

    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError> {
        let delay = *self.create_delay.lock().unwrap_or_else(|p| p.into_inner());
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        if !self.image_exists(&spec.image).await? {
            return Err(EngineError::ImageMissing {
                image: spec.image.clone(),
            });
        }
        let unseen = self
            .unseen_paths
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for mount in &spec.mounts {
            if let super::Mount::Bind { source, .. } = mount {
                if unseen.iter().any(|p| p.as_os_str() == source.as_str()) {
                    return Err(EngineError::Api {
                        op: "create container",
                        target: spec.image.clone(),
                        status: 400,
                        message: format!("invalid mount config for type \"bind\": bind source path does not exist: {source}"),
                    });
                }
            }
        }
        let mut state = self.lock();
        state.next += 1;
        state.created += 1;
        let id = format!("{:012x}{}", state.next, "f".repeat(52));
        state.containers.insert(
            id.clone(),
            Container {
                labels: spec.labels.clone(),
                mounts: spec.mounts.clone(),
                name: String::new(),
                running: false,
                io: None,
                stop: CancellationToken::new(),
                interrupt: Arc::default(),
            },
        );
        Ok(id)
    }

    async fn attach(&self, id: &str) -> Result<Attached, EngineError> {
        let mut state = self.lock();
        let container = state
            .containers
            .get_mut(id)
            .ok_or_else(|| EngineError::Api {
                op: "attach",
                target: id.to_string(),
                status: 404,
                message: "no such container".into(),
            })?;
        let (out_tx, out_rx) = mpsc::channel(64);
        let (host, runner) = tokio::io::duplex(64 * 1024);
        container.io = Some((out_tx, runner));
        let output = tokio_stream_from(out_rx);
        Ok(Attached {
            output,
            input: Box::pin(host),
        })
    }

    async fn start(&self, id: &str) -> Result<(), EngineError> {
        let mut state = self.lock();
        let container = state
            .containers
            .get_mut(id)
            .ok_or_else(|| EngineError::Api {
                op: "start",
                target: id.to_string(),
                status: 404,
                message: "no such container".into(),
            })?;
        container.running = true;
        if let Some((out, input)) = container.io.take() {
            let interrupt = container.interrupt.clone();
            tokio::spawn(fake_runner(out, input, container.stop.clone(), interrupt));
        }
        Ok(())
    }

    async fn kill(&self, id: &str) -> Result<(), EngineError> {
        if let Some(c) = self.lock().containers.get(id) {
            c.stop.cancel();
        }
        Ok(())
    }

    async fn interrupt(&self, id: &str) -> Result<(), EngineError> {
        if let Some(c) = self.lock().containers.get(id) {
            c.interrupt.notify_one();
        }
        Ok(())
    }

    async fn remove_container(&self, id: &str) -> Result<(), EngineError> {
        let mut state = self.lock();
        if state.renaming.contains(id) {
            state.overlaps += 1;
        }
        if let Some(c) = state.containers.remove(id) {
            c.stop.cancel();
            state.removed += 1;
        }
        Ok(())
    }

    async fn rename_container(&self, id: &str, name: &str) -> Result<(), EngineError> {
        let delay = *self.rename_delay.lock().unwrap_or_else(|p| p.into_inner());
        self.lock().renames += 1;
        if !delay.is_zero() {
            self.lock().renaming.insert(id.to_string());
            tokio::time::sleep(delay).await;
            self.lock().renaming.remove(id);
        }
        if let Some(c) = self.lock().containers.get_mut(id) {
            c.name = name.to_string();
        }
        Ok(())
    }

    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>, EngineError> {
        // As the engine's `label` filters: `key=value`, or `key` for any value.
        let matches = |have: &BTreeMap<String, String>| {
            labels.iter().all(|f| match f.split_once('=') {
                Some((k, v)) => have.get(k).is_some_and(|h| h == v),
                None => have.contains_key(f.as_str()),
            })
        };
        Ok(self
            .lock()
            .containers
            .iter()
            .filter(|(_, c)| matches(&c.labels))
            .map(|(id, c)| ContainerInfo {
                id: id.clone(),
                state: if c.running { "running" } else { "created" }.into(),
                labels: c.labels.clone(),
                created: 0,
                name: c.name.clone(),
            })
            .collect())
    }

    async fn upload(&self, _id: &str, _dir: &str, _tar: Bytes) -> Result<(), EngineError> {
        Ok(())
    }

    async fn exec(&self, id: &str, _spec: &ExecSpec) -> Result<Attached, EngineError> {
        // The fake has no file system: file operations are tested against the real engine.
        Err(EngineError::Api {
            op: "exec",
            target: id.to_string(),
            status: 501,
            message: "the fake engine runs no processes in containers".into(),
        })
    }

    async fn exec_process(&self, id: &str, spec: &ExecSpec) -> Result<ExecProcess, EngineError> {
        self.exec(id, spec).await.map(|_| unreachable_process())
    }

    fn events(
        &self,
        _labels: &[String],
        _since: Option<i64>,
    ) -> BoxStream<'static, Result<EngineEvent, EngineError>> {
        futures::stream::pending().boxed()
    }
}

/// Never called: the fake's exec always fails (it has no processes to run).
fn unreachable_process() -> ExecProcess {
    ExecProcess {
        streams: Attached {
            output: futures::stream::empty().boxed(),
            input: Box::pin(tokio::io::sink()),
        },
        exit_code: Box::pin(async { Ok(None) }),
    }
}

fn tokio_stream_from(
    mut rx: mpsc::Receiver<Chunk>,
) -> BoxStream<'static, Result<Chunk, EngineError>> {
    futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|c| c.map(Ok))).boxed()
}
