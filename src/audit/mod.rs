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
//! | `tail.rs` | [`tail`]: the last records of the trail's file, read backwards at most [`TAIL_BYTES`] (`GET /v1/audit`) |
//! | `writer.rs` | [`Auditor`], the handle cells and commands record through, and the one task that writes (bounded channel, each tenant's byte budget, rotation, the chain carried across restarts and rotations), [`AuditStats`] |

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

mod chain;
mod tail;
mod writer;

pub use chain::{line_hash, verify, Verified};
pub use tail::{tail, Tail, TAIL_BYTES};
pub use writer::{AuditStats, Auditor};

/// Records waiting for the writer at most; past it a record is dropped and counted, and the
/// next line written says how many (`dropped`), so the gap is in the trail.
pub const AUDIT_QUEUE: usize = 4_096;

/// A file grows to this many bytes before it is rotated (`FILE` -> `FILE.1`), by default.
pub const DEFAULT_AUDIT_ROTATE_BYTES: u64 = 64 * 1024 * 1024;

/// Rotated files kept (`FILE.1` .. `FILE.N`; older ones deleted), by default.
pub const DEFAULT_AUDIT_KEEP: usize = 5;

/// Bytes of a cell's code (a command's arguments) a line keeps at most (cut at a character
/// boundary); past it the line says `code_truncated` and the code's full size (`code_bytes`),
/// and `code_sha256` is always the hash of the whole code. So one line stays small whatever
/// the code (`docs/usage.md`, "Audit trail").
pub const AUDIT_CODE_BYTES: usize = 16 * 1024;

/// The window of a tenant's byte budget in a file trail: in each window a tenant's lines take
/// at most one file's worth (`--audit-rotate`) of the trail; its lines past that are dropped,
/// counted in its next line (`tenant_dropped`) and in `kernelbox_audit_dropped_total`. So one
/// tenant rotates at most one file out per window, whatever it runs (`docs/usage.md`, "Audit
/// trail").
pub const AUDIT_TENANT_WINDOW: std::time::Duration = std::time::Duration::from_secs(3600);

/// The `prev` of the first line of a new trail.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// The longest line the trail's reader takes (a line holds at most [`AUDIT_CODE_BYTES`] of
/// code, JSON-escaped, well below this): longer is not a line kernelbox wrote.
pub const MAX_AUDIT_LINE: usize = 64 * 1024 * 1024;

/// What ran: a cell or a shell command.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuditKind {
    /// A cell of Python.
    Cell,
    /// A shell command in the kernel's container.
    Command,
}

/// One line of the trail. Field order is the line's order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AuditRecord {
    /// When it ended, RFC 3339 UTC with milliseconds.
    pub time: String,
    /// Cell or command.
    pub kind: AuditKind,
    /// The tenant whose kernel ran it.
    pub tenant: String,
    /// The session whose kernel ran it.
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
    /// The code itself, for a tenant that opted in (`{"audit": {"code": true}}`): at most its
    /// first [`AUDIT_CODE_BYTES`].
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code: Option<String>,
    /// The whole code's size in bytes, when `code` holds only its start.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code_bytes: Option<u64>,
    /// `true` when `code` holds only the code's first bytes (`code_bytes` says how many it had).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub code_truncated: Option<bool>,
    /// This tenant's records dropped since its previous line because it was past its byte
    /// budget ([`AUDIT_TENANT_WINDOW`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub tenant_dropped: Option<u64>,
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

    /// Sets `code` to what a line keeps of `code`: all of it up to [`AUDIT_CODE_BYTES`], else
    /// its first bytes up to that (at a character boundary), marked `code_truncated` with the
    /// whole size in `code_bytes`.
    pub fn keep_code(&mut self, code: &str) {
        if code.len() <= AUDIT_CODE_BYTES {
            self.code = Some(code.to_string());
            return;
        }
        let mut end = AUDIT_CODE_BYTES;
        while !code.is_char_boundary(end) {
            end -= 1;
        }
        self.code = Some(code[..end].to_string());
        self.code_bytes = Some(code.len() as u64);
        self.code_truncated = Some(true);
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
        /// The trail's current file; rotated ones are kept beside it.
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
        /// The trail file concerned.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// A line of a trail is not one kernelbox wrote, or the chain breaks there.
    #[error("audit trail {}: line {line}: {reason}", path.display())]
    Broken {
        /// The trail file that does not verify.
        path: PathBuf,
        /// Its line number, from 1.
        line: usize,
        /// What is wrong.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_keeps_at_most_its_share_of_the_code_cut_at_a_character() {
        let mut record = AuditRecord {
            time: String::new(),
            kind: AuditKind::Cell,
            tenant: "t".into(),
            session: "s".into(),
            child: None,
            kernel: "k".into(),
            generation: 1,
            duration_seconds: 0.0,
            status: "success".into(),
            exit_code: None,
            code_sha256: String::new(),
            code: None,
            code_bytes: None,
            code_truncated: None,
            tenant_dropped: None,
            dropped: None,
            prev: String::new(),
        };
        record.keep_code("print(1)");
        assert_eq!(record.code.as_deref(), Some("print(1)"));
        assert_eq!((record.code_bytes, record.code_truncated), (None, None));
        // A two-byte character straddles the cut: the line keeps the bytes before it.
        let code = format!(
            "{}é{}",
            "x".repeat(AUDIT_CODE_BYTES - 1),
            "#".repeat(900_000)
        );
        record.keep_code(&code);
        assert_eq!(record.code.as_deref(), Some(&code[..AUDIT_CODE_BYTES - 1]));
        assert_eq!(record.code_bytes, Some(code.len() as u64));
        assert_eq!(record.code_truncated, Some(true));
    }
}
