//! Migration on drain, a service of the orchestrator (`docs/cluster.md`, "Migration on
//! drain"): a draining cluster node moves its idle runsc kernels to other nodes instead of
//! ending them. The leaving node checkpoints a kernel (the snapshot's checkpoint,
//! `kernel/snapshot.rs`), streams it to the chosen node over the cluster's authenticated hop
//! (`server/cluster/migrate.rs`), and that node moves the session in the catalog (fenced by
//! both nodes' epochs) and seeds the checkpoint as the same generation of the key: the
//! owner's next call restores it there and is told `kernel.migrated {from_node}`. Any
//! failure leaves the kernel where it was, lost at the drain's deadline and told
//! `node_drained` as without migration.
//!
//! What it makes a node hold: at most [`MAX_INCOMING`] transfers received at once, each at
//! most the snapshots' host bound in bytes (`SnapshotConfig::max_bytes`, refused from the
//! manifest before a byte is written) and [`RECEIVE_DEADLINE`] long; the files on disk
//! under the snapshots' root (`.migrations/`), mode 0700, removed on any failure and at the
//! next start; a set of the sessions moving (at most the node's kernels).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Migrations`]: the sessions moving (their calls wait), the transfers received at once, the working directories, the counters; what a migrated kernel's first call is told |
//! | `transfer.rs` | a checkpoint on the wire: manifest, files, digest; sent and received streaming, bounded, verified |

mod transfer;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cell::{Migrated, Restored};
use crate::owner::KernelKey;

pub(crate) use transfer::{list_files, receive, send, Manifest};

/// Transfers a node receives at once; one more is refused (the sender leaves its kernel to
/// the drain's deadline).
pub const MAX_INCOMING: usize = 2;

/// How long receiving one checkpoint may take, at most.
pub const RECEIVE_DEADLINE: Duration = Duration::from_secs(60);

/// What begins `restored.from` of a migrated kernel's checkpoint: the node it left follows.
const MIGRATED_FROM: &str = "migrated:";

/// What a migration failed on.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The stream was malformed, cut, or its digest did not match.
    #[error("the checkpoint's transfer failed: {0}")]
    Transfer(String),
    /// The checkpoint is larger than the receiver keeps.
    #[error("the checkpoint is {bytes} bytes, more than the {max} this node receives")]
    TooLarge {
        /// Its bytes.
        bytes: u64,
        /// The bound.
        max: u64,
    },
    /// The receiver takes [`MAX_INCOMING`] transfers at once.
    #[error("this node receives {MAX_INCOMING} migrations at once: try another")]
    Busy,
    /// The session is moving already, or has a kernel on the receiver.
    #[error("session {session} is moving already or has a kernel here")]
    Conflict {
        /// The session.
        session: String,
    },
    /// The catalog refused the move: a node was fenced, or the session moved or ended.
    #[error(
        "the catalog refused the move (a node's epoch moved on, or the session moved or ended)"
    )]
    Refused,
    /// The catalog could not be reached.
    #[error("the catalog: {0}")]
    Catalog(String),
    /// The kernel could not be checkpointed (busy, gone, or the engine failed).
    #[error("checkpointing the kernel failed: {0}")]
    Checkpoint(String),
    /// A container for the arriving kernel could not be made.
    #[error("preparing the kernel's container failed: {0}")]
    Restore(String),
    /// The receiving node answered with an error or not at all.
    #[error("node {node:?} did not take the kernel: {why}")]
    Target {
        /// The receiving node.
        node: String,
        /// What it said or what failed.
        why: String,
    },
    /// The working directory could not be written.
    #[error("the migration's files: {0}")]
    Io(String),
}

/// The migration service (see the module documentation).
#[derive(Debug)]
pub(crate) struct Migrations {
    root: PathBuf,
    max_bytes: u64,
    incoming: Arc<tokio::sync::Semaphore>,
    /// (tenant, session) moving to or from this node: their calls here are told to retry.
    moving: Mutex<HashSet<(String, String)>>,
    /// Keys whose migration failed during this drain: not tried again (lost at the deadline).
    tried: Mutex<HashSet<KernelKey>>,
    /// A drain's pass over the kernels is running.
    pass: AtomicBool,
    counters: Counters,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
struct Counters {
    out: AtomicU64,
    arrived: AtomicU64,
    failed: AtomicU64,
}

/// A session marked moving; unmarked when dropped.
pub(crate) struct Moving<'a> {
    migrations: &'a Migrations,
    id: (String, String),
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        self.migrations.moving().remove(&self.id);
    }
}

/// A drain's pass; the next may start once dropped.
pub(crate) struct Pass<'a>(&'a Migrations);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.0.pass.store(false, Ordering::Release);
    }
}

