//! Which node holds each workspace, at which generation (docs/workspaces.md, "In a
//! cluster"): `kb_workspaces`, one row per workspace. A node opening a workspace asks here
//! whether its image is the workspace's current generation; a new workspace is counted
//! against its tenant's maximum and recorded in one transaction, under the tenant's lock
//! that claims take too.

use super::super::error::{db, ClusterError};
use super::sessions::{CLAIM_LOCK_TIMEOUT, TENANT_LOCK_CLASS};
use super::{within, Store};
use crate::owner::root_session;
use crate::workspace::{Opening, Placed};

/// A node that holds workspaces, as [`Store::workspace_nodes`] and
/// [`Store::workspace_home`] find it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceHome {
    /// The node that holds the workspaces.
    pub node: String,
    /// Its address (empty when it has no row).
    pub advertise: String,
    /// Its epoch (0 when it has no row).
    pub epoch: i64,
    /// Its row says live.
    pub live: bool,
}

/// A generation as its column.
fn column(generation: u64) -> i64 {
    i64::try_from(generation).unwrap_or(i64::MAX)
}

fn home_from_row(
    op: &'static str,
    row: &tokio_postgres::Row,
) -> Result<WorkspaceHome, ClusterError> {
    Ok(WorkspaceHome {
        node: row.try_get(0).map_err(db(op))?,
        advertise: row.try_get(1).map_err(db(op))?,
        epoch: row.try_get(2).map_err(db(op))?,
        live: row.try_get(3).map_err(db(op))?,
    })
}

impl Store {
    /// Opens `tenant`'s workspace `owner` on `node`, whose image has the generation `local`
    /// (`Some(0)`: unstamped; `None`: none), as [`crate::workspace::Ledger::open`] says: one
    /// transaction under the tenant's lock, so two nodes never both make a tenant's
    /// `max + 1`-th workspace.
    pub async fn open_workspace(
        &self,
        tenant: &str,
        owner: &str,
        node: &str,
        local: Option<u64>,
        create: bool,
        max: usize,
    ) -> Result<Opening, ClusterError> {
        let op = "open a workspace";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            tx.batch_execute(CLAIM_LOCK_TIMEOUT).await.map_err(db(op))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&TENANT_LOCK_CLASS, &tenant],
            )
            .await
            .map_err(db(op))?;
            let row = tx
                .query_opt(
                    "SELECT node, generation FROM kb_workspaces
                     WHERE tenant = $1 AND owner = $2 FOR UPDATE",
                    &[&tenant, &owner],
                )
                .await
                .map_err(db(op))?;
            let row: Option<(String, i64)> = match row {
                Some(r) => Some((r.try_get(0).map_err(db(op))?, r.try_get(1).map_err(db(op))?)),
                None => None,
            };
            let last = row
                .as_ref()
                .map_or(0, |(_, g)| u64::try_from(*g).unwrap_or(0));
            let opening = match (&row, local) {
                (Some((held_by, _)), Some(g)) if held_by == node && g == last => {
                    Opening::Current { generation: last }
                }
                // An image made before generations were kept, of a workspace the ledger does
                // not know: adopted as generation 1.
                (None, Some(0)) => {
                    tx.execute(
                        "INSERT INTO kb_workspaces (tenant, owner, session, node, generation)
                         VALUES ($1, $2, $3, $4, 1)",
                        &[&tenant, &owner, &root_session(owner), &node],
                    )
                    .await
                    .map_err(db(op))?;
                    Opening::Current { generation: 1 }
                }
                _ if !create => Opening::NotFound,
                _ => make_workspace(&tx, tenant, owner, node, last, max).await?,
            };
            tx.commit().await.map_err(db(op))?;
            Ok(opening)
        })
        .await
    }

    /// Forgets `tenant`'s workspace `owner` if `node` holds it (at `generation`, when
    /// given); true when a row went.
    pub async fn forget_workspace(
        &self,
        tenant: &str,
        owner: &str,
        node: &str,
        generation: Option<u64>,
    ) -> Result<bool, ClusterError> {
        let op = "forget a workspace";
        within(op, async {
            let client = self.client(op).await?;
            let n = client
                .execute(
                    "DELETE FROM kb_workspaces WHERE tenant = $1 AND owner = $2 AND node = $3
                       AND ($4::bigint IS NULL OR generation = $4)",
                    &[&tenant, &owner, &node, &generation.map(column)],
                )
                .await
                .map_err(db(op))?;
            Ok(n > 0)
        })
        .await
    }

    /// The workspaces `node` holds (of `tenant` only, when given).
    pub async fn workspaces_on(
        &self,
        node: &str,
        tenant: Option<&str>,
    ) -> Result<Vec<Placed>, ClusterError> {
        let op = "list a node's workspaces";
        within(op, async {
            let client = self.client(op).await?;
            let rows = client
                .query(
                    "SELECT tenant, owner, generation FROM kb_workspaces
                     WHERE node = $1 AND ($2::text IS NULL OR tenant = $2)",
                    &[&node, &tenant],
                )
                .await
                .map_err(db(op))?;
            rows.iter()
                .map(|r| {
                    let generation: i64 = r.try_get(2).map_err(db(op))?;
                    Ok(Placed {
                        tenant: r.try_get(0).map_err(db(op))?,
                        owner: r.try_get(1).map_err(db(op))?,
                        generation: u64::try_from(generation).unwrap_or(0),
                    })
                })
                .collect()
        })
        .await
    }

    /// The node holding `tenant`'s workspace `owner`, if the ledger has it.
    pub async fn workspace_home(
        &self,
        tenant: &str,
        owner: &str,
    ) -> Result<Option<WorkspaceHome>, ClusterError> {
        let op = "find a workspace's node";
        within(op, async {
            let client = self.client(op).await?;
            let row = client
                .query_opt(
                    "SELECT w.node, coalesce(n.advertise, ''), coalesce(n.epoch, 0),
                         coalesce(n.state = 'live', false)
                     FROM kb_workspaces w LEFT JOIN kb_nodes n ON n.name = w.node
                     WHERE w.tenant = $1 AND w.owner = $2",
                    &[&tenant, &owner],
                )
                .await
                .map_err(db(op))?;
            row.as_ref().map(|r| home_from_row(op, r)).transpose()
        })
        .await
    }

    /// The live nodes holding any of `tenant`'s workspaces.
    pub async fn workspace_nodes(&self, tenant: &str) -> Result<Vec<WorkspaceHome>, ClusterError> {
        let op = "find a tenant's workspaces' nodes";
        within(op, async {
            let client = self.client(op).await?;
            let rows = client
                .query(
                    "SELECT DISTINCT w.node, n.advertise, n.epoch, true
                     FROM kb_workspaces w JOIN kb_nodes n ON n.name = w.node
                     WHERE w.tenant = $1 AND n.state = 'live'
                     ORDER BY w.node",
                    &[&tenant],
                )
                .await
                .map_err(db(op))?;
            rows.iter().map(|r| home_from_row(op, r)).collect()
        })
        .await
    }
}

