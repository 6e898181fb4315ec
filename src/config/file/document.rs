//! The sections of the configuration file. Every key is optional: a key left out takes the
//! default its flag has (`docs/configuration.md`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::tenant::TenantEntry;
use super::values::{HumanDuration, Secret, Size};

/// The configuration file of `kernelbox serve --config FILE` (TOML).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    /// The server: where it listens, how many kernels it runs, its other listeners.
    #[serde(default, skip_serializing_if = "ServerSection::is_empty")]
    pub server: ServerSection,
    /// What every kernel is made from and what one cell may take.
    #[serde(default, skip_serializing_if = "KernelsSection::is_empty")]
    pub kernels: KernelsSection,
    /// Bounds on connections and responses (docs/reliability.md).
    #[serde(default, skip_serializing_if = "LimitsSection::is_empty")]
    pub limits: LimitsSection,
    /// The warm pool: kernels kept started for new owners.
    #[serde(default, skip_serializing_if = "PoolSection::is_empty")]
    pub pool: PoolSection,
    /// The egress proxy of kernels with a network policy (docs/reliability.md, "Network egress"); each tenant's policy is its `network`.
    #[serde(default, skip_serializing_if = "EgressSection::is_empty")]
    pub egress: EgressSection,
    /// Joining a kernelbox cluster (docs/cluster.md).
    #[serde(default, skip_serializing_if = "ClusterSection::is_empty")]
    pub cluster: ClusterSection,
    /// Where the audit trail goes (docs/usage.md, "Audit trail"); who is audited is each tenant's `audit`.
    #[serde(default, skip_serializing_if = "AuditSection::is_empty")]
    pub audit: AuditSection,
    /// Bounds on hibernated kernels (docs/runtimes.md, "Hibernation"); which tenants hibernate is each tenant's `hibernate`.
    #[serde(default, skip_serializing_if = "HibernationSection::is_empty")]
    pub hibernation: HibernationSection,
    /// Where workspaces live (docs/workspaces.md); which tenants have them, and their size, is each tenant's `workspaces`.
    #[serde(default, skip_serializing_if = "WorkspacesSection::is_empty")]
    pub workspaces: WorkspacesSection,
    /// Bounds on snapshots of kernels (docs/snapshots.md).
    #[serde(default, skip_serializing_if = "SnapshotsSection::is_empty")]
    pub snapshots: SnapshotsSection,
    /// What every tenant has unless its own table says otherwise (a tenant entry's type; without
    /// `[[tenants]]`, the settings of the one tenant `default`).
    #[serde(default, skip_serializing_if = "TenantEntry::is_empty")]
    pub tenant_defaults: TenantEntry,
    /// The tenants, each with the tenants file's keys (`name`, `token_sha256` or `token`, ...).
    /// Without any, the server has one tenant `default` whose token is KERNELBOX_TOKEN.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantEntry>,
}

/// `[server]`: The server: where it listens, how many kernels it runs, its other listeners.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    /// Address to listen on (HOST:PORT; default 127.0.0.1:8080). A per-host value: the flag overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Directory of the durable owner catalog, created if missing (default: $XDG_STATE_HOME/kernelbox, else ~/.local/state/kernelbox). One server per directory. A per-host value: the flag overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// Live kernels across all tenants: a hard cap, shared fairly between tenants (default 32).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kernels: Option<u64>,
    /// A kernel idle this long is reaped (default 30m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<HumanDuration>,
    /// On SIGTERM, how long running cells may take to finish before they are stopped (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout: Option<HumanDuration>,
    /// Serve /metrics only on this address (HOST:PORT), to anyone: make it a private one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics_listen: Option<String>,
    /// Serve the E2B-compatible API on this address (HOST:PORT) (docs/e2b.md; off without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2b_listen: Option<String>,
    /// Serve /metrics on the API listener to anyone, without a token (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_metrics: Option<bool>,
    /// Serve the operator's console at /console (docs/console.md; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub console: Option<bool>,
    /// Send OpenTelemetry traces to this OTLP/HTTP receiver (its base URL, e.g. http://collector:4318).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub otlp_endpoint: Option<String>,
    /// An MCP session on /v1/mcp with no message for this long ends, and its kernels go (default 30m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_idle_timeout: Option<HumanDuration>,
    /// MCP sessions one tenant may hold open at once on /v1/mcp (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mcp_max_sessions: Option<u64>,
    /// Host directory shared read-only with every kernel where file transfers meet their kernel's helper; `none`: the engine's exec streams.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_sockets: Option<PathBuf>,
    /// Extra labels KEY = VALUE on everything created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
}

