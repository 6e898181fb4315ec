//! A session's settings as the API carries them (`docs/http-api.md`, "Session settings"): the
//! body of `PUT /v1/sessions/{session}/settings` and what `GET` of it answers. `src/settings.rs`
//! checks them against the tenant's maximums.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What a session's kernels are started with. Every field is optional; a `PUT` replaces the
/// whole value (an absent field is the server's default). Unknown fields are refused.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "SessionSettings")]
pub struct SessionSettings {
    /// Environment variables of the session's kernels (names `[A-Za-z_][A-Za-z0-9_]*`, not
    /// `KERNELBOX_*` nor one kernelbox sets); never in the containers' labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Memory limit of each kernel: a size such as `"512m"` or `"2g"`, or bytes; at most the
    /// tenant's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "size_schema")]
    pub memory: Option<serde_json::Value>,
    /// CPU limit of each kernel, in CPUs (`0.5`, `2`); at most the tenant's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Seconds a kernel of the session may stay idle before it is reaped; at most the
    /// tenant's maximum.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout: Option<f64>,
    /// Metadata of the session: `GET /v1/kernels?label=k:v` and `kernelbox ps --label k=v`
    /// filter on them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

/// What `PUT /v1/sessions/{session}/settings` answers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(rename = "SettingsApplied")]
pub struct SettingsApplied {
    /// The session's settings now (as `GET` answers them).
    pub settings: SessionSettings,
    /// True when a live kernel of the session runs with other environment, memory or CPU
    /// settings: they apply from its next kernel (reset it, or clear the session). Labels and
    /// the idle timeout apply at once.
    pub restart_required: bool,
}

/// A size: a string such as `512m` or a number of bytes.
fn size_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": ["string", "integer"]})
}
