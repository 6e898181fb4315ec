//! The catalog in one redb file.

use std::path::{Path, PathBuf};

use redb::{ReadableTable, ReadableTableMetadata, TableDefinition};

use super::{apply_changes, Catalog, CatalogError, Change, Entry, Row, Rows, FILE_NAME};
use crate::usage::UsageRow;

/// Key hash -> JSON [`Row`].
const ENTRIES: TableDefinition<&str, &[u8]> = TableDefinition::new("entries");
/// Change sequence -> key hash, for least-recently-changed order.
const ORDER: TableDefinition<u64, &str> = TableDefinition::new("order");
/// (tenant, change sequence) -> key hash, for each tenant's least-recently-changed order.
pub(super) const BY_TENANT: TableDefinition<(&str, u64), &str> = TableDefinition::new("by_tenant");
/// Tenant -> how many rows it has.
pub(super) const TENANT_ROWS: TableDefinition<&str, u64> = TableDefinition::new("tenant_rows");

/// (hour, tenant, session) -> JSON [`UsageRow`]: the usage ledger (`docs/usage.md`), by hour
/// first so pruning and reports read a range.
const USAGE: TableDefinition<(u64, &str, &str), &[u8]> = TableDefinition::new("usage");

/// The first bytes of every redb file.
pub(super) const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];

/// The catalog in one redb file (`catalog.redb` in the state directory). redb holds an
/// exclusive lock on the file while it is open, so a second server on the same state
/// directory is refused ([`CatalogError::Locked`]); every commit is durable before it returns.
pub struct RedbCatalog {
    path: PathBuf,
    db: redb::Database,
}

impl std::fmt::Debug for RedbCatalog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedbCatalog")
            .field("path", &self.path)
            .finish()
    }
}

impl RedbCatalog {
    /// Opens (creating the directory, mode 0700, and the file as needed) the catalog in
    /// `state_dir`. Blocking.
    pub fn open(state_dir: &Path) -> Result<RedbCatalog, CatalogError> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(state_dir)
            .map_err(|source| CatalogError::Dir {
                path: state_dir.to_path_buf(),
                source,
            })?;
        let path = state_dir.join(FILE_NAME);
        check_magic(&path)?;
        // redb asserts on some malformed headers: a damaged file must be an error, not a
        // panic reaching the caller.
        let opened = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            redb::Database::create(&path)
        }));
        let db = match opened {
            Ok(Ok(db)) => db,
            Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
                return Err(CatalogError::Locked { path })
            }
            Ok(Err(redb::DatabaseError::Storage(redb::StorageError::Corrupted(reason)))) => {
                return Err(CatalogError::Corrupt { path, reason })
            }
            Ok(Err(e)) => {
                return Err(CatalogError::Storage {
                    path,
                    operation: "opening",
                    reason: e.to_string(),
                })
            }
            Err(_) => {
                return Err(CatalogError::Corrupt {
                    path,
                    reason: "the file could not be read as a catalog".into(),
                })
            }
        };
        let catalog = RedbCatalog { path, db };
        // Create the tables once, so readers never meet a missing one.
        catalog.apply(&[])?;
        catalog.add_usage(&[], 0)?;
        catalog.index_tenants()?;
        Ok(catalog)
    }

    /// Builds the per-tenant tables from the rows when they do not cover them all (a catalog
    /// written before they existed).
    fn index_tenants(&self) -> Result<(), CatalogError> {
        let err = self.storage("indexing");
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        let indexed = {
            let entries = txn.open_table(ENTRIES).map_err(|e| err(e.into()))?;
            let by_tenant = txn.open_table(BY_TENANT).map_err(|e| err(e.into()))?;
            by_tenant.len().map_err(|e| err(e.into()))?
                == entries.len().map_err(|e| err(e.into()))?
        };
        if indexed {
            return txn.abort().map_err(|e| err(e.into()));
        }
        txn.delete_table(BY_TENANT).map_err(|e| err(e.into()))?;
        txn.delete_table(TENANT_ROWS).map_err(|e| err(e.into()))?;
        {
            let entries = txn.open_table(ENTRIES).map_err(|e| err(e.into()))?;
            let mut by_tenant = txn.open_table(BY_TENANT).map_err(|e| err(e.into()))?;
            let mut tenant_rows = txn.open_table(TENANT_ROWS).map_err(|e| err(e.into()))?;
            let mut counts: std::collections::BTreeMap<String, u64> = Default::default();
            for item in entries.iter().map_err(|e| err(e.into()))? {
                let (_, bytes) = item.map_err(|e| err(e.into()))?;
                let row: Row =
                    serde_json::from_slice(bytes.value()).map_err(|e| CatalogError::Corrupt {
                        path: self.path.clone(),
                        reason: format!("a row does not decode: {e}"),
                    })?;
                by_tenant
                    .insert(
                        (row.entry.tenant.as_str(), row.seq),
                        row.entry.key_hash.as_str(),
                    )
                    .map_err(|e| err(e.into()))?;
                *counts.entry(row.entry.tenant).or_default() += 1;
            }
            for (tenant, n) in &counts {
                tenant_rows
                    .insert(tenant.as_str(), n)
                    .map_err(|e| err(e.into()))?;
            }
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    /// The catalog file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn storage(&self, operation: &'static str) -> impl Fn(redb::Error) -> CatalogError + '_ {
        move |e| match e {
            redb::Error::Corrupted(reason) => CatalogError::Corrupt {
                path: self.path.clone(),
                reason,
            },
            e => CatalogError::Storage {
                path: self.path.clone(),
                operation,
                reason: e.to_string(),
            },
        }
    }
}

