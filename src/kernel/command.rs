//! A shell command beside the kernel (`docs/contract.md`, "Commands"): a process run in the
//! kernel's container by the engine's exec, as the kernel's user, in its sandbox and working
//! directory, its stdout and stderr read apart under the cell output caps. It starts under a
//! small Python program the image has anyway (the command's leader): a child subreaper, so
//! every process the command starts stays in the leader's tree whatever it does with its
//! session or process group (`setsid`, a double fork, `setpgid`), that says its process id and
//! its output pipes on stderr, then forks the command (its own process group) and waits for it.
//! A timeout kills the leader's whole tree and every process still holding the command's
//! output, and nothing else: the kernel and its state stay (`docs/reliability.md`, "Commands").

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use super::Kernel;
use crate::cell::OutputBuffer;
use crate::config::{OutputCaps, WORK_DIR};
use crate::docker::{Attached, Chunk, EngineError, ExecSpec};
use crate::wire::CommandResult;

/// What the leader writes first on stderr: this, `{pid}:{stdout pipe}:{stderr pipe}`, a newline.
const LEADER_MARKER: &[u8] = b"\x01kernelbox-command:";

/// The Python both the leader and the killer sweep a command's processes with: round after
/// round, the process groups of `root`'s children, every live descendant of `root` and every
/// process started since `root` holding one of the command's output pipes (with their
/// descendants; one started before it, as the kernel's runner, is never the command's even
/// when handed its pipe, and once `root` is gone no holder is taken, since its start is no
/// longer known) are stopped
/// (SIGSTOP: a stopped process neither forks nor frees a pid, so a fork bomb cannot outrun
/// the rounds; a whole group stops with one signal), until a round finds none still
/// running; then all of them are killed (SIGKILL), and again until none is left. Never the
/// container's init, `root` or the sweeper itself; the rounds are bounded
/// (`docs/reliability.md`, "A command's processes at its timeout").
macro_rules! sweep_py {
    () => {
        "import os, sys, signal
def scan():
    procs = {}
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open('/proc/%s/stat' % name) as f:
                s = f.read()
        except OSError:
            continue
        f = s[s.rindex(')') + 2:].split()
        procs[int(name)] = (f[0], int(f[1]), int(f[19]))
    return procs
def holds(pid, pipes):
    try:
        fds = os.listdir('/proc/%d/fd' % pid)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink('/proc/%d/fd/%s' % (pid, fd)) in pipes:
                return True
        except OSError:
            pass
    return False
def sweep(root, pipes):
    me = os.getpid()
    born = None
    for _ in range(100):
        held = set()
        for _ in range(1000):
            procs = scan()
            kids = {}
            for pid, (state, ppid, _) in procs.items():
                kids.setdefault(ppid, []).append(pid)
            if born is None and root in procs:
                born = procs[root][2]
            for k in kids.get(root, ()):
                try:
                    os.killpg(k, 19)
                except OSError:
                    pass
            found = set()
            def under(seeds):
                todo = list(seeds)
                while todo:
                    p = todo.pop()
                    for k in kids.get(p, ()):
                        if k not in found:
                            found.add(k)
                            todo.append(k)
            under([root])
            if pipes:
                seeds = [p for p in procs if p not in found and p not in (1, me, root)
                         and born is not None and procs[p][2] >= born and holds(p, pipes)]
                found.update(seeds)
                under(seeds)
            found -= {1, me, root}
            alive = [p for p in found if p in procs and procs[p][0] not in 'ZX']
            held.update(alive)
            running = [p for p in alive if procs[p][0] not in 'Tt']
            if not running:
                break
            for p in running:
                try:
                    os.kill(p, 19)
                except OSError:
                    pass
        if not held:
            return
        for p in held:
            try:
                os.kill(p, 9)
            except OSError:
                pass
def pipe_names(inodes):
    return set('pipe:[%s]' % i for i in inodes if str(i) != '0')
"
    };
}

