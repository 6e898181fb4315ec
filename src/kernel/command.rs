//! A shell command beside the kernel (`docs/contract.md`, "Commands"): a process run in the
//! kernel's container by the engine's exec, as the kernel's user, in its sandbox and working
//! directory, its stdout and stderr read apart under the cell output caps. It starts as the
//! leader of its own process group (a small Python program the image has anyway sets it up,
//! says the group's id on stderr, then `exec`s the command), so a timeout kills that group,
//! the command's children included, and nothing else: the kernel and its state stay.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::Kernel;
use crate::cell::OutputBuffer;
use crate::config::{OutputCaps, WORK_DIR};
use crate::docker::{Chunk, EngineError, ExecSpec};
use crate::wire::CommandResult;

/// What the group-leader program writes first on stderr: this, the group's id, a newline.
const PGID_MARKER: &[u8] = b"\x01kernelbox-pgid:";

/// The program a command starts through: it becomes its own process group's leader, says
/// the group's id, changes to the working directory and `exec`s the command.
const LEADER: &str = "import os, sys
a = sys.argv[1:]
try:
    os.setpgid(0, 0)
except OSError:
    pass
os.write(2, b'\\x01kernelbox-pgid:%d\\n' % os.getpgrp())
try:
    os.chdir(a[0])
    os.execvp(a[1], a[1:])
except OSError as e:
    os.write(2, ('kernelbox: cannot run %s in %s: %s\\n' % (a[1], a[0], e.strerror)).encode())
    os._exit(127)
";

/// How long the output may take to end once the group was killed at the timeout (a process
/// outside the group, started with `setsid`, can hold the streams open).
const KILL_DRAIN: Duration = Duration::from_secs(5);

/// Which stream a piece of a command's output came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandStream {
    /// Its stdout.
    Stdout,
    /// Its stderr.
    Stderr,
}

/// Receives a command's output live (for streaming), in the order it arrived.
pub type CommandSink = Arc<dyn Fn(CommandStream, &[u8]) + Send + Sync>;

/// One command, as the kernel runs it.
pub(crate) struct CommandSpec {
    /// The program and its arguments.
    pub(crate) argv: Vec<String>,
    /// Its working directory (relative ones from the kernel's).
    pub(crate) cwd: Option<String>,
    /// `KEY=value` entries added to the kernel's environment.
    pub(crate) env: Vec<String>,
    /// Its stdin (then end of file).
    pub(crate) stdin: Bytes,
    /// Past this its process group is killed.
    pub(crate) timeout: Duration,
    /// What each stream keeps.
    pub(crate) caps: OutputCaps,
    /// Receives the output live.
    pub(crate) sink: Option<CommandSink>,
}

/// The two streams of a command, the group id taken off the front of its stderr.
struct Streams {
    stdout: OutputBuffer,
    stderr: OutputBuffer,
    /// Stderr bytes held until the group's line is complete (at most a line's worth).
    head: Option<Vec<u8>>,
    pgid: Option<u32>,
    sink: Option<CommandSink>,
}

impl Streams {
    fn chunk(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Stdout(b) => self.emit(CommandStream::Stdout, &b),
            Chunk::Stderr(b) => match self.head.as_mut() {
                None => self.emit(CommandStream::Stderr, &b),
                Some(head) => {
                    head.extend_from_slice(&b);
                    self.take_head(false);
                }
            },
        }
    }

    /// Takes the group's line off the front of stderr once it is whole (or at the end, or
    /// when what came cannot be it); what follows is the command's.
    fn take_head(&mut self, end: bool) {
        let Some(head) = self.head.as_ref() else {
            return;
        };
        let newline = head.iter().position(|&b| b == b'\n');
        let could_be = head.len() < PGID_MARKER.len() + 24
            && PGID_MARKER.starts_with(&head[..head.len().min(PGID_MARKER.len())]);
        if newline.is_none() && could_be && !end {
            return;
        }
        let head = self.head.take().unwrap_or_default();
        let rest = match newline {
            Some(n) if head.starts_with(PGID_MARKER) => {
                self.pgid = std::str::from_utf8(&head[PGID_MARKER.len()..n])
                    .ok()
                    .and_then(|t| t.parse().ok());
                &head[n + 1..]
            }
            _ => &head[..],
        };
        let rest = rest.to_vec();
        self.emit(CommandStream::Stderr, &rest);
    }

    fn emit(&mut self, stream: CommandStream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        match stream {
            CommandStream::Stdout => self.stdout.push(bytes),
            CommandStream::Stderr => self.stderr.push(bytes),
        }
        if let Some(sink) = &self.sink {
            // A caller's sink that panics loses its stream, not the command.
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sink(stream, bytes)));
        }
    }
}

