//! Files written into a kernel's staging volume from the host (output spills), owned by the
//! kernel's user so cells can read and delete them; and the lifetime of a session's files
//! volume, which its contexts' kernels share at `/work` (`docs/contract.md`, "Languages").

use bytes::Bytes;

use super::{parse_user, Kernel, KernelError, WORK_DIR};
use crate::clock::unix_now;
use crate::docker::{remove_volume_when_free, Engine, EngineError};

/// Removes the files volume `name` once no container that has it at `/work` is left (each
/// carries [`crate::labels::FILES`]): the last of a session's contexts' kernels to go takes
/// it, a reset or loss of another leaves it. The engine's own count is the guard against a
/// kernel being made meanwhile: a volume a container uses is not removed, and a container
/// made after the removal is caught by [`verify_files`].
pub(crate) async fn release_files(engine: &dyn Engine, name: &str) -> Result<(), EngineError> {
    let users = engine
        .list_containers(&[format!("{}={name}", crate::labels::FILES)])
        .await?;
    if users.is_empty() {
        remove_volume_when_free(engine, name).await
    } else {
        Ok(())
    }
}

/// Checks that the files volume `name` a new container mounts is still kernelbox's: had its
/// last kernel removed it meanwhile, the engine made a bare one of that name with the
/// container, which [`KernelError::FilesGone`] names for removal.
pub(crate) async fn verify_files(engine: &dyn Engine, name: &str) -> Result<(), KernelError> {
    let ours = engine
        .list_volumes(
            &[format!(
                "{}={}",
                crate::labels::MANAGED_BY,
                crate::labels::MANAGED_BY_VALUE
            )],
            false,
        )
        .await?;
    if ours.iter().any(|v| v.name == name) {
        Ok(())
    } else {
        Err(KernelError::FilesGone {
            volume: name.to_string(),
        })
    }
}

impl Kernel {
    /// Writes a file into the kernel's staging volume (used for output spills).
    pub(crate) async fn write_staging_file(
        &self,
        name: &str,
        data: &[u8],
    ) -> Result<String, EngineError> {
        // Spills are owned by the kernel's user so cells can read and delete them.
        let (uid, gid) = parse_user(&self.user);
        let mut builder = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_size(0);
        dir.set_mode(0o755);
        dir.set_uid(uid);
        dir.set_gid(gid);
        dir.set_mtime(unix_now());
        dir.set_cksum();
        let staging = self.spill_dir.clone();
        let (upload_root, rel_dir) = match staging.strip_prefix(&format!("{WORK_DIR}/")) {
            Some(rel) => (WORK_DIR.to_string(), format!("{rel}/")),
            None => (staging.clone(), String::new()),
        };
        if !rel_dir.is_empty() {
            builder
                .append_data(&mut dir, &rel_dir, std::io::empty())
                .map_err(|e| tar_err(&self.id, e))?;
        }
        let mut file = tar::Header::new_gnu();
        file.set_size(data.len() as u64);
        file.set_mode(0o644);
        file.set_uid(uid);
        file.set_gid(gid);
        file.set_mtime(unix_now());
        file.set_cksum();
        builder
            .append_data(&mut file, format!("{rel_dir}{name}"), data)
            .map_err(|e| tar_err(&self.id, e))?;
        let archive = builder.into_inner().map_err(|e| tar_err(&self.id, e))?;
        self.engine
            .upload(&self.id, &upload_root, Bytes::from(archive))
            .await?;
        Ok(format!("{staging}/{name}"))
    }
}

fn tar_err(id: &str, e: std::io::Error) -> EngineError {
    EngineError::Other {
        op: "build archive",
        target: id.to_string(),
        message: e.to_string(),
    }
}
