//! Node leases (docs/cluster.md, "Leases and fencing"): a node registers with a new epoch,
//! renews its lease by the database's clock, and any live node expires the nodes whose lease
//! ran out; listing, draining and a graceful leave.

use std::time::Duration;

use crate::cell::LossReason;

use super::super::error::{db, ClusterError};
use super::{to_int, to_u32, within, Store};

/// Nodes [`Store::nodes`] lists, and [`Store::expire_dead`] expires in one pass, at most (a
/// cluster is a handful of Docker hosts; the bound only keeps every read finite).
pub const MAX_NODES: i64 = 1_024;

/// What a node registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's unique name in the cluster.
    pub name: String,
    /// The address other nodes forward to.
    pub advertise: String,
    /// Kernels it can hold.
    pub capacity: u32,
    /// How long its lease lasts past its last renewal: stored in its row, so that any node
    /// judges its expiry by this, never by its own setting.
    pub lease_ttl: Duration,
}

/// What a lease renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The lease is renewed.
    Renewed,
    /// The node's epoch moved on or the node is not live: it must stop serving and register
    /// again.
    Fenced,
}

/// A node [`Store::expire_dead`] expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expired {
    /// The expired node's name.
    pub name: String,
    /// The epoch that expired (the node's row now holds a newer one).
    pub epoch: i64,
    /// Its live kernels, now lost with `node_lost`.
    pub kernels_lost: u64,
}

/// Where a node's row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Registered and (as far as the last expiry pass knows) renewing its lease.
    Live,
    /// Stopped renewing; expired by another node.
    Expired,
    /// Left gracefully.
    Left,
}

impl NodeState {
    /// The name in the `state` column.
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Live => "live",
            NodeState::Expired => "expired",
            NodeState::Left => "left",
        }
    }

    fn parse(text: &str) -> Option<NodeState> {
        [NodeState::Live, NodeState::Expired, NodeState::Left]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// One node as [`Store::nodes`] lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRow {
    /// The node's name, unique in the cluster.
    pub name: String,
    /// The address other nodes forward to.
    pub advertise: String,
    /// Its current epoch.
    pub epoch: i64,
    /// Where it stands.
    pub state: NodeState,
    /// Taking no new sessions.
    pub draining: bool,
    /// Kernels it can hold.
    pub capacity: u32,
    /// Live kernels at its last renewal.
    pub live_kernels: u32,
    /// The database's now minus its last renewal.
    pub lease_age: Duration,
    /// How long its lease lasts past its last renewal (as it registered it).
    pub lease_ttl: Duration,
}

