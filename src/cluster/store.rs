//! [`Store`]: the cluster's catalog in PostgreSQL (docs/cluster.md, "Catalog schema"):
//! nodes and their epochs (register, renew, expire, drain, leave), where sessions live
//! (lookup, claim), and the live counts the caps read.
//!
//! Every operation runs on a pooled connection (at most [`POOL_SIZE`]; a connection attempt
//! has [`CONNECT_TIMEOUT`], every statement the server-side `statement_timeout`
//! [`STATEMENT_TIMEOUT`]) and as a whole within [`OPERATION_DEADLINE`], so a database that
//! stops answering makes an operation fail, never hang. Times that decide anything (lease
//! ages, `lost_at`) are the database's clock, one clock for every node.

use std::fmt;
use std::time::{Duration, SystemTime};

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use crate::catalog::{Entry, EntryState};
use crate::cell::{LossReason, StateLost};

use super::error::{db, ClusterError};

/// Connections in the pool at most.
pub const POOL_SIZE: usize = 8;

/// Establishing one connection (TCP and start-up), at most.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The server-side `statement_timeout` set on every connection.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One operation in all (waiting for a connection and its few statements), at most.
pub const OPERATION_DEADLINE: Duration = Duration::from_secs(15);

/// Nodes [`Store::nodes`] lists, and [`Store::expire_dead`] expires in one pass, at most (a
/// cluster is a handful of Docker hosts; the bound only keeps every read finite).
pub const MAX_NODES: i64 = 1_024;

/// A session held here at this epoch stops being live once none of its kernels (root or
/// delegated children) is live here: while one is, no other node may claim it, so a session
/// never has kernels on two nodes.
pub(crate) const SESSION_ENDS: &str = "UPDATE kb_sessions SET live = false
    WHERE tenant = $1 AND session = $2 AND node = $3 AND epoch = $4 AND live
      AND NOT EXISTS (SELECT 1 FROM kb_kernels k WHERE k.tenant = $1 AND k.session = $2
          AND k.node = $3 AND k.epoch = $4 AND k.state = 'live')";

/// How long a claim waits for its tenant's lock (claims of one tenant go one at a time).
const CLAIM_LOCK_TIMEOUT: &str = "SET LOCAL lock_timeout = '2s'";

/// Waiting for a free pooled connection, at most.
const POOL_WAIT: Duration = Duration::from_secs(5);

/// The class of the per-tenant advisory lock [`Store::claim`] takes (`kbtn` in ASCII; the
/// tenant's `hashtext` is the second key).
const TENANT_LOCK_CLASS: i32 = 0x6b62_746e;

/// What a node registers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// The node's unique name in the cluster.
    pub name: String,
    /// The address other nodes forward to.
    pub advertise: String,
    /// Kernels it can hold.
    pub capacity: u32,
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
    /// Its name.
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
    /// Its name.
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
}

/// Where a session lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// The node.
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

/// The cluster's catalog in PostgreSQL: a pool of connections (see the module documentation).
#[derive(Clone)]
pub struct Store {
    pool: Pool,
    target: std::sync::Arc<str>,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("target", &self.target)
            .finish_non_exhaustive()
    }
}

/// Runs `op` within [`OPERATION_DEADLINE`].
async fn within<T>(
    operation: &'static str,
    op: impl std::future::Future<Output = Result<T, ClusterError>>,
) -> Result<T, ClusterError> {
    tokio::time::timeout(OPERATION_DEADLINE, op)
        .await
        .unwrap_or(Err(ClusterError::Timeout {
            operation,
            deadline: OPERATION_DEADLINE,
        }))
}

/// `user@host:port/database` of a connection configuration (no password).
fn describe(config: &tokio_postgres::Config) -> String {
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(name) => name.clone(),
            tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    let ports: Vec<String> = config.get_ports().iter().map(u16::to_string).collect();
    format!(
        "{}@{}:{}/{}",
        config.get_user().unwrap_or(""),
        hosts.join(","),
        if ports.is_empty() {
            "5432".to_string()
        } else {
            ports.join(",")
        },
        config.get_dbname().unwrap_or("")
    )
}

