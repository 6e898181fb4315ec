"""What the server returns, as typed objects.

Each class names the OpenAPI schema it mirrors (`SCHEMA`); the drift test fails when the
server's `/openapi.json` defines a field one of them lacks, or one whose type, optionality or
values (`ENUMS`, the values of a field the schema enumerates) differ from the client's. Fields
the server adds later are kept in `.raw` until the client learns them.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, FrozenSet, Iterator, List, Optional, Union


@dataclass(frozen=True)
class StateLost:
    """Why the session's previous kernel was lost (`docs/contract.md`, loss reasons)."""

    SCHEMA: ClassVar[str] = "StateLost"
    #: The values of the enumerated fields.
    ENUMS: ClassVar[Dict[str, FrozenSet[str]]] = {
        "reason": frozenset({
            "idle_reaped", "evicted", "timeout", "oom", "crashed", "killed", "engine_restarted",
            "server_restarted", "protocol", "node_lost", "runaway", "node_drained",
            "tenant_removed",
        }),
    }  # fmt: skip
    reason: str
    at: str
    #: The session's workspace went too (its node was lost, or it was deleted meanwhile):
    #: `/work` is a new, empty workspace (docs/workspaces.md).
    workspace_lost: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "StateLost":
        return cls(
            reason=str(d.get("reason", "")),
            at=str(d.get("at", "")),
            workspace_lost=bool(d.get("workspace_lost", False)),
        )


@dataclass(frozen=True)
class WorkspaceInfo:
    """The workspace a kernel's `/work` is (docs/workspaces.md): its name (the owner it
    belongs to) and whether its files are an earlier kernel's (`restored`)."""

    SCHEMA: ClassVar[str] = "WorkspaceInfo"
    name: str
    restored: bool

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WorkspaceInfo":
        return cls(name=str(d.get("name", "")), restored=bool(d.get("restored", False)))


@dataclass(frozen=True)
class Restored:
    """How a hibernated kernel came back (docs/runtimes.md, "Hibernation"): its memory,
    variables and files are as they were."""

    SCHEMA: ClassVar[str] = "Restored"
    #: Wire names that are Python keywords, by field.
    WIRE_NAMES: ClassVar[Dict[str, str]] = {"from_": "from"}
    #: Why it had hibernated: ``idle``, ``evicted``, or ``restart`` (at the server's stop).
    from_: str
    checkpoint_seconds: float
    restore_seconds: float

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Restored":
        return cls(
            from_=str(d.get("from", "")),
            checkpoint_seconds=float(d.get("checkpoint_seconds", 0.0)),
            restore_seconds=float(d.get("restore_seconds", 0.0)),
        )


@dataclass(frozen=True)
class Migrated:
    """Where a kernel a cluster's drain moved came from (docs/cluster.md, "Migration on
    drain"): its memory, variables and generation are as they were."""

    SCHEMA: ClassVar[str] = "Migrated"
    #: The node the kernel ran on before its drain.
    from_node: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Migrated":
        return cls(from_node=str(d.get("from_node", "")))


@dataclass(frozen=True)
class KernelInfo:
    """The kernel that ran a cell."""

    SCHEMA: ClassVar[str] = "KernelInfo"
    id: str
    reused: bool
    execution_count: int
    state_reset: bool
    ended: bool
    generation: int
    state_lost: Optional[StateLost] = None
    #: Present when the tenant has workspaces: `/work` outlives the kernel.
    workspace: Optional[WorkspaceInfo] = None
    #: Present on the first call after the kernel came back from hibernation.
    restored: Optional[Restored] = None
    #: Present on the first call after a cluster's drain moved the kernel to another node.
    migrated: Optional[Migrated] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "KernelInfo":
        lost = d.get("state_lost")
        workspace = d.get("workspace")
        restored = d.get("restored")
        migrated = d.get("migrated")
        return cls(
            id=str(d.get("id", "")),
            reused=bool(d.get("reused", False)),
            execution_count=int(d.get("execution_count", 0)),
            state_reset=bool(d.get("state_reset", False)),
            ended=bool(d.get("ended", False)),
            generation=int(d.get("generation", 0)),
            state_lost=StateLost.from_json(lost) if isinstance(lost, dict) else None,
            workspace=WorkspaceInfo.from_json(workspace) if isinstance(workspace, dict) else None,
            restored=Restored.from_json(restored) if isinstance(restored, dict) else None,
            migrated=Migrated.from_json(migrated) if isinstance(migrated, dict) else None,
        )


