//! The audit trail (`docs/usage.md`, "Audit trail"): for the tenants that opt in, one JSON
//! line per cell and per command run (who, which kernel, when, how long, how it ended, the
//! code's SHA-256 and, where the tenant asks, the code itself; never the output), each line
//! carrying the SHA-256 of the line before it, so an edited, inserted or removed line breaks
//! the chain (`kernelbox audit verify`).
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this table, the [`AuditRecord`] one line holds, [`AuditConfig`] (the sink and each tenant's [`AuditPolicy`]), [`AuditError`], the constants |
//! | `chain.rs` | the hash chain: a line's hash, the last line of a file, [`verify`] |
//! | `writer.rs` | [`Auditor`], the handle cells and commands record through, and the one task that writes (bounded channel, rotation, the chain carried across restarts and rotations) |

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod chain;
mod writer;

pub use chain::{line_hash, verify, Verified};
pub use writer::Auditor;

/// Records waiting for the writer at most; past it a record is dropped and counted, and the
/// next line written says how many (`dropped`), so the gap is in the trail.
pub const AUDIT_QUEUE: usize = 4_096;

/// A file grows to this many bytes before it is rotated (`FILE` -> `FILE.1`), by default.
pub const DEFAULT_AUDIT_ROTATE_BYTES: u64 = 64 * 1024 * 1024;

/// Rotated files kept (`FILE.1` .. `FILE.N`; older ones deleted), by default.
pub const DEFAULT_AUDIT_KEEP: usize = 5;

/// The `prev` of the first line of a new trail.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The longest line the trail's reader takes (a cell's code is bounded by the request body's
/// limit well below this): longer is not a line kernelbox wrote.
pub const MAX_AUDIT_LINE: usize = 64 * 1024 * 1024;

/// What ran: a cell or a shell command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuditKind {
    /// A cell of Python.
    Cell,
    /// A shell command in the kernel's container.
    Command,
}

/// One line of the trail. Field order is the line's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    /// When it ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// Cell or command.
    pub kind: AuditKind,
    /// The tenant.
    pub tenant: String,
    /// The session.
    pub session: String,
    /// The delegated child whose kernel ran it, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub child: Option<String>,
    /// The kernel (its short container id).
    pub kernel: String,
    /// The session's kernel generation.
    pub generation: u64,
    /// Wall seconds, as the result reports.
    pub duration_seconds: f64,
    /// How it ended: a cell's status (`success`, `error`, `timeout`, ...); a command's
    /// `success` (exit 0), `error` or `timeout`.
    pub status: String,
    /// A command's exit code (absent for cells).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub exit_code: Option<i64>,
    /// SHA-256 of the code (a command's: its arguments joined by NUL), hex.
    pub code_sha256: String,
    /// The code itself, for a tenant that opted in (`{"audit": {"code": true}}`).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code: Option<String>,
    /// Records dropped just before this one because the writer fell behind.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub dropped: Option<u64>,
    /// SHA-256 of the previous line (hex), [`GENESIS`] for the first line of a trail.
    pub prev: String,
}

impl AuditRecord {
    /// The hex SHA-256 of `code` (the `code_sha256` of a record).
    pub fn code_hash(code: &[u8]) -> String {
        use sha2::{Digest, Sha256};
        hex::encode(Sha256::digest(code))
    }

    /// The hash a command's arguments are recorded under: joined by NUL (no argument can
    /// hold one), so `["a b"]` and `["a", "b"]` differ.
    pub fn command_code(argv: &[String]) -> String {
        argv.join("\0")
    }
}

/// The audit trail's configuration: where it goes and which tenants are audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// Where the lines go.
    pub sink: AuditSink,
    /// The tenants audited, and how; a tenant not here is not audited.
    pub tenants: std::collections::BTreeMap<String, AuditPolicy>,
}

/// How one tenant is audited.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditPolicy {
    /// Record the code itself beside its hash (`{"audit": {"code": true}}`).
    pub code: bool,
}

/// Where the trail goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditSink {
    /// Standard output, one line per record, for a log shipper (never rotated; the chain
    /// starts at [`GENESIS`] each run).
    Stdout,
    /// A file, appended to, rotated past `rotate_bytes` keeping `keep` old ones.
    File {
        /// The file.
        path: PathBuf,
        /// Rotate when it reaches this size.
        rotate_bytes: u64,
        /// Rotated files kept.
        keep: usize,
    },
}

/// An audit trail that failed: the operation and the file.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// Opening, reading, writing or rotating a file failed.
    #[error("audit trail {op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line of a trail is not one kernelbox wrote, or the chain breaks there.
    #[error("audit trail {}: line {line}: {reason}", path.display())]
    Broken {
        /// The file.
        path: PathBuf,
        /// Its line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}
