//! Spawning a kernel: its staging volume and container are created, attached before start
//! (so nothing the runner writes is missed), started, and the runner's `ready` awaited. On any
//! failure nothing is left behind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::stream::BoxStream;
use rand::Rng;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::files;
use super::protocol::{
    language_env, runner_command, runner_env, Breach, KernelFrame, PROTOCOL_VERSION,
};
use super::reader::{reader_task, Events, ReaderTask};
use super::stdin::Stdin;
use super::{
    kernel_labels, parse_user, pool_labels, CellIo, IoEvent, Kernel, KernelError, KernelState,
    Shared, MAX_READER_BACKLOG, STAGING_DIR_PROJECT, WORK_DIR,
};
use crate::config::{FileTransfer, KernelSpec, WorkMode};
use crate::docker::monitor::EventMonitor;
use crate::docker::{
    remove_volume_when_free, Attached, Chunk, ContainerSpec, Engine, EngineError, Mount,
    TmpfsVolume,
};
use crate::owner::KernelKey;
use crate::telemetry::in_span;

/// What a new kernel is made from.
pub(crate) struct SpawnRequest<'a> {
    /// The engine to run it on.
    pub(crate) engine: Arc<dyn Engine>,
    /// What it is made from (an owner's kernel runs the image its key names instead).
    pub(crate) spec: &'a KernelSpec,
    /// How long the runner may take to say it is ready.
    pub(crate) spawn_timeout: Duration,
    /// The file transport's settings (the resident helper's idle time, the channels'
    /// directory).
    pub(crate) files: &'a FileTransfer,
    /// The instance's labels, put on the container and its volume.
    pub(crate) base_labels: &'a BTreeMap<String, String>,
    /// The key it will serve and which kernel of the key it is; `None` for a kernel made for
    /// the warm pool, which carries no owner until one takes it ([`Kernel::assign`]).
    pub(crate) owner: Option<(KernelKey, u64)>,
    /// The engine's event stream, to tell deaths apart.
    pub(crate) monitor: EventMonitor,
    /// Owns the kernel's reader and stdin tasks.
    pub(crate) tracker: &'a TaskTracker,
    /// When set, the spawn gives way to others before each engine step (see [`Yield`]).
    pub(crate) yield_to: Option<Yield>,
    /// Set once the engine refused to mount [`FileTransfer::sockets`] (it does not see that
    /// directory: an engine on another host): kernels are then made without it.
    pub(crate) sockets_refused: &'a AtomicBool,
    /// For a kernel with a network policy: the egress network, the proxy's environment and
    /// the CA bundle (`docs/reliability.md`, "Network egress"); `None`: no network at all.
    pub(crate) network: Option<&'a crate::egress::KernelNetwork>,
    /// The session's workspace, mounted at `/work` in place of the staging volume (which
    /// then holds only kernelbox's files, at `/kernelbox`: `docs/workspaces.md`).
    pub(crate) workspace: Option<crate::workspace::Prepared>,
    /// Modules the runner imports before it says it is ready (a pooled kernel's
    /// [`PoolConfig::preload`](crate::config::PoolConfig::preload)); empty: none.
    pub(crate) preload: &'a [String],
    /// The session's settings (`src/settings.rs`): its environment, memory, CPU and labels.
    pub(crate) settings: Option<&'a crate::settings::Settings>,
    /// The session's files volume (another of its contexts' `/work`), mounted at `/work` in
    /// place of the staging volume in strict mode, as a workspace is (`docs/contract.md`,
    /// "Languages"); `None`: the kernel's own staging volume is its `/work`.
    pub(crate) files_volume: Option<String>,
    /// The language a kernel made for the warm pool will run (`owner` is `None`): it starts
    /// with that language's environment, as an owned kernel starts with its key's.
    pub(crate) pool_language: crate::wire::Language,
}

