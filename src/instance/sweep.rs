//! Sweeps by label: leftovers of dead instances, hibernated kernels past their age, and
//! staging volumes past their age.
//!
//! Only objects labelled `io.kernelbox.managed-by=kernelbox` are ever considered; those of a
//! live instance (this one included) are left alone.

use std::collections::HashSet;
use std::time::Duration;

use serde::Serialize;

use super::{liveness, owner_labels, Instance, Liveness};
use crate::clock::unix_now;
use crate::config::HIBERNATED_SPARED_FOR;
use crate::docker::{remove_volume, ContainerInfo, Engine, EngineError, InUse};
use crate::labels::{self, NameClaim};

/// Objects of an instance on another host are judged by age past this grace.
pub const FOREIGN_GRACE: Duration = Duration::from_secs(600);

/// What a sweep removed (or would remove, on a dry run).
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct SweepReport {
    /// Container ids.
    pub containers: Vec<String>,
    /// Volume names.
    pub volumes: Vec<String>,
    /// The hibernated kernels' containers looked at ([`sweep_hibernated`]): removed (their
    /// ids and volumes are in `containers` and `volumes` too) or kept, and why.
    pub hibernated: Vec<HibernatedKernel>,
}

/// A hibernated kernel's stopped container (named `kbh.<since>...`, `labels::hibernated_name`)
/// as [`sweep_hibernated`] judged it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct HibernatedKernel {
    /// The container's id.
    pub container: String,
    /// The container's name (`kbh.<since>...`), which the age is read from.
    pub name: String,
    /// Seconds since it hibernated (by its name).
    pub age_seconds: u64,
    /// Its checkpoints directory's tag (`io.kernelbox.checkpoints`), if it has one.
    pub directory: Option<String>,
    /// Whether it was removed (or would be, on a dry run).
    pub removed: bool,
    /// Why: `past the spare time`, `past the max age, no live server on its directory`, or
    /// why it is kept: `within the max age`, `a live server uses its directory`.
    pub why: &'static str,
}

fn age_of(object_labels: &std::collections::BTreeMap<String, String>, created: i64) -> Duration {
    let created = labels::int(object_labels, labels::CREATED_AT).unwrap_or(created);
    Duration::from_secs(unix_now().saturating_sub(created.max(0) as u64))
}

/// Removes containers and unused volumes left by dead instances (but hibernated kernels':
/// [`hibernated`]; a volume a container still uses is never removed).
pub async fn sweep_orphans(
    engine: &dyn Engine,
    me: &Instance,
    dry_run: bool,
) -> Result<SweepReport, EngineError> {
    let mut report = SweepReport::default();
    for c in engine.list_containers(&[labels::managed()]).await? {
        // Hibernated kernels go by their own rule ([`sweep_hibernated`]).
        if hibernated_since(&c).is_some() {
            continue;
        }
        let leftover = match liveness(me, &owner_labels(me, &c)) {
            Liveness::Alive => false,
            Liveness::Dead => true,
            // Another host's kernels run only while their runner has its host; a container
            // that never started or already exited is a leftover once past the grace.
            Liveness::Unknown => {
                matches!(c.state.as_str(), "exited" | "dead")
                    || (c.state == "created" && age_of(&c.labels, c.created) > FOREIGN_GRACE)
            }
        };
        if leftover {
            // One object the engine refuses to remove must not stop the sweep (or a start).
            if !dry_run {
                if let Err(e) = engine.remove_container(&c.id).await {
                    tracing::warn!(container = %c.id, error = %e, "sweep: cannot remove a leftover");
                    continue;
                }
            }
            report.containers.push(c.id);
        }
    }
    for v in engine.list_volumes(&[labels::managed()], true).await? {
        // A workspace outlives every kernel and instance: only its TTL or its deletion
        // removes it (`docs/workspaces.md`).
        if v.labels.get(labels::ROLE).map(String::as_str) == Some("workspace") {
            continue;
        }
        let leftover = match liveness(me, &v.labels) {
            Liveness::Alive => false,
            Liveness::Dead => true,
            Liveness::Unknown => age_of(&v.labels, 0) > FOREIGN_GRACE,
        };
        if leftover {
            if !dry_run {
                match remove_volume(engine, &v.name, InUse::Fail).await {
                    Ok(()) => {}
                    Err(EngineError::VolumeInUse { .. }) => continue,
                    Err(e) => {
                        tracing::warn!(volume = %v.name, error = %e, "sweep: cannot remove a leftover");
                        continue;
                    }
                }
            }
            report.volumes.push(v.name);
        }
    }
    Ok(report)
}

/// When `c` hibernated, if it is a hibernated kernel's stopped container.
fn hibernated_since(c: &ContainerInfo) -> Option<u64> {
    match labels::name_claim(&c.name) {
        NameClaim::Hibernated { since } if c.state == "exited" => Some(since),
        _ => None,
    }
}

