//! How a cell ended, and how that becomes its result (`docs/contract.md`, "Statuses" and
//! "Loss reasons"). [`Ending`] is the one type for a cell's end: the kernel's cell loop ends
//! a cell with one (`kernel/run.rs`), the orchestrator tells apart the rows only it can see
//! (whether the cell ran, whether its kernel was cleared under it or its node's lease lapsed:
//! `orchestrator/execute.rs`), and one pure function, [`Ending::verdict`], gives the row's
//! status, exit code, error and `kernel.ended`, the loss the owner's next call reports, and
//! whether the kernel stays. Nothing here needs an engine.

use std::time::Duration;

use super::messages;
use super::{CellStatus, LossReason};

/// How a cell ended: one case per row of the contract's table of statuses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The cell ran to its end.
    Completed,
    /// The cell called `sys.exit()`; its kernel ended.
    Exited,
    /// The cell raised (a Bash cell: its last command failed).
    Raised {
        /// The traceback (or kernelbox's note on an unreadable end frame).
        traceback: String,
        /// The result's `exit_code`: 1, or a Bash cell's last command's status.
        exit_code: i32,
    },
    /// The cell ran past its timeout.
    TimedOut {
        /// The timeout it ran under.
        timeout: Duration,
    },
    /// The caller interrupted the cell once it had its kernel, and the cell stopped on the
    /// KeyboardInterrupt within the grace: the kernel stays.
    InterruptStopped,
    /// The caller interrupted the cell once it had its kernel, and it had not stopped when
    /// the grace passed: the kernel was killed.
    InterruptKilled {
        /// The grace it had.
        grace: Duration,
    },
    /// The caller interrupted the cell while it waited behind an earlier cell: it never ran.
    InterruptedWhileQueued,
    /// Its kernel was cleared or reset under it (`DELETE`, `reset: true`, a child's release).
    Cleared,
    /// Its kernel died under it.
    Died(KernelDeath),
}

/// Why a kernel died, in the contract's terms (each with its message and loss reason).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelDeath {
    /// It ran out of memory.
    Oom {
        /// Its memory limit, in bytes (the message gives it in MiB).
        memory_bytes: i64,
    },
    /// It was killed or removed from outside kernelbox.
    Killed,
    /// It was stopped because its node's cluster lease was no longer trusted (by the
    /// watchdog or the fence: `docs/cluster.md`, "Leases and fencing").
    NodeLost,
    /// The runner died on its own.
    Crashed {
        /// The runner's exit code.
        exit_code: i64,
    },
    /// The Docker engine restarted or went away and took it with it.
    EngineRestarted,
    /// It broke the runner protocol past a bound and was killed.
    Protocol {
        /// What it did.
        what: &'static str,
    },
    /// kernelbox disposed of it otherwise than by a clear (at shutdown).
    ShutDown,
    /// It had ended by `sys.exit()`.
    Exited,
}

impl KernelDeath {
    /// The error of the cell it died under.
    pub fn message(self) -> String {
        match self {
            KernelDeath::Oom { memory_bytes } => messages::oom_message(memory_bytes),
            KernelDeath::Killed => messages::KILLED_MESSAGE.to_string(),
            KernelDeath::NodeLost => messages::NODE_LOST_MESSAGE.to_string(),
            KernelDeath::Crashed { exit_code } => messages::crash_message(exit_code),
            KernelDeath::EngineRestarted => messages::ENGINE_RESTARTED_MESSAGE.to_string(),
            KernelDeath::Protocol { what } => messages::protocol_message(what),
            KernelDeath::ShutDown => messages::SHUT_DOWN_MESSAGE.to_string(),
            KernelDeath::Exited => messages::EXITED_MESSAGE.to_string(),
        }
    }