/// Makes a spawn give way: before each of its engine steps (volume, container, attach and
/// start) it waits while `priority` counts spawns that go first, until `until` at the
/// latest. The warm pool's refill yields so to new owners' cold starts
/// (`docs/architecture.md`, "The warm pool"), so a cold start competes with at most one
/// engine step of a refill, not a whole spawn, and a steady stream of cold starts delays a
/// refill by a bounded time, never forever.
#[derive(Debug, Clone)]
pub(crate) struct Yield {
    /// Spawns under way that go first; the spawn proceeds when this is zero (or its sender
    /// is gone).
    pub(crate) priority: tokio::sync::watch::Receiver<usize>,
    /// When the spawn stops giving way.
    pub(crate) until: tokio::time::Instant,
    /// Abandons the wait, and the spawn with [`KernelError::Abandoned`] (shutdown).
    pub(crate) cancel: CancellationToken,
}

impl Yield {
    /// Waits until nothing goes first, or the spawn (or other background engine work of the
    /// pool) has given way long enough.
    pub(crate) async fn give_way(&self) -> Result<(), KernelError> {
        let mut priority = self.priority.clone();
        tokio::select! {
            biased;
            _ = self.cancel.cancelled() => Err(KernelError::Abandoned),
            // A dropped sender means nothing can go first any more.
            _ = priority.wait_for(|n| *n == 0) => Ok(()),
            _ = tokio::time::sleep_until(self.until) => Ok(()),
        }
    }
}

/// Gives way when the request says so.
async fn give_way(yield_to: &Option<Yield>) -> Result<(), KernelError> {
    match yield_to {
        Some(y) => y.give_way().await,
        None => Ok(()),
    }
}

/// What a kernel's object is made of besides its streams ([`Kernel::on_streams`]).
pub(super) struct Streams<'a> {
    pub(super) engine: &'a Arc<dyn Engine>,
    pub(super) id: String,
    pub(super) volume: String,
    pub(super) spill_dir: String,
    pub(super) sockets: Option<std::path::PathBuf>,
    pub(super) workspace: Option<crate::cell::WorkspaceInfo>,
    pub(super) files_volume: Option<String>,
    pub(super) user: String,
    pub(super) helper_idle: Duration,
    pub(super) tracker: &'a TaskTracker,
    pub(super) monitor: EventMonitor,
}

/// A created, not yet started, container.
pub(crate) struct Created {
    pub(super) id: String,
    pub(super) volume: String,
    /// The session's files volume at its `/work`, when it is not `volume`.
    pub(super) files_volume: Option<String>,
    pub(super) spill_dir: String,
    /// The file channels' directory when it is mounted into the container.
    pub(super) sockets: Option<std::path::PathBuf>,
}

impl Created {
    /// Removes the created container and its staging volume.
    pub(crate) async fn remove(&self, engine: &dyn Engine) {
        if let Err(e) = engine.remove_container(&self.id).await {
            tracing::warn!(container = %self.id, error = %e, "removing a created kernel container");
        }
        let _ = remove_volume_when_free(engine, &self.volume).await;
        if let Some(files) = &self.files_volume {
            let _ = super::staging::release_files(engine, files).await;
        }
    }
}

/// The name and labels of a new kernel's staging volume.
fn staging_volume(
    owner: Option<&(KernelKey, u64)>,
    base_labels: &BTreeMap<String, String>,
) -> (String, BTreeMap<String, String>) {
    let suffix: u32 = rand::rng().random();
    match owner {
        Some((key, generation)) => (
            format!("kernelbox-{}-{generation}-{suffix:08x}", key.hash()),
            kernel_labels(base_labels, key, *generation, "staging"),
        ),
        None => (
            format!("kernelbox-pool-{suffix:08x}"),
            pool_labels(base_labels, "staging"),
        ),
    }
}

/// Where the staging volume is mounted, given the spill directory [`work_mounts`] chose.
pub(super) fn staging_root(spill_dir: &str) -> &str {
    spill_dir.strip_suffix("/.kernelbox").unwrap_or(spill_dir)
}

