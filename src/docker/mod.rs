//! Docker behind a narrow, intent-level trait.
//!
//! The registry and kernels speak only [`Engine`]; [`BollardEngine`] talks to the real daemon,
//! and tests substitute the in-memory fake (`fake`: in unit tests, and for `tests/` and
//! `benches/` behind the `test-util` feature). Cleanup verbs are idempotent: an object that is
//! already gone (404), already stopped (304/409) or already being removed is a success.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | the [`Engine`] trait, its requests and errors, idempotent volume removal |
//! | `sandbox.rs` | [`Sandbox`], [`KernelRuntime`]: how a kernel's container is confined, and under which OCI runtime |
//! | `bollard_engine.rs` | [`BollardEngine`]: the trait on the real daemon |
//! | `checkpoint.rs` | its checkpoint verbs: a container checkpointed and stopped, started again from a checkpoint placed in its own store |
//! | `monitor.rs` | the engine's events: tells OOM, outside kills and crashes apart |
//! | `cpu.rs` | a container's CPU time, read from its cgroup (the runaway watch's samples, `kernelbox ps`) |
//! | `fake.rs` | the in-memory fake engine (tests and benches) |

mod bollard_engine;
mod checkpoint;
pub mod cpu;
#[cfg(any(test, feature = "test-util"))]
pub mod fake;
pub(crate) mod monitor;
mod sandbox;

use std::collections::BTreeMap;
use std::pin::Pin;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use tokio::io::AsyncWrite;

pub use bollard_engine::BollardEngine;
pub use sandbox::{KernelRuntime, Sandbox};

/// How many removals kernelbox runs against the engine at once when it disposes of many
/// kernels (shutdown, watchdog, sweeps).
pub const REMOVAL_CONCURRENCY: usize = 32;

/// A Docker operation that failed; names the operation and the object.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The engine could not be reached at all (socket missing, daemon down).
    #[error("docker engine unreachable during {op}: {message}")]
    Unreachable {
        /// What kernelbox asked of the engine (`ping`, `create container`, ...).
        op: &'static str,
        /// What the client said.
        message: String,
    },
    /// The engine answered with an error status.
    #[error("docker {op} {target} failed ({status}): {message}")]
    Api {
        /// What kernelbox asked of the engine.
        op: &'static str,
        /// The container, volume or image concerned.
        target: String,
        /// HTTP status from the engine.
        status: u16,
        /// The engine's message.
        message: String,
    },
    /// The image to create a kernel from does not exist locally (and none can be pulled).
    #[error("image {image} not found; build it with `kernelbox image build`")]
    ImageMissing {
        /// The image as it was named (`name[:tag]` or `name@digest`).
        image: String,
    },
    /// A volume could not be removed because a container still uses it.
    #[error("volume {name} is in use")]
    VolumeInUse {
        /// The volume that was not removed.
        name: String,
    },
    /// Anything else the client reported (I/O on a stream, decoding).
    #[error("docker {op} {target}: {message}")]
    Other {
        /// What kernelbox asked of the engine.
        op: &'static str,
        /// The container, volume or image concerned.
        target: String,
        /// What the client reported.
        message: String,
    },
}

impl EngineError {
    /// True when the engine itself is unreachable (as opposed to refusing one request).
    pub fn is_unreachable(&self) -> bool {
        matches!(self, EngineError::Unreachable { .. })
    }
}

/// A mount into a kernel container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mount {
    /// A named volume at `target`.
    Volume {
        /// Volume name.
        name: String,
        /// Path in the container.
        target: String,
    },
    /// A host directory at `target`.
    Bind {
        /// Host path.
        source: String,
        /// Path in the container.
        target: String,
        /// Mounted read-only.
        read_only: bool,
    },
}

