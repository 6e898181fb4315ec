//! Snapshots, a service of the orchestrator (`docs/snapshots.md`): a session's kernel
//! checkpointed into a snapshot that no restore consumes, kept past the kernel and a restart
//! of the server, the tenant's only, bounded per tenant and on the host and by age; and the
//! files a fork's restore consumes, linked from a snapshot's. The checkpoints themselves are
//! the hibernation's (`kernel/hibernate.rs`, `kernel/snapshot.rs`); the orchestrator takes the
//! kernel and restores the forks (`orchestrator/snapshots.rs`).
//!
//! What one snapshot makes the host hold: a directory with the kernel's memory image (about
//! the kernel's resident memory, on disk) and a record of a few kilobytes; an entry of a few
//! hundred bytes in memory. Bounded by [`SnapshotConfig`]: per tenant (count, bytes), the
//! host's bytes, and the age.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Snapshots`]: made (reserved, committed under the bounds), listed, found, deleted, expired, loaded at start; a fork's files |
//! | `store.rs` | the snapshots on disk: each one's directory and record, made by rename, read back at start |

mod store;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::config::SnapshotConfig;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;

pub(crate) use store::Stored;

/// What a snapshot call failed on.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// No snapshot of this id is the tenant's.
    #[error("no snapshot {id}")]
    NotFound {
        /// The id asked for.
        id: String,
    },
    /// The tenant keeps as many snapshots, or bytes of them, as it may.
    #[error("snapshot limit reached: {what}")]
    Limit {
        /// Which bound, and its value.
        what: String,
    },
    /// The session has no kernel to snapshot.
    #[error("session {session} has no kernel to snapshot")]
    NoKernel {
        /// The session.
        session: String,
    },
    /// The session's kernel is running a cell (or computing): it is snapshotted idle only.
    #[error("session {session} is busy: a kernel is snapshotted between cells")]
    Busy {
        /// The session.
        session: String,
    },
    /// The kernel's runtime cannot checkpoint its memory.
    #[error("snapshots of {runtime} kernels are not supported: the engine checkpoints runsc kernels only (docs/snapshots.md)")]
    Unsupported {
        /// The runtime.
        runtime: String,
    },
    /// A fork or restore names a session that has a kernel already.
    #[error("session {session} already has a kernel: a snapshot is restored into a new session")]
    SessionExists {
        /// The session.
        session: String,
    },
    /// The request itself is wrong (a bad name, too many forks).
    #[error("{0}")]
    Invalid(String),
    /// Checkpointing the kernel failed: it is kept as it was when it could be.
    #[error("snapshotting the kernel failed: {0}")]
    Checkpoint(String),
    /// Restoring the snapshot into a new kernel failed: nothing of it is left.
    #[error("restoring the snapshot failed: {0}")]
    Restore(String),
    /// Admission refused the new kernel, or the server is stopping.
    #[error(transparent)]
    Execute(#[from] Box<crate::orchestrator::ExecuteError>),
    /// The snapshots' directory could not be written or read.
    #[error("the snapshots' store failed: {0}")]
    Store(String),
}

impl From<std::io::Error> for SnapshotError {
    fn from(e: std::io::Error) -> Self {
        SnapshotError::Store(e.to_string())
    }
}

/// A snapshot being made: its directory (`.partial-<id>`), removed unless committed.
pub(crate) struct Reservation {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    tenant: String,
}

/// The snapshots service.
pub(crate) struct Snapshots {
    config: SnapshotConfig,
    root: PathBuf,
    /// Snapshots outlive this run (`SnapshotConfig::location`).
    lasting: bool,
    /// Every whole snapshot, by id.
    index: Mutex<HashMap<String, Stored>>,
    /// Snapshots being made, by tenant: counted by the bounds.
    reserved: Mutex<HashMap<String, usize>>,
}

