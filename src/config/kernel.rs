//! What a kernel is made from: its image, working mode, runtime and sandbox ([`KernelSpec`],
//! consumed by `src/kernel/spawn.rs`).

use std::path::PathBuf;

pub use crate::docker::{KernelRuntime, Sandbox};

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
