//! Spawning a kernel: its staging volume and container are created, attached before start
//! (so nothing the runner writes is missed), started, and the runner's `ready` awaited. On any
//! failure nothing is left behind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use rand::Rng;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::files;
use super::protocol::{runner_command, runner_env, Breach, KernelFrame, PROTOCOL_VERSION};
use super::reader::{reader_task, Events, ReaderTask};
use super::stdin::Stdin;
use super::{
    kernel_labels, parse_user, pool_labels, CellIo, IoEvent, Kernel, KernelError, KernelState,
    Shared, MAX_READER_BACKLOG, STAGING_DIR_PROJECT, WORK_DIR,
};
use crate::config::{FileTransfer, KernelSpec, WorkMode};
use crate::docker::monitor::EventMonitor;
use crate::docker::{remove_volume_when_free, ContainerSpec, Engine, Mount, TmpfsVolume};
use crate::owner::KernelKey;

/// What a new kernel is made from.
pub struct SpawnRequest<'a> {
    /// The engine to run it on.
    pub engine: Arc<dyn Engine>,
    /// What it is made from (an owner's kernel runs the image its key names instead).
    pub spec: &'a KernelSpec,
    /// How long the runner may take to say it is ready.
    pub spawn_timeout: Duration,
    /// The file transport's settings (the resident helper's idle time, the channels'
    /// directory).
    pub files: &'a FileTransfer,
    /// The instance's labels, put on the container and its volume.
    pub base_labels: &'a BTreeMap<String, String>,
    /// The key it will serve and which kernel of the key it is; `None` for a kernel made for
    /// the warm pool, which carries no owner until one takes it ([`Kernel::assign`]).
    pub owner: Option<(KernelKey, u64)>,
    /// The engine's event stream, to tell deaths apart.
    pub monitor: EventMonitor,
    /// Owns the kernel's reader and stdin tasks.
    pub tracker: &'a TaskTracker,
    /// When set, the spawn gives way to others before each engine step (see [`Yield`]).
    pub yield_to: Option<Yield>,
    /// Set once the engine refused to mount [`FileTransfer::sockets`] (it does not see that
    /// directory: an engine on another host): kernels are then made without it.
    pub sockets_refused: &'a AtomicBool,
}

/// Makes a spawn give way: before each of its engine steps (volume, container, attach and
/// start) it waits while `priority` counts spawns that go first, until `until` at the
/// latest. The warm pool's refill yields so to new owners' cold starts
/// (`docs/architecture.md`, "The warm pool"), so a cold start competes with at most one
/// engine step of a refill, not a whole spawn, and a steady stream of cold starts delays a
/// refill by a bounded time, never forever.
#[derive(Debug, Clone)]
pub struct Yield {
    /// Spawns under way that go first; the spawn proceeds when this is zero (or its sender
    /// is gone).
    pub priority: tokio::sync::watch::Receiver<usize>,
    /// When the spawn stops giving way.
    pub until: tokio::time::Instant,
    /// Abandons the wait, and the spawn with [`KernelError::Abandoned`] (shutdown).
    pub cancel: CancellationToken,
}

