//! The Docker labels kernelbox puts on everything it creates, and how it reads them back.
//!
//! Labels are the source of truth for admin verbs and sweeps: a container or volume without
//! `io.kernelbox.managed-by=kernelbox` is never touched.

use std::collections::BTreeMap;

/// Prefix of every kernelbox label key.
pub const PREFIX: &str = "io.kernelbox.";
/// Marks an object as kernelbox's: `io.kernelbox.managed-by=kernelbox`.
pub const MANAGED_BY: &str = "io.kernelbox.managed-by";
/// The value of [`MANAGED_BY`].
pub const MANAGED_BY_VALUE: &str = "kernelbox";
/// The orchestrator instance that owns the object.
pub const INSTANCE: &str = "io.kernelbox.instance";
/// Host name of the owning instance (for liveness checks).
pub const HOST: &str = "io.kernelbox.host";
/// Process id of the owning instance (for liveness checks).
pub const PID: &str = "io.kernelbox.pid";
/// Start time of the owning process, in clock ticks since boot (guards against pid reuse).
pub const PID_START: &str = "io.kernelbox.pid-start";
/// Tenant the kernel belongs to.
pub const TENANT: &str = "io.kernelbox.tenant";
/// Owner string (session, or `session::child::id`).
pub const OWNER: &str = "io.kernelbox.owner";
/// Session part of the owner.
pub const SESSION: &str = "io.kernelbox.session";
/// Delegated child part of the owner, when there is one.
pub const CHILD: &str = "io.kernelbox.child";
/// Hash of the kernel key.
pub const KEY: &str = "io.kernelbox.key";
/// Generation of the kernel within its key.
pub const GENERATION: &str = "io.kernelbox.generation";
/// Creation time, Unix seconds.
pub const CREATED_AT: &str = "io.kernelbox.created-at";
/// What the object is: `kernel` (container) or `staging` (volume).
pub const ROLE: &str = "io.kernelbox.role";
/// Name of the kernel's staging volume, on its container.
pub const VOLUME: &str = "io.kernelbox.volume";
/// The volume a kernel's container has at `/work` in strict mode: its own staging volume, or
/// its session's files volume, which the session's contexts share (`docs/contract.md`,
/// "Languages"); the volume goes once no container carrying this label for it is left.
pub const FILES: &str = "io.kernelbox.files";
/// Path, inside the kernel, of the runner's status file (cells run, last cell's end).
pub const STATUS: &str = "io.kernelbox.status";
/// Memory limit of the kernel, bytes.
pub const MEMORY: &str = "io.kernelbox.memory";

/// Container label: which checkpoints' directory the kernel's checkpoint would go to
/// ([`checkpoints_tag`]), so a start finds the hibernated containers of its directory that no
/// record claims (`docs/runtimes.md`, "Across a restart of the server").
pub const CHECKPOINTS: &str = "io.kernelbox.checkpoints";
/// Prefix of a session's own labels (its settings' `labels`, `src/settings.rs`) on its
/// kernels: `io.kernelbox.meta.KEY=VALUE`, what `kernelbox ps --label` filters on.
pub const META_PREFIX: &str = "io.kernelbox.meta.";

/// On a kernel created for the warm pool (value `true`): it was created without an owner, so
/// it has no tenant, owner, session, key or generation label. Once taken, its owner is in its
/// container name ([`owner_name`]).
pub const POOL: &str = "io.kernelbox.pool";

/// Prefix of the container name a pooled kernel gets when an owner takes it.
pub(crate) const OWNER_NAME_PREFIX: &str = "kb";

/// The container name that records who took a pooled kernel: `kb.TENANT.OWNER.SHORTID`, each
/// part escaped to Docker's name alphabet (`_` → `_u`, `.` → `_d`, `@` → `_a`, `:` → `_c`).
/// Container labels are fixed at create; the name is the one thing the engine lets kernelbox
/// change later, and no kernel can (only the server reaches the Docker socket).
pub fn owner_name(tenant: &str, owner: &str, short_id: &str) -> String {
    format!(
        "{OWNER_NAME_PREFIX}.{}.{}.{}",
        escape(tenant),
        escape(owner),
        escape(short_id)
    )
}

