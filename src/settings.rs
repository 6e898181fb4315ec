//! Per-session settings (`docs/http-api.md`, "Session settings"): environment variables, memory
//! and CPU limits, idle timeout and metadata labels of one session's kernels, checked once
//! against its tenant's maximums ([`Bounds`]) into a [`Settings`] value that the registry keeps
//! (`src/registry/`), the spawn applies (`src/kernel/spawn.rs`) and the reaper reads.
//!
//! Environment, memory and CPU apply when a kernel starts; labels and the idle timeout at once
//! (labels on the containers, for `kernelbox ps --label`, from the next kernel). A session
//! with its own environment, limits or labels never gets a pooled kernel (a pooled kernel was
//! made before its owner was known).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use crate::wire::SessionSettings;

/// Most environment variables one session may set.
pub const MAX_ENV: usize = 64;
/// Most bytes of environment (names and values) one session may set.
pub const MAX_ENV_BYTES: usize = 32 * 1024;
/// Most labels one session may carry.
pub const MAX_LABELS: usize = 16;
/// Longest label key and value, in bytes.
pub const MAX_LABEL_BYTES: usize = 128;
/// Smallest memory limit a session may ask for: the runner and a few imports fit.
pub const MIN_MEMORY_BYTES: i64 = 64 * 1024 * 1024;
/// Smallest CPU limit a session may ask for.
pub const MIN_CPUS: f64 = 0.05;
/// Sessions whose settings one tenant may have at once; past it, settings of sessions with no
/// live kernel are forgotten first (least recently set), then a new one is refused.
pub const MAX_SESSIONS_PER_TENANT: usize = 16_384;
/// Bytes of settings (environment and labels, as [`Settings::bytes`] counts them) one tenant
/// may have kept at once, under the same rule.
pub const MAX_SETTINGS_BYTES_PER_TENANT: usize = 8 * 1024 * 1024;
/// Bytes of sessions' own network policies (entries and a fixed overhead, as
/// `crate::egress::policy_bytes` counts them) one tenant may have kept at once
/// (`docs/reliability.md`, "Network egress"): past it a new session's policy is refused (429
/// `too_many_session_policies`), never an older one forgotten.
pub const MAX_NETWORK_BYTES_PER_TENANT: usize = 4 * 1024 * 1024;
/// What one session's settings count besides their environment and labels.
const SETTINGS_OVERHEAD_BYTES: usize = 256;

/// Environment variables kernelbox sets in every kernel (`src/kernel/spawn.rs`) or in a kernel
/// with network egress (`src/egress/mod.rs`): a session may not set them, nor any
/// `KERNELBOX_*`.
const RESERVED_ENV: &[&str] = &[
    "HOME",
    "LANG",
    "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "http_proxy",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "PIP_CERT",
    "CURL_CA_BUNDLE",
    "PIP_INDEX_URL",
    "PIP_USER",
    "PIP_BREAK_SYSTEM_PACKAGES",
    "PIP_DISABLE_PIP_VERSION_CHECK",
    "PIP_NO_INPUT",
];

/// The most a tenant's sessions may ask for. Without a tenant's own, the server's defaults
/// are the maximums: a session may lower them, not raise them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bounds {
    /// Largest memory limit, in bytes.
    pub memory_bytes: i64,
    /// Largest CPU limit, in CPUs.
    pub cpus: f64,
    /// Longest idle timeout.
    pub idle_timeout: Duration,
}

/// A tenant's own maximums for its sessions (the tenants file's `session_limits`, or `serve
/// --session-max-*`); a field left out is the server's default.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Largest memory limit, in bytes.
    pub memory_bytes: Option<i64>,
    /// Largest CPU limit, in billionths of a CPU.
    pub nano_cpus: Option<i64>,
    /// Longest idle timeout.
    pub idle_timeout: Option<Duration>,
}

/// The server's own memory, CPU and idle timeout: what a session's kernel runs with where
/// neither the session nor its tenant sets one (the configuration's sandbox and kernel idle
/// timeout, `Config::session_defaults`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Defaults {
    /// Memory limit, in bytes.
    pub memory_bytes: i64,
    /// CPU limit, in billionths of a CPU.
    pub nano_cpus: i64,
    /// Idle timeout.
    pub idle_timeout: Duration,
}

impl Limits {
    /// What a session of a tenant with these limits runs with where it sets nothing
    /// (`docs/http-api.md`, "Session settings"): each limit below the server's default in its
    /// place, so that `session_limits` cap every session of the tenant, not only those that
    /// set something. `None` when no limit is below its default.
    pub fn ceiling(&self, defaults: &Defaults) -> Option<Settings> {
        let ceiling = Settings {
            memory_bytes: self.memory_bytes.filter(|m| *m < defaults.memory_bytes),
            nano_cpus: self.nano_cpus.filter(|n| *n < defaults.nano_cpus),
            idle_timeout: self.idle_timeout.filter(|t| *t < defaults.idle_timeout),
            ..Settings::default()
        };
        (ceiling != Settings::default()).then_some(ceiling)
    }

