//! [`Store`]: the cluster's catalog in PostgreSQL (docs/cluster.md, "Catalog schema"):
//! nodes and their epochs (register, renew, expire, drain, leave), where sessions live
//! (lookup, claim), and the live counts the caps read.
//!
//! Every operation runs on a pooled connection (at most [`POOL_SIZE`]; a connection attempt
//! has [`CONNECT_TIMEOUT`], every statement the server-side `statement_timeout`
//! [`STATEMENT_TIMEOUT`]) and as a whole within [`OPERATION_DEADLINE`], so a database that
//! stops answering makes an operation fail, never hang. Times that decide anything (lease
//! ages, `lost_at`) are the database's clock, one clock for every node.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Store`]: the pool and its bounds, connecting (and migrating), the hop secret |
//! | `moves.rs` | a session moved from a draining node to the node that received its kernel, fenced by both nodes' epochs |
//! | `nodes.rs` | leases: register a node with a new epoch, renew, expire dead nodes, list, drain, leave |
//! | `config.rs` | sessions' network policies and settings: written (bounded per tenant, refused for a session live on another node), loaded at a claim, forgotten with the session |
//! | `sessions.rs` | where sessions live: look up, claim (with the tenant's cluster-wide cap), release, count a tenant's live sessions; a `kb_kernels` row as a catalog entry |
//! | `workspaces.rs` | which node holds each workspace at which generation: open (counted against the tenant's maximum), forget, find |

mod config;
mod moves;
mod nodes;
mod sessions;
mod workspaces;

use std::fmt;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, RecyclingMethod, Runtime};
use tokio_postgres::NoTls;

use super::error::{db, ClusterError};

pub use config::{ConfigField, ConfigWrite, SessionConfig};
pub use moves::SessionMove;
pub use nodes::{Expired, NodeInfo, NodeRow, NodeState, Renewal, MAX_NODES};
pub(crate) use sessions::SESSION_ENDS;
pub use sessions::{Claim, ClaimRequest, Placement, MAX_SHARE_TENANTS};
pub use workspaces::WorkspaceHome;

/// Connections in the pool at most.
pub const POOL_SIZE: usize = 8;

/// Establishing one connection (TCP and start-up), at most.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// The server-side `statement_timeout` set on every connection.
pub const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// One operation in all (waiting for a connection and its few statements), at most.
pub const OPERATION_DEADLINE: Duration = Duration::from_secs(15);

/// Waiting for a free pooled connection, at most.
const POOL_WAIT: Duration = Duration::from_secs(5);

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
}