/// The container name a pooled kernel gets when an owner takes it: its [`owner_name`], then
/// `.gGENERATION`, the generation its labels (fixed at create, before it had an owner) lack.
/// [`parse_owner_name`] reads it as an owner name; [`name_generation`] reads the generation.
pub fn taken_name(tenant: &str, owner: &str, generation: u64, short_id: &str) -> String {
    format!("{}.g{generation}", owner_name(tenant, owner, short_id))
}

/// The generation a [`taken_name`] carries (`None` for any other name).
pub fn name_generation(name: &str) -> Option<u64> {
    let name = name.trim_start_matches('/');
    let (head, generation) = name.rsplit_once(".g")?;
    if !head.starts_with(&format!("{OWNER_NAME_PREFIX}.")) || head.split('.').count() != 4 {
        return None;
    }
    generation.parse().ok()
}

/// Prefix of the name of a hibernated kernel's stopped container.
const HIBERNATED_NAME_PREFIX: &str = "kbh";

/// Prefix of the name of a kernel container run by another instance than the one whose
/// labels it carries (restored from its checkpoint after a restart of the server).
const RUN_BY_NAME_PREFIX: &str = "kbr";

/// The name of a hibernated kernel's stopped container: `kbh.SINCE.TENANT.OWNER.SHORTID`,
/// `SINCE` when it hibernated (Unix seconds). Its labels name the instance that created it,
/// which may be gone while the checkpoint outlives it (`docs/runtimes.md`, "Hibernation"):
/// the name tells every sweep to leave it (`instance::sweep`).
pub fn hibernated_name(since: u64, tenant: &str, owner: &str, short_id: &str) -> String {
    format!(
        "{HIBERNATED_NAME_PREFIX}.{since}.{}",
        &owner_name(tenant, owner, short_id)[OWNER_NAME_PREFIX.len() + 1..]
    )
}

/// The name of a kernel container restored by an instance (its id, pid and the pid's start
/// time): `kbr.INSTANCE.PID.PIDSTART.TENANT.OWNER.SHORTID`. Sweeps judge its liveness by
/// this, not by the labels of the instance that created it.
pub fn run_by_name(
    instance: &str,
    pid: u32,
    pid_start: u64,
    tenant: &str,
    owner: &str,
    short_id: &str,
) -> String {
    format!(
        "{RUN_BY_NAME_PREFIX}.{}.{pid}.{pid_start}.{}",
        escape(instance),
        &owner_name(tenant, owner, short_id)[OWNER_NAME_PREFIX.len() + 1..]
    )
}

/// What a container's name says of it, beyond its labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameClaim {
    /// A hibernated kernel's, since this time (Unix seconds).
    Hibernated {
        /// When it hibernated.
        since: u64,
    },
    /// Run by this instance (restored after a restart).
    RunBy {
        /// The instance's id.
        instance: String,
        /// The instance's process id, for telling whether it still runs.
        pid: u32,
        /// The process's start time (`/proc/PID/stat`).
        pid_start: u64,
    },
    /// Nothing: its labels tell.
    Nothing,
}

/// Reads a [`hibernated_name`] or a [`run_by_name`] (with or without Docker's leading `/`).
pub fn name_claim(name: &str) -> NameClaim {
    let mut parts = name.trim_start_matches('/').split('.');
    let claim = match parts.next() {
        Some(HIBERNATED_NAME_PREFIX) => parts
            .next()
            .and_then(|s| s.parse().ok())
            .map(|since| NameClaim::Hibernated { since }),
        Some(RUN_BY_NAME_PREFIX) => (|| {
            Some(NameClaim::RunBy {
                instance: unescape(parts.next()?)?,
                pid: parts.next()?.parse().ok()?,
                pid_start: parts.next()?.parse().ok()?,
            })
        })(),
        _ => None,
    };
    claim.unwrap_or(NameClaim::Nothing)
}

