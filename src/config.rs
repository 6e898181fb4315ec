//! Configuration: resolved and validated once ([`Config::validate`] gives a [`ValidConfig`]),
//! then passed around as a value. Its fields are grouped by who consumes them: what a kernel is
//! made from ([`KernelSpec`], `src/kernel/spawn.rs`), what one cell may do ([`CellLimits`]:
//! the orchestrator's execute path, and `src/kernel/run.rs` for the output and display caps),
//! the host's kernels ([`KernelLimits`]: the registry, the reaper, the spawn deadline), the
//! warm pool ([`PoolConfig`]), file transfers ([`FileTransfer`]: `src/kernel/files/` and the
//! orchestrator's file calls), and what this instance leaves behind ([`Housekeeping`]). Every
//! default is here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// The default kernel image, built by `kernelbox image build`.
pub const DEFAULT_IMAGE: &str = "kernelbox/kernel:latest";

/// The default cap on a cell's output kept inline in its result ([`OutputCaps::inline_bytes`]).
pub const DEFAULT_OUTPUT_INLINE_BYTES: usize = 50_000;

/// The default cap on a cell's output kept for its spill file ([`OutputCaps::spill_bytes`]).
pub const DEFAULT_OUTPUT_SPILL_BYTES: usize = 5_000_000;

/// The default cap on one display ([`DisplayCaps::bundle_bytes`]): 5 MiB of its JSON.
pub const DEFAULT_DISPLAY_BUNDLE_BYTES: usize = 5 * 1024 * 1024;

/// The default cap on a cell's displays ([`DisplayCaps::cell_bytes`]): 20 MiB of their JSON.
pub const DEFAULT_DISPLAY_CELL_BYTES: usize = 20 * 1024 * 1024;

/// The default [`CellLimits::interrupt_grace`]: how long an interrupted cell may take to stop
/// on its KeyboardInterrupt before its kernel is killed (`docs/contract.md`, "Statuses").
pub const DEFAULT_INTERRUPT_GRACE: Duration = Duration::from_secs(5);

/// Shell commands (`POST /v1/sessions/{session}/commands`) one session's kernel runs at once;
/// one more is refused (429 `too_many_commands`, `docs/contract.md` "Commands"). Commands and
/// cells also count among the calls attached to a kernel (`MAX_ATTACHED_PER_SLOT`).
pub const MAX_COMMANDS_PER_SESSION: usize = 4;

/// The default cap on one upload ([`FileTransfer::max_upload_bytes`]: a file, or a tar
/// archive's bytes): 100 MiB.
pub const DEFAULT_MAX_UPLOAD_BYTES: u64 = 100 * 1024 * 1024;

/// What each display counts against [`DisplayCaps::cell_bytes`] beyond its JSON: the host's
/// memory for a result's structure, so a flood of tiny displays is bounded too.
pub const DISPLAY_OVERHEAD_BYTES: usize = 1024;

/// Where a kernel works: its own staging volume, or a bind-mounted project directory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
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
        }
    }
}

/// Where the working directory is inside every kernel, in both modes (the staging volume in
/// strict mode, the bind-mounted project directory in project mode).
pub const WORK_DIR: &str = "/work";

/// Everything an [`Orchestrator`](crate::Orchestrator) needs, checked once by
/// [`Config::validate`].
#[derive(Debug, Clone)]
pub struct Config {
    /// What every kernel is made from: image, working mode, confinement.
    pub spec: KernelSpec,
    /// What one cell may take: its timeout, tool calls, output and displays.
    pub cells: CellLimits,
    /// How many kernels the host runs, how long one may take to start and stay idle.
    pub kernels: KernelLimits,
    /// The warm pool: ready kernels kept for new owners, and for how long.
    pub pool: PoolConfig,
    /// File transfers in and out of kernels.
    pub files: FileTransfer,
    /// What this instance labels, sweeps, watches and keeps on disk.
    pub housekeeping: Housekeeping,
    /// Tenant recorded on kernels created by library callers that name none.
    pub default_tenant: String,
    /// Network egress by policy (`docs/reliability.md`, "Network egress"); `None`: no kernel
    /// has a network.
    pub egress: Option<EgressConfig>,
    /// Tenants whose kernels run under another runtime than the server's
    /// (`spec.sandbox.runtime`): the tenants file's `runtime` (`docs/runtimes.md`).
    pub tenant_runtimes: BTreeMap<String, KernelRuntime>,
    /// Workspaces: a session's `/work` kept past its kernel (`docs/workspaces.md`); `None`:
    /// no tenant has them.
    pub workspaces: Option<WorkspacesConfig>,
}

