//! The audit trail's records (`docs/usage.md`, "Audit trail"): one per cell and per command
//! that ran in a kernel of a tenant that opted in, handed to the trail's writer
//! ([`crate::audit::Auditor`]) without waiting. The code's hash always, the code only for a
//! tenant that asked for it, never the output.

use super::Orchestrator;
use crate::audit::{AuditKind, AuditRecord};
use crate::owner::Owner;

/// What ran, as the trail records it.
pub(super) struct Ran<'a> {
    pub kind: AuditKind,
    pub owner: &'a Owner,
    /// The code (a command's: its arguments joined by NUL, [`AuditRecord::command_code`]).
    pub code: &'a str,
    pub kernel: &'a str,
    pub generation: u64,
    pub duration_seconds: f64,
    pub status: &'a str,
    pub exit_code: Option<i64>,
}

impl Orchestrator {
    /// Records `ran` when its tenant is audited.
    pub(super) fn audit(&self, ran: Ran<'_>) {
        let (Some(auditor), Some(config)) = (&self.inner.audit, &self.inner.config.audit) else {
            return;
        };
        let Some(policy) = config.tenants.get(&ran.owner.tenant) else {
            return;
        };
        let mut record = AuditRecord {
            time: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            kind: ran.kind,
            tenant: ran.owner.tenant.clone(),
            session: ran.owner.session.clone(),
            child: ran.owner.child.clone(),
            kernel: ran.kernel.to_string(),
            generation: ran.generation,
            duration_seconds: ran.duration_seconds,
            status: ran.status.to_string(),
            exit_code: ran.exit_code,
            code_sha256: AuditRecord::code_hash(ran.code.as_bytes()),
            code: None,
            code_bytes: None,
            code_truncated: None,
            tenant_dropped: None,
            dropped: None,
            prev: String::new(),
        };
        if policy.code {
            // At most `AUDIT_CODE_BYTES` of it; the hash above is the whole code's.
            record.keep_code(ran.code);
        }
        auditor.record(record);
    }
}
