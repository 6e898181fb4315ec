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
//!
//! In a cluster the watchdog also enforces the node's lease from outside the server
//! (`docs/cluster.md`, "Leases and fencing"): after each renewal the server writes on the pipe
//! until when its lease is trusted (`trust <nanoseconds since boot>`, `CLOCK_BOOTTIME`); once that time
//! passes with no later one written (the server stopped, frozen or stalled), the watchdog
//! kills every running kernel of the instance, so none runs a cell while another node may
//! already run the session's next generation. The fence margin is the time it has to do so.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use futures::StreamExt;

use crate::docker::{Engine, EngineError};
use std::collections::HashSet;

use crate::labels::{self, NameClaim};

/// A running watchdog; dropping it lets the watchdog sweep and exit.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    /// Deadlines for the lifeline's writer; dropping it closes the lifeline.
    deadlines: Option<std::sync::mpsc::SyncSender<u64>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// The last time told by [`Watchdog::trust_until`].
    told: std::sync::Mutex<Option<Instant>>,
}

impl Watchdog {
    /// Starts the watchdog binary for `instance`. `checkpoints`, the tag of the checkpoints
    /// directory the instance uses (`labels::checkpoints_tag`), goes on the watchdog's command
    /// line, so `kernelbox sweep` on this host sees a live server uses that directory even
    /// while it runs no container ([`super::sweep::sweep_hibernated`]).
    pub fn spawn(
        binary: &Path,
        instance: &str,
        checkpoints: Option<&str>,
    ) -> std::io::Result<Watchdog> {
        let mut command = Command::new(binary);
        command.arg("watchdog").arg("--instance").arg(instance);
        if let Some(tag) = checkpoints {
            command.arg(CHECKPOINTS_ARG).arg(tag);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .process_group(0)
            .spawn()?;
        let lifeline = child.stdin.take();
        // The lifeline is written by a thread of its own: a watchdog that stops reading must
        // never block the lease loop that gives the deadlines.
        let (deadlines, pending) = std::sync::mpsc::sync_channel(1);
        let writer = std::thread::Builder::new()
            .name("kernelbox-lifeline".into())
            .spawn(move || write_lifeline(lifeline, pending))?;
        Ok(Watchdog {
            child,
            deadlines: Some(deadlines),
            writer: Some(writer),
            told: std::sync::Mutex::new(None),
        })
    }

    /// Tells the watchdog that this instance's kernels may run until `until`, and no longer
    /// unless a later time follows. While the writer is still busy with an earlier (sooner)
    /// time, this one is dropped: the watchdog keeps the sooner one until the next.
    pub fn trust_until(&self, until: Instant) {
        *self.told.lock().unwrap_or_else(|p| p.into_inner()) = Some(until);
        if let Some(deadlines) = &self.deadlines {
            let _ = deadlines.try_send(clock_deadline(until));
        }
    }

    /// Whether the last time given to [`Watchdog::trust_until`] has passed (false before
    /// any): the kernels are being killed, so a kernel's death now is the lease's.
    pub fn deadline_passed(&self) -> bool {
        self.told
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some_and(|until| Instant::now() >= until)
    }

    /// Closes the lifeline and waits for the watchdog's final sweep.
    pub fn finish(mut self) {
        self.deadlines.take();
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
        let _ = self.child.wait();
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.deadlines.take();
    }
}

/// Writes each deadline on the lifeline until the sender goes (or the watchdog does); then
/// closes it, which tells the watchdog to sweep.
fn write_lifeline(lifeline: Option<ChildStdin>, pending: std::sync::mpsc::Receiver<u64>) {
    let Some(mut pipe) = lifeline else {
        return;
    };
    for ns in pending {
        if pipe
            .write_all(format!("{TRUST} {ns}\n").as_bytes())
            .is_err()
        {
            return;
        }
    }
}

/// The watchdog's argument naming its server's checkpoints directory tag.
pub const CHECKPOINTS_ARG: &str = "--checkpoints";

/// The checkpoints directory tags of the live servers on this host, read from their
/// watchdogs' command lines (`watchdog --instance ID --checkpoints TAG`) in `/proc`; only
/// processes of this process's pid namespace count, so no kernel's process (each in its
/// container's namespace) can pose as one. A watchdog outlives its server only for its final
/// sweep. Bounded: the first 4096 processes, 4 KiB of each command line.
pub fn live_checkpoint_tags() -> std::collections::HashSet<String> {
    const PROCESSES: usize = 4096;
    const CMDLINE: u64 = 4096;
    let mut tags = std::collections::HashSet::new();
    let Ok(own_ns) = std::fs::read_link("/proc/self/ns/pid") else {
        return tags;
    };
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return tags;
    };
    for entry in entries.flatten().take(PROCESSES) {
        let name = entry.file_name();
        if !name
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let dir = entry.path();
        if std::fs::read_link(dir.join("ns/pid")).ok().as_ref() != Some(&own_ns) {
            continue;
        }
        let mut cmdline = Vec::new();
        let read = std::fs::File::open(dir.join("cmdline"))
            .and_then(|f| f.take(CMDLINE).read_to_end(&mut cmdline));
        if read.is_err() {
            continue;
        }
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let is_watchdog = args.get(1) == Some(&b"watchdog".as_slice())
            && args.get(2) == Some(&b"--instance".as_slice());
        if !is_watchdog || args.get(4) != Some(&CHECKPOINTS_ARG.as_bytes()) {
            continue;
        }
        if let Some(tag) = args.get(5).and_then(|t| std::str::from_utf8(t).ok()) {
            tags.insert(tag.to_string());
        }
    }
    tags
}