    /// The loss the owner's next call reports; `None` when kernelbox was asked to end it.
    pub fn loss(self) -> Option<LossReason> {
        match self {
            KernelDeath::Oom { .. } => Some(LossReason::Oom),
            KernelDeath::Killed => Some(LossReason::Killed),
            KernelDeath::NodeLost => Some(LossReason::NodeLost),
            KernelDeath::Crashed { .. } => Some(LossReason::Crashed),
            KernelDeath::EngineRestarted => Some(LossReason::EngineRestarted),
            KernelDeath::Protocol { .. } => Some(LossReason::Protocol),
            KernelDeath::ShutDown | KernelDeath::Exited => None,
        }
    }
}

/// What the contract makes of an [`Ending`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// The result's `status`.
    pub status: CellStatus,
    /// The result's `exit_code`.
    pub exit_code: i32,
    /// The result's `error`: the traceback or kernelbox's message; `None` on success.
    pub error: Option<String>,
    /// The result's `kernel.ended`: the cell called `sys.exit()`.
    pub ended: bool,
    /// The loss recorded for the owner's next call (its `state_lost.reason`) when the kernel
    /// goes; `None` when it was asked for or nothing was lost.
    pub loss: Option<LossReason>,
    /// The kernel stays for the owner's next cell (a cell that never ran leaves it as it
    /// found it); otherwise it goes.
    pub kernel_kept: bool,
}

impl Ending {
    /// The result's fields for this ending (`docs/contract.md`, "Statuses").
    pub fn verdict(self) -> Verdict {
        let ended = self == Ending::Exited;
        let kernel_kept = matches!(
            self,
            Ending::Completed
                | Ending::Raised { .. }
                | Ending::InterruptStopped
                | Ending::InterruptedWhileQueued
        );
        let (status, exit_code, error, loss) = match self {
            Ending::Completed | Ending::Exited => (CellStatus::Success, 0, None, None),
            Ending::Raised {
                traceback,
                exit_code,
            } => (CellStatus::Error, exit_code, Some(traceback), None),
            Ending::TimedOut { timeout } => (
                CellStatus::Timeout,
                -1,
                Some(messages::timeout_message(timeout)),
                Some(LossReason::Timeout),
            ),
            Ending::InterruptStopped => (
                CellStatus::Interrupted,
                -1,
                Some(messages::INTERRUPTED_MESSAGE.to_string()),
                None,
            ),
            Ending::InterruptKilled { grace } => (
                CellStatus::Interrupted,
                -1,
                Some(messages::interrupt_killed_message(grace)),
                Some(LossReason::Killed),
            ),
            Ending::InterruptedWhileQueued => (
                CellStatus::Interrupted,
                -1,
                Some(messages::INTERRUPTED_BEFORE_IT_RAN.to_string()),
                None,
            ),
            Ending::Cleared => (
                CellStatus::Error,
                -1,
                Some(messages::CLEARED_MESSAGE.to_string()),
                None,
            ),
            Ending::Died(death) => (CellStatus::Error, -1, Some(death.message()), death.loss()),
        };
        Verdict {
            status,
            exit_code,
            error,
            ended,
            loss,
            kernel_kept,
        }
    }
}

impl Verdict {
    /// The result's `hint`: a cell that timed out or was interrupted, its kernel gone, is told
    /// how to fit long work.
    pub fn hint(&self, kernel_gone: bool) -> Option<String> {
        let long_work = matches!(self.status, CellStatus::Timeout | CellStatus::Interrupted);
        (kernel_gone && long_work).then(|| messages::LONG_WORK_HINT.to_string())
    }
}

#[cfg(test)]
mod tests {
    //! Each row of `docs/contract.md`'s "Statuses" and each cause of "Loss reasons", with the
    //! texts of "Exact messages" written out as the document gives them.

    use super::*;

    const NEXT: &str = "its state was lost. The next execute_code call starts a fresh kernel.";

