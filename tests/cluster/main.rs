//! A kernelbox cluster end to end (docs/cluster.md): three real `kernelbox serve` nodes on
//! one real PostgreSQL catalog (a fresh database per test, `tests/common/postgres.rs`), the
//! real engine, and real HAProxy in front, hashing on the session's path. Each test labels
//! what it creates with a unique `io.kernelbox-test.case`, stops everything it started (on
//! panic too) and ends by asserting through the Docker API that no kernel with that label is
//! left.
//!
//! | file | what |
//! |---|---|
//! | `main.rs` | this table; the modules |
//! | `harness.rs` | [`harness::Cluster`]: a database, three nodes, HAProxy, their clean-up; polling with a deadline; what a result says |
//! | `routing.rs` | "Routing": state whichever node the balancer picks, one hop at most and what streams through it, first calls racing on two nodes |
//! | `failures.rs` | "Leases and fencing": a node killed, a node stopped past its lease, the catalog unavailable |
//! | `admin.rs` | "Admin" and caps: a tenant's cap across nodes, draining a node with `kernelbox drain` / `nodes` |
//! | `drain.rs` | "Draining and upgrades": the drain's deadline (`node_drained`), a stop that drains first |
//! | `migrate.rs` | "Migration on drain": an idle runsc kernel moved off a drained node with its variables and generation (`kernel.migrated`), a busy one still lost at the deadline, a transfer refused |
//! | `namesake.rs` | two agents of one node name never both serve |
//! | `logs.rs` | the access log across the hop: both nodes log a forwarded request under one request id (docs/logs.md, "Request ids") |
//! | `traces.rs` | traces across the hop: the holding node continues the forwarding node's trace (docs/usage.md, "Traces") |
//! | `session_config.rs` | "Session policies and settings": a session's network policy and settings set on one node apply to its kernel on another, a `PUT` of them never counts against the tenant's cap, a deleted session's are forgotten |
//! | `workspaces.rs` | workspaces across nodes: a stale image never served as the workspace, the tenant's count, list and delete cluster-wide (docs/workspaces.md, "In a cluster") |
//! | `reload.rs` | every node reloading the same tenants file: a token rotated while the nodes disagree (a forwarded request is authenticated again where it is served), then agreed |
//! | `balancer.rs` | the balancer's mapping moving away from a stopped node and snapping back when it returns |

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/http.rs"]
mod http;
#[path = "../common/otlp.rs"]
mod otlp;
#[path = "../common/postgres.rs"]
mod postgres;

mod admin;
mod balancer;
mod drain;
mod failures;
mod harness;
mod logs;
mod migrate;
mod namesake;
mod reload;
mod routing;
mod session_config;
mod traces;
mod workspaces;
