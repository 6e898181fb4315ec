//! Tenants: who may call the server, with which bearer token, how many kernels, which tools.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Tenants`], [`Tenant`]: the tenants file parsed and checked, a caller found by its token |
//! | `admin.rs` | [`AdminToken`]: the admin token (`--admin-token`) as the operator's routes check it |
//! | `live.rs` | the running server's tenants, one value swapped whole by a reload |
//! | `session_limits.rs` | a tenant's `session_limits`: the most its sessions' settings may ask for |
//! | `workspaces.rs` | a tenant's `workspaces`: its sessions' workspaces and their policy |
//! | `tests.rs` | unit tests |
//!
//! The tenants file is JSON:
//!
//! ```json
//! {"tenants": [{"name": "acme", "token_sha256": "<hex>", "max_kernels": 8, "reserved": 2,
//!               "image": "kernelbox/kernel-datascience:latest",
//!               "tools": {"url": "http://127.0.0.1:9000/tools", "allow": ["web_search"]},
//!               "network": {"allow": ["pypi"], "deny": []}, "runtime": "runsc"}]}
//! ```
//!
//! `runtime` is the OCI runtime of the tenant's kernels, `runc` or `runsc` (default: the
//! server's `--runtime`; `docs/runtimes.md`).
//! `workspaces` (`{"quota": "1g", "ttl": "7d", "max": 100}`, `workspaces.rs`) gives every
//! session of the tenant a workspace (`docs/workspaces.md`).
//!
//! `session_limits` (`{"memory": "4g", "cpus": 2, "idle_timeout": "4h"}`, `session_limits.rs`)
//! is the most a session's own settings may ask for (default: the server's values).
//!
//! `audit` (`true`, or `{"code": true}` to record the code itself) puts the tenant's cells
//! and commands in the audit trail (`docs/usage.md`, "Audit trail").
//!
//! `network` is the tenant's egress policy (`docs/reliability.md`, "Network egress"), the one
//! policy type of the API (`crate::wire::NetworkPolicy`), parsed at load: a bad entry refuses
//! the file. A tenant without one has no network.
//!
//! Only the SHA-256 of each token is stored. Every error names the file and the field.
//!
//! The running server holds its tenants in [`live::LiveTenants`], swapped whole by a reload
//! (`crate::server::reload`; docs/http-api.md, "Reloading the tenants").

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use crate::owner::validate_name;

mod admin;
pub mod live;

pub use admin::AdminToken;

/// Largest tenants file read: a hundred thousand tenants of a few hundred bytes each fit; a
/// larger file (or a device such as `/dev/zero`) is refused rather than read into memory whole.
pub const MAX_TENANTS_FILE_BYTES: u64 = 32 * 1024 * 1024;

/// Default time a tool endpoint has to answer one call.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// A tenants file (or value) that cannot be used; names the file and the field.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("tenants file {}: {field}: {reason}", file.display())]
pub struct TenantsError {
    /// The file read (or `<inline>`).
    pub file: PathBuf,
    /// Path of the offending field, e.g. `tenants[0].token_sha256`.
    pub field: String,
    /// Why it was refused.
    pub reason: String,
}

/// Where a tenant's tool calls go and which tools its cells may call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsConfig {
    /// `http://host:port/path` the server POSTs each call to.
    pub url: String,
    /// Tool names the tenant's cells may call.
    pub allow: BTreeSet<String>,
    /// How long one call may take.
    pub timeout: Duration,
}

