//! Snapshots' kernel side (`docs/snapshots.md`): an idle kernel checkpointed with its
//! container left running (the hibernation's checkpoint, `hibernate.rs`, that no restore
//! consumes), and the checkpoint a fork's new container starts from.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::hibernate::Checkpoint;
use super::spawn::Created;
use super::{Kernel, KernelError};

impl Kernel {
    /// Checkpoints this idle kernel into `dir` and leaves its container running: the
    /// returned checkpoint's restore ([`Kernel::restore`]) only reconnects the runner, which
    /// waits for it. The kernel object is spent, as after a hibernation; on failure the caller
    /// disposes of the kernel.
    pub(crate) async fn snapshot(
        self: &Arc<Self>,
        limit: Duration,
        dir: &Path,
    ) -> Result<Checkpoint, KernelError> {
        self.checkpoint_as(limit, dir, false, true).await
    }
}

impl Checkpoint {
    /// The directory holding its files (`dir/name`).
    pub(crate) fn files(&self) -> PathBuf {
        self.dir.join(&self.name)
    }

    /// The engine's name for it (`kb-…`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The same checkpoint kept as a snapshot's: its files are (linked) under `dir/name`,
    /// no container of its own (a restore makes one: [`Checkpoint::forked`]).
    pub(crate) fn kept_in(&self, dir: &Path) -> Checkpoint {
        Checkpoint {
            dir: dir.to_path_buf(),
            lasting: false,
            running: false,
            ..self.clone()
        }
    }

    /// The checkpoint a fork starts from: the snapshot's, restored into `created` (a new
    /// container of the same spec, its own staging volume), its files linked under
    /// `dir/name` for the one start that consumes them. `from` is what the fork's first call
    /// is told (`restored.from`).
    pub(crate) fn forked(&self, created: &Created, dir: &Path, from: &str) -> Checkpoint {
        Checkpoint {
            id: created.id.clone(),
            volume: created.volume.clone(),
            files_volume: created.files_volume.clone(),
            spill_dir: created.spill_dir.clone(),
            sockets: created.sockets.clone(),
            dir: dir.to_path_buf(),
            lasting: false,
            running: false,
            from: from.to_string(),
            at: Instant::now(),
            ..self.clone()
        }
    }
}