/// A new generation of `tenant`'s workspace `owner` on `node`, inside the opening's
/// transaction: `TooMany` when the tenant holds `max` others on live nodes (a node that is
/// not live holds none that anybody can use until it comes back); else the row points at
/// `node` with the generation after `last`.
async fn make_workspace(
    tx: &tokio_postgres::Transaction<'_>,
    tenant: &str,
    owner: &str,
    node: &str,
    last: u64,
    max: usize,
) -> Result<Opening, ClusterError> {
    let op = "open a workspace";
    let held: i64 = tx
        .query_one(
            "SELECT count(*) FROM kb_workspaces w
             WHERE w.tenant = $1 AND w.owner <> $2
               AND EXISTS (SELECT 1 FROM kb_nodes n
                   WHERE n.name = w.node AND n.state = 'live')",
            &[&tenant, &owner],
        )
        .await
        .map_err(db(op))?
        .try_get(0)
        .map_err(db(op))?;
    if usize::try_from(held).unwrap_or(usize::MAX) >= max {
        return Ok(Opening::TooMany);
    }
    let generation = last.saturating_add(1);
    tx.execute(
        "INSERT INTO kb_workspaces (tenant, owner, session, node, generation)
         VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (tenant, owner) DO UPDATE SET node = EXCLUDED.node,
             generation = EXCLUDED.generation, made_at = now()",
        &[
            &tenant,
            &owner,
            &root_session(owner),
            &node,
            &column(generation),
        ],
    )
    .await
    .map_err(db(op))?;
    Ok(Opening::Fresh { generation })
}
