//! Local files to and from kernels, shared by `cp` (against a server) and `exec`/`repl`
//! `--upload`/`--download` (local runs): a local file streams as it is; a local directory
//! streams as a tar built on the fly; a download is written to a temporary name and renamed,
//! and a tar download is unpacked with regular files and directories only (a link a kernel
//! put in the archive is skipped, never created on the host).

use std::path::{Path, PathBuf};

use anyhow::Context;
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio::io::AsyncWriteExt;
use tokio_util::io::{ReaderStream, StreamReader, SyncIoBridge};

use futures::stream::BoxStream;
use kernelbox::files::{ByteStream, FilePath};

/// Bytes coming out of a kernel, from the local orchestrator (`TransferError`) or a server
/// (`ClientError`); an error ends them.
pub type Incoming<E> = BoxStream<'static, Result<Bytes, E>>;

/// A local file or directory ready to upload: its bytes and whether they are a tar.
pub struct Upload {
    pub body: ByteStream,
    pub tar: bool,
}

/// Opens `local` for upload: a file as itself, a directory as a tar of its contents.
pub async fn open_local(local: &Path) -> anyhow::Result<Upload> {
    let meta = tokio::fs::metadata(local)
        .await
        .with_context(|| format!("{}", local.display()))?;
    if meta.is_file() {
        let file = tokio::fs::File::open(local)
            .await
            .with_context(|| format!("{}", local.display()))?;
        return Ok(Upload {
            body: ReaderStream::with_capacity(file, 256 * 1024).boxed(),
            tar: false,
        });
    }
    if !meta.is_dir() {
        anyhow::bail!("{} is neither a file nor a directory", local.display());
    }
    let (reader, writer) = tokio::io::duplex(1024 * 1024);
    let dir = local.to_path_buf();
    let built = tokio::task::spawn_blocking(move || -> std::io::Result<()> {
        let mut builder = tar::Builder::new(SyncIoBridge::new(writer));
        builder.follow_symlinks(false);
        builder.append_dir_all(".", &dir)?;
        builder.into_inner()?.shutdown()
    });
    // A failure to read the directory ends the stream with that error (the upload is then
    // abandoned and nothing is written in the kernel).
    let failure = futures::stream::once(async move {
        match built.await {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(Err(e)),
            Err(e) => Some(Err(std::io::Error::other(e))),
        }
    })
    .filter_map(|x| async move { x });
    Ok(Upload {
        body: ReaderStream::with_capacity(reader, 256 * 1024)
            .chain(failure)
            .boxed(),
        tar: true,
    })
}

/// Where a download of `remote` goes when the caller names `local` (or nothing): into an
/// existing directory under the remote's last name, else at `local` itself.
pub fn local_target(remote: &str, local: Option<&Path>) -> PathBuf {
    let name = remote
        .trim_end_matches('/')
        .rsplit('/')
        .next()
        .filter(|n| !n.is_empty())
        .unwrap_or("work");
    match local {
        Some(path) if path.is_dir() => path.join(name),
        Some(path) => path.to_path_buf(),
        None => PathBuf::from(name),
    }
}

/// Writes a file download (from a local kernel or a server) to `target` (through a temporary
/// name, renamed when complete).
pub async fn save_file<E>(body: Incoming<E>, target: &Path) -> anyhow::Result<u64>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let tmp = target.with_file_name(format!(
        ".{}.kernelbox-part",
        target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    ));
    let result = async {
        let mut file = tokio::fs::File::create(&tmp)
            .await
            .with_context(|| format!("{}", tmp.display()))?;
        let mut body = body;
        let mut total = 0u64;
        while let Some(chunk) = body.next().await {
            let chunk: Bytes = chunk?;
            total += chunk.len() as u64;
            file.write_all(&chunk).await?;
        }
        file.flush().await?;
        tokio::fs::rename(&tmp, target)
            .await
            .with_context(|| format!("{}", target.display()))?;
        anyhow::Ok(total)
    }
    .await;
    if result.is_err() {
        let _ = tokio::fs::remove_file(&tmp).await;
    }
    result
}