/// The mounts of the working directory in `mode` (the staging volume `volume`, and the project
/// directory in project mode or the session's `workspace` or files volume in strict mode), and
/// where spills go inside the kernel.
fn work_mounts(mode: &WorkMode, volume: &str, workspace: Option<&str>) -> (Vec<Mount>, String) {
    match (mode, workspace) {
        (WorkMode::Strict, Some(workspace)) => (
            vec![
                Mount::Volume {
                    name: volume.to_string(),
                    target: STAGING_DIR_PROJECT.into(),
                },
                Mount::Volume {
                    name: workspace.to_string(),
                    target: WORK_DIR.into(),
                },
            ],
            STAGING_DIR_PROJECT.to_string(),
        ),
        (WorkMode::Strict, None) => (
            vec![Mount::Volume {
                name: volume.to_string(),
                target: WORK_DIR.into(),
            }],
            format!("{WORK_DIR}/.kernelbox"),
        ),
        (WorkMode::Project(dir), _) => (
            vec![
                Mount::Volume {
                    name: volume.to_string(),
                    target: STAGING_DIR_PROJECT.into(),
                },
                Mount::Bind {
                    source: dir.to_string_lossy().into_owned(),
                    target: WORK_DIR.into(),
                    read_only: false,
                },
            ],
            STAGING_DIR_PROJECT.to_string(),
        ),
    }
}

/// The runner's container: `spec`'s image and sandbox, the runner's command and environment.
fn runner_container(
    spec: &KernelSpec,
    status_path: &str,
    labels: BTreeMap<String, String>,
    mounts: Vec<Mount>,
) -> ContainerSpec {
    ContainerSpec {
        image: spec.image.clone(),
        cmd: runner_command(),
        env: runner_env()
            .into_iter()
            .chain([
                format!("KERNELBOX_STATUS={status_path}"),
                "PYTHONUNBUFFERED=1".into(),
                "PYTHONDONTWRITEBYTECODE=1".into(),
                "HOME=/tmp".into(),
                "LANG=C.UTF-8".into(),
            ])
            .collect(),
        user: spec.sandbox.user.clone(),
        working_dir: WORK_DIR.into(),
        labels,
        mounts,
        sandbox: spec.sandbox.clone(),
    }
}

/// The reader task of a kernel being started (`reader.rs`).
fn reader_of(
    kernel: &Kernel,
    tx: mpsc::Sender<IoEvent>,
    breach: Breach,
    output: BoxStream<'static, Result<Chunk, EngineError>>,
    monitor: EventMonitor,
) -> ReaderTask {
    ReaderTask {
        id: kernel.id.clone(),
        engine: kernel.engine.clone(),
        events: Events {
            tx,
            backlog: Arc::new(Semaphore::new(MAX_READER_BACKLOG)),
            breach: breach.clone(),
            drain: kernel.drain.clone(),
            cancel: kernel.cancel.clone(),
        },
        breach,
        output,
        writer: kernel.writer.clone(),
        shared: kernel.shared.clone(),
        epoch: monitor.epoch(),
        monitor,
        cancel: kernel.cancel.clone(),
    }
}

impl Kernel {
    /// Creates, attaches and starts a kernel container, and waits for the runner to be ready.
    /// On any failure nothing is left behind.
    pub(crate) async fn spawn(request: SpawnRequest<'_>) -> Result<Arc<Kernel>, KernelError> {
        let engine = request.engine.clone();
        let request_files = request.files_volume.clone();
        let created = Self::create_stopped(&request).await?;
        let (id, volume) = (created.id.clone(), created.volume.clone());
        match Self::start(request, created).await {
            Ok(kernel) => Ok(kernel),
            Err(e) => {
                if let Err(err) = engine.remove_container(&id).await {
                    tracing::warn!(container = %id, error = %err, "cleanup after failed spawn");
                }
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                // A volume the engine made by itself in place of the workspace's is no one's:
                // it goes with the container that asked for it (`docs/workspaces.md`).
                if let KernelError::Workspace(crate::workspace::WorkspaceError::NotOurs {
                    volume: rogue,
                }) = &e
                {
                    let _ = remove_volume_when_free(engine.as_ref(), rogue).await;
                }
                match &e {
                    KernelError::FilesGone { volume: rogue } => {
                        let _ = remove_volume_when_free(engine.as_ref(), rogue).await;
                    }
                    _ => {
                        if let Some(files) = &request_files {
                            let _ = super::staging::release_files(engine.as_ref(), files).await;
                        }
                    }
                }
                Err(e)
            }
        }
    }

