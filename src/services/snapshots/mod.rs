//! Snapshots, a service of the orchestrator (`docs/snapshots.md`): a session's kernel
//! snapshotted (under runsc checkpointed, its memory with it; under runc its working
//! directory's files only, `memory: false`) into a snapshot that no restore consumes, kept
//! past the kernel and a restart of the server, the tenant's only, bounded per tenant and on
//! the host and by age; restored into new sessions; forked. The checkpoints themselves are
//! the hibernation's (`kernel/hibernate.rs`, `kernel/snapshot.rs`). The orchestrator owns the
//! service and calls it with the resolved kernel keys and its kernel starts as a handle
//! (`kernels.rs`); it never calls the orchestrator by name.
//!
//! What one snapshot makes the host hold: a directory with the kernel's memory image (about
//! the kernel's resident memory, on disk) or its working directory's tar, and a record of a
//! few kilobytes; an entry of a few hundred bytes in memory. Bounded by [`SnapshotConfig`]:
//! per tenant (count, bytes), the host's bytes, and the age; the snapshots and forks' checkpoints
//! being made count with the kept ones, in the same step as each check.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Snapshots`]: the bounds' books (reserved, held, committed), listed, found, deleted, expired, loaded at start; a fork's files |
//! | `kernels.rs` | what it works with: the handles given at start, and the orchestrator's kernel starts handed in with each call |
//! | `take.rs` | a session's kernel taken into a reservation: waited for until idle, checkpointed left running and reconnected (or a hibernated one's checkpoint linked) |
//! | `files_only.rs` | a runc kernel's working directory as a tar (`memory: false`), and its restore into a fresh kernel |
//! | `restore.rs` | the entry points: a snapshot kept, restored, a fork |
//! | `store.rs` | the snapshots on disk: each one's directory and record, made by rename, read back at start |

mod files_only;
mod kernels;
mod restore;
mod store;
mod take;

use crate::config::SnapshotConfig;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub(crate) use kernels::{Handles, Held, SnapshotKernels};
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
    /// The session's kernel stayed busy (a cell running, or computing) for as long as a
    /// snapshot waits for it ([`SNAPSHOT_BUSY_WAIT`](crate::config::SNAPSHOT_BUSY_WAIT)): it is snapshotted between cells only.
    #[error("session {session} stayed busy for {waited:?}: a kernel is snapshotted between cells")]
    Busy {
        /// The session.
        session: String,
        /// How long the snapshot waited for the kernel.
        waited: std::time::Duration,
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
    /// Checkpointing the kernel (or reading its files) failed: it is kept as it was when it
    /// could be.
    #[error("snapshotting the kernel failed: {0}")]
    Checkpoint(String),
    /// Restoring the snapshot into a new kernel failed: nothing of it is left.
    #[error("restoring the snapshot failed: {0}")]
    Restore(String),
    /// The orchestrator refused the kernel (admission at a cap, a bad name, the server
    /// stopping): its error, and the stable code the rest of the API answers it with.
    #[error("{source}")]
    Refused {
        /// The code (`at_capacity`, `invalid_name`, `shutting_down`, ...).
        code: &'static str,
        /// The orchestrator's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The snapshots' directory could not be written or read.
    #[error("the snapshots' store failed: {0}")]
    Store(String),
}

impl SnapshotError {
    /// The error's stable code in an answer (`docs/snapshots.md`).
    pub fn code(&self) -> &'static str {
        match self {
            SnapshotError::NotFound { .. } => "snapshot_not_found",
            SnapshotError::Limit { .. } => "snapshot_limit",
            SnapshotError::NoKernel { .. } => "no_kernel",
            SnapshotError::Busy { .. } => "session_busy",
            SnapshotError::SessionExists { .. } => "session_exists",
            SnapshotError::Invalid(_) => "invalid_request",
            SnapshotError::Checkpoint(_) => "snapshot_failed",
            SnapshotError::Restore(_) => "restore_failed",
            SnapshotError::Refused { code, .. } => code,
            SnapshotError::Store(_) => "snapshot_store",
        }
    }
}

impl From<std::io::Error> for SnapshotError {
    fn from(e: std::io::Error) -> Self {
        SnapshotError::Store(e.to_string())
    }
}

