"""The blocking client: `Client`, `Session`, `Commands`, `Processes`, `Files` (same surface as
`_async.py`)."""

from __future__ import annotations

import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    TypeVar,
    Union,
)

import httpx

from . import _wire
from ._errors import Timeout
from ._types import (
    CommandResult,
    Execution,
    ForkOutcome,
    ForkResult,
    KernelSummary,
    Listing,
    NetworkPolicy,
    ProcessEvent,
    ProcessInfo,
    ProcessOutput,
    Result,
    SessionSettings,
    SettingsApplied,
    SnapshotInfo,
    UsageReport,
    WorkspaceSummary,
    WrittenFile,
)

T = TypeVar("T")


class Client:
    """A kernelbox server. `url` and `token` default to `KERNELBOX_URL` and `KERNELBOX_TOKEN`.

    `timeout` (seconds) bounds connecting, sending and each read of a control call; a run
    waits for its cell's timeout (or the server's longest, 3600 s) plus this. Use it as a
    context manager, or call `close()`, to release its connections.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: Optional[float] = _wire.DEFAULT_TIMEOUT,
    ) -> None:
        self.url, self._token = _wire.resolve(url, token)
        self.timeout = timeout
        self._http = httpx.Client(headers=_wire.headers(self._token))

    def session(self, name: str, child: Optional[str] = None) -> "Session":
        """A conversation's kernel (started by its first run); `child` a delegated sub-agent's."""
        return Session(self, name, child)

    def kernels(self, labels: Optional[Dict[str, str]] = None) -> List[KernelSummary]:
        """The live kernels of this token's tenant; with `labels`, those of sessions whose
        settings carry every one of them."""
        return _wire.kernels(self._send(_wire.kernels_call(labels)) or b"")

    def usage(
        self,
        from_: Optional[str] = None,
        to: Optional[str] = None,
        group_by: str = "session",
        tenant: Optional[str] = None,
    ) -> UsageReport:
        """The usage ledger of this token's tenant (every tenant's for a usage admin) from
        `from_` to `to` (RFC 3339 or Unix seconds; default the last day), rows per session
        and hour, (`group_by="day"`) per day or (`group_by="hour"`) per tenant and hour
        (docs/usage.md)."""
        call = _wire.usage_call(from_, to, group_by, tenant)
        return _wire.usage(self._send(call) or b"")

    def workspaces(self) -> List[WorkspaceSummary]:
        """This token's tenant's workspaces: each session's `/work` kept past its kernel
        (docs/workspaces.md). `NotFound` (`workspace_not_found`) when the tenant has none."""
        return _wire.workspaces(self._send(_wire.Call("GET", "/v1/workspaces")) or b"")

    def delete_workspace(self, name: str) -> str:
        """Deletes the tenant's workspace `name` (a session's name, or a child's
        `session::child::id`) and its files; returns the name. `Conflict` while a kernel has
        it mounted (close the session first), `NotFound` when there is none by that name."""
        call = _wire.Call("DELETE", _wire.workspace_path(name))
        return _wire.workspace_deleted(self._send(call) or b"")

    def snapshots(self) -> List[SnapshotInfo]:
        """This token's tenant's snapshots, oldest first (docs/snapshots.md)."""
        return _wire.snapshots(self._send(_wire.Call("GET", "/v1/snapshots")) or b"")

    def snapshot(self, snapshot_id: str) -> SnapshotInfo:
        """One of the tenant's snapshots; `NotFound` (`snapshot_not_found`) for none, or
        another tenant's."""
        call = _wire.Call("GET", _wire.snapshot_path(snapshot_id))
        return _wire.snapshot(self._send(call) or b"")

    def delete_snapshot(self, snapshot_id: str) -> str:
        """Deletes one of the tenant's snapshots and its files; returns its id."""
        call = _wire.Call("DELETE", _wire.snapshot_path(snapshot_id))
        return _wire.workspace_deleted(self._send(call) or b"")

    def restore(self, snapshot_id: str, session: str) -> ForkOutcome:
        """Starts `session` (which has no kernel) from the snapshot: a new kernel with the
        snapshot's variables, imports and files. `Conflict` (`session_exists`) when the
        session has a kernel."""
        call = _wire.restore_call(session, snapshot_id)
        return _wire.fork_outcome(self._send(call) or b"")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _send(self, call: _wire.Call, content: Any = None) -> Optional[bytes]:
        url = self.url + call.path
        attempt = 0
        while True:
            try:
                r = self._http.request(
                    call.method,
                    url,
                    json=call.json,
                    params=call.params,
                    headers=_wire.request_headers(call),
                    content=content,
                    timeout=call.timeout(self.timeout),
                )
                break
            except httpx.HTTPError as e:
                if not _wire.may_resend(e, call.method, content, attempt):
                    raise _wire.transport_error(e, call.method, url) from e
                attempt += 1
        if r.status_code == 404 and call.missing_ok:
            return None
        if not 200 <= r.status_code < 300:
            raise _wire.error_from_response(r.status_code, r.headers, r.content)
        return r.content

    def _download(self, call: _wire.Call, dest: Any) -> int:
        url = self.url + call.path
        sink = _wire.Sink(dest)
        try:
            with self._http.stream(
                call.method,
                url,
                params=call.params,
                headers=_wire.request_headers(call),
                timeout=call.timeout(self.timeout),
            ) as r:
                if r.status_code != 200:
                    raise _wire.error_from_response(r.status_code, r.headers, r.read())
                for chunk in r.iter_bytes():
                    sink.write(chunk)
        except httpx.HTTPError as e:
            sink.abort()
            raise _wire.transport_error(e, call.method, url) from e
        except BaseException:
            sink.abort()
            raise
        return sink.finish()

    def _stream(
        self,
        call: _wire.Call,
        reader: "_wire.Reader[T]",
        callbacks: Dict[str, Optional[Callable[[Any], Any]]],
    ) -> T:
        url = self.url + call.path
        attempt = 0
        while True:
            try:
                with self._http.stream(
                    call.method,
                    url,
                    json=call.json,
                    headers=_wire.request_headers(call),
                    timeout=call.timeout(self.timeout),
                ) as r:
                    if r.status_code != 200:
                        raise _wire.error_from_response(r.status_code, r.headers, r.read())
                    for line in r.iter_lines():
                        action = reader.feed(line)
                        if action is None:
                            continue
                        kind, value = action
                        callback = callbacks.get(kind)
                        if callback is not None:
                            callback(value)
                break
            except httpx.HTTPError as e:
                if not _wire.may_resend(e, call.method, None, attempt):
                    raise _wire.transport_error(e, call.method, url) from e
                attempt += 1
        return reader.finish()

    def _events(
        self, call: _wire.Call, deadline: Optional[float]
    ) -> Iterator[ProcessEvent]:
        """A process's output events until its `exit` or `deadline` (monotonic; None: its
        end). Closing the iterator early closes the stream (the process goes on)."""
        url = self.url + call.path
        timeout = httpx.Timeout(self.timeout, read=_wire.stream_read_timeout(deadline))
        try:
            with self._http.stream(
                call.method, url, headers=_wire.request_headers(call), timeout=timeout
            ) as r:
                if r.status_code != 200:
                    raise _wire.error_from_response(r.status_code, r.headers, r.read())
                for line in r.iter_lines():
                    event = _wire.process_event(line)
                    if event is not None:
                        yield event
                        if event.kind == "exit":
                            return
                    if deadline is not None and time.monotonic() >= deadline:
                        return
        except httpx.ReadTimeout:
            if deadline is None:
                raise
        except httpx.HTTPError as e:
            raise _wire.transport_error(e, call.method, url) from e


