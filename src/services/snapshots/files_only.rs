//! Files-only snapshots (`docs/snapshots.md`, "Files-only snapshots"): a runc kernel, whose
//! memory the engine here cannot checkpoint, is snapshotted as its working directory's files
//! (`memory: false`, never pretending to more): the file helper's tar of `/work`, read inside
//! the sandbox as the kernel's user (the host never follows the tenant's paths), bounded by
//! the bytes the tenant (and the host) may still keep. On the host the tar is only re-read:
//! its regular files and directories are kept (a hard link to a file kept before as a copy
//! of it), anything else (a symlink, a device, a member naming `..` or an absolute path) is
//! dropped, so that the restore, an upload extracted by the file helper of a fresh kernel
//! (which refuses links and escapes), takes all of it. `/tmp` is not in it: the file helper
//! serves the working directory only.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use super::kernels::{Held, SnapshotKernels};
use super::store::FILES;
use super::{Reservation, SnapshotError, Snapshots};
use crate::files::{Download, FilePath};
use crate::owner::KernelKey;
use crate::registry::TenantLimits;
use crate::wire::RestoredKernel;

/// The tar as the helper wrote it, before it is re-read (removed after).
const RAW: &str = "work.raw.tar";

impl Snapshots {
    /// Reads `key`'s idle runc kernel's working directory into the reservation's directory
    /// (`store::FILES`): the kernel, held, and how long it took.
    pub(super) async fn take_files(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        reservation: &Reservation,
    ) -> Result<(Held, f64), SnapshotError> {
        let held = self.hold_idle(key).await?;
        let started = Instant::now();
        let room = self
            .room(&key.owner.tenant)
            .min(self.handles.max_upload_bytes);
        match self.read_files(&held, &reservation.dir, room).await {
            Ok(()) => Ok((held, started.elapsed().as_secs_f64())),
            Err(e) => {
                kernels.release(held).await;
                Err(e)
            }
        }
    }

    async fn read_files(&self, held: &Held, dir: &Path, room: u64) -> Result<(), SnapshotError> {
        let failed = |e: String| SnapshotError::Checkpoint(format!("reading /work: {e}"));
        let download = held
            .kernel
            .read_file(&FilePath::root(), true)
            .await
            .map_err(|e| failed(e.to_string()))?;
        let Download::Tar { mut body } = download else {
            return Err(failed("the file helper answered no tar".into()));
        };
        let raw = dir.join(RAW);
        let mut file = tokio::fs::File::create(&raw).await?;
        let mut written = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| failed(e.to_string()))?;
            written += chunk.len() as u64;
            if written > room {
                return Err(SnapshotError::Limit {
                    what: format!(
                        "the working directory passes the {room} bytes the tenant may still \
                         keep in snapshots (or upload at once)"
                    ),
                });
            }
            file.write_all(&chunk).await?;
        }
        file.sync_all().await?;
        drop(file);
        let (from, into) = (raw.clone(), dir.join(FILES));
        let kept = tokio::task::spawn_blocking(move || keep_files(&from, &into, room))
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let _ = tokio::fs::remove_file(&raw).await;
        let dropped = match kept {
            Ok(dropped) => dropped,
            Err(e) if e.kind() == std::io::ErrorKind::FileTooLarge => {
                return Err(SnapshotError::Limit {
                    what: format!(
                        "the working directory's files pass the {room} bytes the tenant may \
                         still keep in snapshots (or upload at once)"
                    ),
                })
            }
            Err(e) => return Err(failed(format!("re-reading its tar: {e}"))),
        };
        if dropped > 0 {
            tracing::info!(
                owner = %held.slot.key.owner,
                dropped,
                "a files-only snapshot left out what is not a regular file or directory"
            );
        }
        Ok(())
    }

    /// Starts `key`'s session (no kernel yet) as a fresh kernel with the files-only snapshot's
    /// working directory (`tar`) extracted into it: held until the caller releases it.
    pub(super) async fn restore_files(
        &self,
        kernels: &dyn SnapshotKernels,
        key: &KernelKey,
        limits: TenantLimits,
        tar: PathBuf,
    ) -> Result<(RestoredKernel, Held), SnapshotError> {
        let started = Instant::now();
        let file = tokio::fs::File::open(&tar).await?;
        let held = kernels.hold(key, limits).await?;
        let body = tokio_util::io::ReaderStream::new(file).boxed();
        let written = held
            .kernel
            .write_file(&FilePath::root(), true, body, self.handles.max_upload_bytes)
            .await;
        if let Err(e) = written {
            kernels.release(held).await;
            kernels.clear(key).await;
            return Err(SnapshotError::Restore(format!(
                "writing the snapshot's files: {e}"
            )));
        }
        let restored = RestoredKernel {
            id: held.kernel.short_id().to_string(),
            generation: held.slot.generation(),
            restore_seconds: started.elapsed().as_secs_f64(),
        };
        Ok((restored, held))
    }
}