/// A snapshot being made (or a fork's checkpoint): its directory (`.partial-<id>`), removed
/// unless committed; counted by the bounds, with its bytes once held ([`Snapshots::hold`]).
pub(crate) struct Reservation {
    pub(crate) id: String,
    pub(crate) dir: PathBuf,
    tenant: String,
    /// Bytes of it counted among the tenant's (and the host's) being made.
    held: u64,
}

/// Snapshots and forks' checkpoints being made by one tenant: counted by the bounds with
/// the kept ones, so concurrent ones never pass them together.
#[derive(Debug, Default, Clone, Copy)]
struct Making {
    count: usize,
    bytes: u64,
}

/// What the bounds count, under one lock: a check and the count it passes are one step.
#[derive(Default)]
struct Books {
    /// Every whole snapshot, by id.
    index: HashMap<String, Stored>,
    /// Being made, by tenant.
    making: HashMap<String, Making>,
}

impl Books {
    /// Bytes of `tenant`'s snapshots, kept and being made.
    fn tenant_bytes(&self, tenant: &str) -> u64 {
        let kept: u64 = self
            .index
            .values()
            .filter(|s| s.key.owner.tenant == tenant)
            .map(|s| s.bytes)
            .sum();
        kept + self.making.get(tenant).map_or(0, |m| m.bytes)
    }

    /// Bytes of every snapshot on the host, kept and being made.
    fn host_bytes(&self) -> u64 {
        self.index.values().map(|s| s.bytes).sum::<u64>()
            + self.making.values().map(|m| m.bytes).sum::<u64>()
    }

    /// Gives back what `reservation` counted.
    fn unreserve(&mut self, reservation: &Reservation) {
        if let Some(m) = self.making.get_mut(&reservation.tenant) {
            m.count = m.count.saturating_sub(1);
            m.bytes = m.bytes.saturating_sub(reservation.held);
            if m.count == 0 {
                self.making.remove(&reservation.tenant);
            }
        }
    }
}

/// The snapshots service.
pub(crate) struct Snapshots {
    config: SnapshotConfig,
    root: PathBuf,
    /// Snapshots outlive this run (`SnapshotConfig::location`).
    lasting: bool,
    books: Mutex<Books>,
    /// What it works with, given at start (`kernels.rs`).
    handles: Handles,
}

impl Snapshots {
    pub(crate) fn new(
        config: &SnapshotConfig,
        state_dir: Option<&Path>,
        instance: &str,
        handles: Handles,
    ) -> Self {
        let (root, lasting) = config.location(state_dir, instance);
        Snapshots {
            config: config.clone(),
            root,
            lasting,
            books: Mutex::new(Books::default()),
            handles,
        }
    }