/// Reads `(tenant, owner)` back from an [`owner_name`] (a [`taken_name`] too), a
/// [`hibernated_name`] or a [`run_by_name`] (with or without Docker's leading `/`).
pub fn parse_owner_name(name: &str) -> Option<(String, String)> {
    let name = name.trim_start_matches('/');
    let name = match name_generation(name) {
        Some(_) => name.rsplit_once(".g").map_or(name, |(head, _)| head),
        None => name,
    };
    let mut parts = name.split('.');
    let skip = match parts.next()? {
        OWNER_NAME_PREFIX => 0,
        HIBERNATED_NAME_PREFIX => 1,
        RUN_BY_NAME_PREFIX => 3,
        _ => return None,
    };
    for _ in 0..skip {
        parts.next()?;
    }
    let tenant = unescape(parts.next()?)?;
    let owner = unescape(parts.next()?)?;
    parts.next()?;
    if parts.next().is_some() {
        return None;
    }
    Some((tenant, owner))
}

fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '_' => out.push_str("_u"),
            '.' => out.push_str("_d"),
            '@' => out.push_str("_a"),
            ':' => out.push_str("_c"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(text: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(match c {
            '_' => match chars.next()? {
                'u' => '_',
                'd' => '.',
                'a' => '@',
                'c' => ':',
                _ => return None,
            },
            c => c,
        });
    }
    Some(out)
}

/// The [`CHECKPOINTS`] label's value for a directory: a short hash of its real path (the same
/// directory reached by another path has the same tag).
pub fn checkpoints_tag(dir: &std::path::Path) -> String {
    use sha2::{Digest, Sha256};
    let real = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let digest = Sha256::digest(real.to_string_lossy().as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// A label filter value `key=value` for list calls.
pub fn filter(key: &str, value: &str) -> String {
    format!("{key}={value}")
}

/// The filter that selects everything kernelbox manages.
pub fn managed() -> String {
    filter(MANAGED_BY, MANAGED_BY_VALUE)
}

/// Reads a label as an integer.
pub fn int(labels: &BTreeMap<String, String>, key: &str) -> Option<i64> {
    labels.get(key).and_then(|v| v.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_round_trip_and_fit_dockers_alphabet() {
        for (tenant, owner) in [
            ("default", "conv-a"),
            ("t_1", "user@example.com::child::c.1"),
            ("a:b", "x_u"),
        ] {
            let name = owner_name(tenant, owner, "0123456789ab");
            assert!(name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')));
            assert_eq!(
                parse_owner_name(&format!("/{name}")),
                Some((tenant.to_string(), owner.to_string()))
            );
        }
        let hibernated = hibernated_name(1_800_000_000, "t_1", "s.1", "0123456789ab");
        assert_eq!(
            name_claim(&format!("/{hibernated}")),
            NameClaim::Hibernated {
                since: 1_800_000_000
            }
        );
        let run = run_by_name("abc_1", 42, 7, "t", "s", "0123456789ab");
        assert_eq!(
            name_claim(&run),
            NameClaim::RunBy {
                instance: "abc_1".into(),
                pid: 42,
                pid_start: 7
            }
        );
        for name in [&hibernated, &run] {
            assert!(parse_owner_name(name).is_some(), "{name}");
        }
        assert_eq!(name_claim(&owner_name("t", "s", "x")), NameClaim::Nothing);
        assert_eq!(name_claim("kbr.a.notapid.1.t.s.x"), NameClaim::Nothing);
        assert_eq!(parse_owner_name("/festive_hopper"), None);
        let taken = taken_name("t_1", "s.1::child::c", 3, "0123456789ab");
        assert_eq!(
            parse_owner_name(&format!("/{taken}")),
            Some(("t_1".to_string(), "s.1::child::c".to_string()))
        );
        assert_eq!(name_generation(&format!("/{taken}")), Some(3));
        assert_eq!(name_generation(&owner_name("t", "s", "x")), None);
        assert_eq!(name_generation("kb.t.s.g1"), None);
        assert_eq!(name_claim(&taken), NameClaim::Nothing);
        assert_eq!(parse_owner_name("kb.a.b"), None);
        assert_eq!(parse_owner_name("kb.a_z.b.c"), None);
    }
}
