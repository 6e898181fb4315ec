"""LlamaIndex CodeAct: `KernelboxCodeExecutor`, whose `execute` is the `code_execute_fn` that
`llama_index.core.agent.workflow.CodeActAgent` runs the model's code with, in one kernelbox
session (state kept between steps).

The agent describes its `tools` to the model; the same tools given to this executor are
defined in the kernel from their source before the first step (`_code.py`: each must be a
self-contained module-level function). Cells run in a worker thread, so the agent's event loop
is never blocked.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from .._sync import Session
from ._code import ToolSender, render
from ._session import OwnedSession


def _named(tool: Any) -> Tuple[str, Callable[..., Any]]:
    """A plain function, or a LlamaIndex `FunctionTool` (its name and its function)."""
    fn = getattr(tool, "fn", None)
    metadata = getattr(tool, "metadata", None)
    if fn is not None and metadata is not None:
        return str(metadata.name), fn
    return tool.__name__, tool


class KernelboxCodeExecutor:
    """Runs a `CodeActAgent`'s code in a kernelbox session: `session` (a `Session`), or a new
    one (`url`, `token`, `session_name`); `tools` as given to the agent; `timeout` each step's
    cell timeout in seconds (default the server's). `close()` disposes of a session it made."""

    def __init__(
        self,
        session: Optional[Session] = None,
        *,
        tools: Iterable[Any] = (),
        url: Optional[str] = None,
        token: Optional[str] = None,
        session_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._owned = OwnedSession("llamaindex", session, url, token, session_name)
        self.session = self._owned.session
        self.timeout = timeout
        self._named: List[Tuple[str, Callable[..., Any]]] = [_named(t) for t in tools]
        self._tools = ToolSender()

    def _run(self, code: str) -> Dict[str, Any]:
        definitions, digests = self._tools.pending(self._named)
        if definitions:
            defined = self.session.run(definitions, timeout=self.timeout)
            if defined.status != "success":
                return {"status": defined.status, "output": render(defined)}
            self._tools.sent(digests)
        result = self.session.run(code, timeout=self.timeout)
        if result.kernel.state_lost is not None:
            self._tools.forget()
        return {"status": result.status, "output": render(result)}

    async def execute(self, code: str) -> Dict[str, Any]:
        """Executes Python code in the kernel and returns its status and output (what it
        printed, its last expression, and its error if it failed); variables persist."""
        return await asyncio.to_thread(self._run, code)

    def close(self) -> None:
        self._owned.close()
