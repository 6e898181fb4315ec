"""The HTTP API without I/O: what each call sends and how each answer is read.

`Client` and `AsyncClient` only move bytes; every rule about URLs, bodies, timeouts, status
codes and stream events lives here, once, so the two cannot disagree.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Protocol,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)
from urllib.parse import quote

import httpx

try:
    # Optional: with OpenTelemetry installed, every request carries the current trace context
    # (docs/usage.md, "Traces").
    from opentelemetry.propagate import inject as _inject_trace_context
except ImportError:  # pragma: no cover - OpenTelemetry is not a dependency
    _inject_trace_context = None  # type: ignore[assignment]

from ._errors import ConnectionFailed, KernelboxError, ProtocolError, Timeout, error_for
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

#: Where the client goes without `url` or `KERNELBOX_URL` (`kernelbox serve`'s default).
DEFAULT_URL = "http://127.0.0.1:8080"
#: Seconds the client waits for a control call (and for transport on top of a cell's timeout).
DEFAULT_TIMEOUT = 30.0
#: The server's default `--max-timeout`: how long a cell with no `timeout` may run at most
#: (docs/http-api.md). A run's read deadline is its cell timeout (or this) + the client's
#: timeout, so a healthy server always answers first.
SERVER_MAX_CELL_SECONDS = 3600.0
#: The longest cell timeout the client waits for (a week; bigger values are refused by any
#: server, and the operating system bounds socket timeouts).
MAX_CELL_WAIT = 7 * 24 * 3600.0
#: Stream events the client understands (the drift test checks the server sends no other).
STREAM_EVENTS = ("output", "output_truncated", "display", "result", "error")
#: The streams an `output` event names (`OutputStream` in the server's spec).
OUTPUT_STREAMS = ("stdout", "stderr", "traceback")
#: A streamed command's events (`CommandEvent` in the server's spec).
COMMAND_STREAM_EVENTS = ("stdout", "stderr", "output_truncated", "result", "error")
#: A background process's output events (`ProcessEvent` in the server's spec).
PROCESS_STREAM_EVENTS = ("stdout", "stderr", "output_truncated", "exit")
#: The signals a background process may be sent (docs/processes.md); the server judges them.
SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGTERM", "SIGCONT",
           "SIGSTOP")  # fmt: skip
NDJSON = "application/x-ndjson"
TAR = "application/x-tar"


def resolve(url: Optional[str], token: Optional[str]) -> Tuple[str, Optional[str]]:
    """The base URL and token: the arguments, else `KERNELBOX_URL` / `KERNELBOX_TOKEN`."""
    url = url or os.environ.get("KERNELBOX_URL") or DEFAULT_URL
    token = token if token is not None else os.environ.get("KERNELBOX_TOKEN")
    return url.rstrip("/"), token


def headers(token: Optional[str]) -> Dict[str, str]:
    h = {"User-Agent": "kernelbox-client-python/0.1"}
    if token:
        h["Authorization"] = f"Bearer {token}"
    return h


def _segment(value: str) -> str:
    # Percent-encode everything, dots of `.`/`..` included, so the HTTP stack never resolves
    # a path the server is the one to judge (it refuses escapes with 400).
    if value in (".", ".."):
        return value.replace(".", "%2E")
    return quote(value, safe="")


def session_path(session: str, *rest: str) -> str:
    return "/".join(["/v1/sessions", _segment(session), *rest])


def file_path(session: str, path: str) -> str:
    """`.../files/PATH`; `""` or `"."` (the default of `files.list`) is the working directory
    itself, `.../files`. Every other path goes as given: the server judges it (docs/files.md)."""
    path = os.fspath(path)
    if path in ("", "."):
        return session_path(session, "files")
    return session_path(session, "files", "/".join(_segment(p) for p in path.split("/")))


@dataclass
class Call:
    """One HTTP request, described."""

    method: str
    path: str
    json: Optional[Dict[str, Any]] = None
    params: Mapping[str, Union[str, List[str]]] = field(default_factory=dict)
    headers: Dict[str, str] = field(default_factory=dict)
    #: Seconds to wait for each read; None: the client's timeout.
    read_timeout: Optional[float] = None
    #: A 404 is an answer (0 / None), not an error: interrupting or clearing nothing.
    missing_ok: bool = False

    def timeout(self, client_timeout: Optional[float]) -> httpx.Timeout:
        read = self.read_timeout if self.read_timeout is not None else client_timeout
        return httpx.Timeout(client_timeout, read=read)


def request_headers(call: Call) -> Dict[str, str]:
    """The headers to send `call` with: its own, plus the current OpenTelemetry context's W3C
    `traceparent` (and `tracestate`, baggage) when OpenTelemetry is installed and a span is
    current, so kernelbox's spans join the caller's trace (docs/usage.md, "Traces")."""
    if _inject_trace_context is None:
        return call.headers
    carrier = dict(call.headers)
    _inject_trace_context(carrier)
    return carrier


def execute_call(
    session: str,
    child: Optional[str],
    code: str,
    timeout: Optional[float],
    reset: bool,
    task_id: Optional[str],
    tools: Optional[Iterable[str]],
    stream: bool,
    client_timeout: Optional[float],
    network: Optional[Union[NetworkPolicy, Dict[str, List[str]]]] = None,
    language: Optional[str] = None,
    context: Optional[str] = None,
) -> Call:
    body: Dict[str, Any] = {"code": code}
    if language is not None:
        body["language"] = language
    if context is not None:
        body["context"] = context
    if network is not None:
        body["network"] = (
            network.to_json() if isinstance(network, NetworkPolicy) else network_policy(
                network.get("allow", []), network.get("deny", [])
            )
        )
    if reset:
        body["reset"] = True
    if timeout is not None:
        body["timeout"] = timeout
    if task_id is not None:
        body["task_id"] = task_id
    if child is not None:
        body["child"] = child
    if tools is not None:
        body["tools"] = list(tools)
    read = run_deadline(timeout, client_timeout)
    return Call(
        "POST",
        session_path(session, "execute"),
        json=body,
        headers={"Accept": NDJSON} if stream else {"Accept": "application/json"},
        read_timeout=read,
    )


def network_policy(allow: Iterable[str], deny: Iterable[str]) -> Dict[str, List[str]]:
    """The server's `NetworkPolicy`: `{"allow": [...], "deny": [...]}` (docs/reliability.md,
    "Network egress"); the server judges every entry."""
    if isinstance(allow, str) or isinstance(deny, str):
        raise TypeError("allow and deny are lists of entries, not one string")
    return {"allow": list(allow), "deny": list(deny)}


def network_call(session: str, allow: Iterable[str], deny: Iterable[str]) -> Call:
    return Call("PUT", session_path(session, "network"), json=network_policy(allow, deny))


def settings_call(session: str, settings: SessionSettings) -> Call:
    """`PUT /v1/sessions/{session}/settings`: replaces the session's settings."""
    return Call("PUT", session_path(session, "settings"), json=settings.to_json())