    /// The bounds these limits give over the server's defaults (each default where a limit
    /// is not set).
    pub fn bounds(&self, defaults: &Defaults) -> Bounds {
        Bounds {
            memory_bytes: self.memory_bytes.unwrap_or(defaults.memory_bytes),
            cpus: self.nano_cpus.unwrap_or(defaults.nano_cpus) as f64 / 1e9,
            idle_timeout: self.idle_timeout.unwrap_or(defaults.idle_timeout),
        }
    }
}

/// A session's settings, checked.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Settings {
    /// `NAME=value` entries for the kernel's environment.
    pub env: BTreeMap<String, String>,
    /// Memory limit in bytes (`None`: the server's).
    pub memory_bytes: Option<i64>,
    /// CPU limit in billionths of a CPU (`None`: the server's).
    pub nano_cpus: Option<i64>,
    /// Idle timeout (`None`: the server's).
    pub idle_timeout: Option<Duration>,
    /// Metadata labels.
    pub labels: BTreeMap<String, String>,
}

/// Why settings were refused; the HTTP API answers 400 with [`SettingsError::code`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SettingsError {
    /// A field is malformed.
    #[error("invalid session settings: {0}")]
    Invalid(String),
    /// A field asks for more than the tenant allows.
    #[error("session settings beyond the tenant's maximum: {0}")]
    NotAllowed(String),
    /// The tenant has settings for too many sessions with live kernels.
    #[error(
        "tenant {tenant} has settings for {MAX_SESSIONS_PER_TENANT} sessions with live kernels; \
         clear some sessions first"
    )]
    TooMany {
        /// The tenant whose sessions are at the bound.
        tenant: String,
    },
}

impl SettingsError {
    /// The API's error code.
    pub fn code(&self) -> &'static str {
        match self {
            SettingsError::Invalid(_) => "invalid_settings",
            SettingsError::NotAllowed(_) => "settings_not_allowed",
            SettingsError::TooMany { .. } => "too_many_settings",
        }
    }
}

fn invalid(reason: impl Into<String>) -> SettingsError {
    SettingsError::Invalid(reason.into())
}

impl Bounds {
    /// No maximum: what settings checked once already (kept in the cluster's catalog) are
    /// read back with.
    pub fn unbounded() -> Bounds {
        Bounds {
            memory_bytes: i64::MAX,
            cpus: f64::MAX,
            idle_timeout: Duration::MAX,
        }
    }
}

impl Settings {
    /// Checks `wire` against `bounds`.
    pub fn check(wire: &SessionSettings, bounds: &Bounds) -> Result<Settings, SettingsError> {
        check_env(&wire.env)?;
        check_labels(&wire.labels)?;
        let memory_bytes = match &wire.memory {
            None | Some(serde_json::Value::Null) => None,
            Some(value) => Some(memory(value, bounds)?),
        };
        let nano_cpus = match wire.cpus {
            None => None,
            Some(cpus) if !cpus.is_finite() || cpus < MIN_CPUS => {
                return Err(invalid(format!(
                    "cpus: must be a number of at least {MIN_CPUS}"
                )))
            }
            Some(cpus) if cpus > bounds.cpus => {
                return Err(SettingsError::NotAllowed(format!(
                    "cpus: {cpus} is more than the tenant's maximum, {}",
                    bounds.cpus
                )))
            }
            Some(cpus) => Some((cpus * 1e9).round() as i64),
        };
        let idle_timeout = match wire.idle_timeout {
            None => None,
            Some(secs) if !secs.is_finite() || secs < 1.0 => {
                return Err(invalid(
                    "idle_timeout: must be a number of seconds, at least 1",
                ))
            }
            // Compared as numbers first: a huge one is refused, never made a Duration.
            Some(secs) if secs > bounds.idle_timeout.as_secs_f64() => {
                return Err(SettingsError::NotAllowed(format!(
                    "idle_timeout: {secs} s is more than the tenant's maximum, {} s",
                    bounds.idle_timeout.as_secs_f64()
                )))
            }
            Some(secs) => Some(Duration::from_secs_f64(secs)),
        };
        Ok(Settings {
            env: wire.env.clone(),
            memory_bytes,
            nano_cpus,
            idle_timeout,
            labels: wire.labels.clone(),
        })
    }

    /// The settings as the API answers them.
    pub fn to_wire(&self) -> SessionSettings {
        SessionSettings {
            env: self.env.clone(),
            memory: self.memory_bytes.map(serde_json::Value::from),
            cpus: self.nano_cpus.map(|n| n as f64 / 1e9),
            idle_timeout: self.idle_timeout.map(|d| d.as_secs_f64()),
            labels: self.labels.clone(),
        }
    }

