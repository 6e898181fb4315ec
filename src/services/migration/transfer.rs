//! A migrating kernel's checkpoint on the wire (`docs/cluster.md`, "Migration on drain"):
//! one HTTP body, streamed as it is read from disk and written to disk as it arrives, never
//! held whole in memory.
//!
//! ```text
//! MAGIC (8 bytes) | manifest length (u32, big-endian) | manifest (JSON)
//! | each file's bytes, in the manifest's order | SHA-256 of everything before (32 bytes)
//! ```
//!
//! The receiver bounds the manifest ([`MAX_MANIFEST_BYTES`]), the files' count
//! ([`MAX_FILES`]) and names (plain names, no path), their total bytes (the caller's bound,
//! checked against the manifest before a byte is written), and checks the digest at the end:
//! a stream cut anywhere, longer or shorter than announced, or altered, is refused, and the
//! caller removes what was written.

use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::MigrationError;
use crate::kernel::Checkpoint;
use crate::owner::KernelKey;

/// What begins a migration's stream (its format's version in the last digit).
const MAGIC: &[u8; 8] = b"KBMIGR1\n";

/// A manifest is a few kilobytes; a larger one is refused.
pub const MAX_MANIFEST_BYTES: u32 = 64 << 10;

/// Files in one checkpoint at most (runsc writes a handful).
pub const MAX_FILES: usize = 64;

/// Bytes read or written at once.
const CHUNK: usize = 256 << 10;

/// What travels ahead of a checkpoint's files.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Manifest {
    /// The migrated kernel's key (the session keeps its name, image, tools and runtime).
    pub(crate) key: KernelKey,
    /// The key's generation on the node it leaves: the same goes on.
    pub(crate) generation: u64,
    /// The node it leaves, and that node's epoch (the catalog's move is fenced by it).
    pub(crate) from_node: String,
    pub(crate) from_epoch: i64,
    /// The checkpoint as the leaving node took it (its container is that node's).
    pub(crate) checkpoint: Checkpoint,
    /// Its files' names and sizes, in the stream's order.
    pub(crate) files: Vec<(String, u64)>,
}

impl Manifest {
    /// Bytes of the files.
    pub(crate) fn bytes(&self) -> u64 {
        self.files
            .iter()
            .map(|(_, n)| *n)
            .fold(0, u64::saturating_add)
    }
}

/// A plain file name: no separator, not `.` or `..`, not empty, at most 255 bytes.
fn plain(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
}

/// The regular files directly under `dir`, with their sizes (blocking).
pub(crate) fn list_files(dir: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if !meta.is_file() {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        files.push((name, meta.len()));
    }
    files.sort();
    if files.len() > MAX_FILES {
        return Err(std::io::Error::other(format!(
            "a checkpoint of more than {MAX_FILES} files"
        )));
    }
    Ok(files)
}

/// Writes the stream of `manifest` and the files under `dir` into `out` (see the module
/// documentation). Fails when a file's size is not the manifest's.
pub(crate) async fn send(
    manifest: &Manifest,
    dir: &Path,
    out: &mut (impl AsyncWrite + Unpin),
) -> Result<(), MigrationError> {
    let io = |e: std::io::Error| MigrationError::Transfer(format!("sending: {e}"));
    let head = serde_json::to_vec(manifest).map_err(|e| MigrationError::Transfer(e.to_string()))?;
    let len = u32::try_from(head.len())
        .ok()
        .filter(|n| *n <= MAX_MANIFEST_BYTES)
        .ok_or_else(|| MigrationError::Transfer("the manifest is too large".into()))?;
    let mut digest = Sha256::new();
    for part in [&MAGIC[..], &len.to_be_bytes()[..], &head[..]] {
        digest.update(part);
        out.write_all(part).await.map_err(io)?;
    }
    let mut buf = vec![0u8; CHUNK];
    for (name, size) in &manifest.files {
        let mut file = tokio::fs::File::open(dir.join(name)).await.map_err(io)?;
        let mut left = *size;
        while left > 0 {
            let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
            let n = file.read(&mut buf[..want]).await.map_err(io)?;
            if n == 0 {
                return Err(MigrationError::Transfer(format!(
                    "{name} shrank while sent"
                )));
            }
            digest.update(&buf[..n]);
            out.write_all(&buf[..n]).await.map_err(io)?;
            left -= n as u64;
        }
    }
    out.write_all(&digest.finalize()).await.map_err(io)?;
    out.shutdown().await.map_err(io)?;
    Ok(())
}

