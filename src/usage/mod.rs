//! What each tenant used (`docs/usage.md`): per-tenant counters for the metrics, their
//! label values bounded, and the usage ledger's rows.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this table |
//! | `ledger.rs` | the usage ledger's [`UsageRow`] (per tenant, session and hour), the [`Pending`] deltas between flushes (bounded), grouping for reports |
//! | `tenants.rs` | [`TenantMeter`]: cells by status, cold starts, pool hits and losses by reason per tenant, with at most [`MAX_TENANT_LABELS`] tenants named (the rest in [`OTHER_TENANTS`]) |

/// How often the usage ledger samples kernels and flushes to the catalog: the most usage a
/// `kill -9` of the server can lose (`docs/usage.md`, "Durability").
pub const LEDGER_FLUSH: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the ledger keeps an hour's rows (older ones are pruned at each flush).
pub const LEDGER_RETENTION_SECONDS: u64 = 90 * 86_400;

mod ledger;
mod tenants;

pub use ledger::{group, hour_of, GroupBy, Pending, UsageRow, HOUR, MAX_PENDING, OVERFLOW_SESSION};
pub use tenants::{TenantCounts, TenantMeter, MAX_TENANT_LABELS, OTHER_TENANTS, STATUSES};
