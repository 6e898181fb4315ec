//! Reading the configuration file: [`ConfigFile::parse`] refuses the whole document at its
//! first bad key, naming the key's path, its line and column, and why; [`schema`] is the JSON
//! Schema of the same types (shipped as `docs/config.schema.json`).

use std::path::{Path, PathBuf};

use super::document::ConfigFile;
use super::values::read_bounded;

/// The most bytes a configuration file may hold.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;

/// A configuration file that cannot be used: the file, the key's path (`tenants[1].max_kernels`),
/// where it is, and why.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("config file {}: {key}{}: {reason}", file.display(), at.map(|(l, c)| format!(" (line {l}, column {c})")).unwrap_or_default())]
pub struct ConfigFileError {
    /// The file read.
    pub file: PathBuf,
    /// Path of the offending key (`(file)` when the file itself could not be read).
    pub key: String,
    /// Line and column (from 1) of the offending key or value, when known.
    pub at: Option<(usize, usize)>,
    /// Why it was refused.
    pub reason: String,
}

impl ConfigFile {
    /// Reads and parses a configuration file.
    pub fn load(path: &Path) -> Result<ConfigFile, ConfigFileError> {
        let text = read_bounded(path, MAX_CONFIG_BYTES).map_err(|e| ConfigFileError {
            file: path.to_path_buf(),
            key: "(file)".into(),
            at: None,
            reason: format!("cannot read: {e}"),
        })?;
        ConfigFile::parse(&text, path)
    }

    /// Parses configuration TOML; `file` only names the source in errors.
    pub fn parse(text: &str, file: &Path) -> Result<ConfigFile, ConfigFileError> {
        let parsed: ConfigFile = toml::from_str(text).map_err(|e| {
            let span = e.span();
            ConfigFileError {
                file: file.to_path_buf(),
                key: span
                    .as_ref()
                    .map(|s| key_path_at(text, s.start))
                    .unwrap_or_else(|| "(file)".into()),
                at: span.map(|s| line_column(text, s.start)),
                reason: e.message().trim().to_string(),
            }
        })?;
        for key in ["name", "token", "token_sha256"] {
            let set = match key {
                "name" => parsed.tenant_defaults.name.is_some(),
                "token" => parsed.tenant_defaults.token.is_some(),
                _ => parsed.tenant_defaults.token_sha256.is_some(),
            };
            if set {
                return Err(ConfigFileError {
                    file: file.to_path_buf(),
                    key: format!("tenant_defaults.{key}"),
                    at: None,
                    reason: "belongs to one tenant: give it in its [[tenants]] table".into(),
                });
            }
        }
        Ok(parsed)
    }

    /// The document as TOML (secrets given inline print as `<redacted>`).
    pub fn to_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
    }
}

/// The JSON Schema of the configuration file, generated from its types.
pub fn schema() -> serde_json::Value {
    let generator = schemars::generate::SchemaSettings::draft2020_12()
        .with(|s| s.inline_subschemas = true)
        .into_generator();
    generator.into_root_schema_for::<ConfigFile>().to_value()
}

/// Line and column (from 1) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    (line, column)
}

/// The path of the key at a byte offset: the table header above it (`[[tenants]]` counted, so
/// the second is `tenants[1]`) and the key on its line, e.g. `tenants[1].max_kernels`.
fn key_path_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[offset..].find('\n').map_or(text.len(), |i| offset + i);
    let line = text[line_start..line_end].trim();
    let mut table = String::new();
    let mut arrays: std::collections::BTreeMap<String, usize> = Default::default();
    for l in text[..line_start].lines() {
        let l = l.trim();
        if let Some(name) = l.strip_prefix("[[").and_then(|r| r.split("]]").next()) {
            let name = name.trim().to_string();
            let n = arrays
                .entry(name.clone())
                .and_modify(|n| *n += 1)
                .or_insert(0);
            table = format!("{name}[{n}]");
        } else if let Some(name) = l.strip_prefix('[').and_then(|r| r.split(']').next()) {
            table = name.trim().to_string();
        }
    }
    if line.starts_with('[') {
        return line
            .trim_start_matches('[')
            .split(']')
            .next()
            .unwrap_or("")
            .trim()
            .to_string();
    }
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .unwrap_or_default();
    match (table.is_empty(), key.is_empty()) {
        (true, true) => "(root)".into(),
        (true, false) => key,
        (false, true) => table,
        (false, false) => format!("{table}.{key}"),
    }
}