/// A lease TTL in whole milliseconds for the `lease_ttl_ms` column (at least 1, saturating).
fn ttl_ms(ttl: Duration) -> i64 {
    i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl Store {
    /// New epoch for the node (one transaction): the node's previous epoch's live kernels
    /// become lost with `previous_loss` (at = db now), its sessions not live; node row upserted
    /// live, renewed now, not draining.
    pub async fn register(
        &self,
        node: &NodeInfo,
        previous_loss: LossReason,
    ) -> Result<i64, ClusterError> {
        let op = "register";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            let epoch: i64 = tx
                .query_one("SELECT nextval('kb_epoch_seq')", &[])
                .await
                .map_err(db(op))?
                .try_get(0)
                .map_err(db(op))?;
            tx.execute(
                "SELECT 1 FROM kb_nodes WHERE name = $1 FOR UPDATE",
                &[&node.name],
            )
            .await
            .map_err(db(op))?;
            // Every earlier epoch of this node is over: what it left live is lost.
            tx.execute(
                "UPDATE kb_kernels SET state = 'lost', reason = $3, lost_at = now(),
                     changed_at = clock_timestamp()
                 WHERE node = $1 AND epoch < $2 AND state = 'live'",
                &[&node.name, &epoch, &previous_loss.as_str()],
            )
            .await
            .map_err(db(op))?;
            tx.execute(
                "UPDATE kb_sessions SET live = false WHERE node = $1 AND epoch < $2 AND live",
                &[&node.name, &epoch],
            )
            .await
            .map_err(db(op))?;
            tx.execute(
                "INSERT INTO kb_nodes (name, advertise, epoch, state, started_at, renewed_at,
                     capacity, live_kernels, draining, lease_ttl_ms)
                 VALUES ($1, $2, $3, 'live', now(), now(), $4, 0, false, $5)
                 ON CONFLICT (name) DO UPDATE SET advertise = EXCLUDED.advertise,
                     epoch = EXCLUDED.epoch, state = 'live', started_at = now(),
                     renewed_at = now(), capacity = EXCLUDED.capacity, live_kernels = 0,
                     draining = false, lease_ttl_ms = EXCLUDED.lease_ttl_ms",
                &[
                    &node.name,
                    &node.advertise,
                    &epoch,
                    &to_int(node.capacity),
                    &ttl_ms(node.lease_ttl),
                ],
            )
            .await
            .map_err(db(op))?;
            tx.commit().await.map_err(db(op))?;
            Ok(epoch)
        })
        .await
    }

    /// Renews the node's lease (renewed now, by the database's clock) and records its live
    /// kernels, if `epoch` is still its current live epoch.
    pub async fn renew(
        &self,
        name: &str,
        epoch: i64,
        live_kernels: u32,
    ) -> Result<Renewal, ClusterError> {
        let op = "renew";
        within(op, async {
            let client = self.client(op).await?;
            let n = client
                .execute(
                    "UPDATE kb_nodes SET renewed_at = now(), live_kernels = $3
                     WHERE name = $1 AND epoch = $2 AND state = 'live'",
                    &[&name, &epoch, &to_int(live_kernels)],
                )
                .await
                .map_err(db(op))?;
            Ok(if n == 1 {
                Renewal::Renewed
            } else {
                Renewal::Fenced
            })
        })
        .await
    }

    /// Any live node may call this: every node whose renewed_at is older than its OWN lease
    /// TTL (the `lease_ttl_ms` it registered; never the caller's) by the DATABASE clock is
    /// expired in one transaction (FOR UPDATE SKIP LOCKED): state expired, epoch bumped from
    /// the sequence (so its late renewal returns Fenced), its epoch's live kernels lost with
    /// reason node_lost (lost_at = now), its sessions not live.
    pub async fn expire_dead(&self) -> Result<Vec<Expired>, ClusterError> {
        let op = "expire dead nodes";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            let dead = tx
                .query(
                    "SELECT name, epoch FROM kb_nodes
                     WHERE state = 'live'
                       AND renewed_at < now() - lease_ttl_ms * interval '1 millisecond'
                     ORDER BY name LIMIT $1
                     FOR UPDATE SKIP LOCKED",
                    &[&MAX_NODES],
                )
                .await
                .map_err(db(op))?;
            let mut expired = Vec::with_capacity(dead.len());
            for row in dead {
                let name: String = row.try_get(0).map_err(db(op))?;
                let epoch: i64 = row.try_get(1).map_err(db(op))?;
                tx.execute(
                    "UPDATE kb_nodes SET state = 'expired', epoch = nextval('kb_epoch_seq')
                     WHERE name = $1",
                    &[&name],
                )
                .await
                .map_err(db(op))?;
                let kernels_lost = tx
                    .execute(
                        "UPDATE kb_kernels SET state = 'lost', reason = $3, lost_at = now(),
                             changed_at = clock_timestamp()
                         WHERE node = $1 AND epoch <= $2 AND state = 'live'",
                        &[&name, &epoch, &LossReason::NodeLost.as_str()],
                    )
                    .await
                    .map_err(db(op))?;
                tx.execute(
                    "UPDATE kb_sessions SET live = false WHERE node = $1 AND epoch <= $2 AND live",
                    &[&name, &epoch],
                )
                .await
                .map_err(db(op))?;
                expired.push(Expired {
                    name,
                    epoch,
                    kernels_lost,
                });
            }
            tx.commit().await.map_err(db(op))?;
            Ok(expired)
        })
        .await
    }

    /// Every node (the first [`MAX_NODES`]), by name.
    pub async fn nodes(&self) -> Result<Vec<NodeRow>, ClusterError> {
        let op = "list nodes";
        within(op, async {
            let client = self.client(op).await?;
            let rows = client
                .query(
                    "SELECT name, advertise, epoch, state, draining, capacity, live_kernels,
                         greatest(extract(epoch FROM now() - renewed_at), 0)::float8,
                         lease_ttl_ms
                     FROM kb_nodes ORDER BY name LIMIT $1",
                    &[&MAX_NODES],
                )
                .await
                .map_err(db(op))?;
            rows.iter()
                .map(|row| {
                    let state: String = row.try_get(3).map_err(db(op))?;
                    let age: f64 = row.try_get(7).map_err(db(op))?;
                    Ok(NodeRow {
                        name: row.try_get(0).map_err(db(op))?,
                        advertise: row.try_get(1).map_err(db(op))?,
                        epoch: row.try_get(2).map_err(db(op))?,
                        state: NodeState::parse(&state).ok_or_else(|| ClusterError::Row {
                            operation: op,
                            reason: format!("unknown node state {state:?}"),
                        })?,
                        draining: row.try_get(4).map_err(db(op))?,
                        capacity: to_u32(i64::from(row.try_get::<_, i32>(5).map_err(db(op))?)),
                        live_kernels: to_u32(i64::from(row.try_get::<_, i32>(6).map_err(db(op))?)),
                        lease_age: Duration::try_from_secs_f64(age).unwrap_or(Duration::ZERO),
                        lease_ttl: Duration::from_millis(
                            u64::try_from(row.try_get::<_, i64>(8).map_err(db(op))?).unwrap_or(0),
                        ),
                    })
                })
                .collect()
        })
        .await
    }

    /// Marks the node draining (or not); false when there is no such node.
    pub async fn set_draining(&self, name: &str, draining: bool) -> Result<bool, ClusterError> {
        let op = "set draining";
        within(op, async {
            let client = self.client(op).await?;
            let n = client
                .execute(
                    "UPDATE kb_nodes SET draining = $2 WHERE name = $1",
                    &[&name, &draining],
                )
                .await
                .map_err(db(op))?;
            Ok(n > 0)
        })
        .await
    }

    /// Graceful leave: state left (its live sessions were already ended/lost by the catalog
    /// writer; any session row still live at this epoch is set not live). Nothing changes when
    /// `epoch` is no longer the node's current live epoch.
    pub async fn leave(&self, name: &str, epoch: i64) -> Result<(), ClusterError> {
        let op = "leave";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            let n = tx
                .execute(
                    "UPDATE kb_nodes SET state = 'left', draining = false
                     WHERE name = $1 AND epoch = $2 AND state = 'live'",
                    &[&name, &epoch],
                )
                .await
                .map_err(db(op))?;
            if n > 0 {
                tx.execute(
                    "UPDATE kb_sessions SET live = false WHERE node = $1 AND epoch = $2 AND live",
                    &[&name, &epoch],
                )
                .await
                .map_err(db(op))?;
            }
            tx.commit().await.map_err(db(op))?;
            Ok(())
        })
        .await
    }
}
