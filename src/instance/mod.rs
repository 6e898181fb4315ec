//! Who this orchestrator instance is, and whether another instance is still alive.
//!
//! Every container and volume carries the instance id and the owning process's host, pid and
//! start time, so a sweep can tell leftovers of a dead instance from a live neighbour's work.
//! One concern: no container outlives its instance, but a hibernated kernel's, whose name says
//! so, and one restored by a later instance belongs to that one, as its name says.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Instance`]: this instance's identity, and other instances' [`liveness`] |
//! | `sweep.rs` | label sweeps: dead instances' leftovers, hibernated kernels past their age, stale staging volumes |
//! | `watchdog.rs` | the process that cleans up after an orchestrator that died, and kills a stopped cluster server's kernels at its lease deadline |

pub mod sweep;
pub mod watchdog;

use std::collections::BTreeMap;

use crate::clock::unix_now;
use crate::config::HIBERNATED_SPARED_FOR;
use crate::docker::ContainerInfo;
use crate::labels::{self, NameClaim};

/// The identity of one orchestrator instance.
#[derive(Debug, Clone)]
pub struct Instance {
    /// Random id, unique per orchestrator.
    pub id: String,
    /// Host name of this process.
    pub host: String,
    /// Process id.
    pub pid: u32,
    /// Process start time in clock ticks since boot (0 when unknown).
    pub pid_start: u64,
}

impl Instance {
    /// A new identity for the current process.
    pub fn current() -> Instance {
        let pid = std::process::id();
        Instance {
            id: uuid::Uuid::new_v4().simple().to_string(),
            host: hostname(),
            pid,
            pid_start: process_start(pid).unwrap_or(0),
        }
    }

    /// The labels every object of this instance carries (plus the configured extras).
    pub fn labels(&self, extra: &BTreeMap<String, String>) -> BTreeMap<String, String> {
        let mut l = extra.clone();
        l.insert(labels::MANAGED_BY.into(), labels::MANAGED_BY_VALUE.into());
        l.insert(labels::INSTANCE.into(), self.id.clone());
        l.insert(labels::HOST.into(), self.host.clone());
        l.insert(labels::PID.into(), self.pid.to_string());
        l.insert(labels::PID_START.into(), self.pid_start.to_string());
        l
    }
}

/// What a sweep may conclude about the instance that labelled an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Liveness {
    /// The owning process is running (or it is us).
    Alive,
    /// The owning process is gone from this host.
    Dead,
    /// Another host (or pid namespace) owns it; judge by the object's own state.
    Unknown,
}

/// Whether a sweep leaves the container for its name's claim: a hibernated kernel's stopped
/// container, within [`HIBERNATED_SPARED_FOR`] of its hibernation, whatever instance made it
/// (`docs/runtimes.md`, "Hibernation").
pub fn hibernated(c: &ContainerInfo) -> bool {
    match labels::name_claim(&c.name) {
        NameClaim::Hibernated { since } => {
            c.state == "exited"
                && unix_now().saturating_sub(since) < HIBERNATED_SPARED_FOR.as_secs()
        }
        _ => false,
    }
}

/// The labels that say whose a container is: those its name claims when another instance
/// restored it ([`labels::run_by_name`]; on this host), else its own.
pub fn owner_labels(me: &Instance, c: &ContainerInfo) -> BTreeMap<String, String> {
    match labels::name_claim(&c.name) {
        NameClaim::RunBy {
            instance,
            pid,
            pid_start,
        } => BTreeMap::from([
            (labels::INSTANCE.to_string(), instance),
            (labels::HOST.to_string(), me.host.clone()),
            (labels::PID.to_string(), pid.to_string()),
            (labels::PID_START.to_string(), pid_start.to_string()),
        ]),
        _ => c.labels.clone(),
    }
}

/// Decides whether the instance named by `labels` is alive, from this process's view.
pub fn liveness(me: &Instance, object_labels: &BTreeMap<String, String>) -> Liveness {
    if object_labels.get(labels::INSTANCE) == Some(&me.id) {
        return Liveness::Alive;
    }
    if object_labels.get(labels::HOST) != Some(&me.host) {
        return Liveness::Unknown;
    }
    let Some(pid) = labels::int(object_labels, labels::PID) else {
        return Liveness::Unknown;
    };
    let start = labels::int(object_labels, labels::PID_START).unwrap_or(0) as u64;
    match process_start(pid as u32) {
        None => Liveness::Dead,
        Some(actual) if start != 0 && actual != start => Liveness::Dead,
        Some(_) => Liveness::Alive,
    }
}

/// The machine's host name.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Start time of a process in clock ticks since boot (field 22 of /proc/PID/stat).
pub fn process_start(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; fields resume after the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hibernated_kernel_is_left_for_its_name_and_a_restored_one_is_its_restorers() {
        let me = Instance::current();
        let container = |name: String, state: &str| ContainerInfo {
            id: "c".into(),
            state: state.into(),
            labels: BTreeMap::from([
                (labels::INSTANCE.to_string(), "gone".to_string()),
                (labels::HOST.to_string(), me.host.clone()),
                (labels::PID.to_string(), u32::MAX.to_string()),
            ]),
            created: 0,
            name,
        };
        let now = unix_now();
        let recent = labels::hibernated_name(now - 60, "t", "s", "0123456789ab");
        let old = labels::hibernated_name(
            now - HIBERNATED_SPARED_FOR.as_secs() - 1,
            "t",
            "s",
            "0123456789ab",
        );
        assert!(hibernated(&container(format!("/{recent}"), "exited")));
        assert!(!hibernated(&container(recent.clone(), "running")));
        assert!(!hibernated(&container(old, "exited")));
        assert!(!hibernated(&container("kb.t.s.x".into(), "exited")));
        // Labelled by a dead instance; named for this one (or a dead one) that restored it.
        let plain = container("x".into(), "running");
        assert_eq!(liveness(&me, &owner_labels(&me, &plain)), Liveness::Dead);
        let mine = labels::run_by_name(&me.id, me.pid, me.pid_start, "t", "s", "c");
        let other = labels::run_by_name("other", me.pid, me.pid_start + 1, "t", "s", "c");
        let mine = container(mine, "running");
        assert_eq!(liveness(&me, &owner_labels(&me, &mine)), Liveness::Alive);
        let other = container(other, "running");
        assert_eq!(liveness(&me, &owner_labels(&me, &other)), Liveness::Dead);
    }

    #[test]
    fn our_own_process_is_alive_and_a_vanished_pid_is_dead() {
        let me = Instance::current();
        assert!(me.pid_start > 0);
        let other = Instance {
            id: "other".into(),
            ..me.clone()
        };
        assert_eq!(
            liveness(&me, &other.labels(&BTreeMap::new())),
            Liveness::Alive
        );
        let dead = Instance {
            id: "dead".into(),
            pid_start: me.pid_start + 1,
            ..me.clone()
        };
        assert_eq!(
            liveness(&me, &dead.labels(&BTreeMap::new())),
            Liveness::Dead
        );
        let remote = Instance {
            id: "remote".into(),
            host: "elsewhere".into(),
            ..me.clone()
        };
        assert_eq!(
            liveness(&me, &remote.labels(&BTreeMap::new())),
            Liveness::Unknown
        );
    }
}