/// One tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tenant {
    /// Namespace of every owner the tenant creates.
    pub name: String,
    /// SHA-256 of the tenant's bearer token.
    pub token_sha256: [u8; 32],
    /// Live kernels the tenant may hold at once (`None`: only the global cap applies).
    pub max_kernels: Option<usize>,
    /// Kernels the tenant keeps against other tenants' demand, in place of its fair share of
    /// the host's cap (`None`: the fair share).
    pub reserved: Option<usize>,
    /// The tenant's tool endpoint, if it has one.
    pub tools: Option<ToolsConfig>,
    /// The image the tenant's kernels run (`None`: the server's `--image`).
    pub image: Option<String>,
    /// The tenant's network egress policy (`None`: no network).
    pub network: Option<crate::wire::NetworkPolicy>,
    /// The runtime the tenant's kernels run under (`None`: the server's `--runtime`;
    /// `docs/runtimes.md`).
    pub runtime: Option<crate::config::KernelRuntime>,
    /// The tenant's workspaces (`None`: its sessions' files live and die with their kernel;
    /// `docs/workspaces.md`).
    pub workspaces: Option<crate::config::WorkspacePolicy>,
    /// The tenant may read every tenant's usage (`GET /v1/usage`, docs/usage.md).
    pub usage_admin: bool,
    /// The tenant's cells and commands go to the audit trail (`None`: they do not;
    /// `docs/usage.md`, "Audit trail").
    pub audit: Option<crate::audit::AuditPolicy>,
    /// The most the tenant's sessions may ask for in their settings (`src/settings.rs`).
    pub session_limits: crate::settings::Limits,
    /// The tenant's idle kernels hibernate (its runtime must be runsc; `docs/runtimes.md`,
    /// "Hibernation").
    pub hibernate: bool,
}

impl Tenant {
    /// A tenant identified by a plain token (hashed here).
    pub fn with_token(name: &str, token: &str) -> Tenant {
        Tenant {
            name: name.to_string(),
            token_sha256: token_hash(token),
            max_kernels: None,
            reserved: None,
            tools: None,
            image: None,
            network: None,
            runtime: None,
            workspaces: None,
            usage_admin: false,
            audit: None,
            session_limits: crate::settings::Limits::default(),
            hibernate: false,
        }
    }

    /// The limits every request of the tenant carries to the orchestrator.
    pub fn limits(&self) -> crate::registry::TenantLimits {
        crate::registry::TenantLimits {
            max_kernels: self.max_kernels,
            reserved: self.reserved,
            // Decided by the orchestrator from the configuration (`Config::hibernate`).
            hibernate: false,
        }
    }
}

/// A tenant's `audit`: `true` (hashes of the code), `{"code": true}` (the code too), or
/// absent, `false` or `null` (not audited); the error says which field and why.
fn parse_audit(
    value: Option<&Value>,
) -> Result<Option<crate::audit::AuditPolicy>, (String, String)> {
    use crate::audit::AuditPolicy;
    match value {
        None | Some(Value::Null) | Some(Value::Bool(false)) => Ok(None),
        Some(Value::Bool(true)) => Ok(Some(AuditPolicy::default())),
        Some(Value::Object(obj)) => {
            if let Some(key) = obj.keys().find(|k| k.as_str() != "code") {
                return Err((format!(".{key}"), "unknown field (use code)".into()));
            }
            match obj.get("code") {
                None | Some(Value::Null) => Ok(Some(AuditPolicy::default())),
                Some(Value::Bool(code)) => Ok(Some(AuditPolicy { code: *code })),
                Some(_) => Err((".code".into(), "must be true or false".into())),
            }
        }
        Some(_) => Err((
            String::new(),
            "must be true, false or {\"code\": true}".into(),
        )),
    }
}

