"""LangGraph CodeAct: `KernelboxEval`, the `eval_fn` that `langgraph_codeact.create_codeact`
runs the model's code with, in one kernelbox session (state kept between steps).

`create_codeact` hands `eval_fn` the agent's tools as Python functions in its locals; their
source is defined in the kernel before the code runs (`_code.py`: a tool must be a
self-contained module-level function). The variables a step makes stay in the kernel, not in
the graph's `context`: the returned new-variables dict is always empty.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

from .._sync import Session
from ._code import ToolSender, render
from ._session import OwnedSession


class KernelboxEval:
    """`eval_fn(code, locals) -> (output, new_vars)` over a kernelbox session: `session` (a
    `Session`), or a new one (`url`, `token`, `session_name`); `timeout` is each step's cell
    timeout in seconds (default the server's). `close()` disposes of a session it made."""

    def __init__(
        self,
        session: Optional[Session] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        session_name: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> None:
        self._owned = OwnedSession("langgraph", session, url, token, session_name)
        self.session = self._owned.session
        self.timeout = timeout
        self._tools = ToolSender()

    def __call__(self, code: str, _locals: Dict[str, Any]) -> Tuple[str, Dict[str, Any]]:
        tools = [(n, f) for n, f in _locals.items() if callable(f) and not isinstance(f, type)]
        definitions, digests = self._tools.pending(tools)
        if definitions:
            defined = self.session.run(definitions, timeout=self.timeout)
            if defined.status != "success":
                return "kernelbox: the tools could not be defined:\n" + render(defined), {}
            self._tools.sent(digests)
        result = self.session.run(code, timeout=self.timeout)
        if result.kernel.state_lost is not None:
            self._tools.forget()
        return render(result), {}

    def close(self) -> None:
        self._owned.close()