impl Snapshots {
    pub(crate) fn new(config: &SnapshotConfig, state_dir: Option<&Path>, instance: &str) -> Self {
        let (root, lasting) = config.location(state_dir, instance);
        Snapshots {
            config: config.clone(),
            root,
            lasting,
            index: Mutex::new(HashMap::new()),
            reserved: Mutex::new(HashMap::new()),
        }
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, Stored>> {
        self.index.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn reserved(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        self.reserved.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reads the snapshots an earlier run left (clearing half-made ones and forks' leftovers)
    /// and removes those past their age. Returns how many are kept.
    pub(crate) async fn load(&self) -> usize {
        let root = self.root.clone();
        let lasting = self.lasting;
        let found = tokio::task::spawn_blocking(move || {
            if !lasting {
                let _ = std::fs::remove_dir_all(&root);
            }
            store::read_all(&root)
        })
        .await
        .unwrap_or_default();
        {
            let mut index = self.index();
            for stored in found {
                index.insert(stored.id.clone(), stored);
            }
        }
        self.expire().await;
        self.index().len()
    }

    /// Begins a snapshot of `tenant`'s: refused past the tenant's count.
    pub(crate) async fn reserve(&self, tenant: &str) -> Result<Reservation, SnapshotError> {
        {
            let index = self.index();
            let mut reserved = self.reserved();
            let kept = index
                .values()
                .filter(|s| s.key.owner.tenant == tenant)
                .count();
            let making = reserved.get(tenant).copied().unwrap_or(0);
            if kept + making >= self.config.max_per_tenant {
                return Err(SnapshotError::Limit {
                    what: format!(
                        "a tenant keeps at most {} snapshots (delete one first)",
                        self.config.max_per_tenant
                    ),
                });
            }
            *reserved.entry(tenant.to_string()).or_insert(0) += 1;
        }
        let (id, _) = store::fresh(&self.root, "snap-");
        let dir = self.root.join(format!("{}{id}", store::PARTIAL));
        let reservation = Reservation {
            id,
            dir,
            tenant: tenant.to_string(),
        };
        let (root, dir) = (self.root.clone(), reservation.dir.clone());
        let made = tokio::task::spawn_blocking(move || {
            store::private_dir(&root)?;
            store::private_dir(&dir)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))
        .and_then(|r| r);
        if let Err(e) = made {
            self.abort(reservation).await;
            return Err(e.into());
        }
        Ok(reservation)
    }

    /// Gives up a reservation: its directory goes.
    pub(crate) async fn abort(&self, reservation: Reservation) {
        self.unreserve(&reservation.tenant);
        let dir = reservation.dir;
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }

    fn unreserve(&self, tenant: &str) {
        let mut reserved = self.reserved();
        if let Some(n) = reserved.get_mut(tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                reserved.remove(tenant);
            }
        }
    }

    /// Keeps the checkpoint written (or linked) under the reservation's directory as the
    /// snapshot of `key`'s kernel: refused, and removed, past the byte bounds.
    pub(crate) async fn commit(
        &self,
        reservation: Reservation,
        key: &KernelKey,
        name: Option<String>,
        checkpoint: &Checkpoint,
    ) -> Result<Stored, SnapshotError> {
        let partial = reservation.dir.clone();
        let bytes = {
            let dir = partial.clone();
            tokio::task::spawn_blocking(move || store::size_of(&dir))
                .await
                .unwrap_or(0)
        };
        let refused = {
            let index = self.index();
            let tenant: u64 = index
                .values()
                .filter(|s| s.key.owner.tenant == key.owner.tenant)
                .map(|s| s.bytes)
                .sum();
            let host: u64 = index.values().map(|s| s.bytes).sum();
            if tenant + bytes > self.config.max_tenant_bytes {
                Some(format!(
                    "a tenant keeps at most {} bytes of snapshots; this one is {bytes}",
                    self.config.max_tenant_bytes
                ))
            } else if host + bytes > self.config.max_bytes {
                Some(format!(
                    "the host keeps at most {} bytes of snapshots",
                    self.config.max_bytes
                ))
            } else {
                None
            }
        };
        if let Some(what) = refused {
            self.abort(reservation).await;
            return Err(SnapshotError::Limit { what });
        }
        let whole = self.root.join(&reservation.id);
        let stored = Stored::new(
            reservation.id.clone(),
            key.clone(),
            name,
            checkpoint.kept_in(&whole),
            bytes,
        );
        let written = {
            let (stored, partial, whole) = (stored.clone(), partial.clone(), whole.clone());
            tokio::task::spawn_blocking(move || store::commit(&stored, &partial, &whole))
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r)
        };
        if let Err(e) = written {
            self.abort(reservation).await;
            return Err(e.into());
        }
        self.unreserve(&reservation.tenant);
        self.index().insert(stored.id.clone(), stored.clone());
        Ok(stored)
    }

    /// `tenant`'s snapshots, oldest first.
    pub(crate) fn list(&self, tenant: &str) -> Vec<Stored> {
        let mut mine: Vec<Stored> = self
            .index()
            .values()
            .filter(|s| s.key.owner.tenant == tenant)
            .cloned()
            .collect();
        mine.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        mine
    }

    /// `tenant`'s snapshot `id` (another tenant's is not found).
    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<Stored, SnapshotError> {
        self.index()
            .get(id)
            .filter(|s| s.key.owner.tenant == tenant)
            .cloned()
            .ok_or_else(|| SnapshotError::NotFound { id: id.to_string() })
    }

    /// Deletes `tenant`'s snapshot `id` and its files.
    pub(crate) async fn delete(&self, tenant: &str, id: &str) -> Result<(), SnapshotError> {
        let removed = {
            let mut index = self.index();
            match index.get(id) {
                Some(s) if s.key.owner.tenant == tenant => index.remove(id),
                _ => None,
            }
        };
        let Some(stored) = removed else {
            return Err(SnapshotError::NotFound { id: id.to_string() });
        };
        self.remove_files(&stored).await;
        Ok(())
    }

    async fn remove_files(&self, stored: &Stored) {
        let dir = self.root.join(&stored.id);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }

    /// Removes the snapshots past their age.
    pub(crate) async fn expire(&self) {
        let now = crate::clock::unix_now();
        let ttl = self.config.ttl.as_secs();
        let old: Vec<Stored> = {
            let mut index = self.index();
            let ids: Vec<String> = index
                .values()
                .filter(|s| now.saturating_sub(s.created) >= ttl)
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| index.remove(id)).collect()
        };
        for stored in &old {
            self.remove_files(stored).await;
        }
        if !old.is_empty() {
            tracing::info!(snapshots = old.len(), "expired snapshots removed");
        }
    }

    /// Links `checkpoint`'s files (a snapshot's) under a new directory of the root, for one
    /// fork's restore to consume: returns that directory (the checkpoint's `dir` for the
    /// fork), which [`Snapshots::fork_done`] removes.
    pub(crate) async fn fork_files(
        &self,
        checkpoint: &Checkpoint,
    ) -> Result<PathBuf, SnapshotError> {
        let (_, dir) = store::fresh(&self.root, store::FORK);
        let (from, into) = (checkpoint.files(), dir.join(checkpoint.name()));
        let root = self.root.clone();
        tokio::task::spawn_blocking(move || {
            store::private_dir(&root)?;
            store::link_files(&from, &into)
        })
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))??;
        Ok(dir)
    }

    /// Removes a fork's directory ([`Snapshots::fork_files`]) once its restore is over.
    pub(crate) async fn fork_done(&self, dir: PathBuf) {
        if dir.starts_with(&self.root) {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        }
    }

    /// Links the files of a hibernated kernel's checkpoint into a reservation's directory.
    pub(crate) async fn link_into(
        &self,
        checkpoint: &Checkpoint,
        reservation: &Reservation,
    ) -> Result<(), SnapshotError> {
        let (from, into) = (checkpoint.files(), reservation.dir.join(checkpoint.name()));
        tokio::task::spawn_blocking(move || store::link_files(&from, &into))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))??;
        Ok(())
    }
}
