//! A workspace's disk: a sparse image file of the quota's size holding an ext4 file system,
//! attached to a loop device the engine mounts as the workspace's volume
//! (`docs/workspaces.md`, "Quota"). The file never grows past its size, so a full workspace
//! gives `ENOSPC` inside and takes nothing more from the host; mounted with `discard`, the
//! blocks a cell frees go back to the host.
//!
//! A loop device is held only while the workspace is used: [`attach`] binds it (or finds it
//! bound), opens it (a [`DeviceHold`]) and marks it to be released by the kernel when its
//! last user closes it (`losetup -d` on a device in use sets its autoclear). The hold lasts
//! until the kernel's container is started (its mount then holds the device); when the
//! container stops and the engine unmounts the volume, the device goes.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::WorkspaceError;

/// How long one of the host's tools (`mkfs.ext4`, `losetup`) may take.
const TOOL_DEADLINE: Duration = Duration::from_secs(60);

/// Longest output of a tool kept for an error message.
const MAX_TOOL_MESSAGE: usize = 512;

/// Runs one of the host's tools to its end under [`TOOL_DEADLINE`]; its stdout on success.
async fn run(op: &'static str, program: &str, args: &[&str]) -> Result<String, WorkspaceError> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(TOOL_DEADLINE, child).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => {
            return Err(WorkspaceError::Tool {
                op,
                message: format!("{program}: {e}"),
            })
        }
        Err(_) => {
            return Err(WorkspaceError::Tool {
                op,
                message: format!("{program} did not finish within {TOOL_DEADLINE:?}"),
            })
        }
    };
    if !output.status.success() {
        let mut message = String::from_utf8_lossy(&output.stderr).trim().to_string();
        message.truncate(MAX_TOOL_MESSAGE);
        return Err(WorkspaceError::Tool {
            op,
            message: format!("{program} {}: {message}", output.status),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn io_err(op: &'static str, path: &Path, source: std::io::Error) -> WorkspaceError {
    WorkspaceError::Io {
        op,
        path: path.to_path_buf(),
        source,
    }
}

/// Creates the image `path` of `size` bytes (sparse) with an empty ext4 file system whose
/// root belongs to `uid:gid` and no blocks reserved for root. Nothing is left on failure.
pub(super) async fn create(
    path: &Path,
    size: u64,
    uid: u64,
    gid: u64,
) -> Result<(), WorkspaceError> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| io_err("create the workspace image", path, e))?;
    let made = async {
        file.set_len(size)
            .map_err(|e| io_err("size the workspace image", path, e))?;
        drop(file);
        let owner = format!("root_owner={uid}:{gid}");
        let target = path.to_string_lossy();
        run(
            "make the workspace's file system",
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", "-E", &owner, &target],
        )
        .await
        .map(|_| ())
    }
    .await;
    if made.is_err() {
        let _ = std::fs::remove_file(path);
    }
    made
}

/// The loop devices `path` is attached to.
async fn attached(path: &Path) -> Result<Vec<String>, WorkspaceError> {
    let target = path.to_string_lossy();
    let out = run(
        "find the workspace's loop device",
        "losetup",
        &["-j", &target],
    )
    .await?;
    // One line per device: `/dev/loop3: [2049]:1234 (/path/to/image)`.
    Ok(out
        .lines()
        .filter_map(|l| l.split_once(':').map(|(dev, _)| dev.trim().to_string()))
        .filter(|dev| dev.starts_with("/dev/"))
        .collect())
}

/// An open loop device: while any clone of it lives, the device stays bound to its image
/// (see the module's documentation). Equal to any other (it is no part of what a workspace
/// is).
#[derive(Debug, Clone, Default)]
pub struct DeviceHold {
    _device: Option<std::sync::Arc<std::fs::File>>,
}

impl PartialEq for DeviceHold {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for DeviceHold {}

/// How many times [`attach`] tries when the device it found went between finding and opening
/// it (its last user closed it just then).
const ATTACH_TRIES: usize = 3;

/// Binds the image `path` to a loop device: `preferred` when it is free (the device its volume
/// already names, so the volume need not be made anew), else the first free one.
async fn bind(path: &Path, preferred: Option<&str>) -> Result<String, WorkspaceError> {
    let target = path.to_string_lossy();
    if let Some(dev) = preferred.filter(|d| d.starts_with("/dev/loop")) {
        if run(
            "attach the workspace to a loop device",
            "losetup",
            &[dev, &target],
        )
        .await
        .is_ok()
        {
            return Ok(dev.to_string());
        }
    }
    let out = run(
        "attach the workspace to a loop device",
        "losetup",
        &["--find", "--show", &target],
    )
    .await?;
    let dev = out.trim().to_string();
    if dev.starts_with("/dev/") {
        Ok(dev)
    } else {
        Err(WorkspaceError::Tool {
            op: "attach the workspace to a loop device",
            message: format!("losetup printed {dev:?}"),
        })
    }
}

/// The loop device of the image `path` (bound now if it is not yet; `preferred` as
/// [`bind`] takes it), held open, and marked to go when its last user closes it.
pub(super) async fn attach(
    path: &Path,
    preferred: Option<&str>,
) -> Result<(String, DeviceHold), WorkspaceError> {
    for _ in 0..ATTACH_TRIES {
        let dev = match attached(path).await?.into_iter().next() {
            Some(dev) => dev,
            None => bind(path, preferred).await?,
        };
        let Ok(file) = std::fs::File::open(&dev) else {
            continue;
        };
        // Still this image's once held: bound to it until the hold and every mount are gone.
        if !attached(path).await?.contains(&dev) {
            continue;
        }
        run(
            "mark the workspace's loop device for release",
            "losetup",
            &["-d", &dev],
        )
        .await?;
        return Ok((
            dev,
            DeviceHold {
                _device: Some(std::sync::Arc::new(file)),
            },
        ));
    }
    Err(WorkspaceError::Tool {
        op: "attach the workspace to a loop device",
        message: format!("its loop device went {ATTACH_TRIES} times while it was opened"),
    })
}

/// Bytes of the file system holding `dir` that are free for unprivileged use, or `None`
/// when it cannot be read.
pub(super) fn free_bytes(dir: &Path) -> Option<u64> {
    let st = rustix::fs::statvfs(dir).ok()?;
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// The workspace images in `dir`: each one's size (its quota) and the bytes it takes.
pub(super) fn images(dir: &Path) -> Vec<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".img"))
        .filter_map(|e| e.metadata().ok())
        .filter(|m| m.is_file())
        .map(|m| (m.len(), (m.blocks() * 512).min(m.len())))
        .collect()
}