    /// Creates a kernel's staging volume and container, not started: [`Kernel::spawn`]'s
    /// first half, and a fork's container that a snapshot is restored into
    /// (`docs/snapshots.md`). On failure nothing is left behind; on success the caller
    /// starts it or removes both ([`Created::remove`]).
    pub(crate) async fn create_stopped(request: &SpawnRequest<'_>) -> Result<Created, KernelError> {
        let engine = request.engine.clone();
        let (volume, labels) = staging_volume(request.owner.as_ref(), request.base_labels);
        // An owner's kernel runs the image its key names (a tenant's or a request's, see
        // docs/images.md "Images"); a pooled kernel, the configuration's.
        let mut spec = KernelSpec::clone(request.spec);
        if let Some((key, _)) = &request.owner {
            spec.image = key.image.clone();
            spec.sandbox.runtime = key.runtime;
        }
        if let Some(net) = request.network {
            spec.sandbox.network_mode = net.network.clone();
        }
        if let Some(settings) = request.settings {
            if let Some(memory) = settings.memory_bytes {
                spec.sandbox.memory_bytes = memory;
            }
            if let Some(cpus) = settings.nano_cpus {
                spec.sandbox.nano_cpus = cpus;
            }
        }
        let tmpfs = spec.sandbox.work_bytes.map(|size_bytes| {
            let (uid, gid) = parse_user(&spec.sandbox.user);
            TmpfsVolume {
                size_bytes,
                uid,
                gid,
            }
        });
        give_way(&request.yield_to).await?;
        in_span("volume", engine.create_volume(&volume, &labels, tmpfs)).await?;
        match in_span(
            "create",
            Self::create(request, &spec, volume.clone(), labels),
        )
        .await
        {
            Ok(created) => Ok(created),
            Err(e) => {
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                Err(e)
            }
        }
    }

    /// Creates the container of `spec` on the staging volume `volume` (labelled `labels`), with
    /// the file channels' directory when there is one. The caller removes the volume on failure.
    async fn create(
        request: &SpawnRequest<'_>,
        spec: &KernelSpec,
        volume: String,
        mut labels: BTreeMap<String, String>,
    ) -> Result<Created, KernelError> {
        labels.insert(crate::labels::ROLE.into(), "kernel".into());
        labels.insert(crate::labels::VOLUME.into(), volume.clone());
        labels.insert(
            crate::labels::MEMORY.into(),
            spec.sandbox.memory_bytes.to_string(),
        );
        let workspace = request.workspace.as_ref().map(|w| w.volume.as_str());
        // A session's contexts share `/work` (`docs/contract.md`, "Languages"): strict mode
        // without a workspace, the session's files volume when another context has one, else
        // this kernel's own staging volume, which later contexts then share.
        let files_volume = request
            .files_volume
            .clone()
            .filter(|_| workspace.is_none() && spec.mode == WorkMode::Strict);
        let (mut mounts, spill_dir) =
            work_mounts(&spec.mode, &volume, workspace.or(files_volume.as_deref()));
        if workspace.is_none() && spec.mode == WorkMode::Strict {
            let files = files_volume.as_deref().unwrap_or(&volume);
            labels.insert(crate::labels::FILES.into(), files.to_string());
        }
        let mut sockets = request
            .files
            .sockets
            .clone()
            .filter(|_| !request.sockets_refused.load(Ordering::Relaxed));
        if let Some(dir) = &sockets {
            mounts.push(Mount::Bind {
                source: dir.to_string_lossy().into_owned(),
                target: files::SOCKET_DIR_IN_KERNEL.into(),
                read_only: true,
            });
        }
        let status_path = format!("{spill_dir}/status");
        labels.insert(crate::labels::STATUS.into(), status_path.clone());
        let mut container = runner_container(spec, &status_path, labels, mounts);
        // A kernel of another language than Python: the runner hosts it (`runner/kernel_runner.py`).
        let language = match &request.owner {
            Some((key, _)) => key.context.language,
            None => request.pool_language,
        };
        container.env.extend(language_env(language));
        if !request.preload.is_empty() {
            container
                .env
                .push(format!("KERNELBOX_PRELOAD={}", request.preload.join(",")));
        }
        if let Some(net) = request.network {
            container.env.extend(net.env.iter().cloned());
            container.mounts.extend(net.mounts.iter().cloned());
        }
        if let Some(settings) = request.settings {
            // Names kernelbox sets are refused when the settings are checked, so these never
            // shadow one (`src/settings.rs`).
            container
                .env
                .extend(settings.env.iter().map(|(k, v)| format!("{k}={v}")));
            container.labels.extend(
                settings
                    .labels
                    .iter()
                    .map(|(k, v)| (format!("{}{k}", crate::labels::META_PREFIX), v.clone())),
            );
        }
        give_way(&request.yield_to).await?;
        let id = Self::create_container(request, container, &mut sockets).await?;
        Ok(Created {
            id,
            volume,
            files_volume,
            spill_dir,
            sockets,
        })
    }

