//! Per-tenant counters for the metrics (`docs/usage.md`, "Per-tenant metrics"). Tenants are
//! few and sessions many: a session is never a label value, and a host that sees more than
//! [`MAX_TENANT_LABELS`] tenants counts the later ones together under [`OTHER_TENANTS`], so
//! hostile tenant churn cannot grow the scrape without bound.

use std::collections::BTreeMap;
use std::sync::Mutex;

use crate::cell::{CellStatus, LossReason};

/// The most tenants named in metric labels; later ones share [`OTHER_TENANTS`].
pub const MAX_TENANT_LABELS: usize = 64;

/// The label value of tenants past [`MAX_TENANT_LABELS`] (no tenant name can be it: `(` is
/// not allowed in names).
pub const OTHER_TENANTS: &str = "(other)";

/// The cell statuses counted, in label order.
pub const STATUSES: [CellStatus; 4] = [
    CellStatus::Success,
    CellStatus::Error,
    CellStatus::Timeout,
    CellStatus::Interrupted,
];

/// One tenant's (or the other tenants') counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TenantCounts {
    /// Cells ended, indexed as [`STATUSES`].
    pub cells: [u64; STATUSES.len()],
    /// New kernels started cold for the tenant's owners.
    pub cold_starts: u64,
    /// New kernels taken from the warm pool for the tenant's owners.
    pub pool_hits: u64,
    /// Kernels lost without their owner asking, indexed as [`LossReason::ALL`].
    pub losses: [u64; LossReason::ALL.len()],
}

/// The per-tenant counters, keyed by label value (a tenant's name or [`OTHER_TENANTS`]).
#[derive(Debug, Default)]
pub struct TenantMeter {
    counts: Mutex<BTreeMap<String, TenantCounts>>,
}

impl TenantMeter {
    fn with(&self, tenant: &str, f: impl FnOnce(&mut TenantCounts)) {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let label = label_in(&counts, tenant).to_string();
        f(counts.entry(label).or_default());
    }

    /// The label value `tenant` is counted under.
    pub fn label<'a>(&self, tenant: &'a str) -> &'a str {
        label_in(
            &self.counts.lock().unwrap_or_else(|p| p.into_inner()),
            tenant,
        )
    }

    /// A cell of `tenant` ended with `status`.
    pub fn cell(&self, tenant: &str, status: CellStatus) {
        let i = STATUSES.iter().position(|s| *s == status).unwrap_or(0);
        self.with(tenant, |c| c.cells[i] += 1);
    }

    /// A new kernel for an owner of `tenant`: out of the warm pool (`pooled`) or cold.
    pub fn new_kernel(&self, tenant: &str, pooled: bool) {
        self.with(tenant, |c| match pooled {
            true => c.pool_hits += 1,
            false => c.cold_starts += 1,
        });
    }

    /// A kernel of `tenant` lost for `reason`.
    pub fn loss(&self, tenant: &str, reason: LossReason) {
        if let Some(i) = LossReason::ALL.iter().position(|r| *r == reason) {
            self.with(tenant, |c| c.losses[i] += 1);
        }
    }

    /// Every label value's counters, by label value.
    pub fn snapshot(&self) -> BTreeMap<String, TenantCounts> {
        self.counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// `tenant`'s label value: its name once counted, or while fewer than [`MAX_TENANT_LABELS`]
/// tenants are named; [`OTHER_TENANTS`] after.
fn label_in<'a>(counts: &BTreeMap<String, TenantCounts>, tenant: &'a str) -> &'a str {
    let named = counts.len() - usize::from(counts.contains_key(OTHER_TENANTS));
    if counts.contains_key(tenant) || named < MAX_TENANT_LABELS {
        tenant
    } else {
        OTHER_TENANTS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenants_past_the_cap_share_one_label() {
        let meter = TenantMeter::default();
        for i in 0..MAX_TENANT_LABELS + 10 {
            meter.cell(&format!("t{i}"), CellStatus::Success);
        }
        meter.cell("t0", CellStatus::Error);
        let snap = meter.snapshot();
        assert_eq!(snap.len(), MAX_TENANT_LABELS + 1);
        assert_eq!(snap[OTHER_TENANTS].cells[0], 10);
        assert_eq!(snap["t0"].cells, [1, 1, 0, 0]);
        assert_eq!(meter.label("late"), OTHER_TENANTS);
        assert_eq!(meter.label("t3"), "t3");
    }
}
