//! Files written into a kernel's staging volume from the host (output spills), owned by the
//! kernel's user so cells can read and delete them.

use bytes::Bytes;

use super::{parse_user, Kernel, WORK_DIR};
use crate::clock::unix_now;
use crate::docker::EngineError;

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