/// Re-reads the tar `from` into `into` (at most `room` bytes: past it `FileTooLarge`),
/// keeping its regular files (sparse ones with their PAX records) and directories; a hard
/// link to a file kept before becomes a copy of it; anything else is dropped, and counted in
/// the answer. Blocking.
fn keep_files(from: &Path, into: &Path, room: u64) -> std::io::Result<u64> {
    use std::io::{Read, Seek};
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::Component;
    let mut data = std::fs::File::open(from)?;
    let mut archive = tar::Archive::new(std::io::BufReader::new(std::fs::File::open(from)?));
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(into)?;
    let mut builder = tar::Builder::new(Bounded {
        inner: std::io::BufWriter::new(out),
        left: room,
    });
    // Plain regular files kept so far: where their data is in `from`, and their header.
    let mut kept: HashMap<PathBuf, (u64, u64, tar::Header)> = HashMap::new();
    let mut dropped = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        let kind = entry.header().entry_type();
        let path = entry.path()?.into_owned();
        if !path.components().any(|c| matches!(c, Component::Normal(_))) {
            // The archive's root (`.`): the directory itself.
            continue;
        }
        let plain = path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !plain {
            dropped += 1;
            continue;
        }
        if kind.is_hard_link() {
            let target = entry.link_name()?.map(|t| t.into_owned());
            match target.and_then(|t| kept.get(&t).cloned()) {
                Some((at, size, mut header)) => {
                    data.seek(std::io::SeekFrom::Start(at))?;
                    builder.append_data(&mut header, &path, (&mut data).take(size))?;
                }
                None => dropped += 1,
            }
            continue;
        }
        if !(kind.is_file() || kind.is_dir()) {
            dropped += 1;
            continue;
        }
        let pax: Vec<(String, Vec<u8>)> = match entry.pax_extensions()? {
            Some(extensions) => extensions
                .filter_map(|e| e.ok())
                .filter_map(|e| Some((e.key().ok()?.to_string(), e.value_bytes().to_vec())))
                .collect(),
            None => Vec::new(),
        };
        let mut header = entry.header().clone();
        if kind.is_file() && pax.is_empty() {
            kept.insert(
                path.clone(),
                (entry.raw_file_position(), entry.size(), header.clone()),
            );
        }
        if !pax.is_empty() {
            builder.append_pax_extensions(pax.iter().map(|(k, v)| (k.as_str(), v.as_slice())))?;
        }
        builder.append_data(&mut header, &path, &mut entry)?;
    }
    let out = builder.into_inner()?;
    out.inner
        .into_inner()
        .map_err(|e| e.into_error())?
        .sync_all()?;
    Ok(dropped)
}

/// A writer that refuses to write past `left` bytes (`FileTooLarge`).
struct Bounded<W> {
    inner: W,
    left: u64,
}

impl<W: std::io::Write> std::io::Write for Bounded<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.left {
            return Err(std::io::ErrorKind::FileTooLarge.into());
        }
        let n = self.inner.write(buf)?;
        self.left -= n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}
