//! What a kernel is made from: its image, working mode, runtime and sandbox ([`KernelSpec`],
//! consumed by `src/kernel/spawn.rs`).

use std::path::PathBuf;

/// The default kernel image, built by `kernelbox image build`.
pub const DEFAULT_IMAGE: &str = "kernelbox/kernel:latest";

/// Where a kernel works: its own staging volume, or a bind-mounted project directory.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum WorkMode {
    /// The kernel's staging volume is its working directory (the default).
    Strict,
    /// The given host directory is bind-mounted as the working directory.
    Project(PathBuf),
}

impl WorkMode {
    /// A short name for labels and keys.
    pub fn name(&self) -> &'static str {
        match self {
            WorkMode::Strict => "strict",
            WorkMode::Project(_) => "project",
        }
    }
}

/// The OCI runtime a kernel's container runs under (`docs/runtimes.md`): per server
/// (`--runtime`) and per tenant (the tenants file's `runtime`).
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum KernelRuntime {
    /// The engine's runc: namespaces and cgroups on the host's kernel (the default).
    #[default]
    Runc,
    /// gVisor's runsc: the kernel's system calls served by a user-space kernel, no network
    /// stack at all (the engine must have it registered; `.ci/runsc`).
    Runsc,
}

impl KernelRuntime {
    /// The name the engine registers it under (`HostConfig.Runtime`), and kernelbox's.
    pub fn name(self) -> &'static str {
        match self {
            KernelRuntime::Runc => "runc",
            KernelRuntime::Runsc => "runsc",
        }
    }

    /// `runc` or `runsc`; anything else is refused, naming the two.
    pub fn parse(text: &str) -> Result<KernelRuntime, String> {
        match text {
            "runc" => Ok(KernelRuntime::Runc),
            "runsc" => Ok(KernelRuntime::Runsc),
            other => Err(format!("{other:?} is not a kernel runtime (runc or runsc)")),
        }
    }
}

impl std::fmt::Display for KernelRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How each kernel container is confined. Every field has a hardened default.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    /// Docker network mode; `none` means no interface but loopback.
    pub network_mode: String,
    /// Memory limit in bytes (swap is set to the same value, so there is no swap).
    pub memory_bytes: i64,
    /// CPU limit in billionths of a CPU.
    pub nano_cpus: i64,
    /// Maximum number of processes and threads.
    pub pids_limit: i64,
    /// Mount the image's root filesystem read-only.
    pub readonly_rootfs: bool,
    /// Size of the tmpfs mounted at /tmp, in bytes.
    pub tmp_bytes: u64,
    /// `uid:gid` the kernel runs as; never root by default.
    pub user: String,
    /// Size of the staging volume when memory-backed (the default); `None` puts it on the
    /// host's disk, unbounded, and needs an image whose `/work` the kernel user owns.
    pub work_bytes: Option<u64>,
    /// The OCI runtime (the server's; a tenant's own is in [`Config::tenant_runtimes`]).
    pub runtime: KernelRuntime,
    /// The container stays when its process stops, until kernelbox removes it (set when
    /// kernels hibernate: a checkpoint stops the container it keeps; `docs/runtimes.md`);
    /// otherwise the engine removes it by itself.
    pub keep_stopped: bool,
}

impl Sandbox {
    /// The mount options of the tmpfs at `/tmp`: what the engine is asked for (and what the
    /// bench's `docker run` floor passes to `--tmpfs`).
    pub fn tmp_mount_options(&self) -> String {
        format!("rw,nosuid,nodev,size={},mode=1777", self.tmp_bytes)
    }
}

impl Default for Sandbox {
    fn default() -> Self {
        Sandbox {
            network_mode: "none".into(),
            memory_bytes: 512 * 1024 * 1024,
            nano_cpus: 1_000_000_000,
            pids_limit: 256,
            readonly_rootfs: true,
            tmp_bytes: 256 * 1024 * 1024,
            user: "10000:10000".into(),
            work_bytes: Some(256 * 1024 * 1024),
            runtime: KernelRuntime::Runc,
            keep_stopped: false,
        }
    }
}

/// Where the working directory is inside every kernel, in both modes (the staging volume in
/// strict mode, the bind-mounted project directory in project mode).
pub const WORK_DIR: &str = "/work";

/// What a kernel is made from, whoever owns it: the pool is keyed by it, so a pooled kernel is
/// handed only to an owner whose kernel would have been made the same way.
#[derive(Debug, Clone, PartialEq)]
pub struct KernelSpec {
    /// The image; any image with python3 >= 3.8.
    pub image: String,
    /// Strict (staging volume) or project (bind mount) working directory.
    pub mode: WorkMode,
    /// The confinement (memory, CPU, pids, user, ...).
    pub sandbox: Sandbox,
}

impl Default for KernelSpec {
    fn default() -> Self {
        KernelSpec {
            image: DEFAULT_IMAGE.into(),
            mode: WorkMode::Strict,
            sandbox: Sandbox::default(),
        }
    }
}
