//! Where `kernelbox serve`'s tenants come from, and reading them again (what a reload of a
//! running server calls): the flags' one tenant, a JSON tenants file, or the `[[tenants]]` of
//! the configuration file (docs/configuration.md).

use std::path::{Path, PathBuf};

use kernelbox::config::file::{ConfigFile, TenantEntry};
use kernelbox::server::Tenants;

use super::Exit;

fn usage(message: String) -> anyhow::Error {
    Exit { code: 2, message }.into()
}

/// Where the tenants come from: the one tenant `default` of the flags (KERNELBOX_TOKEN,
/// `--session-max-*`, ...), a JSON tenants file (`--tenants`), or the `[[tenants]]` of the
/// configuration file (`--config`, `[tenant_defaults]` applied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TenantsSource {
    /// No tenants file: the one tenant `default`.
    Flags,
    /// `--tenants FILE`.
    Json(PathBuf),
    /// `--config FILE` with `[[tenants]]`.
    Config(PathBuf),
}

impl TenantsSource {
    /// True when the tenants come from a file (each tenant then has its own settings there).
    pub(crate) fn is_file(&self) -> bool {
        !matches!(self, TenantsSource::Flags)
    }
}

/// How a configuration file's tables other than its tenants are checked, as `serve --config`
/// checked them at start (`super::config::check_keys`): a file the start would refuse is
/// refused whole by a reload too, its tenants with it.
pub(crate) type FileCheck = fn(&ConfigFile, &Path) -> anyhow::Result<()>;

/// What [`load_tenants`] read.
pub(crate) struct Loaded {
    /// The tenants.
    pub(crate) tenants: Tenants,
    /// The configuration file itself, when the tenants come from one: a reload compares it
    /// with the file at start for what only a restart applies
    /// (`kernelbox::config::file::needs_restart`).
    pub(crate) file: Option<ConfigFile>,
}

/// Reads the tenants from their file (a configuration file checked whole by `check`): what a
/// reload of a running server re-reads, with the egress secrets file of the start
/// (`serve::tenants_loader`). Exit code 2 when they cannot be used; `None` for the one tenant of the flags
/// (nothing to re-read).
pub(crate) fn load_tenants(source: &TenantsSource, check: FileCheck) -> anyhow::Result<Loaded> {
    match source {
        TenantsSource::Flags => Err(usage(
            "no tenants file: the one tenant `default` comes from the flags".into(),
        )),
        TenantsSource::Json(path) => Ok(Loaded {
            tenants: Tenants::load(path).map_err(|e| usage(e.to_string()))?,
            file: None,
        }),
        TenantsSource::Config(path) => {
            let file = ConfigFile::load(path).map_err(|e| usage(e.to_string()))?;
            check(&file, path)?;
            let tenants = file_tenants(&file, path)?;
            Ok(Loaded {
                tenants,
                file: Some(file),
            })
        }
    }
}

/// The `[[tenants]]` of a configuration file, `[tenant_defaults]` applied, checked as the
/// tenants file's are (exit code 2 otherwise).
pub(crate) fn file_tenants(file: &ConfigFile, path: &Path) -> anyhow::Result<Tenants> {
    let entries: Vec<TenantEntry> = file
        .tenants
        .iter()
        .map(|t| t.with_defaults(&file.tenant_defaults))
        .collect();
    Tenants::from_entries(&entries, path).map_err(|e| usage(e.to_string()))
}