/// The program a command starts through (see the module's documentation). Its first argument
/// is the command's timeout in seconds: at it the leader itself sweeps its tree (it needs no new
/// process, so a command that took every pid of its container is still killed), besides the
/// killer the server runs. It ends with the command's exit status (128 + the signal when a
/// signal ended it), as the command would.
const LEADER: &str = concat!(
    sweep_py!(),
    "a = sys.argv[1:]
try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)
except Exception:
    pass
def ino(fd):
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return 0
inodes = (ino(1), ino(2))
os.write(2, b'\\x01kernelbox-command:%d:%d:%d\\n' % (os.getpid(), inodes[0], inodes[1]))
child = os.fork()
if child == 0:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    try:
        os.chdir(a[1])
        os.execvp(a[2], a[2:])
    except OSError as e:
        os.write(2, ('kernelbox: cannot run %s in %s: %s\\n' % (a[2], a[1], e.strerror)).encode())
        os._exit(127)
os.close(0)
def expire(signum, frame):
    try:
        os.killpg(child, 19)
    except OSError:
        pass
    sweep(os.getpid(), pipe_names(inodes))
    os._exit(137)
signal.signal(signal.SIGALRM, expire)
signal.setitimer(signal.ITIMER_REAL, max(float(a[0]), 0.001))
while True:
    try:
        pid, status = os.wait()
    except ChildProcessError:
        os._exit(0)
    if pid == child:
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)
"
);

/// The program that kills a command at its timeout, run by a second exec as the kernel's user:
/// it stops the leader (so it neither reaps nor leaves), sweeps the leader's tree and the
/// holders of the command's output ([`sweep_py`]), then kills the leader. Arguments: the
/// leader's pid, its two pipes' inodes.
const KILLER: &str = concat!(
    sweep_py!(),
    "root = int(sys.argv[1])
try:
    os.kill(root, 19)
except OSError:
    pass
sweep(root, pipe_names(sys.argv[2:]))
try:
    os.kill(root, 9)
except OSError:
    pass
"
);

/// How long the output may take to end once the command was killed at the timeout, and how
/// long the killer may take.
const KILL_DRAIN: Duration = Duration::from_secs(5);

/// Which stream a piece of a command's output came on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CommandStream {
    /// The command's standard output.
    Stdout,
    /// The command's standard error.
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
    /// Past this its whole tree is killed.
    pub(crate) timeout: Duration,
    /// What each stream keeps.
    pub(crate) caps: OutputCaps,
    /// Receives the output live.
    pub(crate) sink: Option<CommandSink>,
}

/// The leader's process id and the inodes of the command's stdout and stderr pipes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Leader {
    /// The leader's process id, in the container.
    pub(crate) pid: u32,
    pipes: [u64; 2],
}

/// Takes the leader's line off the front of a command's stderr: what follows is the
/// command's.
#[derive(Debug)]
pub(crate) struct LeaderHead {
    /// Stderr bytes held until the leader's line is complete (at most a line's worth).
    head: Option<Vec<u8>>,
    leader: Option<Leader>,
}

impl LeaderHead {
    /// The leader's line still expected.
    pub(crate) fn new() -> LeaderHead {
        LeaderHead {
            head: Some(Vec::new()),
            leader: None,
        }
    }

    /// The leader, once its line came.
    pub(crate) fn leader(&self) -> Option<Leader> {
        self.leader
    }

