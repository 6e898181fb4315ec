//! Host measurements, from `free` and `/proc`: used memory and the engine's helper processes
//! (taken together as a [`HostMemory`] snapshot), a container's memory cgroup, this process's
//! RSS, the load average and the machine's description.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use tokio::process::Command;

pub const MIB: f64 = 1024.0 * 1024.0;

/// Per-kind helper processes: (processes, summed PSS bytes).
type Helpers = BTreeMap<&'static str, (usize, u64)>;

/// What the host spends on memory at one moment: `free -b` "used" and the helper processes.
pub struct HostMemory {
    used: u64,
    helpers: Helpers,
}

/// A helper kind's growth between two [`HostMemory`] snapshots.
pub struct HelperDelta {
    pub kind: &'static str,
    pub processes_added: usize,
    pub pss_delta_bytes: i64,
}

impl HostMemory {
    pub async fn take() -> Result<HostMemory> {
        let used = host_used_bytes().await?;
        Ok(HostMemory {
            used,
            helpers: helper_memory(),
        })
    }

    pub fn used_bytes(&self) -> u64 {
        self.used
    }

    /// Growth of "used" since `before`, per each of `n` objects, in MiB.
    pub fn mib_per(&self, before: &HostMemory, n: usize) -> f64 {
        (self.used as f64 - before.used as f64) / n as f64 / MIB
    }

    /// Growth of each helper kind present now since `before`.
    pub fn helpers_since(&self, before: &HostMemory) -> Vec<HelperDelta> {
        self.helpers
            .iter()
            .map(|(kind, (count1, pss1))| {
                let (count0, pss0) = before.helpers.get(kind).copied().unwrap_or_default();
                HelperDelta {
                    kind,
                    processes_added: count1.saturating_sub(count0),
                    pss_delta_bytes: *pss1 as i64 - pss0 as i64,
                }
            })
            .collect()
    }
}

/// The number in a `/proc` line `NAME  VALUE kB`, in bytes.
fn kib_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map(|kib| kib * 1024)
}

/// `free -b` "used" (falls back to MemTotal − MemAvailable from /proc/meminfo).
async fn host_used_bytes() -> Result<u64> {
    if let Ok(out) = Command::new("free").arg("-b").output().await {
        let text = String::from_utf8_lossy(&out.stdout);
        if let Some(used) = text
            .lines()
            .find(|l| l.starts_with("Mem:"))
            .and_then(|l| l.split_whitespace().nth(2))
            .and_then(|v| v.parse().ok())
        {
            return Ok(used);
        }
    }
    let info = std::fs::read_to_string("/proc/meminfo")?;
    match (
        kib_field(&info, "MemTotal:"),
        kib_field(&info, "MemAvailable:"),
    ) {
        (Some(t), Some(a)) => Ok(t.saturating_sub(a)),
        _ => bail!("cannot read host memory"),
    }
}

/// Per-container host helpers (containerd shims, fuse-overlayfs) and the engine's daemons:
/// (processes, summed PSS).
fn helper_memory() -> Helpers {
    let mut out = Helpers::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let path = entry.path();
        let Ok(comm) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let kind = match comm.trim() {
            c if c.starts_with("containerd-shim") => "containerd-shim",
            "fuse-overlayfs" => "fuse-overlayfs",
            // The daemons themselves: their growth is per-kernel bookkeeping.
            "dockerd" => "dockerd",
            "containerd" => "containerd",
            _ => continue,
        };
        let pss = std::fs::read_to_string(path.join("smaps_rollup"))
            .ok()
            .and_then(|t| kib_field(&t, "Pss:"))
            .unwrap_or(0);
        let slot = out.entry(kind).or_default();
        slot.0 += 1;
        slot.1 += pss;
    }
    out
}

/// This process's resident set (VmRSS): the library runs in it.
pub fn vm_rss_bytes() -> Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    kib_field(&status, "VmRSS:").ok_or_else(|| anyhow!("no VmRSS in /proc/self/status"))
}

