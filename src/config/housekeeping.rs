//! What this instance leaves behind and watches: labels, the watchdog, sweeps, the state
//! directory, the runaway watch ([`Housekeeping`]).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// What this instance labels, sweeps, watches and keeps on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Housekeeping {
    /// Labels added to everything this instance creates (tests use them to find their own).
    pub extra_labels: BTreeMap<String, String>,
    /// The kernelbox binary run as this instance's watchdog; `None` disables the watchdog.
    pub watchdog: Option<PathBuf>,
    /// Sweep leftovers of dead instances when the orchestrator starts.
    pub sweep_on_start: bool,
    /// Staging volumes older than this and not in use are swept.
    pub staging_max_age: Duration,
    /// Directory of the durable owner catalog (created if missing), so that the state lost
    /// by a restart of this process is reported to owners and generations keep counting.
    /// One process per directory. `None` (the default): no catalog, nothing survives.
    pub state_dir: Option<PathBuf>,
    /// The watch on kernels that compute with no cell running.
    pub runaway: RunawayWatch,
}

/// The watch on kernels that keep computing with no cell running (`docs/reliability.md`,
/// "Runaway kernels"): every `interval` the orchestrator reads the CPU time of each kernel
/// with no running cell from its cgroup. An interval in which it used more than `cpu_percent`
/// of its CPU limit counts as computing; a kernel computing for longer than its last cell's
/// timeout plus `grace`, with no cell between, is killed (`state_lost.reason = "runaway"`).
/// While it computes it counts as busy: listed `busy`, never reaped or evicted as idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunawayWatch {
    /// How often kernels with no running cell are sampled.
    pub interval: Duration,
    /// The share of its CPU limit (`Sandbox::nano_cpus`), in percent, above which an interval
    /// counts as computing. Below half a core so that a kernel computing on a host whose other
    /// work leaves it a third of a core (seen on a loaded CI host) is still caught.
    pub cpu_percent: u32,
    /// How long past its last cell's timeout a kernel may keep computing.
    pub grace: Duration,
}

impl Default for RunawayWatch {
    fn default() -> Self {
        RunawayWatch {
            interval: Duration::from_secs(1),
            cpu_percent: 25,
            grace: Duration::from_secs(2),
        }
    }
}

impl Default for Housekeeping {
    fn default() -> Self {
        Housekeeping {
            extra_labels: BTreeMap::new(),
            watchdog: None,
            sweep_on_start: true,
            staging_max_age: Duration::from_secs(7 * 24 * 3600),
            state_dir: None,
            runaway: RunawayWatch::default(),
        }
    }
}