def get_settings_call(session: str) -> Call:
    return Call("GET", session_path(session, "settings"))


def settings_applied(body: Optional[bytes]) -> SettingsApplied:
    value = json_body(body or b"{}", "settings")
    return SettingsApplied.from_json(value if isinstance(value, dict) else {})


def session_settings(body: Optional[bytes]) -> SessionSettings:
    value = json_body(body or b"{}", "settings")
    return SessionSettings.from_json(value if isinstance(value, dict) else {})


def kernels_call(labels: Optional[Dict[str, str]]) -> Call:
    """`GET /v1/kernels`, those of sessions carrying every label in `labels`."""
    wanted = [f"{k}:{v}" for k, v in (labels or {}).items()]
    return Call("GET", "/v1/kernels", params={"label": wanted} if wanted else {})


def closed(body: Optional[bytes]) -> int:
    """`{"closed": n}` of a network policy set."""
    value = json_body(body or b"{}", "network")
    return int(value.get("closed", 0)) if isinstance(value, dict) else 0


def run_deadline(timeout: Optional[float], client_timeout: Optional[float]) -> float:
    """The read deadline of a call that runs for `timeout` seconds on the server (a cell, a
    command): the server judges the timeout (400 `invalid_timeout`); the client only needs a
    finite deadline that outlasts anything the server would accept."""
    run = (
        min(timeout, MAX_CELL_WAIT) if isinstance(timeout, (int, float)) and timeout > 0 else None
    )
    return (run or SERVER_MAX_CELL_SECONDS) + (client_timeout or DEFAULT_TIMEOUT)


