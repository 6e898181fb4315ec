//! The usage ledger's rows and the pending deltas not yet flushed (`docs/usage.md`, "The
//! usage ledger"). Usage is aggregated per tenant, session and hour, so the ledger grows with
//! sessions times hours, never with cells; the catalog prunes rows past their retention.

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// Seconds in one ledger bucket.
pub const HOUR: u64 = 3_600;

/// Rows pending between flushes at most; past it a tenant's new sessions of the hour are
/// counted together under [`OVERFLOW_SESSION`] (a flush every few seconds keeps far below).
pub const MAX_PENDING: usize = 16_384;

/// The session name usage is counted under when [`MAX_PENDING`] rows are pending (no session
/// name can be it: `(` is not allowed in names).
pub const OVERFLOW_SESSION: &str = "(overflow)";

/// One tenant's session's usage in one hour (or, summed, over a range: see
/// [`UsageRow::add`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageRow {
    /// The tenant the usage is billed to.
    pub tenant: String,
    /// The session (a delegated child's usage counts toward its session); empty when summed
    /// over sessions.
    pub session: String,
    /// Start of the bucket, seconds since the Unix epoch (a multiple of [`HOUR`], or of a day
    /// when grouped by day).
    pub start: u64,
    /// Seconds kernels were alive.
    pub kernel_seconds: f64,
    /// CPU seconds kernels used, from their cgroups.
    pub cpu_seconds: f64,
    /// The highest memory a kernel of the session reached, from its memory cgroup, in bytes.
    pub peak_memory_bytes: u64,
    /// Cells run.
    pub cells: u64,
    /// Wall seconds of those cells.
    pub cell_seconds: f64,
    /// Shell commands run.
    pub commands: u64,
    /// Bytes uploaded into kernels through the file API.
    pub file_bytes_in: u64,
    /// Bytes downloaded out of kernels through the file API.
    pub file_bytes_out: u64,
    /// New kernels taken from the warm pool.
    pub pool_hits: u64,
    /// Bytes kernels received through the egress proxy (counted when a connection ends).
    #[serde(default)]
    pub network_bytes_in: u64,
    /// Bytes kernels sent through the egress proxy (counted when a connection ends).
    #[serde(default)]
    pub network_bytes_out: u64,
}

impl UsageRow {
    /// Adds `other`'s counts to this row (peak memory: the higher).
    pub fn add(&mut self, other: &UsageRow) {
        self.kernel_seconds += other.kernel_seconds;
        self.cpu_seconds += other.cpu_seconds;
        self.peak_memory_bytes = self.peak_memory_bytes.max(other.peak_memory_bytes);
        self.cells += other.cells;
        self.cell_seconds += other.cell_seconds;
        self.commands += other.commands;
        self.file_bytes_in += other.file_bytes_in;
        self.file_bytes_out += other.file_bytes_out;
        self.pool_hits += other.pool_hits;
        self.network_bytes_in += other.network_bytes_in;
        self.network_bytes_out += other.network_bytes_out;
    }
}

/// The hour bucket holding `epoch_seconds`.
pub fn hour_of(epoch_seconds: u64) -> u64 {
    epoch_seconds - epoch_seconds % HOUR
}

/// Usage recorded since the last flush, per (tenant, session, hour).
#[derive(Debug, Default)]
pub struct Pending {
    rows: Mutex<BTreeMap<(String, String, u64), UsageRow>>,
}

impl Pending {
    /// Adds to the row of `tenant`'s `session` in the current hour.
    pub fn record(&self, tenant: &str, session: &str, f: impl FnOnce(&mut UsageRow)) {
        let start = hour_of(crate::clock::unix_now());
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let mut key = (tenant.to_string(), session.to_string(), start);
        if !rows.contains_key(&key) && rows.len() >= MAX_PENDING {
            key.1 = OVERFLOW_SESSION.to_string();
        }
        let row = rows
            .entry(key)
            .or_insert_with_key(|(tenant, session, start)| UsageRow {
                tenant: tenant.clone(),
                session: session.clone(),
                start: *start,
                ..UsageRow::default()
            });
        f(row);
    }