/// The SHA-256 of a bearer token.
pub fn token_hash(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// A fresh random bearer token (64 hex characters).
pub fn generate_token() -> String {
    let bytes: [u8; 32] = rand::random();
    hex::encode(bytes)
}

/// The set of tenants, looked up by token hash.
#[derive(Debug, Clone, Default)]
pub struct Tenants {
    by_hash: HashMap<[u8; 32], Arc<Tenant>>,
    names: Vec<String>,
    /// Where the tenants came from (for errors).
    file: PathBuf,
}

impl Tenants {
    /// Builds the set, refusing duplicate names or tokens and bad names.
    pub fn new(tenants: Vec<Tenant>) -> Result<Tenants, TenantsError> {
        let err = |i: usize, field: &str, reason: String| TenantsError {
            file: PathBuf::from("<inline>"),
            field: format!("tenants[{i}].{field}"),
            reason,
        };
        if tenants.is_empty() {
            return Err(TenantsError {
                file: PathBuf::from("<inline>"),
                field: "tenants".into(),
                reason: "must list at least one tenant".into(),
            });
        }
        let mut set = Tenants {
            file: PathBuf::from("<inline>"),
            ..Tenants::default()
        };
        for (i, tenant) in tenants.into_iter().enumerate() {
            validate_name("tenant", &tenant.name).map_err(|e| err(i, "name", e.to_string()))?;
            if set.names.contains(&tenant.name) {
                return Err(err(
                    i,
                    "name",
                    format!("duplicate tenant {:?}", tenant.name),
                ));
            }
            if set.by_hash.contains_key(&tenant.token_sha256) {
                return Err(err(
                    i,
                    "token_sha256",
                    "another tenant has the same token".into(),
                ));
            }
            if tenant.max_kernels == Some(0) {
                return Err(err(i, "max_kernels", "must be at least 1".into()));
            }
            if let (Some(reserved), Some(max)) = (tenant.reserved, tenant.max_kernels) {
                if reserved > max {
                    return Err(err(
                        i,
                        "reserved",
                        format!("{reserved} is more than the tenant's max_kernels ({max})"),
                    ));
                }
            }
            set.names.push(tenant.name.clone());
            set.by_hash.insert(tenant.token_sha256, Arc::new(tenant));
        }
        Ok(set)
    }

    /// Reads and validates a tenants file.
    pub fn load(path: &Path) -> Result<Tenants, TenantsError> {
        use std::io::Read as _;
        let unreadable = |reason: String| TenantsError {
            file: path.to_path_buf(),
            field: "(file)".into(),
            reason,
        };
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_TENANTS_FILE_BYTES + 1).read_to_string(&mut text))
            .map_err(|e| unreadable(format!("cannot read: {e}")))?;
        if text.len() as u64 > MAX_TENANTS_FILE_BYTES {
            return Err(unreadable(format!(
                "larger than {MAX_TENANTS_FILE_BYTES} bytes"
            )));
        }
        Tenants::parse(&text, path)
    }

    /// Parses and validates tenants-file JSON; `file` only names the source in errors.
    pub fn parse(text: &str, file: &Path) -> Result<Tenants, TenantsError> {
        let bad = |field: String, reason: String| TenantsError {
            file: file.to_path_buf(),
            field,
            reason,
        };
        let root: Value = serde_json::from_str(text)
            .map_err(|e| bad("(file)".into(), format!("not valid JSON: {e}")))?;
        Tenants::parse_value(&root, file)
    }

    /// The `[[tenants]]` of a configuration file (`crate::config::file`), `[tenant_defaults]`
    /// already applied: each token given as a secret is read and hashed, then every entry goes
    /// through the tenants file's own checks; `file` names the configuration file in errors.
    pub fn from_entries(
        entries: &[crate::config::file::TenantEntry],
        file: &Path,
    ) -> Result<Tenants, TenantsError> {
        let bad = |field: String, reason: String| TenantsError {
            file: file.to_path_buf(),
            field,
            reason,
        };
        let mut list = Vec::with_capacity(entries.len());
        for (i, entry) in entries.iter().enumerate() {
            let mut entry = entry.clone().without_off();
            if let Some(token) = entry.token.take() {
                if entry.token_sha256.is_some() {
                    return Err(bad(
                        format!("tenants[{i}].token"),
                        "give token or token_sha256, not both".into(),
                    ));
                }
                let token = token
                    .resolve()
                    .map_err(|reason| bad(format!("tenants[{i}].token"), reason))?;
                entry.token_sha256 = Some(hex::encode(token_hash(&token)));
            }
            list.push(
                serde_json::to_value(&entry)
                    .map_err(|e| bad(format!("tenants[{i}]"), e.to_string()))?,
            );
        }
        let root = serde_json::json!({ "tenants": list });
        Tenants::parse_value(&root, file)
    }

    /// Validates a tenants document already parsed; `file` only names the source in errors.
    fn parse_value(root: &Value, file: &Path) -> Result<Tenants, TenantsError> {
        let bad = |field: String, reason: String| TenantsError {
            file: file.to_path_buf(),
            field,
            reason,
        };
        let root = root
            .as_object()
            .ok_or_else(|| bad("(root)".into(), "must be a JSON object".into()))?;
        only_keys(root, &["tenants"], "", &bad)?;
        let list = root
            .get("tenants")
            .ok_or_else(|| bad("tenants".into(), "missing".into()))?
            .as_array()
            .ok_or_else(|| bad("tenants".into(), "must be an array".into()))?;
        let mut tenants = Vec::new();
        for (i, entry) in list.iter().enumerate() {
            let at = format!("tenants[{i}]");
            let obj = entry
                .as_object()
                .ok_or_else(|| bad(at.clone(), "must be an object".into()))?;
            only_keys(
                obj,
                &[
                    "name",
                    "token_sha256",
                    "max_kernels",
                    "reserved",
                    "tools",
                    "image",
                    "network",
                    "runtime",
                    "workspaces",
                    "usage_admin",
                    "audit",
                    "session_limits",
                    "hibernate",
                ],
                &at,
                &bad,
            )?;
            let name = required_str(obj, "name", &at, &bad)?;
            let hash_hex = required_str(obj, "token_sha256", &at, &bad)?;
            let token_sha256: [u8; 32] = hex::decode(hash_hex.trim())
                .ok()
                .and_then(|b| b.try_into().ok())
                .ok_or_else(|| {
                    bad(
                        format!("{at}.token_sha256"),
                        "must be 64 hex characters (sha256 of the token, e.g. `printf %s TOKEN | sha256sum`)".into(),
                    )
                })?;
            let max_kernels = match obj.get("max_kernels") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().filter(|n| *n >= 1 && *n <= 100_000).ok_or_else(
                    || {
                        bad(
                            format!("{at}.max_kernels"),
                            "must be an integer from 1 to 100000".into(),
                        )
                    },
                )? as usize),
            };
            let reserved = match obj.get("reserved") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_u64().filter(|n| *n <= 100_000).ok_or_else(|| {
                    bad(
                        format!("{at}.reserved"),
                        "must be an integer from 0 to 100000".into(),
                    )
                })? as usize),
            };
            let tools = match obj.get("tools") {
                None | Some(Value::Null) => None,
                Some(v) => Some(parse_tools(v, &format!("{at}.tools"), &bad)?),
            };
            let image = match obj.get("image") {
                None | Some(Value::Null) => None,
                Some(Value::String(image)) => Some(
                    check_image(image)
                        .map_err(|reason| bad(format!("{at}.image"), reason))?
                        .to_string(),
                ),
                Some(_) => return Err(bad(format!("{at}.image"), "must be a string".into())),
            };
            let network = match obj.get("network") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    Some(parse_network(v).map_err(|reason| bad(format!("{at}.network"), reason))?)
                }
            };
            let runtime = match obj.get("runtime") {
                None | Some(Value::Null) => None,
                Some(Value::String(runtime)) => Some(
                    crate::config::KernelRuntime::parse(runtime)
                        .map_err(|reason| bad(format!("{at}.runtime"), reason))?,
                ),
                Some(_) => return Err(bad(format!("{at}.runtime"), "must be a string".into())),
            };
            let workspaces = match obj.get("workspaces") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    Some(workspaces::parse_workspaces(v).map_err(|(field, reason)| {
                        bad(format!("{at}.workspaces{field}"), reason)
                    })?)
                }
            };
            let usage_admin = optional_bool(obj, "usage_admin", &at, &bad)?;
            let hibernate = optional_bool(obj, "hibernate", &at, &bad)?;
            let audit = parse_audit(obj.get("audit"))
                .map_err(|(field, reason)| bad(format!("{at}.audit{field}"), reason))?;
            let session_limits = match obj.get("session_limits") {
                None | Some(Value::Null) => crate::settings::Limits::default(),
                Some(v) => session_limits::parse_session_limits(v).map_err(|(field, reason)| {
                    bad(format!("{at}.session_limits{field}"), reason)
                })?,
            };
            tenants.push(Tenant {
                hibernate,
                session_limits,
                audit,
                usage_admin,
                workspaces,
                name: name.to_string(),
                token_sha256,
                max_kernels,
                reserved,
                tools,
                image,
                network,
                runtime,
            });
        }
        let mut set = Tenants::new(tenants).map_err(|e| TenantsError {
            file: file.to_path_buf(),
            ..e
        })?;
        set.file = file.to_path_buf();
        Ok(set)
    }

    /// Checks that the reservations fit the host's kernel cap (`kernelbox serve
    /// --max-kernels`): their sum may not exceed it, or a reservation could not be honoured.
    pub fn check_reserved(&self, host_max: usize) -> Result<(), TenantsError> {
        let total: usize = self.by_hash.values().filter_map(|t| t.reserved).sum();
        if total > host_max {
            return Err(TenantsError {
                file: self.file.clone(),
                field: "tenants[*].reserved".into(),
                reason: format!(
                    "the reservations add up to {total}, more than the host's kernel cap \
                     (--max-kernels {host_max})"
                ),
            });
        }
        Ok(())
    }

    /// The tenant whose token this is.
    pub fn authenticate(&self, token: &str) -> Option<Arc<Tenant>> {
        self.by_hash.get(&token_hash(token)).cloned()
    }

    /// Every image a tenant names (the server checks each is on the engine before serving).
    pub fn images(&self) -> BTreeSet<&str> {
        self.by_hash
            .values()
            .filter_map(|t| t.image.as_deref())
            .collect()
    }

    /// Every tenant's network policy that allows something (what `kernelbox serve` hands the
    /// egress configuration); tenants without one have no network.
    pub fn networks(&self) -> std::collections::BTreeMap<String, crate::wire::NetworkPolicy> {
        self.by_hash
            .values()
            .filter_map(|t| {
                let policy = t.network.as_ref().filter(|p| !p.is_none())?;
                Some((t.name.clone(), policy.clone()))
            })
            .collect()
    }

    /// Every tenant that names its own runtime (what `kernelbox serve` hands
    /// `Config::tenant_runtimes`).
    pub fn runtimes(&self) -> std::collections::BTreeMap<String, crate::config::KernelRuntime> {
        self.by_hash
            .values()
            .filter_map(|t| Some((t.name.clone(), t.runtime?)))
            .collect()
    }

    /// Each tenant's `session_limits`, for those that set any.
    pub fn session_limits(&self) -> std::collections::BTreeMap<String, crate::settings::Limits> {
        self.by_hash
            .values()
            .filter(|t| t.session_limits != crate::settings::Limits::default())
            .map(|t| (t.name.clone(), t.session_limits))
            .collect()
    }

    /// The tenants whose idle kernels hibernate (`"hibernate": true`).
    pub fn hibernating(&self) -> std::collections::BTreeSet<String> {
        self.by_hash
            .values()
            .filter(|t| t.hibernate)
            .map(|t| t.name.clone())
            .collect()
    }

    /// Every tenant's workspace policy (what `kernelbox serve` hands the workspaces'
    /// configuration); tenants without one have no workspaces.
    pub fn workspaces(&self) -> std::collections::BTreeMap<String, crate::config::WorkspacePolicy> {
        self.by_hash
            .values()
            .filter_map(|t| Some((t.name.clone(), t.workspaces?)))
            .collect()
    }

    /// Every audited tenant and how (what `kernelbox serve` hands `Config::audit`).
    pub fn audits(&self) -> std::collections::BTreeMap<String, crate::audit::AuditPolicy> {
        self.by_hash
            .values()
            .filter_map(|t| Some((t.name.clone(), t.audit?)))
            .collect()
    }

    /// Tenant names, in file order.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Number of tenants.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// The tenant named `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<Tenant>> {
        self.by_hash.values().find(|t| t.name == name)
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