    /// Creates `container`. An engine that cannot mount the file channels' directory (it does
    /// not see it: an engine on another host) gets the container without it, `sockets` is
    /// cleared, and later kernels are made without it.
    async fn create_container(
        request: &SpawnRequest<'_>,
        mut container: ContainerSpec,
        sockets: &mut Option<std::path::PathBuf>,
    ) -> Result<String, EngineError> {
        let created = request.engine.create_container(&container).await;
        let refused = match (&created, sockets.as_deref()) {
            (Err(e), Some(dir)) => files::mount_refused(e, dir),
            _ => false,
        };
        if !refused {
            return created;
        }
        // Files still move, over the exec streams (slower): said once.
        if let Some(dir) = sockets.take() {
            if !request.sockets_refused.swap(true, Ordering::Relaxed) {
                tracing::warn!(dir = %dir.display(), "the engine cannot mount the file channel's directory (it does not see it): kernels are made without it and files go through the engine's exec streams");
            }
        }
        container.mounts.retain(
            |m| !matches!(m, Mount::Bind { target, .. } if target == files::SOCKET_DIR_IN_KERNEL),
        );
        request.engine.create_container(&container).await
    }

    /// Attaches to a created container, starts its reader and stdin tasks, starts it, and
    /// waits for the runner's `ready`.
    async fn start(
        request: SpawnRequest<'_>,
        created: Created,
    ) -> Result<Arc<Kernel>, KernelError> {
        let SpawnRequest {
            engine,
            spec,
            spawn_timeout,
            files: file_transfer,
            owner,
            monitor,
            tracker,
            yield_to,
            workspace,
            ..
        } = request;
        let Created {
            id,
            volume,
            files_volume,
            spill_dir,
            sockets,
        } = created;
        // Likewise the session's files volume must still be kernelbox's.
        if let Some(files) = &files_volume {
            in_span(
                "files check",
                super::staging::verify_files(engine.as_ref(), files),
            )
            .await?;
        }
        // The container now pins its volumes: its `/work` must be the workspace's own volume,
        // never one the engine made by itself under that name (`docs/workspaces.md`, "Quota").
        if let Some(w) = &workspace {
            in_span(
                "workspace check",
                crate::workspace::verify(engine.as_ref(), w),
            )
            .await?;
        }
        // The workspace's loop device stays held until the container is started: its mount
        // holds it from then on (`docs/workspaces.md`, "Quota").
        let (workspace, _device) = match workspace {
            Some(w) => (Some(w.info), Some(w.device)),
            None => (None, None),
        };
        give_way(&yield_to).await?;
        let attached = engine.attach(&id).await?;
        let kernel = Kernel::on_streams(
            Streams {
                engine: &engine,
                id: id.clone(),
                volume,
                spill_dir,
                sockets,
                workspace,
                files_volume,
                user: spec.sandbox.user.clone(),
                helper_idle: file_transfer.helper_idle,
                tracker,
                monitor,
            },
            attached,
        );
        give_way(&yield_to).await?;
        in_span("start", engine.start(&id)).await?;
        let (v, python) = in_span("ready", kernel.wait_ready(spawn_timeout)).await?;
        if v != PROTOCOL_VERSION {
            return Err(KernelError::Protocol(v));
        }
        if let Some((key, _)) = owner {
            kernel.assign(&key.owner);
        }
        tracing::debug!(container = %kernel.short_id(), python = %python, "kernel ready");
        kernel.shared.set_live(KernelState::Idle);
        Ok(kernel)
    }