    /// The verdict the contract gives: status, exit code, error, `kernel.ended`, loss, kept.
    fn row(
        status: CellStatus,
        exit_code: i32,
        error: Option<&str>,
        ended: bool,
        loss: Option<LossReason>,
        kernel_kept: bool,
    ) -> Verdict {
        Verdict {
            status,
            exit_code,
            error: error.map(str::to_string),
            ended,
            loss,
            kernel_kept,
        }
    }

    fn died(death: KernelDeath) -> Verdict {
        Ending::Died(death).verdict()
    }

    #[test]
    fn a_kernel_stopped_with_its_nodes_lease_is_reported_node_lost() {
        assert_eq!(
            died(KernelDeath::NodeLost),
            row(
                CellStatus::Error,
                -1,
                Some(messages::NODE_LOST_MESSAGE),
                false,
                Some(LossReason::NodeLost),
                false
            )
        );
    }

    #[test]
    fn a_cell_that_ran_to_its_end_succeeds_and_keeps_its_kernel() {
        assert_eq!(
            Ending::Completed.verdict(),
            row(CellStatus::Success, 0, None, false, None, true)
        );
    }

    #[test]
    fn sys_exit_succeeds_and_ends_the_kernel_without_a_loss() {
        assert_eq!(
            Ending::Exited.verdict(),
            row(CellStatus::Success, 0, None, true, None, false)
        );
    }

    #[test]
    fn a_raise_is_an_error_with_the_traceback_and_keeps_the_kernel() {
        let traceback = "Traceback (most recent call last):\nZeroDivisionError: division by zero";
        let raised = Ending::Raised {
            traceback: traceback.into(),
            exit_code: 1,
        };
        assert_eq!(
            raised.verdict(),
            row(CellStatus::Error, 1, Some(traceback), false, None, true)
        );
        // A Bash cell's failing command gives its own status.
        let failed = Ending::Raised {
            traceback: "exit status 3".into(),
            exit_code: 3,
        };
        assert_eq!(
            failed.verdict(),
            row(
                CellStatus::Error,
                3,
                Some("exit status 3"),
                false,
                None,
                true
            )
        );
    }

    #[test]
    fn a_timeout_kills_the_kernel_with_the_timeout_message_and_loss() {
        let after = |timeout| Ending::TimedOut { timeout }.verdict();
        assert_eq!(
            after(Duration::from_secs(5)),
            row(
                CellStatus::Timeout,
                -1,
                Some(
                    "Cell timed out after 5s; the session kernel was killed and its state was \
                     lost. The next execute_code call starts a fresh kernel."
                ),
                false,
                Some(LossReason::Timeout),
                false
            )
        );
        // `{T}` is the decimal when the timeout is not whole seconds.
        let error = after(Duration::from_millis(1500)).error.unwrap();
        assert!(error.starts_with("Cell timed out after 1.5s; "), "{error}");
    }

    #[test]
    fn an_interrupt_the_cell_stopped_on_keeps_the_kernel_and_loses_nothing() {
        assert_eq!(
            Ending::InterruptStopped.verdict(),
            row(
                CellStatus::Interrupted,
                -1,
                Some(
                    "Interrupted (KeyboardInterrupt); the session kernel and its state were kept."
                ),
                false,
                None,
                true
            )
        );
    }

    #[test]
    fn an_interrupt_not_stopped_within_the_grace_kills_the_kernel_with_loss_killed() {
        let after = |grace| Ending::InterruptKilled { grace }.verdict();
        assert_eq!(
            after(Duration::from_secs(5)),
            row(
                CellStatus::Interrupted,
                -1,
                Some(
                    "Interrupted, but the cell did not stop within 5s of its KeyboardInterrupt; \
                     the session kernel was killed and its state was lost."
                ),
                false,
                Some(LossReason::Killed),
                false
            )
        );
        let error = after(Duration::from_millis(500)).error.unwrap();
        assert!(error.contains("within 0.5s of"), "{error}");
    }

