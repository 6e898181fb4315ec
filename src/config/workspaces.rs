//! Workspaces: a session's `/work` kept past its kernel, per tenant (`docs/workspaces.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Workspaces: where their disk images live and each tenant's policy; a tenant listed has a
/// workspace for every session (`docs/workspaces.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspacesConfig {
    /// Directory of the workspaces' disk images (created if missing); the engine must see it
    /// at the same path (an engine on this host).
    pub dir: PathBuf,
    /// Each tenant's policy; a tenant not here has no workspaces.
    pub tenants: BTreeMap<String, WorkspacePolicy>,
    /// The most bytes of quota all workspaces in `dir` may add up to (their images' sizes):
    /// a new workspace past it is refused. `None`: what the directory's file system can hold
    /// for them, measured at start (its free bytes plus what the images there already take;
    /// `docs/reliability.md`, "Workspace disks and tars").
    pub total_bytes: Option<u64>,
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
