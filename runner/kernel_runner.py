"""kernelbox kernel runner: executes cells statefully inside a kernel container.

Standard library only, Python >= 3.8. The host hands this file to ``bootstrap.py`` (run as
``python3 -c``) in the environment, with the container's stdin/stdout/stderr attached (tty off,
OpenStdin + StdinOnce), so any image that has python3 works and nothing has to be written into
a read-only root filesystem. The bootstrap runs it as ``__main__`` in its own namespace.

Channels (protocol version 3):

* host -> runner: newline-delimited JSON on the container's stdin (moved to a private fd).
* runner -> host: newline-delimited JSON on the container's stderr (moved to a private fd).
* cell output: fd 1 points at the container's stdout, so prints, ``os.write`` and subprocess
  output arrive live, in write order, read by the engine rather than by a thread in this
  interpreter (no GIL-held capture deadlock). Fd 2 is a pipe read by the stderr relay, a
  process forked at start (see _StderrRelay): it writes each chunk to the container's stdout
  behind the cell's display marker, flagged ``e`` with its length, in one atomic write, so the
  host tells stderr from stdout and keeps them in write order (docs/contract.md, "stdout and
  stderr"). The traceback of a cell that raised travels the same way, flagged ``t``. When a cell ends the runner writes, in one
  write on the output pipe, the cell's end marker (chosen by the host) followed by the cell's
  ``done`` frame and a newline: the host then holds all the cell's output and its outcome.
  Displays travel on the same pipe behind the cell's display marker (``runner/rich.py``).

Messages, host -> runner:  {"op": "exec", "cell": N, "code": str, "marker": str,
                            "display": str, "display_caps": {"bundle", "cell", "overhead"}}
                           {"op": "tool_result", "call": N, "ok": bool, "result": any, "error": str}
                           {"op": "ping"}
                           {"op": "hibernate", "token": str, "staging": str}  (docs/runtimes.md, "Hibernation")
Messages, runner -> host:  {"op": "ready", "v": 3, "python": str, "pid": N}       (stderr)
                           {"op": "tool_call", "cell": N|null, "call": N, "tool": str, "args": {}}
                           {"op": "pong"}
                           {"op": "hibernating", "ok": bool, "error": str}
                           MARKER {"op": "done", "cell": N,
                            "status": "ok"|"error"|"exit"|"interrupted",
                            "traceback": str|null, "ename": str|null, "evalue": str|null,
                            "execution_count": N, "exit_code": N, "displays_dropped": N}                                 (stdout)
                           DISPLAY_MARKER ("+"|".") PIECE                          (stdout)
                           DISPLAY_MARKER ("e"|"t") HEX4 BYTES  (stderr / traceback) (stdout)

Nobody owns stdin: whichever thread needs a message (the idle main thread waiting for a cell,
or a thread waiting for its tool result) reads it and files what it reads for the others, so
a cell starts and a tool result lands without a thread hand-off. A watcher thread polls stdin
for hang-up only and exits the process the moment the host goes away, even mid-cell.

Bash (``KERNELBOX_LANGUAGE=bash``, docs/contract.md "Languages"): the runner hosts one
persistent ``bash`` (see _Bash) and every cell runs in it; the frames, markers, limits and
status file are the ones above, so the host sees one protocol whatever the language. No
displays and no tool calls from Bash cells. JavaScript and TypeScript
(``KERNELBOX_LANGUAGE=javascript|typescript``): the runner hosts one persistent ``node``
running ``runner/node_kernel.js`` (see _Node) the same way; its displays go through the
runner's display machinery; no tool calls.

Interrupts (docs/contract.md, "Statuses"): the host sends SIGINT to this process (the engine
delivers it through the container's init). It becomes a KeyboardInterrupt only while a cell's
own code runs on the main thread; landing anywhere else (between cells, in the runner's own
output, display or tool-call work) it is held, and raised when the cell's code resumes, or
dropped when the cell ends first (see _Interrupts).
"""

# Imports are kept to modules the interpreter loads anyway plus C extensions: ``json`` pulls in
# ``re`` and ``enum`` and ``threading`` pulls in ``functools`` and ``collections``, together
# about 1.5 MiB of anonymous memory in every idle kernel (see _make_codec and _tag_threads).
import _signal
import _thread
import io
import os
import select
import sys
import time

PROTOCOL_VERSION = 3
# Longest protocol line the host reads (MAX_FRAME_LINE in src/kernel/protocol.rs); a longer one
# is a protocol breach that kills the kernel, so a tool call that would not fit is refused here.
MAX_FRAME_LINE = 1 << 20

# Times the runner runs the whole cell path before ready (see _Runner.warm_up).
WARM_UP_ROUNDS = 10

# How long the kernel waits with nothing to do, once in its life, before it returns its C
# heap's free pages to the system (see _Runner.trim_when_idle), in milliseconds.
TRIM_AFTER_IDLE_MS = 1000

# What a preloading kernel runs first in its warm-up (see _Runner.warm_up): the modules
# imported one by one (one that fails is skipped), then, when pyplot is among them, one figure
# drawn to PNG and closed (the first render loads fonts and the Agg canvas), and with pandas
# loaded too, one DataFrame plotted (its plotting backend loads on the first ``.plot()``).
_PRELOAD_CODE = """
for _name in %r:
    try:
        __import__(_name)
    except BaseException:
        pass
import sys as _sys
if "matplotlib.pyplot" in _sys.modules:
    import io as _io
    _plt = _sys.modules["matplotlib.pyplot"]
    _fig = _plt.figure(figsize=(1, 1))
    _plt.plot([0, 1], [0, 1])
    _fig.savefig(_io.BytesIO(), format="png")
    _plt.close(_fig)
    if "pandas" in _sys.modules:
        _ax = _sys.modules["pandas"].DataFrame({"x": [0, 1]}).plot()
        _ax.figure.savefig(_io.BytesIO(), format="png")
        _plt.close(_ax.figure)
"""

# Cells share this process and may rebind anything they can reach (``os.write = None``,
# ``builtins.print = ...``): the runner keeps its own references, taken before any cell runs.
# Builtins are covered by the bootstrap, which gives the runner a private copy of the builtins
# namespace; module attributes it uses after start are bound here.
_write = os.write
_read = os.read
_dup2 = os.dup2
_close = os.close
_exit = os._exit
_getpid = os.getpid
_pwrite = os.pwrite
_fdopen = os.fdopen
_exc_info = sys.exc_info
_modules = sys.modules
_allocate_lock = _thread.allocate_lock
_get_ident = _thread.get_ident
_now = time.time
_TextIOWrapper = io.TextIOWrapper
_poll = select.poll
_HANGUP = select.POLLHUP | select.POLLERR | select.POLLNVAL
_POLLIN = select.POLLIN


def _make_codec():
    """Returns (dumps, loads) for compact JSON, through the C accelerator ``_json`` when it
    behaves as expected here, else through the ``json`` module."""
    try:
        import _json

        make_encoder = _json.make_encoder
        encode_basestring_ascii = _json.encode_basestring_ascii

        def default(obj):
            raise TypeError("Object of type %s is not JSON serializable" % type(obj).__name__)

        def dumps(obj):
            # A fresh encoder per call: its circular-reference markers start empty.
            encoder = make_encoder(
                {}, default, encode_basestring_ascii, None, ":", ",", False, False, False
            )
            return "".join(encoder(obj, 0))

        class Context:
            strict = True
            object_hook = None
            object_pairs_hook = None
            parse_float = float
            parse_int = int
            parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__
            memo = None

        scan = _json.make_scanner(Context())

        def loads(text):
            value, end = scan(text, 0)
            if text[end:].strip():
                raise ValueError("extra data after a JSON value")
            return value

        sample = {"op": "x", "n": [1, -2.5, None, True, False], "s": "\u00e9\"\n"}
        if dumps(sample) != '{"op":"x","n":[1,-2.5,null,true,false],"s":"\\u00e9\\"\\n"}':
            raise ValueError("unexpected encoding")
        if loads(dumps(sample)) != sample:
            raise ValueError("unexpected decoding")
        return dumps, loads
    except Exception:
        import json

        json_dumps = json.dumps

        def dumps(obj):
            return json_dumps(obj, separators=(",", ":"), allow_nan=False)

        return dumps, json.loads