def command_call(
    session: str,
    command: Union[str, Sequence[str]],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: Optional[str],
    timeout: Optional[float],
    stream: bool,
    client_timeout: Optional[float],
) -> Call:
    """`POST .../commands` (docs/http-api.md, "Commands"): `command` a list of arguments run as
    given, or a string run by `/bin/sh -c`."""
    body: Dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin is not None:
        body["stdin"] = stdin
    if timeout is not None:
        body["timeout"] = timeout
    return Call(
        "POST",
        session_path(session, "commands"),
        json=body,
        headers={"Accept": NDJSON} if stream else {"Accept": "application/json"},
        read_timeout=run_deadline(timeout, client_timeout),
    )


def check_command_session(child: Optional[str], what: str = "commands") -> None:
    """Commands and background processes run in a session's own kernel: the API has no
    `child` for them."""
    if child is not None:
        raise ValueError(
            f"{what} run in a session's own kernel; the API has none for a delegated child"
        )


def process_path(session: str, process_id: Optional[int] = None, *rest: str) -> str:
    """`/v1/sessions/S/processes[/ID[/REST]]` (docs/processes.md)."""
    if process_id is None:
        return session_path(session, "processes")
    if isinstance(process_id, bool) or not isinstance(process_id, int):
        raise TypeError(f"a process id is an int (ProcessInfo.id), not {process_id!r}")
    return session_path(session, "processes", str(process_id), *rest)


def process_start_call(
    session: str,
    command: Union[str, Sequence[str]],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    stdin: bool,
) -> Call:
    """`POST .../processes`: `command` a list of arguments run as given, or a string run by
    `/bin/sh -c`; `stdin` keeps its stdin open for `write_stdin` until `close_stdin`."""
    body: Dict[str, Any] = {"command": command if isinstance(command, str) else list(command)}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if stdin:
        body["stdin"] = True
    # The session's kernel may be started first (a fresh container): as long as a run waits.
    return Call("POST", process_path(session), json=body, read_timeout=FORK_READ_TIMEOUT)


def process_signal_call(session: str, process_id: int, signal: str) -> Call:
    return Call("POST", process_path(session, process_id, "signal"), json={"signal": signal})


def stdin_bytes(data: Union[str, bytes]) -> bytes:
    """What `write_stdin` sends: bytes as given, text as UTF-8."""
    if isinstance(data, str):
        return data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    raise TypeError(f"stdin data is str or bytes, not {type(data).__name__}")


def process_info(body: bytes) -> ProcessInfo:
    value = json_body(body, "process")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "process: the answer is not a JSON object")
    return ProcessInfo.from_json(value)


def process_list(body: bytes) -> List[ProcessInfo]:
    value = json_body(body, "processes")
    items = value.get("processes", []) if isinstance(value, dict) else []
    return [ProcessInfo.from_json(p) for p in items if isinstance(p, dict)]


def stdin_written(body: bytes) -> int:
    """`{"written": n}`."""
    value = json_body(body, "stdin")
    return int(value.get("written", 0)) if isinstance(value, dict) else 0


def process_event(line: str) -> Optional[ProcessEvent]:
    """One line of a process's output stream; None for a blank line or an event a newer
    server adds (the drift test keeps those visible)."""
    if not line.strip():
        return None
    event = json_body(line.encode(), "process output")
    if not isinstance(event, dict):
        raise ProtocolError("invalid_response", "process output: an event is not an object")
    kind = event.get("event")
    if kind in ("stdout", "stderr"):
        return ProcessEvent(str(kind), text=str(event.get("data", "")))
    if kind == "output_truncated":
        return ProcessEvent("output_truncated", dropped=int(event.get("bytes", 0)))
    if kind == "exit":
        return ProcessEvent("exit", exit_code=int(event.get("exit_code", -1)))
    return None


def stream_deadline(timeout: Optional[float]) -> Optional[float]:
    """The monotonic time a bounded read of a process's output stops at (None: its end)."""
    if timeout is None:
        return None
    if timeout < 0:
        raise ValueError("timeout is a number of seconds >= 0, or None")
    return time.monotonic() + timeout


def stream_read_timeout(deadline: Optional[float]) -> Optional[float]:
    """How long one read of the stream may wait: until `deadline` (at least a moment, so
    what the server keeps is read), or forever when the stream is read to its end."""
    if deadline is None:
        return None
    return max(deadline - time.monotonic(), 0.05)


