//! Snapshots on disk (`docs/snapshots.md`, "Trust model"): one directory per snapshot under
//! the snapshots' root (mode 0700), holding its checkpoint's files and its record
//! (`snapshot.json`, mode 0600). A snapshot is made under `.partial-<id>` and renamed into
//! place once its record is written, so a server killed meanwhile leaves no half snapshot
//! that a later run takes for whole (`.partial-*` and `.fork-*` are cleared at start).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::kernel::Checkpoint;
use crate::owner::KernelKey;

/// The record's format; another is not read.
const VERSION: u32 = 1;

/// The record's file in a snapshot's directory.
pub(super) const RECORD: &str = "snapshot.json";

/// A record is a few kilobytes; a larger one is not read.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// Snapshot directories read at start at most.
const MAX_READ: usize = 65_536;

/// What begins a snapshot being made.
pub(super) const PARTIAL: &str = ".partial-";

/// A files-only snapshot's working directory, as the file helper's tar of it.
pub(super) const FILES: &str = "work.tar";

/// What begins a fork's links to a snapshot's files (consumed by its restore).
pub(super) const FORK: &str = ".fork-";

/// One snapshot as kept on disk.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Stored {
    version: u32,
    /// Its id (`snap-` and 24 hex digits).
    pub(crate) id: String,
    /// The key of the kernel it was taken of: its tenant owns it, its image, mode, tools and
    /// runtime are what a restore makes the new kernel with.
    pub(crate) key: KernelKey,
    /// The name its owner gave it.
    pub(crate) name: Option<String>,
    /// When it was taken, in seconds since the Unix epoch.
    pub(crate) created: u64,
    /// Bytes on disk.
    pub(crate) bytes: u64,
    /// The kernel's memory is in it (runsc); `false`: its files only.
    pub(crate) memory: bool,
    /// The kernel's checkpoint, its files in this snapshot's directory; `None` for a
    /// files-only snapshot (`memory: false`), whose working directory is [`FILES`] there.
    #[serde(default)]
    pub(crate) checkpoint: Option<Checkpoint>,
    /// How long the checkpoint took.
    pub(crate) checkpoint_seconds: f64,
}

impl Stored {
    pub(super) fn new(
        id: String,
        key: KernelKey,
        name: Option<String>,
        checkpoint: Option<&Checkpoint>,
        seconds: f64,
        whole: &Path,
        bytes: u64,
    ) -> Stored {
        Stored {
            version: VERSION,
            id,
            key,
            name,
            created: crate::clock::unix_now(),
            bytes,
            memory: checkpoint.is_some(),
            checkpoint_seconds: seconds,
            checkpoint: checkpoint.map(|c| c.kept_in(whole)),
        }
    }

    /// The files-only snapshot's tar of the working directory, in `dir` (its directory).
    pub(super) fn files_in(dir: &Path) -> PathBuf {
        dir.join(FILES)
    }
}

/// Creates `dir` (and its parents) mode 0700. Blocking.
pub(super) fn private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `stored` into `partial` (mode 0600, synced) and renames `partial` to `whole`.
/// Blocking.
pub(super) fn commit(stored: &Stored, partial: &Path, whole: &Path) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let body = serde_json::to_vec(stored).map_err(std::io::Error::other)?;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(partial.join(RECORD))?;
    file.write_all(&body)?;
    file.sync_all()?;
    std::fs::rename(partial, whole)
}

/// The snapshots under `root` whose records read and parse (their files' directory there),
/// and removes what is not a whole snapshot (`.partial-*`, `.fork-*`, a directory without a
/// readable record). Blocking.
pub(super) fn read_all(root: &Path) -> Vec<Stored> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(root) else {
        return found;
    };
    for entry in entries.flatten().take(MAX_READ) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !path.is_dir() {
            continue;
        }
        match read_one(&path).filter(|s| s.id == name && s.version == VERSION) {
            Some(mut stored) => {
                stored.checkpoint = stored.checkpoint.map(|c| c.kept_in(&path));
                found.push(stored);
            }
            None => {
                if name.starts_with(PARTIAL) || name.starts_with(FORK) || name.starts_with("snap-")
                {
                    let _ = std::fs::remove_dir_all(&path);
                }
            }
        }
    }
    found
}

fn read_one(dir: &Path) -> Option<Stored> {
    use std::io::Read;
    let file = std::fs::File::open(dir.join(RECORD)).ok()?;
    let mut body = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut body)
        .ok()?;
    if body.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// Links (or copies, across file systems) the regular files of `from` into the new directory
/// `into`. Blocking.
pub(super) fn link_files(from: &Path, into: &Path) -> std::io::Result<()> {
    private_dir(into)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if !entry.file_type()?.is_file() {
            continue;
        }
        let target = into.join(entry.file_name());
        if std::fs::hard_link(entry.path(), &target).is_err() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Bytes of the regular files directly under `dir` and its subdirectories (one level).
/// Blocking.
pub(super) fn size_of(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += std::fs::read_dir(entry.path())
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .filter(|m| m.is_file())
                .map(|m| m.len())
                .sum::<u64>();
        } else if meta.is_file() {
            total += meta.len();
        }
    }
    total
}

/// A fresh name under `root` beginning with `prefix`.
pub(super) fn fresh(root: &Path, prefix: &str) -> (String, PathBuf) {
    let id = format!("{prefix}{:024x}", rand::random::<u128>() >> 32);
    let path = root.join(&id);
    (id, path)
}
