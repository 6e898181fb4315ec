//! Background processes (`docs/processes.md`): processes started in a session's kernel
//! container beside its cells, each with a handle (an id) to list it, read its output (what is
//! kept, then live), write and close its stdin, signal it, kill it, and learn its exit code.
//! The orchestrator starts one on the owner's kernel (`orchestrator/process.rs`: the kernel
//! held or started as a command's is); everything else is this service's.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Processes`]: the processes per session, their bounds per session, tenant and host, the verbs; [`ProcessError`] |
//! | `process.rs` | one process: its pump task (output into its ring, its pid, its exit code), its stdin, a reader attached to its output |
//! | `ring.rs` | a process's recent output under its byte cap, with absolute offsets |
//!
//! What one process makes the host hold: one pump task and the engine's exec streams (until
//! it ends or its kernel goes), its kept output ([`OUTPUT_BUFFER_BYTES`]), its stdin pipe;
//! per reader a cursor. Bounds: [`MAX_PROCESSES_PER_SESSION`] running per session,
//! [`MAX_PROCESSES_PER_TENANT`] per tenant, [`MAX_PROCESSES`] per host;
//! [`MAX_ENDED_KEPT`] ended ones kept per session, [`MAX_ENDED_KEPT_PER_TENANT`] per tenant
//! and [`MAX_ENDED_KEPT_HOST`] on the host (the oldest forgotten first; a cleared session's
//! are forgotten with it); [`MAX_READERS`] readers per process; a stdin write at most
//! [`MAX_STDIN_WRITE`] bytes, done within [`STDIN_WRITE_LIMIT`] or refused. A process dies
//! with its kernel's container (timeout, reset, clear, eviction, the server's stop), and a
//! client that goes away does not stop it.

mod process;
mod ring;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use process::{Attach, OutputItem, Process};

use crate::docker::EngineError;
use crate::kernel::{Kernel, ProcessSpec, StartedProcess};
use crate::owner::Owner;
use crate::wire::ProcessInfo;

/// Running background processes one session may have.
pub const MAX_PROCESSES_PER_SESSION: usize = 16;
/// Running background processes one tenant may have.
pub const MAX_PROCESSES_PER_TENANT: usize = 64;
/// Running background processes on the host.
pub const MAX_PROCESSES: usize = 512;
/// Output kept per process (its stdout and stderr together, the newest), in bytes.
pub const OUTPUT_BUFFER_BYTES: usize = 256 * 1024;
/// Ended processes kept per session (their exit code and kept output), the oldest forgotten
/// first.
pub const MAX_ENDED_KEPT: usize = 16;
/// Ended processes kept on the host.
pub const MAX_ENDED_KEPT_HOST: usize = 1024;
/// Ended processes kept per tenant (the oldest forgotten first), so that one tenant cannot
/// push the others' out of the host's [`MAX_ENDED_KEPT_HOST`].
pub const MAX_ENDED_KEPT_PER_TENANT: usize = 64;
/// Readers of one process's output at once.
pub const MAX_READERS: usize = 8;
/// Longest write to a process's stdin, in bytes.
pub const MAX_STDIN_WRITE: usize = 1024 * 1024;
/// How long a stdin write may wait for the process to take it.
pub const STDIN_WRITE_LIMIT: Duration = Duration::from_secs(10);
/// How long the engine may take to give an ended process's exit code.
const EXIT_CODE_LIMIT: Duration = Duration::from_secs(10);
/// How long a kill waits for the process to end.
const KILL_LIMIT: Duration = Duration::from_secs(10);