class ProcessOutputReader:
    """Collects a process's output events into a `ProcessOutput`."""

    def __init__(self) -> None:
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self.output: List[str] = []
        self.dropped = 0
        self.exit_code: Optional[int] = None

    def feed(self, event: ProcessEvent) -> None:
        if event.kind in ("stdout", "stderr"):
            (self.stdout if event.kind == "stdout" else self.stderr).append(event.text)
            self.output.append(event.text)
        elif event.kind == "output_truncated":
            self.dropped += event.dropped
        elif event.kind == "exit":
            self.exit_code = event.exit_code

    def finish(self) -> ProcessOutput:
        return ProcessOutput(
            stdout="".join(self.stdout),
            stderr="".join(self.stderr),
            output="".join(self.output),
            exit_code=self.exit_code,
            bytes_dropped=self.dropped,
        )


def interrupt_call(session: str) -> Call:
    return Call("POST", session_path(session, "interrupt"), missing_ok=True)


def close_call(session: str, child: Optional[str]) -> Call:
    if child is None:
        return Call("DELETE", session_path(session), missing_ok=True)
    return Call("DELETE", session_path(session, "children", _segment(child)), missing_ok=True)


def contexts_call(session: str, child: Optional[str]) -> Call:
    """`GET /v1/sessions/{session}/contexts` (docs/contract.md, "Languages")."""
    if child is not None:
        raise ValueError("contexts: the API lists a session's own contexts, not a child's")
    return Call("GET", session_path(session, "contexts"))


def end_context_call(session: str, child: Optional[str], context: str) -> Call:
    """`DELETE /v1/sessions/{session}/contexts/{context}`; a context with no kernel is 0."""
    if child is not None:
        raise ValueError("end_context: the API ends a session's own contexts, not a child's")
    return Call("DELETE", session_path(session, "contexts", _segment(context)), missing_ok=True)


def contexts(body: bytes) -> List[KernelSummary]:
    value = json_body(body, "contexts")
    items = value.get("contexts", []) if isinstance(value, dict) else []
    return [KernelSummary.from_json(k) for k in items if isinstance(k, dict)]


def child_params(child: Optional[str]) -> Dict[str, str]:
    return {} if child is None else {"child": child}


def error_from_response(status: int, hdrs: Mapping[str, str], body: bytes) -> KernelboxError:
    """The typed error for a non-2xx answer, with the server's code and message."""
    retry_after: Optional[float] = None
    try:
        retry_after = float(hdrs.get("retry-after", ""))
    except ValueError:
        pass
    code, message = f"http_{status}", body[:500].decode("utf-8", "replace") or "(empty body)"
    try:
        err = json.loads(body)["error"]
        code, message = str(err["code"]), str(err["message"])
    except (ValueError, KeyError, TypeError, RecursionError):
        pass
    return error_for(status, code, message, retry_after)


def json_body(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ProtocolError("invalid_response", f"{what}: the answer is not JSON ({e})") from None


def count(body: Optional[bytes], key: str) -> int:
    """`{"interrupted": n}` / `{"cleared": n}` / `{"released": n}`; 0 for a 404."""
    if body is None:
        return 0
    value = json_body(body, key)
    return int(value.get(key, 0)) if isinstance(value, dict) else 0


def close_key(child: Optional[str]) -> str:
    return "cleared" if child is None else "released"


def execution(body: bytes) -> Execution:
    value = json_body(body, "execute")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "execute: the result is not a JSON object")
    return Execution.from_json(value)


def command_result(body: bytes) -> CommandResult:
    value = json_body(body, "command")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "command: the result is not a JSON object")
    return CommandResult.from_json(value)


def usage_call(
    from_: Optional[str], to: Optional[str], group_by: str, tenant: Optional[str]
) -> Call:
    """`GET /v1/usage` (docs/usage.md): the fields that are set."""
    fields = {"from": from_, "to": to, "group_by": group_by, "tenant": tenant}
    return Call("GET", "/v1/usage", params={k: v for k, v in fields.items() if v is not None})


def usage(body: bytes) -> UsageReport:
    value = json_body(body, "usage")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "usage: the answer is not a JSON object")
    return UsageReport.from_json(value)


