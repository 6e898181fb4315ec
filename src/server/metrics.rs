//! Prometheus metrics, hand-rolled (text exposition format 0.0.4). Every label value is
//! pre-initialised so series exist from the first scrape.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::cell::{CellResult, CellStatus, LossReason};
use crate::histogram::Histogram;
use crate::orchestrator::{FileBytes, PoolStats, Stats, TenantStats};
use crate::usage::STATUSES;

/// Upper bounds of the cell duration histogram, in seconds.
const BUCKETS: [f64; 12] = [
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
];

/// Outcomes of a tool call dispatched to a tenant's endpoint.
pub const TOOL_OUTCOMES: [&str; 2] = ["ok", "error"];

/// Why a request was turned away before reaching a kernel.
/// `connections`: a connection refused at the server's connection limits (no slot to be
/// had); `connections_per_address`: one refused because its address holds its share of
/// unauthenticated connections; `connection_evicted`: an unauthenticated connection doing
/// nothing useful closed to give its slot to a newer one (docs/http-api.md, "Slow and idle
/// clients cannot hold the server"); `mcp_sessions`: an MCP `initialize` past the tenant's
/// MCP session cap; `pending_results`: a cell of a tenant whose responses not yet read
/// reach its budget (or the host's).
pub const REJECTIONS: [&str; 10] = [
    "unauthorized",
    "invalid",
    "too_large",
    "capacity",
    "session_busy",
    "connections",
    "connections_per_address",
    "connection_evicted",
    "mcp_sessions",
    "pending_results",
];

/// The server's counters.
pub struct Metrics {
    cells: Mutex<[Histogram; 4]>,
    kernel_starts: AtomicU64,
    state_lost: [AtomicU64; LossReason::ALL.len()],
    tool_calls: [AtomicU64; TOOL_OUTCOMES.len()],
    rejected: [AtomicU64; REJECTIONS.len()],
    mcp_sessions: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            cells: Mutex::new(std::array::from_fn(|_| Histogram::new(&BUCKETS))),
            kernel_starts: AtomicU64::default(),
            state_lost: Default::default(),
            tool_calls: Default::default(),
            rejected: Default::default(),
            mcp_sessions: AtomicU64::default(),
        }
    }
}

fn status_index(status: CellStatus) -> usize {
    STATUSES.iter().position(|s| *s == status).unwrap_or(0)
}

