//! The watchdog: a small process that removes an instance's containers and volumes as soon as
//! the instance dies, however it dies (SIGKILL, OOM, panic), even mid-spawn.
//!
//! The orchestrator starts `kernelbox watchdog --instance ID` with a pipe on its stdin and keeps
//! the write end. The kernel closes that end when the orchestrator exits for any reason; the
//! watchdog reads EOF, sweeps everything labelled with the instance id, and exits. It runs in
//! its own process group, so a signal aimed at the orchestrator's group does not stop it.
//!
//! This backs up the runner's own rule (exit when stdin closes, with auto-removal), which cannot
//! cover a container that was created but not yet started when the host died.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};

use futures::StreamExt;

use crate::docker::{Engine, EngineError};
use std::collections::HashSet;

use crate::labels::{self, NameClaim};

/// A running watchdog; dropping it lets the watchdog sweep and exit.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    lifeline: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts the watchdog binary for `instance`.
    pub fn spawn(binary: &Path, instance: &str) -> std::io::Result<Watchdog> {
        let mut child = Command::new(binary)
            .arg("watchdog")
            .arg("--instance")
            .arg(instance)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let lifeline = child.stdin.take();
        Ok(Watchdog { child, lifeline })
    }

    /// Closes the lifeline and waits for the watchdog's final sweep.
    pub fn finish(mut self) {
        self.lifeline.take();
        let _ = self.child.wait();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.lifeline.take();
    }
}

/// The watchdog's body: block until stdin closes, then remove every object of `instance`.
pub async fn run(engine: &dyn Engine, instance: &str) -> Result<usize, EngineError> {
    // Reading stdin blocks a thread, not the runtime.
    let _ = tokio::task::spawn_blocking(|| {
        let mut sink = [0u8; 64];
        let mut stdin = std::io::stdin();
        while matches!(stdin.read(&mut sink), Ok(n) if n > 0) {}
    })
    .await;
    remove_instance(engine, instance).await
}

/// Removes every container of `instance`, then its volumes: those labelled with it but
/// hibernated kernels' (`super::hibernated`), and those its name says it ran (restored from an
/// earlier instance's checkpoints, `labels::run_by_name`).
pub async fn remove_instance(engine: &dyn Engine, instance: &str) -> Result<usize, EngineError> {
    let filters = [
        labels::managed(),
        labels::filter(labels::INSTANCE, instance),
    ];
    let mut doomed = Vec::new();
    let mut kept_volumes = HashSet::new();
    let mut taken_volumes = Vec::new();
    for c in engine.list_containers(&[labels::managed()]).await? {
        let labelled = c.labels.get(labels::INSTANCE).map(String::as_str) == Some(instance);
        let volume = c.labels.get(labels::VOLUME).cloned();
        let ran = match labels::name_claim(&c.name) {
            NameClaim::RunBy { instance: by, .. } => by == instance,
            _ => labelled && !super::hibernated(&c),
        };
        if ran {
            if !labelled {
                taken_volumes.extend(volume);
            }
            doomed.push(c.id);
        } else if labelled {
            kept_volumes.extend(volume);
        }
    }
    let removals = doomed
        .into_iter()
        .map(|id| async move { engine.remove_container(&id).await });
    let mut count = 0;
    let results: Vec<_> = futures::stream::iter(removals)
        .buffer_unordered(crate::docker::REMOVAL_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        match result {
            Ok(()) => count += 1,
            Err(e) => tracing::warn!(error = %e, "watchdog: container removal failed"),
        }
    }
    // The instance's egress network and its firewall rules, once its kernels are gone.
    crate::egress::sweep(engine, &filters).await;
    let mut volumes: Vec<String> = engine
        .list_volumes(&filters, false)
        .await?
        .into_iter()
        .map(|v| v.name)
        .filter(|name| !kept_volumes.contains(name))
        .collect();
    volumes.extend(taken_volumes);
    let removals = volumes
        .into_iter()
        .map(|name| async move { crate::docker::remove_volume_when_free(engine, &name).await });
    let results: Vec<_> = futures::stream::iter(removals)
        .buffer_unordered(crate::docker::REMOVAL_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        if let Err(e) = result {
            tracing::warn!(error = %e, "watchdog: volume removal failed");
        }
    }
    Ok(count)
}
