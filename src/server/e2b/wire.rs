//! E2B's request and answer bodies, field for field as its SDKs send and read them (E2B's
//! OpenAPI document, `spec/openapi.yml` in e2b-dev/E2B, and the code interpreter's server).
//! They are E2B's API, not kernelbox's: `/openapi.json` does not describe them, E2B's
//! documents do. Unknown fields are ignored, as the SDKs add fields over time.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The envd version kernelbox's sandboxes answer as: the SDK enables features by it (closing
/// stdin 0.5.2, octet-stream uploads 0.5.7, a watch event's entry 0.6.3, watching with
/// `allow_network_mounts` 0.6.4, which changes nothing here: a sandbox has no network mounts).
/// File metadata (0.6.2, `X-Metadata-*` upload headers) is refused as not available
/// (docs/e2b.md).
pub(crate) const ENVD_VERSION: &str = "0.6.4";

/// `POST /sandboxes`, `POST /v2/sandboxes`.
#[derive(Debug, Deserialize)]
pub(crate) struct NewSandbox {
    #[serde(rename = "templateID")]
    pub(crate) template_id: String,
    /// Seconds the sandbox lives.
    #[serde(default)]
    pub(crate) timeout: Option<u64>,
    #[serde(default)]
    pub(crate) metadata: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "envVars")]
    pub(crate) env_vars: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub(crate) allow_internet_access: Option<bool>,
    #[serde(default, rename = "autoPause")]
    pub(crate) auto_pause: Option<bool>,
}

/// `POST /sandboxes/{id}/timeout`, `POST .../connect`, `POST .../refreshes`: `timeout` in
/// seconds (`duration` for a refresh).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct Timeout {
    #[serde(default)]
    pub(crate) timeout: Option<u64>,
    #[serde(default)]
    pub(crate) duration: Option<u64>,
}

/// A created or connected sandbox (E2B's `Sandbox`).
#[derive(Debug, Serialize)]
pub(crate) struct Created {
    #[serde(rename = "templateID")]
    pub(crate) template_id: String,
    #[serde(rename = "sandboxID")]
    pub(crate) sandbox_id: String,
    #[serde(rename = "clientID")]
    pub(crate) client_id: String,
    #[serde(rename = "envdVersion")]
    pub(crate) envd_version: &'static str,
    #[serde(rename = "envdAccessToken")]
    pub(crate) envd_access_token: String,
    #[serde(rename = "trafficAccessToken")]
    pub(crate) traffic_access_token: String,
    /// No domain: the SDK sends per-sandbox traffic to `E2B_SANDBOX_URL`.
    pub(crate) domain: Option<String>,
}

/// A sandbox as `GET /sandboxes/{id}` and the lists answer it (E2B's `SandboxDetail` and
/// `ListedSandbox`).
#[derive(Debug, Serialize)]
pub(crate) struct Detail {
    #[serde(rename = "templateID")]
    pub(crate) template_id: String,
    pub(crate) alias: String,
    #[serde(rename = "sandboxID")]
    pub(crate) sandbox_id: String,
    #[serde(rename = "clientID")]
    pub(crate) client_id: String,
    #[serde(rename = "startedAt")]
    pub(crate) started_at: String,
    #[serde(rename = "endAt")]
    pub(crate) end_at: String,
    #[serde(rename = "envdVersion")]
    pub(crate) envd_version: &'static str,
    #[serde(rename = "cpuCount")]
    pub(crate) cpu_count: u64,
    #[serde(rename = "memoryMB")]
    pub(crate) memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    pub(crate) disk_size_mb: u64,
    /// Always `running`: kernelbox does not pause sandboxes through this API.
    pub(crate) state: &'static str,
    pub(crate) metadata: BTreeMap<String, String>,
}

/// `GET /v2/sandboxes`'s query.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct ListQuery {
    /// `k1=v1&k2=v2`, URL-encoded once more.
    #[serde(default)]
    pub(crate) metadata: Option<String>,
    /// `running`, `paused` or both, comma separated.
    #[serde(default)]
    pub(crate) state: Option<String>,
    #[serde(default, rename = "nextToken")]
    pub(crate) next_token: Option<String>,
    #[serde(default)]
    pub(crate) limit: Option<usize>,
}

/// `POST /execute` (the code interpreter).
#[derive(Debug, Deserialize)]
pub(crate) struct Execute {
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) context_id: Option<String>,
    #[serde(default)]
    pub(crate) language: Option<String>,
    #[serde(default)]
    pub(crate) env_vars: Option<BTreeMap<String, String>>,
}

/// `POST /contexts`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct NewContext {
    #[serde(default)]
    pub(crate) language: Option<String>,
    #[serde(default)]
    pub(crate) cwd: Option<String>,
}

/// A code context as `/contexts` answers it.
#[derive(Debug, Serialize)]
pub(crate) struct Context {
    pub(crate) id: String,
    pub(crate) language: String,
    pub(crate) cwd: String,
}

/// One entry of `POST /files`'s answer (E2B's `EntryInfo`).
#[derive(Debug, Serialize)]
pub(crate) struct WrittenEntry {
    pub(crate) name: String,
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    pub(crate) path: String,
}

/// `GET`, `POST /files`'s query.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct FilesQuery {
    #[serde(default)]
    pub(crate) path: Option<String>,
    #[serde(default)]
    pub(crate) username: Option<String>,
}
