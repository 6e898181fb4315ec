//! A background process beside the kernel (`docs/processes.md`): the command's leader
//! (`command.rs`: a child subreaper that says its pid, its command in a process group of its
//! own) started by the engine's exec with no deadline of its own, its stdin open until its
//! owner closes it. Its output, stdin and exit code go to the processes service
//! (`src/services/processes/`), which bounds what it keeps; a signal goes to the command's
//! process group and the kill sweeps the leader's whole tree, both from inside the container
//! as the kernel's user. It dies with the kernel's container.

use std::pin::Pin;

use futures::future::BoxFuture;
use tokio::io::AsyncWriteExt;

use super::command::Leader;
use super::Kernel;
use crate::config::WORK_DIR;
use crate::docker::{Chunk, EngineError, ExecSpec};

/// The leader's own deadline for a background process, in seconds (about 31 years: none);
/// the process ends by itself, by a signal, by its kill, or with its kernel.
const NO_DEADLINE_SECS: &str = "1000000000";

/// The program that sends a signal to a process's command: the process group of every child
/// of the leader (the command, `setpgid`'d to itself; what it started in other groups is its
/// own business, as in a shell). Arguments: the leader's pid, the signal's number.
const SIGNALLER: &str = "import os, sys
root, sig = int(sys.argv[1]), int(sys.argv[2])
for name in os.listdir('/proc'):
    if not name.isdigit():
        continue
    try:
        with open('/proc/%s/stat' % name) as f:
            s = f.read()
    except OSError:
        continue
    if int(s[s.rindex(')') + 2:].split()[1]) == root:
        try:
            os.killpg(int(name), sig)
        except OSError:
            pass
";

/// A background process to start.
pub(crate) struct ProcessSpec {
    /// The program and its arguments.
    pub(crate) argv: Vec<String>,
    /// Its working directory (relative ones from the kernel's).
    pub(crate) cwd: Option<String>,
    /// `KEY=value` entries added to the kernel's environment.
    pub(crate) env: Vec<String>,
    /// False: its stdin is closed at once (end of file).
    pub(crate) stdin_open: bool,
}

/// A started background process: its output as the engine sends it (the leader's line first
/// on stderr: [`super::LeaderHead`]), its stdin, and its exit code once its output ended.
pub(crate) struct StartedProcess {
    /// Its stdout and stderr chunks; ends when the process and everything holding its output
    /// ended (or the container went).
    pub(crate) output: futures::stream::BoxStream<'static, Result<Chunk, EngineError>>,
    /// Its stdin (already shut down when the spec closed it).
    pub(crate) input: Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    /// Asks the engine for the exit code; await it after the output ended.
    pub(crate) exit_code: BoxFuture<'static, Result<Option<i64>, EngineError>>,
}

impl Kernel {
    /// Starts a background process in this kernel's container.
    pub(crate) async fn start_process(
        &self,
        spec: &ProcessSpec,
    ) -> Result<StartedProcess, EngineError> {
        let exec =
            self.leader_exec_of(NO_DEADLINE_SECS, spec.cwd.as_deref(), &spec.argv, &spec.env);
        let process = self.engine.exec_process(&self.id, &exec).await?;
        let mut input = process.streams.input;
        if !spec.stdin_open {
            let _ = input.shutdown().await;
        }
        Ok(StartedProcess {
            output: process.streams.output,
            input,
            exit_code: process.exit_code,
        })
    }

    /// Sends `signal` to a background process's command (its process group), from inside the
    /// container; waits for the signaller to end, bounded.
    pub(crate) async fn signal_process(
        &self,
        leader: Leader,
        signal: i32,
    ) -> Result<(), EngineError> {
        let exec = ExecSpec {
            cmd: vec![
                "python3".into(),
                "-I".into(),
                "-S".into(),
                "-c".into(),
                SIGNALLER.into(),
                leader.pid.to_string(),
                signal.to_string(),
            ],
            user: self.user.clone(),
            working_dir: WORK_DIR.to_string(),
            env: Vec::new(),
        };
        let mut signaller = self.engine.exec(&self.id, &exec).await?;
        let _ = signaller.input.shutdown().await;
        let _ = tokio::time::timeout(SIGNAL_LIMIT, async {
            use futures::StreamExt;
            while signaller.output.next().await.is_some() {}
        })
        .await;
        Ok(())
    }
}

/// How long a signaller may take.
const SIGNAL_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);