    /// The kernel of container `id` speaking over `attached` (the container's attach, or a
    /// restored kernel's relay: `hibernate.rs`), its reader and stdin tasks started.
    pub(super) fn on_streams(streams: Streams<'_>, attached: Attached) -> Arc<Kernel> {
        let Streams {
            engine,
            id,
            volume,
            spill_dir,
            sockets,
            workspace,
            files_volume,
            user,
            helper_idle,
            tracker,
            monitor,
        } = streams;
        let cancel = CancellationToken::new();
        let breach = Breach::default();
        let (writer, writer_task) = Stdin::new(attached.input, cancel.clone(), breach.clone());
        let (tx, rx) = mpsc::channel(256);
        let kernel = Arc::new(Kernel {
            id,
            volume,
            files_volume,
            workspace,
            owner: OnceLock::new(),
            spill_dir,
            user,
            engine: engine.clone(),
            shared: Arc::new(Shared::new()),
            io: tokio::sync::Mutex::new(CellIo { rx }),
            writer,
            next_cell: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            last_timeout_ms: AtomicU64::new(0),
            computing: std::sync::atomic::AtomicBool::new(false),
            authority: Mutex::new(None),
            drain: CancellationToken::new(),
            cancel: cancel.clone(),
            files: Arc::new(files::Resident::new(
                helper_idle,
                sockets,
                tracker.clone(),
                cancel,
            )),
            restored: Mutex::new(None),
        });
        tracker.spawn(writer_task);
        tracker.spawn(reader_task(reader_of(
            &kernel,
            tx,
            breach,
            attached.output,
            monitor,
        )));
        kernel
    }