type Bad<'a> = &'a dyn Fn(String, String) -> TenantsError;

fn only_keys(
    obj: &Map<String, Value>,
    keys: &[&str],
    at: &str,
    bad: Bad<'_>,
) -> Result<(), TenantsError> {
    for key in obj.keys() {
        if !keys.contains(&key.as_str()) {
            let field = if at.is_empty() {
                key.clone()
            } else {
                format!("{at}.{key}")
            };
            return Err(bad(
                field,
                format!("unknown field (expected one of: {})", keys.join(", ")),
            ));
        }
    }
    Ok(())
}

fn required_str<'v>(
    obj: &'v Map<String, Value>,
    key: &str,
    at: &str,
    bad: Bad<'_>,
) -> Result<&'v str, TenantsError> {
    match obj.get(key) {
        None => Err(bad(format!("{at}.{key}"), "missing".into())),
        Some(Value::String(s)) => Ok(s),
        Some(_) => Err(bad(format!("{at}.{key}"), "must be a string".into())),
    }
}

/// A field that is `true`, `false`, absent or `null` (false).
fn optional_bool(
    obj: &Map<String, Value>,
    key: &str,
    at: &str,
    bad: Bad<'_>,
) -> Result<bool, TenantsError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(bad(format!("{at}.{key}"), "must be true or false".into())),
    }
}

