//! [`PostgresCatalog`]: the existing [`Catalog`] trait over the cluster's `kb_kernels` and
//! `kb_sessions` tables (docs/cluster.md, "Catalog schema"), written only for this node at
//! its current epoch.
//!
//! The catalog's rules (`src/catalog/mod.rs`) hold row by row: generations only grow, a start
//! overwrites a loss, an end never overwrites a loss, a tenant's non-live rows past
//! [`MAX_ENTRIES_PER_TENANT`] go oldest first. Fencing: every batch first checks, in its own
//! transaction and holding the node's row (`FOR SHARE`, so an expiry waits or skips it), that
//! the node's current live epoch is the one this catalog writes for; if not, nothing changes
//! and the batch is refused with [`CatalogError::Fenced`]. A loss or an end touches a row only
//! when it is this node's at this epoch (another node may hold the key since); a start always
//! writes (the node started the kernel, after claiming its session).

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::SystemTime;

use tokio::runtime::Handle;

use super::error::{db, ClusterError};
use super::store::{Store, SESSION_ENDS};
use crate::catalog::{Catalog, CatalogError, Change, Entry, MAX_ENTRIES_PER_TENANT};
use crate::cell::StateLost;
use crate::owner::root_session;
use crate::usage::UsageRow;

/// The [`Catalog`] of a cluster node (see the module documentation). Called from the catalog
/// writer's own thread, never a runtime worker: each call blocks on the runtime it was built
/// with.
#[derive(Debug, Clone)]
pub struct PostgresCatalog {
    store: Store,
    node: String,
    epoch: Arc<AtomicI64>,
    handle: Handle,
    tenant_bound: usize,
}

/// Why a batch failed, before it is told as a [`CatalogError`].
enum Refusal {
    Fenced(i64),
    Store(ClusterError),
}

impl From<ClusterError> for Refusal {
    fn from(e: ClusterError) -> Self {
        Refusal::Store(e)
    }
}

/// When a loss happened, from its RFC 3339 text (`None`: the database's now).
fn lost_at(loss: &StateLost) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(&loss.at).ok()
}

impl PostgresCatalog {
    /// A catalog writing for `node` at the epoch `epoch` holds when each batch runs (the
    /// node's lease loop stores a new one when it registers again); `handle` is the runtime
    /// the store's connections run on.
    pub fn new(store: Store, node: String, epoch: Arc<AtomicI64>, handle: Handle) -> Self {
        PostgresCatalog {
            store,
            node,
            epoch,
            handle,
            tenant_bound: MAX_ENTRIES_PER_TENANT,
        }
    }

    /// The same catalog with another per-tenant bound on rows (default
    /// [`MAX_ENTRIES_PER_TENANT`]); tests use a small one.
    pub fn with_tenant_bound(mut self, bound: usize) -> Self {
        self.tenant_bound = bound;
        self
    }

    async fn apply_async(&self, changes: &[Change], epoch: i64) -> Result<(), Refusal> {
        let op = "catalog write";
        let node = self.node.as_str();
        let mut client = self.store.client(op).await?;
        let tx = client.transaction().await.map_err(db(op))?;
        let current = tx
            .query_opt(
                "SELECT 1 FROM kb_nodes WHERE name = $1 AND epoch = $2 AND state = 'live'
                 FOR SHARE",
                &[&node, &epoch],
            )
            .await
            .map_err(db(op))?;
        if current.is_none() {
            return Err(Refusal::Fenced(epoch));
        }
        let mut touched = std::collections::BTreeSet::new();
        let writer = Writer {
            tx: &tx,
            node,
            epoch,
        };
        for change in changes {
            touched.extend(writer.change(change).await?);
        }
        // Each tenant that gained rows keeps at most its bound: its own oldest non-live go.
        let bound = i64::try_from(self.tenant_bound).unwrap_or(i64::MAX);
        for tenant in touched {
            tx.execute(
                "DELETE FROM kb_kernels WHERE key_hash IN (
                     SELECT key_hash FROM kb_kernels
                     WHERE tenant = $1 AND state <> 'live'
                     ORDER BY changed_at, key_hash
                     LIMIT greatest((SELECT count(*) FROM kb_kernels WHERE tenant = $1) - $2,
                         0))",
                &[&tenant, &bound],
            )
            .await
            .map_err(db(op))?;
        }
        tx.commit().await.map_err(db(op))?;
        Ok(())
    }
}