    #[test]
    fn an_interrupt_while_queued_leaves_the_kernel_untouched_and_loses_nothing() {
        assert_eq!(
            Ending::InterruptedWhileQueued.verdict(),
            row(
                CellStatus::Interrupted,
                -1,
                Some(
                    "Interrupted before it ran: the cell was waiting for an earlier cell of \
                     this session and never executed."
                ),
                false,
                None,
                true
            )
        );
    }

    #[test]
    fn a_clear_under_the_cell_is_an_error_without_a_loss() {
        assert_eq!(
            Ending::Cleared.verdict(),
            row(
                CellStatus::Error,
                -1,
                Some(
                    "The session's kernel was cleared or reset by another request while this \
                     cell ran (DELETE, reset: true, or the child's release) and was killed; its \
                     state was lost. The next execute_code call starts a fresh kernel."
                ),
                false,
                None,
                false
            )
        );
    }

    #[test]
    fn each_death_has_its_message_and_its_loss_reason() {
        let cases = [
            (
                KernelDeath::Oom {
                    memory_bytes: 512 * 1024 * 1024,
                },
                format!("The kernel ran out of memory (limit 512 MiB) and was killed; {NEXT}"),
                Some(LossReason::Oom),
            ),
            (
                KernelDeath::Killed,
                format!("The kernel was killed from outside kernelbox; {NEXT}"),
                Some(LossReason::Killed),
            ),
            (
                KernelDeath::Crashed { exit_code: 139 },
                format!("The kernel died unexpectedly (exit code 139); {NEXT}"),
                Some(LossReason::Crashed),
            ),
            (
                KernelDeath::EngineRestarted,
                format!(
                    "The Docker engine restarted or went away and took the kernel with it; {NEXT}"
                ),
                Some(LossReason::EngineRestarted),
            ),
            (
                KernelDeath::Protocol {
                    what: "a protocol line over 1 MiB",
                },
                format!(
                    "The kernel broke the kernelbox protocol (a protocol line over 1 MiB) and \
                     was killed; {NEXT}"
                ),
                Some(LossReason::Protocol),
            ),
            (
                KernelDeath::ShutDown,
                format!("The kernel was shut down by kernelbox; {NEXT}"),
                None,
            ),
            (
                KernelDeath::Exited,
                "The kernel ended (sys.exit).".to_string(),
                None,
            ),
        ];
        for (death, message, loss) in cases {
            assert_eq!(
                died(death),
                row(CellStatus::Error, -1, Some(&message), false, loss, false),
                "{death:?}"
            );
        }
    }

    #[test]
    fn only_a_timeout_or_an_interrupt_that_took_the_kernel_gets_the_hint() {
        let hint = "Long work can be split across cells, or run with a larger timeout.";
        let timed_out = Ending::TimedOut {
            timeout: Duration::from_secs(1),
        }
        .verdict();
        assert_eq!(timed_out.hint(true).as_deref(), Some(hint));
        let killed = Ending::InterruptKilled {
            grace: Duration::from_secs(5),
        };
        assert_eq!(killed.verdict().hint(true).as_deref(), Some(hint));
        assert_eq!(Ending::InterruptStopped.verdict().hint(false), None);
        assert_eq!(Ending::InterruptedWhileQueued.verdict().hint(false), None);
        assert_eq!(Ending::Cleared.verdict().hint(true), None);
        assert_eq!(died(KernelDeath::Killed).hint(true), None);
        assert_eq!(Ending::Completed.verdict().hint(false), None);
    }

    #[test]
    fn loss_reasons_have_the_contract_names() {
        let names: Vec<&str> = LossReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(
            names,
            [
                "idle_reaped",
                "evicted",
                "timeout",
                "oom",
                "crashed",
                "killed",
                "engine_restarted",
                "server_restarted",
                "protocol",
                "node_lost",
                "runaway",
                "node_drained",
                "tenant_removed"
            ]
        );
        for reason in LossReason::ALL {
            assert_eq!(serde_json::to_value(reason).unwrap(), reason.as_str());
        }
    }
}
