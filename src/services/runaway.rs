//! The runaway watch (`docs/reliability.md`, "Runaway kernels"): a cell can forge its own end
//! and keep computing, so the host bounds what a kernel computes with no cell running, whatever
//! the runner says. One task samples the CPU time of every kernel with no running cell from
//! its cgroup (`docker/cpu.rs`) each `housekeeping.runaway.interval`. An interval above
//! `cpu_percent` of the kernel's CPU limit adds its length to the time the kernel has computed,
//! an interval below it takes half its length off; the kernel is busy (`Slot::is_idle`) while
//! that time is above zero, and one that has computed, with no cell between, for longer than
//! its last cell's timeout plus `grace` is killed and its owner's next call
//! reports `state_lost: runaway`. An interval a cell began in is not counted either way, so
//! cells in between neither add to nor clear the time computed. A kernel whose cgroup cannot
//! be read is left alone (logged once). A service of the orchestrator: [`RunawayWatcher`] is
//! built at start and runs as one task the orchestrator owns, with its own state.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::cell::LossReason;
use crate::config::ValidConfig;
use crate::docker::cpu::{CpuFile, CpuReadError};
use crate::kernel::Kernel;
use crate::registry::{Registry, Slot};

/// A quiet interval takes `1 / QUIET_PAYBACK` of its length off the time a kernel has
/// computed (`docs/reliability.md`, "Runaway kernels").
const QUIET_PAYBACK: u32 = 2;

/// What the watch keeps between rounds.
#[derive(Default)]
struct Watch {
    /// What it knows of each registered kernel, by container id.
    tracks: HashMap<String, Track>,
    /// A kernel's cgroup could not be read and that was logged (once for the instance).
    warned: bool,
}

/// What the watch knows of one kernel.
#[derive(Default)]
struct Track {
    /// Where its CPU time is; `None` until found, or when it cannot be (then `unreadable`).
    file: Option<CpuFile>,
    /// Its cgroup could not be read (logged once); it is left alone.
    unreadable: bool,
    /// The last sample: CPU time (ns), when, and the cells begun by then.
    last: Option<(u64, Instant, u64)>,
    /// How long it has computed with no cell running, less what quiet intervals paid back.
    computing: Duration,
}

/// One kernel to sample this round.
struct Due {
    slot: Arc<Slot>,
    kernel: Arc<Kernel>,
    file: Option<CpuFile>,
}

/// The runaway watch: its bounds (`housekeeping.runaway`, the sandbox's CPU limit, the
/// cells' default timeout), the registry it samples, and what it knows between rounds.
pub(crate) struct RunawayWatcher {
    registry: Arc<Registry>,
    interval: Duration,
    bounds: Bounds,
    watch: Watch,
}

/// What a kernel may compute with no cell running.
struct Bounds {
    cpu_percent: u32,
    grace: Duration,
    /// The kernels' CPU limit, in cores.
    limit_cores: f64,
    /// The bound of a kernel that has run no cell with a timeout of its own.
    cell_timeout: Duration,
}

impl RunawayWatcher {
    pub(crate) fn new(config: &ValidConfig, registry: Arc<Registry>) -> RunawayWatcher {
        let runaway = &config.housekeeping.runaway;
        RunawayWatcher {
            registry,
            interval: runaway.interval,
            bounds: Bounds {
                cpu_percent: runaway.cpu_percent,
                grace: runaway.grace,
                limit_cores: config.spec.sandbox.nano_cpus as f64 / 1e9,
                cell_timeout: config.cells.timeout,
            },
            watch: Watch::default(),
        }
    }