/// Reads a stream from `input` into `into` (which must not exist; made mode 0700, files
/// 0600 under `into/<checkpoint name>`), at most `max_bytes` of files. On error, what was
/// written is left for the caller to remove.
pub(crate) async fn receive(
    input: &mut (impl AsyncRead + Unpin),
    into: &Path,
    max_bytes: u64,
) -> Result<Manifest, MigrationError> {
    let bad = |why: String| MigrationError::Transfer(why);
    let cut = |e: std::io::Error| MigrationError::Transfer(format!("the stream broke: {e}"));
    let mut digest = Sha256::new();
    let mut magic = [0u8; 8];
    input.read_exact(&mut magic).await.map_err(cut)?;
    if &magic != MAGIC {
        return Err(bad("not a migration stream".into()));
    }
    let mut len = [0u8; 4];
    input.read_exact(&mut len).await.map_err(cut)?;
    let n = u32::from_be_bytes(len);
    if n > MAX_MANIFEST_BYTES {
        return Err(bad(format!("a manifest of {n} bytes")));
    }
    let mut head = vec![0u8; n as usize];
    input.read_exact(&mut head).await.map_err(cut)?;
    digest.update(magic);
    digest.update(len);
    digest.update(&head);
    let manifest: Manifest =
        serde_json::from_slice(&head).map_err(|e| bad(format!("the manifest: {e}")))?;
    if manifest.files.len() > MAX_FILES
        || !manifest.files.iter().all(|(name, _)| plain(name))
        || !plain(manifest.checkpoint.name())
    {
        return Err(bad("the manifest names files it may not".into()));
    }
    if manifest.bytes() > max_bytes {
        return Err(MigrationError::TooLarge {
            bytes: manifest.bytes(),
            max: max_bytes,
        });
    }
    let files = into.join(manifest.checkpoint.name());
    {
        let (into, files) = (into.to_path_buf(), files.clone());
        tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new().mode(0o700).create(&into)?;
            std::fs::DirBuilder::new().mode(0o700).create(&files)
        })
        .await
        .map_err(|e| MigrationError::Io(e.to_string()))?
        .map_err(|e| MigrationError::Io(e.to_string()))?;
    }
    let mut buf = vec![0u8; CHUNK];
    for (name, size) in &manifest.files {
        let mut file = tokio::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(files.join(name))
            .await
            .map_err(|e| MigrationError::Io(e.to_string()))?;
        let mut left = *size;
        while left > 0 {
            let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
            let n = input.read(&mut buf[..want]).await.map_err(cut)?;
            if n == 0 {
                return Err(bad(format!("the stream ended inside {name}")));
            }
            digest.update(&buf[..n]);
            file.write_all(&buf[..n])
                .await
                .map_err(|e| MigrationError::Io(e.to_string()))?;
            left -= n as u64;
        }
        file.sync_all()
            .await
            .map_err(|e| MigrationError::Io(e.to_string()))?;
    }
    let mut sent = [0u8; 32];
    input.read_exact(&mut sent).await.map_err(cut)?;
    if sent[..] != digest.finalize()[..] {
        return Err(bad("the checkpoint's digest does not match".into()));
    }
    let mut more = [0u8; 1];
    if input.read(&mut more).await.map_err(cut)? != 0 {
        return Err(bad("bytes after the digest".into()));
    }
    Ok(manifest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkMode;
    use crate::owner::Owner;

    fn manifest(files: Vec<(String, u64)>, name: &str) -> Manifest {
        let checkpoint: Checkpoint = serde_json::from_value(serde_json::json!({
            "id": "c", "volume": "v", "spill_dir": "s", "sockets": null, "user": "u",
            "name": name, "dir": "/nowhere", "bytes": 0, "token": "t",
            "execution_count": 1, "cells_begun": 1, "checkpoint_seconds": 0.1,
            "taken": 0, "from": "snapshot"
        }))
        .expect("a checkpoint record");
        Manifest {
            key: KernelKey {
                owner: Owner::new("t", "s", None).expect("owner"),
                mode: WorkMode::Strict,
                image: "img".into(),
                tools: Default::default(),
                runtime: Default::default(),
                context: Default::default(),
            },
            generation: 3,
            from_node: "n1".into(),
            from_epoch: 7,
            checkpoint,
            files,
        }
    }

    /// A stream of two files from a fresh directory, as the sender makes it.
    async fn stream() -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("a"), vec![1u8; 300_000]).expect("write");
        std::fs::write(dir.path().join("b"), b"bee").expect("write");
        let files = list_files(dir.path()).expect("list");
        let mut out = Vec::new();
        send(&manifest(files, "kb-x"), dir.path(), &mut out)
            .await
            .expect("send");
        (dir, out)
    }

    #[tokio::test]
    async fn a_stream_arrives_whole_and_verified() {
        let (_src, bytes) = stream().await;
        let into = tempfile::tempdir().expect("dir");
        let got = receive(&mut &bytes[..], &into.path().join("in"), 1 << 20)
            .await
            .expect("received");
        assert_eq!(got.generation, 3);
        let a = std::fs::read(into.path().join("in/kb-x/a")).expect("a");
        assert_eq!(a, vec![1u8; 300_000]);
        assert_eq!(
            std::fs::read(into.path().join("in/kb-x/b")).expect("b"),
            b"bee"
        );
    }

    #[tokio::test]
    async fn a_cut_altered_longer_or_too_large_stream_is_refused() {
        let (_src, bytes) = stream().await;
        let into = tempfile::tempdir().expect("dir");
        let half = &bytes[..bytes.len() / 2];
        let e = receive(&mut &half[..], &into.path().join("cut"), 1 << 20).await;
        assert!(matches!(e, Err(MigrationError::Transfer(_))), "{e:?}");
        let mut altered = bytes.clone();
        let at = altered.len() - 40;
        altered[at] ^= 1;
        let e = receive(&mut &altered[..], &into.path().join("alt"), 1 << 20).await;
        assert!(matches!(e, Err(MigrationError::Transfer(_))), "{e:?}");
        let mut longer = bytes.clone();
        longer.push(0);
        let e = receive(&mut &longer[..], &into.path().join("long"), 1 << 20).await;
        assert!(matches!(e, Err(MigrationError::Transfer(_))), "{e:?}");
        let e = receive(&mut &bytes[..], &into.path().join("big"), 1000).await;
        assert!(matches!(e, Err(MigrationError::TooLarge { .. })), "{e:?}");
        // Refused from the manifest: nothing written.
        assert!(!into.path().join("big").exists());
    }

    #[tokio::test]
    async fn a_manifest_naming_a_path_is_refused() {
        for (file, name) in [("../x", "kb-x"), ("a", "../kb"), ("a", "")] {
            let mut out = Vec::new();
            let m = manifest(vec![(file.to_string(), 0)], name);
            let head = serde_json::to_vec(&m).expect("json");
            out.extend_from_slice(MAGIC);
            out.extend_from_slice(&(head.len() as u32).to_be_bytes());
            out.extend_from_slice(&head);
            let into = tempfile::tempdir().expect("dir");
            let e = receive(&mut &out[..], &into.path().join("in"), 1 << 20).await;
            assert!(
                matches!(e, Err(MigrationError::Transfer(_))),
                "{file} {name}: {e:?}"
            );
            assert!(!into.path().join("in").exists());
        }
    }
}