@dataclass(frozen=True)
class Result:
    """One rich result: a Jupyter MIME bundle (`display(...)` or a cell's last expression).

    `data` maps MIME types to values as in nbformat (images base64-encoded); the helpers
    decode them: `.png` and `.jpeg` are bytes, `.text`, `.html`, `.svg`, ... strings.
    """

    SCHEMA: ClassVar[str] = "RichResult"
    data: Dict[str, Any]
    metadata: Dict[str, Any] = field(default_factory=dict)
    is_main_result: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Result":
        data = d.get("data")
        metadata = d.get("metadata")
        return cls(
            data=data if isinstance(data, dict) else {},
            metadata=metadata if isinstance(metadata, dict) else {},
            is_main_result=bool(d.get("is_main_result", False)),
        )

    @property
    def formats(self) -> List[str]:
        """The MIME types this result carries."""
        return list(self.data)

    def _text(self, mime: str) -> Optional[str]:
        value = self.data.get(mime)
        if value is None:
            return None
        # nbformat allows a multi-line string as a list of lines.
        return "".join(value) if isinstance(value, list) else str(value)

    def _binary(self, mime: str) -> Optional[bytes]:
        value = self._text(mime)
        return None if value is None else base64.b64decode(value)

    @property
    def text(self) -> Optional[str]:
        return self._text("text/plain")

    @property
    def html(self) -> Optional[str]:
        return self._text("text/html")

    @property
    def markdown(self) -> Optional[str]:
        return self._text("text/markdown")

    @property
    def latex(self) -> Optional[str]:
        return self._text("text/latex")

    @property
    def svg(self) -> Optional[str]:
        return self._text("image/svg+xml")

    @property
    def png(self) -> Optional[bytes]:
        return self._binary("image/png")

    @property
    def jpeg(self) -> Optional[bytes]:
        return self._binary("image/jpeg")

    @property
    def json(self) -> Any:
        value = self.data.get("application/json")
        if not isinstance(value, str):
            return value
        try:
            return json.loads(value)
        except RecursionError:
            # A string the kernel wrote, as deep as it liked: as unreadable as malformed JSON.
            raise ValueError("application/json: nested too deep to read") from None

    # Rendered as itself inside Jupyter.
    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Dict[str, Any]:
        return dict(self.data)


@dataclass(frozen=True)
class CellException:
    """The exception a cell raised (`docs/contract.md`, "stdout and stderr"): its class name
    (`ZeroDivisionError`), its text, and the formatted traceback."""

    SCHEMA: ClassVar[str] = "CellException"
    name: str
    value: str
    traceback: str

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "CellException":
        return cls(
            name=str(d.get("name", "")),
            value=str(d.get("value", "")),
            traceback=str(d.get("traceback", "")),
        )