_dumps, _loads = _make_codec()


def _check_text(value):
    """Raises UnicodeEncodeError (a ValueError) if a string in `value` (keys included) is not
    valid Unicode text, RecursionError if it nests too deep."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_text(key)
            _check_text(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_text(item)
# Where runner/rich.py is loaded (see _Display.load).
_RUNNER_GLOBALS = globals()


class _Channel:
    """The private protocol descriptors and the frame writer shared by all threads."""

    def __init__(self):
        # Private copies first, then repoint 0/1/2, so nothing a cell does touches the channel.
        # os.dup makes non-inheritable descriptors: subprocesses never see the channel.
        self.inp = os.dup(0)
        self.out = os.dup(2)
        # A private handle on the output pipe: end markers still get through after a cell
        # closed or redirected fds 1 and 2, and each cell starts with them restored.
        self.cell_out = os.dup(1)
        self.null = os.open(os.devnull, os.O_RDONLY)
        self.lock = _allocate_lock()
        # The write end of the stderr relay's pipe while the relay runs (see _StderrRelay).
        self.err = None
        # The relay's control pipe, closed in processes a cell forks.
        self.relay_fds = ()
        self.restore_fds()

    def restore_fds(self):
        """Points fd 0 at /dev/null, fd 1 at the output pipe and fd 2 at the stderr relay
        (at the output pipe when no relay runs)."""
        _dup2(self.null, 0)
        _dup2(self.cell_out, 1)
        _dup2(self.cell_out if self.err is None else self.err, 2)

    def close_in_child(self):
        """A process forked by a cell must not speak (or forge) the protocol."""
        for fd in (self.inp, self.out) + tuple(self.relay_fds):
            try:
                _close(fd)
            except OSError:
                pass

    def send(self, msg, limit=None):
        """Writes one frame; a message that is not JSON, or longer than `limit` bytes (the
        newline aside), raises (OverflowError for the length) before anything is written."""
        data = (_dumps(msg) + "\n").encode("utf-8", "surrogatepass")
        if limit is not None and len(data) - 1 > limit:
            raise OverflowError(len(data) - 1)
        with self.lock:
            view = memoryview(data)
            while view:
                n = _write(self.out, view)
                view = view[n:]


class _Inbox:
    """Host -> runner messages, read by whichever waiting thread gets there first."""

    def __init__(self, channel):
        self.ch = channel
        self.buf = b""
        self.lock = _allocate_lock()
        # One held lock per thread asleep in _sleep; releasing it wakes that thread.
        self.sleepers = []
        self.reading = False
        self.execs = []
        self.results = {}

    def wait(self, take):
        """Returns ``take()`` once it is not None, reading messages meanwhile if nobody is.

        ``take`` runs under the inbox lock."""
        with self.lock:
            while True:
                value = take()
                if value is not None:
                    return value
                if not self.reading:
                    self.reading = True
                    break
                self._sleep()
        try:
            while True:
                msg = self._read()
                with self.lock:
                    self._file(msg)
                    self._wake_all()
                    value = take()
                    if value is not None:
                        return value
        finally:
            with self.lock:
                self.reading = False
                # Another waiter takes over the reading.
                self._wake_all()

    def _sleep(self):
        """Waits for _wake_all; called and returns with the inbox lock held."""
        sleeper = _allocate_lock()
        sleeper.acquire()
        self.sleepers.append(sleeper)
        self.lock.release()
        try:
            sleeper.acquire()
        finally:
            self.lock.acquire()
            if sleeper in self.sleepers:
                self.sleepers.remove(sleeper)

    def _wake_all(self):
        sleepers, self.sleepers = self.sleepers, []
        for sleeper in sleepers:
            sleeper.release()

    def _read(self):
        # Only the reading thread touches the buffer.
        while True:
            if b"\n" in self.buf:
                line, self.buf = self.buf.split(b"\n", 1)
                try:
                    return _loads(line.decode("utf-8"))
                except Exception:
                    continue  # not a frame: nothing the host sends, so nothing to act on
            chunk = _read(self.ch.inp, 65536)
            if not chunk:
                _exit(0)
            self.buf += chunk

    def _file(self, msg):
        op = msg.get("op") if isinstance(msg, dict) else None
        if op == "exec":
            self.execs.append(msg)
        elif op == "tool_result":
            self.results[msg.get("call")] = msg
        elif op == "ping":
            self.ch.send({"op": "pong"})
        elif op == "hibernate":
            _hibernate(self.ch, msg.get("token"), msg.get("staging"), _RUNNER[0])


# Longest frame the stderr relay (or the traceback) writes on the output pipe: one atomic write
# (PIPE_BUF), so no other writer's output lands inside it. The host reads at most this much
# after a display marker (MAX_DISPLAY_PIECE in src/kernel/scanner.rs).
_PIPE_BUF = 4096

# How long the runner waits for the relay to forward a cell's stderr before the cell's end
# marker, in milliseconds; a relay that does not answer (a cell killed it) is given up and fd 2
# goes to the output pipe, stderr and stdout mixed, for the kernel's life.
_RELAY_FLUSH_MS = 2000


def _pieces(marker, flag, data):
    """``data`` as frames of the output pipe: ``marker``, ``flag``, four hex digits of length,
    the bytes; each frame at most _PIPE_BUF bytes. Without a marker (between cells, during the
    warm-up) the bytes go as they are."""
    if not marker:
        return [data] if data else []
    step = _PIPE_BUF - len(marker) - 5
    return [marker + flag + b"%04x" % len(data[i:i + step]) + data[i:i + step]
            for i in range(0, len(data), step)]


def _relay_loop(err, ctl, ack, out):
    """The stderr relay's process: forwards what arrives on ``err`` to ``out`` as stderr frames
    behind the current cell's display marker (told on ``ctl`` as ``M<marker>\\n``); on ``F\\n``
    forwards everything ``err`` holds, then answers one byte on ``ack``. Returns when the
    runner is gone (``ctl`` closed) or ``out`` is."""
    _signal.signal(_signal.SIGINT, _signal.SIG_IGN)
    poller = _poll()
    poller.register(err, _POLLIN)
    poller.register(ctl, _POLLIN)
    pending = _poll()
    pending.register(err, _POLLIN)
    marker = b""
    buf = b""
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        flush = False
        # Control first: a marker told before the cell wrote applies to what it wrote.
        if any(fd == ctl for fd, _ in events):
            chunk = _read(ctl, 4096)
            if not chunk:
                return
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                if line[:1] == b"M":
                    marker = line[1:]
                elif line == b"F":
                    flush = True
        while True:
            try:
                ready = pending.poll(0)
            except InterruptedError:
                continue
            if not ready:
                break
            data = _read(err, _PIPE_BUF - len(marker) - 5 if marker else _PIPE_BUF)
            if not data:
                return
            for frame in _pieces(marker, b"e", data):
                try:
                    _write(out, frame)
                except OSError:
                    return
            if not flush:
                break
        if flush:
            _write(ack, b"k")


class _StderrRelay:
    """Cell stderr apart from stdout (docs/contract.md, "stdout and stderr"): fd 2 is a pipe
    this relay's process reads and writes to the output pipe as frames behind the cell's display
    marker. A process, not a thread of this interpreter: a cell that holds the GIL while its
    stderr fills the pipe blocks only itself. At a cell's end the runner asks the relay to
    forward everything the pipe holds before it writes the end marker (``flush``), so the
    cell's stderr is the cell's. A relay that fails (a cell killed it) is given up: stderr goes
    to the output pipe again, mixed with stdout. It is stopped before a hibernation (it holds
    the host's output pipe) and started again after the restore."""

    def __init__(self, channel):
        self.ch = channel
        self.pid = None
        self.ctl = None
        self.ack = None
        # The process that started the relay: a process a cell forks leaves it alone.
        self.owner = _getpid()
        # One flush at a time (a thread's display and the main thread's may race).
        self.lock = _allocate_lock()

    def start(self):
        fds = []
        try:
            err_r, err_w = os.pipe()
            fds += [err_r, err_w]
            ctl_r, ctl_w = os.pipe()
            fds += [ctl_r, ctl_w]
            ack_r, ack_w = os.pipe()
            fds += [ack_r, ack_w]
            pid = os.fork()
        except OSError:
            for fd in fds:
                _close(fd)
            return
        if pid == 0:
            try:
                for fd in (err_w, ctl_w, ack_r):
                    _close(fd)
                _relay_loop(err_r, ctl_r, ack_w, self.ch.cell_out)
            finally:
                _exit(0)
        for fd in (err_r, ctl_r, ack_w):
            _close(fd)
        self.pid, self.ctl, self.ack = pid, ctl_w, ack_r
        self.ch.err = err_w
        self.ch.relay_fds = (ctl_w, ack_r)
        self.ch.restore_fds()

    def stop(self):
        """Ends the relay; fd 2 goes to the output pipe."""
        if self.pid is None or _getpid() != self.owner:
            return
        try:
            os.kill(self.pid, 9)
            os.waitpid(self.pid, 0)
        except OSError:
            pass
        for fd in (self.ch.err, self.ctl, self.ack):
            try:
                _close(fd)
            except OSError:
                pass
        self.pid = self.ctl = self.ack = self.ch.err = None
        self.ch.relay_fds = ()
        self.ch.restore_fds()

    def begin(self, marker):
        """The cell's display marker, for what it writes on stderr."""
        if self.pid is None or _getpid() != self.owner:
            return
        if not self._tell(b"M" + marker + b"\n"):
            self.stop()

    def flush(self):
        """Returns once everything written on stderr so far is on the output pipe."""
        if self.pid is None or _getpid() != self.owner:
            return
        with self.lock:
            if self.pid is not None and not self._flushed():
                self.stop()

    def _flushed(self):
        """Asks the relay to forward what its pipe holds; True once it answered."""
        if not self._tell(b"F\n"):
            return False
        poller = _poll()
        poller.register(self.ack, _POLLIN)
        deadline = _now() + _RELAY_FLUSH_MS / 1000.0
        while True:
            left = int((deadline - _now()) * 1000)
            if left <= 0:
                return False
            try:
                return bool(poller.poll(left)) and _read(self.ack, 1) == b"k"
            except InterruptedError:
                continue
            except OSError:
                return False

    def _tell(self, line):
        try:
            _write(self.ctl, line)
            return True
        except OSError:
            return False


# The relay, for what hibernation stops and starts again (see _hibernate).
_STDERR_RELAY = [None]


# The runner, for what hibernation closes and reopens (see _hibernate).
_RUNNER = [None]

# The pid of the relay whose streams are the channel after a restore (see _hibernate).
_RELAY = [None]

# Bumped when the kernel hibernates: a watcher of an earlier channel returns instead of ending
# the kernel when that channel closes (see _hibernate).
_EPOCH = [0]


def _watch_hangup(fd, epoch=0):
    """Ends the kernel the moment the host's end of stdin closes, whatever the cell does."""
    poller = _poll()
    poller.register(fd, 0)  # POLLHUP and POLLERR are always reported; data is left alone.
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        for _, ev in events:
            if ev & _HANGUP:
                if _EPOCH[0] != epoch:
                    return
                _exit(0)


# Where a hibernating kernel keeps its staging volume's files (see _hibernate): /tmp is the
# sandbox's own memory, saved with the checkpoint.
_STASH = "/tmp/.kernelbox-hibernated"


def _move_all(source, target):
    """Moves every entry of ``source`` into ``target``; on a failure moves back what it moved
    and raises."""
    import shutil

    moved = []
    try:
        for name in os.listdir(source):
            shutil.move(os.path.join(source, name), os.path.join(target, name))
            moved.append(name)
    except BaseException:
        for name in moved:
            try:
                shutil.move(os.path.join(target, name), os.path.join(source, name))
            except OSError:
                pass
        raise


def _open_under(directory):
    """Descriptors of this process open on files under ``directory``."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink("/proc/self/fd/" + name)
        except OSError:
            continue
        if target == directory or target.startswith(directory + "/"):
            found.append(target)
    return found


def _hibernate(ch, token, staging, runner):
    """The host checkpoints this kernel (docs/runtimes.md, "Hibernation"): the runner drops its
    channel, answers ``hibernating`` and waits on the abstract Unix socket named by the host's
    token. Once restored, the host starts a relay by exec that presents the token and hands
    over its stdin, stdout and stderr: they become the channel, and the runner says ``ready``
    again. Only an idle kernel hibernates (the host holds the cell lock); the socket module is
    imported only here, so kernels that never hibernate do not pay for it."""
    import _socket
    import array

    # The token's first 16 characters name the socket (names are listed in /proc/net/unix);
    # the rest is the secret the relay presents.
    if not (isinstance(token, str) and token.isalnum() and 32 <= len(token) <= 64):
        ch.send({"op": "hibernating", "ok": False, "error": "bad token"})
        return
    if runner is not None and runner.shell is not None:
        # Bash's descriptors are the container's streams, which a restore replaces: a Bash
        # kernel is not checkpointed (it is reaped as without hibernation).
        ch.send({"op": "hibernating", "ok": False, "error": "a %s kernel does not hibernate" % runner.shell.name})
        return
    # The staging volume is the host's memory and comes back empty after a restore, while
    # /tmp is the sandbox's own and is saved with it: the volume's files wait in /tmp and go
    # back before the runner speaks again. Nothing may hold one of them open through the
    # checkpoint (a file missing at restore fails it): the status file is closed and
    # reopened, and a kernel whose cells hold one open does not hibernate.
    if not (isinstance(staging, str) and staging.startswith("/") and os.path.isdir(staging)):
        staging = None
    if runner is not None and runner.status_fd is not None:
        _close(runner.status_fd)
        runner.status_fd = None

    def refuse(error):
        if runner is not None:
            runner.status_fd = _open_status(runner.status_path)
        ch.send({"op": "hibernating", "ok": False, "error": error})

    held = _open_under(staging) if staging else []
    if held:
        refuse("files are open under %s: %s" % (staging, ", ".join(held[:4])))
        return
    if staging:
        try:
            os.makedirs(_STASH, mode=0o700, exist_ok=True)
            _move_all(staging, _STASH)
        except Exception as exc:
            refuse("cannot keep the files of %s: %s" % (staging, exc))
            return
    try:
        listener = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        listener.bind(b"\0kernelbox-resume-" + token[:16].encode())
        listener.listen(4)
    except OSError as exc:
        if staging:
            _move_all(_STASH, staging)
        refuse(str(exc))
        return
    _EPOCH[0] += 1
    _dup2(ch.null, ch.inp)
    ch.send({"op": "hibernating", "ok": True})
    # Nothing of the host's may stay open through the checkpoint (a restore cannot give the
    # sandbox back the host's descriptors of an earlier exec): the channel's output and fds 1
    # and 2 go to /dev/null, and a previous restore's relay goes.
    if _STDERR_RELAY[0] is not None:
        _STDERR_RELAY[0].stop()
    sink = os.open(os.devnull, os.O_WRONLY)
    with ch.lock:
        for fd in (ch.out, ch.cell_out, 1, 2):
            _dup2(sink, fd)
    _close(sink)
    if _RELAY[0]:
        try:
            os.kill(_RELAY[0], 9)
        except OSError:
            pass
        _RELAY[0] = None
    want = token[16:].encode()
    fds = array.array("i")
    try:
        while True:
            conn = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM, 0, listener._accept()[0])
            try:
                conn.settimeout(5)
                msg, ancillary, _, _ = conn.recvmsg(128, _socket.CMSG_SPACE(3 * fds.itemsize))
                for level, kind, data in ancillary:
                    if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
                        fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
            except OSError:
                msg = b""
            finally:
                conn.close()
            # The relay sends the secret, a space and its pid (ended at the next hibernation).
            secret, _, pid = msg.partition(b" ")
            if secret == want and len(fds) == 3:
                _RELAY[0] = int(pid) if pid.isdigit() and int(pid) > 1 else None
                break
            for fd in fds:
                _close(fd)
            del fds[:]
    finally:
        listener.close()
    _dup2(fds[0], ch.inp)
    _dup2(fds[2], ch.out)
    _dup2(fds[1], ch.cell_out)
    for fd in fds:
        _close(fd)
    ch.restore_fds()
    if _STDERR_RELAY[0] is not None:
        _STDERR_RELAY[0].start()
    if staging:
        try:
            _move_all(_STASH, staging)
            os.rmdir(_STASH)
        except Exception:
            pass  # what could not go back stays in the stash: the kernel goes on
    if runner is not None:
        runner.status_fd = _open_status(runner.status_path)
    _thread.start_new_thread(_watch_hangup, (ch.inp, _EPOCH[0]))
    ch.send({"op": "ready", "v": PROTOCOL_VERSION, "python": sys.version.split()[0], "pid": _getpid()})


class _Interrupts:
    """SIGINT as a KeyboardInterrupt in the running cell's code, and nowhere else.

    ``armed`` is set only while the main thread runs the cell's code (``guard`` clears it
    around the runner's own work the cell calls into: displays, tool calls, the import hook),
    so the runner's state (the inbox, the display channel, the end line) is never cut half
    way. A SIGINT that lands while not armed during a cell is held (``pending``) and raised
    as soon as the cell's code resumes; one that lands between cells is dropped."""

    def __init__(self):
        self.armed = False
        self.in_cell = False
        self.pending = False
        # This cell received a SIGINT: it ends "interrupted" if it raises KeyboardInterrupt.
        self.hit = False

    def handler(self, signum, frame):
        if not self.in_cell:
            return
        self.hit = True
        if self.armed:
            # Disarmed as it is raised: a second SIGINT while the exception unwinds (through
            # the runner's own frames) is held, not raised there.
            self.armed = False
            self.pending = False
            raise KeyboardInterrupt
        self.pending = True

    def install(self):
        try:
            _signal.signal(_signal.SIGINT, self.handler)
        except (ValueError, OSError):
            pass  # not the main thread, or no signals here: interrupts then kill the kernel

    def begin(self):
        self.pending = False
        self.hit = False
        self.in_cell = True

    def end(self):
        self.armed = False
        self.in_cell = False
        self.pending = False

    def arm(self):
        """Back in the cell's code: a SIGINT held meanwhile is raised now."""
        if _get_ident() != _MAIN_THREAD or not self.in_cell:
            return
        self.armed = True
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt

    def guard(self):
        """Entering the runner's own work from the cell's code on the main thread: returns
        whether the cell's code was armed (pass it to ``restore``)."""
        if _get_ident() != _MAIN_THREAD:
            return False
        was, self.armed = self.armed, False
        return was

    def restore(self, was):
        if was:
            self.arm()


_MAIN_THREAD = _get_ident()
_INTERRUPTS = _Interrupts()


def _guarded(function):
    """Runs ``function`` (the runner's own work, called from a cell's code) with SIGINT held,
    and raises a SIGINT that arrived meanwhile once it returned or raised."""

    def run(*args, **kwargs):
        was = _INTERRUPTS.guard()
        try:
            return function(*args, **kwargs)
        finally:
            _INTERRUPTS.restore(was)

    run.__name__ = getattr(function, "__name__", "run")
    run.__qualname__ = getattr(function, "__qualname__", "run")
    run.__doc__ = getattr(function, "__doc__", None)
    return run


class _Runner:
    def __init__(self, channel, status_path, rich_source, preload=()):
        self.preload = tuple(preload)
        self.ch = channel
        self.inbox = _Inbox(channel)
        self.current_cell = None
        self.execution_count = 0
        # Cells run in a fresh __main__ module, so pickling and introspection see cell code.
        main_module = type(sys)("__main__")
        # The real builtins module: the runner's own namespace holds a private copy.
        main_module.__dict__["__builtins__"] = _modules["builtins"]
        _modules["__main__"] = main_module
        self.namespace = main_module.__dict__
        self.calls_lock = _allocate_lock()
        # Threads and the cell they belong to (see _tag_threads); the main thread runs the
        # current cell.
        self.main_thread = _get_ident()
        self.thread_cells = {}
        self.next_call = 0
        self.pid = _getpid()
        self.status_path = status_path
        self.status_fd = _open_status(status_path)
        # Rich results; the builtin ``display`` is put back before every cell.
        self.display = _Display(channel, os.getcwd(), rich_source)
        self.display_builtin = _display_builtin(self.display)
        # The Bash a Bash kernel's cells run in (None: cells are Python).
        self.shell = None

    # -- tool calls ------------------------------------------------------------------------

    def tool_call(self, name, args):
        return _guarded(self._tool_call)(name, args)

    def _tool_call(self, name, args):
        if _getpid() != self.pid:
            raise ToolError("tool calls are only available in the kernel process, not in a forked child")
        if not isinstance(name, str) or not name:
            raise ToolError("tool name must be a non-empty string")
        cell = self.cell_of_current_thread()
        with self.calls_lock:
            self.next_call += 1
            call = self.next_call
        try:
            # A lone surrogate (e.g. a file name decoded with surrogateescape) would be sent as
            # an escape the host cannot read as text: the call would never be answered.
            _check_text(name)
            _check_text(args)
            self.ch.send(
                {"op": "tool_call", "cell": cell, "call": call, "tool": name, "args": args},
                limit=MAX_FRAME_LINE,
            )
        except OverflowError as exc:
            raise ToolError(
                "tool call too large: %s bytes as JSON; at most %d per call"
                % (exc.args[0], MAX_FRAME_LINE)
            )
        except (TypeError, ValueError, RecursionError) as exc:
            raise ToolError("tool arguments must be JSON-serialisable: %s" % exc)
        results = self.inbox.results
        reply = self.inbox.wait(lambda: results.pop(call, None))
        if reply.get("ok"):
            return reply.get("result")
        raise ToolError(reply.get("error") or "tool call failed")

    def cell_of_current_thread(self):
        """The cell whose authority the calling thread carries (None: no cell)."""
        ident = _get_ident()
        if ident == self.main_thread:
            return self.current_cell
        return self.thread_cells.get(ident)

    # -- cells -----------------------------------------------------------------------------

    def run_forever(self):
        if self.shell is None:
            self.warm_up()
        self.ch.send(
            {"op": "ready", "v": PROTOCOL_VERSION, "python": sys.version.split()[0], "pid": _getpid()}
        )
        execs = self.inbox.execs
        trimmed = False
        while True:
            if not trimmed:
                trimmed = self.trim_when_idle()
            msg = self.inbox.wait(lambda: execs.pop(0) if execs else None)
            self.run_cell(msg)

    def trim_when_idle(self):
        """Once no message has come for ``TRIM_AFTER_IDLE_MS``, returns the free pages of the C
        heap to the system (glibc's ``malloc_trim``, through ctypes) and returns True; returns
        False as soon as a message is waiting or arrives first. Called between cells until it
        returns True, so it runs once in the kernel's life, when the kernel first sits idle
        (a pooled kernel waiting, a cold one after its first cell). Compiling the runner leaves
        freed parser memory scattered through the heap, resident for the process's life:
        trimming it saves about 0.2 MiB of anonymous memory per idle kernel, ctypes included
        (docs/performance.md). Importing ctypes takes a few milliseconds, which is why this
        waits for an idle moment rather than delay ``ready``. Best effort: without ctypes or
        glibc nothing is trimmed."""
        inbox = self.inbox
        with inbox.lock:
            if inbox.execs or inbox.reading or b"\n" in inbox.buf:
                return False
        poller = _poll()
        poller.register(self.ch.inp, _POLLIN)
        try:
            if poller.poll(TRIM_AFTER_IDLE_MS):
                return False
        except OSError:
            return False
        try:
            import ctypes

            ctypes.CDLL(None).malloc_trim(0)
        except BaseException:
            pass
        return True

    def warm_up(self, rounds=WARM_UP_ROUNDS):
        """Runs the whole cell path ``rounds`` times before ready, so that a new owner's first
        cell (on a warm-pool kernel above all) costs what any cell costs. Run once, a path is
        several times slower than run again (the AST module loads on the first compile, the
        interpreter specialises code only after it ran a few times, memory is first touched):
        measured in the runner with cells back to back, its first cell took 0.3-0.35 ms, the
        later ones 0.03-0.09 ms, and the first one after this warm-up 0.06-0.08 ms
        (docs/performance.md). The messages come through a private pipe, the cells run on a constant
        in a throwaway namespace with their output going to /dev/null; afterwards nothing of
        them is visible to cells, no cell is counted and the status file is empty again.
        A pooled kernel told to preload (``KERNELBOX_PRELOAD``) first runs the import of those
        modules the same way (``_PRELOAD_CODE``): they stay in ``sys.modules``, not in the
        namespace, so a cell's ``import numpy`` is a dictionary lookup."""
        inp, cell_out, namespace = self.ch.inp, self.ch.cell_out, self.namespace
        fds = []
        try:
            r, w = os.pipe()
            fds += [r, w]
            sink = os.open(os.devnull, os.O_WRONLY)
            fds.append(sink)
            self.ch.inp, self.ch.cell_out = r, sink
            self.namespace = {"__builtins__": _modules["builtins"]}
            execs = self.inbox.execs
            codes = ["_ = None\n_"] * rounds
            if self.preload:
                codes.insert(0, _PRELOAD_CODE % (self.preload,))
            for i, code in enumerate(codes):
                # One message at a time: the pipe never holds more than one (a preload's code
                # is far below a pipe's buffer).
                _write_all(
                    w,
                    (_dumps({"op": "exec", "cell": -1 - i, "code": code, "marker": "",
                             "display": "", "display_caps": {}}) + "\n").encode(),
                )
                self.run_cell(self.inbox.wait(lambda: execs.pop(0) if execs else None))
        except Exception:
            pass  # best effort: a kernel that could not warm up still works, only slower once
        finally:
            self.ch.inp, self.ch.cell_out, self.namespace = inp, cell_out, namespace
            self.ch.restore_fds()
            _restore_std_streams()
            self.inbox.buf = b""
            del self.inbox.execs[:]
            self.execution_count = 0
            for fd in fds:
                _close(fd)
            if self.status_fd is not None:
                try:
                    os.ftruncate(self.status_fd, 0)
                except OSError:
                    pass

    def run_cell(self, msg):
        cell = msg.get("cell")
        marker = str(msg.get("marker", "")).encode("utf-8")
        self.ch.restore_fds()
        _restore_std_streams()
        self.current_cell = cell
        self.execution_count += 1
        self.write_status(busy=True)
        self.display.begin(msg)
        display_marker = str(msg.get("display", "")).encode("utf-8")
        relay = _STDERR_RELAY[0]
        if relay is not None:
            relay.begin(display_marker)
        _modules["builtins"].display = self.display_builtin
        status, tb, exit_code = "ok", None, 0
        ename = evalue = None
        interrupts = _INTERRUPTS
        interrupts.begin()
        try:
            if self.shell is not None:
                status, exit_code, tb, ename, evalue = self.shell.run(msg.get("code", ""), interrupts)
                raise _ShellDone
            code, last = _compile_cell(msg.get("code", ""), "<cell-%s>" % cell)
            try:
                # A KeyboardInterrupt raised anywhere in here, this block's own lines
                # included, is caught below: it never reaches the runner's loop.
                interrupts.arm()
                exec(code, self.namespace)
                if last is not None:
                    # The last expression's value is the main result (Jupyter's execute_result).
                    value = eval(last, self.namespace)
                    interrupts.armed = False
                    if value is not None:
                        self.display.show((value,), main=True)
                    del value
            finally:
                interrupts.armed = False
        except _ShellDone:
            pass
        except SystemExit as exc:
            status = "exit"
            exit_code = _exit_code(exc.code)
        except BaseException:
            etype, value, tb_obj = _exc_info()
            status = "interrupted" if etype is KeyboardInterrupt and interrupts.hit else "error"
            exit_code = 1
            # Drop this frame so the traceback starts in the cell.
            if tb_obj is not None and tb_obj.tb_frame.f_code is _Runner.run_cell.__code__:
                tb_obj = tb_obj.tb_next
            tb = _format_traceback(etype, value, tb_obj)
            ename, evalue = _exception_parts(etype, value)
            del tb_obj, value
        finally:
            interrupts.end()
            self.current_cell = None
        if _getpid() != self.pid:
            # A process the cell forked fell out of the cell's code: it is not the kernel.
            _flush_quietly()
            _exit(exit_code)
        if status != "exit":
            self.display.flush_figures()
        dropped = self.display.end()
        _flush_quietly()
        if tb and (self.shell is None or self.shell.traceback_in_output):
            # The traceback is part of the cell's output too, in write order, flagged apart
            # from its stdout and stderr.
            for frame in _pieces(display_marker, b"t", tb.encode("utf-8", "replace")):
                _write_all(self.ch.cell_out, frame)
        # The end marker and the outcome in one write of at most PIPE_BUF bytes, which the
        # kernel makes atomic: output of threads or subprocesses cannot land inside it.
        _write_all(self.ch.cell_out, _end_line(marker, cell, status, tb, self.execution_count, exit_code, dropped,
                                               ename, evalue))
        if status == "exit":
            _exit(0)
        self.write_status(busy=False)

    def write_status(self, busy):
        """Cells run, busy or idle, and since when, for `kernelbox ps` (one pwrite)."""
        if self.status_fd is None:
            return
        line = "%d %d %d\n" % (self.execution_count, int(_now()), int(busy))
        try:
            _pwrite(self.status_fd, line.ljust(40).encode(), 0)
        except OSError:
            pass


_INLINE_BACKEND = "kernelbox_inline"


class _Display:
    """The rich results of the running cell: the cell's display marker and caps, and what it
    displayed so far. The work is in ``runner/rich.py``, whose text is kept and compiled into
    the runner's namespace on first use (an idle kernel pays nothing for it)."""

    def __init__(self, channel, workdir, source):
        self.ch = channel
        self.workdir = workdir
        self.source = source
        self.loading = _allocate_lock()
        self.lock = _allocate_lock()
        self.marker = None
        self.cell = None
        self.caps = (0, 0, 0)
        self.used = 0
        self.count = 0
        self.dropped = 0

    def load(self):
        with self.loading:
            if self.source:
                exec(compile(self.source, "<kernelbox-rich>", "exec"), _RUNNER_GLOBALS)
                self.source = None

    def begin(self, msg):
        marker = msg.get("display")
        caps = msg.get("display_caps") or {}
        with self.lock:
            self.marker = marker.encode("utf-8") if isinstance(marker, str) and marker else None
            self.cell = msg.get("cell")
            self.caps = (int(caps.get("bundle", 0)), int(caps.get("cell", 0)), int(caps.get("overhead", 0)))
            self.used = 0
            self.count = 0
            self.dropped = 0

    def end(self):
        """Closes the cell's display channel; returns how many displays were dropped."""
        with self.lock:
            self.marker = None
            return self.dropped

    def show(self, objs, raw=False, metadata=None, main=False):
        self.load()
        _show(self, objs, raw, metadata, main)

    def flush_figures(self):
        """Shows and closes open matplotlib figures, if a cell loaded pyplot."""
        if "matplotlib.pyplot" in _modules:
            self.load()
            _flush_figures(self)


def _display_builtin(display):
    def display_(*objs, raw=False, metadata=None, **_ignored):
        """Show objects as rich results (as IPython's display): their _repr_mimebundle_,
        _repr_png_, _repr_svg_, _repr_html_, ... and repr, in the order called."""
        _guarded(display.show)(objs, raw=raw, metadata=metadata)

    display_.__name__ = "display"
    display_.__qualname__ = "display"
    return display_


class _InlineFinder:
    """Points matplotlib's default backend at ``kernelbox_inline`` when a cell imports it, and
    makes that backend module (``runner/rich.py``); never imports matplotlib itself."""

    def __init__(self, display):
        self.display = display
        self.busy = False

    def find_spec(self, name, path=None, target=None):
        if name not in ("matplotlib", _INLINE_BACKEND) or self.busy:
            return None
        return _guarded(self._find_spec)(name, path, target)

    def _find_spec(self, name, path, target):
        self.display.load()
        self.busy = True
        try:
            return _inline_spec(self, name, path, target)
        finally:
            self.busy = False


def _compile_cell(source, filename):
    """Compiles a cell; when its last statement is an expression not ended by ``;`` (as in
    Jupyter), returns it apart, compiled for eval, so its value can be the main result."""
    import _ast

    tree = compile(source, filename, "exec", _ast.PyCF_ONLY_AST)
    body = tree.body
    if body and type(body[-1]) is _ast.Expr and not _silenced(source, body[-1]):
        last = body.pop()
        expression = _ast.Expression(body=last.value)
        return compile(tree, filename, "exec"), compile(expression, filename, "eval")
    return compile(tree, filename, "exec"), None


def _silenced(source, node):
    """True when a ``;`` follows the expression on its last line (Jupyter shows nothing then)."""
    try:
        line = source.split("\n")[node.end_lineno - 1].encode("utf-8")
        return line[node.end_col_offset:].decode("utf-8").lstrip().startswith(";")
    except Exception:
        return False


class ToolError(Exception):
    """A tool call was refused or failed on the host; the message says why."""


class _ShellDone(BaseException):
    """A Bash cell ended (its outcome is set): leaves run_cell's try block."""


# Where the hosted Bash reads a cell's number and writes its status, and keeps its copies of
# the output pipe (the runner's fds 1 and 2): all four are closed while a cell runs (the ``.``
# command's redirections), so neither the cell nor its background jobs hold them, and
# restored by Bash after it; fds 0, 1 and 2 are set again for every cell, so a cell that
# closed or redirected them (``exec >&-``) leaves the next one whole.
_BASH_OUT_FD = 60
_BASH_ERR_FD = 61
_BASH_CMD_FD = 62
_BASH_STATUS_FD = 63
# How long a Bash whose status pipe closed may take to exit before it is taken for alive.
_BASH_EXIT_WAIT_MS = 2000

# The hosted Bash's loop: for each cell the runner writes a fresh nonce; the loop sources the
# cell's file in this shell (so variables, functions, the working directory, options and traps
# persist) and reports the nonce and ``$?``. SIGINT returns from the cell (status 130) and keeps
# the shell; the trap is set again before every cell, so a cell cannot keep its own. ``exit`` in
# a cell ends the shell: the kernel ends as it does on Python's ``sys.exit()``. The loop calls
# its commands through ``builtin`` and drops functions that would shadow them (a cell's
# ``read() { ...; }``) before each use; the cell owns the shell, so this only narrows what a
# cell breaks by accident: what holds the results in step is the runner's check of each status
# line against the running cell's nonce (``_Bash._status``, `docs/contract.md`, "Languages").
_BASH_LOOP = """declare -r __kernelbox_cell="$1"
while unset -f builtin unset read trap printf 2>/dev/null; IFS= builtin read -r -u %d __kernelbox_n; do
  builtin trap 'return 130 2>/dev/null' INT
  builtin . "$__kernelbox_cell" </dev/null >&%d 2>&%d %d>&- %d>&- %d<&- %d>&-
  __kernelbox_s=$?
  unset -f builtin unset printf 2>/dev/null
  builtin printf '%%s %%s\\n' "$__kernelbox_n" "$__kernelbox_s" >&%d
done
""" % (_BASH_CMD_FD, _BASH_OUT_FD, _BASH_ERR_FD, _BASH_OUT_FD, _BASH_ERR_FD, _BASH_CMD_FD,
       _BASH_STATUS_FD, _BASH_STATUS_FD)


class _Bash:
    """The persistent Bash of a Bash kernel, a child of the runner in a session of its own.

    A cell's source goes to a file in a private directory under /tmp (the kernel's tmpfs);
    the cell's number, on a pipe Bash reads; its status comes back on another pipe. Bash
    inherits fds 1 and 2 from the runner (the output pipe), so its output and its children's
    arrive as a Python cell's do, and the end marker follows them. Bash gone mid-cell: by
    ``exit N``, the cell ended the kernel (status ``exit``); by a signal (the OOM killer, a
    cell's ``kill``), the runner exits with the signal's status and the host reports the
    loss; a status pipe closed under it (a cell closed Bash's saved copy), or a status line
    that is not the running cell's (a cell wrote on a saved copy of the pipe, or subverted the
    loop: its nonce is wrong, or more than one line came), the runner ends Bash and exits: the
    kernel is lost, never a result out of step."""

    def __init__(self):
        path = None
        for candidate in ("/bin/bash", "/usr/bin/bash", "/usr/local/bin/bash"):
            if os.access(candidate, os.X_OK):
                path = candidate
                break
        if path is None:
            raise OSError("bash is not installed in this kernel image")
        directory = "/tmp/.kernelbox-bash"
        os.makedirs(directory, mode=0o700, exist_ok=True)
        self.cell_path = directory + "/cell.sh"
        cmd_r, self.cmd_w = os.pipe()
        self.status_r, status_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                _dup2(1, _BASH_OUT_FD)
                _dup2(2, _BASH_ERR_FD)
                _dup2(cmd_r, _BASH_CMD_FD)
                _dup2(status_w, _BASH_STATUS_FD)
                os.execv(path, [path, "--noprofile", "--norc", "-c", _BASH_LOOP, "bash", self.cell_path])
            finally:
                _exit(127)
        _close(cmd_r)
        _close(status_w)
        self.pid = pid
        self.pidfd = None
        try:
            self.pidfd = os.pidfd_open(pid)  # Python 3.9+, Linux 5.3+
        except (AttributeError, OSError):
            pass
        self.interrupted = False
        self.buf = b""

    # A failing command's message is the result's error, not part of the output.
    traceback_in_output = False
    name = "Bash"

    def interrupt(self, signum, frame):
        """The runner's SIGINT handler: a running cell's SIGINT goes to Bash's session."""
        if _INTERRUPTS.in_cell:
            self.interrupted = True
            try:
                os.killpg(self.pid, _signal.SIGINT)
            except OSError:
                pass

    def run(self, code, interrupts):
        """Runs one cell; returns (status, exit_code, error)."""
        self.interrupted = False
        fd = os.open(self.cell_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, code.encode("utf-8", "surrogateescape") + b"\n")
        finally:
            _close(fd)
        nonce = os.urandom(12).hex().encode("ascii")
        _write_all(self.cmd_w, nonce + b"\n")
        line = self._status()
        if line is None:
            return self._gone()
        said, _, code = line.partition(b" ")
        if said != nonce or self.buf or not code.isdigit():
            self._out_of_step()
        code = int(code)
        if code == 0:
            return "ok", 0, None, None, None
        if code == 130 and self.interrupted:
            return "interrupted", 130, "KeyboardInterrupt", None, None
        return "error", code, "exit status %d" % code, None, None

    def _status(self):
        """The next status line, or None once Bash can no longer give one."""
        poller = _poll()
        poller.register(self.status_r, _POLLIN)
        if self.pidfd is not None:
            poller.register(self.pidfd, _POLLIN)
        while b"\n" not in self.buf:
            try:
                events = poller.poll(None if self.pidfd is not None else 1000)
            except InterruptedError:
                continue
            if not events:
                if self._exited(block=False) is not None:
                    break
                continue
            if any(fd == self.status_r for fd, _ in events):
                chunk = _read(self.status_r, 64)
                if not chunk:
                    return None
                self.buf += chunk
                if len(self.buf) > 64:
                    return None
            elif b"\n" not in self.buf:
                return None  # Bash is gone
        if b"\n" not in self.buf:
            return None
        line, self.buf = self.buf.split(b"\n", 1)
        return line

    def _out_of_step(self):
        """A status line not the running cell's: the shell can no longer be trusted to report
        its cells, so it is ended and the runner exits (the kernel's loss, as a closed status
        pipe)."""
        try:
            os.killpg(self.pid, _signal.SIGKILL)
        except OSError:
            pass
        self._exited()
        _flush_quietly()
        _exit(70)

    def _exited(self, block=True):
        """Bash's wait status once it is gone, else None."""
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return 0
        return status if pid else None

    def _gone(self):
        """Bash cannot report: it exited (the cell's ``exit``), was killed, or lost its pipe."""
        status = self._exited(block=False)
        if status is None and self.pidfd is not None:
            # Bash's pipes close as it exits, a moment before its exit status can be had:
            # wait for that (its pidfd turns readable), bounded, before taking it for alive.
            poller = _poll()
            poller.register(self.pidfd, _POLLIN)
            try:
                poller.poll(_BASH_EXIT_WAIT_MS)
            except InterruptedError:
                pass
            status = self._exited(block=False)
        if status is None:
            # Alive without its status pipe: it cannot run another cell.
            try:
                os.killpg(self.pid, _signal.SIGKILL)
            except OSError:
                pass
            self._exited()
            _flush_quietly()
            _exit(70)
        if os.WIFSIGNALED(status):
            _exit(128 + os.WTERMSIG(status))
        return "exit", os.WEXITSTATUS(status), None, None, None


# Where the hosted Node reads commands (3), writes its messages (4) and reads display
# acknowledgements (5): the numbers runner/node_kernel.js expects, which it reopens close-on-exec.
_NODE_FDS = (3, 4, 5)
# Longest message line read from Node: a display over this (far over the display cap) is
# dropped unread, counted in the cell's ``displays_dropped``.
_NODE_MAX_LINE = 64 << 20
# How long Node may take to start (the TypeScript compiler loads first in a TypeScript kernel).
_NODE_START_MS = 60000


class _Node:
    """The persistent Node of a JavaScript or TypeScript kernel (docs/contract.md, "JavaScript
    and TypeScript"), a child of the runner in a session of its own, running
    ``runner/node_kernel.js`` (its text comes in ``KERNELBOX_NODE``).

    Node writes the cell's output on fds 1 and 2, reopened from the runner's (a new open file
    description of the same pipes: nothing Node does to its descriptors' flags reaches the
    runner's), so it arrives as a Python cell's does. The cell's code goes to Node on a pipe;
    its displays and outcome come back on another, each line carrying the cell's nonce (a
    stale line, or one without it, is ignored; the nonce is no secret from the cell, which
    can forge its own outcomes: docs/contract.md); displays go through the runner's display
    machinery (caps, spills) and are acknowledged, so they land in write order. Node gone
    mid-cell: by ``process.exit(n)``, the cell ended the kernel (status ``exit``); by a signal,
    the runner exits with the signal's status and the host reports the loss; its pipe closed,
    the runner ends Node and exits."""

    traceback_in_output = True
    name = "JavaScript"

    def __init__(self, language, source, display):
        path = None
        for candidate in ("/usr/bin/node", "/usr/bin/nodejs", "/usr/local/bin/node"):
            if os.access(candidate, os.X_OK):
                path = candidate
                break
        if path is None or not source:
            raise OSError("node is not installed in this kernel image")
        self.display = display
        directory = "/tmp/.kernelbox-node"
        os.makedirs(directory, mode=0o700, exist_ok=True)
        driver = directory + "/node_kernel.js"
        fd = os.open(driver, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            _write_all(fd, source.encode("utf-8"))
        finally:
            _close(fd)
        cmd_r, self.cmd_w = os.pipe()
        self.status_r, status_w = os.pipe()
        ack_r, self.ack_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.setsid()
                for std in (1, 2):
                    try:
                        fresh = os.open("/proc/self/fd/%d" % std, os.O_WRONLY)
                        _dup2(fresh, std)
                        _close(fresh)
                    except OSError:
                        pass  # the shared description: Node's stdio is written synchronously
                for i, fd in enumerate((cmd_r, status_w, ack_r)):
                    _dup2(fd, 100 + i)
                for i, target in enumerate(_NODE_FDS):
                    _dup2(100 + i, target)
                for i in range(len(_NODE_FDS)):
                    _close(100 + i)  # only 3, 4, 5 (which Node reopens close-on-exec) remain
                os.execv(path, [path, "--expose-internals", "--experimental-vm-modules", driver, language])
            finally:
                _exit(127)
        for fd in (cmd_r, status_w, ack_r):
            _close(fd)
        self.pid = pid
        self.pidfd = None
        try:
            self.pidfd = os.pidfd_open(pid)
        except (AttributeError, OSError):
            pass
        self.interrupted = False
        # Message bytes read from Node and not yet a whole line (a bytearray: a long display
        # line grows by appending, not by copying what came before), and how far it holds no
        # newline.
        self.buf = bytearray()
        self.scanned = 0
        self.cell = 0
        ready = self._message(_NODE_START_MS)
        if not isinstance(ready, dict) or ready.get("op") != "ready":
            self._kill()
            _exit(71)

    def interrupt(self, signum, frame):
        """The runner's SIGINT handler: a running cell's SIGINT goes to Node's session."""
        if _INTERRUPTS.in_cell:
            self.interrupted = True
            try:
                os.killpg(self.pid, _signal.SIGINT)
            except OSError:
                pass

    def run(self, code, interrupts):
        """Runs one cell; returns (status, exit_code, traceback, ename, evalue)."""
        self.interrupted = False
        self.cell += 1
        nonce = os.urandom(12).hex()
        _write_all(self.cmd_w, (_dumps({"code": code, "cell": self.cell, "nonce": nonce}) + "\n")
                   .encode("utf-8", "surrogatepass"))
        while True:
            msg = self._message(None)
            if msg is None:
                return self._gone()
            if not isinstance(msg, dict):
                if msg == "dropped":
                    with self.display.lock:
                        self.display.dropped += 1
                    _write_all(self.ack_w, b"k")
                continue
            if msg.get("nonce") != nonce:
                continue
            if msg.get("op") == "display":
                data = msg.get("data")
                try:
                    if isinstance(data, dict):
                        md = msg.get("metadata")
                        self.display.show((data,), raw=True, metadata=md if isinstance(md, dict) else None,
                                          main=bool(msg.get("main")))
                except Exception:
                    with self.display.lock:
                        self.display.dropped += 1
                finally:
                    _write_all(self.ack_w, b"k")
            elif msg.get("op") == "done":
                status = msg.get("status")
                tb, ename, evalue = msg.get("traceback"), msg.get("ename"), msg.get("evalue")
                if status == "ok":
                    return "ok", 0, None, None, None
                if status == "interrupted":
                    return "interrupted", 1, tb or "Interrupted\n", ename or "Interrupted", evalue
                return ("error", 1, tb if isinstance(tb, str) else "Uncaught error\n",
                        ename if isinstance(ename, str) else "Error",
                        evalue if isinstance(evalue, str) else "")

    def _message(self, timeout_ms):
        """The next message line from Node, parsed (None when Node can no longer send one,
        "dropped" for a line over _NODE_MAX_LINE, which is skipped unread)."""
        poller = _poll()
        poller.register(self.status_r, _POLLIN)
        if self.pidfd is not None:
            poller.register(self.pidfd, _POLLIN)
        deadline = None if timeout_ms is None else _now() + timeout_ms / 1000.0
        skipping = False
        while True:
            at = self.buf.find(b"\n", self.scanned)
            if at >= 0:
                line = bytes(self.buf[:at])
                del self.buf[:at + 1]
                self.scanned = 0
                if skipping:
                    return "dropped"
                try:
                    return _loads(line.decode("utf-8", "surrogatepass"))
                except Exception:
                    continue
            self.scanned = len(self.buf)
            if len(self.buf) > _NODE_MAX_LINE:
                self.buf = bytearray()
                self.scanned = 0
                skipping = True
            wait = None
            if deadline is not None:
                wait = max(0, int((deadline - _now()) * 1000))
                if wait == 0:
                    return None
            elif self.pidfd is None:
                wait = 1000
            try:
                events = poller.poll(wait)
            except InterruptedError:
                continue
            if not events:
                if self.pidfd is None and self._exited(block=False) is not None:
                    return None
                continue
            if any(fd == self.status_r for fd, _ in events):
                chunk = _read(self.status_r, 1 << 16)
                if not chunk:
                    return None
                self.buf += chunk
            else:
                return None  # Node is gone

    def _exited(self, block=True):
        try:
            pid, status = os.waitpid(self.pid, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return 0
        return status if pid else None

    def _kill(self):
        try:
            os.killpg(self.pid, _signal.SIGKILL)
        except OSError:
            pass
        self._exited()

    def _gone(self):
        """Node cannot report: it exited (the cell's ``process.exit``), was killed, or lost
        its pipe."""
        status = self._exited(block=False)
        if status is None and self.pidfd is not None:
            poller = _poll()
            poller.register(self.pidfd, _POLLIN)
            try:
                poller.poll(_BASH_EXIT_WAIT_MS)
            except InterruptedError:
                pass
            status = self._exited(block=False)
        if status is None:
            self._kill()
            _flush_quietly()
            _exit(70)
        if os.WIFSIGNALED(status):
            _exit(128 + os.WTERMSIG(status))
        return "exit", os.WEXITSTATUS(status), None, None, None


def _end_line(marker, cell, status, tb, count, exit_code, dropped, ename=None, evalue=None):
    keep = 3000
    while True:
        short = tb
        if tb and len(tb) > keep:
            short = "...(cut; the whole traceback is in the output)\n" + tb[-keep:]
        value = evalue
        if value and len(value) > keep // 3:
            value = value[: keep // 3] + "...(cut)"
        done = {"op": "done", "cell": cell, "status": status, "traceback": short,
                "ename": ename, "evalue": value,
                "execution_count": count, "exit_code": exit_code, "displays_dropped": dropped}
        line = marker + _dumps(done).encode("ascii") + b"\n"
        if len(line) <= 4000 or keep < 100:
            return line
        keep //= 2


def _exception_parts(etype, value):
    """The exception's class name and its text (``str(value)``), for the typed error; a cell
    whose exception cannot be shown as text gets a placeholder."""
    try:
        name = etype.__name__
        if not isinstance(name, str):
            name = "BaseException"
        name = name[:200]
    except BaseException:
        name = "BaseException"
    try:
        text = str(value)
        if not isinstance(text, str):
            text = ""
    except BaseException:
        text = "<exception str() failed>"
    return name, text


def _format_traceback(etype, value, tb):
    """The cell's traceback as text; a cell that broke ``traceback`` gets a plain line."""
    try:
        import traceback  # only when a cell raises: keeps idle kernels small

        return "".join(traceback.format_exception(etype, value, tb))
    except BaseException:
        try:
            return "%s: %s\n" % (etype.__name__, value)
        except BaseException:
            return "the cell raised; its traceback could not be formatted\n"


def _open_status(path):
    if not path:
        return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    except OSError:
        return None


def _exit_code(code):
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    return 1


def _flush_quietly():
    """Flushes sys.stdout and sys.stderr, then the stderr relay: what the cell wrote so far
    is on the output pipe before the runner writes there itself (a display, the end)."""
    for name in ("stdout", "stderr"):
        try:
            getattr(sys, name).flush()
        except BaseException:
            pass
    relay = _STDERR_RELAY[0]
    if relay is not None:
        relay.flush()


def _text_stream(fd):
    # Line-buffered text streams keep print and os.write output in write order.
    return _TextIOWrapper(_fdopen(fd, "wb", closefd=False), encoding="utf-8",
                            errors="backslashreplace", line_buffering=True)


def _restore_std_streams():
    """Gives a cell working sys.stdout/sys.stderr if an earlier cell closed them."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        try:
            stream = getattr(sys, name, None)
            if stream is None or getattr(stream, "closed", True):
                setattr(sys, name, _text_stream(fd))
        except BaseException:
            setattr(sys, name, _text_stream(fd))


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            n = _write(fd, view)
        except OSError:
            return
        view = view[n:]


def _tag_threads(runner):
    """Threads carry the cell that started them, for tool-call authority.

    Every thread starts through ``_thread`` (``threading`` binds its starters when it is first
    imported, after this runs), so wrapping the starters tags threads of ``threading``,
    ``concurrent.futures`` and raw ``_thread`` alike without importing ``threading`` here."""

    def tagged(start):
        def start_tagged(function, *args, **kwargs):
            cell = runner.cell_of_current_thread()

            def run(*a, **kw):
                ident = _get_ident()
                runner.thread_cells[ident] = cell
                try:
                    return function(*a, **kw)
                finally:
                    runner.thread_cells.pop(ident, None)

            return start(run, *args, **kwargs)

        return start_tagged

    # start_new_thread (and its old alias start_new) up to 3.12; start_joinable_thread 3.13+.
    for name in ("start_new_thread", "start_new", "start_joinable_thread"):
        start = getattr(_thread, name, None)
        if start is not None:
            setattr(_thread, name, tagged(start))
    threading = _modules.get("threading")  # imported by a sitecustomize, say
    if threading is not None:
        for name in ("_start_new_thread", "_start_joinable_thread"):
            if hasattr(threading, name):
                setattr(threading, name, getattr(_thread, name.lstrip("_")))


def _tools_module(runner):
    mod = type(sys)("kernel_tools")
    mod.__doc__ = "Call host tools from a cell: kernel_tools.NAME(**args) or kernel_tools.call(NAME, **args)."
    mod.ToolError = ToolError

    def call(name, **args):
        """Call host tool NAME with keyword arguments; returns its parsed JSON result."""
        return runner.tool_call(name, args)

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)

        def tool(**args):
            return runner.tool_call(name, args)

        tool.__name__ = name
        tool.__qualname__ = name
        return tool

    mod.call = call
    mod.__getattr__ = __getattr__
    return mod


def _private_environment():
    """Takes every ``KERNELBOX_`` variable out of the environment (and so out of every
    subprocess's); returns what the runner needs of them: the status file's path, the
    text of ``runner/rich.py``, the modules to preload and the kernel's language."""
    status_path = os.environ.pop("KERNELBOX_STATUS", None)
    rich_source = os.environ.pop("KERNELBOX_RICH", None)
    preload = [m for m in os.environ.pop("KERNELBOX_PRELOAD", "").split(",") if m]
    language = os.environ.pop("KERNELBOX_LANGUAGE", "python")
    node_source = os.environ.pop("KERNELBOX_NODE", None)
    for key in [k for k in os.environ if k.startswith("KERNELBOX_")]:
        del os.environ[key]
    return status_path, rich_source, preload, language, node_source


def _user_site():
    """With ``PIP_USER`` set (a kernel with a network policy, docs/reliability.md "Network
    egress"), ``pip install`` writes to the user site directory, which the interpreter put on
    ``sys.path`` only if it existed at start: it is created now and put there (before the
    system's packages, where ``site`` would have), so a package installed mid-session imports
    at once. Without ``PIP_USER`` this does nothing (``site`` is loaded anyway)."""
    if not os.environ.get("PIP_USER"):
        return
    import site

    try:
        path = site.getusersitepackages()
        os.makedirs(path, exist_ok=True)
    except (OSError, AttributeError):
        return
    if path in sys.path:
        return
    at = next((i for i, p in enumerate(sys.path) if p.endswith("-packages")), len(sys.path))
    sys.path.insert(at, path)


def main():
    status_path, rich_source, preload, language, node_source = _private_environment()
    _user_site()
    channel = _Channel()
    # Forked before any thread starts; the relay's process holds nothing of the cells.
    relay = _StderrRelay(channel)
    relay.start()
    _STDERR_RELAY[0] = relay
    sys.stdin = open(os.devnull, "r")
    sys.stdout = _text_stream(1)
    sys.stderr = _text_stream(2)
    runner = _Runner(channel, status_path, rich_source, preload)
    _RUNNER[0] = runner
    os.register_at_fork(after_in_child=channel.close_in_child)
    sys.modules["kernel_tools"] = _tools_module(runner)
    # matplotlib, when a cell imports it, gets the inline backend (runner/rich.py).
    sys.meta_path.insert(0, _InlineFinder(runner.display))
    # The watcher starts before the starters are wrapped: it belongs to no cell.
    _thread.start_new_thread(_watch_hangup, (channel.inp,))
    _tag_threads(runner)
    _INTERRUPTS.install()
    if language == "bash":
        runner.shell = _Bash()
        try:
            _signal.signal(_signal.SIGINT, runner.shell.interrupt)
        except (ValueError, OSError):
            pass
    elif language in ("javascript", "typescript"):
        try:
            runner.shell = _Node(language, node_source, runner.display)
        except OSError:
            _exit(71)  # no Node in this image: the kernel fails to start
        try:
            _signal.signal(_signal.SIGINT, runner.shell.interrupt)
        except (ValueError, OSError):
            pass
    elif language != "python":
        _exit(71)  # a language this runner does not host: the kernel fails to start
    try:
        runner.run_forever()
    finally:
        # The runner cannot go on (a cell broke something it needs): end the kernel now, so
        # the host reports the loss, rather than leave the session waiting on a silent kernel
        # (or the interpreter waiting on a cell's non-daemon threads).
        _exit(70)


if __name__ == "__main__":
    main()
