//! What a reload of the configuration file cannot apply (`docs/http-api.md`, "Reloading the
//! tenants"): the tenants (`[[tenants]]`, `[tenant_defaults]`) and the content of the egress
//! secrets file the server started with are read again and applied live; every other key (the
//! secrets file's path too) is read once, at start. A reload lists each
//! such key whose value changed as "needs a restart" rather than ignoring it.

use super::ConfigFile;

/// The keys of `new` outside the tenants whose value differs from
/// `old`'s (`limits.max_connections`, `server.listen`, ...), each with what to do. A changed
/// secret is named by its key, never shown.
pub fn needs_restart(old: &ConfigFile, new: &ConfigFile) -> Vec<String> {
    let live = |file: &ConfigFile| {
        let mut file = file.clone();
        file.tenants.clear();
        file.tenant_defaults = Default::default();
        file
    };
    let (old, new) = (live(old), live(new));
    if old == new {
        return Vec::new();
    }
    let flat = |file: &ConfigFile| {
        let mut keys = std::collections::BTreeMap::new();
        if let Ok(value) = toml::Value::try_from(file) {
            flatten("", &value, &mut keys);
        }
        keys
    };
    let (before, after) = (flat(&old), flat(&new));
    let mut changed: Vec<String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .cloned()
        .collect();
    changed.dedup();
    changed.sort();
    changed.dedup();
    // A secret given inline is written redacted: a change of one shows as no key, so the
    // sections that differ are named instead.
    if changed.is_empty() {
        changed = sections_differing(&old, &new);
    }
    changed
        .into_iter()
        .map(|key| format!("{key}: read at start only; the change applies after a restart"))
        .collect()
}

/// Every leaf of `value` by its dotted key.
fn flatten(
    prefix: &str,
    value: &toml::Value,
    keys: &mut std::collections::BTreeMap<String, String>,
) {
    match value {
        toml::Value::Table(table) => {
            for (k, v) in table {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, keys);
            }
        }
        other => {
            keys.insert(prefix.to_string(), other.to_string());
        }
    }
}

/// The sections of the two files that differ.
fn sections_differing(old: &ConfigFile, new: &ConfigFile) -> Vec<String> {
    let mut names = Vec::new();
    let mut differs = |name: &str, same: bool| {
        if !same {
            names.push(name.to_string());
        }
    };
    differs("server", old.server == new.server);
    differs("kernels", old.kernels == new.kernels);
    differs("limits", old.limits == new.limits);
    differs("pool", old.pool == new.pool);
    differs("egress", old.egress == new.egress);
    differs("cluster", old.cluster == new.cluster);
    differs("audit", old.audit == new.audit);
    differs("hibernation", old.hibernation == new.hibernation);
    differs("workspaces", old.workspaces == new.workspaces);
    differs("snapshots", old.snapshots == new.snapshots);
    names
}
