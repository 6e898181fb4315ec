//! The audit trail's records (`docs/usage.md`, "Audit trail"): one per cell and per command
//! that ran in a kernel of a tenant that opted in, handed to the trail's writer
//! ([`crate::audit::Auditor`]) without waiting. The code's hash always, the code only for a
//! tenant that asked for it, never the output. A service of the orchestrator: [`AuditTrail`]
//! owns the writer and the tenants' policies; cells and commands hand it what ran.

use std::sync::Arc;

use tokio_util::task::TaskTracker;

use crate::audit::{
    AuditConfig, AuditError, AuditKind, AuditPolicy, AuditRecord, AuditStats, Auditor,
};
use crate::owner::Owner;
use crate::tenancy::LivePolicies;

/// What ran, as the trail records it.
pub(crate) struct Ran<'a> {
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

/// The audit trail: its writer and the tenants it audits, when configured.
#[derive(Default)]
pub(crate) struct AuditTrail {
    writer: Option<Auditor>,
    /// The tenants' settings as now: which tenants are audited and how (a reload swaps them:
    /// `crate::tenancy`).
    policies: Option<Arc<LivePolicies>>,
}

impl AuditTrail {
    /// The trail of `config` (none without one), its writer owned by `tracker`.
    pub(crate) fn start(
        config: Option<&AuditConfig>,
        policies: Arc<LivePolicies>,
        tracker: &TaskTracker,
    ) -> Result<AuditTrail, AuditError> {
        let Some(config) = config else {
            return Ok(AuditTrail::default());
        };
        Ok(AuditTrail {
            writer: Some(Auditor::start(config.sink.clone(), tracker)?),
            policies: Some(policies),
        })
    }

    /// How `tenant` is audited; `None` when it is not.
    fn policy(&self, tenant: &str) -> Option<AuditPolicy> {
        self.policies.as_ref()?.load().audit.get(tenant).copied()
    }

    /// The writer's counters (zero without a trail).
    pub(crate) fn stats(&self) -> AuditStats {
        self.writer.as_ref().map(|a| a.stats()).unwrap_or_default()
    }

    /// Writes what was recorded and closes the trail (at the stop, once the kernels are
    /// gone: their cells and commands have ended).
    pub(crate) async fn close(&self) {
        if let Some(writer) = &self.writer {
            writer.close().await;
        }
    }

    /// Records `ran` when its tenant is audited.
    pub(crate) fn record(&self, ran: Ran<'_>) {
        let Some(auditor) = &self.writer else {
            return;
        };
        let Some(policy) = self.policy(&ran.owner.tenant) else {
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