/// One catalog write's transaction, as `node` at `epoch`.
struct Writer<'a, 't> {
    tx: &'a tokio_postgres::Transaction<'t>,
    node: &'a str,
    epoch: i64,
}

const OP: &str = "catalog write";

impl Writer<'_, '_> {
    /// Writes one change; the tenant that gained a row, if any (its bound is kept after).
    async fn change<'c>(&self, change: &'c Change) -> Result<Option<&'c str>, ClusterError> {
        match change {
            Change::Started {
                key_hash,
                tenant,
                owner,
                generation,
            } => {
                self.started(key_hash, tenant, owner, *generation).await?;
                Ok(Some(tenant))
            }
            Change::Lost {
                key_hash,
                tenant,
                owner,
                generation,
                loss,
            } => {
                self.lost(key_hash, tenant, owner, *generation, loss)
                    .await?;
                Ok(Some(tenant))
            }
            Change::Ended { key_hash } => self.ended(key_hash).await.map(|()| None),
            Change::AllLiveLost { loss } => self.all_live_lost(loss).await.map(|()| None),
        }
    }

    /// A kernel live here; a root session's row live here too, unless another node holds
    /// it live.
    async fn started(
        &self,
        key_hash: &str,
        tenant: &str,
        owner: &str,
        generation: u64,
    ) -> Result<(), ClusterError> {
        let (node, epoch) = (self.node, self.epoch);
        let session = root_session(owner);
        let generation = i64::try_from(generation).unwrap_or(i64::MAX);
        self.tx
            .execute(
                "INSERT INTO kb_kernels (key_hash, tenant, owner, session, node, epoch,
                     generation, state, reason, lost_at, changed_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'live', NULL, NULL,
                     clock_timestamp())
                 ON CONFLICT (key_hash) DO UPDATE SET tenant = EXCLUDED.tenant,
                     owner = EXCLUDED.owner, session = EXCLUDED.session,
                     node = EXCLUDED.node, epoch = EXCLUDED.epoch,
                     generation = greatest(kb_kernels.generation, EXCLUDED.generation),
                     state = 'live', reason = NULL, lost_at = NULL,
                     changed_at = EXCLUDED.changed_at",
                &[
                    &key_hash,
                    &tenant,
                    &owner,
                    &session,
                    &node,
                    &epoch,
                    &generation,
                ],
            )
            .await
            .map_err(db(OP))?;
        if session == owner {
            self.tx
                .execute(
                    "INSERT INTO kb_sessions (tenant, session, node, epoch, live,
                         claimed_at)
                     VALUES ($1, $2, $3, $4, true, now())
                     ON CONFLICT (tenant, session) DO UPDATE SET node = EXCLUDED.node,
                         epoch = EXCLUDED.epoch, live = true,
                         claimed_at = CASE WHEN kb_sessions.node = EXCLUDED.node
                             AND kb_sessions.epoch = EXCLUDED.epoch
                             THEN kb_sessions.claimed_at ELSE now() END
                     WHERE NOT kb_sessions.live
                        OR (kb_sessions.node = EXCLUDED.node
                            AND kb_sessions.epoch = EXCLUDED.epoch)",
                    &[&tenant, &session, &node, &epoch],
                )
                .await
                .map_err(db(OP))?;
        }
        Ok(())
    }

    /// A kernel of this node lost (a row of another node's is left as it is), and its
    /// session's row no longer live here when it has no live kernel left.
    async fn lost(
        &self,
        key_hash: &str,
        tenant: &str,
        owner: &str,
        generation: u64,
        loss: &StateLost,
    ) -> Result<(), ClusterError> {
        let (node, epoch) = (self.node, self.epoch);
        let session = root_session(owner);
        let generation = i64::try_from(generation).unwrap_or(i64::MAX);
        self.tx
            .execute(
                "INSERT INTO kb_kernels (key_hash, tenant, owner, session, node, epoch,
                     generation, state, reason, lost_at, changed_at)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, 'lost', $8, coalesce($9, now()),
                     clock_timestamp())
                 ON CONFLICT (key_hash) DO UPDATE SET
                     generation = greatest(kb_kernels.generation, EXCLUDED.generation),
                     state = 'lost', reason = EXCLUDED.reason,
                     lost_at = EXCLUDED.lost_at, changed_at = EXCLUDED.changed_at
                 WHERE kb_kernels.node = EXCLUDED.node
                   AND kb_kernels.epoch = EXCLUDED.epoch",
                &[
                    &key_hash,
                    &tenant,
                    &owner,
                    &session,
                    &node,
                    &epoch,
                    &generation,
                    &loss.reason.as_str(),
                    &lost_at(loss),
                ],
            )
            .await
            .map_err(db(OP))?;
        self.tx
            .execute(SESSION_ENDS, &[&tenant, &session, &node, &epoch])
            .await
            .map_err(db(OP))?;
        Ok(())
    }

    /// A kernel live here ended, and its session's row no longer live here when it has no
    /// live kernel left.
    async fn ended(&self, key_hash: &str) -> Result<(), ClusterError> {
        let (node, epoch) = (self.node, self.epoch);
        let ended = self
            .tx
            .query_opt(
                "UPDATE kb_kernels SET state = 'ended',
                     changed_at = clock_timestamp()
                 WHERE key_hash = $1 AND state = 'live' AND node = $2
                   AND epoch = $3
                 RETURNING tenant, owner, session",
                &[&key_hash, &node, &epoch],
            )
            .await
            .map_err(db(OP))?;
        if let Some(row) = ended {
            let tenant: String = row.try_get(0).map_err(db(OP))?;
            let session: String = row.try_get(2).map_err(db(OP))?;
            self.tx
                .execute(SESSION_ENDS, &[&tenant, &session, &node, &epoch])
                .await
                .map_err(db(OP))?;
        }
        Ok(())
    }

    /// Every kernel live here lost, and no session live here.
    async fn all_live_lost(&self, loss: &StateLost) -> Result<(), ClusterError> {
        let (node, epoch) = (self.node, self.epoch);
        self.tx
            .execute(
                "UPDATE kb_kernels SET state = 'lost', reason = $3,
                     lost_at = coalesce($4, now()), changed_at = clock_timestamp()
                 WHERE node = $1 AND epoch = $2 AND state = 'live'",
                &[&node, &epoch, &loss.reason.as_str(), &lost_at(loss)],
            )
            .await
            .map_err(db(OP))?;
        self.tx
            .execute(
                "UPDATE kb_sessions SET live = false
                 WHERE node = $1 AND epoch = $2 AND live",
                &[&node, &epoch],
            )
            .await
            .map_err(db(OP))?;
        Ok(())
    }
}