/// Workspaces: where their disk images live and each tenant's policy; a tenant listed has a
/// workspace for every session (`docs/workspaces.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspacesConfig {
    /// Directory of the workspaces' disk images (created if missing); the engine must see it
    /// at the same path (an engine on this host).
    pub dir: PathBuf,
    /// Each tenant's policy; a tenant not here has no workspaces.
    pub tenants: BTreeMap<String, WorkspacePolicy>,
}

/// One tenant's workspaces: how big each may grow, how long one is kept after its last
/// use, how many the tenant may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkspacePolicy {
    /// Size of each workspace's file system, bytes: a cell writing past it gets `ENOSPC`.
    pub quota_bytes: u64,
    /// A workspace unused for longer than this is deleted by the reaper.
    pub ttl: Duration,
    /// Workspaces the tenant may hold at once.
    pub max: usize,
}

/// Smallest workspace quota: room for the file system's own structures.
pub const MIN_WORKSPACE_QUOTA: u64 = 4 * 1024 * 1024;
/// A workspace's quota when none is given (1 GiB).
pub const DEFAULT_WORKSPACE_QUOTA: u64 = 1024 * 1024 * 1024;
/// A workspace's time to live after its last use when none is given (7 days).
pub const DEFAULT_WORKSPACE_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// Workspaces a tenant may hold when no maximum is given.
pub const DEFAULT_WORKSPACE_MAX: usize = 100;

impl Default for WorkspacePolicy {
    fn default() -> Self {
        WorkspacePolicy {
            quota_bytes: DEFAULT_WORKSPACE_QUOTA,
            ttl: DEFAULT_WORKSPACE_TTL,
            max: DEFAULT_WORKSPACE_MAX,
        }
    }
}

/// Network egress: the tenants' policies, the CA bundle kernels trust, the proxy's limits.
#[derive(Debug, Clone)]
pub struct EgressConfig {
    /// Each tenant's policy (the tenants file's `network`, or `--network-allow` for the
    /// default tenant); a tenant not here has no network.
    pub tenants: BTreeMap<String, crate::wire::NetworkPolicy>,
    /// The CA bundle mounted read-only into kernels with a policy (`--ca-bundle`).
    pub ca_bundle: PathBuf,
    /// Connections and bytes per second.
    pub limits: crate::egress::proxy::Limits,
    /// Where audit lines go, one JSON line per connection (`--egress-audit`); `None`: the log.
    pub audit: Option<PathBuf>,
    /// Credentials added at the boundary (`--egress-secrets`); `None`: every tunnel carries
    /// its bytes untouched.
    pub credentials: Option<CredentialsConfig>,
}

/// Credentials added at the boundary (`docs/reliability.md`, "Credentials at the boundary").
#[derive(Debug, Clone)]
pub struct CredentialsConfig {
    /// Every tenant's secrets and rules.
    pub secrets: crate::egress::secrets::Secrets,
    /// Where the kernelbox egress CA is kept (generated there when missing).
    pub ca_dir: PathBuf,
    /// Replace the CA with a new one at start.
    pub rotate_ca: bool,
}

/// The CA bundle kernels with a policy trust unless told otherwise: the host's.
pub const DEFAULT_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

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

/// What one cell may take (the orchestrator's execute path; the output and display caps go to
/// the kernel with each cell).
#[derive(Debug, Clone, PartialEq)]
pub struct CellLimits {
    /// Default cell timeout when a request gives none.
    pub timeout: Duration,
    /// Upper bound on the timeout a request may ask for.
    pub max_timeout: Duration,
    /// Tool calls one cell may make.
    pub max_tool_calls: u32,
    /// What a cell's result keeps of its output.
    pub output: OutputCaps,
    /// What a cell's result keeps of its displays.
    pub display: DisplayCaps,
    /// How long an interrupted cell may take to stop on its KeyboardInterrupt before its
    /// kernel is killed.
    pub interrupt_grace: Duration,
}

impl Default for CellLimits {
    fn default() -> Self {
        CellLimits {
            timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(3600),
            max_tool_calls: 50,
            output: OutputCaps::default(),
            display: DisplayCaps::default(),
            interrupt_grace: DEFAULT_INTERRUPT_GRACE,
        }
    }
}