/// A background process verb that failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The request itself is wrong (an empty program, a bad environment variable or signal).
    #[error("invalid process request: {0}")]
    Invalid(String),
    /// No such process in this session (never started, or ended and forgotten).
    #[error("session {owner} has no background process {id}")]
    NotFound {
        /// Whose.
        owner: String,
        /// The id asked for.
        id: u64,
    },
    /// A bound on running processes was reached.
    #[error("{scope} already runs {max} background processes, the most allowed; retry when one has ended")]
    TooMany {
        /// `session NAME`, `tenant NAME` or `the host`.
        scope: String,
        /// The bound.
        max: usize,
    },
    /// The process's stdin is closed (never opened, closed, or the process ended).
    #[error("the stdin of process {id} is closed")]
    StdinClosed {
        /// The process.
        id: u64,
    },
    /// The process did not take a stdin write in time.
    #[error("process {id} did not take its stdin within {seconds}s; nothing more was written")]
    StdinStuck {
        /// The process.
        id: u64,
        /// The limit.
        seconds: u64,
    },
    /// A stdin write was too long.
    #[error("a stdin write is at most {max} bytes")]
    StdinTooLarge {
        /// The bound.
        max: usize,
    },
    /// The process has as many readers as allowed.
    #[error("process {id} already has {max} readers of its output")]
    TooManyReaders {
        /// The process.
        id: u64,
        /// The bound.
        max: usize,
    },
    /// The process has not said its pid yet, so it cannot be signalled; retry.
    #[error("process {id} is still starting; retry")]
    Starting {
        /// The process.
        id: u64,
    },
    /// The engine failed (starting, signalling or killing).
    #[error("{op} a background process: {source}")]
    Engine {
        /// What was being done.
        op: &'static str,
        /// The engine's error.
        source: EngineError,
    },
}

/// The processes, by session.
pub(crate) struct Processes {
    state: Arc<Mutex<State>>,
    tracker: TaskTracker,
    cancel: CancellationToken,
}

#[derive(Default)]
struct State {
    sessions: HashMap<Owner, BTreeMap<u64, Arc<Process>>>,
    running_by_session: HashMap<Owner, usize>,
    running_by_tenant: HashMap<String, usize>,
    running: usize,
    /// Ended processes, oldest first, for [`MAX_ENDED_KEPT_HOST`].
    ended: VecDeque<(Owner, u64)>,
    /// The last id given per session (ids count from 1 per session, so one tenant's starts
    /// are not visible in another's ids; forgotten when the session is cleared).
    last_id: HashMap<Owner, u64>,
}

/// A running process's place under the bounds; given back (and the process filed as ended)
/// when dropped.
pub(crate) struct LiveSlot {
    state: Arc<Mutex<State>>,
    owner: Owner,
    id: Option<u64>,
}

impl Drop for LiveSlot {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.running = state.running.saturating_sub(1);
        decrement(&mut state.running_by_session, &self.owner);
        decrement(&mut state.running_by_tenant, &self.owner.tenant);
        // A process of a session cleared meanwhile was forgotten with it: not filed again.
        let known = self.id.filter(|id| {
            state
                .sessions
                .get(&self.owner)
                .is_some_and(|p| p.contains_key(id))
        });
        if let Some(id) = known {
            state.ended.push_back((self.owner.clone(), id));
            state.forget_ended(&self.owner);
        }
    }
}

fn decrement<K: std::hash::Hash + Eq + Clone>(counts: &mut HashMap<K, usize>, key: &K) {
    if let Some(n) = counts.get_mut(key) {
        *n -= 1;
        if *n == 0 {
            counts.remove(key);
        }
    }
}

impl State {
    /// Forgets the oldest ended processes past [`MAX_ENDED_KEPT`] of `owner` and past
    /// [`MAX_ENDED_KEPT_HOST`] on the host.
    fn forget_ended(&mut self, owner: &Owner) {
        let ended_of_owner: Vec<u64> = self
            .ended
            .iter()
            .filter(|(o, _)| o == owner)
            .map(|(_, id)| *id)
            .collect();
        let excess = ended_of_owner.len().saturating_sub(MAX_ENDED_KEPT);
        for id in &ended_of_owner[..excess] {
            self.forget(owner.clone(), *id);
        }
        // One tenant's ended processes never take the host's whole share from the others.
        let ended_of_tenant: Vec<(Owner, u64)> = self
            .ended
            .iter()
            .filter(|(o, _)| o.tenant == owner.tenant)
            .cloned()
            .collect();
        let excess = ended_of_tenant
            .len()
            .saturating_sub(MAX_ENDED_KEPT_PER_TENANT);
        for (o, id) in ended_of_tenant.into_iter().take(excess) {
            self.forget(o, id);
        }
        while self.ended.len() > MAX_ENDED_KEPT_HOST {
            let Some((owner, id)) = self.ended.front().cloned() else {
                break;
            };
            self.forget(owner, id);
        }
    }

