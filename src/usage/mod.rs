//! What each tenant used (`docs/usage.md`): per-tenant counters for the metrics, their
//! label values bounded.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this table |
//! | `tenants.rs` | [`TenantMeter`]: cells by status, cold starts, pool hits and losses by reason per tenant, with at most [`MAX_TENANT_LABELS`] tenants named (the rest in [`OTHER_TENANTS`]) |

mod tenants;

pub use tenants::{TenantCounts, TenantMeter, MAX_TENANT_LABELS, OTHER_TENANTS, STATUSES};