/// What a cell's result keeps of its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputCaps {
    /// Output kept inline in a result, in bytes (40% head, 60% tail beyond it).
    pub inline_bytes: usize,
    /// Output spilled to the staging volume when the inline copy is cut, in bytes.
    pub spill_bytes: usize,
}

impl Default for OutputCaps {
    fn default() -> Self {
        OutputCaps {
            inline_bytes: DEFAULT_OUTPUT_INLINE_BYTES,
            spill_bytes: DEFAULT_OUTPUT_SPILL_BYTES,
        }
    }
}

/// What a cell's result keeps of its displays (rich results, `docs/contract.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DisplayCaps {
    /// Largest display (its MIME bundle's JSON, images in base64), in bytes: a larger one has
    /// its data saved to files in the kernel's working directory and a note in its place.
    pub bundle_bytes: usize,
    /// Largest total of one cell's displays, in bytes (each counted with
    /// [`DISPLAY_OVERHEAD_BYTES`] more): past it displays are saved to files, then dropped.
    pub cell_bytes: usize,
}

impl Default for DisplayCaps {
    fn default() -> Self {
        DisplayCaps {
            bundle_bytes: DEFAULT_DISPLAY_BUNDLE_BYTES,
            cell_bytes: DEFAULT_DISPLAY_CELL_BYTES,
        }
    }
}

/// The host's kernels: the registry's cap and reaping, and the spawn deadline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelLimits {
    /// The host's cap on live kernels, hard at admission: a new kernel past it evicts an idle
    /// one (fairly between tenants, see `docs/architecture.md`) or is refused. Live delegated
    /// children are pinned and not counted.
    pub max_session_kernels: usize,
    /// How long a new kernel may take to say it is ready.
    pub spawn_timeout: Duration,
    /// A kernel idle this long is reaped.
    pub idle_timeout: Duration,
}

impl Default for KernelLimits {
    fn default() -> Self {
        KernelLimits {
            max_session_kernels: 4,
            spawn_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(30 * 60),
        }
    }
}

/// The warm pool (`docs/architecture.md`, "The warm pool").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    /// Ready kernels kept warm for new owners: started, runner-ready, owned by nobody, never
    /// run a cell. They count toward [`KernelLimits::max_session_kernels`], so at most that
    /// many. 0 (the default): no pool.
    pub size: usize,
    /// A pooled kernel older than this is replaced by a fresh one.
    pub max_age: Duration,
}

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 0,
            max_age: Duration::from_secs(15 * 60),
        }
    }
}

/// File transfers in and out of kernels (docs/files.md "Files in and out of a kernel"): the caps and
/// pace the orchestrator applies, and the transport each kernel uses (`src/kernel/files/`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileTransfer {
    /// Cap on one file upload into a kernel (a file's bytes, or a tar archive's), in bytes;
    /// past it the upload is refused and nothing is written.
    pub max_upload_bytes: u64,
    /// Slowest a download may be read once `download_rate_grace` has passed, in bytes per
    /// second on average since it started (0: no minimum); a slower one is cut and its kernel
    /// released.
    pub download_min_rate: u64,
    /// How long a download runs before `download_min_rate` applies.
    pub download_rate_grace: Duration,
    /// How long a kernel's resident file helper may stay idle before it is ended; the next
    /// file operation starts a new one.
    pub helper_idle: Duration,
    /// Host directory of the file helpers' channels: bind-mounted read-only into every
    /// kernel, where the host listens on a Unix socket for each helper it starts, so file
    /// bytes bypass the engine's exec streams. It must be the same path for the engine as for
    /// this process. `None`: the exec streams carry them. The orchestrator creates it (mode
    /// 0711) when it starts, or goes without it, saying why.
    pub sockets: Option<PathBuf>,
}

impl Default for FileTransfer {
    fn default() -> Self {
        FileTransfer {
            max_upload_bytes: DEFAULT_MAX_UPLOAD_BYTES,
            download_min_rate: 64 * 1024,
            download_rate_grace: Duration::from_secs(30),
            helper_idle: Duration::from_secs(30),
            sockets: Some(default_file_sockets()),
        }
    }
}

