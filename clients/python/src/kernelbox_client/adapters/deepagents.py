"""LangChain deepagents: `KernelboxSandbox`, a `BaseSandbox` backend over one kernelbox
session. `execute` is the commands API (a shell line run by `/bin/sh -c` in the kernel's
container, stdout then stderr as one output), `upload_files` / `download_files` the file API;
deepagents builds `ls`, `read_file`, `write_file`, `edit_file`, `grep` and `glob` on those.

The file API reaches the kernel's working directory only (docs/files.md): a path is taken
relative to it, or absolute under `/work`; any other absolute path is refused
(`permission_denied`), while `execute` sees the whole container as the kernel's user does.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

from deepagents.backends.protocol import ExecuteResponse, FileDownloadResponse, FileUploadResponse
from deepagents.backends.sandbox import BaseSandbox

from .._errors import BadRequest, KernelboxError, NotFound
from .._sync import Session
from ._session import OwnedSession

#: The kernel's working directory, where the file API's relative paths start.
WORKDIR = "/work"


class KernelboxSandbox(BaseSandbox):  # type: ignore[misc]
    """A deepagents sandbox in a kernelbox session: `session` (a `Session`), or a new session
    named `session_name` (default a fresh `deepagents-...`) on the server at `url`/`token`
    (default `KERNELBOX_URL` / `KERNELBOX_TOKEN`). `timeout` is a command's default, in
    seconds (default the server's). `close()` disposes of the kernel when this sandbox made
    the session."""

    def __init__(
        self,
        session: Optional[Session] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        session_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._owned = OwnedSession("deepagents", session, url, token, session_name)
        self.session = self._owned.session
        self.timeout = timeout

    @property
    def id(self) -> str:
        return self.session.name

    def execute(self, command: str, *, timeout: Optional[int] = None) -> ExecuteResponse:
        r = self.session.commands.run(command, timeout=timeout or self.timeout)
        output = r.stdout + r.stderr
        if r.timed_out:
            output += f"\n[kernelbox] the command timed out after {r.duration_seconds:.1f} s and was killed"
        truncated = bool(r.stdout_truncated or r.stderr_truncated)
        return ExecuteResponse(
            output=output,
            exit_code=None if r.timed_out else r.exit_code,
            truncated=truncated,
        )

    def upload_files(self, files: List[Tuple[str, bytes]]) -> List[FileUploadResponse]:
        out = []
        for path, content in files:
            rel, error = _relative(path)
            if error is None:
                try:
                    self.session.files.write(rel, content)
                except KernelboxError as e:
                    error = _file_error(e)
            out.append(FileUploadResponse(path=path, error=error))
        return out

    def download_files(self, paths: List[str]) -> List[FileDownloadResponse]:
        out = []
        for path in paths:
            rel, error = _relative(path)
            content: Optional[bytes] = None
            if error is None:
                try:
                    content = self.session.files.read(rel)
                except KernelboxError as e:
                    error = _file_error(e)
            out.append(FileDownloadResponse(path=path, content=content, error=error))
        return out

    def close(self) -> None:
        """Disposes of the session's kernel when this sandbox made the session."""
        self._owned.close()


def _relative(path: str) -> Tuple[str, Optional[str]]:
    """`path` for the file API (relative to the working directory), or deepagents' error."""
    if not path.startswith("/"):
        return path, None
    if path == WORKDIR or path.startswith(WORKDIR + "/"):
        return path[len(WORKDIR) + 1 :], None
    return path, "permission_denied"


def _file_error(e: KernelboxError) -> str:
    """A refusal of the file API as deepagents' error names, or kernelbox's own message."""
    if isinstance(e, NotFound):
        return "file_not_found"
    if isinstance(e, BadRequest) and "path" in e.code:
        return "invalid_path"
    return f"kernelbox: {e.code}: {e.message}"