/// A non-empty file that does not start like a redb file is refused before redb sees it.
fn check_magic(path: &Path) -> Result<(), CatalogError> {
    use std::io::Read;
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(CatalogError::Storage {
                path: path.to_path_buf(),
                operation: "opening",
                reason: e.to_string(),
            })
        }
    };
    let mut head = Vec::with_capacity(REDB_MAGIC.len());
    (&mut file)
        .take(REDB_MAGIC.len() as u64)
        .read_to_end(&mut head)
        .map_err(|e| CatalogError::Storage {
            path: path.to_path_buf(),
            operation: "reading",
            reason: e.to_string(),
        })?;
    if !head.is_empty() && head != REDB_MAGIC {
        return Err(CatalogError::Corrupt {
            path: path.to_path_buf(),
            reason: "not a catalog file".into(),
        });
    }
    Ok(())
}

struct RedbRows<'t> {
    catalog: &'t RedbCatalog,
    entries: redb::Table<'t, &'static str, &'static [u8]>,
    order: redb::Table<'t, u64, &'static str>,
    by_tenant: redb::Table<'t, (&'static str, u64), &'static str>,
    tenant_rows: redb::Table<'t, &'static str, u64>,
}

impl RedbRows<'_> {
    fn err(&self, operation: &'static str) -> impl Fn(redb::StorageError) -> CatalogError + '_ {
        let storage = self.catalog.storage(operation);
        move |e| storage(e.into())
    }

    fn decode(&self, bytes: &[u8]) -> Result<Row, CatalogError> {
        serde_json::from_slice(bytes).map_err(|e| CatalogError::Corrupt {
            path: self.catalog.path.clone(),
            reason: format!("a row does not decode: {e}"),
        })
    }

    /// Adds `row` to the orderings and its tenant's count.
    fn index(&mut self, row: &Row) -> Result<(), CatalogError> {
        let err = self.catalog.storage("writing");
        let tenant = row.entry.tenant.as_str();
        self.order
            .insert(row.seq, row.entry.key_hash.as_str())
            .map_err(|e| err(e.into()))?;
        self.by_tenant
            .insert((tenant, row.seq), row.entry.key_hash.as_str())
            .map_err(|e| err(e.into()))?;
        let held = self.tenant_len(tenant)? as u64;
        self.tenant_rows
            .insert(tenant, held + 1)
            .map_err(|e| err(e.into()))?;
        Ok(())
    }

    /// Takes `row` out of the orderings and its tenant's count.
    fn unindex(&mut self, row: &Row) -> Result<(), CatalogError> {
        let err = self.catalog.storage("removing");
        let tenant = row.entry.tenant.as_str();
        self.order.remove(row.seq).map_err(|e| err(e.into()))?;
        let was_indexed = self
            .by_tenant
            .remove((tenant, row.seq))
            .map_err(|e| err(e.into()))?
            .is_some();
        if was_indexed {
            match self.tenant_len(tenant)? as u64 {
                0 | 1 => {
                    self.tenant_rows.remove(tenant).map_err(|e| err(e.into()))?;
                }
                held => {
                    self.tenant_rows
                        .insert(tenant, held - 1)
                        .map_err(|e| err(e.into()))?;
                }
            }
        }
        Ok(())
    }
}

