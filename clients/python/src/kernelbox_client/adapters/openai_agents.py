"""OpenAI Agents SDK: `KernelboxSandboxClient`, a sandbox client whose sessions are kernelbox
sessions, for `RunConfig(sandbox=SandboxRunConfig(client=KernelboxSandboxClient()))`.

A sandbox session runs its one-shot commands through the commands API (in the kernel's
container, as the kernel's user), reads and writes files through the file API, and persists /
hydrates its workspace as a tar of the kernel's working directory (`/work`, the manifest's
root).

The SDK's interactive sessions (`supports_pty()`: its shell tool's `exec_command` with
`yield_time_ms`, then `write_stdin` to poll or feed it) are kernelbox background processes
(docs/processes.md): `exec_command` starts one and returns what it wrote within
`yield_time_ms`; one still running stays so, and its session id is the model's handle for
`write_stdin`, which writes on its stdin (with `tty=true`), waits for more output, and gives
its exit code once it ended. One reader per process follows its output from its start, so no
output is lost or repeated between polls. `tty=true` opens a stdin pipe, not a terminal (no
echo; `isatty()` is false); Ctrl-C (`\u0003`) written sends SIGINT, Ctrl-D (`\u0004`) closes
stdin. What kernelbox lacks: no other users (a read or write `as` another user is refused), no
exposed ports, and the file API reaches only `/work` (commands see the whole container).
"""

from __future__ import annotations

import asyncio
import io
import uuid
from collections import deque
from pathlib import Path, PurePosixPath
from typing import Any, Deque, Dict, Literal, Optional, Union

from agents.sandbox.errors import ExecTimeoutError, ExecTransportError, PtySessionNotFoundError
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

from .._async import AsyncClient, AsyncSession
from .._errors import Conflict, KernelboxError, NotFound

#: The kernel's working directory: the workspace root of every kernelbox sandbox session.
WORKDIR = "/work"
#: What `write_stdin` turns into a signal or an end of file instead of writing it (there is
#: no terminal to do so): Ctrl-C, Ctrl-D.
CTRL_C, CTRL_D = "\x03", "\x04"
#: How many times a signal or kill is tried while the process has not said its pid yet
#: (`process_starting`, a few milliseconds after its start).
STARTING_RETRIES = 50


class _Interactive:
    """One interactive session: a kernelbox background process and what its one reader
    (`pump`) has read of its output and not handed to the model yet."""

    def __init__(self, process_id: int, tty: bool) -> None:
        self.process_id = process_id
        self.tty = tty
        self.chunks: Deque[bytes] = deque()
        self.lock = asyncio.Lock()
        self.notify = asyncio.Event()
        #: Set when its output ended: it exited, or its stream broke.
        self.ended = asyncio.Event()
        self.exit_code: Optional[int] = None
        self.pump: Optional["asyncio.Task[None]"] = None


class KernelboxSandboxSessionState(SandboxSessionState):  # type: ignore[misc]
    type: Literal["kernelbox"] = "kernelbox"
    #: The kernelbox session the sandbox session is.
    kernelbox_session: str = ""


class KernelboxSandboxClientOptions(BaseSandboxClientOptions):  # type: ignore[misc]
    type: Literal["kernelbox"] = "kernelbox"
    #: The kernelbox session to use (default a fresh `openai-agents-...`).
    session_name: Optional[str] = None


