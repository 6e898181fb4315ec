//! Where sessions live (docs/cluster.md, "Catalog schema"): looking a session up, claiming it
//! for a node (one at a time per tenant, under the tenant's cluster-wide cap), giving a claim
//! back, and counting a tenant's live sessions.

use std::time::SystemTime;

use crate::catalog::{Entry, EntryState};
use crate::cell::{LossReason, StateLost};

use super::super::error::{db, ClusterError};
use super::{to_u32, within, Store};

/// A session held here at this epoch stops being live once none of its kernels (root or
/// delegated children) is live here: while one is, no other node may claim it, so a session
/// never has kernels on two nodes.
pub(crate) const SESSION_ENDS: &str = "UPDATE kb_sessions SET live = false
    WHERE tenant = $1 AND session = $2 AND node = $3 AND epoch = $4 AND live
      AND NOT EXISTS (SELECT 1 FROM kb_kernels k WHERE k.tenant = $1 AND k.session = $2
          AND k.node = $3 AND k.epoch = $4 AND k.state = 'live')";

/// How long a claim waits for its tenant's lock (claims of one tenant go one at a time).
pub(super) const CLAIM_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// The class of the per-tenant advisory lock [`Store::claim`] takes (`kbtn` in ASCII; the
/// tenant's `hashtext` is the second key).
pub(super) const TENANT_LOCK_CLASS: i32 = 0x6b62_746e;

/// Where a session lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node whose kernel serves the session.
    pub node: String,
    /// The node's epoch when the session was placed.
    pub epoch: i64,
    /// The node's address (empty when the node has no row).
    pub advertise: String,
    /// The session's row says live.
    pub live: bool,
    /// That node's row is `live` with this same epoch.
    pub node_current: bool,
}

/// A node's claim on a session, made before it serves the session's first call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The session's tenant.
    pub tenant: String,
    /// The root session's name (never a child's owner).
    pub session: String,
    /// The claiming node.
    pub node: String,
    /// The claiming node's epoch.
    pub epoch: i64,
    /// The tenant's cap on live sessions cluster-wide, if any.
    pub tenant_cap: Option<u32>,
}

/// What a claim found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The session is now (or already was) on `node` at `epoch`: its kernels' rows (root
    /// and children; generation and any owed loss), to seed the node's registry.
    Claimed {
        /// The session's kernels' rows, least recently changed first.
        entries: Vec<Entry>,
    },
    /// Live on another node whose lease is current: forward there.
    Held(Placement),
    /// The tenant has `live` live sessions cluster-wide, at or over `tenant_cap`.
    TenantAtCap {
        /// The tenant's live sessions other than this one.
        live: u32,
    },
    /// The claimant's epoch is not its node's current live epoch (it is fenced).
    Fenced,
}

/// The columns [`entry_from_row`] reads, in order.
pub(crate) const ENTRY_COLUMNS: &str =
    "key_hash, tenant, owner, generation, state, reason, lost_at";

/// A `kb_kernels` row (selected as [`ENTRY_COLUMNS`]) as the catalog's [`Entry`].
pub(crate) fn entry_from_row(
    operation: &'static str,
    row: &tokio_postgres::Row,
) -> Result<Entry, ClusterError> {
    let generation: i64 = row.try_get(3).map_err(db(operation))?;
    let state: String = row.try_get(4).map_err(db(operation))?;
    let state = match state.as_str() {
        "live" => EntryState::Live,
        "ended" => EntryState::Ended,
        "lost" => {
            let reason: Option<String> = row.try_get(5).map_err(db(operation))?;
            let at: Option<SystemTime> = row.try_get(6).map_err(db(operation))?;
            let reason = reason.unwrap_or_default();
            let reason = LossReason::ALL
                .into_iter()
                .find(|r| r.as_str() == reason)
                .ok_or_else(|| ClusterError::Row {
                    operation,
                    reason: format!("unknown loss reason {reason:?}"),
                })?;
            let at = at.unwrap_or(SystemTime::UNIX_EPOCH);
            EntryState::Lost {
                loss: StateLost {
                    reason,
                    at: humantime::format_rfc3339_seconds(at).to_string(),
                    workspace_lost: false,
                },
            }
        }
        other => {
            return Err(ClusterError::Row {
                operation,
                reason: format!("unknown kernel state {other:?}"),
            })
        }
    };
    Ok(Entry {
        key_hash: row.try_get(0).map_err(db(operation))?,
        tenant: row.try_get(1).map_err(db(operation))?,
        owner: row.try_get(2).map_err(db(operation))?,
        generation: u64::try_from(generation).unwrap_or(0),
        state,
    })
}

/// Tenants [`Store::tenants_elsewhere`] returns at most (the busiest first): a tenant past it
/// is counted as holding nothing on other nodes.
pub const MAX_SHARE_TENANTS: i64 = 4_096;

/// A session's placement, joined with its node's row (`$1` tenant, `$2` session).
pub(super) const PLACEMENT: &str = "
SELECT s.node, s.epoch, s.live, coalesce(n.advertise, ''),
       coalesce(n.state = 'live' AND n.epoch = s.epoch, false)