    /// Takes in stderr bytes (`end`: no more will come); gives back what of them is the
    /// command's, nothing while the leader's line may still be incomplete.
    pub(crate) fn feed<'a>(&mut self, bytes: &'a [u8], end: bool) -> std::borrow::Cow<'a, [u8]> {
        let Some(head) = self.head.as_mut() else {
            return bytes.into();
        };
        head.extend_from_slice(bytes);
        let newline = head.iter().position(|&b| b == b'\n');
        let could_be = head.len() < LEADER_MARKER.len() + 64
            && LEADER_MARKER.starts_with(&head[..head.len().min(LEADER_MARKER.len())]);
        if newline.is_none() && could_be && !end {
            return (&[][..]).into();
        }
        let mut head = self.head.take().unwrap_or_default();
        match newline {
            Some(n) if head.starts_with(LEADER_MARKER) => {
                self.leader = parse_leader(&head[LEADER_MARKER.len()..n]);
                head.drain(..=n);
                head.into()
            }
            _ => head.into(),
        }
    }
}

/// The leader's line after [`LEADER_MARKER`]: `{pid}:{stdout pipe}:{stderr pipe}`.
fn parse_leader(line: &[u8]) -> Option<Leader> {
    let text = std::str::from_utf8(line).ok()?;
    let mut parts = text.split(':');
    let pid = parts.next()?.parse().ok()?;
    let out = parts.next()?.parse().ok()?;
    let err = parts.next()?.parse().ok()?;
    parts.next().is_none().then_some(Leader {
        pid,
        pipes: [out, err],
    })
}

/// The two streams of a command, the leader's line taken off the front of its stderr.
struct Streams {
    stdout: OutputBuffer,
    stderr: OutputBuffer,
    head: LeaderHead,
    sink: Option<CommandSink>,
}

/// A command's output as the engine sends it.
type ChunkStream = futures::stream::BoxStream<'static, Result<Chunk, EngineError>>;

/// The stdin written beside the reading (a command may read it only as it writes), bounded
/// by the deadline, then closed.
async fn write_stdin(
    mut input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    stdin: Bytes,
    deadline: Instant,
) {
    let _ = tokio::time::timeout_at(deadline, async {
        if !stdin.is_empty() {
            let _ = input.write_all(&stdin).await;
        }
        let _ = input.shutdown().await;
    })
    .await;
}

impl Streams {
    /// Empty streams, each keeping `caps.inline_bytes`, the leader's line still expected.
    fn new(caps: OutputCaps, sink: Option<CommandSink>) -> Streams {
        Streams {
            stdout: OutputBuffer::new(caps.inline_bytes, caps.inline_bytes),
            stderr: OutputBuffer::new(caps.inline_bytes, caps.inline_bytes),
            head: LeaderHead::new(),
            sink,
        }
    }

    /// Reads the command's output until it ends (`false`) or the deadline passes (`true`).
    async fn read_until(
        &mut self,
        output: &mut ChunkStream,
        deadline: Instant,
    ) -> Result<bool, EngineError> {
        loop {
            tokio::select! {
                chunk = output.next() => match chunk {
                    Some(Ok(chunk)) => self.chunk(chunk),
                    Some(Err(e)) => return Err(e),
                    None => return Ok(false),
                },
                _ = tokio::time::sleep_until(deadline) => return Ok(true),
            }
        }
    }

    /// The command's result: its exit code and both streams as kept (the duration is the
    /// caller's to fill in).
    fn into_result(self, exit_code: i64, timed_out: bool) -> CommandResult {
        let (stdout, stderr) = (self.stdout.finish(), self.stderr.finish());
        let cut = |omitted: u64| (omitted > 0).then_some(true);
        let total = |omitted: u64, total: u64| (omitted > 0).then_some(total);
        CommandResult {
            exit_code,
            stdout_truncated: cut(stdout.omitted),
            stdout_bytes_total: total(stdout.omitted, stdout.total),
            stderr_truncated: cut(stderr.omitted),
            stderr_bytes_total: total(stderr.omitted, stderr.total),
            stdout: stdout.text,
            stderr: stderr.text,
            duration_seconds: 0.0,
            timed_out,
        }
    }

    fn chunk(&mut self, chunk: Chunk) {
        match chunk {
            Chunk::Stdout(b) => self.emit(CommandStream::Stdout, &b),
            Chunk::Stderr(b) => {
                let rest = self.head.feed(&b, false).into_owned();
                self.emit(CommandStream::Stderr, &rest);
            }
        }
    }