class KernelboxSandboxSession(BaseSandboxSession):  # type: ignore[misc]
    """One kernelbox session as an Agents SDK sandbox session."""

    state: KernelboxSandboxSessionState

    def __init__(self, *, state: KernelboxSandboxSessionState, client: AsyncClient) -> None:
        self.state = state
        self._kb: AsyncSession = client.session(state.kernelbox_session)
        #: The interactive sessions still running, by the id the model knows them by.
        self._interactive: Dict[int, _Interactive] = {}

    def supports_pty(self) -> bool:
        return True

    async def pty_exec_start(
        self,
        *command: Union[str, Path],
        timeout: Optional[float] = None,
        shell: Union[bool, list[str]] = True,
        user: Union[str, User, None] = None,
        tty: bool = False,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        """Starts `command` as a background process (its stdin open with `tty`) and returns
        what it wrote within `yield_time_s`: its exit code if it ended, else the session id
        `write_stdin` takes."""
        _only_the_kernels_user(user)
        argv = self._prepare_exec_command(*command, shell=shell, user=None)
        try:
            info = await self._kb.processes.start(argv, stdin=tty)
        except KernelboxError as e:
            # Refused before anything ran (too many processes, no kernel): the SDK may run
            # it one-shot instead.
            raise ExecTransportError(command=argv, context={"retry_safe": True}, cause=e) from e
        live = _Interactive(info.id, tty)
        live.pump = asyncio.create_task(self._pump(live))
        session_id = allocate_pty_process_id(set(self._interactive))
        self._interactive[session_id] = live
        wait_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._collect(session_id, live, clamp_pty_yield_time_ms(wait_ms),
                                   max_output_tokens)  # fmt: skip

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: Optional[float] = None,
        max_output_tokens: Optional[int] = None,
    ) -> PtyExecUpdate:
        """Writes `chars` on the session's stdin (Ctrl-C a SIGINT, Ctrl-D its end), then
        returns what it wrote since the last call, within `yield_time_s`."""
        live = self._interactive.get(session_id)
        if live is None:
            raise PtySessionNotFoundError(session_id=session_id)
        if chars:
            if not live.tty:
                raise RuntimeError("stdin is not available for this process")
            await self._send(live, chars)
        wait_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        wait_ms = resolve_pty_write_yield_time_ms(yield_time_ms=wait_ms, input_empty=chars == "")
        return await self._collect(session_id, live, wait_ms, max_output_tokens)

    async def pty_terminate_all(self) -> None:
        """Kills every interactive session still running (the SDK's stop and shutdown)."""
        live, self._interactive = list(self._interactive.values()), {}
        for one in live:
            if not one.ended.is_set():
                await self._retry_starting(lambda: self._kb.processes.kill(one.process_id))
            if one.pump is not None:
                one.pump.cancel()
                await asyncio.gather(one.pump, return_exceptions=True)

    async def _pump(self, live: _Interactive) -> None:
        """Reads the process's output from its start to its exit into `live.chunks`."""
        try:
            async for event in self._kb.processes.stream(live.process_id):
                if event.kind in ("stdout", "stderr"):
                    async with live.lock:
                        live.chunks.append(event.text.encode())
                    live.notify.set()
                elif event.kind == "output_truncated":
                    note = f"[{event.dropped} bytes of output were dropped unread]\n"
                    async with live.lock:
                        live.chunks.append(note.encode())
                elif event.kind == "exit":
                    live.exit_code = event.exit_code
        except KernelboxError as e:
            async with live.lock:
                live.chunks.append(f"[kernelbox: the output stream broke: {e}]\n".encode())
        finally:
            live.ended.set()
            live.notify.set()

    async def _collect(
        self, session_id: int, live: _Interactive, wait_ms: int, max_output_tokens: Optional[int]
    ) -> PtyExecUpdate:
        output, tokens, ended = await collect_pty_output(
            output_chunks=live.chunks,
            output_lock=live.lock,
            output_notify=live.notify,
            is_done=live.ended.is_set,
            yield_time_ms=wait_ms,
            max_output_tokens=max_output_tokens,
        )
        if not ended:
            return PtyExecUpdate(session_id, output, None, tokens)
        # Its output ended: it exited (or its reader failed, -1), and the session is over.
        self._interactive.pop(session_id, None)
        exit_code = live.exit_code if live.exit_code is not None else -1
        return PtyExecUpdate(None, output, exit_code, tokens)

    async def _send(self, live: _Interactive, chars: str) -> None:
        """`chars` on the process's stdin, Ctrl-C and Ctrl-D as a SIGINT and an end of file.
        A process that ended meanwhile takes nothing, as a closed pipe would."""
        text = ""
        try:
            for ch in chars:
                if ch not in (CTRL_C, CTRL_D):
                    text += ch
                    continue
                if text:
                    await self._kb.processes.write_stdin(live.process_id, text)
                    text = ""
                if ch == CTRL_C:
                    await self._retry_starting(
                        lambda: self._kb.processes.signal(live.process_id, "SIGINT")
                    )
                else:
                    await self._kb.processes.close_stdin(live.process_id)
            if text:
                await self._kb.processes.write_stdin(live.process_id, text)
        except Conflict as e:
            if e.code != "stdin_closed":
                raise

    async def _retry_starting(self, call: Any) -> None:
        """`call()` (a signal or a kill), again while the process has not said its pid."""
        for _ in range(STARTING_RETRIES):
            try:
                await call()
                return
            except NotFound:
                return
            except Conflict as e:
                if e.code != "process_starting":
                    raise
                # A backoff between attempts (the server's answer says to retry), not a wait
                # for an event: none says when the pid is known.
                await asyncio.sleep(0.05)

    async def _exec_internal(
        self, *command: Union[str, Path], timeout: Optional[float] = None
    ) -> ExecResult:
        argv = [str(c) for c in command]
        r = await self._kb.commands.run(argv, timeout=timeout)
        if r.timed_out:
            raise ExecTimeoutError(command=argv, timeout_s=timeout)
        return ExecResult(
            stdout=r.stdout.encode(), stderr=r.stderr.encode(), exit_code=r.exit_code
        )

    async def read(self, path: Path, *, user: Union[str, User, None] = None) -> io.IOBase:
        _only_the_kernels_user(user)
        try:
            return io.BytesIO(await self._kb.files.read(_relative(path)))
        except NotFound:
            raise FileNotFoundError(str(path)) from None

    async def write(
        self, path: Path, data: io.IOBase, *, user: Union[str, User, None] = None
    ) -> None:
        _only_the_kernels_user(user)
        content = data.read()
        if isinstance(content, str):
            content = content.encode()
        await self._kb.files.write(_relative(path), content)

    async def running(self) -> bool:
        return True

    async def persist_workspace(self) -> io.IOBase:
        return io.BytesIO(await self._kb.files.read(".", tar=True))

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        await self._kb.files.write(".", data.read(), tar=True)

    async def aclose_kernel(self) -> None:
        await self._kb.close()