def workspaces(body: bytes) -> List[WorkspaceSummary]:
    value = json_body(body, "workspaces")
    items = value.get("workspaces", []) if isinstance(value, dict) else []
    return [WorkspaceSummary.from_json(w) for w in items if isinstance(w, dict)]


def workspace_path(name: str) -> str:
    """`/v1/workspaces/NAME` (a child's workspace's name holds `::`: encoded)."""
    return "/v1/workspaces/" + _segment(name)


def workspace_deleted(body: bytes) -> str:
    """`{"deleted": NAME}`."""
    value = json_body(body, "delete workspace")
    return str(value.get("deleted", "")) if isinstance(value, dict) else ""


def snapshot_call(session: str, name: Optional[str]) -> Call:
    """`POST /v1/sessions/S/snapshots` (docs/snapshots.md)."""
    body: Dict[str, Any] = {} if name is None else {"name": name}
    return Call("POST", session_path(session, "snapshots"), json=body)


def snapshot_path(snapshot_id: str) -> str:
    return "/v1/snapshots/" + _segment(snapshot_id)


def snapshot(body: bytes) -> SnapshotInfo:
    value = json_body(body, "snapshot")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "snapshot: the answer is not a JSON object")
    return SnapshotInfo.from_json(value)


def snapshots(body: bytes) -> List[SnapshotInfo]:
    value = json_body(body, "snapshots")
    items = value.get("snapshots", []) if isinstance(value, dict) else []
    return [SnapshotInfo.from_json(s) for s in items if isinstance(s, dict)]


#: Seconds a restore's or a fork's answer may take: its kernels start first.
FORK_READ_TIMEOUT = 300.0


def restore_call(session: str, snapshot_id: str) -> Call:
    """`POST /v1/sessions/S/restore`."""
    return Call(
        "POST",
        session_path(session, "restore"),
        json={"snapshot": snapshot_id},
        read_timeout=FORK_READ_TIMEOUT,
    )


def fork_call(session: str, count: Optional[int], sessions: Optional[List[str]]) -> Call:
    """`POST /v1/sessions/S/fork`: `count` forks, or the `sessions` named."""
    body: Dict[str, Any] = {"count": count} if sessions is None else {"sessions": sessions}
    return Call("POST", session_path(session, "fork"), json=body, read_timeout=FORK_READ_TIMEOUT)


def fork_outcome(body: bytes) -> ForkOutcome:
    value = json_body(body, "restore")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "restore: the answer is not a JSON object")
    return ForkOutcome.from_json(value)


def fork_result(body: bytes) -> ForkResult:
    value = json_body(body, "fork")
    if not isinstance(value, dict):
        raise ProtocolError("invalid_response", "fork: the answer is not a JSON object")
    return ForkResult.from_json(value)


def kernels(body: bytes) -> List[KernelSummary]:
    value = json_body(body, "kernels")
    items = value.get("kernels", []) if isinstance(value, dict) else []
    return [KernelSummary.from_json(k) for k in items if isinstance(k, dict)]


def listing(body: bytes) -> Listing:
    value = json_body(body, "list files")
    return Listing.from_json(value if isinstance(value, dict) else {})


def deleted(body: bytes) -> str:
    """`{"deleted": "/work/<path>"}`."""
    value = json_body(body, "remove file")
    return str(value.get("deleted", "")) if isinstance(value, dict) else ""


def written(body: bytes) -> WrittenFile:
    value = json_body(body, "write file")
    return WrittenFile.from_json(value if isinstance(value, dict) else {})


T = TypeVar("T", covariant=True)


class Reader(Protocol[T]):
    """Reads one NDJSON stream: `feed` turns a line into a callback's `(kind, value)` (or
    nothing), `finish` gives the result once the stream ended."""

    def feed(self, line: str) -> Optional[Tuple[str, Any]]: ...

    def finish(self) -> T: ...


def stream_error(event: Dict[str, Any]) -> KernelboxError:
    err = event.get("error")
    if not isinstance(err, dict):
        err = {}
    return error_for(None, str(err.get("code", "error")), str(err.get("message", "")))