fn parse_tools(v: &Value, at: &str, bad: Bad<'_>) -> Result<ToolsConfig, TenantsError> {
    let obj = v
        .as_object()
        .ok_or_else(|| bad(at.to_string(), "must be an object".into()))?;
    only_keys(obj, &["url", "allow", "timeout_seconds"], at, bad)?;
    let url = required_str(obj, "url", at, bad)?;
    check_tool_url(url).map_err(|reason| bad(format!("{at}.url"), reason))?;
    let allow = obj
        .get("allow")
        .ok_or_else(|| bad(format!("{at}.allow"), "missing".into()))?
        .as_array()
        .ok_or_else(|| {
            bad(
                format!("{at}.allow"),
                "must be an array of tool names".into(),
            )
        })?;
    let mut names = BTreeSet::new();
    for (j, name) in allow.iter().enumerate() {
        let field = format!("{at}.allow[{j}]");
        let name = name
            .as_str()
            .ok_or_else(|| bad(field.clone(), "must be a string".into()))?;
        if !valid_tool_name(name) {
            return Err(bad(
                field,
                format!(
                    "{name:?} is not a tool name (a Python identifier of at most 64 characters)"
                ),
            ));
        }
        names.insert(name.to_string());
    }
    let timeout = match obj.get("timeout_seconds") {
        None | Some(Value::Null) => DEFAULT_TOOL_TIMEOUT,
        Some(v) => v
            .as_f64()
            .filter(|s| s.is_finite() && *s > 0.0 && *s <= 3600.0)
            .map(Duration::from_secs_f64)
            .ok_or_else(|| {
                bad(
                    format!("{at}.timeout_seconds"),
                    "must be a number of seconds in (0, 3600]".into(),
                )
            })?,
    };
    Ok(ToolsConfig {
        url: url.to_string(),
        allow: names,
        timeout,
    })
}