    fn books(&self) -> std::sync::MutexGuard<'_, Books> {
        self.books.lock().unwrap_or_else(|p| p.into_inner())
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
            let mut books = self.books();
            for stored in found {
                books.index.insert(stored.id.clone(), stored);
            }
        }
        self.expire().await;
        self.books().index.len()
    }

    /// Begins a snapshot of `tenant`'s (or a fork's checkpoint): refused past the tenant's
    /// count, those being made counted.
    pub(crate) async fn reserve(&self, tenant: &str) -> Result<Reservation, SnapshotError> {
        {
            let mut books = self.books();
            let kept = books
                .index
                .values()
                .filter(|s| s.key.owner.tenant == tenant)
                .count();
            let making = books.making.get(tenant).map_or(0, |m| m.count);
            if kept + making >= self.config.max_per_tenant {
                return Err(SnapshotError::Limit {
                    what: format!(
                        "a tenant keeps at most {} snapshots (delete one first)",
                        self.config.max_per_tenant
                    ),
                });
            }
            books.making.entry(tenant.to_string()).or_default().count += 1;
        }
        let (id, _) = store::fresh(&self.root, "snap-");
        let dir = self.root.join(format!("{}{id}", store::PARTIAL));
        let reservation = Reservation {
            id,
            dir,
            tenant: tenant.to_string(),
            held: 0,
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

    /// Gives up a reservation: its count and bytes, and its directory.
    pub(crate) async fn abort(&self, reservation: Reservation) {
        self.books().unreserve(&reservation);
        let dir = reservation.dir;
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
    }

    /// Bytes `tenant` may still add under the tenant's and the host's bounds, those being
    /// made counted: what a files-only snapshot reads at most.
    pub(crate) fn room(&self, tenant: &str) -> u64 {
        let books = self.books();
        let tenant = self
            .config
            .max_tenant_bytes
            .saturating_sub(books.tenant_bytes(tenant));
        tenant.min(self.config.max_bytes.saturating_sub(books.host_bytes()))
    }

    /// Counts what was written under the reservation's directory among its tenant's bytes
    /// being made, in the same step as the check against the tenant's and the host's byte
    /// bounds (kept and being made): refused past them (the caller aborts).
    pub(crate) async fn hold(&self, reservation: &mut Reservation) -> Result<u64, SnapshotError> {
        let bytes = {
            let dir = reservation.dir.clone();
            tokio::task::spawn_blocking(move || store::size_of(&dir))
                .await
                .unwrap_or(0)
        };
        let mut books = self.books();
        // Counted once: a second hold counts only what was added since.
        let more = bytes.saturating_sub(reservation.held);
        let tenant = books.tenant_bytes(&reservation.tenant);
        if tenant + more > self.config.max_tenant_bytes {
            return Err(SnapshotError::Limit {
                what: format!(
                    "a tenant keeps at most {} bytes of snapshots (those being made counted); \
                     this one is {bytes}",
                    self.config.max_tenant_bytes
                ),
            });
        }
        if books.host_bytes() + more > self.config.max_bytes {
            return Err(SnapshotError::Limit {
                what: format!(
                    "the host keeps at most {} bytes of snapshots",
                    self.config.max_bytes
                ),
            });
        }
        books
            .making
            .entry(reservation.tenant.clone())
            .or_default()
            .bytes += more;
        reservation.held += more;
        Ok(bytes)
    }

    /// Keeps what `taken` wrote (or linked) under the reservation's directory as the
    /// snapshot of `key`'s kernel: its bytes held first ([`Snapshots::hold`]), refused and
    /// removed past the byte bounds.
    async fn commit(
        &self,
        mut reservation: Reservation,
        key: &KernelKey,
        name: Option<String>,
        taken: &take::Taken,
    ) -> Result<Stored, SnapshotError> {
        let bytes = match self.hold(&mut reservation).await {
            Ok(bytes) => bytes,
            Err(e) => {
                self.abort(reservation).await;
                return Err(e);
            }
        };
        let partial = reservation.dir.clone();
        let whole = self.root.join(&reservation.id);
        let stored = Stored::new(
            reservation.id.clone(),
            key.clone(),
            name,
            taken.checkpoint.as_ref(),
            taken.seconds,
            &whole,
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
        // Kept, and no longer being made, in one step: never counted twice nor not at all.
        let mut books = self.books();
        books.unreserve(&reservation);
        books.index.insert(stored.id.clone(), stored.clone());
        Ok(stored)
    }

    /// `tenant`'s snapshots, oldest first.
    pub(crate) fn list(&self, tenant: &str) -> Vec<Stored> {
        let mut mine: Vec<Stored> = self
            .books()
            .index
            .values()
            .filter(|s| s.key.owner.tenant == tenant)
            .cloned()
            .collect();
        mine.sort_by(|a, b| (a.created, &a.id).cmp(&(b.created, &b.id)));
        mine
    }

    /// `tenant`'s snapshot `id` (another tenant's is not found).
    pub(crate) fn get(&self, tenant: &str, id: &str) -> Result<Stored, SnapshotError> {
        self.books()
            .index
            .get(id)
            .filter(|s| s.key.owner.tenant == tenant)
            .cloned()
            .ok_or_else(|| SnapshotError::NotFound { id: id.to_string() })
    }

    /// Deletes `tenant`'s snapshot `id` and its files.
    pub(crate) async fn delete(&self, tenant: &str, id: &str) -> Result<(), SnapshotError> {
        let removed = {
            let mut books = self.books();
            match books.index.get(id) {
                Some(s) if s.key.owner.tenant == tenant => books.index.remove(id),
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
            let mut books = self.books();
            let ids: Vec<String> = books
                .index
                .values()
                .filter(|s| now.saturating_sub(s.created) >= ttl)
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| books.index.remove(id)).collect()
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