impl Rows for RedbRows<'_> {
    fn get(&mut self, key_hash: &str) -> Result<Option<Row>, CatalogError> {
        let found = self.entries.get(key_hash).map_err(self.err("reading"))?;
        found.map(|v| self.decode(v.value())).transpose()
    }

    fn put(&mut self, old: Option<&Row>, row: &Row) -> Result<(), CatalogError> {
        let bytes = serde_json::to_vec(row).map_err(|e| CatalogError::Storage {
            path: self.catalog.path.clone(),
            operation: "encoding",
            reason: e.to_string(),
        })?;
        if let Some(old) = old {
            self.unindex(old)?;
        }
        self.index(row)?;
        let err = self.catalog.storage("writing");
        self.entries
            .insert(row.entry.key_hash.as_str(), bytes.as_slice())
            .map_err(|e| err(e.into()))?;
        Ok(())
    }

    fn remove(&mut self, row: &Row) -> Result<(), CatalogError> {
        self.unindex(row)?;
        let err = self.catalog.storage("removing");
        self.entries
            .remove(row.entry.key_hash.as_str())
            .map_err(|e| err(e.into()))?;
        Ok(())
    }

    fn len(&mut self) -> Result<usize, CatalogError> {
        let n = self.entries.len().map_err(self.err("counting"))?;
        Ok(usize::try_from(n).unwrap_or(usize::MAX))
    }

    fn next_seq(&mut self) -> Result<u64, CatalogError> {
        let last = self.order.last().map_err(self.err("reading"))?;
        Ok(last.map_or(0, |(k, _)| k.value() + 1))
    }

    fn oldest(&mut self, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        read_rows(self.catalog, &self.order, &self.entries, limit)
    }

    fn oldest_of(&mut self, tenant: &str, limit: Option<usize>) -> Result<Vec<Row>, CatalogError> {
        let err = self.catalog.storage("reading");
        let mut rows = Vec::new();
        let own = self
            .by_tenant
            .range((tenant, 0)..=(tenant, u64::MAX))
            .map_err(|e| err(e.into()))?;
        for item in own.take(limit.unwrap_or(usize::MAX)) {
            let (_, hash) = item.map_err(|e| err(e.into()))?;
            if let Some(bytes) = self.entries.get(hash.value()).map_err(|e| err(e.into()))? {
                rows.push(self.decode(bytes.value())?);
            }
        }
        Ok(rows)
    }

    fn tenant_len(&mut self, tenant: &str) -> Result<usize, CatalogError> {
        let held = self
            .tenant_rows
            .get(tenant)
            .map_err(self.err("reading"))?
            .map_or(0, |v| v.value());
        Ok(usize::try_from(held).unwrap_or(usize::MAX))
    }

    fn tenant_counts(&mut self) -> Result<Vec<(String, usize)>, CatalogError> {
        let err = self.catalog.storage("reading");
        let mut counts = Vec::new();
        for item in self.tenant_rows.iter().map_err(|e| err(e.into()))? {
            let (tenant, held) = item.map_err(|e| err(e.into()))?;
            counts.push((
                tenant.value().to_string(),
                usize::try_from(held.value()).unwrap_or(usize::MAX),
            ));
        }
        Ok(counts)
    }
}

fn read_rows(
    catalog: &RedbCatalog,
    order: &impl ReadableTable<u64, &'static str>,
    entries: &impl ReadableTable<&'static str, &'static [u8]>,
    limit: Option<usize>,
) -> Result<Vec<Row>, CatalogError> {
    let err = catalog.storage("reading");
    let mut rows = Vec::new();
    let ordered = order.iter().map_err(|e| err(e.into()))?;
    for item in ordered.take(limit.unwrap_or(usize::MAX)) {
        let (_, hash) = item.map_err(|e| err(e.into()))?;
        if let Some(bytes) = entries.get(hash.value()).map_err(|e| err(e.into()))? {
            let row: Row =
                serde_json::from_slice(bytes.value()).map_err(|e| CatalogError::Corrupt {
                    path: catalog.path.clone(),
                    reason: format!("a row does not decode: {e}"),
                })?;
            rows.push(row);
        }
    }
    Ok(rows)
}

