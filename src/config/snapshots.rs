//! [`SnapshotConfig`]: where snapshots of kernels are kept and their bounds
//! (`docs/snapshots.md`).

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Snapshots one tenant keeps at most, by default.
pub const DEFAULT_SNAPSHOTS_PER_TENANT: usize = 16;

/// Bytes of one tenant's snapshots on disk at most, by default (4 GiB).
pub const DEFAULT_SNAPSHOT_TENANT_BYTES: u64 = 4 << 30;

/// Bytes of every tenant's snapshots on the host at most, by default (32 GiB).
pub const DEFAULT_SNAPSHOT_BYTES: u64 = 32 << 30;

/// How long a snapshot is kept, by default (a day).
pub const DEFAULT_SNAPSHOT_TTL: Duration = Duration::from_secs(24 * 3600);

/// How long a snapshot or fork waits for the session's kernel to be idle (the call before it
/// letting go of it, a running cell ending) before it answers `session_busy`: the wait a call
/// gives a kernel being hibernated.
pub const SNAPSHOT_BUSY_WAIT: Duration = super::HIBERNATE_WAIT_LIMIT;

/// Forks one request makes at most.
pub const MAX_FORKS_PER_REQUEST: usize = 16;

/// Snapshots of kernels (`docs/snapshots.md`): a session's kernel checkpointed (runsc) or its
/// files only (runc), kept past the kernel, restored into new sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotConfig {
    /// Most snapshots of one tenant; the next is refused (`409 snapshot_limit`).
    pub max_per_tenant: usize,
    /// Most bytes of one tenant's snapshots; a snapshot past it is refused and removed.
    pub max_tenant_bytes: u64,
    /// Most bytes of snapshots on the host; as above.
    pub max_bytes: u64,
    /// Age past which a snapshot is removed.
    pub ttl: Duration,
    /// Where snapshots are kept (`None`: `snapshots` in the state directory, else in the
    /// system's temporary directory, per instance); created mode 0700.
    pub dir: Option<PathBuf>,
}

impl Default for SnapshotConfig {
    fn default() -> Self {
        SnapshotConfig {
            max_per_tenant: DEFAULT_SNAPSHOTS_PER_TENANT,
            max_tenant_bytes: DEFAULT_SNAPSHOT_TENANT_BYTES,
            max_bytes: DEFAULT_SNAPSHOT_BYTES,
            ttl: DEFAULT_SNAPSHOT_TTL,
            dir: None,
        }
    }
}

impl SnapshotConfig {
    /// Where snapshots are kept, and whether they outlive this run of the server (a
    /// directory of the configuration's or the state directory's).
    pub fn location(&self, state_dir: Option<&Path>, instance: &str) -> (PathBuf, bool) {
        match (&self.dir, state_dir) {
            (Some(dir), _) => (dir.clone(), true),
            (None, Some(state)) => (state.join("snapshots"), true),
            (None, None) => (
                std::env::temp_dir().join(format!("kernelbox-snapshots-{instance}")),
                false,
            ),
        }
    }
}