/// The word of a lifeline line giving the time the kernels may run until.
const TRUST: &str = "trust";

/// Longest line read on the lifeline; a longer one is ignored.
const LINE_LIMIT: usize = 64;

/// The host's boot clock now (`CLOCK_BOOTTIME`, the clock of `/proc/uptime`): one clock for
/// every process of the host, so the server's deadline means the same instant to its
/// watchdog. Read without opening anything, so a process at its descriptor limit still
/// gives its watchdog a true deadline (`docs/cluster.md`, "Leases and fencing").
#[allow(unsafe_code)]
fn clock_now() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec the call writes; CLOCK_BOOTTIME exists on every
    // Linux kernelbox runs on (2.6.39 and later).
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) };
    if rc != 0 {
        // Never on Linux; a zero clock would make every deadline look far off to the
        // watchdog, never past.
        return Duration::ZERO;
    }
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or_default(),
        u32::try_from(now.tv_nsec).unwrap_or_default(),
    )
}

/// `until` on the boot clock, in nanoseconds. The clock is read before `Instant::now()`, so
/// a stall between the two reads makes the deadline sooner, never later.
fn clock_deadline(until: Instant) -> u64 {
    let clock = clock_now();
    let left = until.saturating_duration_since(Instant::now());
    u64::try_from((clock + left).as_nanos()).unwrap_or(u64::MAX)
}

/// Reads the lifeline until EOF, publishing each `trust` deadline it gives.
fn read_lifeline(mut input: impl Read, deadline: tokio::sync::watch::Sender<Option<u64>>) {
    let mut chunk = [0u8; 256];
    let mut line: Vec<u8> = Vec::with_capacity(LINE_LIMIT);
    let mut overlong = false;
    loop {
        let n = match input.read(&mut chunk) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return,
        };
        for &byte in &chunk[..n] {
            if byte != b'\n' {
                if line.len() < LINE_LIMIT {
                    line.push(byte);
                } else {
                    overlong = true;
                }
                continue;
            }
            if !overlong {
                if let Some(ns) = parse_trust(&line) {
                    deadline.send_replace(Some(ns));
                }
            }
            line.clear();
            overlong = false;
        }
    }
}

fn parse_trust(line: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(line).ok()?;
    let (word, ns) = text.trim().split_once(' ')?;
    (word == TRUST).then(|| ns.parse().ok()).flatten()
}

