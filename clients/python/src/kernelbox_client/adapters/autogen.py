"""AutoGen: `KernelboxCodeExecutor`, an `autogen_core` `CodeExecutor` (for `CodeExecutorAgent`
and the like) over one kernelbox session: Python blocks run as cells in the session's kernel
(state kept between blocks and turns), shell blocks (`sh`, `bash`, `shell`) through the
commands API beside it (docs/contract.md, "Commands"). Cancelling the token interrupts the
running cell (`KeyboardInterrupt`; the kernel keeps its state); `restart()` resets the kernel.
"""

from __future__ import annotations

import asyncio
from typing import Any, List, Optional

from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock, CodeExecutor, CodeResult

from .._sync import Session
from ._code import render
from ._session import OwnedSession

#: The languages run as cells, and those run as shell commands.
PYTHON = ("python", "py", "python3", "")
SHELL = ("sh", "bash", "shell")


class KernelboxCodeExecutor(CodeExecutor):  # type: ignore[misc]
    """Code blocks in a kernelbox session: `session` (a `Session`), or a new one (`url`,
    `token`, `session_name`) disposed of by `stop()`; `timeout` each block's timeout in
    seconds (default the server's)."""

    def __init__(
        self,
        session: Optional[Session] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        session_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._owned = OwnedSession("autogen", session, url, token, session_name)
        self.session = self._owned.session
        self.timeout = timeout

    def _block(self, block: CodeBlock) -> CodeResult:
        language = block.language.lower().strip()
        if language in PYTHON:
            result = self.session.run(block.code, timeout=self.timeout)
            return CodeResult(exit_code=0 if result.status == "success" else 1, output=render(result))
        if language in SHELL:
            done = self.session.commands.run(block.code, timeout=self.timeout)
            output = done.stdout + done.stderr
            if done.timed_out:
                output += f"\n[kernelbox: the command timed out after {done.duration_seconds:.1f} s]"
            return CodeResult(exit_code=done.exit_code, output=output)
        return CodeResult(
            exit_code=1,
            output=f"kernelbox: unsupported language {block.language!r} (python or a shell)",
        )

    def _blocks(self, code_blocks: List[CodeBlock]) -> CodeResult:
        outputs = []
        for block in code_blocks:
            done = self._block(block)
            outputs.append(done.output)
            if done.exit_code != 0:
                return CodeResult(exit_code=done.exit_code, output="".join(outputs))
        return CodeResult(exit_code=0, output="".join(outputs))

    async def execute_code_blocks(
        self, code_blocks: List[CodeBlock], cancellation_token: CancellationToken
    ) -> CodeResult:
        """Runs the blocks in order, stopping at the first that fails."""
        work = asyncio.ensure_future(asyncio.to_thread(self._blocks, code_blocks))
        cancellation_token.link_future(work)
        try:
            return await work
        except asyncio.CancelledError:
            await asyncio.to_thread(self.session.interrupt)
            raise

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        await asyncio.to_thread(self._owned.close)

    async def restart(self) -> None:
        """A fresh kernel for the session (its variables gone)."""
        await asyncio.to_thread(self.session.run, "", None, True)
