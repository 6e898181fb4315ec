//! What happened lately (`docs/console.md`, "What happened lately"): a session's kernel
//! lifecycle events ([`SessionEvents`]), the audit trail's tail ([`AuditTail`]), the egress
//! proxy's recent refusals ([`EgressRefusals`]); and [`RecentQuery`], the query of their
//! routes. Each answer is bounded by [`MAX_RECENT`] items.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most items (sessions, audit records, refusals) one answer holds.
pub const MAX_RECENT: usize = 200;
/// Items in an answer when the query names no `limit`.
pub const DEFAULT_RECENT: usize = 50;

/// The query of the recent-things routes: how many, and (the admin's routes) whose.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    /// Items answered, the most recent (default [`DEFAULT_RECENT`], 1 to [`MAX_RECENT`]).
    #[serde(default)]
    pub limit: Option<usize>,
    /// Only this tenant's (the admin's routes; a tenant's token sees its own only).
    #[serde(default)]
    pub tenant: Option<String>,
}

impl RecentQuery {
    /// The number of items asked for; an error names what is out of bounds.
    pub fn limit(&self) -> Result<usize, String> {
        match self.limit {
            None => Ok(DEFAULT_RECENT),
            Some(0) => Err("limit must be at least 1".into()),
            Some(n) if n > MAX_RECENT => Err(format!("limit {n} is more than {MAX_RECENT}")),
            Some(n) => Ok(n),
        }
    }
}

/// What happened to a session's kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LifecycleKind {
    /// A kernel started: `reason` says `cold` or `pool` (a warm one taken).
    Started,
    /// A hibernated kernel was restored, its state intact.
    Restored,
    /// An idle kernel was checkpointed and stopped: `reason` says `idle`, `evicted` or `restart`.
    Hibernated,
    /// Running cells were interrupted: `reason` says how many.
    Interrupted,
    /// The kernel was removed on purpose: `reason` says `cleared`, `reset` or `ended`.
    Ended,
    /// The kernel is gone with its state: `reason` is the loss reason its next call reports
    /// (`timeout`, `oom`, `idle_reaped`, ... docs/contract.md).
    Lost,
}

/// One lifecycle event of a session's kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct KernelEvent {
    /// When, RFC 3339 UTC with milliseconds.
    pub at: String,
    /// What happened.
    pub event: LifecycleKind,
    /// Why or how (see [`LifecycleKind`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub reason: Option<String>,
    /// The session's kernel generation.
    pub generation: u64,
    /// The kernel's short container id, when it had one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub container: Option<String>,
    /// The delegated child whose kernel it was, if any.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub child: Option<String>,
}

/// `GET /v1/sessions/{session}/events`: a session's recent lifecycle events, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct SessionEvents {
    /// The tenant.
    pub tenant: String,
    /// The session.
    pub session: String,
    /// Its last event ended or lost its kernel: it has none now.
    pub ended: bool,
    /// Why its kernel was last lost, among the events kept.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub lost: Option<String>,
    /// The events, oldest first (at most the last 32).
    pub events: Vec<KernelEvent>,
}

/// `GET /v1/admin/events`: the sessions whose events changed last, the most recent first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct RecentSessions {
    /// The sessions, each with its events.
    pub sessions: Vec<SessionEvents>,
}

/// `GET /v1/audit`: the last records of the audit trail's current file, the most recent last.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct AuditTail {
    /// The records, oldest first: each as its line holds it (the code's hash always, the
    /// code only for a tenant that records it).
    pub records: Vec<crate::audit::AuditRecord>,
    /// Bytes read from the end of the file to find them (bounded).
    pub scanned_bytes: u64,
    /// The records read cover the whole current file (false: older lines were not read).
    pub whole_file: bool,
}

/// One destination the egress proxy refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EgressRefusal {
    /// When, RFC 3339 UTC with milliseconds.
    pub at: String,
    /// The tenant whose kernel asked.
    pub tenant: String,
    /// Its session.
    pub session: String,
    /// The destination's host as asked (cut at 253 bytes; `-` when refused before one was read).
    pub host: String,
    /// The destination's port (0 when refused before one was read).
    pub port: u16,
    /// Why: the outcome named as in `kernelbox_egress_refusals_total` (`denied`, `special_address`, ...).
    pub reason: String,
}

/// `GET /v1/egress/refusals`: the proxy's recent refusals, the most recent first.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
pub struct EgressRefusals {
    /// The refusals.
    pub refusals: Vec<EgressRefusal>,
    /// Egress is configured on this server (false: there is no proxy, so nothing is refused).
    pub egress: bool,
}
