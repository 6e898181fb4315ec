//! Hibernation (`docs/runtimes.md`, "Hibernation"): an idle kernel's processes checkpointed
//! by the engine, which stops the container and keeps it (with its staging volume) instead of
//! the kernel being removed; later the container is started again from its checkpoint, and
//! the runner, which waited on an abstract Unix socket, is handed the streams of a relay the
//! host starts by exec (`runner/resume_relay.py`) once the relay presented the secret part of
//! a token only the host and the runner knew (the socket's name, the other part, is visible to
//! the kernel's processes). The restored kernel is the same process: its variables, its
//! imports, its working directory; what it had open to the outside (the old channel, a file
//! helper) is gone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::task::TaskTracker;

use super::protocol::{HostFrame, KernelFrame, PROTOCOL_VERSION};
use super::spawn::Streams;
use super::{Death, IoEvent, Kernel, KernelError, KernelState};
use crate::config::WORK_DIR;
use crate::docker::monitor::EventMonitor;
use crate::docker::{Engine, ExecSpec};
use crate::owner::Owner;

/// The relay the host starts by exec in a restored kernel.
const RELAY_SOURCE: &str = include_str!("../../runner/resume_relay.py");

/// A hibernated kernel: its stopped container, what its object is rebuilt from, and what the
/// restore reports. Serialized in its record beside the checkpoint (`record.rs`), so it
/// survives a restart of the server.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub(crate) struct Checkpoint {
    /// The stopped container (full id).
    pub(crate) id: String,
    pub(crate) volume: String,
    /// The session's files volume at its `/work`, when it is not `volume` (`staging.rs`).
    #[serde(default)]
    pub(crate) files_volume: Option<String>,
    pub(super) spill_dir: String,
    pub(super) sockets: Option<std::path::PathBuf>,
    pub(super) user: String,
    /// The engine's name for the checkpoint (`kb-` and the token's first part).
    pub(super) name: String,
    /// The directory holding it (`dir/name`): the server's, mode 0700.
    pub(super) dir: std::path::PathBuf,
    /// Its size on disk.
    pub(crate) bytes: u64,
    /// Its first 16 characters name the socket the runner waits on; the relay presents the
    /// rest.
    pub(super) token: String,
    pub(super) execution_count: u64,
    pub(super) cells_begun: u64,
    /// How long the checkpoint took.
    pub(crate) checkpoint_seconds: f64,
    /// When it was taken, in this process's clock (set again from `taken` when a record is
    /// read back).
    #[serde(skip, default = "Instant::now")]
    pub(crate) at: Instant,
    /// When it was taken, in seconds since the Unix epoch.
    pub(super) taken: u64,
    /// Why it hibernated: `idle`, `evicted` or `restart` (told in `restored.from`).
    pub(crate) from: String,
    /// Its container was named hibernated (`labels::hibernated_name`): it outlives the
    /// server, and is named for the instance that restores it.
    #[serde(default)]
    pub(super) lasting: bool,
    /// Its container was left running (a snapshot's source, `docs/snapshots.md`): a restore
    /// only reconnects the runner, and its files are not the restore's to remove.
    #[serde(default)]
    pub(super) running: bool,
}

/// What [`Kernel::restore`] needs besides the checkpoint.
pub(crate) struct Restore<'a> {
    pub(crate) engine: &'a Arc<dyn Engine>,
    pub(crate) owner: &'a Owner,
    pub(crate) helper_idle: Duration,
    pub(crate) tracker: &'a TaskTracker,
    pub(crate) monitor: EventMonitor,
    /// How long the runner has to say ready once the container runs.
    pub(crate) limit: Duration,
    /// The instance restoring it (the container's name says so).
    pub(crate) instance: &'a crate::instance::Instance,
}

impl Kernel {
    /// Checkpoints this idle kernel and stops its container (kept, with its volume; named
    /// hibernated when `lasting`: it outlives the server). On
    /// success the kernel object is spent (dead as disposed of: its streams ended by design)
    /// and the returned checkpoint is what brings it back; on failure the caller disposes of
    /// the kernel. `limit` bounds the runner's answer; the engine's checkpoint takes what it
    /// takes (it writes the kernel's memory).
    pub(crate) async fn hibernate(
        self: &Arc<Self>,
        limit: Duration,
        dir: &std::path::Path,
        lasting: bool,
    ) -> Result<Checkpoint, KernelError> {
        self.checkpoint_as(limit, dir, lasting, false).await
    }

