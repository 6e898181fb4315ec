//! The catalog in memory.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::{apply_changes, Catalog, CatalogError, Change, Entry, Row, Rows};
use crate::usage::UsageRow;

/// The catalog in memory: for tests, and for library users who want the semantics without a
/// file.
#[derive(Debug, Default)]
pub struct MemoryCatalog {
    inner: Mutex<MemoryRows>,
    /// The usage ledger by (tenant, hour, session).
    usage: Mutex<BTreeMap<(String, u64, String), UsageRow>>,
}

#[derive(Debug, Default, Clone)]
struct MemoryRows {
    rows: HashMap<String, Row>,
    order: BTreeMap<u64, String>,
    /// Each tenant's rows: change sequence -> key hash.
    by_tenant: HashMap<String, BTreeMap<u64, String>>,
}

impl MemoryRows {
    fn unindex(&mut self, row: &Row) {
        self.order.remove(&row.seq);
        if let Some(own) = self.by_tenant.get_mut(&row.entry.tenant) {
            own.remove(&row.seq);
            if own.is_empty() {
                self.by_tenant.remove(&row.entry.tenant);
            }
        }
    }
}

impl Rows for MemoryRows {
    fn get(&mut self, key_hash: &str) -> Result<Option<Row>, CatalogError> {
        Ok(self.rows.get(key_hash).cloned())
    }
    fn put(&mut self, old: Option<&Row>, row: &Row) -> Result<(), CatalogError> {
        if let Some(old) = old {
            self.unindex(old);
        }
        self.order.insert(row.seq, row.entry.key_hash.clone());
        self.by_tenant
            .entry(row.entry.tenant.clone())
            .or_default()
            .insert(row.seq, row.entry.key_hash.clone());
        self.rows.insert(row.entry.key_hash.clone(), row.clone());
        Ok(())
    }
    fn remove(&mut self, row: &Row) -> Result<(), CatalogError> {
        self.unindex(row);
        self.rows.remove(&row.entry.key_hash);
        Ok(())
    }
    fn len(&mut self) -> Result<usize, CatalogError> {
        Ok(self.rows.len())
    }
    fn next_seq(&mut self) -> Result<u64, CatalogError> {
        Ok(self.order.keys().next_back().map_or(0, |s| s + 1))
    }
    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        Ok(self
            .order
            .values()
            .take(limit.unwrap_or(usize::MAX))
            .filter_map(|h| self.rows.get(h).cloned())
            .collect())
    }
    fn oldest_of(&mut self, tenant: &str, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        Ok(self
            .by_tenant
            .get(tenant)
            .into_iter()
            .flat_map(|own| own.values())
            .take(limit.unwrap_or(usize::MAX))
            .filter_map(|h| self.rows.get(h).cloned())
            .collect())
    }
    fn tenant_len(&mut self, tenant: &str) -> Result<usize, CatalogError> {
        Ok(self.by_tenant.get(tenant).map_or(0, BTreeMap::len))
    }
    fn tenant_counts(&mut self) -> Result<Vec<(String, usize)>, CatalogError> {
        Ok(self
            .by_tenant
            .iter()
            .map(|(tenant, own)| (tenant.clone(), own.len()))
            .collect())
    }
}

impl Catalog for MemoryCatalog {
    fn load(&self) -> Result<Vec<Entry>, CatalogError> {
        let mut rows = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        Ok(rows.oldest(None)?.into_iter().map(|r| r.entry).collect())
    }

    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError> {
        let mut rows = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        // All or nothing, as a transaction.
        let mut copy = rows.clone();
        apply_changes(&mut copy, changes)?;
        *rows = copy;
        Ok(())
    }

    fn add_usage(&self, rows: &[UsageRow], keep_from: u64) -> Result<(), CatalogError> {
        let mut usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        for row in rows {
            usage
                .entry((row.tenant.clone(), row.start, row.session.clone()))
                .or_insert_with(|| UsageRow {
                    tenant: row.tenant.clone(),
                    session: row.session.clone(),
                    start: row.start,
                    ..UsageRow::default()
                })
                .add(row);
        }
        usage.retain(|(_, hour, _), _| *hour >= keep_from);
        Ok(())
    }

    fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
    ) -> Result<Vec<UsageRow>, CatalogError> {
        let usage = self.usage.lock().unwrap_or_else(|p| p.into_inner());
        Ok(usage
            .iter()
            .filter(|((t, hour, _), _)| {
                tenant.is_none_or(|want| want == t) && (from..to).contains(hour)
            })
            .map(|(_, row)| row.clone())
            .collect())
    }
}