FROM kb_sessions s LEFT JOIN kb_nodes n ON n.name = s.node
WHERE s.tenant = $1 AND s.session = $2";

/// A tenant's live sessions on current nodes, other than `$2` (`$1` tenant; `$2` may be a
/// name no session has).
const TENANT_LIVE: &str = "
SELECT count(*) FROM kb_sessions s
JOIN kb_nodes n ON n.name = s.node AND n.epoch = s.epoch AND n.state = 'live'
WHERE s.tenant = $1 AND s.live AND s.session <> $2";

pub(super) fn placement_from_row(row: &tokio_postgres::Row) -> Result<Placement, ClusterError> {
    let op = "read placement";
    Ok(Placement {
        node: row.try_get(0).map_err(db(op))?,
        epoch: row.try_get(1).map_err(db(op))?,
        live: row.try_get(2).map_err(db(op))?,
        advertise: row.try_get(3).map_err(db(op))?,
        node_current: row.try_get(4).map_err(db(op))?,
    })
}

impl Store {
    /// Where the session lives, if it has a row.
    pub async fn lookup(
        &self,
        tenant: &str,
        session: &str,
    ) -> Result<Option<Placement>, ClusterError> {
        let op = "lookup";
        within(op, async {
            let client = self.client(op).await?;
            let row = client
                .query_opt(PLACEMENT, &[&tenant, &session])
                .await
                .map_err(db(op))?;
            row.as_ref().map(placement_from_row).transpose()
        })
        .await
    }

    /// One transaction, serialised per tenant (pg_advisory_xact_lock on the tenant):
    /// claimant not current -> Fenced; row live on another node that is current -> Held;
    /// row live on this node+epoch -> Claimed (no count); otherwise, with a cap, the tenant's
    /// live sessions (other than this one) >= cap -> TenantAtCap; else upsert the row to
    /// (node, epoch, live) -> Claimed with the session's kernels rows as catalog::Entry
    /// (state Live / Lost{loss: StateLost{reason, at RFC 3339}} / Ended).
    ///
    /// On a takeover, the session's kernels still `live` on a node that is not current
    /// (expired, left or registered anew since) become lost with `node_lost`, so that the
    /// loss is owed to the owner.
    pub async fn claim(&self, req: &ClaimRequest) -> Result<Claim, ClusterError> {
        let op = "claim";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            // Claims of one tenant queue on its lock: a burst of them fails fast rather than
            // holding the pool's connections (docs/cluster.md, "Catalog schema").
            tx.batch_execute(CLAIM_LOCK_TIMEOUT).await.map_err(db(op))?;
            tx.execute(
                "SELECT pg_advisory_xact_lock($1, hashtext($2))",
                &[&TENANT_LOCK_CLASS, &req.tenant],
            )
            .await
            .map_err(db(op))?;
            let current = tx
                .query_opt(
                    "SELECT 1 FROM kb_nodes WHERE name = $1 AND epoch = $2 AND state = 'live'
                     FOR SHARE",
                    &[&req.node, &req.epoch],
                )
                .await
                .map_err(db(op))?;
            if current.is_none() {
                return Ok(Claim::Fenced);
            }
            let placed = tx
                .query_opt(
                    &format!("{PLACEMENT} FOR UPDATE OF s"),
                    &[&req.tenant, &req.session],
                )
                .await
                .map_err(db(op))?;
            let placed = placed.as_ref().map(placement_from_row).transpose()?;
            let here = placed
                .as_ref()
                .is_some_and(|p| p.live && p.node == req.node && p.epoch == req.epoch);
            if let Some(p) = placed.filter(|p| p.live && p.node_current && !here) {
                return Ok(Claim::Held(p));
            }
            if !here {
                if let Some(at_cap) = take_session(&tx, req).await? {
                    return Ok(at_cap);
                }
            }
            let entries = session_entries(&tx, &req.tenant, &req.session).await?;
            tx.commit().await.map_err(db(op))?;
            Ok(Claim::Claimed { entries })
        })
        .await
    }

    /// Gives back a claim that started no kernel (the request failed before it could): the
    /// session held by `node` at `epoch` stops being live unless one of its kernels is live
    /// there. Also keeps the tenant's sessions that are not live within
    /// [`crate::catalog::MAX_ENTRIES_PER_TENANT`], oldest first.
    pub async fn release(
        &self,
        tenant: &str,
        session: &str,
        node: &str,
        epoch: i64,
    ) -> Result<(), ClusterError> {
        let op = "release claim";
        within(op, async {
            let client = self.client(op).await?;
            client
                .execute(SESSION_ENDS, &[&tenant, &session, &node, &epoch])
                .await
                .map_err(db(op))?;
            let bound = i64::try_from(crate::catalog::MAX_ENTRIES_PER_TENANT).unwrap_or(i64::MAX);
            client
                .execute(
                    "DELETE FROM kb_sessions WHERE (tenant, session) IN (
                         SELECT tenant, session FROM kb_sessions
                         WHERE tenant = $1 AND NOT live
                         ORDER BY claimed_at DESC OFFSET $2)",
                    &[&tenant, &bound],
                )
                .await
                .map_err(db(op))?;
            Ok(())
        })
        .await
    }

    /// Each tenant's live root kernels on current nodes other than `node` (the first
    /// [`MAX_SHARE_TENANTS`], busiest first): what the fair shares count beside this node's
    /// own kernels (docs/cluster.md, "Caps and fair shares").
    pub async fn tenants_elsewhere(&self, node: &str) -> Result<Vec<(String, u32)>, ClusterError> {
        let op = "count tenants' kernels on other nodes";
        within(op, async {
            let client = self.client(op).await?;
            let rows = client
                .query(
                    "SELECT k.tenant, count(*) FROM kb_kernels k
                     JOIN kb_nodes n ON n.name = k.node AND n.epoch = k.epoch
                         AND n.state = 'live'
                     WHERE k.state = 'live' AND k.node <> $1 AND k.owner = k.session
                     GROUP BY k.tenant ORDER BY count(*) DESC, k.tenant LIMIT $2",
                    &[&node, &MAX_SHARE_TENANTS],
                )
                .await
                .map_err(db(op))?;
            rows.iter()
                .map(|row| {
                    let n: i64 = row.try_get(1).map_err(db(op))?;
                    Ok((row.try_get(0).map_err(db(op))?, to_u32(n)))
                })
                .collect()
        })
        .await
    }

    /// The tenant's live sessions cluster-wide (on nodes whose lease is current).
    pub async fn tenant_live(&self, tenant: &str) -> Result<u32, ClusterError> {
        let op = "count tenant's live sessions";
        within(op, async {
            let client = self.client(op).await?;
            // `::` never occurs in a session name (owner::validate_name): no session excluded.
            let live: i64 = client
                .query_one(TENANT_LIVE, &[&tenant, &"::"])
                .await
                .map_err(db(op))?
                .try_get(0)
                .map_err(db(op))?;
            Ok(to_u32(live))
        })
        .await
    }
}