class Session:
    """One conversation (or one delegated child of it) on a server."""

    def __init__(self, client: Client, name: str, child: Optional[str] = None) -> None:
        self.client = client
        self.name = name
        self.child = child
        self.files = Files(self)
        self.commands = Commands(self)
        self.processes = Processes(self)

    def run(
        self,
        code: str,
        timeout: Optional[float] = None,
        reset: bool = False,
        task_id: Optional[str] = None,
        on_output: Optional[Callable[[str], Any]] = None,
        on_display: Optional[Callable[[Result], Any]] = None,
        tools: Optional[Iterable[str]] = None,
        network: Optional[Union[NetworkPolicy, Dict[str, List[str]]]] = None,
        language: Optional[str] = None,
        context: Optional[str] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
    ) -> Execution:
        """Runs one cell. With `on_output` (text as the cell writes it: stdout, stderr and a
        traceback in order), `on_stdout` / `on_stderr` (one stream's text) or `on_display` (each
        rich result as it is displayed) the answer is streamed; `result.stdout`,
        `result.stderr` and `result.exception` hold the streams apart and the typed error. `network` (a
        `NetworkPolicy` or `{"allow": [...], "deny": [...]}`) sets the session's egress policy
        first, as `set_network` does (it stays the session's). A cell that fails is a result
        (`status`), not an exception; errors are calls the server refused. `language`
        (`python` by default, `bash`, `javascript` or `typescript`) picks the session's
        kernel of that language: each keeps its own state (docs/contract.md, "Languages"); `context` names another kernel of
        that language in the session (E2B-style code contexts)."""
        callbacks = _wire.output_callbacks(on_output, on_stdout, on_stderr, on_display)
        stream = any(callback is not None for callback in callbacks.values())
        call = _wire.execute_call(
            self.name,
            self.child,
            code,
            timeout,
            reset,
            task_id,
            tools,
            stream,
            self.client.timeout,
            network,
            language,
            context,
        )
        if stream:
            return self.client._stream(call, _wire.StreamReader(), callbacks)
        return _wire.execution(self.client._send(call) or b"")

    def set_network(
        self, allow: Iterable[str] = (), deny: Iterable[str] = ()
    ) -> int:
        """Sets the session's network egress policy (docs/reliability.md, "Network egress"):
        entries are presets (`pypi`), hosts (`example.com`, `*.example.com`) or address ranges,
        each optionally with `:PORT`; deny wins. It is intersected with the tenant's policy and
        applied at once to the running kernel; returns how many of its connections it closed.
        A bad entry raises `BadRequest` (`invalid_network`); any entry (allowed or denied), for
        a tenant with no network, `BadRequest` (`network_not_allowed`): nothing is kept."""
        return _wire.closed(self.client._send(_wire.network_call(self.name, allow, deny)))

    def set_settings(
        self,
        *,
        env: Optional[Dict[str, str]] = None,
        memory: Optional[Union[int, str]] = None,
        cpus: Optional[float] = None,
        idle_timeout: Optional[float] = None,
        labels: Optional[Dict[str, str]] = None,
    ) -> SettingsApplied:
        """Replaces the session's settings (docs/http-api.md, "Session settings"): its
        kernels' environment variables, memory (`"512m"` or bytes) and CPU limits, idle
        timeout (seconds) and labels, within the tenant's maximums (`BadRequest`
        `settings_not_allowed` beyond them). Environment, memory and CPU apply from the
        session's next kernel (`restart_required` says a live one runs with others); the idle
        timeout and labels at once."""
        settings = SessionSettings(
            env=dict(env or {}),
            memory=memory,
            cpus=cpus,
            idle_timeout=idle_timeout,
            labels=dict(labels or {}),
        )
        return _wire.settings_applied(self.client._send(_wire.settings_call(self.name, settings)))

    def settings(self) -> SessionSettings:
        """The session's settings (all defaults when it set none)."""
        return _wire.session_settings(self.client._send(_wire.get_settings_call(self.name)))

    def interrupt(self) -> int:
        """Stops the session's running and queued cells: they end `interrupted`, a running
        cell by a `KeyboardInterrupt` (the kernel and its state are kept unless the cell
        ignores it past the server's grace); returns how many, 0 when none was running."""
        return _wire.count(self.client._send(_wire.interrupt_call(self.name)), "interrupted")

    def snapshot(self, name: Optional[str] = None) -> SnapshotInfo:
        """Snapshots the session's kernel, idle or hibernated (docs/snapshots.md): under
        runsc its memory and files; the kernel goes on. `Conflict` (`session_busy`) while a
        cell runs, or (`snapshot_limit`) past the tenant's bounds."""
        call = _wire.snapshot_call(self.name, name)
        return _wire.snapshot(self.client._send(call) or b"")

    def fork(
        self, n: Optional[int] = None, sessions: Optional[List[str]] = None
    ) -> ForkResult:
        """Snapshots the session's kernel once and starts `n` new sessions (or those named in
        `sessions`) from it, in parallel; the source goes on. Each fork succeeds or fails on
        its own (`ForkOutcome.ok`)."""
        if (n is None) == (sessions is None):
            raise ValueError("fork: give exactly one of n and sessions")
        call = _wire.fork_call(self.name, n, sessions)
        return _wire.fork_result(self.client._send(call) or b"")

    def contexts(self) -> List[KernelSummary]:
        """The session's contexts that have a kernel, each its kernel (`context` names it,
        `language` says what it runs); they share the session's `/work`."""
        return _wire.contexts(self.client._send(_wire.contexts_call(self.name, self.child)) or b"")

    def end_context(self, context: str) -> int:
        """Disposes of one context's kernel (e.g. `"bash"`, or a named one); the session's
        other contexts and its files stay. Returns how many kernels went, 0 when none."""
        call = _wire.end_context_call(self.name, self.child, context)
        return _wire.count(self.client._send(call), "released")

    def close(self) -> int:
        """Disposes of the session's kernels (its children's too), or of this child's; returns
        how many, 0 when there were none (so closing twice is fine)."""
        body = self.client._send(_wire.close_call(self.name, self.child))
        return _wire.count(body, _wire.close_key(self.child))

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Commands:
    """Shell commands in the session's kernel container (`docs/contract.md`, "Commands"):
    beside its cells, as the kernel's user, in its working directory (`/work`) and files."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def run(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: Optional[str] = None,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
    ) -> CommandResult:
        """Runs `command` (a list of arguments run as given, or a string run by `/bin/sh -c`)
        and returns its exit code, stdout and stderr. Starts the kernel if needed. Past
        `timeout` seconds (default the server's cell timeout) the command's whole process
        group is killed (`timed_out`); the kernel and its state stay. With `on_stdout` or
        `on_stderr` the answer is streamed: each gets text as the command writes it. A command
        that fails is a result (`exit_code`), not an exception."""
        s = self._session
        _wire.check_command_session(s.child)
        stream = on_stdout is not None or on_stderr is not None
        call = _wire.command_call(
            s.name, command, cwd, env, stdin, timeout, stream, s.client.timeout
        )
        if stream:
            callbacks = {"stdout": on_stdout, "stderr": on_stderr}
            return s.client._stream(call, _wire.CommandStreamReader(), callbacks)
        return _wire.command_result(s.client._send(call) or b"")


class Processes:
    """Background processes in the session's kernel container (docs/processes.md): started
    beside its cells, as the kernel's user, with no deadline of their own; each has an id to
    read its output, write its stdin, signal it, kill it and learn its exit code. A process
    dies with its kernel (a timeout, `reset`, `close()`); a client that goes away does not
    stop it."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _call(self, method: str, process_id: Optional[int] = None, *rest: str) -> _wire.Call:
        s = self._session
        _wire.check_command_session(s.child, "background processes")
        return _wire.Call(method, _wire.process_path(s.name, process_id, *rest))

    def start(
        self,
        command: Union[str, Sequence[str]],
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        stdin: bool = False,
    ) -> ProcessInfo:
        """Starts `command` (a list of arguments run as given, or a string run by
        `/bin/sh -c`) and returns at once; starts the kernel if needed. With `stdin=True` its
        stdin stays open for `write_stdin` until `close_stdin` (else it reads end of file).
        `RateLimited` (`too_many_processes`) past 16 running per session."""
        s = self._session
        _wire.check_command_session(s.child, "background processes")
        call = _wire.process_start_call(s.name, command, cwd, env, stdin)
        return _wire.process_info(s.client._send(call) or b"")

    def list(self) -> List[ProcessInfo]:
        """The session's processes, running and recently ended, oldest first."""
        return _wire.process_list(self._session.client._send(self._call("GET")) or b"")

    def get(self, process_id: int) -> ProcessInfo:
        """One process; `NotFound` (`no_process`) for an id the session does not have."""
        return _wire.process_info(self._session.client._send(self._call("GET", process_id)) or b"")

    def stream(self, process_id: int, timeout: Optional[float] = None) -> Iterator[ProcessEvent]:
        """The process's output as events: what the server keeps of it (its newest 256 KiB)
        first, then live, then `exit`. With `timeout` (seconds) the iteration stops then,
        whether or not the process ended; closing it early leaves the process running."""
        call = self._call("GET", process_id, "output")
        return self._session.client._events(call, _wire.stream_deadline(timeout))

    def output(
        self,
        process_id: int,
        timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], Any]] = None,
        on_stderr: Optional[Callable[[str], Any]] = None,
    ) -> ProcessOutput:
        """The process's output, what is kept first: read until it ends, or for `timeout`
        seconds at most (then `exit_code` is None and it goes on). `on_stdout` / `on_stderr`
        get the text as it comes."""
        reader = _wire.ProcessOutputReader()
        callbacks = {"stdout": on_stdout, "stderr": on_stderr}
        for event in self.stream(process_id, timeout):
            reader.feed(event)
            callback = callbacks.get(event.kind)
            if callback is not None:
                callback(event.text)
        return reader.finish()

    def wait(self, process_id: int, timeout: Optional[float] = None) -> ProcessInfo:
        """Waits for the process to end (at most `timeout` seconds: then `Timeout`) and
        returns it, its `exit_code` set."""
        for event in self.stream(process_id, timeout):
            if event.kind == "exit":
                return self.get(process_id)
        raise Timeout("timeout", f"process {process_id} is still running after {timeout}s")

    def write_stdin(self, process_id: int, data: Union[str, bytes]) -> int:
        """Writes `data` (text as UTF-8, at most 1 MiB) on the process's stdin; returns how
        many bytes. `Conflict` (`stdin_closed`) when its stdin is closed."""
        call = self._call("POST", process_id, "stdin")
        call.headers = {"Content-Type": "application/octet-stream"}
        sent = self._session.client._send(call, content=_wire.stdin_bytes(data))
        return _wire.stdin_written(sent or b"")

    def close_stdin(self, process_id: int) -> ProcessInfo:
        """Closes the process's stdin: it reads end of file."""
        return _wire.process_info(
            self._session.client._send(self._call("DELETE", process_id, "stdin")) or b""
        )

    def signal(self, process_id: int, signal: str = "SIGTERM") -> ProcessInfo:
        """Sends `signal` (`SIGTERM`, `SIGINT`, `SIGKILL`, ...; `_wire.SIGNALS`) to the
        process's command; nothing happens once it ended."""
        s = self._session
        _wire.check_command_session(s.child, "background processes")
        call = _wire.process_signal_call(s.name, process_id, signal)
        return _wire.process_info(s.client._send(call) or b"")

    def kill(self, process_id: int) -> ProcessInfo:
        """Kills the process and everything it started, and waits (10 s at most) for it to
        end; nothing happens once it ended."""
        return _wire.process_info(self._session.client._send(self._call("DELETE", process_id)) or b"")


