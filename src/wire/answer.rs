//! The JSON answers of the routes that are not a cell's or a command's result: counts,
//! listings, deletions, the network policy's answer, health and the cluster's admin answers
//! (`docs/http-api.md`, `docs/cluster.md`). The server builds each answer from its type here,
//! and the OpenAPI document describes it from the same type. Fields of an answer with several
//! are in name order: the order the server has always written them in.

use schemars::JsonSchema;
use serde::Serialize;

use std::collections::BTreeMap;

/// A live kernel, as `Orchestrator::list_kernels` reports it (`GET /v1/kernels`).
#[derive(Debug, Clone, Serialize, PartialEq, JsonSchema)]
pub struct KernelSummary {
    /// Short container id.
    pub id: String,
    /// The tenant the kernel's owner belongs to.
    pub tenant: String,
    /// The owner: `session` or `session::child::child`.
    pub owner: String,
    /// The owner's session.
    pub session: String,
    /// The owner's delegated child, when the kernel is a child's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub child: Option<String>,
    /// The language the kernel runs (`docs/contract.md`, "Languages").
    pub language: super::Language,
    /// The kernel's context within its owner (the default one of a language is named by it).
    pub context: String,
    /// Generation within the key.
    pub generation: u64,
    /// `starting`, `idle` or `busy` (a cell running, or computing with no cell running:
    /// `docs/reliability.md`, "Runaway kernels").
    pub state: String,
    /// Cells executed.
    pub execution_count: u64,
    /// Seconds since last use.
    pub idle_seconds: f64,
    /// Calls attached.
    pub attached: usize,
    /// The session's labels (its settings', `src/settings.rs`).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// One workspace as its tenant sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
pub struct WorkspaceSummary {
    /// The owner it belongs to (`session`, or `session::child::id`).
    pub name: String,
    /// Bytes it takes on the host (at most `quota_bytes`).
    pub size_bytes: u64,
    /// Its quota, bytes.
    pub quota_bytes: u64,
    /// Its last use, Unix seconds.
    pub last_used: u64,
    /// A kernel has it mounted now.
    pub in_use: bool,
}

/// `POST /v1/sessions/{session}/interrupt`: the cells that ended `interrupted`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Interrupted {
    /// Cells interrupted (at least 1: none is a 404).
    pub interrupted: usize,
}

/// `DELETE /v1/sessions/{session}`: the session's kernels disposed of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Cleared {
    /// Kernels disposed of, its children's included (at least 1: none is a 404).
    pub cleared: usize,
}

/// `DELETE /v1/sessions/{session}/children/{child}`: the child's kernels disposed of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Released {
    /// Kernels disposed of (at least 1: none is a 404).
    pub released: usize,
}

/// `PUT /v1/sessions/{session}/network`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct NetworkApplied {
    /// The session's connections the new policy refused, closed at once.
    pub closed: usize,
}

/// `GET /v1/kernels`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct KernelList {
    /// The caller's tenant's live kernels (those with every label asked for).
    pub kernels: Vec<KernelSummary>,
}

/// `GET /v1/sessions/{session}/contexts`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ContextList {
    /// The session's contexts that have a kernel (its own, not its children's), each its
    /// kernel: `context` names it, `language` says what it runs.
    pub contexts: Vec<KernelSummary>,
}

/// `GET /v1/workspaces`.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct WorkspaceList {
    /// The caller's tenant's workspaces, by name.
    pub workspaces: Vec<WorkspaceSummary>,
}

/// `DELETE` of a file or of a workspace: what is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Deleted {
    /// The file's path in the kernel (`/work/...`), or the workspace's name.
    pub deleted: String,
}

/// `GET /healthz`: serving.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct Health {
    /// A cluster node's epoch (its lease).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub epoch: Option<i64>,
    /// This server process's instance id (its kernels' `io.kernelbox.instance` label).
    pub instance: String,
    /// A cluster node's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// `ok`.
    pub status: HealthStatus,
}

/// The `status` of a [`Health`] answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum HealthStatus {
    /// Serving.
    Ok,
}

/// `GET /v1/nodes`: a cluster's nodes, and which one answered.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct NodeList {
    /// Every node of the cluster's catalog.
    pub nodes: Vec<NodeEntry>,
    /// The name of the node that answered.
    #[serde(rename = "self")]
    pub this: String,
}

/// One node of a [`NodeList`].
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct NodeEntry {
    /// The address other nodes forward to.
    pub advertise: String,
    /// Kernels it can hold.
    pub capacity: u32,
    /// Taking no new sessions.
    pub draining: bool,
    /// Its current epoch.
    pub epoch: i64,
    /// Seconds since its last lease renewal.
    pub lease_age_seconds: f64,
    /// Seconds its lease lasts past a renewal.
    pub lease_ttl_seconds: f64,
    /// Live kernels at its last lease renewal.
    pub live_kernels: u32,
    /// Its name.
    pub name: String,
    /// Where its row stands.
    pub state: NodeStatus,
}

/// The `state` of a [`NodeEntry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum NodeStatus {
    /// Registered and renewing its lease.
    Live,
    /// Stopped renewing; expired by another node.
    Expired,
    /// Left gracefully.
    Left,
}

/// `POST` and `DELETE /v1/nodes/{node}/drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, JsonSchema)]
pub struct NodeDrain {
    /// Whether it now takes no new sessions.
    pub draining: bool,
    /// The node.
    pub node: String,
}

/// `GET /v1/nodes/{node}/kernels`: one node's live kernels, every tenant's.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct NodeKernels {
    /// Its live kernels.
    pub kernels: Vec<KernelSummary>,
    /// The node.
    pub node: String,
}
