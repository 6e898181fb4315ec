//! Snapshots and forks as the API carries them (`docs/snapshots.md`): the bodies of
//! `POST /v1/sessions/{session}/snapshots`, `.../restore` and `.../fork`, and their answers.

use serde::{Deserialize, Serialize};

/// Longest snapshot name.
pub const MAX_SNAPSHOT_NAME: usize = 128;

/// `POST /v1/sessions/{session}/snapshots`: snapshot the session's kernel.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotBody {
    /// A name of the caller's (at most 128 characters), told back in listings.
    #[serde(default)]
    pub name: Option<String>,
}

/// One snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotInfo {
    /// Its id: `snap-` and 24 hex digits.
    pub id: String,
    /// The name it was given.
    pub name: Option<String>,
    /// The session whose kernel it was taken of.
    pub session: String,
    /// When it was taken (RFC 3339).
    pub created: String,
    /// When it is removed (RFC 3339): its age bound.
    pub expires: String,
    /// Bytes it holds on disk.
    pub bytes: u64,
    /// The kernel's memory is in it: variables, imports, `/tmp` and the staging files
    /// (runsc). `false`: a files-only snapshot (runc), the working directory's files only.
    pub memory: bool,
    /// The runtime of the kernel it was taken of, which a restore runs under.
    pub runtime: String,
    /// How long the kernel was paused for the checkpoint (a files-only snapshot: reading its
    /// files), in seconds.
    pub checkpoint_seconds: f64,
}

/// `GET /v1/snapshots`: the caller's snapshots, oldest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SnapshotList {
    /// The snapshots.
    pub snapshots: Vec<SnapshotInfo>,
}

/// `POST /v1/sessions/{session}/restore`: start the session (which has no kernel) from a
/// snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    /// The snapshot's id.
    pub snapshot: String,
}

/// `POST /v1/sessions/{session}/fork`: snapshot the session's kernel once and start new
/// sessions from it. Exactly one of `count` (sessions named for the source) and `sessions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ForkBody {
    /// How many forks, named `<session>-fork-<n>-<6 hex>` (1 to 16).
    #[serde(default)]
    pub count: Option<u32>,
    /// The forks' session names (1 to 16, new sessions).
    #[serde(default)]
    pub sessions: Option<Vec<String>>,
}

/// The kernel a restore started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RestoredKernel {
    /// The new kernel's short container id.
    pub id: String,
    /// Its generation in its session (a new session's first is 1).
    pub generation: u64,
    /// How long the restore took, in seconds.
    pub restore_seconds: f64,
}

/// One fork (or a restore): the session and its kernel, or why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ForkOutcome {
    /// The new session.
    pub session: String,
    /// Its kernel, restored from the snapshot; absent when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kernel: Option<RestoredKernel>,
    /// Why it failed (the session then has no kernel).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<crate::wire::ErrorDetail>,
}

/// The answer of `POST /v1/sessions/{session}/fork`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ForkResult {
    /// How long the source was paused for its checkpoint, in seconds (0 when it was
    /// hibernated: its checkpoint is used as it is).
    pub checkpoint_seconds: f64,
    /// The forks, in the order asked; each succeeded or failed on its own.
    pub forks: Vec<ForkOutcome>,
}
