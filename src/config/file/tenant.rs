//! One tenant of the configuration file: a `[[tenants]]` table, with the tenants file's key
//! names (`src/server/tenants/mod.rs`), so a tenant moves from the JSON file into the TOML one
//! unchanged. `[tenant_defaults]` has the same type: every key a tenant leaves out is taken
//! from it, whole (a tenant's `workspaces` table replaces the default one, it is not merged).

use std::borrow::Cow;

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::values::{HumanDuration, Secret, Size};

/// A tenant (`[[tenants]]`), or the defaults of every tenant (`[tenant_defaults]`, where
/// `name`, `token` and `token_sha256` are refused).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TenantEntry {
    /// The tenant's name: the namespace of every owner it creates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// SHA-256 of the tenant's bearer token, 64 hex characters (`printf %s TOKEN | sha256sum`).
    /// Give this or `token`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_sha256: Option<String>,
    /// The tenant's bearer token itself (inline, `{ file = "..." }` or `{ env = "..." }`), hashed
    /// at load. Give this or `token_sha256`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// Live kernels the tenant may hold at once (1 to 100000; default: only the host's cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_kernels: Option<u64>,
    /// Kernels the tenant keeps against other tenants' demand, in place of its fair share of the
    /// host's cap (at most its max_kernels; the reservations add up to at most the host's cap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reserved: Option<u64>,
    /// The tenant's tool endpoint and the tools its cells may call (docs/http-api.md);
    /// `false`: none, whatever `[tenant_defaults]` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<OrOff<ToolsEntry>>,
    /// The image the tenant's kernels run (default: the server's `kernels.image`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The tenant's network egress policy (docs/reliability.md, "Network egress"); without it
    /// the tenant's kernels have no network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkEntry>,
    /// The OCI runtime of the tenant's kernels, `runc` or `runsc` (default: the server's
    /// `kernels.runtime`; docs/runtimes.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Every session of the tenant gets a workspace: its /work kept past its kernel
    /// (docs/workspaces.md); `false`: none, whatever `[tenant_defaults]` gives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspaces: Option<OrOff<WorkspacesEntry>>,
    /// The tenant may read every tenant's usage (`GET /v1/usage`, docs/usage.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage_admin: Option<bool>,
    /// The tenant's cells and commands go to the audit trail: `true` (hashes of the code) or
    /// `{ code = true }` (the code too; docs/usage.md, "Audit trail").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit: Option<AuditEntry>,
    /// The most one session of the tenant may ask for in its settings (default: the server's
    /// values, which a session may only lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_limits: Option<SessionLimitsEntry>,
    /// The tenant's idle kernels are checkpointed and stopped instead of reaped (runsc only;
    /// docs/runtimes.md, "Hibernation").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernate: Option<bool>,
}

impl TenantEntry {
    /// This entry with every key it leaves out taken from `defaults`.
    pub fn with_defaults(&self, defaults: &TenantEntry) -> TenantEntry {
        let d = defaults.clone();
        let t = self.clone();
        TenantEntry {
            name: t.name.or(d.name),
            token_sha256: t.token_sha256.or(d.token_sha256),
            token: t.token.or(d.token),
            max_kernels: t.max_kernels.or(d.max_kernels),
            reserved: t.reserved.or(d.reserved),
            tools: t.tools.or(d.tools),
            image: t.image.or(d.image),
            network: t.network.or(d.network),
            runtime: t.runtime.or(d.runtime),
            workspaces: t.workspaces.or(d.workspaces),
            usage_admin: t.usage_admin.or(d.usage_admin),
            audit: t.audit.or(d.audit),
            session_limits: t.session_limits.or(d.session_limits),
            hibernate: t.hibernate.or(d.hibernate),
        }
    }

    /// This entry as the tenants file writes it: a table turned off (`false`) is left out.
    pub fn without_off(mut self) -> TenantEntry {
        if matches!(self.tools, Some(OrOff::Off(_))) {
            self.tools = None;
        }
        if matches!(self.workspaces, Some(OrOff::Off(_))) {
            self.workspaces = None;
        }
        self
    }

    /// True when no key is set.
    pub fn is_empty(&self) -> bool {
        self == &TenantEntry::default()
    }
}

/// A tenant's tool endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ToolsEntry {
    /// `http://host:port/path` the server POSTs each tool call to.
    pub url: String,
    /// Tool names the tenant's cells may call (Python identifiers).
    pub allow: Vec<String>,
    /// How long one call may take, in seconds (0 to 3600; default 60).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<f64>,
}

/// A network egress policy: entries are presets (`pypi`), hosts (`example.com`,
/// `*.example.com`), any host (`*`) or address ranges (`203.0.113.0/24`), each optionally
/// with `:PORT`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NetworkEntry {
    /// Destinations allowed.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Destinations refused even where allowed.
    #[serde(default)]
    pub deny: Vec<String>,
}

/// A tenant's workspaces.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WorkspacesEntry {
    /// Size of each workspace (at least 4m; default 1g); a cell writing past it gets ENOSPC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<Size>,
    /// A workspace unused this long is deleted (default 7d).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<HumanDuration>,
    /// Workspaces the tenant may hold at once (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<u64>,
}

/// A tenant's audit: `true`, `false`, or `{ code = true }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum AuditEntry {
    /// `true`: hashes of the code; `false`: not audited.
    On(bool),
    /// `{ code = true }`: the code itself beside its hash.
    Policy(AuditPolicyEntry),
}

/// `{ code = true }`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuditPolicyEntry {
    /// Record each cell's code itself beside its hash (never its output).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<bool>,
}

/// The most one session may ask for in its settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionLimitsEntry {
    /// Memory (at least 64m; default: `kernels.memory`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Size>,
    /// CPUs (default: `kernels.cpus`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Idle timeout (default: `server.idle_timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<HumanDuration>,
}

/// A tenant's table, or `false`: none, over the one `[tenant_defaults]` gives (a tenant left
/// out of its defaults' workspaces or tools).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum OrOff<T> {
    /// `false`.
    Off(Off),
    /// The table.
    On(T),
}

impl<T> OrOff<T> {
    /// The table, unless turned off.
    pub fn on(&self) -> Option<&T> {
        match self {
            OrOff::On(t) => Some(t),
            OrOff::Off(_) => None,
        }
    }
}

/// `false` (and only `false`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Off;

impl Serialize for Off {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(false)
    }
}

impl<'de> Deserialize<'de> for Off {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Off, D::Error> {
        match bool::deserialize(d)? {
            false => Ok(Off),
            true => Err(serde::de::Error::custom(
                "`true` is not a table: give the table, or `false` for none",
            )),
        }
    }
}

impl JsonSchema for Off {
    fn schema_name() -> Cow<'static, str> {
        "Off".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({"description": "`false`: none.", "const": false})
    }
}