/// A tenant's `network`: the API's one policy type, every entry parsed as the proxy will
/// (`crate::egress::Policy::parse`), so a bad entry refuses the file at load.
fn parse_network(v: &Value) -> Result<crate::wire::NetworkPolicy, String> {
    let policy: crate::wire::NetworkPolicy = serde_json::from_value(v.clone())
        .map_err(|e| format!("must be {{\"allow\": [ENTRY...], \"deny\": [ENTRY...]}}: {e}"))?;
    crate::egress::Policy::parse(&policy).map_err(|e| e.to_string())?;
    Ok(policy)
}

/// An image reference as Docker takes it (`name[:tag]` or `name@digest`): no blanks or control
/// characters, at most 255 bytes; whether it exists is checked against the engine at start.
fn check_image(image: &str) -> Result<&str, String> {
    if image.is_empty() {
        return Err("must not be empty".into());
    }
    if image.len() > 255 || image.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{image:?} is not an image reference (e.g. kernelbox/kernel-datascience:latest)"
        ));
    }
    Ok(image)
}

/// Tool names are what a cell writes after `kernel_tools.`: Python identifiers.
pub fn valid_tool_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 64
}

/// Tool endpoints are plain `http://` URLs (typically on loopback or a compose network).
fn check_tool_url(url: &str) -> Result<(), String> {
    let uri: hyper::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(
                "https tool endpoints are not supported; use http:// on a trusted network".into(),
            )
        }
        _ => return Err(format!("{url:?} must start with http://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{url:?} has no host"));
    }
    Ok(())
}

mod session_limits;
#[cfg(test)]
mod tests;
mod workspaces;

/// The bearer token of a request, if it carries one.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.trim().split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        })
        .filter(|t| !t.is_empty())
}