impl Yield {
    /// Waits until nothing goes first, or the spawn (or other background engine work of the
    /// pool) has given way long enough.
    pub async fn give_way(&self) -> Result<(), KernelError> {
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

/// A created, not yet started, container.
struct Created {
    id: String,
    volume: String,
    spill_dir: String,
    /// The file channels' directory when it is mounted into the container.
    sockets: Option<std::path::PathBuf>,
}

impl Kernel {
    /// Creates, attaches and starts a kernel container, and waits for the runner to be ready.
    /// On any failure nothing is left behind.
    pub async fn spawn(request: SpawnRequest<'_>) -> Result<Arc<Kernel>, KernelError> {
        let SpawnRequest {
            engine,
            spec,
            files: file_transfer,
            base_labels,
            owner,
            yield_to,
            sockets_refused,
            ..
        } = &request;
        let suffix: u32 = rand::rng().random();
        let (volume, mut labels) = match owner {
            Some((key, generation)) => (
                format!("kernelbox-{}-{generation}-{suffix:08x}", key.hash()),
                kernel_labels(base_labels, key, *generation, "staging"),
            ),
            None => (
                format!("kernelbox-pool-{suffix:08x}"),
                pool_labels(base_labels, "staging"),
            ),
        };
        // An owner's kernel runs the image its key names (a tenant's or a request's, see
        // README "Images"); a pooled kernel, the configuration's.
        let mut spec = KernelSpec::clone(spec);
        if let Some((key, _)) = owner {
            spec.image = key.image.clone();
        }
        let tmpfs = spec.sandbox.work_bytes.map(|size_bytes| {
            let (uid, gid) = parse_user(&spec.sandbox.user);
            TmpfsVolume {
                size_bytes,
                uid,
                gid,
            }
        });
        give_way(yield_to).await?;
        engine.create_volume(&volume, &labels, tmpfs).await?;
        labels.insert(crate::labels::ROLE.into(), "kernel".into());
        labels.insert(crate::labels::VOLUME.into(), volume.clone());
        labels.insert(
            crate::labels::MEMORY.into(),
            spec.sandbox.memory_bytes.to_string(),
        );
        let (mut mounts, spill_dir) = match &spec.mode {
            WorkMode::Strict => (
                vec![Mount::Volume {
                    name: volume.clone(),
                    target: WORK_DIR.into(),
                }],
                format!("{WORK_DIR}/.kernelbox"),
            ),
            WorkMode::Project(dir) => (
                vec![
                    Mount::Volume {
                        name: volume.clone(),
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
        };
        let mut sockets = file_transfer
            .sockets
            .clone()
            .filter(|_| !sockets_refused.load(Ordering::Relaxed));
        if let Some(dir) = &sockets {
            mounts.push(Mount::Bind {
                source: dir.to_string_lossy().into_owned(),
                target: files::SOCKET_DIR_IN_KERNEL.into(),
                read_only: true,
            });
        }
        let status_path = format!("{spill_dir}/status");
        labels.insert(crate::labels::STATUS.into(), status_path.clone());
        let mut spec = ContainerSpec {
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
        };
        let mut created = match give_way(yield_to).await {
            Ok(()) => engine.create_container(&spec).await,
            Err(e) => {
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                return Err(e);
            }
        };
        if let (Err(e), Some(dir)) = (&created, &sockets) {
            if files::mount_refused(e, dir) {
                // Files still move, over the exec streams (slower): said once.
                if !sockets_refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(dir = %dir.display(), "the engine cannot mount the file channel's directory (it does not see it): kernels are made without it and files go through the engine's exec streams");
                }
                spec.mounts.retain(|m| {
                    !matches!(m, Mount::Bind { target, .. } if target == files::SOCKET_DIR_IN_KERNEL)
                });
                sockets = None;
                created = engine.create_container(&spec).await;
            }
        }
        let created = created.map_err(KernelError::from);
        let id = match created {
            Ok(id) => id,
            Err(e) => {
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                return Err(e);
            }
        };
        let engine = engine.clone();
        let created = Created {
            id: id.clone(),
            volume: volume.clone(),
            spill_dir,
            sockets,
        };
        match Self::start(request, created).await {
            Ok(kernel) => Ok(kernel),
            Err(e) => {
                if let Err(err) = engine.remove_container(&id).await {
                    tracing::warn!(container = %id, error = %err, "cleanup after failed spawn");
                }
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                Err(e)
            }
        }
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
            ..
        } = request;
        let Created {
            id,
            volume,
            spill_dir,
            sockets,
        } = created;
        give_way(&yield_to).await?;
        let attached = engine.attach(&id).await?;
        let cancel = CancellationToken::new();
        let drain = CancellationToken::new();
        let breach = Breach::default();
        let (writer, writer_task) = Stdin::new(attached.input, cancel.clone(), breach.clone());
        let (tx, rx) = mpsc::channel(256);
        let shared = Arc::new(Shared::new());
        let kernel = Arc::new(Kernel {
            id: id.clone(),
            volume,
            owner: OnceLock::new(),
            created: SystemTime::now(),
            spill_dir,
            user: spec.sandbox.user.clone(),
            engine: engine.clone(),
            shared: shared.clone(),
            io: tokio::sync::Mutex::new(CellIo { rx }),
            writer: writer.clone(),
            next_cell: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            authority: Mutex::new(None),
            drain: drain.clone(),
            cancel: cancel.clone(),
            files: Arc::new(files::Resident::new(
                file_transfer.helper_idle,
                sockets,
                tracker.clone(),
                cancel.clone(),
            )),
        });
        tracker.spawn(writer_task);
        tracker.spawn(reader_task(ReaderTask {
            id: id.clone(),
            engine: engine.clone(),
            events: Events {
                tx,
                backlog: Arc::new(Semaphore::new(MAX_READER_BACKLOG)),
                breach: breach.clone(),
                drain: drain.clone(),
                cancel: cancel.clone(),
            },
            breach,
            output: attached.output,
            writer,
            shared,
            epoch: monitor.epoch(),
            monitor,
            cancel,
        }));
        give_way(&yield_to).await?;
        engine.start(&id).await?;
        let mut io = kernel.io.lock().await;
        let ready = tokio::time::timeout(spawn_timeout, async {
            loop {
                match io.rx.recv().await {
                    Some(IoEvent::Frame(KernelFrame::Ready { v, python }, _)) => {
                        return Ok((v, python));
                    }
                    Some(IoEvent::Closed) | None => {
                        return Err(KernelError::SpawnDied(
                            kernel
                                .death()
                                .map(|d| format!("{d:?}"))
                                .unwrap_or_else(|| "no output".into()),
                        ));
                    }
                    Some(_) => {}
                }
            }
        })
        .await
        .map_err(|_| KernelError::SpawnTimeout(spawn_timeout))??;
        drop(io);
        if ready.0 != PROTOCOL_VERSION {
            return Err(KernelError::Protocol(ready.0));
        }
        if let Some((key, _)) = owner {
            kernel.assign(&key.owner);
        }
        tracing::debug!(container = %kernel.short_id(), python = %ready.1, "kernel ready");
        kernel.shared.set_live(KernelState::Idle);
        Ok(kernel)
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