    /// Forgets every process of `tenant`'s `session` (its children's included): the session
    /// was cleared, and a later conversation of the same name must not read them.
    fn forget_session(&mut self, tenant: &str, session: &str) {
        let of_session = |o: &Owner| o.tenant == tenant && o.session == session;
        self.ended.retain(|(o, _)| !of_session(o));
        self.sessions.retain(|o, _| !of_session(o));
        self.last_id.retain(|o, _| !of_session(o));
    }

    fn forget(&mut self, owner: Owner, id: u64) {
        self.ended.retain(|(o, i)| !(o == &owner && *i == id));
        if let Some(procs) = self.sessions.get_mut(&owner) {
            procs.remove(&id);
            if procs.is_empty() {
                self.sessions.remove(&owner);
            }
        }
    }
}

impl Processes {
    /// The service, its tasks on `tracker`, ended by `cancel` (the orchestrator's stop).
    pub(crate) fn new(tracker: TaskTracker, cancel: CancellationToken) -> Processes {
        Processes {
            state: Arc::default(),
            tracker,
            cancel,
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes a running process's place for `owner` under the bounds.
    fn reserve(&self, owner: &Owner) -> Result<LiveSlot, ProcessError> {
        let mut state = self.state();
        let session = state.running_by_session.get(owner).copied().unwrap_or(0);
        let tenant = state
            .running_by_tenant
            .get(&owner.tenant)
            .copied()
            .unwrap_or(0);
        let refused = if session >= MAX_PROCESSES_PER_SESSION {
            Some((format!("session {owner}"), MAX_PROCESSES_PER_SESSION))
        } else if tenant >= MAX_PROCESSES_PER_TENANT {
            Some((format!("tenant {}", owner.tenant), MAX_PROCESSES_PER_TENANT))
        } else if state.running >= MAX_PROCESSES {
            Some(("the host".to_string(), MAX_PROCESSES))
        } else {
            None
        };
        if let Some((scope, max)) = refused {
            return Err(ProcessError::TooMany { scope, max });
        }
        state.running += 1;
        *state.running_by_session.entry(owner.clone()).or_default() += 1;
        *state
            .running_by_tenant
            .entry(owner.tenant.clone())
            .or_default() += 1;
        Ok(LiveSlot {
            state: self.state.clone(),
            owner: owner.clone(),
            id: None,
        })
    }

    /// Starts a process on `owner`'s `kernel` (the caller holds it while this runs); its pump
    /// runs on the service's tracker until it ends.
    pub(crate) async fn start(
        &self,
        owner: &Owner,
        kernel: Arc<Kernel>,
        spec: ProcessSpec,
    ) -> Result<ProcessInfo, ProcessError> {
        let mut slot = self.reserve(owner)?;
        let StartedProcess {
            output,
            input,
            exit_code,
        } = kernel
            .start_process(&spec)
            .await
            .map_err(|source| ProcessError::Engine {
                op: "starting",
                source,
            })?;
        let id = {
            let mut state = self.state();
            let last = state.last_id.entry(owner.clone()).or_default();
            *last += 1;
            *last
        };
        slot.id = Some(id);
        let ProcessSpec {
            argv,
            cwd,
            stdin_open,
            ..
        } = spec;
        let process = Arc::new(Process::new(id, argv, cwd, kernel, input, stdin_open));
        let process = {
            let mut state = self.state();
            state
                .sessions
                .entry(owner.clone())
                .or_default()
                .insert(id, process.clone());
            process
        };
        let info = process.info();
        self.tracker
            .spawn(process.pump(output, exit_code, self.cancel.clone(), slot));
        Ok(info)
    }

    /// `owner`'s processes, oldest first.
    /// Forgets a cleared session's processes (`Orchestrator::clear_session`): its running
    /// ones end with its kernels and are not filed as ended.
    pub(crate) fn forget_session(&self, tenant: &str, session: &str) {
        self.state().forget_session(tenant, session);
    }

    pub(crate) fn list(&self, owner: &Owner) -> Vec<ProcessInfo> {
        let procs: Vec<Arc<Process>> = self
            .state()
            .sessions
            .get(owner)
            .map(|p| p.values().cloned().collect())
            .unwrap_or_default();
        procs.iter().map(|p| p.info()).collect()
    }

    /// One of `owner`'s processes.
    pub(crate) fn get(&self, owner: &Owner, id: u64) -> Result<Arc<Process>, ProcessError> {
        self.state()
            .sessions
            .get(owner)
            .and_then(|p| p.get(&id))
            .cloned()
            .ok_or_else(|| ProcessError::NotFound {
                owner: owner.to_string(),
                id,
            })
    }

    /// Waits (at most [`KILL_LIMIT`]) until a process can be signalled: its leader said its
    /// pid, or it ended (the E2B API answers a start once its pid is known, docs/e2b.md).
    pub(crate) async fn started(&self, owner: &Owner, id: u64) -> Result<(), ProcessError> {
        let process = self.get(owner, id)?;
        let _ = tokio::time::timeout(KILL_LIMIT, process.started(&self.cancel)).await;
        Ok(())
    }

    /// A reader of a process's output (what is kept, then live, then its exit).
    pub(crate) fn attach(&self, owner: &Owner, id: u64) -> Result<Attach, ProcessError> {
        self.get(owner, id)?.attach(self.cancel.clone())
    }

    /// Writes on a process's stdin; returns how many bytes.
    pub(crate) async fn write_stdin(
        &self,
        owner: &Owner,
        id: u64,
        data: &[u8],
    ) -> Result<u64, ProcessError> {
        if data.len() > MAX_STDIN_WRITE {
            return Err(ProcessError::StdinTooLarge {
                max: MAX_STDIN_WRITE,
            });
        }
        self.get(owner, id)?
            .write_stdin(data, STDIN_WRITE_LIMIT)
            .await?;
        Ok(data.len() as u64)
    }

    /// Closes a process's stdin.
    pub(crate) async fn close_stdin(
        &self,
        owner: &Owner,
        id: u64,
    ) -> Result<ProcessInfo, ProcessError> {
        let process = self.get(owner, id)?;
        process.close_stdin(STDIN_WRITE_LIMIT).await?;
        Ok(process.info())
    }

    /// Sends a signal to a process's command (no-op once it ended).
    pub(crate) async fn signal(
        &self,
        owner: &Owner,
        id: u64,
        signal: i32,
    ) -> Result<ProcessInfo, ProcessError> {
        let process = self.get(owner, id)?;
        if process.exit().is_none() {
            let leader = process.leader().ok_or(ProcessError::Starting { id })?;
            process
                .kernel
                .signal_process(leader, signal)
                .await
                .map_err(|source| ProcessError::Engine {
                    op: "signalling",
                    source,
                })?;
        }
        Ok(process.info())
    }

    /// Kills a process and everything it started (the leader's whole tree), and waits for
    /// it to end (bounded); no-op once it ended.
    pub(crate) async fn kill(&self, owner: &Owner, id: u64) -> Result<ProcessInfo, ProcessError> {
        let process = self.get(owner, id)?;
        if process.exit().is_none() {
            let leader = process.leader().ok_or(ProcessError::Starting { id })?;
            process
                .kernel
                .kill_tree(leader)
                .await
                .map_err(|source| ProcessError::Engine {
                    op: "killing",
                    source,
                })?;
            let _ = tokio::time::timeout(KILL_LIMIT, process.ended(&self.cancel)).await;
        }
        Ok(process.info())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_ended(state: &mut State, tenant: &str, session: &str, id: u64) {
        let owner = Owner::new(tenant, session, None).expect("a valid owner");
        state.ended.push_back((owner.clone(), id));
        state.forget_ended(&owner);
    }

    #[test]
    fn one_tenant_keeps_at_most_its_share_of_ended_processes() {
        let mut state = State::default();
        file_ended(&mut state, "other", "s", 0);
        for id in 1..=200u64 {
            file_ended(&mut state, "greedy", &format!("s{}", id % 20), id);
        }
        let greedy = state
            .ended
            .iter()
            .filter(|(o, _)| o.tenant == "greedy")
            .count();
        assert_eq!(greedy, MAX_ENDED_KEPT_PER_TENANT);
        // The newest are kept, and the other tenant's record is untouched.
        assert!(state.ended.iter().any(|(_, id)| *id == 200));
        assert!(state.ended.iter().any(|(o, _)| o.tenant == "other"));
    }

    #[test]
    fn a_cleared_session_forgets_its_ended_processes() {
        let mut state = State::default();
        file_ended(&mut state, "t", "gone", 1);
        file_ended(&mut state, "t", "kept", 2);
        state.forget_session("t", "gone");
        let left: Vec<u64> = state.ended.iter().map(|(_, id)| *id).collect();
        assert_eq!(left, vec![2]);
    }
}
