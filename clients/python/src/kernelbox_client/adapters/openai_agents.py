"""OpenAI Agents SDK: `KernelboxSandboxClient`, a sandbox client whose sessions are kernelbox
sessions, for `RunConfig(sandbox=SandboxRunConfig(client=KernelboxSandboxClient()))`.

A sandbox session runs its commands through the commands API (in the kernel's container, as
the kernel's user), reads and writes files through the file API, and persists / hydrates its
workspace as a tar of the kernel's working directory (`/work`, the manifest's root). What
kernelbox lacks: no PTY (`exec_command` with `tty=true` is refused by the SDK's own check), no
other users (a read or write `as` another user is refused), no exposed ports, and the file API
reaches only `/work` (commands see the whole container).
"""

from __future__ import annotations

import io
import uuid
from pathlib import Path, PurePosixPath
from typing import Any, Literal, Optional, Union

from agents.sandbox.errors import ExecTimeoutError
from agents.sandbox.manifest import Manifest
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.session.sandbox_session import SandboxSession
from agents.sandbox.session.sandbox_session_state import SandboxSessionState
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User

from .._async import AsyncClient, AsyncSession
from .._errors import NotFound

#: The kernel's working directory: the workspace root of every kernelbox sandbox session.
WORKDIR = "/work"


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