    /// Waits up to `limit` for the runner's `ready`: its protocol version and Python version.
    pub(super) async fn wait_ready(&self, limit: Duration) -> Result<(u64, String), KernelError> {
        let mut io = self.io.lock().await;
        tokio::time::timeout(limit, async {
            loop {
                match io.rx.recv().await {
                    Some(IoEvent::Frame(KernelFrame::Ready { v, python }, _)) => {
                        return Ok((v, python));
                    }
                    Some(IoEvent::Closed) | None => {
                        return Err(KernelError::SpawnDied(
                            self.death()
                                .map(|d| format!("{d:?}"))
                                .unwrap_or_else(|| "no output".into()),
                        ));
                    }
                    Some(_) => {}
                }
            }
        })
        .await
        .map_err(|_| KernelError::SpawnTimeout(limit))?
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::docker::fake::FakeEngine;
    use crate::docker::monitor::EventMonitor;

    fn request<'a>(
        fake: &FakeEngine,
        config: &'a Config,
        labels: &'a BTreeMap<String, String>,
        tracker: &'a TaskTracker,
        yield_to: Yield,
    ) -> SpawnRequest<'a> {
        SpawnRequest {
            engine: Arc::new(fake.clone()),
            spec: &config.spec,
            spawn_timeout: config.kernels.spawn_timeout,
            files: &config.files,
            base_labels: labels,
            owner: None,
            monitor: EventMonitor::default(),
            tracker,
            yield_to: Some(yield_to),
            sockets_refused: &REFUSED,
            network: None,
            workspace: None,
            preload: &[],
            settings: None,
            files_volume: None,
            pool_language: crate::wire::Language::Python,
        }
    }

    static REFUSED: AtomicBool = AtomicBool::new(false);

    #[tokio::test(start_paused = true)]
    async fn a_yielding_spawn_makes_nothing_while_another_goes_first_then_completes() {
        let fake = FakeEngine::default();
        let (config, labels, tracker) = (Config::default(), BTreeMap::new(), TaskTracker::new());
        let (priority, rx) = tokio::sync::watch::channel(1usize);
        let yield_to = Yield {
            priority: rx,
            until: tokio::time::Instant::now() + Duration::from_secs(3600),
            cancel: CancellationToken::new(),
        };
        let spawn = Kernel::spawn(request(&fake, &config, &labels, &tracker, yield_to));
        tokio::pin!(spawn);
        // A cold start goes first: the spawn waits at its first step, however long.
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut spawn)
                .await
                .is_err(),
            "the spawn went on while another went first"
        );
        assert_eq!((fake.created(), fake.live_volumes()), (0, 0));
        // Nothing goes first any more: it completes.
        priority.send_replace(0);
        let kernel = spawn.await.expect("spawn");
        assert!(kernel.is_alive());
        assert_eq!(fake.created(), 1);
        kernel.dispose().await.expect("dispose");
    }

    #[tokio::test(start_paused = true)]
    async fn a_yielding_spawn_abandoned_at_shutdown_leaves_nothing() {
        let fake = FakeEngine::default();
        *fake.create_delay.lock().unwrap() = Duration::from_secs(1);
        let (config, labels, tracker) = (Config::default(), BTreeMap::new(), TaskTracker::new());
        let (priority, rx) = tokio::sync::watch::channel(0usize);
        let cancel = CancellationToken::new();
        let yield_to = Yield {
            priority: rx,
            until: tokio::time::Instant::now() + Duration::from_secs(3600),
            cancel: cancel.clone(),
        };
        let spawn = Kernel::spawn(request(&fake, &config, &labels, &tracker, yield_to));
        tokio::pin!(spawn);
        // A cold start begins while the spawn creates its container: it waits before its
        // next step (the attach), however long.
        assert!(tokio::time::timeout(Duration::from_millis(500), &mut spawn)
            .await
            .is_err());
        assert_eq!((fake.live_volumes(), fake.created()), (1, 0));
        priority.send_replace(1);
        assert!(
            tokio::time::timeout(Duration::from_secs(60), &mut spawn)
                .await
                .is_err(),
            "the spawn went on while a cold start was under way"
        );
        assert_eq!(fake.created(), 1);
        // Shutdown: the spawn gives up and removes what it made.
        cancel.cancel();
        let error = spawn.await.expect_err("an abandoned spawn fails");
        assert!(matches!(error, KernelError::Abandoned), "{error}");
        assert_eq!((fake.live_containers(), fake.live_volumes()), (0, 0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_yielding_spawn_goes_on_once_it_has_given_way_long_enough() {
        let fake = FakeEngine::default();
        let (config, labels, tracker) = (Config::default(), BTreeMap::new(), TaskTracker::new());
        let (_priority, rx) = tokio::sync::watch::channel(1usize);
        let yield_to = Yield {
            priority: rx,
            until: tokio::time::Instant::now() + Duration::from_secs(2),
            cancel: CancellationToken::new(),
        };
        let spawn = Kernel::spawn(request(&fake, &config, &labels, &tracker, yield_to));
        tokio::pin!(spawn);
        assert!(
            tokio::time::timeout(Duration::from_millis(1900), &mut spawn)
                .await
                .is_err()
        );
        assert_eq!(fake.created(), 0);
        // Cold starts never stop coming, yet past its time the spawn goes on.
        let kernel = tokio::time::timeout(Duration::from_millis(200), spawn)
            .await
            .expect("the spawn still gave way past its time")
            .expect("spawn");
        assert!(kernel.is_alive());
        kernel.dispose().await.expect("dispose");
    }
}