    /// [`Kernel::hibernate`], or, with `leave_running`, the same checkpoint with the container
    /// left running (a snapshot, `docs/snapshots.md`): its runner then waits for the relay a
    /// restore of the returned checkpoint starts ([`Checkpoint::running`]).
    pub(super) async fn checkpoint_as(
        self: &Arc<Self>,
        limit: Duration,
        dir: &std::path::Path,
        lasting: bool,
        leave_running: bool,
    ) -> Result<Checkpoint, KernelError> {
        let lasting = lasting && !leave_running;
        let fail = |why: String| KernelError::Hibernate(why);
        let mut io = self.io.lock().await;
        if self.state() != KernelState::Idle || self.workspace.is_some() {
            return Err(fail("the kernel is not idle".into()));
        }
        // The first 16 characters name the runner's socket, the other 32 are the secret.
        if !self.files.end_idle().await {
            return Err(fail("a file transfer is under way".into()));
        }
        let token = format!(
            "{:016x}{:032x}",
            rand::rng().random::<u64>(),
            rand::rng().random::<u128>()
        );
        self.shared.hibernating.store(true, Ordering::Release);
        self.writer.send(
            HostFrame::Hibernate {
                token: &token,
                staging: super::spawn::staging_root(&self.spill_dir),
            }
            .to_line(),
        );
        let answer = tokio::time::timeout(limit, async {
            loop {
                match io.rx.recv().await {
                    Some(IoEvent::Frame(KernelFrame::Hibernating { ok, error }, _)) => {
                        return Ok((ok, error));
                    }
                    Some(IoEvent::Closed) | None => return Err("the kernel went".to_string()),
                    Some(_) => {}
                }
            }
        })
        .await
        .map_err(|_| fail(format!("the runner did not answer within {limit:?}")));
        self.shared.hibernating.store(false, Ordering::Release);
        let answer = answer?.map_err(fail)?;
        match answer {
            (true, _) => {}
            (false, error) => return Err(fail(error.unwrap_or_else(|| "refused".into()))),
        }
        // The streams end with the checkpoint: that is no death to report.
        self.shared.die(Death::Disposed);
        self.drain.cancel();
        let name = format!("kb-{}", &token[..16]);
        let started = Instant::now();
        let checkpointed = if leave_running {
            self.engine.checkpoint_running(&self.id, &name, dir).await
        } else {
            self.engine.checkpoint(&self.id, &name, dir).await
        };
        let checkpoint_seconds = started.elapsed().as_secs_f64();
        self.cancel.cancel();
        // When it outlives the server, its name tells every sweep, of any instance, to leave
        // it (`labels::hibernated_name`); otherwise it goes with the server as before.
        let taken = crate::clock::unix_now();
        let renamed = match (&checkpointed, self.owner()) {
            (Ok(()), Some(owner)) if lasting => {
                let hibernated = crate::labels::hibernated_name(
                    taken,
                    &owner.tenant,
                    &owner.to_string(),
                    self.short_id(),
                );
                self.engine.rename_container(&self.id, &hibernated).await
            }
            _ => Ok(()),
        };
        if let Err(e) = checkpointed.and(renamed) {
            remove_files(dir.join(&name)).await;
            return Err(fail(e.to_string()));
        }
        let bytes = size_of(dir.join(&name)).await;
        Ok(Checkpoint {
            dir: dir.to_path_buf(),
            bytes,
            id: self.id.clone(),
            volume: self.volume.clone(),
            files_volume: self.files_volume.clone(),
            spill_dir: self.spill_dir.clone(),
            sockets: self.files.sockets(),
            user: self.user.clone(),
            name,
            token,
            execution_count: self.execution_count(),
            cells_begun: self.cells_begun(),
            checkpoint_seconds,
            at: Instant::now(),
            taken,
            from: "idle".into(),
            lasting,
            running: leave_running,
        })
    }

