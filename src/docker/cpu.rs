//! A container's CPU time, read from its cgroup (`docs/reliability.md`, "Runaway kernels"):
//! the orchestrator's runaway watch samples kernels with it between cells, and `kernelbox ps`
//! shows a kernel computing with no cell running as busy. One read is a small
//! file in the cgroup filesystem (tens of microseconds, against about a second per container
//! for the engine's stats API), and blocking: callers batch their reads off the async threads.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Where the cgroup hierarchies are mounted.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Longest cgroup file read, in bytes (`cpuacct.usage` is one number, `cpu.stat` a few lines).
const MAX_CPU_FILE: u64 = 4096;

/// The file holding a container's CPU time, found once per kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CpuFile {
    /// cgroup v1 `cpuacct.usage`: nanoseconds.
    Usage(PathBuf),
    /// cgroup v2 `cpu.stat`: its `usage_usec` line, microseconds.
    Stat(PathBuf),
}

/// Reading a container's CPU time failed.
#[derive(Debug, thiserror::Error)]
pub enum CpuReadError {
    /// No cgroup layout this host knows has the container's CPU time.
    #[error(
        "reading a container's CPU time: no cgroup file for container {0} under {CGROUP_ROOT}"
    )]
    NotFound(String),
    /// The file could not be read.
    #[error("reading a container's CPU time from {path}: {source}")]
    Io {
        /// The cgroup file read.
        path: PathBuf,
        /// What the system said.
        source: std::io::Error,
    },
    /// The file held no CPU time.
    #[error("reading a container's CPU time from {0}: no usage in it")]
    Unparsable(PathBuf),
}

/// Longest memory cgroup file read, in bytes (one number).
const MAX_MEMORY_FILE: u64 = 64;

/// The highest memory use of the container `id` (its full id) so far, in bytes, from its memory
/// cgroup (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`); `None` when no layout this host
/// knows has it. Blocking.
pub fn memory_peak(id: &str) -> Option<u64> {
    let root = Path::new(CGROUP_ROOT);
    let scope = format!("system.slice/docker-{id}.scope");
    let cgroupfs = format!("docker/{id}");
    let files = [&cgroupfs, &scope]
        .map(|dir| {
            root.join("memory")
                .join(dir)
                .join("memory.max_usage_in_bytes")
        })
        .into_iter()
        .chain([&scope, &cgroupfs].map(|dir| root.join(dir).join("memory.peak")));
    files.into_iter().find_map(|path| {
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_MEMORY_FILE).read_to_string(&mut text))
            .ok()?;
        text.trim().parse().ok()
    })
}

impl CpuFile {
    /// The first file present of the layouts the engine uses (cgroup v1 with the cgroupfs or
    /// the systemd driver, cpu and cpuacct mounted apart or together; cgroup v2 likewise), for
    /// the container `id` (its full id). Blocking.
    pub fn find(id: &str) -> Result<CpuFile, CpuReadError> {
        Self::find_under(Path::new(CGROUP_ROOT), id)
    }

    fn find_under(root: &Path, id: &str) -> Result<CpuFile, CpuReadError> {
        let scope = format!("system.slice/docker-{id}.scope");
        let cgroupfs = format!("docker/{id}");
        let v1 = ["cpuacct", "cpu,cpuacct", "cpuacct,cpu"];
        let usage = v1.iter().flat_map(|hierarchy| {
            [&cgroupfs, &scope]
                .map(|dir| CpuFile::Usage(root.join(hierarchy).join(dir).join("cpuacct.usage")))
        });
        let stat = [&scope, &cgroupfs].map(|dir| CpuFile::Stat(root.join(dir).join("cpu.stat")));
        usage
            .chain(stat)
            .find(|file| file.path().is_file())
            .ok_or_else(|| CpuReadError::NotFound(super::short_id(id).to_string()))
    }

    fn path(&self) -> &Path {
        match self {
            CpuFile::Usage(path) | CpuFile::Stat(path) => path,
        }
    }

    /// The container's CPU time so far, in nanoseconds. Blocking.
    pub fn read_ns(&self) -> Result<u64, CpuReadError> {
        let path = self.path();
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_CPU_FILE).read_to_string(&mut text))
            .map_err(|source| CpuReadError::Io {
                path: path.to_path_buf(),
                source,
            })?;
        let parsed = match self {
            CpuFile::Usage(_) => text.trim().parse::<u64>().ok(),
            CpuFile::Stat(_) => text.lines().find_map(|line| {
                let usec = line
                    .strip_prefix("usage_usec ")?
                    .trim()
                    .parse::<u64>()
                    .ok()?;
                usec.checked_mul(1000)
            }),
        };
        parsed.ok_or_else(|| CpuReadError::Unparsable(path.to_path_buf()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[test]
    fn each_cgroup_layout_is_found_and_read_in_nanoseconds() {
        let root = std::env::temp_dir().join(format!("kernelbox-cpu-{}", uuid::Uuid::new_v4()));
        let id = "ab".repeat(32);
        assert!(matches!(
            CpuFile::find_under(&root, &id),
            Err(CpuReadError::NotFound(_))
        ));
        // cgroup v2, systemd driver.
        let v2 = root.join(format!("system.slice/docker-{id}.scope/cpu.stat"));
        write(&v2, "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\n");
        let file = CpuFile::find_under(&root, &id).unwrap();
        assert_eq!(file, CpuFile::Stat(v2));
        assert_eq!(file.read_ns().unwrap(), 1_500_000);
        // cgroup v1, cgroupfs driver, cpuacct mounted alone (as on the CI host): preferred.
        let v1 = root.join(format!("cpuacct/docker/{id}/cpuacct.usage"));
        write(&v1, "33157391\n");
        let file = CpuFile::find_under(&root, &id).unwrap();
        assert_eq!(file, CpuFile::Usage(v1.clone()));
        assert_eq!(file.read_ns().unwrap(), 33_157_391);
        write(&v1, "not a number\n");
        assert!(matches!(file.read_ns(), Err(CpuReadError::Unparsable(_))));
        std::fs::remove_dir_all(&root).unwrap();
        assert!(matches!(file.read_ns(), Err(CpuReadError::Io { .. })));
    }
}