impl ServerSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[kernels]`: What every kernel is made from and what one cell may take.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct KernelsSection {
    /// Image to run kernels from (default kernelbox/kernel:latest); a tenant's `image` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// OCI runtime of the kernels: runc (default) or runsc (gVisor); a tenant's `runtime` overrides it (docs/runtimes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Cell timeout (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<HumanDuration>,
    /// Longest timeout a request may ask for (default: the larger of `timeout` and 1h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_timeout: Option<HumanDuration>,
    /// How long an interrupted cell may take to stop before its kernel is killed (default 5s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interrupt_grace: Option<HumanDuration>,
    /// Memory limit per kernel (default 512m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    /// CPUs per kernel (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Process/thread limit per kernel (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<i64>,
    /// Bind-mount this directory as the working directory (project mode) instead of a staging volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<PathBuf>,
    /// Cap on one file upload into a kernel (default 100m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_upload: Option<Size>,
    /// Largest rich result inline, as JSON (default 5m); a larger one is saved to a file in the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_bytes: Option<Size>,
    /// Largest total of one cell's rich results (default 20m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_cell_bytes: Option<Size>,
}

impl KernelsSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[limits]`: Bounds on connections and responses (docs/reliability.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsSection {
    /// A request's headers must arrive in full within this time of their first byte (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_timeout: Option<HumanDuration>,
    /// A connection's first request headers must arrive within this time of the accept (default 3s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_header_timeout: Option<HumanDuration>,
    /// A connection with no request in flight is closed after this long idle (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_timeout: Option<HumanDuration>,
    /// A request's body must arrive in full within this time of its headers (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_timeout: Option<HumanDuration>,
    /// A response whose write blocked this long has its connection closed (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_timeout: Option<HumanDuration>,
    /// Most connections open at once, API and metrics listeners together (default 1024).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u64>,
    /// Most connections open at once without a valid token yet (default: a quarter of max_connections).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unauthenticated_connections: Option<u64>,
    /// Most of those from one address (an IPv4 address or an IPv6 /64); 0: no cap (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unauthenticated_per_address: Option<u64>,
    /// A file download read slower than this many bytes per second is cut once download_rate_grace has passed; 0: no minimum (default 64k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_download_rate: Option<Size>,
    /// How long a file download runs before min_download_rate applies (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub download_rate_grace: Option<HumanDuration>,
    /// Bytes of responses one tenant may have built and its clients not yet read (default 64m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_results_per_tenant: Option<Size>,
    /// The same for all tenants together (default 512m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pending_results: Option<Size>,
    /// A response read slower than this many bytes per second is cut once send_rate_grace has passed; 0: no minimum (default 64k).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_send_rate: Option<Size>,
    /// How long a response may have bytes waiting before min_send_rate applies (default 30s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub send_rate_grace: Option<HumanDuration>,
}

impl LimitsSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[pool]`: The warm pool: kernels kept started for new owners.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PoolSection {
    /// Kernels kept ready (default 4, or server.max_kernels if lower; 0 turns the pool off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// A pooled kernel older than this is replaced (default 15m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<HumanDuration>,
    /// Modules each pooled kernel imports before it is offered (e.g. ["numpy", "pandas"]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preload: Option<Vec<String>>,
    /// Kernels kept ready per language other than Python, e.g. { bash = 1, javascript = 1 } (default none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub languages: Option<BTreeMap<String, u64>>,
}

impl PoolSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[egress]`: The egress proxy of kernels with a network policy (docs/reliability.md, "Network egress"); each tenant's policy is its `network`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct EgressSection {
    /// CA bundle mounted read-only into kernels with a network policy (default: the host's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<PathBuf>,
    /// Egress connections one kernel may have open at once (default 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connections: Option<u64>,
    /// Egress bytes per second one kernel may move (default 50m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<Size>,
    /// Append one JSON line per egress connection to this file (default: the log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<PathBuf>,
    /// Credentials added at the boundary: the JSON file of each tenant's secrets and rules (its values inline or {"env": "VAR"}; docs/reliability.md, "Credentials at the boundary").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets: Option<PathBuf>,
    /// Where the kernelbox egress CA is kept (default: the state directory's egress-ca).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_dir: Option<PathBuf>,
    /// Replace the egress CA with a new one at start (default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_rotate: Option<bool>,
}

impl EgressSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[cluster]`: Joining a kernelbox cluster (docs/cluster.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    /// The cluster catalog's PostgreSQL URL (postgres://USER:PASSWORD@HOST:PORT/DB): inline, { file = "..." } or { env = "..." }.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<Secret>,
    /// This node's name in the cluster (default: the host name). A per-host value: the flag overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// How the other nodes reach this one, http://ADDR:PORT. A per-host value: the flag overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// How long a node's cluster lease lasts past its last renewal (default 10s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ttl: Option<HumanDuration>,
    /// A node that cannot renew its lease fences itself this long before it could expire (default 3s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fence_margin: Option<HumanDuration>,
    /// The token of the cluster's admin routes (GET /v1/nodes, POST /v1/nodes/NODE/drain): inline, { file = "..." } or { env = "..." }.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<Secret>,
    /// A draining node's sessions still live this long after the drain began are ended (docs/cluster.md, "Draining and upgrades").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_deadline: Option<HumanDuration>,
}

impl ClusterSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[audit]`: Where the audit trail goes (docs/usage.md, "Audit trail"); who is audited is each tenant's `audit`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditSection {
    /// A file (appended to) or `-` for standard output (default: the state directory's audit.log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// The audit file is rotated when it reaches this size (default 64m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rotate: Option<Size>,
    /// Rotated audit files kept (default 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<u64>,
}

impl AuditSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[hibernation]`: Bounds on hibernated kernels (docs/runtimes.md, "Hibernation"); which tenants hibernate is each tenant's `hibernate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HibernationSection {
    /// Most hibernated kernels kept on the host; past it the oldest checkpoint goes (default 256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// A checkpoint older than this is discarded and its loss reported (default 24h; 7d at most).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<HumanDuration>,
}

impl HibernationSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[snapshots]`: Bounds on snapshots of kernels (docs/snapshots.md).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotsSection {
    /// Most snapshots one tenant keeps; the next is refused, `snapshot_limit` (default 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
    /// Most bytes of one tenant's snapshots; a snapshot past it is refused and removed (default 4g).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_bytes: Option<Size>,
    /// A snapshot older than this is removed (default 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<HumanDuration>,
}

impl SnapshotsSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[workspaces]`: Where workspaces live (docs/workspaces.md); which tenants have them, and their size, is each tenant's `workspaces`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesSection {
    /// Directory of the workspaces' disk images (default: the state directory's workspaces).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
    /// The most bytes of quota all workspaces of this host may add up to (default: what the directory's disk can hold).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<Size>,
}

impl WorkspacesSection {
    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}
