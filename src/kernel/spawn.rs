//! Spawning a kernel: its staging volume and container are created, attached before start
//! (so nothing the runner writes is missed), started, and the runner's `ready` awaited. On any
//! failure nothing is left behind.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

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
use crate::config::{Config, WorkMode};
use crate::docker::{remove_volume_when_free, ContainerSpec, Engine, Mount, TmpfsVolume};
use crate::monitor::EventMonitor;
use crate::owner::KernelKey;

/// What a new kernel is made from.
pub struct SpawnRequest<'a> {
    /// The engine to run it on.
    pub engine: Arc<dyn Engine>,
    /// Sandbox, image-independent limits and the spawn timeout.
    pub config: &'a Config,
    /// The instance's labels, put on the container and its volume.
    pub base_labels: &'a BTreeMap<String, String>,
    /// The key it will serve and which kernel of the key it is; `None` for a kernel made for
    /// the warm pool, which carries no owner until one takes it ([`Kernel::assign`]).
    pub owner: Option<(KernelKey, u64)>,
    /// The engine's event stream, to tell deaths apart.
    pub monitor: EventMonitor,
    /// Owns the kernel's reader and stdin tasks.
    pub tracker: &'a TaskTracker,
}

/// A created, not yet started, container.
struct Created {
    id: String,
    volume: String,
    spill_dir: String,
}

impl Kernel {
    /// Creates, attaches and starts a kernel container, and waits for the runner to be ready.
    /// On any failure nothing is left behind.
    pub async fn spawn(request: SpawnRequest<'_>) -> Result<Arc<Kernel>, KernelError> {
        let SpawnRequest {
            engine,
            config,
            base_labels,
            owner,
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
        let mut spec = config.kernel_spec();
        if let Some((key, _)) = owner {
            spec.image = key.image.clone();
        }
        let tmpfs = config.sandbox.work_bytes.map(|size_bytes| {
            let (uid, gid) = parse_user(&config.sandbox.user);
            TmpfsVolume {
                size_bytes,
                uid,
                gid,
            }
        });
        engine.create_volume(&volume, &labels, tmpfs).await?;
        labels.insert(crate::labels::ROLE.into(), "kernel".into());
        labels.insert(crate::labels::VOLUME.into(), volume.clone());
        labels.insert(
            crate::labels::MEMORY.into(),
            config.sandbox.memory_bytes.to_string(),
        );
        let (mounts, spill_dir) = match &spec.mode {
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
                    },
                ],
                STAGING_DIR_PROJECT.to_string(),
            ),
        };
        let status_path = format!("{spill_dir}/status");
        labels.insert(crate::labels::STATUS.into(), status_path.clone());
        let spec = ContainerSpec {
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
            user: config.sandbox.user.clone(),
            working_dir: WORK_DIR.into(),
            labels,
            mounts,
            sandbox: config.sandbox.clone(),
        };
        let id = match engine.create_container(&spec).await {
            Ok(id) => id,
            Err(e) => {
                let _ = remove_volume_when_free(engine.as_ref(), &volume).await;
                return Err(e.into());
            }
        };
        let engine = engine.clone();
        let created = Created {
            id: id.clone(),
            volume: volume.clone(),
            spill_dir,
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
            config,
            owner,
            monitor,
            tracker,
            ..
        } = request;
        let Created {
            id,
            volume,
            spill_dir,
        } = created;
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
            user: config.sandbox.user.clone(),
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
                config.file_helper_idle,
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
        engine.start(&id).await?;
        let mut io = kernel.io.lock().await;
        let ready = tokio::time::timeout(config.spawn_timeout, async {
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
        .map_err(|_| KernelError::SpawnTimeout(config.spawn_timeout))??;
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