    /// Takes every pending row (the flush); rows it fails to write are given back with
    /// [`Pending::restore`].
    pub fn take(&self) -> Vec<UsageRow> {
        std::mem::take(&mut *self.rows.lock().unwrap_or_else(|p| p.into_inner()))
            .into_values()
            .collect()
    }

    /// Gives back rows a flush could not write, merged into what was recorded since.
    pub fn restore(&self, rows: Vec<UsageRow>) {
        let mut pending = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        for row in rows {
            let key = (row.tenant.clone(), row.session.clone(), row.start);
            if !pending.contains_key(&key) && pending.len() >= MAX_PENDING {
                continue;
            }
            pending
                .entry(key)
                .or_insert_with(|| UsageRow {
                    tenant: row.tenant.clone(),
                    session: row.session.clone(),
                    start: row.start,
                    ..UsageRow::default()
                })
                .add(&row);
        }
    }
}

/// How usage is summed for a report.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum GroupBy {
    /// One row per tenant and session over the range (`start`: the range's first hour).
    #[default]
    Session,
    /// One row per tenant and UTC day (`session` empty).
    Day,
    /// One row per tenant and hour, the ledger's own bucket (`session` empty): the console's
    /// chart.
    Hour,
}

impl GroupBy {
    /// The name in a query string and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            GroupBy::Session => "session",
            GroupBy::Day => "day",
            GroupBy::Hour => "hour",
        }
    }
}

/// Sums hourly `rows` as `group_by` says, in (tenant, start, session) order.
pub fn group(rows: Vec<UsageRow>, group_by: GroupBy) -> Vec<UsageRow> {
    let mut out: BTreeMap<(String, u64, String), UsageRow> = BTreeMap::new();
    for row in rows {
        let key = match group_by {
            GroupBy::Session => (row.tenant.clone(), 0, row.session.clone()),
            GroupBy::Day => (
                row.tenant.clone(),
                row.start - row.start % 86_400,
                String::new(),
            ),
            GroupBy::Hour => (row.tenant.clone(), hour_of(row.start), String::new()),
        };
        let start = key.1;
        let entry = out.entry(key).or_insert_with(|| UsageRow {
            tenant: row.tenant.clone(),
            session: match group_by {
                GroupBy::Session => row.session.clone(),
                GroupBy::Day | GroupBy::Hour => String::new(),
            },
            start: match group_by {
                GroupBy::Session => row.start,
                GroupBy::Day | GroupBy::Hour => start,
            },
            ..UsageRow::default()
        });
        if group_by == GroupBy::Session {
            entry.start = entry.start.min(row.start);
        }
        entry.add(&row);
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_rows_are_bounded_and_grouping_sums() {
        let pending = Pending::default();
        for i in 0..MAX_PENDING + 5 {
            pending.record("t", &format!("s{i}"), |r| r.cells += 1);
        }
        let rows = pending.take();
        assert_eq!(rows.len(), MAX_PENDING + 1);
        let overflow = rows
            .iter()
            .find(|r| r.session == OVERFLOW_SESSION)
            .expect("an overflow row");
        assert_eq!(overflow.cells, 5);
        let by_day = group(rows, GroupBy::Day);
        assert_eq!(by_day.len(), 1);
        assert_eq!(by_day[0].cells, (MAX_PENDING + 5) as u64);
        assert!(pending.take().is_empty());
    }

    #[test]
    fn grouping_by_hour_sums_sessions_within_each_tenant_and_hour() {
        let row = |tenant: &str, session: &str, start: u64, cells: u64| UsageRow {
            tenant: tenant.into(),
            session: session.into(),
            start,
            cells,
            ..UsageRow::default()
        };
        let rows = vec![
            row("a", "s1", 7 * HOUR, 1),
            row("a", "s2", 7 * HOUR, 2),
            row("a", "s1", 8 * HOUR, 4),
            row("b", "s1", 7 * HOUR, 8),
        ];
        let by_hour = group(rows, GroupBy::Hour);
        let got: Vec<(&str, &str, u64, u64)> = by_hour
            .iter()
            .map(|r| (r.tenant.as_str(), r.session.as_str(), r.start, r.cells))
            .collect();
        assert_eq!(
            got,
            vec![
                ("a", "", 7 * HOUR, 3),
                ("a", "", 8 * HOUR, 4),
                ("b", "", 7 * HOUR, 8)
            ]
        );
    }
}
