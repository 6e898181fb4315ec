//! Validation: [`Config::validate`] checks every value once and gives a [`ValidConfig`]; the
//! errors ([`ConfigError`], [`InvalidTimeout`]) and the parsers of durations and sizes.

use std::time::Duration;

use super::*;

/// A configuration value that cannot be used; the message names the field.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration: {field}: {reason}")]
pub struct ConfigError {
    /// The setting refused, by the name its error shows (`memory`, `cell_timeout`,
    /// `pool_size`, ...).
    pub field: &'static str,
    /// Why it was refused.
    pub reason: String,
}

pub(super) fn bad(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        field,
        reason: reason.into(),
    }
}

/// A cell timeout outside `(0, max_cell_timeout]`, or not a number of seconds at all. The one
/// rule for every timeout a caller gives, whether through HTTP, the CLI or the library.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("timeout {given} is not a number of seconds in (0, {}]", max.as_secs_f64())]
pub struct InvalidTimeout {
    /// What was given, as the caller wrote it (seconds, or the JSON value).
    pub given: String,
    /// The largest timeout allowed (`max_cell_timeout`).
    pub max: Duration,
}

impl Config {
    /// Checks a cell timeout against `(0, max_timeout]`.
    pub fn check_cell_timeout(&self, timeout: Duration) -> Result<Duration, InvalidTimeout> {
        if timeout.is_zero() || timeout > self.cells.max_timeout {
            return Err(self.invalid_timeout(format!("{:?}", timeout.as_secs_f64())));
        }
        Ok(timeout)
    }

    /// A cell timeout from a number of seconds, by the rule of [`Config::check_cell_timeout`];
    /// NaN, infinities and values too large for a `Duration` are refused the same way.
    pub fn cell_timeout_from_secs(&self, secs: f64) -> Result<Duration, InvalidTimeout> {
        let invalid = || self.invalid_timeout(format!("{secs:?}"));
        let timeout = Duration::try_from_secs_f64(secs).map_err(|_| invalid())?;
        self.check_cell_timeout(timeout).map_err(|_| invalid())
    }

    /// The error for a timeout given as something other than seconds (`given` is shown as is).
    pub fn invalid_timeout(&self, given: impl std::fmt::Display) -> InvalidTimeout {
        InvalidTimeout {
            given: given.to_string(),
            max: self.cells.max_timeout,
        }
    }

    /// Checks every field once; the [`ValidConfig`] it gives is what the rest of the crate
    /// takes, so nothing checks again.
    pub fn validate(self) -> Result<ValidConfig, ConfigError> {
        if self.spec.image.trim().is_empty() {
            return Err(bad("image", "must not be empty"));
        }
        if self.kernels.max_session_kernels == 0 {
            return Err(bad("max_session_kernels", "must be at least 1"));
        }
        if let Err(e) = self.check_cell_timeout(self.cells.timeout) {
            return Err(bad("cell_timeout", e.to_string()));
        }
        if self.cells.interrupt_grace.is_zero() {
            return Err(bad("interrupt_grace", "must be positive"));
        }
        if self.kernels.spawn_timeout.is_zero() {
            return Err(bad("spawn_timeout", "must be positive"));
        }
        if self.kernels.idle_timeout.is_zero() {
            return Err(bad("kernel_idle_timeout", "must be positive"));
        }
        self.spec.sandbox.check()?;
        self.check_runtimes()?;
        self.cells.output.check()?;
        self.cells.display.check()?;
        self.spec.mode.check()?;
        self.check_instance()?;
        self.check_workspaces()?;
        let mut config = self;
        // A checkpoint stops the container it keeps (`docs/runtimes.md`, "Hibernation").
        config.spec.sandbox.keep_stopped |= config.hibernate.is_some();
        Ok(ValidConfig(config))
    }

    /// Workspaces: strict mode only (in project mode `/work` is the project), an absolute
    /// directory, each tenant's quota and count bounded (`docs/workspaces.md`).
    fn check_workspaces(&self) -> Result<(), ConfigError> {
        let Some(ws) = &self.workspaces else {
            return Ok(());
        };
        if !matches!(self.spec.mode, WorkMode::Strict) {
            return Err(bad(
                "workspaces",
                "workspaces need strict mode (in project mode /work is the project directory)",
            ));
        }
        if !ws.dir.is_absolute() {
            return Err(bad("workspaces.dir", "must be an absolute path"));
        }
        for (tenant, policy) in &ws.tenants {
            if policy.quota_bytes < MIN_WORKSPACE_QUOTA {
                return Err(bad(
                    "workspaces.quota",
                    format!("tenant {tenant}: must be at least {MIN_WORKSPACE_QUOTA} bytes"),
                ));
            }
            if policy.ttl.is_zero() {
                return Err(bad(
                    "workspaces.ttl",
                    format!("tenant {tenant}: must be positive"),
                ));
            }
            if policy.max == 0 {
                return Err(bad(
                    "workspaces.max",
                    format!("tenant {tenant}: must be at least 1"),
                ));
            }
        }
        Ok(())
    }