impl Kernel {
    /// Runs a command in this kernel's container (see the module's documentation).
    pub(crate) async fn run_command(
        &self,
        spec: CommandSpec,
    ) -> Result<CommandResult, EngineError> {
        let deadline = Instant::now() + spec.timeout;
        let cwd = spec.cwd.clone().unwrap_or_else(|| WORK_DIR.to_string());
        let mut cmd = vec![
            "python3".to_string(),
            "-I".into(),
            "-S".into(),
            "-c".into(),
            LEADER.into(),
            cwd,
        ];
        cmd.extend(spec.argv.iter().cloned());
        let exec = ExecSpec {
            cmd,
            user: self.user.clone(),
            working_dir: WORK_DIR.to_string(),
            env: spec.env.clone(),
        };
        let process = self.engine.exec_process(&self.id, &exec).await?;
        let (mut output, mut input) = (process.streams.output, process.streams.input);
        let mut streams = Streams {
            stdout: OutputBuffer::new(spec.caps.inline_bytes, spec.caps.inline_bytes),
            stderr: OutputBuffer::new(spec.caps.inline_bytes, spec.caps.inline_bytes),
            head: Some(Vec::new()),
            pgid: None,
            sink: spec.sink.clone(),
        };
        let stdin = spec.stdin.clone();
        // The stdin is written beside the reading (a command may read it only as it writes),
        // bounded by the deadline, then closed.
        let write = async move {
            let _ = tokio::time::timeout_at(deadline, async {
                if !stdin.is_empty() {
                    let _ = input.write_all(&stdin).await;
                }
                let _ = input.shutdown().await;
            })
            .await;
        };
        let read = async {
            loop {
                tokio::select! {
                    chunk = output.next() => match chunk {
                        Some(Ok(chunk)) => streams.chunk(chunk),
                        Some(Err(e)) => return Err(e),
                        None => return Ok(false),
                    },
                    _ = tokio::time::sleep_until(deadline) => return Ok(true),
                }
            }
        };
        let (_, timed_out) = tokio::join!(write, read);
        let timed_out = timed_out?;
        if timed_out {
            if let Some(pgid) = streams.pgid {
                if let Err(e) = self.kill_group(pgid).await {
                    tracing::warn!(container = %self.short_id(), error = %e, "killing a command's process group");
                }
            }
            // What the group wrote before it died is the command's; bounded.
            let _ = tokio::time::timeout(KILL_DRAIN, async {
                while let Some(Ok(chunk)) = output.next().await {
                    streams.chunk(chunk);
                }
            })
            .await;
        }
        streams.take_head(true);
        let exit_code = if timed_out {
            -1
        } else {
            match tokio::time::timeout(Duration::from_secs(10), process.exit_code).await {
                Ok(Ok(Some(code))) => code,
                _ => -1,
            }
        };
        let (stdout, stderr) = (streams.stdout.finish(), streams.stderr.finish());
        let cut = |omitted: u64| (omitted > 0).then_some(true);
        let total = |omitted: u64, total: u64| (omitted > 0).then_some(total);
        Ok(CommandResult {
            exit_code,
            stdout_truncated: cut(stdout.omitted),
            stdout_bytes_total: total(stdout.omitted, stdout.total),
            stderr_truncated: cut(stderr.omitted),
            stderr_bytes_total: total(stderr.omitted, stderr.total),
            stdout: stdout.text,
            stderr: stderr.text,
            duration_seconds: 0.0,
            timed_out,
        })
    }

    /// Kills a command's process group (SIGKILL), from inside the container as the kernel's
    /// user, and waits for the killer to end (bounded).
    async fn kill_group(&self, pgid: u32) -> Result<(), EngineError> {
        let exec = ExecSpec {
            cmd: vec![
                "python3".into(),
                "-I".into(),
                "-S".into(),
                "-c".into(),
                "import os, sys\nos.killpg(int(sys.argv[1]), 9)".into(),
                pgid.to_string(),
            ],
            user: self.user.clone(),
            working_dir: WORK_DIR.to_string(),
            env: Vec::new(),
        };
        let mut killer = self.engine.exec(&self.id, &exec).await?;
        let _ = killer.input.shutdown().await;
        let _ = tokio::time::timeout(KILL_DRAIN, async {
            while killer.output.next().await.is_some() {}
        })
        .await;
        Ok(())
    }
}