    /// These settings with `ceiling`'s limits where they set none (a session's effective
    /// settings under its tenant's [`Limits::ceiling`]).
    pub fn under(&self, ceiling: &Settings) -> Settings {
        Settings {
            memory_bytes: self.memory_bytes.or(ceiling.memory_bytes),
            nano_cpus: self.nano_cpus.or(ceiling.nano_cpus),
            idle_timeout: self.idle_timeout.or(ceiling.idle_timeout),
            ..self.clone()
        }
    }

    /// True when a kernel of these settings must be made for its session (its own
    /// environment, memory, CPU, or labels, which its container carries for `kernelbox ps
    /// --label`): never a pooled one.
    pub fn shapes_the_container(&self) -> bool {
        !self.env.is_empty()
            || self.memory_bytes.is_some()
            || self.nano_cpus.is_some()
            || !self.labels.is_empty()
    }

    /// True when a kernel started with `self` differs from one started with `other` (what a
    /// change of a live session's settings needs a restart for).
    pub fn start_differs(&self, other: &Settings) -> bool {
        self.env != other.env
            || self.memory_bytes != other.memory_bytes
            || self.nano_cpus != other.nano_cpus
    }

    /// What the settings hold in memory, roughly: their text and a fixed overhead (what
    /// [`MAX_SETTINGS_BYTES_PER_TENANT`] counts).
    pub fn bytes(&self) -> usize {
        let text: usize = self
            .env
            .iter()
            .chain(self.labels.iter())
            .map(|(k, v)| k.len() + v.len())
            .sum();
        text + SETTINGS_OVERHEAD_BYTES
    }

    /// True when every `filters` pair is one of the labels.
    pub fn matches(&self, filters: &[(String, String)]) -> bool {
        filters
            .iter()
            .all(|(k, v)| self.labels.get(k).is_some_and(|have| have == v))
    }
}

/// A session's settings as the registry shares them.
pub type Shared = Arc<Settings>;

fn check_env(env: &BTreeMap<String, String>) -> Result<(), SettingsError> {
    if env.len() > MAX_ENV {
        return Err(invalid(format!("env: at most {MAX_ENV} variables")));
    }
    let bytes: usize = env.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    if bytes > MAX_ENV_BYTES {
        return Err(invalid(format!(
            "env: at most {MAX_ENV_BYTES} bytes in all"
        )));
    }
    for (name, value) in env {
        let well_formed = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !well_formed {
            return Err(invalid(format!(
                "env: {name:?} is not a variable name ([A-Za-z_][A-Za-z0-9_]*)"
            )));
        }
        if reserved(name) {
            return Err(invalid(format!(
                "env: {name} is set by kernelbox or shapes its processes (KERNELBOX_*, LD_*, \
                 PYTHON*, PATH, *_PROXY and the variables kernelbox sets are refused)"
            )));
        }
        if value.contains('\0') {
            return Err(invalid(format!("env: the value of {name} contains NUL")));
        }
    }
    Ok(())
}

/// A name a session may not set: kernelbox's own, one it sets, or one that changes how the
/// runner and the file helper (which share the container's environment) load code or reach
/// the network.
fn reserved(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper.starts_with("KERNELBOX_")
        || upper.starts_with("LD_")
        || upper.starts_with("PYTHON")
        || upper == "PATH"
        || upper.ends_with("_PROXY")
        || RESERVED_ENV.iter().any(|r| r.eq_ignore_ascii_case(name))
}

fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), SettingsError> {
    if labels.len() > MAX_LABELS {
        return Err(invalid(format!("labels: at most {MAX_LABELS}")));
    }
    for (key, value) in labels {
        let key_ok = !key.is_empty()
            && key.len() <= MAX_LABEL_BYTES
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'));
        if !key_ok {
            return Err(invalid(format!(
                "labels: {key:?} is not a label key (1 to {MAX_LABEL_BYTES} of [A-Za-z0-9._/-])"
            )));
        }
        if value.len() > MAX_LABEL_BYTES || value.chars().any(char::is_control) {
            return Err(invalid(format!(
                "labels: the value of {key} must be at most {MAX_LABEL_BYTES} bytes without control characters"
            )));
        }
    }
    Ok(())
}