/// A claim's takeover of a session not live on the claimant, inside the claim's
/// transaction: refused (`TenantAtCap`) when the tenant has a cap and that many other live
/// sessions; else the session's row points at the claimant, and its kernels still live on a
/// node that is not current become lost with `node_lost`, so that the loss is owed to the
/// owner.
async fn take_session(
    tx: &tokio_postgres::Transaction<'_>,
    req: &ClaimRequest,
) -> Result<Option<Claim>, ClusterError> {
    let op = "claim";
    if let Some(cap) = req.tenant_cap {
        let live: i64 = tx
            .query_one(TENANT_LIVE, &[&req.tenant, &req.session])
            .await
            .map_err(db(op))?
            .try_get(0)
            .map_err(db(op))?;
        let live = to_u32(live);
        if live >= cap {
            return Ok(Some(Claim::TenantAtCap { live }));
        }
    }
    tx.execute(
        "INSERT INTO kb_sessions (tenant, session, node, epoch, live, claimed_at)
         VALUES ($1, $2, $3, $4, true, now())
         ON CONFLICT (tenant, session) DO UPDATE SET node = EXCLUDED.node,
             epoch = EXCLUDED.epoch, live = true, claimed_at = now()",
        &[&req.tenant, &req.session, &req.node, &req.epoch],
    )
    .await
    .map_err(db(op))?;
    tx.execute(
        "UPDATE kb_kernels k SET state = 'lost', reason = $3, lost_at = now(),
             changed_at = clock_timestamp()
         WHERE k.tenant = $1 AND k.session = $2 AND k.state = 'live'
           AND NOT EXISTS (SELECT 1 FROM kb_nodes n WHERE n.name = k.node
               AND n.epoch = k.epoch AND n.state = 'live')",
        &[&req.tenant, &req.session, &LossReason::NodeLost.as_str()],
    )
    .await
    .map_err(db(op))?;
    Ok(None)
}

/// The session's kernels' rows as catalog entries, oldest change first, at most
/// [`crate::catalog::MAX_ENTRIES_PER_TENANT`], inside the claim's transaction.
pub(super) async fn session_entries(
    tx: &tokio_postgres::Transaction<'_>,
    tenant: &str,
    session: &str,
) -> Result<Vec<Entry>, ClusterError> {
    let op = "claim";
    let limit = i64::try_from(crate::catalog::MAX_ENTRIES_PER_TENANT).unwrap_or(i64::MAX);
    let rows = tx
        .query(
            &format!(
                "SELECT {ENTRY_COLUMNS} FROM kb_kernels
                 WHERE tenant = $1 AND session = $2
                 ORDER BY changed_at, key_hash LIMIT $3"
            ),
            &[&tenant, &session, &limit],
        )
        .await
        .map_err(db(op))?;
    rows.iter().map(|row| entry_from_row(op, row)).collect()
}
