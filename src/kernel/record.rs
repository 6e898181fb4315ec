//! A hibernated kernel's record, kept beside its checkpoint so that the checkpoint survives a
//! restart of the server (`docs/runtimes.md`, "Hibernation"): written (mode 0600, by rename)
//! when the checkpoint is kept, read back at start, removed when the checkpoint is restored or
//! discarded. (Sweeps leave the hibernated kernel's container for its name, not its record:
//! `labels::hibernated_name`.)
//!
//! Records are read bounded (their number and each one's size); one that cannot be read or
//! does not parse is skipped, and its checkpoint is cleared with the other unclaimed files.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::hibernate::Checkpoint;
use crate::owner::KernelKey;

/// The record's format; another is not read.
const VERSION: u32 = 1;

/// A record is a few hundred bytes; one larger than this is not read.
const MAX_RECORD_BYTES: u64 = 64 << 10;

/// Records read at most (far above any host's bound on hibernated kernels).
const MAX_RECORDS: usize = 4096;

/// What a record file ends with (`<checkpoint name>.json`).
const SUFFIX: &str = ".json";

/// One hibernated kernel as kept on disk: whose it is, its generation and the checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    version: u32,
    /// The kernel's key.
    pub(crate) key: KernelKey,
    /// The key's generation when it hibernated (a restore continues it).
    pub(crate) generation: u64,
    /// Where the kernel's checkpoint is kept, and how to start from it.
    pub(crate) checkpoint: Checkpoint,
}

impl Record {
    /// A record of `checkpoint`, not restored.
    pub(crate) fn new(key: KernelKey, generation: u64, checkpoint: Checkpoint) -> Record {
        Record {
            version: VERSION,
            key,
            generation,
            checkpoint,
        }
    }

    /// Writes the record beside its checkpoint: a temporary file (mode 0600) renamed into
    /// place, so a reader never sees half of one.
    pub(crate) async fn write(&self) -> std::io::Result<()> {
        let path = record_path(&self.checkpoint);
        let body = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        tokio::task::spawn_blocking(move || {
            use std::io::Write;
            use std::os::unix::fs::OpenOptionsExt;
            let temporary = path.with_extension("tmp");
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(&body)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    /// The records in `dir` that parse, are of this format, name a kernel on a valid key and
    /// a checkpoint there: at most [`MAX_RECORDS`], each at most [`MAX_RECORD_BYTES`].
    /// Blocking.
    pub(crate) fn read_all(dir: &Path) -> Vec<Record> {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return Vec::new();
        };
        let mut records = Vec::new();
        for entry in entries.flatten() {
            if records.len() >= MAX_RECORDS {
                tracing::warn!(dir = %dir.display(), "more hibernated kernels' records than are read: the rest are cleared");
                break;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("kb-") || !name.ends_with(SUFFIX) {
                continue;
            }
            match read_one(&entry.path()) {
                Some(mut record)
                    if record.version == VERSION
                        && format!("{}{SUFFIX}", record.checkpoint.name) == name
                        && valid_key(&record.key)
                        && dir.join(&record.checkpoint.name).is_dir() =>
                {
                    // The directory it was read from, however it is reached now.
                    record.checkpoint.dir = dir.to_path_buf();
                    let age = crate::clock::unix_now().saturating_sub(record.checkpoint.taken);
                    record.checkpoint.at = Instant::now()
                        .checked_sub(Duration::from_secs(age))
                        .unwrap_or_else(Instant::now);
                    records.push(record);
                }
                _ => {
                    tracing::warn!(record = %name, "a hibernated kernel's record is unreadable: its checkpoint is cleared")
                }
            }
        }
        records
    }
}

impl Checkpoint {
    /// Removes the checkpoint's record, if it has one.
    pub(super) async fn remove_record(&self) {
        let path = record_path(self);
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_file(path)).await;
    }

    /// The file names in the checkpoints' directory that are this checkpoint's (its memory
    /// image's directory and its record).
    pub(crate) fn file_names(&self) -> [String; 2] {
        [self.name.clone(), format!("{}{SUFFIX}", self.name)]
    }
}

fn record_path(checkpoint: &Checkpoint) -> PathBuf {
    checkpoint.dir.join(format!("{}{SUFFIX}", checkpoint.name))
}

fn read_one(path: &Path) -> Option<Record> {
    use std::io::Read;
    let file = std::fs::File::open(path).ok()?;
    let mut body = Vec::new();
    file.take(MAX_RECORD_BYTES + 1)
        .read_to_end(&mut body)
        .ok()?;
    if body.len() as u64 > MAX_RECORD_BYTES {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// The key's names pass the same checks as a caller's.
fn valid_key(key: &KernelKey) -> bool {
    let owner = &key.owner;
    crate::owner::Owner::new(&owner.tenant, &owner.session, owner.child.as_deref())
        .is_ok_and(|checked| checked == *owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_is_read_back_and_a_damaged_or_foreign_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let json = |name: &str, tenant: &str| {
            serde_json::json!({
                "version": VERSION,
                "key": {
                    "owner": {"tenant": tenant, "session": "s", "child": null},
                    "mode": "strict", "image": "img", "tools": [], "runtime": "runsc"
                },
                "generation": 3,
                "checkpoint": {
                    "id": "c", "volume": "v", "spill_dir": "/work", "sockets": null, "user": "u",
                    "name": name, "dir": dir.path(), "bytes": 1, "token": "t",
                    "execution_count": 2, "cells_begun": 2, "checkpoint_seconds": 0.3,
                    "taken": crate::clock::unix_now() - 60, "from": "idle", "lasting": true
                }
            })
        };
        for (name, tenant) in [("kb-a", "t"), ("kb-b", "bad tenant"), ("kb-c", "t")] {
            std::fs::create_dir(dir.path().join(name)).unwrap();
            std::fs::write(
                dir.path().join(format!("{name}.json")),
                json(name, tenant).to_string(),
            )
            .unwrap();
        }
        // Named for another checkpoint than its file's.
        std::fs::write(dir.path().join("kb-c.json"), json("kb-a", "t").to_string()).unwrap();
        std::fs::write(dir.path().join("kb-d.json"), b"{not json").unwrap();
        let records = Record::read_all(dir.path());
        assert_eq!(records.len(), 1, "{records:?}");
        assert_eq!(records[0].generation, 3);
        assert!(records[0].checkpoint.at.elapsed() >= Duration::from_secs(59));
    }
}
