//! What an earlier run of the server left in the checkpoints' directory, read at start
//! (`docs/runtimes.md`, "Hibernation"), and the directory's clearing.

use std::collections::HashSet;

use crate::config::{HibernateConfig, ValidConfig};
use crate::docker::{ContainerInfo, Engine, EngineError};
use crate::kernel::Record;
use crate::labels;

/// Hibernated kernels an earlier run of the server left, read at start.
#[derive(Default)]
pub(crate) struct Recorded {
    /// The records to take over: their containers are still there, stopped, named hibernated.
    pub(crate) records: Vec<Record>,
    /// The [`labels::CHECKPOINTS`] label this run's kernels carry, when checkpoints outlive
    /// it.
    pub(crate) tag: Option<String>,
}

/// The hibernated kernels an earlier run left in the checkpoints' directory, when checkpoints
/// outlive a run (`HibernateConfig::lasts`): the records whose containers are still there,
/// stopped and named hibernated. What no record claims (a record unreadable or not written,
/// a kill between the rename and the record) is discarded: the stopped containers labelled
/// with this directory's tag, with their volumes. A server whose checkpoints do not outlive
/// it (one that does not hibernate, on the state directory's `checkpoints`) discards every
/// one, and clears the directory: their owners are told `server_restarted`.
pub(crate) async fn recorded(
    config: &ValidConfig,
    engine: &dyn Engine,
) -> Result<Recorded, EngineError> {
    let state_dir = config.housekeeping.state_dir.as_deref();
    let (dir, lasting) = match (&config.hibernate, state_dir) {
        (Some(h), _) if h.lasts(state_dir) => (h.checkpoint_dir(state_dir, ""), true),
        (_, Some(state)) => (
            HibernateConfig::default().checkpoint_dir(Some(state), ""),
            false,
        ),
        (_, None) => return Ok(Recorded::default()),
    };
    let reading = dir.clone();
    let (records, tag) = tokio::task::spawn_blocking(move || {
        (
            Record::read_all(&reading),
            labels::checkpoints_tag(&reading),
        )
    })
    .await
    .unwrap_or_default();
    let hibernated: Vec<ContainerInfo> = engine
        .list_containers(&[labels::managed(), labels::filter(labels::CHECKPOINTS, &tag)])
        .await?
        .into_iter()
        .filter(|c| {
            c.state == "exited"
                && matches!(
                    labels::name_claim(&c.name),
                    labels::NameClaim::Hibernated { .. }
                )
        })
        .collect();
    let (records, unclaimed): (Vec<Record>, Vec<Record>) = records
        .into_iter()
        .partition(|r| lasting && hibernated.iter().any(|c| c.id == r.checkpoint.id));
    for record in &unclaimed {
        record.checkpoint.discard(engine).await;
    }
    for c in &hibernated {
        if records.iter().any(|r| r.checkpoint.id == c.id) {
            continue;
        }
        tracing::warn!(container = %crate::docker::short_id(&c.id), "a hibernated kernel no record claims: discarded");
        let _ = engine.remove_container(&c.id).await;
        if let Some(volume) = c.labels.get(labels::VOLUME) {
            let _ = crate::docker::remove_volume_when_free(engine, volume).await;
        }
    }
    if !lasting {
        let _ = tokio::task::spawn_blocking(move || clear_dir(&dir, &HashSet::new())).await;
        return Ok(Recorded::default());
    }
    Ok(Recorded {
        records,
        tag: Some(tag),
    })
}

/// Removes the `kb-*` entries of `dir` whose names are not in `keep`. Blocking.
pub(super) fn clear_dir(dir: &std::path::Path, keep: &std::collections::HashSet<String>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("kb-") || keep.contains(&name) {
            continue;
        }
        let path = entry.path();
        let _ = if path.is_dir() {
            std::fs::remove_dir_all(path)
        } else {
            std::fs::remove_file(path)
        };
    }
}
