//! `GET /v1/usage` (`docs/usage.md`, "Reading the ledger"): the query and the answer.

use serde::{Deserialize, Serialize};

use crate::usage::{GroupBy, UsageRow};

/// The longest range a report covers, in seconds (the ledger's retention).
pub const MAX_USAGE_RANGE: u64 = crate::usage::LEDGER_RETENTION_SECONDS;

/// The query string of `GET /v1/usage`, as sent.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UsageQuery {
    /// Start of the range: RFC 3339 (`2026-01-02T03:00:00Z`) or seconds since the epoch;
    /// default a day before `to`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// End of the range (exclusive), as `from`; default now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
    /// `session` (default), `day` or `hour` (one row per tenant and hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_by: Option<GroupBy>,
    /// Only this tenant (a usage admin; others may name only themselves).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A [`UsageQuery`] checked: the range in seconds since the epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageRange {
    /// Start (inclusive).
    pub from: u64,
    /// End (exclusive).
    pub to: u64,
    /// How rows are summed.
    pub group_by: GroupBy,
}

/// A bad `GET /v1/usage` query.
#[derive(Debug, thiserror::Error)]
pub enum UsageQueryError {
    /// A time is neither RFC 3339 nor seconds since the epoch.
    #[error("reading the usage query: `{field}` must be RFC 3339 or seconds since the epoch, not {value:?}")]
    Time {
        /// `from` or `to`.
        field: &'static str,
        /// What was sent (cut to 64 characters).
        value: String,
    },
    /// `from` is not before `to`, or the range is longer than the retention.
    #[error("reading the usage query: the range must be non-empty and at most {MAX_USAGE_RANGE} seconds")]
    Range,
}

fn parse_time(field: &'static str, value: &str) -> Result<u64, UsageQueryError> {
    if let Ok(n) = value.parse::<u64>() {
        return Ok(n);
    }
    humantime::parse_rfc3339_weak(value)
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs())
        .ok_or_else(|| UsageQueryError::Time {
            field,
            value: value.chars().take(64).collect(),
        })
}

impl UsageQuery {
    /// The range asked for, `now` the current time in seconds since the epoch.
    pub fn range(&self, now: u64) -> Result<UsageRange, UsageQueryError> {
        let to = match &self.to {
            Some(t) => parse_time("to", t)?,
            None => now.saturating_add(1),
        };
        let from = match &self.from {
            Some(f) => parse_time("from", f)?,
            None => to.saturating_sub(86_400),
        };
        if from >= to || to - from > MAX_USAGE_RANGE + 86_400 {
            return Err(UsageQueryError::Range);
        }
        Ok(UsageRange {
            from,
            to,
            group_by: self.group_by.unwrap_or_default(),
        })
    }
}

/// The answer of `GET /v1/usage`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct UsageReport {
    /// Start of the range (seconds since the epoch).
    pub from: u64,
    /// End of the range (exclusive).
    pub to: u64,
    /// How rows are summed.
    pub group_by: GroupBy,
    /// The rows, by tenant then start then session.
    pub rows: Vec<UsageRow>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_both_ways_and_bad_ones_are_named() {
        let q = UsageQuery {
            from: Some("2026-01-02T00:00:00Z".into()),
            to: Some("1767322800".into()),
            ..UsageQuery::default()
        };
        let r = q.range(0).expect("a range");
        assert_eq!((r.from, r.to), (1_767_312_000, 1_767_322_800));
        let bad = UsageQuery {
            from: Some("yesterday".into()),
            ..UsageQuery::default()
        };
        assert!(bad
            .range(100_000)
            .unwrap_err()
            .to_string()
            .contains("`from`"));
    }
}