/// What this instance labels, sweeps, watches and keeps on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Housekeeping {
    /// Labels added to everything this instance creates (tests use them to find their own).
    pub extra_labels: BTreeMap<String, String>,
    /// The kernelbox binary run as this instance's watchdog; `None` disables the watchdog.
    pub watchdog: Option<PathBuf>,
    /// Sweep leftovers of dead instances when the orchestrator starts.
    pub sweep_on_start: bool,
    /// Staging volumes older than this and not in use are swept.
    pub staging_max_age: Duration,
    /// Directory of the durable owner catalog (created if missing), so that the state lost
    /// by a restart of this process is reported to owners and generations keep counting.
    /// One process per directory. `None` (the default): no catalog, nothing survives.
    pub state_dir: Option<PathBuf>,
    /// The watch on kernels that compute with no cell running.
    pub runaway: RunawayWatch,
}

/// The watch on kernels that keep computing with no cell running (`docs/reliability.md`,
/// "Runaway kernels"): every `interval` the orchestrator reads the CPU time of each kernel
/// with no running cell from its cgroup. An interval in which it used more than `cpu_percent`
/// of its CPU limit counts as computing; a kernel computing for longer than its last cell's
/// timeout plus `grace`, with no cell between, is killed (`state_lost.reason = "runaway"`).
/// While it computes it counts as busy: listed `busy`, never reaped or evicted as idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunawayWatch {
    /// How often kernels with no running cell are sampled.
    pub interval: Duration,
    /// The share of its CPU limit (`Sandbox::nano_cpus`), in percent, above which an interval
    /// counts as computing. Below half a core so that a kernel computing on a host whose other
    /// work leaves it a third of a core (seen on a loaded CI host) is still caught.
    pub cpu_percent: u32,
    /// How long past its last cell's timeout a kernel may keep computing.
    pub grace: Duration,
}

impl Default for RunawayWatch {
    fn default() -> Self {
        RunawayWatch {
            interval: Duration::from_secs(1),
            cpu_percent: 25,
            grace: Duration::from_secs(2),
        }
    }
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping {
            extra_labels: BTreeMap::new(),
            watchdog: None,
            sweep_on_start: true,
            staging_max_age: Duration::from_secs(7 * 24 * 3600),
            state_dir: None,
            runaway: RunawayWatch::default(),
        }
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            spec: KernelSpec::default(),
            cells: CellLimits::default(),
            kernels: KernelLimits::default(),
            pool: PoolConfig::default(),
            files: FileTransfer::default(),
            housekeeping: Housekeeping::default(),
            default_tenant: "default".into(),
            egress: None,
            tenant_runtimes: BTreeMap::new(),
            workspaces: None,
        }
    }
}

/// The default [`FileTransfer::sockets`]: `$XDG_RUNTIME_DIR/kernelbox`, else `/run/kernelbox`
/// for root, else `/tmp/kernelbox-UID`.
pub fn default_file_sockets() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("kernelbox");
    }
    match effective_uid() {
        Some(0) => PathBuf::from("/run/kernelbox"),
        Some(uid) => PathBuf::from(format!("/tmp/kernelbox-{uid}")),
        None => std::env::temp_dir().join("kernelbox"),
    }
}

/// This process's effective uid (`Uid:` in /proc/self/status), `None` when unreadable.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// A configuration value that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The setting refused, by the name its error shows (`memory`, `cell_timeout`,
    /// `pool_size`, ...).
    pub field: &'static str,
    /// Why it was refused.
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

/// A cell timeout outside `(0, max_cell_timeout]`, or not a number of seconds at all. The one
/// rule for every timeout a caller gives, whether through HTTP, the CLI or the library.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("timeout {given} is not a number of seconds in (0, {}]", max.as_secs_f64())]
pub struct InvalidTimeout {
    /// What was given, as the caller wrote it (seconds, or the JSON value).
    pub given: String,
    /// The largest timeout allowed (`max_cell_timeout`).
    pub max: Duration,
}

impl Config {
    /// Checks a cell timeout against `(0, max_timeout]`.
    pub fn check_cell_timeout(&self, timeout: Duration) -> Result<Duration, InvalidTimeout> {
        if timeout.is_zero() || timeout > self.cells.max_timeout {
            return Err(self.invalid_timeout(format!("{:?}", timeout.as_secs_f64())));
        }
        Ok(timeout)
    }

