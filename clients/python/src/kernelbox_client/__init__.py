"""Python client for kernelbox: stateful Python kernels in hardened Docker containers, one per
agent conversation (docs/python-client.md).

| file | what |
|---|---|
| `_sync.py` | `Client`, `Session`, `Commands`, `Processes`, `Files`: the blocking client |
| `_async.py` | `AsyncClient`, `AsyncSession`, `AsyncCommands`, `AsyncProcesses`, `AsyncFiles`: the same surface for asyncio |
| `_wire.py` | the HTTP API without I/O: requests, answers, timeouts, the NDJSON stream |
| `_types.py` | `Execution`, `CommandResult`, `Result`, `KernelInfo`, ...: what the server returns, typed |
| `_errors.py` | `KernelboxError` and its subclasses, from a status or a stream's error code |
| `_dropin.py` | `execute_code`: the result JSON string, one session per task id |
"""

from ._async import AsyncClient, AsyncCommands, AsyncFiles, AsyncProcesses, AsyncSession
from ._dropin import execute_code, session_for_task
from ._errors import (
    BadRequest,
    Conflict,
    ConnectionFailed,
    KernelboxError,
    NotFound,
    PayloadTooLarge,
    ProtocolError,
    RateLimited,
    ServerError,
    Timeout,
    Unauthorized,
)
from ._sync import Client, Commands, Files, Processes, Session
from ._types import (
    CellException,
    CommandResult,
    Execution,
    FileEntry,
    ForkError,
    ForkOutcome,
    ForkResult,
    KernelInfo,
    KernelSummary,
    Listing,
    NetworkPolicy,
    Migrated,
    ProcessEvent,
    ProcessInfo,
    ProcessOutput,
    Restored,
    Result,
    SessionSettings,
    SettingsApplied,
    SnapshotInfo,
    StateLost,
    RestoredKernel,
    UsageReport,
    UsageRow,
    WorkspaceInfo,
    WorkspaceSummary,
    WrittenFile,
)

# The package's version, its one home: pyproject.toml reads it from here
# ([tool.hatch.version]).
__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "AsyncCommands",
    "AsyncFiles",
    "AsyncProcesses",
    "AsyncSession",
    "BadRequest",
    "CellException",
    "Client",
    "CommandResult",
    "Commands",
    "Conflict",
    "ConnectionFailed",
    "Execution",
    "FileEntry",
    "Files",
    "ForkError",
    "ForkOutcome",
    "ForkResult",
    "KernelInfo",
    "KernelSummary",
    "KernelboxError",
    "Listing",
    "NetworkPolicy",
    "NotFound",
    "PayloadTooLarge",
    "ProcessEvent",
    "ProcessInfo",
    "ProcessOutput",
    "Processes",
    "ProtocolError",
    "RateLimited",
    "Result",
    "ServerError",
    "Session",
    "SessionSettings",
    "SettingsApplied",
    "StateLost",
    "Timeout",
    "Unauthorized",
    "UsageReport",
    "UsageRow",
    "Migrated",
    "Restored",
    "RestoredKernel",
    "SnapshotInfo",
    "WorkspaceInfo",
    "WorkspaceSummary",
    "WrittenFile",
    "execute_code",
    "session_for_task",
]