impl Migrations {
    /// The service, its working directory `root` (cleared: what an earlier run left is no
    /// kernel's), receiving at most `max_bytes` per transfer.
    pub(crate) fn new(root: PathBuf, max_bytes: u64) -> Migrations {
        let _ = std::fs::remove_dir_all(&root);
        Migrations {
            root,
            max_bytes,
            incoming: Arc::new(tokio::sync::Semaphore::new(MAX_INCOMING)),
            moving: Mutex::new(HashSet::new()),
            tried: Mutex::new(HashSet::new()),
            pass: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    fn moving(&self) -> std::sync::MutexGuard<'_, HashSet<(String, String)>> {
        self.moving.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn tried(&self) -> std::sync::MutexGuard<'_, HashSet<KernelKey>> {
        self.tried.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The most bytes of one transfer this node receives.
    pub(crate) fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// True while `tenant`'s `session` moves to or from this node.
    pub(crate) fn is_moving(&self, tenant: &str, session: &str) -> bool {
        self.moving()
            .contains(&(tenant.to_string(), session.to_string()))
    }

    /// True while any session moves to or from this node.
    pub(crate) fn any_moving(&self) -> bool {
        !self.moving().is_empty()
    }

    /// Marks the session moving; `None` when it is already.
    pub(crate) fn begin_move(&self, tenant: &str, session: &str) -> Option<Moving<'_>> {
        let id = (tenant.to_string(), session.to_string());
        self.moving().insert(id.clone()).then_some(Moving {
            migrations: self,
            id,
        })
    }

    /// A permit to receive one transfer; `None` past [`MAX_INCOMING`].
    pub(crate) fn incoming(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.incoming.clone().try_acquire_owned().ok()
    }

    /// True when no drain's pass runs.
    pub(crate) fn pass_free(&self) -> bool {
        !self.pass.load(Ordering::Acquire)
    }

    /// Starts a drain's pass; `None` while one runs.
    pub(crate) fn begin_pass(&self) -> Option<Pass<'_>> {
        (!self.pass.swap(true, Ordering::AcqRel)).then_some(Pass(self))
    }

    /// True when `key`'s migration failed during this drain.
    pub(crate) fn was_tried(&self, key: &KernelKey) -> bool {
        self.tried().contains(key)
    }

    /// Records `key`'s failed migration (bounded by the node's kernels: one per key).
    pub(crate) fn failed(&self, key: &KernelKey) {
        self.counters.failed.fetch_add(1, Ordering::Relaxed);
        self.tried().insert(key.clone());
    }

    /// The drain ended: failed keys may be tried at the next.
    pub(crate) fn drain_over(&self) {
        self.tried().clear();
    }

    /// Counts a kernel moved away.
    pub(crate) fn moved_out(&self) {
        self.counters.out.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a kernel arrived.
    pub(crate) fn arrived(&self) {
        self.counters.arrived.fetch_add(1, Ordering::Relaxed);
    }

    /// A new working directory's path (not made): `out-…` for a leaving kernel's
    /// checkpoint, `in-…` for an arriving one. The root is made mode 0700.
    pub(crate) async fn fresh_dir(&self, prefix: &str) -> Result<PathBuf, MigrationError> {
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&root)?;
            std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o700))
        })
        .await
        .map_err(|e| MigrationError::Io(e.to_string()))?
        .map_err(|e| MigrationError::Io(e.to_string()))?;
        Ok(self
            .root
            .join(format!("{prefix}{:024x}", rand::random::<u128>() >> 32)))
    }

    /// Removes a working directory (idempotent); nothing outside the root.
    pub(crate) async fn remove_dir(&self, dir: &Path) {
        if dir.starts_with(&self.root) && dir != self.root {
            let dir = dir.to_path_buf();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        }
    }

    /// The service's lines of `/metrics`.
    pub(crate) fn render_metrics(&self, out: &mut String, node: &str) -> std::fmt::Result {
        use std::fmt::Write;
        let c = &self.counters;
        for (name, help, value) in [
            (
                "kernelbox_cluster_migrated_out_total",
                "Kernels a drain moved from this node to another.",
                &c.out,
            ),
            (
                "kernelbox_cluster_migrated_in_total",
                "Kernels moved to this node by another's drain.",
                &c.arrived,
            ),
            (
                "kernelbox_cluster_migration_failures_total",
                "Migrations from this node that failed (the kernel left to the drain's deadline).",
                &c.failed,
            ),
        ] {
            writeln!(out, "# HELP {name} {help}")?;
            writeln!(out, "# TYPE {name} counter")?;
            writeln!(
                out,
                "{name}{{node=\"{node}\"}} {}",
                value.load(Ordering::Relaxed)
            )?;
        }
        Ok(())
    }
}

/// `restored.from` of a checkpoint migrated from `node`.
pub(crate) fn restored_from(node: &str) -> String {
    format!("{MIGRATED_FROM}{node}")
}

/// A restored kernel's `restored` and, when it was migrated, `migrated {from_node}` (its
/// `restored.from` then says `migrated`).
pub fn split_restored(restored: Option<Restored>) -> (Option<Restored>, Option<Migrated>) {
    match restored {
        Some(r) if r.from.starts_with(MIGRATED_FROM) => {
            let from_node = r.from[MIGRATED_FROM.len()..].to_string();
            (
                Some(Restored {
                    from: "migrated".into(),
                    ..r
                }),
                Some(Migrated { from_node }),
            )
        }
        other => (other, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_migrated_checkpoint_says_where_it_came_from() {
        let restored = Restored {
            from: restored_from("n1"),
            checkpoint_seconds: 0.1,
            restore_seconds: 0.2,
        };
        let (restored, migrated) = split_restored(Some(restored));
        assert_eq!(restored.map(|r| r.from).as_deref(), Some("migrated"));
        assert_eq!(migrated.map(|m| m.from_node).as_deref(), Some("n1"));
        let idle = Restored {
            from: "idle".into(),
            checkpoint_seconds: 0.1,
            restore_seconds: 0.2,
        };
        assert_eq!(split_restored(Some(idle)).1, None);
    }
}