impl Catalog for RedbCatalog {
    fn load(&self) -> Result<Vec<Entry>, CatalogError> {
        let err = self.storage("reading");
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let order = txn.open_table(ORDER).map_err(|e| err(e.into()))?;
        let entries = txn.open_table(ENTRIES).map_err(|e| err(e.into()))?;
        Ok(read_rows(self, &order, &entries, None)?
            .into_iter()
            .map(|r| r.entry)
            .collect())
    }

    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError> {
        let err = self.storage("writing");
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut rows = RedbRows {
                catalog: self,
                entries: txn.open_table(ENTRIES).map_err(|e| err(e.into()))?,
                order: txn.open_table(ORDER).map_err(|e| err(e.into()))?,
                by_tenant: txn.open_table(BY_TENANT).map_err(|e| err(e.into()))?,
                tenant_rows: txn.open_table(TENANT_ROWS).map_err(|e| err(e.into()))?,
            };
            // An error drops the transaction uncommitted: all or nothing.
            apply_changes(&mut rows, changes)?;
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    fn add_usage(&self, rows: &[UsageRow], keep_from: u64) -> Result<(), CatalogError> {
        let err = self.storage("writing usage");
        let txn = self.db.begin_write().map_err(|e| err(e.into()))?;
        {
            let mut table = txn.open_table(USAGE).map_err(|e| err(e.into()))?;
            for row in rows {
                let key = (row.start, row.tenant.as_str(), row.session.as_str());
                let mut sum = match table.get(key).map_err(|e| err(e.into()))? {
                    Some(bytes) => self.decode_usage(bytes.value())?,
                    None => UsageRow {
                        tenant: row.tenant.clone(),
                        session: row.session.clone(),
                        start: row.start,
                        ..UsageRow::default()
                    },
                };
                sum.add(row);
                let bytes = serde_json::to_vec(&sum).map_err(|e| CatalogError::Storage {
                    path: self.path.clone(),
                    operation: "encoding usage",
                    reason: e.to_string(),
                })?;
                table
                    .insert(key, bytes.as_slice())
                    .map_err(|e| err(e.into()))?;
            }
            // Hours before `keep_from` go: the range's keys first, then each one.
            let old: Vec<(u64, String, String)> = table
                .range(..(keep_from, "", ""))
                .map_err(|e| err(e.into()))?
                .map(|item| {
                    item.map(|(k, _)| {
                        let (hour, tenant, session) = k.value();
                        (hour, tenant.to_string(), session.to_string())
                    })
                })
                .collect::<Result<_, _>>()
                .map_err(|e| err(e.into()))?;
            for (hour, tenant, session) in &old {
                table
                    .remove((*hour, tenant.as_str(), session.as_str()))
                    .map_err(|e| err(e.into()))?;
            }
        }
        txn.commit().map_err(|e| err(e.into()))
    }

    fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
    ) -> Result<Vec<UsageRow>, CatalogError> {
        let err = self.storage("reading usage");
        let txn = self.db.begin_read().map_err(|e| err(e.into()))?;
        let table = txn.open_table(USAGE).map_err(|e| err(e.into()))?;
        let mut rows = Vec::new();
        for item in table
            .range((from, "", "")..(to, "", ""))
            .map_err(|e| err(e.into()))?
        {
            let (key, bytes) = item.map_err(|e| err(e.into()))?;
            if tenant.is_some_and(|want| want != key.value().1) {
                continue;
            }
            rows.push(self.decode_usage(bytes.value())?);
        }
        Ok(rows)
    }
}

impl RedbCatalog {
    fn decode_usage(&self, bytes: &[u8]) -> Result<UsageRow, CatalogError> {
        serde_json::from_slice(bytes).map_err(|e| CatalogError::Corrupt {
            path: self.path.clone(),
            reason: format!("a usage row does not decode: {e}"),
        })
    }
}