/// Everything needed to create a hardened kernel container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerSpec {
    /// The image it is created from.
    pub image: String,
    /// Command line (imported images have no `Cmd`, so it is always given).
    pub cmd: Vec<String>,
    /// Environment, `KEY=value`; nothing of the host's.
    pub env: Vec<String>,
    /// The user the container's process runs as, `uid:gid`.
    pub user: String,
    /// Where its process starts.
    pub working_dir: String,
    /// Its labels, fixed at create (`src/labels.rs`).
    pub labels: BTreeMap<String, String>,
    /// Volumes and host directories mounted into it.
    pub mounts: Vec<Mount>,
    /// Its limits and hardening (memory, CPU, processes, network, read-only root).
    pub sandbox: Sandbox,
}

/// One chunk of container output, as the engine framed it (not a line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    /// From the container's stdout (cell output).
    Stdout(Bytes),
    /// From the container's stderr (protocol frames).
    Stderr(Bytes),
}

/// The streams of an attached container.
pub struct Attached {
    /// Output chunks; ends when the container's streams close.
    pub output: BoxStream<'static, Result<Chunk, EngineError>>,
    /// The container's stdin; shutting it down gives the process EOF.
    pub input: Pin<Box<dyn AsyncWrite + Send>>,
}

/// A process to run inside a running container ([`Engine::exec`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecSpec {
    /// The program and its arguments.
    pub cmd: Vec<String>,
    /// `uid:gid` it runs as.
    pub user: String,
    /// Where it starts.
    pub working_dir: String,
    /// Environment added to the container's, `KEY=value`.
    pub env: Vec<String>,
}

/// A process started by [`Engine::exec_process`]: its streams, and its exit code once its
/// output ended.
pub struct ExecProcess {
    /// Its stdout and stderr, apart, and its stdin.
    pub streams: Attached,
    /// Asks the engine for the exit code (`None` while it still runs, or when the engine
    /// does not know); await it after the output ended.
    pub exit_code: futures::future::BoxFuture<'static, Result<Option<i64>, EngineError>>,
}

/// A memory-backed volume: bounded in size, charged to the kernel's memory, owned by the
/// kernel's user whatever the image, and never written to the host's disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TmpfsVolume {
    /// Size limit in bytes.
    pub size_bytes: u64,
    /// Owner uid of the volume's root.
    pub uid: u64,
    /// Owner gid of the volume's root.
    pub gid: u64,
}

/// What `list` reports of a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerInfo {
    /// The full (64 hex) container id.
    pub id: String,
    /// `created`, `running`, `exited`, ...
    pub state: String,
    /// Its labels, as set at create.
    pub labels: BTreeMap<String, String>,
    /// Creation time, Unix seconds.
    pub created: i64,
    /// The container's name, without Docker's leading `/` (empty when it has none).
    pub name: String,
}

/// What `list` reports of a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeInfo {
    /// Volume name.
    pub name: String,
    /// Its labels, as set at create.
    pub labels: BTreeMap<String, String>,
}

/// A container event from the engine's event stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineEvent {
    /// The container's full id.
    pub id: String,
    /// `create`, `start`, `oom`, `kill`, `die`, `destroy`, ...
    pub action: String,
    /// Exit code, on `die`.
    pub exit_code: Option<i64>,
    /// Signal number, on `kill`.
    pub signal: Option<i64>,
}

/// Where a network kernelbox created lies ([`Engine::create_network`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkAddrs {
    /// The host's address on it.
    pub gateway: std::net::IpAddr,
    /// Its subnet: base address and prefix length.
    pub subnet: (std::net::IpAddr, u8),
}

/// A network kernelbox creates ([`Engine::create_network`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSpec {
    /// The network's name, which labels and sweeps find it by.
    pub name: String,
    /// The name of its bridge interface on the host (at most 15 bytes).
    pub bridge: String,
    /// Its labels (`src/labels.rs`): which instance made it, for the sweeps.
    pub labels: BTreeMap<String, String>,
}

fn unsupported(op: &'static str, target: &str) -> EngineError {
    EngineError::Other {
        op,
        target: target.to_string(),
        message: "this engine has no networks".into(),
    }
}