class CommandStreamReader:
    """Reads a streamed command's NDJSON lines: `stdout` and `stderr` events go to the
    callbacks (returned as actions), the `result` ends it, an `error` event raises."""

    def __init__(self) -> None:
        self.dropped = 0
        self.result: Optional[CommandResult] = None

    def feed(self, line: str) -> Optional[Tuple[str, Any]]:
        """One line; returns `("stdout", str)` or `("stderr", str)` for a callback."""
        if not line.strip():
            return None
        event = json_body(line.encode(), "command stream")
        if not isinstance(event, dict):
            raise ProtocolError("invalid_response", "command stream: an event is not an object")
        kind = event.get("event")
        if kind in ("stdout", "stderr"):
            return (str(kind), str(event.get("data", "")))
        if kind == "output_truncated":
            self.dropped += int(event.get("bytes", 0))
        elif kind == "result":
            result = event.get("result")
            if not isinstance(result, dict):
                raise ProtocolError("invalid_response", "command stream: bad result event")
            self.result = CommandResult.from_json(result, stream_bytes_dropped=self.dropped)
        elif kind == "error":
            raise stream_error(event)
        # Events a newer server adds are skipped (they stay visible in the drift test).
        return None

    def finish(self) -> CommandResult:
        if self.result is None:
            raise ConnectionFailed(
                "stream_ended",
                "the command stream ended before the command's result; the command may still "
                "be running (its timeout ends it)",
            )
        return self.result


def output_callbacks(
    on_output: Optional[Callable[[str], Any]],
    on_stdout: Optional[Callable[[str], Any]],
    on_stderr: Optional[Callable[[str], Any]],
    on_display: Optional[Callable[[Any], Any]],
) -> Dict[str, Optional[Callable[[Any], Any]]]:
    """A streamed execute's callbacks by what `StreamReader.feed` returns: `on_output` gets
    all output (stdout, stderr and a traceback, in order), `on_stdout` / `on_stderr` their
    stream's."""

    def both(
        first: Optional[Callable[[str], Any]], second: Optional[Callable[[str], Any]]
    ) -> Optional[Callable[[str], Any]]:
        if first is None or second is None:
            return first or second

        def call(text: str) -> Any:
            done = first(text)
            if not inspect.isawaitable(done):
                return second(text)

            async def in_order() -> None:
                await done
                rest = second(text)
                if inspect.isawaitable(rest):
                    await rest

            return in_order()

        return call

    return {
        "stdout": both(on_output, on_stdout),
        "stderr": both(on_output, on_stderr),
        "traceback": on_output,
        "display": on_display,
    }


class StreamReader:
    """Reads a streaming execute's NDJSON lines: `output` and `display` events go to the
    callbacks (returned as actions), the `result` ends it, an `error` event raises."""

    def __init__(self) -> None:
        self.dropped = 0
        self.result: Optional[Execution] = None

    def feed(self, line: str) -> Optional[Tuple[str, Any]]:
        """One line; returns `(STREAM, str)` for output (STREAM `stdout`, `stderr` or
        `traceback`, the event's `stream`) or `("display", Result)` for a callback."""
        if not line.strip():
            return None
        event = json_body(line.encode(), "execute stream")
        if not isinstance(event, dict):
            raise ProtocolError("invalid_response", "execute stream: an event is not an object")
        kind = event.get("event")
        if kind == "output":
            stream = event.get("stream")
            if stream not in OUTPUT_STREAMS:
                stream = "stdout"
            return (str(stream), str(event.get("data", "")))
        if kind == "display":
            data = event.get("data")
            return ("display", Result.from_json(data if isinstance(data, dict) else {}))
        if kind == "output_truncated":
            self.dropped += int(event.get("bytes", 0))
        elif kind == "result":
            result = event.get("result")
            if not isinstance(result, dict):
                raise ProtocolError("invalid_response", "execute stream: bad result event")
            self.result = Execution.from_json(result, stream_bytes_dropped=self.dropped)
        elif kind == "error":
            raise stream_error(event)
        # Events a newer server adds are skipped (they stay visible in the drift test).
        return None

    def finish(self) -> Execution:
        if self.result is None:
            raise ConnectionFailed(
                "stream_ended",
                "the execute stream ended before the cell's result; the cell may still be "
                "running (session.interrupt() stops it)",
            )
        return self.result


#: The methods a request may be sent twice with: GET and HEAD change nothing, a PUT sets the
#: same state again. Never a POST (it runs a cell or a command) nor a DELETE (its second
#: answer would say nothing was there).
RESENDABLE = frozenset({"GET", "HEAD", "PUT"})