/// The watchdog's body: block until stdin closes, then remove every object of `instance`.
/// Meanwhile, each time a `trust` deadline the server gave passes with no later one given,
/// every running kernel of the instance is killed ([`stop_kernels`]).
pub async fn run(engine: &dyn Engine, instance: &str) -> Result<usize, EngineError> {
    let (deadline, mut deadlines) = tokio::sync::watch::channel(None);
    // Reading stdin blocks a thread, not the runtime; EOF drops the sender.
    let reader = tokio::task::spawn_blocking(move || read_lifeline(std::io::stdin(), deadline));
    let mut enforced = None;
    loop {
        let current = *deadlines.borrow_and_update();
        let pending = current.filter(|_| enforced != current);
        let due = async move {
            match pending {
                Some(ns) => {
                    let left = Duration::from_nanos(ns).saturating_sub(clock_now());
                    tokio::time::sleep(left).await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            changed = deadlines.changed() => {
                if changed.is_err() {
                    break;
                }
            }
            () = due => {
                enforced = current;
                match stop_kernels(engine, instance).await {
                    Ok(0) => {}
                    Ok(n) => tracing::warn!(
                        kernels = n,
                        "watchdog: the server's lease deadline passed with no renewal: its kernels were killed"
                    ),
                    Err(e) => tracing::warn!(error = %e, "watchdog: stopping the kernels failed"),
                }
            }
        }
    }
    let _ = reader.await;
    remove_instance(engine, instance).await
}

/// Kills every container `instance` runs (a created one is removed, so it never starts);
/// stopped ones, hibernated kernels' among them, are left for the server's fence or the final
/// sweep. Returns how many were stopped.
pub async fn stop_kernels(engine: &dyn Engine, instance: &str) -> Result<usize, EngineError> {
    let doomed: Vec<_> = engine
        .list_containers(&[labels::managed()])
        .await?
        .into_iter()
        .filter(|c| runs(c, instance) && !matches!(c.state.as_str(), "exited" | "dead"))
        .collect();
    let stops = doomed.into_iter().map(|c| async move {
        if c.state == "created" {
            engine.remove_container(&c.id).await
        } else {
            engine.kill(&c.id).await
        }
    });
    let results: Vec<_> = futures::stream::iter(stops)
        .buffer_unordered(crate::docker::REMOVAL_CONCURRENCY)
        .collect()
        .await;
    let mut count = 0;
    for result in results {
        match result {
            Ok(()) => count += 1,
            Err(e) => tracing::warn!(error = %e, "watchdog: stopping a kernel failed"),
        }
    }
    Ok(count)
}

/// Whether `instance` runs `c`: the name of a restored kernel says who runs it, else its
/// labels do.
fn runs(c: &crate::docker::ContainerInfo, instance: &str) -> bool {
    match labels::name_claim(&c.name) {
        NameClaim::RunBy { instance: by, .. } => by == instance,
        _ => c.labels.get(labels::INSTANCE).map(String::as_str) == Some(instance),
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lifeline_gives_the_last_well_formed_deadline_and_ignores_the_rest() {
        let overlong = format!("trust {}\n", "9".repeat(LINE_LIMIT));
        let input = format!("trust 5\nbogus 6\ntrust x\n{overlong}trust 7\ntrust 8");
        let (tx, rx) = tokio::sync::watch::channel(None);
        read_lifeline(input.as_bytes(), tx);
        // "trust 8" has no end of line: EOF came first, it is not read.
        assert_eq!(*rx.borrow(), Some(7));
    }

    #[test]
    fn a_deadline_on_the_boot_clock_is_never_later_than_the_instant() {
        let until = Instant::now() + Duration::from_secs(5);
        let ns = clock_deadline(until);
        let after = clock_now() + Duration::from_secs(5);
        assert!(Duration::from_nanos(ns) <= after);
        assert!(Duration::from_nanos(ns) > clock_now());
    }
}