@dataclass(frozen=True)
class Execution:
    """The result of one cell (`docs/contract.md`); `.raw` is the JSON as the server sent it."""

    SCHEMA: ClassVar[str] = "CellResult"
    #: The values of the enumerated fields: `interrupted` is a cell stopped by
    #: `session.interrupt()`, its kernel kept unless it outlived the grace.
    ENUMS: ClassVar[Dict[str, FrozenSet[str]]] = {
        "status": frozenset({"success", "error", "timeout", "interrupted"}),
    }
    status: str
    output: str
    exit_code: int
    tool_calls_made: int
    duration_seconds: float
    kernel: KernelInfo
    error: Optional[str] = None
    #: The cell's stdout and stderr apart (`output` has both, interleaved, and the traceback).
    stdout: str = ""
    stderr: str = ""
    #: The exception the cell raised, typed; None when it did not raise.
    exception: Optional[CellException] = None
    results: List[Result] = field(default_factory=list)
    stdout_truncated: Optional[bool] = None
    stdout_bytes_total: Optional[int] = None
    stdout_bytes_omitted: Optional[int] = None
    warning: Optional[str] = None
    hint: Optional[str] = None
    #: Output bytes a streaming call did not deliver to `on_output` because the client read
    #: too slowly (the server's `output_truncated` event); `output` still has them.
    stream_bytes_dropped: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.status == "success"

    @property
    def main_result(self) -> Optional[Result]:
        """The bundle of the cell's last expression, when it had a value."""
        return next((r for r in self.results if r.is_main_result), None)

    @classmethod
    def from_json(cls, d: Dict[str, Any], stream_bytes_dropped: int = 0) -> "Execution":
        kernel = d.get("kernel")
        results = d.get("results")
        exception = d.get("exception")
        return cls(
            status=str(d.get("status", "")),
            output=str(d.get("output", "")),
            exit_code=int(d.get("exit_code", -1)),
            tool_calls_made=int(d.get("tool_calls_made", 0)),
            duration_seconds=float(d.get("duration_seconds", 0.0)),
            kernel=KernelInfo.from_json(kernel if isinstance(kernel, dict) else {}),
            error=d.get("error"),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            exception=CellException.from_json(exception) if isinstance(exception, dict) else None,
            results=(
                [Result.from_json(r) for r in results if isinstance(r, dict)]
                if isinstance(results, list)
                else []
            ),
            stdout_truncated=d.get("stdout_truncated"),
            stdout_bytes_total=d.get("stdout_bytes_total"),
            stdout_bytes_omitted=d.get("stdout_bytes_omitted"),
            warning=d.get("warning"),
            hint=d.get("hint"),
            stream_bytes_dropped=stream_bytes_dropped,
            raw=d,
        )


@dataclass(frozen=True)
class KernelSummary:
    """A live kernel of the caller's tenant (`client.kernels()`)."""

    SCHEMA: ClassVar[str] = "KernelSummary"
    #: The values of the enumerated fields.
    ENUMS: ClassVar[Dict[str, FrozenSet[str]]] = {
        "language": frozenset({"python", "bash", "javascript", "typescript"}),
    }
    id: str
    tenant: str
    owner: str
    session: str
    generation: int
    state: str
    execution_count: int
    idle_seconds: float
    attached: int
    child: Optional[str] = None
    #: The session's labels (its settings').
    labels: Dict[str, str] = field(default_factory=dict)
    #: The language the kernel runs (`python`, `bash`, ...).
    language: str = "python"
    #: The kernel's context within its owner (the default one of a language is named by it).
    context: str = "python"

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "KernelSummary":
        labels = d.get("labels")
        return cls(
            id=str(d.get("id", "")),
            tenant=str(d.get("tenant", "")),
            owner=str(d.get("owner", "")),
            session=str(d.get("session", "")),
            generation=int(d.get("generation", 0)),
            state=str(d.get("state", "")),
            execution_count=int(d.get("execution_count", 0)),
            idle_seconds=float(d.get("idle_seconds", 0.0)),
            attached=int(d.get("attached", 0)),
            child=d.get("child"),
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
            language=str(d.get("language", "python")),
            context=str(d.get("context", "python")),
        )


@dataclass(frozen=True)
class FileEntry:
    """One entry of a directory listing (`session.files.list()`)."""

    SCHEMA: ClassVar[str] = "FileEntry"
    #: The values of the enumerated fields.
    ENUMS: ClassVar[Dict[str, FrozenSet[str]]] = {
        "kind": frozenset({"file", "dir", "symlink", "other"}),
    }
    name: str
    kind: str
    size: int
    #: RFC 3339, UTC.
    modified: str = ""

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "FileEntry":
        return cls(
            name=str(d.get("name", "")),
            kind=str(d.get("kind", "")),
            size=int(d.get("size") or 0),
            modified=str(d.get("modified") or ""),
        )