/// A `u32` for an `int` column (saturating).
fn to_int(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

/// A count or an `int` column as a `u32` (saturating; never negative by the schema).
fn to_u32(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
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

/// A session's placement, joined with its node's row (`$1` tenant, `$2` session).
const PLACEMENT: &str = "
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

fn placement_from_row(row: &tokio_postgres::Row) -> Result<Placement, ClusterError> {
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
    /// Connects to the database at `url` (`postgres://user[:password]@host[:port]/database`;
    /// without TLS) and applies the migrations it lacks ([`super::schema`]).
    pub async fn connect(url: &str) -> Result<Store, ClusterError> {
        Store::connect_sized(url, POOL_SIZE).await
    }

    /// [`Store::connect`] with a pool of at most `size` connections (a node's lease gets a
    /// pool of its own, so that no burst of claims can delay its renewal).
    pub async fn connect_sized(url: &str, size: usize) -> Result<Store, ClusterError> {
        let mut config: tokio_postgres::Config =
            url.parse()
                .map_err(|e: tokio_postgres::Error| ClusterError::Url {
                    reason: e.to_string(),
                })?;
        let target = describe(&config);
        config.connect_timeout(CONNECT_TIMEOUT);
        let options = format!(
            "{} -c statement_timeout={}",
            config.get_options().unwrap_or(""),
            STATEMENT_TIMEOUT.as_millis()
        );
        config.options(options.trim_start());
        if config.get_application_name().is_none() {
            config.application_name("kernelbox");
        }
        let manager = Manager::from_config(
            config,
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(size.max(1))
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT))
            .create_timeout(Some(CONNECT_TIMEOUT * 2))
            .recycle_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| ClusterError::Connection {
                operation: "connect",
                target: target.clone(),
                reason: e.to_string(),
            })?;
        let store = Store {
            pool,
            target: target.into(),
        };
        within("migrate", async {
            let mut client = store.client("migrate").await?;
            super::schema::migrate(&mut client).await
        })
        .await?;
        Ok(store)
    }

    /// A pooled connection.
    pub(crate) async fn client(&self, operation: &'static str) -> Result<Object, ClusterError> {
        self.pool.get().await.map_err(|e| ClusterError::Connection {
            operation,
            target: self.target.to_string(),
            reason: e.to_string(),
        })
    }

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
                     capacity, live_kernels, draining)
                 VALUES ($1, $2, $3, 'live', now(), now(), $4, 0, false)
                 ON CONFLICT (name) DO UPDATE SET advertise = EXCLUDED.advertise,
                     epoch = EXCLUDED.epoch, state = 'live', started_at = now(),
                     renewed_at = now(), capacity = EXCLUDED.capacity, live_kernels = 0,
                     draining = false",
                &[&node.name, &node.advertise, &epoch, &to_int(node.capacity)],
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

    /// Any live node may call this: every node whose renewed_at is older than `ttl` by the
    /// DATABASE clock is expired in one transaction (FOR UPDATE SKIP LOCKED): state expired,
    /// epoch bumped from the sequence (so its late renewal returns Fenced), its epoch's live
    /// kernels lost with reason node_lost (lost_at = now), its sessions not live.
    pub async fn expire_dead(&self, ttl: Duration) -> Result<Vec<Expired>, ClusterError> {
        let op = "expire dead nodes";
        within(op, async {
            let mut client = self.client(op).await?;
            let tx = client.transaction().await.map_err(db(op))?;
            let dead = tx
                .query(
                    "SELECT name, epoch FROM kb_nodes
                     WHERE state = 'live' AND renewed_at < now() - make_interval(secs => $1)
                     ORDER BY name LIMIT $2
                     FOR UPDATE SKIP LOCKED",
                    &[&ttl.as_secs_f64(), &MAX_NODES],
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
                         greatest(extract(epoch FROM now() - renewed_at), 0)::float8
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
                if let Some(cap) = req.tenant_cap {
                    let live: i64 = tx
                        .query_one(TENANT_LIVE, &[&req.tenant, &req.session])
                        .await
                        .map_err(db(op))?
                        .try_get(0)
                        .map_err(db(op))?;
                    let live = to_u32(live);
                    if live >= cap {
                        return Ok(Claim::TenantAtCap { live });
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
            }
            let limit = i64::try_from(crate::catalog::MAX_ENTRIES_PER_TENANT).unwrap_or(i64::MAX);
            let rows = tx
                .query(
                    &format!(
                        "SELECT {ENTRY_COLUMNS} FROM kb_kernels
                         WHERE tenant = $1 AND session = $2
                         ORDER BY changed_at, key_hash LIMIT $3"
                    ),
                    &[&req.tenant, &req.session, &limit],
                )
                .await
                .map_err(db(op))?;
            let entries = rows
                .iter()
                .map(|row| entry_from_row(op, row))
                .collect::<Result<Vec<_>, _>>()?;
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

    /// The secret that marks a request forwarded by a node of this cluster (made once, by the
    /// migration that added it; readable by whoever can read the catalog, never by a tenant).
    pub async fn hop_secret(&self) -> Result<String, ClusterError> {
        let op = "read the hop secret";
        within(op, async {
            let client = self.client(op).await?;
            let row = client
                .query_one("SELECT hop_secret FROM kb_cluster WHERE id = 1", &[])
                .await
                .map_err(db(op))?;
            row.try_get(0).map_err(db(op))
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