impl Catalog for PostgresCatalog {
    /// Nothing: a cluster node seeds its registry per session, from [`Store::claim`].
    fn load(&self) -> Result<Vec<Entry>, CatalogError> {
        Ok(vec![])
    }

    fn apply(&self, changes: &[Change]) -> Result<(), CatalogError> {
        if changes.is_empty() {
            return Ok(());
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let deadline = super::store::OPERATION_DEADLINE;
        let done = self.handle.block_on(async {
            tokio::time::timeout(deadline, self.apply_async(changes, epoch))
                .await
                .unwrap_or(Err(Refusal::Store(ClusterError::Timeout {
                    operation: "catalog write",
                    deadline,
                })))
        });
        match done {
            Ok(()) => Ok(()),
            Err(Refusal::Fenced(epoch)) => Err(CatalogError::Fenced {
                node: self.node.clone(),
                epoch,
            }),
            Err(Refusal::Store(e)) => Err(CatalogError::Shared {
                reason: e.to_string(),
            }),
        }
    }

    fn add_usage(&self, rows: &[UsageRow], keep_from: u64) -> Result<(), CatalogError> {
        let deadline = super::store::OPERATION_DEADLINE;
        self.handle
            .block_on(async {
                tokio::time::timeout(deadline, self.add_usage_async(rows, keep_from))
                    .await
                    .unwrap_or(Err(ClusterError::Timeout {
                        operation: "usage write",
                        deadline,
                    }))
            })
            .map_err(|e| CatalogError::Shared {
                reason: e.to_string(),
            })
    }

    fn usage(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
    ) -> Result<Vec<UsageRow>, CatalogError> {
        let deadline = super::store::OPERATION_DEADLINE;
        self.handle
            .block_on(async {
                tokio::time::timeout(deadline, self.usage_async(tenant, from, to))
                    .await
                    .unwrap_or(Err(ClusterError::Timeout {
                        operation: "usage read",
                        deadline,
                    }))
            })
            .map_err(|e| CatalogError::Shared {
                reason: e.to_string(),
            })
    }
}

/// A count as PostgreSQL's bigint (saturating).
fn big(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A bigint read back as a count (negative: 0).
fn count(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

impl PostgresCatalog {
    /// The ledger's rows summed into `kb_usage` by every node, old hours pruned, in one
    /// transaction (usage is the tenant's whichever node served it: not fenced by epoch).
    async fn add_usage_async(&self, rows: &[UsageRow], keep_from: u64) -> Result<(), ClusterError> {
        let op = "usage write";
        let mut client = self.store.client(op).await?;
        let tx = client.transaction().await.map_err(db(op))?;
        for r in rows {
            tx.execute(
                "INSERT INTO kb_usage (hour, tenant, session, kernel_seconds, cpu_seconds,
                     peak_memory_bytes, cells, cell_seconds, commands, file_bytes_in,
                     file_bytes_out, pool_hits, network_bytes_in, network_bytes_out)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
                 ON CONFLICT (hour, tenant, session) DO UPDATE SET
                     kernel_seconds = kb_usage.kernel_seconds + EXCLUDED.kernel_seconds,
                     cpu_seconds = kb_usage.cpu_seconds + EXCLUDED.cpu_seconds,
                     peak_memory_bytes = GREATEST(kb_usage.peak_memory_bytes,
                         EXCLUDED.peak_memory_bytes),
                     cells = kb_usage.cells + EXCLUDED.cells,
                     cell_seconds = kb_usage.cell_seconds + EXCLUDED.cell_seconds,
                     commands = kb_usage.commands + EXCLUDED.commands,
                     file_bytes_in = kb_usage.file_bytes_in + EXCLUDED.file_bytes_in,
                     file_bytes_out = kb_usage.file_bytes_out + EXCLUDED.file_bytes_out,
                     pool_hits = kb_usage.pool_hits + EXCLUDED.pool_hits,
                     network_bytes_in = kb_usage.network_bytes_in + EXCLUDED.network_bytes_in,
                     network_bytes_out = kb_usage.network_bytes_out + EXCLUDED.network_bytes_out",
                &[
                    &big(r.start),
                    &r.tenant,
                    &r.session,
                    &r.kernel_seconds,
                    &r.cpu_seconds,
                    &big(r.peak_memory_bytes),
                    &big(r.cells),
                    &r.cell_seconds,
                    &big(r.commands),
                    &big(r.file_bytes_in),
                    &big(r.file_bytes_out),
                    &big(r.pool_hits),
                    &big(r.network_bytes_in),
                    &big(r.network_bytes_out),
                ],
            )
            .await
            .map_err(db(op))?;
        }
        tx.execute("DELETE FROM kb_usage WHERE hour < $1", &[&big(keep_from)])
            .await
            .map_err(db(op))?;
        tx.commit().await.map_err(db(op))
    }

    async fn usage_async(
        &self,
        tenant: Option<&str>,
        from: u64,
        to: u64,
    ) -> Result<Vec<UsageRow>, ClusterError> {
        let op = "usage read";
        let client = self.store.client(op).await?;
        let rows = client
            .query(
                "SELECT hour, tenant, session, kernel_seconds, cpu_seconds, peak_memory_bytes,
                     cells, cell_seconds, commands, file_bytes_in, file_bytes_out, pool_hits,
                     network_bytes_in, network_bytes_out
                 FROM kb_usage WHERE hour >= $1 AND hour < $2
                     AND ($3::text IS NULL OR tenant = $3)
                 ORDER BY hour, tenant, session",
                &[&big(from), &big(to), &tenant],
            )
            .await
            .map_err(db(op))?;
        Ok(rows
            .iter()
            .map(|r| UsageRow {
                start: count(r.get(0)),
                tenant: r.get(1),
                session: r.get(2),
                kernel_seconds: r.get(3),
                cpu_seconds: r.get(4),
                peak_memory_bytes: count(r.get(5)),
                cells: count(r.get(6)),
                cell_seconds: r.get(7),
                commands: count(r.get(8)),
                file_bytes_in: count(r.get(9)),
                file_bytes_out: count(r.get(10)),
                pool_hits: count(r.get(11)),
                network_bytes_in: count(r.get(12)),
                network_bytes_out: count(r.get(13)),
            })
            .collect())
    }
}