def may_resend(e: httpx.HTTPError, method: str, content: Any, attempt: int) -> bool:
    """Whether to send a request again, once: only when the server closed the connection
    without answering (a kept-alive one closed while idle, docs/http-api.md, slow and idle
    clients), which cannot tell whether the server read the request (a crash, a proxy), so
    only for a method it is harmless to send twice, and only when the body can be sent again
    (not a stream)."""
    return (
        attempt == 0
        and method in RESENDABLE
        and isinstance(e, httpx.RemoteProtocolError)
        and "without sending a response" in str(e)
        and (content is None or isinstance(content, bytes))
    )


def transport_error(e: httpx.HTTPError, method: str, url: str) -> KernelboxError:
    """A clear error for a request that got no (complete) answer."""
    if isinstance(e, httpx.TimeoutException):
        phase = {
            httpx.ConnectTimeout: "connecting to",
            httpx.WriteTimeout: "sending to",
            httpx.PoolTimeout: "waiting for a free connection to",
        }.get(type(e), "waiting for an answer from")
        hint = (
            "; the cell may still be running (session.interrupt() stops it)"
            if method == "POST" and url.endswith("/execute")
            else ""
        )
        return Timeout("timeout", f"timed out {phase} kernelbox at {method} {url}{hint}")
    what = str(e) or type(e).__name__
    if isinstance(e, httpx.ConnectError):
        return ConnectionFailed(
            "connection_failed", f"could not connect to kernelbox at {method} {url}: {what}"
        )
    return ConnectionFailed(
        "connection_failed", f"the connection to kernelbox broke during {method} {url}: {what}"
    )


#: Bytes read from a local file per chunk of an upload.
UPLOAD_CHUNK = 256 * 1024


@dataclass
class Upload:
    """The body of `files.write`: bytes, or chunks read from a file as they are sent."""

    content: Any
    length: Optional[int]
    file: Any = None

    def chunks(self) -> Iterable[bytes]:
        while True:
            chunk = self.file.read(UPLOAD_CHUNK)
            if not chunk:
                return
            if isinstance(chunk, str):
                chunk = chunk.encode()
            yield chunk

    def close(self, opened: bool) -> None:
        if opened and self.file is not None:
            self.file.close()


def upload(data: Any) -> Tuple[Upload, bool]:
    """What `files.write(path, data)` sends, and whether this call opened a file to close.

    `data`: bytes-like, a str (UTF-8), a local path (`os.PathLike`), a binary file object
    (streamed, never read whole), or an iterable of bytes chunks.
    """
    if isinstance(data, str):
        data = data.encode()
    if isinstance(data, (bytes, bytearray, memoryview)):
        data = bytes(data)
        return Upload(data, len(data)), False
    opened = False
    if isinstance(data, os.PathLike):
        data = open(data, "rb")
        opened = True
    if hasattr(data, "read"):
        length: Optional[int] = None
        try:
            length = os.fstat(data.fileno()).st_size - data.tell()
        except (AttributeError, OSError, ValueError):
            length = None
        up = Upload(None, length, file=data)
        up.content = up.chunks()
        return up, opened
    return Upload(data, None), False


def upload_headers(up: Upload, tar: bool = False) -> Dict[str, str]:
    h = {"Content-Type": TAR if tar else "application/octet-stream"}
    if up.length is not None:
        h["Content-Length"] = str(up.length)
    return h


class Sink:
    """Where `files.download` writes: a binary file object as given, or a local path through
    a temporary file beside it, renamed into place only once the whole body arrived."""

    def __init__(self, dest: Any) -> None:
        self.size = 0
        self.final: Optional[str] = None
        if isinstance(dest, (str, os.PathLike)):
            self.final = os.fspath(dest)
            folder = os.path.dirname(os.path.abspath(self.final))
            fd, self.temp = tempfile.mkstemp(prefix=".kernelbox-", suffix=".part", dir=folder)
            self.file: Any = os.fdopen(fd, "wb")
        else:
            self.file = dest

    def write(self, chunk: bytes) -> None:
        self.file.write(chunk)
        self.size += len(chunk)

    def abort(self) -> None:
        if self.final is not None:
            self.file.close()
            try:
                os.unlink(self.temp)
            except FileNotFoundError:
                pass

    def finish(self) -> int:
        if self.final is not None:
            self.file.close()
            os.replace(self.temp, self.final)
        return self.size