/// The Docker operations kernelbox needs, at the level of intent.
#[async_trait]
pub trait Engine: Send + Sync + 'static {
    /// Checks the engine answers.
    async fn ping(&self) -> Result<(), EngineError>;
    /// The OCI runtimes the engine has registered (`runc`, `runsc`, ...). An engine that does
    /// not say (the fake) runs every runtime kernelbox knows.
    async fn runtimes(&self) -> Result<Vec<String>, EngineError> {
        Ok(vec!["runc".into(), "runsc".into()])
    }
    /// True when the image exists locally.
    async fn image_exists(&self, image: &str) -> Result<bool, EngineError>;
    /// Creates a labelled volume (on disk, or in memory when `tmpfs` is given).
    async fn create_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        tmpfs: Option<TmpfsVolume>,
    ) -> Result<(), EngineError>;
    /// Creates a labelled volume that the engine mounts from a block `device` holding a file
    /// system of type `fstype` (a workspace's loop device, `docs/workspaces.md`); engines
    /// without local block devices refuse.
    async fn create_device_volume(
        &self,
        name: &str,
        labels: &BTreeMap<String, String>,
        device: &str,
        fstype: &str,
    ) -> Result<(), EngineError> {
        let _ = (labels, device, fstype);
        Err(EngineError::Other {
            op: "create device volume",
            target: name.to_string(),
            message: "this engine has no device volumes".into(),
        })
    }
    /// Removes a volume; a missing one is a success.
    async fn remove_volume(&self, name: &str) -> Result<(), EngineError>;
    /// Volumes matching every `key=value` label filter; `dangling` keeps only unused ones.
    async fn list_volumes(
        &self,
        labels: &[String],
        dangling: bool,
    ) -> Result<Vec<VolumeInfo>, EngineError>;
    /// Creates a container; returns its id.
    async fn create_container(&self, spec: &ContainerSpec) -> Result<String, EngineError>;
    /// Attaches to stdin, stdout and stderr (before start, so nothing is missed).
    async fn attach(&self, id: &str) -> Result<Attached, EngineError>;
    /// Starts a created container.
    async fn start(&self, id: &str) -> Result<(), EngineError>;
    /// Checkpoints a running container's processes into `dir/name` and stops it, keeping it
    /// (the engine's experimental checkpoints: under gVisor, `docs/runtimes.md`
    /// "Hibernation"). Engines and runtimes that cannot checkpoint refuse.
    async fn checkpoint(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        let _ = (name, dir);
        Err(EngineError::Other {
            op: "checkpoint",
            target: id.to_string(),
            message: "this engine cannot checkpoint containers".into(),
        })
    }
    /// Checkpoints a running container's processes into `dir/name` and leaves it running (a
    /// snapshot, `docs/snapshots.md`): the same checkpoint as [`Engine::checkpoint`], which
    /// another container of the same spec can be started from. Engines and runtimes that
    /// cannot checkpoint refuse.
    async fn checkpoint_running(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        let _ = (name, dir);
        Err(EngineError::Other {
            op: "snapshot",
            target: id.to_string(),
            message: "this engine cannot checkpoint containers".into(),
        })
    }
    /// Starts a stopped container from its checkpoint `dir/name` (made by
    /// [`Engine::checkpoint`]): its processes resume where they were.
    async fn start_from_checkpoint(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        let _ = (name, dir);
        Err(EngineError::Other {
            op: "restore",
            target: id.to_string(),
            message: "this engine cannot restore checkpoints".into(),
        })
    }
    /// Sends SIGKILL; a stopped or missing container is a success.
    async fn kill(&self, id: &str) -> Result<(), EngineError>;
    /// Sends SIGINT to the container's main process (the init passes it on to the runner:
    /// an interrupt, `docs/contract.md` "Statuses"); a stopped or missing container is a
    /// success.
    async fn interrupt(&self, id: &str) -> Result<(), EngineError>;
    /// Kills and removes a container and waits until it is gone; a missing one is a success.
    async fn remove_container(&self, id: &str) -> Result<(), EngineError>;
    /// Renames a container (kernelbox records who took a pooled kernel in its name: see
    /// [`labels::owner_name`](crate::labels::owner_name)); a missing container is a success.
    async fn rename_container(&self, id: &str, name: &str) -> Result<(), EngineError>;
    /// Containers (any state) matching every `key=value` label filter.
    async fn list_containers(&self, labels: &[String]) -> Result<Vec<ContainerInfo>, EngineError>;
    /// Extracts a tar archive into `dir` of a container (a volume path, before or after start).
    async fn upload(&self, id: &str, dir: &str, tar: Bytes) -> Result<(), EngineError>;
    /// Runs a process inside a running container, attached to its stdin, stdout and stderr
    /// (no TTY, so the two output streams stay apart). The process lives in the container's
    /// namespaces and cgroup, under its limits; the output ends when it exits.
    async fn exec(&self, id: &str, spec: &ExecSpec) -> Result<Attached, EngineError>;
    /// [`Engine::exec`], with a way to learn the process's exit code once it ended (a
    /// session's shell commands, `src/kernel/command.rs`).
    async fn exec_process(&self, id: &str, spec: &ExecSpec) -> Result<ExecProcess, EngineError>;
    /// Creates a labelled internal bridge network for kernels with a network policy
    /// (`docs/reliability.md`, "Network egress"): no route out, no traffic between its
    /// containers, its bridge interface named `spec.bridge`; returns its gateway address (the
    /// host's on that network) and subnet. Engines without networks refuse.
    async fn create_network(&self, spec: &NetworkSpec) -> Result<NetworkAddrs, EngineError> {
        Err(unsupported("create network", &spec.name))
    }
    /// Removes a network; a missing one is a success.
    async fn remove_network(&self, name: &str) -> Result<(), EngineError> {
        Err(unsupported("remove network", name))
    }
    /// Names of the networks matching every `key=value` label filter.
    async fn list_networks(&self, labels: &[String]) -> Result<Vec<String>, EngineError> {
        let _ = labels;
        Ok(Vec::new())
    }
    /// The address of a running container on `network`, if it has one there.
    async fn container_address(
        &self,
        id: &str,
        network: &str,
    ) -> Result<Option<std::net::IpAddr>, EngineError> {
        let _ = network;
        Err(unsupported("inspect container", id))
    }
    /// Container events matching every label filter, replayed from `since` (Unix seconds)
    /// when given; ends when the engine goes away.
    fn events(
        &self,
        labels: &[String],
        since: Option<i64>,
    ) -> BoxStream<'static, Result<EngineEvent, EngineError>>;
}

