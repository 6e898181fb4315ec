//! The cluster's shared catalog in PostgreSQL (docs/cluster.md, "Catalog schema"): several
//! `kernelbox serve` nodes share one database that says which nodes are live at which epoch,
//! where each session lives, and what each kernel key's last kernel did. The node side (lease
//! loop, routing, forwarding) is built on [`Store`] and [`PostgresCatalog`]; this folder is
//! the database layer only, in plain SQL.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | this table, re-exports |
//! | `schema.rs` | the tables as versioned migrations (`kernelbox_schema`), applied once under an advisory lock however many nodes start at once |
//! | `error.rs` | [`ClusterError`]: why an operation failed, naming it (never the password) |
//! | `store/` | [`Store`] (the connection pool, its bounds) and its operations: `nodes.rs` register / renew / expire / drain / leave nodes (leases), `sessions.rs` look up, claim and release sessions, count a tenant's live sessions |
//! | `workspaces.rs` | [`WorkspaceLedger`]: the workspaces' ledger of a node (which node holds each workspace at which generation) |
//! | `catalog.rs` | [`PostgresCatalog`]: the [`crate::catalog::Catalog`] trait over the shared tables, fenced by the node's epoch |

mod catalog;
mod error;
mod schema;
mod store;
mod workspaces;

pub use catalog::PostgresCatalog;
pub use error::ClusterError;
pub use store::{
    Claim, ClaimRequest, ConfigField, ConfigWrite, Expired, NodeInfo, NodeRow, NodeState,
    Placement, Renewal, SessionConfig, SessionMove, Store, WorkspaceHome, CONNECT_TIMEOUT,
    MAX_NODES, MAX_SHARE_TENANTS, OPERATION_DEADLINE, POOL_SIZE, STATEMENT_TIMEOUT,
};
pub use workspaces::WorkspaceLedger;