@dataclass(frozen=True)
class Listing:
    """A directory's entries (`session.files.list()`); iterates, indexes and measures like a
    list of `FileEntry`. `truncated` is true when the directory held more than were listed."""

    SCHEMA: ClassVar[str] = "Listing"
    entries: List[FileEntry]
    truncated: bool = False

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Listing":
        items = d.get("entries")
        return cls(
            entries=(
                [FileEntry.from_json(e) for e in items if isinstance(e, dict)]
                if isinstance(items, list)
                else []
            ),
            truncated=bool(d.get("truncated", False)),
        )

    def __iter__(self) -> Iterator[FileEntry]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def __getitem__(self, i: int) -> FileEntry:
        return self.entries[i]

    @property
    def names(self) -> List[str]:
        return [e.name for e in self.entries]


@dataclass(frozen=True)
class WrittenFile:
    """What `session.files.write()` stored: the absolute path in the kernel, the bytes
    written, and for a tar the files extracted."""

    SCHEMA: ClassVar[str] = "Written"
    path: str
    size: int
    files: Optional[int] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WrittenFile":
        files = d.get("files")
        return cls(
            path=str(d.get("path", "")),
            size=int(d.get("size") or 0),
            files=int(files) if isinstance(files, int) else None,
        )


@dataclass(frozen=True)
class CommandResult:
    """What `session.commands.run()` did (`docs/contract.md`, "Commands"): the exit code (-1
    when it was killed at its timeout or the engine could not tell), stdout and stderr apart
    (lossy UTF-8, cut as a cell's output is: the start and the end kept), the wall time, and
    whether it timed out (its whole process group killed; the kernel and its state kept)."""

    SCHEMA: ClassVar[str] = "CommandResult"
    exit_code: int
    stdout: str
    stderr: str
    duration_seconds: float
    timed_out: bool
    stdout_truncated: Optional[bool] = None
    stdout_bytes_total: Optional[int] = None
    stderr_truncated: Optional[bool] = None
    stderr_bytes_total: Optional[int] = None
    #: Bytes of stdout and stderr a streamed run's callbacks never saw (the server dropped
    #: them, `output_truncated`); 0 when not streamed.
    stream_bytes_dropped: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """It exited 0 (and so did not time out)."""
        return self.exit_code == 0 and not self.timed_out

    @classmethod
    def from_json(cls, d: Dict[str, Any], stream_bytes_dropped: int = 0) -> "CommandResult":
        def opt_int(key: str) -> Optional[int]:
            v = d.get(key)
            return int(v) if isinstance(v, int) else None

        def opt_bool(key: str) -> Optional[bool]:
            v = d.get(key)
            return bool(v) if isinstance(v, bool) else None

        return cls(
            exit_code=int(d.get("exit_code", -1)),
            stdout=str(d.get("stdout", "")),
            stderr=str(d.get("stderr", "")),
            duration_seconds=float(d.get("duration_seconds", 0.0)),
            timed_out=bool(d.get("timed_out", False)),
            stdout_truncated=opt_bool("stdout_truncated"),
            stdout_bytes_total=opt_int("stdout_bytes_total"),
            stderr_truncated=opt_bool("stderr_truncated"),
            stderr_bytes_total=opt_int("stderr_bytes_total"),
            stream_bytes_dropped=stream_bytes_dropped,
            raw=d,
        )


@dataclass(frozen=True)
class NetworkPolicy:
    """A session's network egress policy, within its tenant's (docs/reliability.md, "Network
    egress"): `allow` entries (a preset such as `pypi`, a host, `*.example.com`, an address
    range, each optionally with `:PORT`); `deny` wins over `allow`; no `allow`: no network."""

    SCHEMA: ClassVar[str] = "NetworkPolicy"
    allow: List[str] = field(default_factory=list)
    deny: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {"allow": list(self.allow), "deny": list(self.deny)}