fn memory(value: &serde_json::Value, bounds: &Bounds) -> Result<i64, SettingsError> {
    let bytes = match value {
        serde_json::Value::String(text) => {
            crate::units::parse_bytes(text).map_err(|e| invalid(format!("memory: {e}")))?
        }
        serde_json::Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| invalid("memory: must be a whole number of bytes or a size"))?,
        _ => {
            return Err(invalid(
                "memory: must be a size such as \"512m\" or a number of bytes",
            ))
        }
    };
    if bytes < MIN_MEMORY_BYTES {
        return Err(invalid(format!(
            "memory: at least {} MiB",
            MIN_MEMORY_BYTES / (1024 * 1024)
        )));
    }
    if bytes > bounds.memory_bytes {
        return Err(SettingsError::NotAllowed(format!(
            "memory: {bytes} bytes is more than the tenant's maximum, {} bytes",
            bounds.memory_bytes
        )));
    }
    Ok(bytes)
}

/// Parses `GET /v1/kernels?label=k:v` filters (several `label` parameters must all match).
pub fn label_filters<'a>(
    values: impl IntoIterator<Item = &'a str>,
) -> Result<Vec<(String, String)>, SettingsError> {
    values
        .into_iter()
        .map(|v| {
            v.split_once(':')
                .or_else(|| v.split_once('='))
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| invalid(format!("label filter {v:?}: expected key:value")))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn bounds() -> Bounds {
        Bounds {
            memory_bytes: 1 << 30,
            cpus: 2.0,
            idle_timeout: Duration::from_secs(3600),
        }
    }

    fn check(value: serde_json::Value) -> Result<Settings, SettingsError> {
        let wire: SessionSettings = serde_json::from_value(value).expect("parse");
        Settings::check(&wire, &bounds())
    }

    #[test]
    fn settings_within_the_bounds_are_kept_and_answered_as_given() {
        let s = check(json!({"env": {"A": "1"}, "memory": "512m", "cpus": 0.5,
                             "idle_timeout": 60, "labels": {"team": "x"}}))
        .expect("valid");
        assert_eq!(s.memory_bytes, Some(512 << 20));
        assert_eq!(s.nano_cpus, Some(500_000_000));
        assert_eq!(s.idle_timeout, Some(Duration::from_secs(60)));
        assert!(s.shapes_the_container());
        let back = s.to_wire();
        assert_eq!(back.cpus, Some(0.5));
        assert_eq!(back.memory, Some(json!(512 << 20)));
        assert!(s.matches(&[("team".into(), "x".into())]));
        assert!(!s.matches(&[("team".into(), "y".into())]));
    }

    #[test]
    fn settings_beyond_the_bounds_or_malformed_are_refused_with_their_code() {
        for (body, code) in [
            (json!({"memory": "2g"}), "settings_not_allowed"),
            (json!({"cpus": 3}), "settings_not_allowed"),
            (json!({"idle_timeout": 7200}), "settings_not_allowed"),
            (json!({"memory": "1m"}), "invalid_settings"),
            (json!({"cpus": 0}), "invalid_settings"),
            (json!({"idle_timeout": 0}), "invalid_settings"),
            (
                json!({"env": {"KERNELBOX_STATUS": "x"}}),
                "invalid_settings",
            ),
            (json!({"env": {"HOME": "/"}}), "invalid_settings"),
            (json!({"env": {"LD_PRELOAD": "/x.so"}}), "invalid_settings"),
            (json!({"env": {"PYTHONPATH": "/x"}}), "invalid_settings"),
            (json!({"env": {"no_proxy": "*"}}), "invalid_settings"),
            (json!({"env": {"Path": "/x"}}), "invalid_settings"),
            (json!({"idle_timeout": 1e20}), "settings_not_allowed"),
            (json!({"env": {"1A": "x"}}), "invalid_settings"),
            (json!({"env": {"A": "a\u{0}b"}}), "invalid_settings"),
            (json!({"labels": {"a b": "x"}}), "invalid_settings"),
            (json!({"labels": {"a": "x\ny"}}), "invalid_settings"),
        ] {
            assert_eq!(
                check(body.clone()).map_err(|e| e.code()),
                Err(code),
                "{body}"
            );
        }
        let many: BTreeMap<String, String> = (0..=MAX_ENV)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(check(json!({ "env": many })).is_err());
    }

    #[test]
    fn only_environment_memory_and_cpu_need_a_restart() {
        let a = check(json!({"env": {"A": "1"}, "labels": {"x": "1"}})).expect("a");
        let b = check(json!({"env": {"A": "1"}, "idle_timeout": 5})).expect("b");
        let c = check(json!({"env": {"A": "2"}})).expect("c");
        assert!(!a.start_differs(&b));
        assert!(a.start_differs(&c));
        assert!(!check(json!({"idle_timeout": 9}))
            .expect("d")
            .shapes_the_container());
    }

    #[test]
    fn label_filters_take_key_colon_value() {
        assert_eq!(
            label_filters(["a:b", "c=d"]).expect("ok"),
            vec![("a".into(), "b".into()), ("c".into(), "d".into())]
        );
        assert!(label_filters(["ab"]).is_err());
    }
}