/// A container's memory cgroup: (charged bytes, anonymous bytes), cgroup v1 or v2.
pub fn cgroup_memory(id: &str) -> Option<(u64, u64)> {
    let read = |p: PathBuf| std::fs::read_to_string(p).ok();
    let stat_field = |text: &str, key: &str| -> Option<u64> {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == key).then(|| v.trim().parse().ok()).flatten()
        })
    };
    let v1 = Path::new("/sys/fs/cgroup/memory/docker").join(id);
    if let Some(usage) = read(v1.join("memory.usage_in_bytes")) {
        let stat = read(v1.join("memory.stat")).unwrap_or_default();
        let anon = stat_field(&stat, "total_rss").or_else(|| stat_field(&stat, "rss"))?;
        return Some((usage.trim().parse().ok()?, anon));
    }
    for dir in [
        PathBuf::from(format!("/sys/fs/cgroup/system.slice/docker-{id}.scope")),
        Path::new("/sys/fs/cgroup/docker").join(id),
    ] {
        if let Some(current) = read(dir.join("memory.current")) {
            let stat = read(dir.join("memory.stat")).unwrap_or_default();
            return Some((current.trim().parse().ok()?, stat_field(&stat, "anon")?));
        }
    }
    None
}

/// Cores, memory, kernel release and load average, for the report's heading.
pub fn machine() -> Value {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| kib_field(&m, "MemTotal:"))
        .map(|bytes| bytes as f64 / MIB / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    json!({"cores": cores, "memory_gib": (mem * 10.0).round() / 10.0, "kernel": kernel, "loadavg": loadavg()})
}

/// The 1-minute load average: other work on the host (builds, tests) skews the figures.
pub fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(f64::NAN)
}

/// One process of a container, or of the engine on its behalf, by smaps_rollup.
pub struct ContainerProcess {
    /// `init` (the container's first process: docker-init), its children by `comm`
    /// (`python3`, `sleep`), `containerd-shim` or `fuse-overlayfs`.
    pub name: String,
    pub pss_bytes: u64,
    pub anon_bytes: u64,
}

/// The processes one container costs the host: its own (init and init's children), its
/// containerd shim (init's parent) and, on a fuse-overlayfs engine, the mount's process (the
/// one whose command line names the container's merged directory). Empty when the container
/// cannot be inspected.
pub async fn container_processes(id: &str) -> Vec<ContainerProcess> {
    let Ok(out) = Command::new("docker")
        .args([
            "inspect",
            "-f",
            "{{.State.Pid}} {{.GraphDriver.Data.MergedDir}}",
            id,
        ])
        .output()
        .await
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let mut fields = text.split_whitespace();
    let Some(pid) = fields.next().and_then(|p| p.parse::<u32>().ok()) else {
        return Vec::new();
    };
    let merged = fields.next().unwrap_or_default().to_string();
    let rollup = |name: &str, pid: u32| -> Option<ContainerProcess> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
        Some(ContainerProcess {
            name: name.to_string(),
            pss_bytes: kib_field(&text, "Pss:")?,
            anon_bytes: kib_field(&text, "Anonymous:").unwrap_or(0),
        })
    };
    let mut found: Vec<ContainerProcess> = rollup("init", pid).into_iter().collect();
    let children =
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
        let comm = std::fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
        found.extend(rollup(comm.trim(), child));
    }
    let parent = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            // The fields after the command's closing parenthesis: state, then the parent.
            let rest = s.rsplit_once(')')?.1.to_string();
            rest.split_whitespace().nth(1)?.parse::<u32>().ok()
        });
    if let Some(shim) = parent {
        found.extend(rollup("containerd-shim", shim));
    }
    if !merged.is_empty() && merged != "<no value>" {
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let path = entry.path();
                let is_fuse = std::fs::read_to_string(path.join("comm"))
                    .is_ok_and(|c| c.trim() == "fuse-overlayfs");
                if !is_fuse {
                    continue;
                }
                let cmdline = std::fs::read(path.join("cmdline")).unwrap_or_default();
                let names_it = cmdline
                    .windows(merged.len())
                    .any(|w| w == merged.as_bytes());
                let fuse_pid = entry.file_name().to_str().and_then(|p| p.parse().ok());
                if let (true, Some(fuse_pid)) = (names_it, fuse_pid) {
                    found.extend(rollup("fuse-overlayfs", fuse_pid));
                }
            }
        }
    }
    found
}

/// `name anon/pss MiB` for each process, for a row.
pub fn describe_processes(processes: &[ContainerProcess]) -> String {
    processes
        .iter()
        .map(|p| {
            format!(
                "{} {:.2}/{:.2}",
                p.name,
                p.anon_bytes as f64 / MIB,
                p.pss_bytes as f64 / MIB
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}