    /// The state directory, the pool and the labels.
    fn check_instance(&self) -> Result<(), ConfigError> {
        if self
            .housekeeping
            .state_dir
            .as_ref()
            .is_some_and(|d| d.as_os_str().is_empty())
        {
            return Err(bad("state_dir", "must not be empty"));
        }
        if self
            .pool
            .languages
            .contains_key(&crate::wire::Language::Python)
        {
            return Err(bad(
                "pool_languages",
                "python's pool is pool_size, not a language entry",
            ));
        }
        let pooled = self.pool.total();
        if pooled > self.kernels.max_session_kernels {
            let field = if self.pool.languages.is_empty() {
                "pool_size"
            } else {
                "pool_languages"
            };
            return Err(bad(
                field,
                format!(
                    "{pooled} pooled kernels do not fit the host's cap of {} kernels (max_session_kernels)",
                    self.kernels.max_session_kernels
                ),
            ));
        }
        if self.pool.max_age.is_zero() {
            return Err(bad("pool_max_age", "must be positive"));
        }
        if self.pool.preload.len() > MAX_POOL_PRELOAD {
            return Err(bad(
                "pool_preload",
                format!("at most {MAX_POOL_PRELOAD} modules"),
            ));
        }
        if let Some(name) = self.pool.preload.iter().find(|m| !is_module_name(m)) {
            return Err(bad(
                "pool_preload",
                format!("{name:?} is not a module name (dotted Python identifiers, e.g. matplotlib.pyplot)"),
            ));
        }
        let runaway = &self.housekeeping.runaway;
        if runaway.interval.is_zero() {
            return Err(bad("runaway_interval", "must be positive"));
        }
        if !(1..=100).contains(&runaway.cpu_percent) {
            return Err(bad("runaway_cpu_percent", "must be between 1 and 100"));
        }
        for key in self.housekeeping.extra_labels.keys() {
            if key.starts_with(crate::labels::PREFIX) {
                return Err(bad("labels", format!("{key} uses kernelbox's own prefix")));
            }
        }
        Ok(())
    }

    /// The runtime `tenant`'s kernels run under: its own, else the server's.
    pub fn runtime_of(&self, tenant: &str) -> KernelRuntime {
        self.tenant_runtimes
            .get(tenant)
            .copied()
            .unwrap_or(self.spec.sandbox.runtime)
    }

    /// Every runtime some kernel may run under (the engine must know each: checked at start).
    pub fn runtimes(&self) -> std::collections::BTreeSet<KernelRuntime> {
        std::iter::once(self.spec.sandbox.runtime)
            .chain(self.tenant_runtimes.values().copied())
            .collect()
    }