/// Removes hibernated kernels' containers, with their staging volumes, that no server will
/// restore (`docs/runtimes.md`, "Across a restart of the server"): every one hibernated
/// [`HIBERNATED_SPARED_FOR`] ago or more (no server keeps a checkpoint longer:
/// `--hibernate-max-age` is at most that), and every one hibernated `max_age` ago or more
/// whose checkpoints directory no live server uses: no container with its tag is run by a
/// live instance on this host, and no live server's watchdog names it
/// ([`super::watchdog::live_checkpoint_tags`]; a server on another host is not seen: a
/// checkpoint removed under it is the loss its restore reports, never a silent one). The
/// others are kept and reported, with why.
pub async fn sweep_hibernated(
    engine: &dyn Engine,
    me: &Instance,
    max_age: Duration,
    dry_run: bool,
) -> Result<SweepReport, EngineError> {
    let containers = engine.list_containers(&[labels::managed()]).await?;
    let mut live: HashSet<String> = containers
        .iter()
        .filter(|c| liveness(me, &owner_labels(me, c)) == Liveness::Alive)
        .filter_map(|c| c.labels.get(labels::CHECKPOINTS).cloned())
        .collect();
    if max_age < HIBERNATED_SPARED_FOR {
        // A live server running no container is seen by its watchdog.
        live.extend(
            tokio::task::spawn_blocking(super::watchdog::live_checkpoint_tags)
                .await
                .unwrap_or_default(),
        );
    }
    let now = unix_now();
    let mut report = SweepReport::default();
    for c in &containers {
        let Some(since) = hibernated_since(c) else {
            continue;
        };
        let age = now.saturating_sub(since);
        let directory = c.labels.get(labels::CHECKPOINTS);
        let lived = directory.is_some_and(|d| live.contains(d));
        let (removed, why) = if age >= HIBERNATED_SPARED_FOR.as_secs() {
            (true, "past the spare time")
        } else if age < max_age.as_secs() {
            (false, "within the max age")
        } else if lived {
            (false, "a live server uses its directory")
        } else {
            (true, "past the max age, no live server on its directory")
        };
        if removed {
            if !dry_run {
                if let Err(e) = engine.remove_container(&c.id).await {
                    tracing::warn!(container = %c.id, error = %e, "sweep: cannot remove a hibernated kernel");
                    continue;
                }
            }
            report.containers.push(c.id.clone());
            if let Some(volume) = c.labels.get(labels::VOLUME) {
                if !dry_run {
                    if let Err(e) = crate::docker::remove_volume_when_free(engine, volume).await {
                        tracing::warn!(volume = %volume, error = %e, "sweep: cannot remove a hibernated kernel's volume");
                    }
                }
                report.volumes.push(volume.clone());
            }
        }
        report.hibernated.push(HibernatedKernel {
            container: c.id.clone(),
            name: c.name.clone(),
            age_seconds: age,
            directory: directory.cloned(),
            removed,
            why,
        });
    }
    Ok(report)
}

/// Removes staging volumes older than `max_age` (by their creation label) that no container
/// uses. Unlabelled volumes are never touched.
pub async fn sweep_stale_staging(
    engine: &dyn Engine,
    max_age: Duration,
    extra_filters: &[String],
    dry_run: bool,
) -> Result<Vec<String>, EngineError> {
    sweep_staging_where(engine, max_age, extra_filters, dry_run, |_| true).await
}

/// [`sweep_stale_staging`] for a running instance's reaper: only volumes of `me` or of an
/// instance known to be dead on this host go. A live neighbour's are never touched, nor those
/// of an instance whose liveness cannot be told from here (another host): `kernelbox sweep`
/// judges those by age alone.
pub async fn sweep_stale_staging_of_dead(
    engine: &dyn Engine,
    me: &Instance,
    max_age: Duration,
) -> Result<Vec<String>, EngineError> {
    sweep_staging_where(engine, max_age, &[], false, |l| {
        l.get(labels::INSTANCE) == Some(&me.id) || liveness(me, l) == Liveness::Dead
    })
    .await
}

async fn sweep_staging_where(
    engine: &dyn Engine,
    max_age: Duration,
    extra_filters: &[String],
    dry_run: bool,
    sweepable: impl Fn(&std::collections::BTreeMap<String, String>) -> bool,
) -> Result<Vec<String>, EngineError> {
    let mut filters = vec![labels::managed(), labels::filter(labels::ROLE, "staging")];
    filters.extend_from_slice(extra_filters);
    let mut removed = Vec::new();
    for v in engine.list_volumes(&filters, true).await? {
        let Some(created) = labels::int(&v.labels, labels::CREATED_AT) else {
            continue;
        };
        if !sweepable(&v.labels) {
            continue;
        }
        if age_of(&v.labels, created) <= max_age {
            continue;
        }
        if !dry_run {
            match remove_volume(engine, &v.name, InUse::Fail).await {
                Ok(()) => {}
                Err(EngineError::VolumeInUse { .. }) => continue,
                Err(e) => {
                    tracing::warn!(volume = %v.name, error = %e, "staging sweep: cannot remove");
                    continue;
                }
            }
        }
        removed.push(v.name);
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::docker::fake::FakeEngine;

    #[tokio::test]
    async fn a_workspace_is_never_a_leftover_however_old() {
        let fake = FakeEngine::default();
        for (name, role) in [("ws", "workspace"), ("st", "staging")] {
            let l = BTreeMap::from([
                (
                    labels::MANAGED_BY.to_string(),
                    labels::MANAGED_BY_VALUE.to_string(),
                ),
                (labels::ROLE.to_string(), role.to_string()),
                (labels::CREATED_AT.to_string(), "1".to_string()),
            ]);
            fake.create_volume(name, &l, None).await.expect("volume");
        }
        let report = sweep_orphans(&fake, &Instance::current(), false)
            .await
            .expect("sweep");
        assert_eq!(report.volumes, vec!["st".to_string()]);
        let left: Vec<_> = fake
            .list_volumes(&[], false)
            .await
            .expect("list")
            .into_iter()
            .map(|v| v.name)
            .collect();
        assert_eq!(left, vec!["ws".to_string()]);
    }
}