    /// The end: what the leader's line held back is the command's.
    fn take_head(&mut self) {
        let rest = self.head.feed(&[], true).into_owned();
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
    /// Runs a command in this kernel's container (see the module's documentation): the
    /// leader started, its stdin written while its output is read until it ends or the
    /// deadline passes, its tree killed past the deadline, then its exit code.
    pub(crate) async fn run_command(
        &self,
        spec: CommandSpec,
    ) -> Result<CommandResult, EngineError> {
        let deadline = Instant::now() + spec.timeout;
        let process = self
            .engine
            .exec_process(&self.id, &self.leader_exec(&spec))
            .await?;
        let Attached { mut output, input } = process.streams;
        let mut streams = Streams::new(spec.caps, spec.sink.clone());
        let timed_out = tokio::join!(
            write_stdin(input, spec.stdin.clone(), deadline),
            streams.read_until(&mut output, deadline),
        )
        .1?;
        if timed_out {
            self.stop_timed_out(&mut output, &mut streams).await;
        }
        streams.take_head();
        let exit_code = if timed_out {
            -1
        } else {
            match tokio::time::timeout(Duration::from_secs(10), process.exit_code).await {
                Ok(Ok(Some(code))) => code,
                _ => -1,
            }
        };
        Ok(streams.into_result(exit_code, timed_out))
    }

    /// The exec that runs [`LEADER`] with the command's timeout, working directory and
    /// argv, as the kernel's user, with the command's environment.
    fn leader_exec(&self, spec: &CommandSpec) -> ExecSpec {
        self.leader_exec_of(
            &format!("{:.3}", spec.timeout.as_secs_f64()),
            spec.cwd.as_deref(),
            &spec.argv,
            &spec.env,
        )
    }

    /// The exec that runs [`LEADER`] with a timeout in seconds, a working directory (the
    /// kernel's by default), an argv and environment entries.
    pub(super) fn leader_exec_of(
        &self,
        timeout_secs: &str,
        cwd: Option<&str>,
        argv: &[String],
        env: &[String],
    ) -> ExecSpec {
        let mut cmd = vec![
            "python3".to_string(),
            "-I".into(),
            "-S".into(),
            "-c".into(),
            LEADER.into(),
            timeout_secs.to_string(),
            cwd.unwrap_or(WORK_DIR).to_string(),
        ];
        cmd.extend(argv.iter().cloned());
        ExecSpec {
            cmd,
            user: self.user.clone(),
            working_dir: WORK_DIR.to_string(),
            env: env.to_vec(),
        }
    }

    /// Past the deadline: the command's tree killed (when its leader said who it is), and
    /// what it wrote before it died kept, the drain bounded by [`KILL_DRAIN`].
    async fn stop_timed_out(&self, output: &mut ChunkStream, streams: &mut Streams) {
        if let Some(leader) = streams.head.leader() {
            if let Err(e) = self.kill_tree(leader).await {
                tracing::warn!(container = %self.short_id(), error = %e, "killing a command's processes");
            }
        }
        let _ = tokio::time::timeout(KILL_DRAIN, async {
            while let Some(Ok(chunk)) = output.next().await {
                streams.chunk(chunk);
            }
        })
        .await;
    }

    /// Kills a command's processes ([`KILLER`]), from inside the container as the kernel's
    /// user, and waits for the killer to end (bounded).
    pub(crate) async fn kill_tree(&self, leader: Leader) -> Result<(), EngineError> {
        let exec = ExecSpec {
            cmd: vec![
                "python3".into(),
                "-I".into(),
                "-S".into(),
                "-c".into(),
                KILLER.into(),
                leader.pid.to_string(),
                leader.pipes[0].to_string(),
                leader.pipes[1].to_string(),
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