/// What [`remove_volume`] does when the engine says a container still uses the volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InUse {
    /// Give up at once with [`EngineError::VolumeInUse`] (sweeps: a volume in use is not a
    /// leftover).
    Fail,
    /// Retry with backoff for about five seconds: the container was just removed and the
    /// engine is still committing its removal (disposal, cleanup after a failed spawn).
    Wait,
}

/// Removes a volume (a missing one is a success). The one place kernelbox removes volumes.
pub async fn remove_volume(
    engine: &dyn Engine,
    name: &str,
    in_use: InUse,
) -> Result<(), EngineError> {
    if in_use == InUse::Wait {
        let mut delay = std::time::Duration::from_millis(20);
        for _ in 0..8 {
            match engine.remove_volume(name).await {
                Err(EngineError::VolumeInUse { .. }) => {
                    // There is no engine event for "volume released": back off and retry.
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
                other => return other,
            }
        }
    }
    engine.remove_volume(name).await
}

/// Removes a volume, waiting briefly while the engine finishes removing its container
/// ([`remove_volume`] with [`InUse::Wait`]).
pub async fn remove_volume_when_free(engine: &dyn Engine, name: &str) -> Result<(), EngineError> {
    remove_volume(engine, name, InUse::Wait).await
}

/// The short form of a container id (its first 12 characters), as `docker ps` shows it.
pub fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}