    /// Starts the checkpoint's container again and reconnects its runner: the kernel as it
    /// was, owned by `owner`. On failure the caller removes the container and its volume
    /// ([`Checkpoint::discard`]).
    pub(crate) async fn restore(
        checkpoint: &Checkpoint,
        restore: Restore<'_>,
    ) -> Result<Arc<Kernel>, KernelError> {
        let engine = restore.engine;
        let started = Instant::now();
        // One that outlives the server may carry an earlier run's labels: its name says whose
        // it is now (`labels::run_by_name`), for every sweep and this instance's watchdog.
        if checkpoint.lasting {
            let me = restore.instance;
            let name = crate::labels::run_by_name(
                &me.id,
                me.pid,
                me.pid_start,
                &restore.owner.tenant,
                &restore.owner.to_string(),
                crate::docker::short_id(&checkpoint.id),
            );
            engine.rename_container(&checkpoint.id, &name).await?;
        }
        if !checkpoint.running {
            engine
                .start_from_checkpoint(&checkpoint.id, &checkpoint.name, &checkpoint.dir)
                .await?;
            // The engine holds its own copy now: the memory image does not stay twice on
            // disk, and the record goes with it.
            remove_files(checkpoint.dir.join(&checkpoint.name)).await;
            checkpoint.remove_record().await;
        }
        let relay = ExecSpec {
            cmd: ["python3", "-I", "-S", "-c", RELAY_SOURCE]
                .map(String::from)
                .to_vec(),
            user: checkpoint.user.clone(),
            working_dir: WORK_DIR.into(),
            env: Vec::new(),
        };
        let attached = engine.exec(&checkpoint.id, &relay).await?;
        let kernel = Kernel::on_streams(
            Streams {
                engine,
                id: checkpoint.id.clone(),
                volume: checkpoint.volume.clone(),
                spill_dir: checkpoint.spill_dir.clone(),
                sockets: checkpoint.sockets.clone(),
                workspace: None,
                files_volume: checkpoint.files_volume.clone(),
                user: checkpoint.user.clone(),
                helper_idle: restore.helper_idle,
                tracker: restore.tracker,
                monitor: restore.monitor,
            },
            attached,
        );
        kernel
            .writer
            .send(format!("{}\n", checkpoint.token).into_bytes());
        let (v, _) = kernel.wait_ready(restore.limit).await?;
        if v != PROTOCOL_VERSION {
            return Err(KernelError::Protocol(v));
        }
        kernel
            .execution_count
            .store(checkpoint.execution_count, Ordering::Release);
        kernel
            .next_cell
            .store(checkpoint.cells_begun, Ordering::Release);
        kernel.assign(restore.owner);
        kernel.shared.set_live(KernelState::Idle);
        *kernel.restored.lock().unwrap_or_else(|p| p.into_inner()) = Some(crate::cell::Restored {
            from: checkpoint.from.clone(),
            checkpoint_seconds: checkpoint.checkpoint_seconds,
            restore_seconds: started.elapsed().as_secs_f64(),
        });
        Ok(kernel)
    }
}

impl Kernel {
    /// How it came back from hibernation: told once, to the first call after.
    pub(crate) fn take_restored(&self) -> Option<crate::cell::Restored> {
        self.restored
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Checkpoint {
    /// Removes the hibernated container and its staging volume (its checkpoint goes with the
    /// container). Idempotent.
    pub(crate) async fn discard(&self, engine: &dyn Engine) {
        if let Err(e) = engine.remove_container(&self.id).await {
            tracing::warn!(container = %crate::docker::short_id(&self.id), error = %e, "removing a hibernated kernel");
        }
        match &self.files_volume {
            Some(files) => {
                let _ = crate::docker::remove_volume_when_free(engine, &self.volume).await;
                let _ = super::staging::release_files(engine, files).await;
            }
            None => {
                let _ = super::staging::release_files(engine, &self.volume).await;
            }
        }
        if !self.running {
            remove_files(self.dir.join(&self.name)).await;
            self.remove_record().await;
        }
    }
}

/// Removes a checkpoint's directory, if it is there.
pub(super) async fn remove_files(path: std::path::PathBuf) {
    let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(path)).await;
}

/// Bytes of the files in a checkpoint's directory.
async fn size_of(path: std::path::PathBuf) -> u64 {
    tokio::task::spawn_blocking(move || {
        std::fs::read_dir(path)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok()?.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    })
    .await
    .unwrap_or(0)
}
