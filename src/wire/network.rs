//! A network egress policy as the API carries it (`docs/reliability.md`, "Network egress"): the
//! `network` of a tenant in the tenants file, of an execute body, and of
//! `PUT /v1/sessions/{session}/network`. Entries are text here; `src/egress/policy.rs` parses
//! and matches them.

use serde::{Deserialize, Serialize};

/// `{"allow": [ENTRY...], "deny": [ENTRY...]}`. An entry is a preset name (`pypi`), a host
/// name (`example.com`, `*.example.com`) or an address range (`203.0.113.0/24`, `127.0.0.1`),
/// each optionally with `:PORT`. Deny wins over allow; no allow entry means no network.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "NetworkPolicy")]
pub struct NetworkPolicy {
    /// Destinations allowed: preset names, host names (`*.` for subdomains), address ranges,
    /// each optionally with `:PORT`.
    #[serde(default)]
    pub allow: Vec<String>,
    /// Destinations refused even when allowed, in the same syntax.
    #[serde(default)]
    pub deny: Vec<String>,
}

impl NetworkPolicy {
    /// True when nothing is allowed: a kernel under it has no network (`network_mode: none`).
    pub fn is_none(&self) -> bool {
        self.allow.is_empty()
    }
}