/// Detaches the image from its loop devices and deletes it with its generation's stamp; a
/// missing image is a success.
pub(super) async fn destroy(path: &Path) -> Result<(), WorkspaceError> {
    let stamp = stamp_path(path);
    match std::fs::remove_file(&stamp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err("delete the workspace's generation stamp", &stamp, e)),
    }
    if !path.exists() {
        return Ok(());
    }
    for dev in attached(path).await? {
        run(
            "detach the workspace's loop device",
            "losetup",
            &["-d", &dev],
        )
        .await?;
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("delete the workspace image", path, e)),
    }
}

/// Bytes the image takes on the host (its allocated blocks, at most its size).
pub(super) fn used_bytes(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| (m.blocks() * 512).min(m.len()))
        .unwrap_or(0)
}

/// When the workspace was last used (its image's modification time), Unix seconds.
pub(super) fn last_used(path: &Path) -> u64 {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Records a use of the workspace now (its image's modification time).
pub(super) fn touch(path: &Path) -> Result<(), WorkspaceError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(SystemTime::now()))
        .map_err(|e| io_err("record the workspace's use", path, e))
}

/// Sets the time of the workspace's last use (tests age a workspace with it).
pub(super) fn set_last_used(path: &Path, at: SystemTime) -> Result<(), WorkspaceError> {
    std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(at))
        .map_err(|e| io_err("record the workspace's use", path, e))
}

/// The file beside the image `path` holding the workspace's generation (`docs/workspaces.md`,
/// "In a cluster").
fn stamp_path(path: &Path) -> PathBuf {
    path.with_extension("gen")
}

/// Longest stamp file read (a decimal `u64`).
const MAX_STAMP: u64 = 32;

/// The generation stamped on the image `path`: `None` when it has none (an image made before
/// generations were kept) or the stamp is not a number.
pub(super) fn stamped(path: &Path) -> Option<u64> {
    use std::io::Read;
    let mut text = String::new();
    std::fs::File::open(stamp_path(path))
        .ok()?
        .take(MAX_STAMP)
        .read_to_string(&mut text)
        .ok()?;
    text.trim().parse().ok()
}

/// Stamps the image `path` with `generation` (written aside, then renamed into place: a
/// crash leaves the old stamp or the new one, never half of one).
pub(super) fn stamp(path: &Path, generation: u64) -> Result<(), WorkspaceError> {
    let stamp = stamp_path(path);
    let partial = path.with_extension("gen.partial");
    std::fs::write(&partial, generation.to_string())
        .and_then(|()| std::fs::rename(&partial, &stamp))
        .map_err(|e| io_err("stamp the workspace's generation", &stamp, e))
}

/// The image of the workspace volume `volume` in `dir`.
pub(super) fn image_path(dir: &Path, volume: &str) -> PathBuf {
    dir.join(format!("{volume}.img"))
}
