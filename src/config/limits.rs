//! What one cell, the host's kernels, the warm pool and file transfers may do: the caps and
//! their defaults ([`CellLimits`], [`KernelLimits`], [`PoolConfig`], [`FileTransfer`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use crate::wire::Language;

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
    /// Modules each pooled kernel imports before it is offered (`numpy`, `matplotlib.pyplot`),
    /// so a new owner's first cell finds them loaded (`docs/performance.md`, "Preloading the
    /// pool"); they are in `sys.modules`, not in the cell's namespace. At most
    /// [`MAX_POOL_PRELOAD`], each a dotted Python name. Empty (the default): none, and pooled
    /// kernels keep a plain kernel's idle memory.
    pub preload: Vec<String>,
    /// Ready kernels kept warm per language other than Python (`bash`, `javascript`,
    /// `typescript`), each started with its language's environment so that the first cell
    /// of a session's context in that language is a pool hit (`docs/architecture.md`, "The
    /// warm pool"). They count toward [`KernelLimits::max_session_kernels`] with
    /// [`PoolConfig::size`]. Empty (the default): only Python kernels are pooled.
    pub languages: BTreeMap<Language, usize>,
}

impl PoolConfig {
    /// The pool's size for `language`: [`PoolConfig::size`] for Python, else its entry in
    /// [`PoolConfig::languages`] (0: none pooled).
    pub fn size_of(&self, language: Language) -> usize {
        match language {
            Language::Python => self.size,
            other => self.languages.get(&other).copied().unwrap_or(0),
        }
    }

    /// Every language's pool size, summed (saturating): the most pooled kernels the host
    /// holds.
    pub fn total(&self) -> usize {
        let sizes = Language::ALL.iter().map(|l| self.size_of(*l));
        sizes.fold(0, usize::saturating_add)
    }
}

/// Most modules a pool may preload.
pub const MAX_POOL_PRELOAD: usize = 64;

impl Default for PoolConfig {
    fn default() -> Self {
        PoolConfig {
            size: 0,
            max_age: Duration::from_secs(15 * 60),
            preload: Vec::new(),
            languages: BTreeMap::new(),
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