    /// A cell timeout from a number of seconds, by the rule of [`Config::check_cell_timeout`];
    /// NaN, infinities and values too large for a `Duration` are refused the same way.
    pub fn cell_timeout_from_secs(&self, secs: f64) -> Result<Duration, InvalidTimeout> {
        let invalid = || self.invalid_timeout(format!("{secs:?}"));
        let timeout = Duration::try_from_secs_f64(secs).map_err(|_| invalid())?;
        self.check_cell_timeout(timeout).map_err(|_| invalid())
    }

    /// The error for a timeout given as something other than seconds (`given` is shown as is).
    pub fn invalid_timeout(&self, given: impl std::fmt::Display) -> InvalidTimeout {
        InvalidTimeout {
            given: given.to_string(),
            max: self.cells.max_timeout,
        }
    }

    /// Checks every field once; the [`ValidConfig`] it gives is what the rest of the crate
    /// takes, so nothing checks again.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        if self.spec.image.trim().is_empty() {
            return Err(bad("image", "must not be empty"));
        }
        if self.kernels.max_session_kernels == 0 {
            return Err(bad("max_session_kernels", "must be at least 1"));
        }
        if let Err(e) = self.check_cell_timeout(self.cells.timeout) {
            return Err(bad("cell_timeout", e.to_string()));
        }
        if self.cells.interrupt_grace.is_zero() {
            return Err(bad("interrupt_grace", "must be positive"));
        }
        if self.kernels.spawn_timeout.is_zero() {
            return Err(bad("spawn_timeout", "must be positive"));
        }
        if self.kernels.idle_timeout.is_zero() {
            return Err(bad("kernel_idle_timeout", "must be positive"));
        }
        self.spec.sandbox.check()?;
        self.check_runtimes()?;
        self.cells.output.check()?;
        self.cells.display.check()?;
        self.spec.mode.check()?;
        self.check_instance()?;
        self.check_workspaces()?;
        Ok(ValidConfig(self))
    }

    /// Workspaces: strict mode only (in project mode `/work` is the project), an absolute
    /// directory, each tenant's quota and count bounded (`docs/workspaces.md`).
    fn check_workspaces(&self) -> Result<(), ConfigError> {
        let Some(ws) = &self.workspaces else {
            return Ok(());
        };
        if !matches!(self.spec.mode, WorkMode::Strict) {
            return Err(bad(
                "workspaces",
                "workspaces need strict mode (in project mode /work is the project directory)",
            ));
        }
        if !ws.dir.is_absolute() {
            return Err(bad("workspaces.dir", "must be an absolute path"));
        }
        for (tenant, policy) in &ws.tenants {
            if policy.quota_bytes < MIN_WORKSPACE_QUOTA {
                return Err(bad(
                    "workspaces.quota",
                    format!("tenant {tenant}: must be at least {MIN_WORKSPACE_QUOTA} bytes"),
                ));
            }
            if policy.ttl.is_zero() {
                return Err(bad(
                    "workspaces.ttl",
                    format!("tenant {tenant}: must be positive"),
                ));
            }
            if policy.max == 0 {
                return Err(bad(
                    "workspaces.max",
                    format!("tenant {tenant}: must be at least 1"),
                ));
            }
        }
        Ok(())
    }

    /// The state directory, the pool and the labels.
    fn check_instance(&self) -> Result<(), ConfigError> {
        if self
            .housekeeping
            .state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(bad("state_dir", "must not be empty"));
        }
        if self.pool.size > self.kernels.max_session_kernels {
            return Err(bad(
                "pool_size",
                format!(
                    "{} pooled kernels do not fit the host's cap of {} kernels (max_session_kernels)",
                    self.pool.size, self.kernels.max_session_kernels
                ),
            ));
        }
        if self.pool.max_age.is_zero() {
            return Err(bad("pool_max_age", "must be positive"));
        }
        let runaway = &self.housekeeping.runaway;
        if runaway.interval.is_zero() {
            return Err(bad("runaway_interval", "must be positive"));
        }
        if !(1..=100).contains(&runaway.cpu_percent) {
            return Err(bad("runaway_cpu_percent", "must be between 1 and 100"));
        }
        for key in self.housekeeping.extra_labels.keys() {
            if key.starts_with(crate::labels::PREFIX) {
                return Err(bad("labels", format!("{key} uses kernelbox's own prefix")));
            }
        }
        Ok(())
    }

    /// The runtime `tenant`'s kernels run under: its own, else the server's.
    pub fn runtime_of(&self, tenant: &str) -> KernelRuntime {
        self.tenant_runtimes
            .get(tenant)
            .copied()
            .unwrap_or(self.spec.sandbox.runtime)
    }

    /// Every runtime some kernel may run under (the engine must know each: checked at start).
    pub fn runtimes(&self) -> std::collections::BTreeSet<KernelRuntime> {
        std::iter::once(self.spec.sandbox.runtime)
            .chain(self.tenant_runtimes.values().copied())
            .collect()
    }

    /// What cannot hold under runsc is refused here, not discovered by a cell
    /// (`docs/runtimes.md`): its kernels have no network stack, so a tenant with an egress
    /// policy cannot run under it.
    fn check_runtimes(&self) -> Result<(), ConfigError> {
        let Some(egress) = &self.egress else {
            return Ok(());
        };
        for tenant in egress.tenants.keys() {
            if self.runtime_of(tenant) == KernelRuntime::Runsc {
                return Err(bad(
                    "runtime",
                    format!(
                        "tenant {tenant} has a network policy, but its kernels run under runsc, which gives them no network stack (docs/runtimes.md); give it runtime runc or no network"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How often the background reaper runs: `min(5m, max(30s, idle/6))`.
    pub fn reap_interval(&self) -> Duration {
        (self.kernels.idle_timeout / 6).clamp(Duration::from_secs(30), Duration::from_secs(300))
    }
}

impl Sandbox {
    fn check(&self) -> Result<(), ConfigError> {
        if self.memory_bytes < 16 * 1024 * 1024 {
            return Err(bad("memory", "must be at least 16 MiB"));
        }
        if self.pids_limit < 8 {
            return Err(bad("pids_limit", "must be at least 8"));
        }
        if self.nano_cpus <= 0 {
            return Err(bad("cpus", "must be positive"));
        }
        let mut ids = self.user.split(':');
        let uid = ids.next().and_then(|u| u.parse::<u32>().ok());
        let gid_ok = ids.next().is_none_or(|g| g.parse::<u32>().is_ok());
        if uid.is_none() || !gid_ok || ids.next().is_some() {
            return Err(bad("user", "must be numeric UID or UID:GID"));
        }
        if uid == Some(0) {
            return Err(bad("user", "kernels never run as root"));
        }
        if self.work_bytes.is_some_and(|b| b < 1024 * 1024) {
            return Err(bad("work_bytes", "must be at least 1 MiB"));
        }
        Ok(())
    }
}

impl OutputCaps {
    fn check(&self) -> Result<(), ConfigError> {
        if self.inline_bytes < 100 {
            return Err(bad("output_inline_bytes", "must be at least 100"));
        }
        if self.spill_bytes < self.inline_bytes {
            return Err(bad(
                "output_spill_bytes",
                "must be at least output_inline_bytes",
            ));
        }
        Ok(())
    }
}

impl DisplayCaps {
    fn check(&self) -> Result<(), ConfigError> {
        if self.bundle_bytes < 64 * 1024 {
            return Err(bad("display_bundle_bytes", "must be at least 64 KiB"));
        }
        if self.cell_bytes < self.bundle_bytes + DISPLAY_OVERHEAD_BYTES {
            return Err(bad(
                "display_cell_bytes",
                "must be at least display_bundle_bytes (and 1 KiB)",
            ));
        }
        Ok(())
    }
}

impl WorkMode {
    fn check(&self) -> Result<(), ConfigError> {
        if let WorkMode::Project(dir) = self {
            if !dir.is_absolute() {
                return Err(bad("project_dir", "must be an absolute path"));
            }
            if !dir.is_dir() {
                return Err(bad(
                    "project_dir",
                    format!("{} is not a directory", dir.display()),
                ));
            }
        }
        Ok(())
    }
}

/// A [`Config`] that [`Config::validate`] accepted: what the orchestrator runs on. It reads as
/// a `Config` (`Deref`) and cannot be changed but for dropping the file channels.
#[derive(Debug, Clone)]
pub struct ValidConfig(Config);

impl std::ops::Deref for ValidConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.0
    }
}

impl ValidConfig {
    /// The configuration, to change and validate again.
    pub fn into_inner(self) -> Config {
        self.0
    }

    /// Goes without the file channels' directory (it cannot be used): files then move over
    /// the engine's exec streams. Valid either way.
    pub(crate) fn drop_file_sockets(&mut self) {
        self.0.files.sockets = None;
    }
}

/// What an orchestrator starts from: a [`Config`], validated when taken, or a [`ValidConfig`]
/// as it is (not checked again).
pub trait IntoValidConfig {
    /// The valid configuration, or why there is none.
    fn into_valid(self) -> Result<ValidConfig, ConfigError>;
}

impl IntoValidConfig for Config {
    fn into_valid(self) -> Result<ValidConfig, ConfigError> {
        self.validate()
    }
}

impl IntoValidConfig for ValidConfig {
    fn into_valid(self) -> Result<ValidConfig, ConfigError> {
        Ok(self)
    }
}

/// Parses a human duration such as `30s`, `5m` or `7d` (humantime), or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    if let Ok(secs) = text.parse::<f64>() {
        if secs.is_finite() && secs > 0.0 {
            return Ok(Duration::from_secs_f64(secs));
        }
        return Err(format!("{text:?} is not a positive duration"));
    }
    humantime::parse_duration(text).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses a size such as `512m`, `1g` or a bare byte count.
pub fn parse_bytes(text: &str) -> Result<i64, String> {
    let text = text.trim().to_ascii_lowercase();
    let (num, mult) = match text.trim_end_matches(['b', 'i']).chars().last() {
        Some('k') => (&text[..text.find('k').unwrap_or(0)], 1024i64),
        Some('m') => (&text[..text.find('m').unwrap_or(0)], 1024 * 1024),
        Some('g') => (&text[..text.find('g').unwrap_or(0)], 1024 * 1024 * 1024),
        _ => (text.as_str(), 1),
    };
    let value: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a size (use e.g. 512m, 1g)"))?;
    if !(value.is_finite() && value > 0.0) {
        return Err(format!("{text:?} is not a positive size"));
    }
    Ok((value * mult as f64) as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_reap_interval_is_clamped() {
        let config = Config::default().validate().expect("defaults are valid");
        assert_eq!(config.reap_interval(), Duration::from_secs(300));
        let mut short = Config::default();
        short.kernels.idle_timeout = Duration::from_secs(1);
        assert_eq!(short.reap_interval(), Duration::from_secs(30));
    }

    #[test]
    fn bad_values_name_their_field() {
        let mut config = Config::default();
        config.kernels.max_session_kernels = 0;
        let err = config.validate().unwrap_err();
        assert_eq!(err.field, "max_session_kernels");
    }

    #[test]
    fn one_rule_for_every_cell_timeout() {
        let config = Config::default();
        assert_eq!(
            config.cell_timeout_from_secs(1.5),
            Ok(Duration::from_millis(1500))
        );
        assert_eq!(
            config.cell_timeout_from_secs(3600.0),
            Ok(Duration::from_secs(3600))
        );
        for secs in [0.0, -1.0, 1e-12, 3600.5, 1e300, f64::NAN, f64::INFINITY] {
            let err = config.cell_timeout_from_secs(secs).unwrap_err();
            assert_eq!(err.max, Duration::from_secs(3600));
            assert_eq!(
                err.to_string(),
                format!("timeout {secs:?} is not a number of seconds in (0, 3600]")
            );
        }
        let err = config
            .check_cell_timeout(Duration::from_secs(3601))
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "timeout 3601.0 is not a number of seconds in (0, 3600]"
        );
        assert!(config.check_cell_timeout(Duration::ZERO).is_err());
        let err = config.invalid_timeout("\"abc\"");
        assert_eq!(
            err.to_string(),
            "timeout \"abc\" is not a number of seconds in (0, 3600]"
        );
        let mut config = Config::default();
        config.cells.timeout = Duration::from_secs(7200);
        let err = config.validate().unwrap_err();
        assert_eq!(err.field, "cell_timeout");
    }

    #[test]
    fn durations_and_sizes_parse() {
        assert_eq!(
            parse_duration("7d").unwrap(),
            Duration::from_secs(7 * 86400)
        );
        assert_eq!(parse_duration("1.5").unwrap(), Duration::from_millis(1500));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1").is_err());
        assert_eq!(parse_bytes("512m").unwrap(), 512 * 1024 * 1024);
        assert_eq!(parse_bytes("1GiB").unwrap(), 1024 * 1024 * 1024);
        assert_eq!(parse_bytes("4096").unwrap(), 4096);
        assert!(parse_bytes("lots").is_err());
    }
}