@dataclass(frozen=True)
class SessionSettings:
    """A session's settings (docs/http-api.md, "Session settings"): environment variables,
    memory (bytes, or a size such as `"512m"` when sent) and CPU limits, idle timeout
    (seconds) and labels of its kernels; `None` or empty: the server's default."""

    SCHEMA: ClassVar[str] = "SessionSettings"
    env: Dict[str, str] = field(default_factory=dict)
    memory: Optional[Union[int, str]] = None
    cpus: Optional[float] = None
    idle_timeout: Optional[float] = None
    labels: Dict[str, str] = field(default_factory=dict)

    def to_json(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        if self.env:
            out["env"] = dict(self.env)
        if self.labels:
            out["labels"] = dict(self.labels)
        for name in ("memory", "cpus", "idle_timeout"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SessionSettings":
        env, labels = d.get("env"), d.get("labels")
        memory = d.get("memory")
        cpus, idle = d.get("cpus"), d.get("idle_timeout")
        return cls(
            env={str(k): str(v) for k, v in env.items()} if isinstance(env, dict) else {},
            memory=memory if isinstance(memory, (int, str)) else None,
            cpus=float(cpus) if isinstance(cpus, (int, float)) else None,
            idle_timeout=float(idle) if isinstance(idle, (int, float)) else None,
            labels={str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {},
        )


@dataclass(frozen=True)
class SettingsApplied:
    """What setting a session's settings answers: the settings now, and whether a live
    kernel of the session runs with another environment, memory or CPU (they apply from its
    next kernel: `run(..., reset=True)` or `close()` first)."""

    SCHEMA: ClassVar[str] = "SettingsApplied"
    settings: SessionSettings
    restart_required: bool

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SettingsApplied":
        settings = d.get("settings")
        return cls(
            settings=SessionSettings.from_json(settings if isinstance(settings, dict) else {}),
            restart_required=bool(d.get("restart_required", False)),
        )


@dataclass(frozen=True)
class WorkspaceSummary:
    """One of the tenant's workspaces (`client.workspaces()`, docs/workspaces.md)."""

    SCHEMA: ClassVar[str] = "WorkspaceSummary"
    name: str
    size_bytes: int
    quota_bytes: int
    #: Its last use, Unix seconds.
    last_used: int
    #: A kernel has it mounted now (it cannot be deleted until the session is closed).
    in_use: bool

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "WorkspaceSummary":
        return cls(
            name=str(d.get("name", "")),
            size_bytes=int(d.get("size_bytes") or 0),
            quota_bytes=int(d.get("quota_bytes") or 0),
            last_used=int(d.get("last_used") or 0),
            in_use=bool(d.get("in_use", False)),
        )


@dataclass(frozen=True)
class UsageRow:
    """One tenant's session's usage in one bucket (an hour, or a day), docs/usage.md."""

    SCHEMA: ClassVar[str] = "UsageRow"
    tenant: str
    #: Empty when summed over sessions (`group_by="day"` or `"hour"`).
    session: str
    #: Start of the bucket, Unix seconds.
    start: int
    kernel_seconds: float = 0.0
    cpu_seconds: float = 0.0
    peak_memory_bytes: int = 0
    cells: int = 0
    cell_seconds: float = 0.0
    commands: int = 0
    file_bytes_in: int = 0
    file_bytes_out: int = 0
    pool_hits: int = 0
    #: Bytes kernels received and sent through the egress proxy.
    network_bytes_in: int = 0
    network_bytes_out: int = 0

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "UsageRow":
        def num(key: str) -> float:
            v = d.get(key)
            return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0

        return cls(
            tenant=str(d.get("tenant", "")),
            session=str(d.get("session", "")),
            start=int(num("start")),
            kernel_seconds=num("kernel_seconds"),
            cpu_seconds=num("cpu_seconds"),
            peak_memory_bytes=int(num("peak_memory_bytes")),
            cells=int(num("cells")),
            cell_seconds=num("cell_seconds"),
            commands=int(num("commands")),
            file_bytes_in=int(num("file_bytes_in")),
            file_bytes_out=int(num("file_bytes_out")),
            pool_hits=int(num("pool_hits")),
            network_bytes_in=int(num("network_bytes_in")),
            network_bytes_out=int(num("network_bytes_out")),
        )


@dataclass(frozen=True)
class UsageReport:
    """The usage ledger over a range (`client.usage()`, docs/usage.md): `from_` (the wire's
    `from`) and `to` in Unix seconds, how rows are summed, and the rows; iterates like its
    rows."""

    SCHEMA: ClassVar[str] = "UsageReport"
    #: Wire names that are Python keywords, by field.
    WIRE_NAMES: ClassVar[Dict[str, str]] = {"from_": "from"}
    #: The values of the enumerated fields.
    ENUMS: ClassVar[Dict[str, FrozenSet[str]]] = {"group_by": frozenset({"session", "day", "hour"})}
    from_: int
    to: int
    group_by: str
    rows: List[UsageRow] = field(default_factory=list)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "UsageReport":
        rows = d.get("rows")
        return cls(
            from_=int(d.get("from") or 0),
            to=int(d.get("to") or 0),
            group_by=str(d.get("group_by", "")),
            rows=(
                [UsageRow.from_json(r) for r in rows if isinstance(r, dict)]
                if isinstance(rows, list)
                else []
            ),
        )

    def __iter__(self) -> Iterator[UsageRow]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

@dataclass(frozen=True)
class SnapshotInfo:
    """A snapshot of a session's kernel (`session.snapshot()`, docs/snapshots.md): under
    runsc its memory (variables, imports, `/tmp`) and its working directory's files; under
    runc its working directory's files only (`memory` False)."""

    SCHEMA: ClassVar[str] = "SnapshotInfo"
    id: str
    session: str
    #: RFC 3339.
    created: str
    #: RFC 3339: when the server removes it.
    expires: str
    bytes: int
    #: The kernel's memory is in it.
    memory: bool
    runtime: str
    checkpoint_seconds: float = 0.0
    name: Optional[str] = None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "SnapshotInfo":
        name = d.get("name")
        return cls(
            id=str(d.get("id", "")),
            session=str(d.get("session", "")),
            created=str(d.get("created", "")),
            expires=str(d.get("expires", "")),
            bytes=int(d.get("bytes") or 0),
            memory=bool(d.get("memory", False)),
            runtime=str(d.get("runtime", "")),
            checkpoint_seconds=float(d.get("checkpoint_seconds") or 0.0),
            name=None if name is None else str(name),
        )


@dataclass(frozen=True)
class RestoredKernel:
    """The kernel a restore or a fork started from a snapshot."""

    SCHEMA: ClassVar[str] = "RestoredKernel"
    id: str
    generation: int
    restore_seconds: float

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RestoredKernel":
        return cls(
            id=str(d.get("id", "")),
            generation=int(d.get("generation") or 0),
            restore_seconds=float(d.get("restore_seconds") or 0.0),
        )


@dataclass(frozen=True)
class ForkError:
    """Why a fork failed: the server's error code and message."""

    SCHEMA: ClassVar[str] = "ErrorDetail"
    code: str
    message: str


@dataclass(frozen=True)
class ForkOutcome:
    """One fork (or a restore): its session and kernel, or why it failed (the session then
    has no kernel)."""

    SCHEMA: ClassVar[str] = "ForkOutcome"
    session: str
    kernel: Optional[RestoredKernel] = None
    error: Optional[ForkError] = None

    @property
    def ok(self) -> bool:
        return self.kernel is not None

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ForkOutcome":
        kernel = d.get("kernel")
        error = d.get("error")
        return cls(
            session=str(d.get("session", "")),
            kernel=RestoredKernel.from_json(kernel) if isinstance(kernel, dict) else None,
            error=ForkError(str(error.get("code", "")), str(error.get("message", "")))
            if isinstance(error, dict)
            else None,
        )


@dataclass(frozen=True)
class ForkResult:
    """`session.fork(n)`: the forks in the order asked, each on its own."""

    SCHEMA: ClassVar[str] = "ForkResult"
    #: How long the source was paused for its checkpoint (0 when it was hibernated).
    checkpoint_seconds: float
    forks: List[ForkOutcome]

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ForkResult":
        forks = d.get("forks")
        return cls(
            checkpoint_seconds=float(d.get("checkpoint_seconds") or 0.0),
            forks=(
                [ForkOutcome.from_json(f) for f in forks if isinstance(f, dict)]
                if isinstance(forks, list)
                else []
            ),
        )



@dataclass(frozen=True)
class ProcessInfo:
    """A background process (docs/processes.md): started in the session's kernel container
    beside its cells, running until it ends, is killed or its kernel goes."""

    SCHEMA: ClassVar[str] = "ProcessInfo"
    #: Its id in the session (the handle every other call takes).
    id: int
    #: The argument vector it runs (`["/bin/sh", "-c", LINE]` for a shell line).
    command: List[str]
    #: When it started, RFC 3339.
    started_at: str
    #: True until its output ended (it, and everything holding its output, are gone).
    running: bool
    #: True while its stdin is open (started with `stdin=True`, not closed yet).
    stdin_open: bool
    #: Bytes it wrote on stdout and stderr in all.
    output_bytes: int
    #: Its leader's process id inside the container, once known.
    pid: Optional[int] = None
    #: Its working directory, as asked.
    cwd: Optional[str] = None
    #: Its exit code once it ended (128 + the signal when a signal ended it; -1 when the
    #: engine could not tell, e.g. its kernel went).
    exit_code: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ProcessInfo":
        command = d.get("command")
        pid, exit_code = d.get("pid"), d.get("exit_code")
        return cls(
            id=int(d.get("id", 0)),
            command=[str(a) for a in command] if isinstance(command, list) else [],
            started_at=str(d.get("started_at", "")),
            running=bool(d.get("running", False)),
            stdin_open=bool(d.get("stdin_open", False)),
            output_bytes=int(d.get("output_bytes", 0)),
            pid=int(pid) if isinstance(pid, int) else None,
            cwd=str(d["cwd"]) if isinstance(d.get("cwd"), str) else None,
            exit_code=int(exit_code) if isinstance(exit_code, int) else None,
            raw=d,
        )


@dataclass(frozen=True)
class ProcessEvent:
    """One line of a background process's output stream (`processes.stream`): `kind` is
    `stdout` or `stderr` (`text` what it wrote), `output_truncated` (`dropped` bytes it wrote
    that were no longer kept when the stream reached them) or `exit` (`exit_code`), always
    the last."""

    kind: str
    text: str = ""
    dropped: int = 0
    exit_code: Optional[int] = None


@dataclass(frozen=True)
class ProcessOutput:
    """What `processes.output` read of a background process: its kept output, then what it
    wrote while the call waited; `exit_code` once it ended (None: still running when the
    wait was over)."""

    stdout: str
    stderr: str
    #: stdout and stderr as they came, interleaved.
    output: str
    exit_code: Optional[int] = None
    #: Bytes it wrote that were no longer kept (its oldest output past the server's 256 KiB).
    bytes_dropped: int = 0

    @property
    def running(self) -> bool:
        """True when the process had not ended by the time the call returned."""
        return self.exit_code is None


#: Every type above, by the schema it mirrors (the drift test walks the server's spec with it).
MIRRORS = {
    cls.SCHEMA: cls
    for cls in (
        StateLost,
        WorkspaceInfo,
        Restored,
        Migrated,
        KernelInfo,
        Result,
        CellException,
        Execution,
        KernelSummary,
        FileEntry,
        Listing,
        WrittenFile,
        CommandResult,
        NetworkPolicy,
        SessionSettings,
        SettingsApplied,
        WorkspaceSummary,
        UsageRow,
        UsageReport,
        SnapshotInfo,
        RestoredKernel,
        ForkError,
        ForkOutcome,
        ForkResult,
        ProcessInfo,
    )
}