class KernelboxSandboxClient(BaseSandboxClient[Optional[KernelboxSandboxClientOptions]]):  # type: ignore[misc]
    """Creates sandbox sessions on the kernelbox server at `url` / `token` (default
    `KERNELBOX_URL` / `KERNELBOX_TOKEN`); `delete` disposes of the session's kernel."""

    backend_id = "kernelbox"
    supports_default_options = True

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None) -> None:
        self._client = AsyncClient(url, token)

    async def create(
        self,
        *,
        snapshot: Union[SnapshotSpec, SnapshotBase, None] = None,
        manifest: Optional[Manifest] = None,
        options: Optional[KernelboxSandboxClientOptions] = None,
    ) -> SandboxSession:
        options = options or KernelboxSandboxClientOptions()
        manifest = (manifest or Manifest()).model_copy(update={"root": WORKDIR}, deep=True)
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = KernelboxSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            kernelbox_session=options.session_name or f"openai-agents-{session_id.hex[:12]}",
        )
        return self._wrap_session(KernelboxSandboxSession(state=state, client=self._client))

    async def delete(self, session: SandboxSession) -> SandboxSession:
        inner = session._inner
        if isinstance(inner, KernelboxSandboxSession):
            await inner.aclose_kernel()
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        if not isinstance(state, KernelboxSandboxSessionState):
            raise TypeError("KernelboxSandboxClient.resume expects a KernelboxSandboxSessionState")
        return self._wrap_session(KernelboxSandboxSession(state=state, client=self._client))

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, KernelboxSandboxSessionState)

    async def aclose(self) -> None:
        await self._client.close()


def _relative(path: Union[Path, str]) -> str:
    """`path` for the file API: relative to the working directory (absolute under `/work`)."""
    p = PurePosixPath(str(path))
    if not p.is_absolute():
        return str(p)
    try:
        rel = p.relative_to(WORKDIR)
    except ValueError:
        raise PermissionError(
            f"{path}: kernelbox's file API reaches only the working directory ({WORKDIR})"
        ) from None
    return str(rel) if str(rel) != "." else "."


def _only_the_kernels_user(user: Any) -> None:
    if user is not None:
        raise PermissionError("kernelbox runs everything as the kernel's one user")
