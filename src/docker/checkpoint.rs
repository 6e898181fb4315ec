//! Checkpoints on the real daemon (`docs/runtimes.md`, "Hibernation"): a running container's
//! processes written to a directory and the container stopped, and a stopped container
//! started again from such a directory (Docker 20.10 restores only from the container's own
//! store: the files are placed there first).

use super::bollard_engine::{map_err, BollardEngine};
use super::EngineError;

impl BollardEngine {
    /// Checkpoints container `id` into its own store and stops it
    /// ([`Engine::checkpoint`](super::Engine::checkpoint)).
    pub(super) async fn checkpoint_into(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        self.create_checkpoint(id, name, dir, true).await
    }

    /// Checkpoints container `id` into `dir/name` and leaves it running
    /// ([`Engine::checkpoint_running`](super::Engine::checkpoint_running)): under gVisor the
    /// sandbox is paused for the checkpoint only (`docs/snapshots.md`).
    pub(super) async fn checkpoint_leaving_running(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        self.create_checkpoint(id, name, dir, false).await
    }

    async fn create_checkpoint(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
        exit: bool,
    ) -> Result<(), EngineError> {
        let options = bollard::container::CreateCheckpointOptions {
            checkpoint_id: name.to_string(),
            checkpoint_dir: Some(dir.to_string_lossy().into_owned()),
            exit,
        };
        let op = if exit { "checkpoint" } else { "snapshot" };
        self.docker
            .create_checkpoint(id, options)
            .await
            .map_err(|e| map_err(op, id, e))
    }

    /// Starts container `id` again from a checkpoint placed in its store
    /// ([`Engine::start_from_checkpoint`](super::Engine::start_from_checkpoint)).
    pub(super) async fn start_checkpointed(
        &self,
        id: &str,
        name: &str,
        dir: &std::path::Path,
    ) -> Result<(), EngineError> {
        // bollard's start options carry no `checkpoint` parameter: it rides in the path, after
        // the id, where the engine reads it as the query (the `&_=` takes bollard's `/start`
        // suffix as an ignored parameter). Both are checked to be plain names first.
        let plain = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !plain(id) || !plain(name) {
            return Err(EngineError::Other {
                op: "restore",
                target: id.to_string(),
                message: format!("not a plain container or checkpoint name: {name}"),
            });
        }
        // Docker 20.10 restores only from the container's own checkpoint store (it refuses a
        // custom directory on start): the files are linked (or copied) there first, which needs
        // the engine's data root on this host.
        let root = self
            .docker
            .info()
            .await
            .map_err(|e| map_err("restore", id, e))?
            .docker_root_dir
            .ok_or_else(|| EngineError::Other {
                op: "restore",
                target: id.to_string(),
                message: "the engine did not say where its data root is".into(),
            })?;
        let from = dir.join(name);
        let into = std::path::Path::new(&root)
            .join("containers")
            .join(id)
            .join("checkpoints")
            .join(name);
        let into_dir = into.clone();
        let placed = tokio::task::spawn_blocking(move || place_checkpoint(&from, &into))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))
            .and_then(|r| r);
        placed.map_err(|e| EngineError::Other {
            op: "restore",
            target: id.to_string(),
            message: format!("placing the checkpoint in the engine's data root: {e}"),
        })?;
        let started = self
            .docker
            .start_container(&format!("{id}/start?checkpoint={name}&_="), None)
            .await
            .map_err(|e| map_err("restore", id, e));
        // The engine's copy served its one start: a memory image does not stay on disk for
        // the kernel's life.
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(into_dir)).await;
        started
    }
}

/// Links (or, across file systems, copies) the files of checkpoint directory `from` into
/// `into`, with a file of its own: the engine uploads the directory to containerd's content
/// store at the start, and refuses ("already exists") content containerd still holds from the
/// checkpoint's creation, so the upload must differ from it.
fn place_checkpoint(from: &std::path::Path, into: &std::path::Path) -> std::io::Result<()> {
    std::fs::create_dir_all(into)?;
    let nonce: u128 = rand::random();
    std::fs::write(into.join("kernelbox-restore"), format!("{nonce:032x}\n"))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let target = into.join(entry.file_name());
        let _ = std::fs::remove_file(&target);
        if std::fs::hard_link(entry.path(), &target).is_err() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
