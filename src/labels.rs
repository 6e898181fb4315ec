//! The Docker labels kernelbox puts on everything it creates, and how it reads them back.
//!
//! Labels are the source of truth for admin verbs and sweeps: a container or volume without
//! `io.kernelbox.managed-by=kernelbox` is never touched.

use std::collections::BTreeMap;

/// Prefix of every kernelbox label key.
pub const PREFIX: &str = "io.kernelbox.";
/// Marks an object as kernelbox's: `io.kernelbox.managed-by=kernelbox`.
pub const MANAGED_BY: &str = "io.kernelbox.managed-by";
/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "kernelbox";
/// The orchestrator instance that owns the object.
pub const INSTANCE: &str = "io.kernelbox.instance";
/// Host name of the owning instance (for liveness checks).
pub const HOST: &str = "io.kernelbox.host";
/// Process id of the owning instance (for liveness checks).
pub const PID: &str = "io.kernelbox.pid";
/// Start time of the owning process, in clock ticks since boot (guards against pid reuse).
pub const PID_START: &str = "io.kernelbox.pid-start";
/// Tenant the kernel belongs to.
pub const TENANT: &str = "io.kernelbox.tenant";
/// Owner string (session, or `session::child::id`).
pub const OWNER: &str = "io.kernelbox.owner";
/// Session part of the owner.
pub const SESSION: &str = "io.kernelbox.session";
/// Delegated child part of the owner, when there is one.
pub const CHILD: &str = "io.kernelbox.child";
/// Hash of the kernel key.
pub const KEY: &str = "io.kernelbox.key";
/// Generation of the kernel within its key.
pub const GENERATION: &str = "io.kernelbox.generation";
/// Creation time, Unix seconds.
pub const CREATED_AT: &str = "io.kernelbox.created-at";
/// What the object is: `kernel` (container) or `staging` (volume).
pub const ROLE: &str = "io.kernelbox.role";
/// Name of the kernel's staging volume, on its container.
pub const VOLUME: &str = "io.kernelbox.volume";
/// Path, inside the kernel, of the runner's status file (cells run, last cell's end).
pub const STATUS: &str = "io.kernelbox.status";
/// Memory limit of the kernel, bytes.
pub const MEMORY: &str = "io.kernelbox.memory";

/// A label filter value `key=value` for list calls.
pub fn filter(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// The filter that selects everything kernelbox manages.
pub fn managed() -> String {
    filter(MANAGED_BY, MANAGED_BY_VALUE)
}

/// Reads a label as an integer.
pub fn int(labels: &BTreeMap<String, String>, key: &str) -> Option<i64> {
    labels.get(key).and_then(|v| v.parse().ok())
}