class Files:
    """The files of a session's kernel, relative to its working directory (`/work`)."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def _call(self, method: str, path: str, **kw: Any) -> _wire.Call:
        s = self._session
        return _wire.Call(
            method, _wire.file_path(s.name, path), params=_wire.child_params(s.child), **kw
        )

    def write(self, path: str, data: Any, tar: bool = False) -> WrittenFile:
        """Stores `data` at `path`, creating parents; starts the kernel if needed. `data`:
        bytes, str, a local path, a binary file object or an iterable of bytes (files
        and iterables are streamed, never read whole). With `tar=True`, `data` is a tar archive
        extracted into the directory `path` (many files in one request)."""
        up, opened = _wire.upload(data)
        try:
            call = self._call("PUT", path, headers=_wire.upload_headers(up, tar))
            return _wire.written(self._session.client._send(call, content=up.content) or b"")
        finally:
            up.close(opened)

    def read(self, path: str, tar: bool = False) -> bytes:
        """The bytes of the file at `path`; with `tar=True`, the directory at `path` as a tar
        archive."""
        call = self._call("GET", path, headers={"Accept": _wire.TAR} if tar else {})
        return self._session.client._send(call) or b""

    def download(self, path: str, dest: Any, tar: bool = False) -> int:
        """Streams the file at `path` (with `tar=True`, the directory at `path` as a tar
        archive) into `dest`, a local path or a binary file object, never holding it whole;
        returns the bytes written. A local path is written whole or not at all."""
        call = self._call("GET", path, headers={"Accept": _wire.TAR} if tar else {})
        return self._session.client._download(call, dest)

    def list(self, path: str = ".") -> Listing:
        """The entries of the directory at `path` (a list of `FileEntry`)."""
        call = self._call("GET", path, headers={"Accept": "application/json"})
        return _wire.listing(self._session.client._send(call) or b"")

    def remove(self, path: str) -> str:
        """Deletes the file or directory tree at `path` (a symlink itself, never its target);
        returns the path removed, inside the kernel (`/work/...`)."""
        return _wire.deleted(self._session.client._send(self._call("DELETE", path)) or b"")

    def save_workspace(self, dest: Any) -> int:
        """Streams the session's workspace (docs/workspaces.md) as a tar of its `/work` into
        `dest` (a local path or a binary file object) without starting its kernel: through
        its live kernel, or a transfer kernel made for this download. Returns the bytes
        written; `NotFound` (`workspace_not_found`) when the tenant has no such workspace."""
        s = self._session
        call = _wire.Call(
            "GET", _wire.session_path(s.name, "workspace"), params=_wire.child_params(s.child)
        )
        return s.client._download(call, dest)

    def restore_workspace(self, data: Any) -> WrittenFile:
        """Extracts the tar `data` (bytes, a local path, a binary file object or an iterable
        of bytes) into the session's workspace, made when it has none, without starting its
        kernel."""
        s = self._session
        up, opened = _wire.upload(data)
        try:
            call = _wire.Call(
                "PUT",
                _wire.session_path(s.name, "workspace"),
                params=_wire.child_params(s.child),
                headers=_wire.upload_headers(up, True),
            )
            return _wire.written(s.client._send(call, content=up.content) or b"")
        finally:
            up.close(opened)