    /// What cannot hold under runsc is refused here, not discovered by a cell
    /// (`docs/runtimes.md`): its kernels have no network stack, so a tenant with an egress
    /// policy cannot run under it.
    fn check_runtimes(&self) -> Result<(), ConfigError> {
        if let Some(hibernate) = &self.hibernate {
            // Only gVisor's runsc can checkpoint a kernel here (`docs/runtimes.md`).
            let cannot: Vec<&str> = match &hibernate.tenants {
                None if self.spec.sandbox.runtime != KernelRuntime::Runsc
                    && !self
                        .tenant_runtimes
                        .values()
                        .any(|r| *r == KernelRuntime::Runsc) =>
                {
                    vec!["(every tenant)"]
                }
                None => Vec::new(),
                Some(tenants) => tenants
                    .iter()
                    .filter(|t| self.runtime_of(t) != KernelRuntime::Runsc)
                    .map(String::as_str)
                    .collect(),
            };
            if !cannot.is_empty() {
                return Err(bad(
                    "hibernate",
                    format!(
                        "hibernation checkpoints kernels under runsc only, and these tenants' kernels run under runc: {}; give them runtime runsc (docs/runtimes.md)",
                        cannot.join(", ")
                    ),
                ));
            }
            if hibernate.max_kernels == 0 || hibernate.max_per_tenant == 0 {
                return Err(bad("hibernate", "its bounds must be at least 1"));
            }
            if hibernate.max_age > HIBERNATED_SPARED_FOR {
                return Err(bad(
                    "hibernate",
                    format!(
                        "its max age must be at most {} (sweeps spare a hibernated kernel that long)",
                        humantime::format_duration(HIBERNATED_SPARED_FOR)
                    ),
                ));
            }
        }
        let Some(egress) = &self.egress else {
            return Ok(());
        };
        for tenant in egress.tenants.keys() {
            if self.runtime_of(tenant) == KernelRuntime::Runsc {
                return Err(bad(
                    "runtime",
                    format!(
                        "tenant {tenant} has a network policy, but its kernels run under runsc, which gives them no network stack (docs/runtimes.md); give it runtime runc or no network"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// How often the background reaper runs: `min(5m, max(30s, idle/6))`.
    pub fn reap_interval(&self) -> Duration {
        (self.kernels.idle_timeout / 6).clamp(Duration::from_secs(30), Duration::from_secs(300))
    }
}

impl Sandbox {
    fn check(&self) -> Result<(), ConfigError> {
        if self.memory_bytes < 16 * 1024 * 1024 {
            return Err(bad("memory", "must be at least 16 MiB"));
        }
        if self.pids_limit < 8 {
            return Err(bad("pids_limit", "must be at least 8"));
        }
        if self.nano_cpus <= 0 {
            return Err(bad("cpus", "must be positive"));
        }
        let mut ids = self.user.split(':');
        let uid = ids.next().and_then(|u| u.parse::<u32>().ok());
        let gid_ok = ids.next().is_none_or(|g| g.parse::<u32>().is_ok());
        if uid.is_none() || !gid_ok || ids.next().is_some() {
            return Err(bad("user", "must be numeric UID or UID:GID"));
        }
        if uid == Some(0) {
            return Err(bad("user", "kernels never run as root"));
        }
        if self.work_bytes.is_some_and(|b| b < 1024 * 1024) {
            return Err(bad("work_bytes", "must be at least 1 MiB"));
        }
        Ok(())
    }
}

impl OutputCaps {
    fn check(&self) -> Result<(), ConfigError> {
        if self.inline_bytes < 100 {
            return Err(bad("output_inline_bytes", "must be at least 100"));
        }
        if self.spill_bytes < self.inline_bytes {
            return Err(bad(
                "output_spill_bytes",
                "must be at least output_inline_bytes",
            ));
        }
        Ok(())
    }
}

impl DisplayCaps {
    fn check(&self) -> Result<(), ConfigError> {
        if self.bundle_bytes < 64 * 1024 {
            return Err(bad("display_bundle_bytes", "must be at least 64 KiB"));
        }
        if self.cell_bytes < self.bundle_bytes + DISPLAY_OVERHEAD_BYTES {
            return Err(bad(
                "display_cell_bytes",
                "must be at least display_bundle_bytes (and 1 KiB)",
            ));
        }
        Ok(())
    }
}

impl WorkMode {
    fn check(&self) -> Result<(), ConfigError> {
        if let WorkMode::Project(dir) = self {
            if !dir.is_absolute() {
                return Err(bad("project_dir", "must be an absolute path"));
            }
            if !dir.is_dir() {
                return Err(bad(
                    "project_dir",
                    format!("{} is not a directory", dir.display()),
                ));
            }
        }
        Ok(())
    }
}

/// A [`Config`] that [`Config::validate`] accepted: what the orchestrator runs on. It reads as
/// a `Config` (`Deref`) and cannot be changed but for dropping the file channels.
#[derive(Debug, Clone)]
pub struct ValidConfig(Config);

impl std::ops::Deref for ValidConfig {
    type Target = Config;

    fn deref(&self) -> &Config {
        &self.0
    }
}

impl ValidConfig {
    /// The configuration, to change and validate again.
    pub fn into_inner(self) -> Config {
        self.0
    }

    /// Goes without the file channels' directory (it cannot be used): files then move over
    /// the engine's exec streams. Valid either way.
    pub(crate) fn drop_file_sockets(&mut self) {
        self.0.files.sockets = None;
    }
}

/// What an orchestrator starts from: a [`Config`], validated when taken, or a [`ValidConfig`]
/// as it is (not checked again).
pub trait IntoValidConfig {
    /// The valid configuration, or why there is none.
    fn into_valid(self) -> Result<ValidConfig, ConfigError>;
}

impl IntoValidConfig for Config {
    fn into_valid(self) -> Result<ValidConfig, ConfigError> {
        self.validate()
    }
}

impl IntoValidConfig for ValidConfig {
    fn into_valid(self) -> Result<ValidConfig, ConfigError> {
        Ok(self)
    }
}

/// A dotted Python module name of ASCII identifiers (`matplotlib.pyplot`), at most 200 bytes.
fn is_module_name(name: &str) -> bool {
    name.len() <= 200
        && name.split('.').all(|part| {
            part.chars()
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        })
}