    /// Samples kernels with no running cell every `housekeeping.runaway.interval` until
    /// `cancel`, disposing of the runaways.
    pub(crate) async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            let runaways = self.sample().await;
            if !runaways.is_empty() {
                super::dispose_slots(runaways).await;
            }
        }
    }

    /// One round: every registered kernel with no running cell sampled, its track updated;
    /// returns the slots of the kernels killed as runaways (unregistered, their losses
    /// recorded), for disposal.
    async fn sample(&mut self) -> Vec<Arc<Slot>> {
        let slots = self.registry.slots();
        let tracks = &mut self.watch.tracks;
        let live: HashSet<&str> = slots
            .iter()
            .filter_map(|s| s.kernel.get().map(|k| k.id.as_str()))
            .collect();
        tracks.retain(|id, _| live.contains(id.as_str()));
        let due: Vec<Due> = slots
            .into_iter()
            .filter_map(|slot| {
                let kernel = slot.kernel.get()?.clone();
                let track = tracks.entry(kernel.id.clone()).or_default();
                let sampled = kernel.is_alive() && !kernel.is_running_cell() && !track.unreadable;
                sampled.then(|| Due {
                    file: track.file.clone(),
                    slot,
                    kernel,
                })
            })
            .collect();
        if due.is_empty() {
            return Vec::new();
        }
        // One blocking batch for every read (cgroup reads can wait on the kernel's lock).
        let wanted: Vec<(String, Option<CpuFile>)> = due
            .iter()
            .map(|d| (d.kernel.id.clone(), d.file.clone()))
            .collect();
        let Ok(read) = tokio::task::spawn_blocking(move || read_all(wanted)).await else {
            return Vec::new();
        };
        let now = Instant::now();
        let mut runaways = Vec::new();
        for (due, (file, usage)) in due.into_iter().zip(read) {
            let track = tracks.entry(due.kernel.id.clone()).or_default();
            match usage {
                Ok(ns) => {
                    track.file = file;
                    if self.bounds.observe(track, &due.kernel, ns, now)
                        && kill(&self.registry, &due)
                    {
                        runaways.push(due.slot);
                    }
                }
                Err(e) if due.kernel.is_alive() => {
                    track.unreadable = true;
                    if !std::mem::replace(&mut self.watch.warned, true) {
                        tracing::warn!(container = %due.kernel.short_id(), error = %e,
                            "kernels whose CPU time cannot be read are not watched for runaway computation");
                    } else {
                        tracing::debug!(container = %due.kernel.short_id(), error = %e,
                            "not watching this kernel for runaway computation");
                    }
                }
                // Gone meanwhile: the next round forgets it.
                Err(_) => {}
            }
        }
        runaways
    }
}

impl Bounds {
    /// Adds one sample (`ns` of CPU time at `now`) to a kernel's track; true when it has
    /// computed with no cell running for longer than its bound.
    fn observe(&self, track: &mut Track, kernel: &Kernel, ns: u64, now: Instant) -> bool {
        // Read after the CPU time: a cell that began before the read shows here.
        let cells = kernel.cells_begun();
        let last = track.last.replace((ns, now, cells));
        let Some((last_ns, last_at, last_cells)) = last else {
            return false;
        };
        let elapsed = now.saturating_duration_since(last_at);
        if last_cells != cells || kernel.is_running_cell() || elapsed.is_zero() {
            return false;
        }
        let used = ns.saturating_sub(last_ns) as f64;
        let threshold =
            elapsed.as_nanos() as f64 * self.limit_cores * f64::from(self.cpu_percent) / 100.0;
        if used > threshold {
            track.computing += elapsed;
        } else {
            // A quiet interval pays back half its length, never all of what was computed: a
            // kernel that pauses now and then to slip under the watch (or that a loaded host
            // starves for an interval) still adds up when it computes more than a third of the
            // time.
            track.computing = track.computing.saturating_sub(elapsed / QUIET_PAYBACK);
        }
        kernel.set_computing(!track.computing.is_zero());
        let allowed = kernel.last_timeout().unwrap_or(self.cell_timeout) + self.grace;
        track.computing > allowed
    }
}

/// Unregisters a runaway's slot (its loss recorded) unless a call attached meanwhile: that
/// call's cell runs under its own timeout, and the watch goes on after it.
fn kill(registry: &Registry, due: &Due) -> bool {
    let killed = registry.forget_unattached(&due.slot, LossReason::Runaway);
    if killed {
        tracing::warn!(
            container = %due.kernel.short_id(),
            owner = %due.slot.key.owner,
            "kernel kept computing with no cell running past its last cell's timeout; killing it"
        );
    }
    killed
}

/// Reads each kernel's CPU time, finding its cgroup file first when not known yet. Blocking.
fn read_all(
    wanted: Vec<(String, Option<CpuFile>)>,
) -> Vec<(Option<CpuFile>, Result<u64, CpuReadError>)> {
    wanted
        .into_iter()
        .map(|(id, file)| {
            let file = match file {
                Some(file) => file,
                None => match CpuFile::find(&id) {
                    Ok(file) => file,
                    Err(e) => return (None, Err(e)),
                },
            };
            let usage = file.read_ns();
            (Some(file), usage)
        })
        .collect()
}
