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
use crate::labels;

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

/// Removes every container, then every volume, labelled with `instance`.
pub async fn remove_instance(engine: &dyn Engine, instance: &str) -> Result<usize, EngineError> {
    let filters = [
        labels::managed(),
        labels::filter(labels::INSTANCE, instance),
    ];
    let containers = engine.list_containers(&filters).await?;
    let removals = containers
        .into_iter()
        .map(|c| async move { engine.remove_container(&c.id).await });
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
    let volumes = engine.list_volumes(&filters, false).await?;
    let removals = volumes
        .into_iter()
        .map(|v| async move { crate::docker::remove_volume_when_free(engine, &v.name).await });
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