impl Metrics {
    /// Records a finished cell.
    pub fn cell(&self, result: &CellResult) {
        {
            let mut cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
            cells[status_index(result.status)].observe(result.duration_seconds);
        }
        if !result.kernel.reused {
            self.kernel_starts.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(lost) = &result.kernel.state_lost {
            if let Some(i) = LossReason::ALL.iter().position(|r| *r == lost.reason) {
                self.state_lost[i].fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Records a tool call's outcome (`ok` or `error`).
    pub fn tool_call(&self, ok: bool) {
        self.tool_calls[usize::from(!ok)].fetch_add(1, Ordering::Relaxed);
    }

    /// Records a rejected request (one of [`REJECTIONS`]).
    pub fn rejected(&self, reason: &str) {
        if let Some(i) = REJECTIONS.iter().position(|r| *r == reason) {
            self.rejected[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// An MCP session on `/v1/mcp` opened (`true`) or ended (`false`).
    pub(crate) fn mcp_session(&self, opened: bool) {
        if opened {
            self.mcp_sessions.fetch_add(1, Ordering::Relaxed);
        } else {
            self.mcp_sessions.fetch_sub(1, Ordering::Relaxed);
        }
    }

    /// The exposition text; `live` is the number of live kernels right now.
    pub fn render(&self, live: usize, draining: bool, stats: &Stats) -> String {
        let mut out = String::new();
        let _ = self.write(&mut out, live, draining);
        let _ = write_lifecycle(&mut out, stats);
        out
    }

    fn write(&self, out: &mut String, live: usize, draining: bool) -> std::fmt::Result {
        self.write_gauges(out, live, draining)?;
        self.write_cells(out)?;
        self.write_counters(out)
    }

    /// Live kernels, draining, open MCP sessions.
    fn write_gauges(&self, out: &mut String, live: usize, draining: bool) -> std::fmt::Result {
        writeln!(
            out,
            "# HELP kernelbox_kernels_live Kernels alive now (starting, idle or busy)."
        )?;
        writeln!(out, "# TYPE kernelbox_kernels_live gauge")?;
        writeln!(out, "kernelbox_kernels_live {live}")?;
        writeln!(
            out,
            "# HELP kernelbox_draining 1 while the server shuts down."
        )?;
        writeln!(out, "# TYPE kernelbox_draining gauge")?;
        writeln!(out, "kernelbox_draining {}", u8::from(draining))?;
        writeln!(
            out,
            "# HELP kernelbox_mcp_sessions MCP sessions open on /v1/mcp."
        )?;
        writeln!(out, "# TYPE kernelbox_mcp_sessions gauge")?;
        writeln!(
            out,
            "kernelbox_mcp_sessions {}",
            self.mcp_sessions.load(Ordering::Relaxed)
        )
    }

    /// Cells' wall time and count, by status.
    fn write_cells(&self, out: &mut String) -> std::fmt::Result {
        writeln!(
            out,
            "# HELP kernelbox_cell_duration_seconds Wall time of executed cells, by status."
        )?;
        writeln!(out, "# TYPE kernelbox_cell_duration_seconds histogram")?;
        let cells = self.cells.lock().unwrap_or_else(|p| p.into_inner());
        for (status, h) in STATUSES.iter().zip(cells.iter()) {
            h.render(
                out,
                "kernelbox_cell_duration_seconds",
                &format!("status=\"{}\"", status.as_str()),
            )?;
        }
        writeln!(
            out,
            "# HELP kernelbox_cells_total Executed cells, by status."
        )?;
        writeln!(out, "# TYPE kernelbox_cells_total counter")?;
        for (status, h) in STATUSES.iter().zip(cells.iter()) {
            writeln!(
                out,
                "kernelbox_cells_total{{status=\"{}\"}} {}",
                status.as_str(),
                h.count()
            )?;
        }
        Ok(())
    }

    /// Kernel starts, losses by reason, tool calls by outcome, refused requests by reason.
    fn write_counters(&self, out: &mut String) -> std::fmt::Result {
        writeln!(
            out,
            "# HELP kernelbox_kernel_starts_total New kernels given to an owner by a cell: cold starts and warm-pool takes (kernelbox_pool_takes_total tells them apart)."
        )?;
        writeln!(out, "# TYPE kernelbox_kernel_starts_total counter")?;
        writeln!(
            out,
            "kernelbox_kernel_starts_total {}",
            self.kernel_starts.load(Ordering::Relaxed)
        )?;

        writeln!(out, "# HELP kernelbox_state_lost_total Involuntary kernel losses reported to callers, by reason.")?;
        writeln!(out, "# TYPE kernelbox_state_lost_total counter")?;
        for (reason, n) in LossReason::ALL.iter().zip(self.state_lost.iter()) {
            writeln!(
                out,
                "kernelbox_state_lost_total{{reason=\"{}\"}} {}",
                reason.as_str(),
                n.load(Ordering::Relaxed)
            )?;
        }

        writeln!(
            out,
            "# HELP kernelbox_tool_calls_total Tool calls sent to tenant endpoints, by outcome."
        )?;
        writeln!(out, "# TYPE kernelbox_tool_calls_total counter")?;
        for (outcome, n) in TOOL_OUTCOMES.iter().zip(self.tool_calls.iter()) {
            writeln!(
                out,
                "kernelbox_tool_calls_total{{outcome=\"{outcome}\"}} {}",
                n.load(Ordering::Relaxed)
            )?;
        }

        writeln!(out, "# HELP kernelbox_requests_rejected_total Requests refused before reaching a kernel, by reason.")?;
        writeln!(out, "# TYPE kernelbox_requests_rejected_total counter")?;
        for (reason, n) in REJECTIONS.iter().zip(self.rejected.iter()) {
            writeln!(
                out,
                "kernelbox_requests_rejected_total{{reason=\"{reason}\"}} {}",
                n.load(Ordering::Relaxed)
            )?;
        }
        Ok(())
    }
}

/// Response bytes built and not yet handed to clients' connections, and responses cut for
/// being read slower than the minimum rate (docs/http-api.md).
pub(crate) fn write_responses(out: &mut String, held: u64, cut: u64) -> std::fmt::Result {
    writeln!(out, "# HELP kernelbox_response_bytes_pending Response bytes built and not yet sent, all tenants.")?;
    writeln!(out, "# TYPE kernelbox_response_bytes_pending gauge")?;
    writeln!(out, "kernelbox_response_bytes_pending {held}")?;
    writeln!(out, "# HELP kernelbox_responses_cut_total Responses cut for being read slower than the minimum rate.")?;
    writeln!(out, "# TYPE kernelbox_responses_cut_total counter")?;
    writeln!(out, "kernelbox_responses_cut_total {cut}")
}

/// A tenant's name as a label value.
fn escape(tenant: &str) -> String {
    tenant.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Per tenant (`docs/usage.md`, "Per-tenant metrics"): live kernels, cells by status, new
/// kernels cold and from the pool, losses by reason. Label values are tenants' names, at most
/// `MAX_TENANT_LABELS` of them and `(other)` for the rest; never sessions.
pub(crate) fn write_tenants(out: &mut String, tenants: &TenantStats) -> std::fmt::Result {
    let names: std::collections::BTreeSet<&String> =
        tenants.counts.keys().chain(tenants.live.keys()).collect();
    let zero = crate::usage::TenantCounts::default();
    let counts = |t: &str| tenants.counts.get(t).unwrap_or(&zero);
    writeln!(out, "# HELP kernelbox_tenant_kernels_live Kernels alive now per tenant (starting, idle or busy).")?;
    writeln!(out, "# TYPE kernelbox_tenant_kernels_live gauge")?;
    for t in &names {
        let n = tenants.live.get(*t).copied().unwrap_or(0);
        writeln!(
            out,
            "kernelbox_tenant_kernels_live{{tenant=\"{}\"}} {n}",
            escape(t)
        )?;
    }
    writeln!(
        out,
        "# HELP kernelbox_tenant_cells_total Cells ended per tenant, by status."
    )?;
    writeln!(out, "# TYPE kernelbox_tenant_cells_total counter")?;
    for t in &names {
        for (status, n) in STATUSES.iter().zip(counts(t).cells.iter()) {
            writeln!(
                out,
                "kernelbox_tenant_cells_total{{tenant=\"{}\",status=\"{}\"}} {n}",
                escape(t),
                status.as_str()
            )?;
        }
    }
    writeln!(out, "# HELP kernelbox_tenant_new_kernels_total New kernels given to a tenant's owners: started cold, or taken from the warm pool (pool_hit).")?;
    writeln!(out, "# TYPE kernelbox_tenant_new_kernels_total counter")?;
    for t in &names {
        let c = counts(t);
        for (how, n) in [("cold_start", c.cold_starts), ("pool_hit", c.pool_hits)] {
            writeln!(
                out,
                "kernelbox_tenant_new_kernels_total{{tenant=\"{}\",how=\"{how}\"}} {n}",
                escape(t)
            )?;
        }
    }
    writeln!(out, "# HELP kernelbox_tenant_kernel_losses_total Kernels of a tenant lost without their owner asking, by reason.")?;
    writeln!(out, "# TYPE kernelbox_tenant_kernel_losses_total counter")?;
    for t in &names {
        for (reason, n) in LossReason::ALL.iter().zip(counts(t).losses.iter()) {
            writeln!(
                out,
                "kernelbox_tenant_kernel_losses_total{{tenant=\"{}\",reason=\"{}\"}} {n}",
                escape(t),
                reason.as_str()
            )?;
        }
    }
    Ok(())
}

/// Network egress per tenant (docs/reliability.md, "Network egress"): bytes each way,
/// connections allowed, refusals by reason. Every tenant with a policy has every series from
/// the first scrape; tenants are few, and no series is per session.
pub(crate) fn write_egress(out: &mut String, egress: &crate::egress::Egress) -> std::fmt::Result {
    use crate::egress::proxy::{Outcome, TenantCounters};
    let counters = egress.counters();
    let mut tenants: Vec<(String, TenantCounters)> = egress
        .tenants()
        .into_iter()
        .map(|t| {
            let c = counters
                .iter()
                .find(|(name, _)| *name == t)
                .map(|(_, c)| c.clone())
                .unwrap_or_default();
            (t, c)
        })
        .collect();
    // A tenant that had connections and no policy now (none today; kept should that change).
    for (t, c) in &counters {
        if !tenants.iter().any(|(name, _)| name == t) {
            tenants.push((t.clone(), c.clone()));
        }
    }
    writeln!(out, "# HELP kernelbox_egress_bytes_total Bytes through the egress proxy, by tenant and direction (out: kernels to destinations; in: back).")?;
    writeln!(out, "# TYPE kernelbox_egress_bytes_total counter")?;
    for (t, c) in &tenants {
        for (direction, n) in [("out", c.bytes_out), ("in", c.bytes_in)] {
            writeln!(
                out,
                "kernelbox_egress_bytes_total{{tenant=\"{}\",direction=\"{direction}\"}} {n}",
                escape(t)
            )?;
        }
    }
    writeln!(out, "# HELP kernelbox_egress_connections_total Egress connections allowed and ended, by tenant.")?;
    writeln!(out, "# TYPE kernelbox_egress_connections_total counter")?;
    for (t, c) in &tenants {
        writeln!(
            out,
            "kernelbox_egress_connections_total{{tenant=\"{}\"}} {}",
            escape(t),
            c.connections
        )?;
    }
    writeln!(out, "# HELP kernelbox_egress_lookups_total Names the egress proxy looked up for kernels' requests, by tenant (only names a name entry of the policy allows).")?;
    writeln!(out, "# TYPE kernelbox_egress_lookups_total counter")?;
    for (t, c) in &tenants {
        writeln!(
            out,
            "kernelbox_egress_lookups_total{{tenant=\"{}\"}} {}",
            escape(t),
            c.lookups
        )?;
    }
    writeln!(out, "# HELP kernelbox_egress_refusals_total Egress connections refused or failed, by tenant and reason.")?;
    writeln!(out, "# TYPE kernelbox_egress_refusals_total counter")?;
    for (t, c) in &tenants {
        for outcome in Outcome::ALL {
            let reason = outcome.name();
            writeln!(
                out,
                "kernelbox_egress_refusals_total{{tenant=\"{}\",reason=\"{reason}\"}} {}",
                escape(t),
                c.refusals.get(reason).copied().unwrap_or(0)
            )?;
        }
    }
    Ok(())
}

/// The orchestrator's own counters: kernel start times by outcome, losses as they happen.
fn write_lifecycle(out: &mut String, stats: &Stats) -> std::fmt::Result {
    writeln!(out, "# HELP kernelbox_tenant_evictions_total Idle kernels evicted to keep a tenant under max_kernels.")?;
    writeln!(out, "# TYPE kernelbox_tenant_evictions_total counter")?;
    writeln!(
        out,
        "kernelbox_tenant_evictions_total {}",
        stats.evictions.tenant_cap
    )?;
    writeln!(out, "# HELP kernelbox_host_cap_evictions_total Idle kernels evicted at the host's kernel cap to admit another, by whose they were: the requester's own tenant's, or a tenant's over its fair share.")?;
    writeln!(out, "# TYPE kernelbox_host_cap_evictions_total counter")?;
    for (victim, n) in [
        ("own_tenant", stats.evictions.host_cap_own),
        ("other_tenant", stats.evictions.host_cap_other),
    ] {
        writeln!(
            out,
            "kernelbox_host_cap_evictions_total{{victim=\"{victim}\"}} {n}"
        )?;
    }
    writeln!(
        out,
        "# HELP kernelbox_kernel_start_seconds Time to start a kernel (container up, runner ready), by outcome."
    )?;
    writeln!(out, "# TYPE kernelbox_kernel_start_seconds histogram")?;
    for (outcome, h) in [
        ("started", &stats.starts.started),
        ("failed", &stats.starts.failed),
    ] {
        h.render(
            out,
            "kernelbox_kernel_start_seconds",
            &format!("outcome=\"{outcome}\""),
        )?;
    }
    writeln!(
        out,
        "# HELP kernelbox_kernel_losses_total Kernels lost without their owner asking, as it happened, by reason (evictions and idle reaps included)."
    )?;
    writeln!(out, "# TYPE kernelbox_kernel_losses_total counter")?;
    for (reason, n) in LossReason::ALL.iter().zip(stats.losses.iter()) {
        writeln!(
            out,
            "kernelbox_kernel_losses_total{{reason=\"{}\"}} {n}",
            reason.as_str()
        )?;
    }
    write_pool(out, &stats.pool)?;
    writeln!(
        out,
        "# HELP kernelbox_catalog_write_failures_total Changes to the durable owner catalog that were dropped or failed (logged; cells are unaffected)."
    )?;
    writeln!(out, "# TYPE kernelbox_catalog_write_failures_total counter")?;
    writeln!(
        out,
        "kernelbox_catalog_write_failures_total {}",
        stats.catalog_failures
    )?;
    writeln!(
        out,
        "# HELP kernelbox_file_bytes_total File bytes streamed into (upload) and out of (download) kernels, by the file API and the MCP file tools alike."
    )?;
    writeln!(out, "# TYPE kernelbox_file_bytes_total counter")?;
    let FileBytes { upload, download } = stats.file_bytes;
    for (direction, n) in [("upload", upload), ("download", download)] {
        writeln!(
            out,
            "kernelbox_file_bytes_total{{direction=\"{direction}\"}} {n}"
        )?;
    }
    write_audit(out, &stats.audit)
}

/// The audit trail's losses (docs/usage.md, "Audit trail"): records never written, by why;
/// lines whose code was cut; files and bytes rotation deleted.
fn write_audit(out: &mut String, audit: &crate::audit::AuditStats) -> std::fmt::Result {
    writeln!(out, "# HELP kernelbox_audit_dropped_total Audit records never written, by reason: the writer's queue was full, a write failed, or the tenant was past its byte budget.")?;
    writeln!(out, "# TYPE kernelbox_audit_dropped_total counter")?;
    for (reason, n) in [
        ("queue", audit.dropped_queue),
        ("write", audit.dropped_write),
        ("tenant_budget", audit.dropped_budget),
    ] {
        writeln!(
            out,
            "kernelbox_audit_dropped_total{{reason=\"{reason}\"}} {n}"
        )?;
    }
    writeln!(out, "# HELP kernelbox_audit_code_truncated_total Audit lines whose code was cut to its first bytes.")?;
    writeln!(out, "# TYPE kernelbox_audit_code_truncated_total counter")?;
    writeln!(
        out,
        "kernelbox_audit_code_truncated_total {}",
        audit.code_truncated
    )?;
    writeln!(out, "# HELP kernelbox_audit_rotated_out_files_total Audit files deleted by rotation (their lines are gone from the host).")?;
    writeln!(
        out,
        "# TYPE kernelbox_audit_rotated_out_files_total counter"
    )?;
    writeln!(
        out,
        "kernelbox_audit_rotated_out_files_total {}",
        audit.rotated_out_files
    )?;
    writeln!(out, "# HELP kernelbox_audit_rotated_out_bytes_total Bytes of the audit files deleted by rotation.")?;
    writeln!(
        out,
        "# TYPE kernelbox_audit_rotated_out_bytes_total counter"
    )?;
    writeln!(
        out,
        "kernelbox_audit_rotated_out_bytes_total {}",
        audit.rotated_out_bytes
    )
}

/// The warm pool: ready kernels, takes by outcome, refill times.
fn write_pool(out: &mut String, pool: &PoolStats) -> std::fmt::Result {
    writeln!(
        out,
        "# HELP kernelbox_pool_size Pooled kernels the warm pool keeps ready (0: no pool)."
    )?;
    writeln!(out, "# TYPE kernelbox_pool_size gauge")?;
    writeln!(out, "kernelbox_pool_size {}", pool.size)?;
    writeln!(out, "# HELP kernelbox_pool_ready Pooled kernels ready now (counted toward the host's kernel cap, no tenant's).")?;
    writeln!(out, "# TYPE kernelbox_pool_ready gauge")?;
    writeln!(out, "kernelbox_pool_ready {}", pool.ready)?;
    writeln!(out, "# HELP kernelbox_pool_takes_total New kernels for new owners while the pool is on: hit (taken from the pool) or miss (started cold).")?;
    writeln!(out, "# TYPE kernelbox_pool_takes_total counter")?;
    for (outcome, n) in [("hit", pool.hits), ("miss", pool.misses)] {
        writeln!(
            out,
            "kernelbox_pool_takes_total{{outcome=\"{outcome}\"}} {n}"
        )?;
    }
    writeln!(out, "# HELP kernelbox_pool_language_ready Pooled kernels ready now, by the language they were started with.")?;
    writeln!(out, "# TYPE kernelbox_pool_language_ready gauge")?;
    for (language, share) in &pool.languages {
        let language = language.name();
        writeln!(
            out,
            "kernelbox_pool_language_ready{{language=\"{language}\"}} {}",
            share.ready
        )?;
    }
    writeln!(out, "# HELP kernelbox_pool_language_takes_total New kernels of a pooled language for new owners: hit (taken from its pool) or miss (started cold).")?;
    writeln!(out, "# TYPE kernelbox_pool_language_takes_total counter")?;
    for (language, share) in &pool.languages {
        let language = language.name();
        for (outcome, n) in [("hit", share.hits), ("miss", share.misses)] {
            writeln!(
                out,
                "kernelbox_pool_language_takes_total{{language=\"{language}\",outcome=\"{outcome}\"}} {n}"
            )?;
        }
    }
    writeln!(out, "# HELP kernelbox_pool_refill_seconds Time to start one pooled kernel (container up, runner ready).")?;
    writeln!(out, "# TYPE kernelbox_pool_refill_seconds histogram")?;
    pool.refills
        .render(out, "kernelbox_pool_refill_seconds", "")?;
    writeln!(
        out,
        "# HELP kernelbox_pool_refill_failures_total Pooled kernels that failed to start."
    )?;
    writeln!(out, "# TYPE kernelbox_pool_refill_failures_total counter")?;
    writeln!(
        out,
        "kernelbox_pool_refill_failures_total {}",
        pool.refill_failures
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_value_is_present_before_any_event() {
        let stats = Stats {
            starts: Default::default(),
            losses: Default::default(),
            evictions: Default::default(),
            catalog_failures: 0,
            pool: PoolStats {
                size: 4,
                ready: 0,
                hits: 0,
                misses: 0,
                refills: Histogram::new(&crate::orchestrator::REFILL_BUCKETS),
                refill_failures: 0,
                languages: [(
                    crate::wire::Language::Bash,
                    crate::orchestrator::LanguagePool {
                        size: 1,
                        ..Default::default()
                    },
                )]
                .into(),
            },
            file_bytes: FileBytes::default(),
            audit: Default::default(),
        };
        let text = Metrics::default().render(0, false, &stats);
        assert!(text.contains("kernelbox_audit_dropped_total{reason=\"tenant_budget\"} 0"));
        assert!(text.contains("kernelbox_audit_rotated_out_files_total 0"));
        assert!(text.contains("kernelbox_pool_ready 0"));
        assert!(text.contains("kernelbox_pool_takes_total{outcome=\"hit\"} 0"));
        assert!(text.contains("kernelbox_pool_takes_total{outcome=\"miss\"} 0"));
        assert!(text.contains("kernelbox_pool_language_ready{language=\"bash\"} 0"));
        let bash_hits = "kernelbox_pool_language_takes_total{language=\"bash\",outcome=\"hit\"} 0";
        assert!(text.contains(bash_hits));
        assert!(text.contains("kernelbox_pool_refill_seconds_count 0"));
        assert!(text.contains("kernelbox_kernel_start_seconds_count{outcome=\"failed\"} 0"));
        assert!(text.contains("kernelbox_kernel_losses_total{reason=\"evicted\"} 0"));
        for s in ["success", "error", "timeout", "interrupted"] {
            assert!(
                text.contains(&format!("kernelbox_cells_total{{status=\"{s}\"}} 0")),
                "{s}"
            );
        }
        for r in LossReason::ALL {
            assert!(text.contains(&format!(
                "kernelbox_state_lost_total{{reason=\"{}\"}} 0",
                r.as_str()
            )));
        }
        assert!(text.contains("kernelbox_tool_calls_total{outcome=\"error\"} 0"));
        assert!(text.contains("kernelbox_kernels_live 0"));
        assert!(text.contains("kernelbox_tenant_evictions_total 0"));
        assert!(text.contains("kernelbox_host_cap_evictions_total{victim=\"other_tenant\"} 0"));
        assert!(text.contains("kernelbox_catalog_write_failures_total 0"));
        assert!(text.contains("kernelbox_file_bytes_total{direction=\"download\"} 0"));
    }
}
