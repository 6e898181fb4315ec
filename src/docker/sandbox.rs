//! How a kernel's container is confined: the OCI runtime it runs under ([`KernelRuntime`]) and
//! its limits and hardening ([`Sandbox`]), as every [`ContainerSpec`](super::ContainerSpec)
//! carries them. The defaults are the hardened ones; the configuration (`src/config/`) chooses
//! them and checks them once.

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
    /// The OCI runtime (the server's; a tenant's own is in the configuration's
    /// `tenant_runtimes`).
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