/// This process's umask (`Umask:` in /proc/self/status), or 0o022 when unreadable.
fn umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o022)
}

/// Unpacks a tar download into the directory `target` (created): regular files and
/// directories only, each inside `target` (the tar crate refuses paths that climb out).
pub async fn save_tar<E>(body: Incoming<E>, target: &Path) -> anyhow::Result<u64>
where
    E: std::error::Error + Send + Sync + 'static,
{
    tokio::fs::create_dir_all(target)
        .await
        .with_context(|| format!("{}", target.display()))?;
    let reader = StreamReader::new(body.map_err(std::io::Error::other));
    let target = target.to_path_buf();
    tokio::task::spawn_blocking(move || -> anyhow::Result<u64> {
        let mut archive = tar::Archive::new(SyncIoBridge::new(reader));
        // Modes come from the kernel: never setuid/setgid/sticky or world-writable, and
        // the process's umask applies as it would to a file created here.
        archive.set_preserve_permissions(false);
        archive.set_mask(umask() | 0o7002);
        let mut files = 0;
        for entry in archive.entries()? {
            let mut entry = entry?;
            let kind = entry.header().entry_type();
            if kind.is_file() || kind.is_dir() {
                entry.unpack_in(&target)?;
                files += u64::from(kind.is_file());
            }
        }
        Ok(files)
    })
    .await?
}

/// `--upload LOCAL[:PATH]`: LOCAL into the session's kernel at PATH (default: LOCAL's name),
/// before the first cell (starting the kernel).
pub async fn upload(
    orchestrator: &kernelbox::Orchestrator,
    session: &str,
    spec: &str,
) -> anyhow::Result<()> {
    let (local, path) = match spec.split_once(':') {
        Some((local, path)) => (PathBuf::from(local), path.to_string()),
        None => {
            let local = PathBuf::from(spec);
            let name = local
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (local, name)
        }
    };
    let source = open_local(&local).await?;
    let path = FilePath::parse(&path).with_context(|| format!("--upload {spec}"))?;
    let request = kernelbox::FileRequest::session(session);
    let written = orchestrator
        .write_file(&request, &path, source.tar, source.body)
        .await
        .with_context(|| format!("--upload {spec}"))?;
    eprintln!(
        "[kernelbox] uploaded {} -> {} ({} bytes)",
        local.display(),
        written.path,
        written.size
    );
    Ok(())
}

/// `--download PATH[:LOCAL]`: PATH out of the session's kernel to LOCAL (default: PATH's
/// name here), after the last cell; a directory comes as a tar and is unpacked.
pub async fn download(
    orchestrator: &kernelbox::Orchestrator,
    session: &str,
    spec: &str,
) -> anyhow::Result<()> {
    let (path, local) = match spec.split_once(':') {
        Some((path, local)) => (path, Some(PathBuf::from(local))),
        None => (spec, None),
    };
    let request = kernelbox::FileRequest::session(session);
    let checked = FilePath::parse(path).with_context(|| format!("--download {spec}"))?;
    let found = orchestrator
        .read_file(&request, &checked, true)
        .await
        .with_context(|| format!("--download {spec}"))?;
    match found {
        kernelbox::Download::File { body, .. } => {
            let target = local_target(path, local.as_deref());
            let size = save_file(body, &target).await?;
            eprintln!(
                "[kernelbox] downloaded {path} -> {} ({size} bytes)",
                target.display()
            );
        }
        kernelbox::Download::Tar { body } => {
            let target = local.unwrap_or_else(|| local_target(path, None));
            let files = save_tar(body, &target).await?;
            eprintln!(
                "[kernelbox] downloaded {path} -> {} ({files} files)",
                target.display()
            );
        }
        kernelbox::Download::Dir(_) => anyhow::bail!("--download {spec}: unexpected listing"),
    }
    Ok(())
}
