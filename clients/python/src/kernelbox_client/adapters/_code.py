"""What the code-acting adapters share (`langgraph_codeact.py`, `llama_index.py`,
`autogen.py`): a cell's answer as the text a model reads next, and the caller's tools defined
in the kernel from their source.

A kernel runs in its own container, so a tool the agent was given as a Python function cannot
be called across the boundary: its source is sent and defined in the kernel instead, as
smolagents does for every remote executor (docs/python-client.md, "Agent frameworks"). A tool
must therefore be self-contained: a module-level `def` whose imports are inside it or already
importable in the kernel. One whose source Python cannot find (a builtin, a lambda in a REPL)
is an error saying so, never a silent gap.
"""

from __future__ import annotations

import hashlib
import inspect
import textwrap
from typing import Any, Callable, Dict, Iterable, Tuple

from .._types import Execution


class ToolSourceError(ValueError):
    """A tool given to a code-acting adapter has no source Python can read."""


def render(execution: Execution) -> str:
    """The cell's text as a model should read it: what it printed, its last expression's text,
    then, when it failed, its error; a kernel that lost its state says so (the earlier steps'
    variables are gone, docs/contract.md)."""
    parts = []
    lost = execution.kernel.state_lost
    if lost is not None:
        parts.append(
            f"[kernelbox: the kernel's earlier state was lost ({lost.reason}); "
            "variables from earlier steps are gone]\n"
        )
    parts.append(execution.output)
    for result in execution.results:
        if result.is_main_result and result.text is not None:
            parts.append(result.text if result.text.endswith("\n") else result.text + "\n")
    if execution.status != "success":
        parts.append(execution.error or f"[kernelbox: the cell ended {execution.status}]")
    return "".join(parts)


def tool_source(name: str, func: Callable[..., Any]) -> str:
    """The source that defines `func` in the kernel under `name`."""
    target = inspect.unwrap(func)
    try:
        source = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError) as e:
        raise ToolSourceError(
            f"kernelbox: the tool {name!r} has no readable source ({e}); a tool runs in the "
            "kernel's container, so it must be a module-level function defined in a file"
        ) from None
    lines = source.splitlines()
    start = next(
        (i for i, line in enumerate(lines) if line.startswith(("def ", "async def "))), 0
    )
    # The decorators (a framework's `@tool`) stay with the caller: the kernel gets the function.
    source = "\n".join(lines[start:]) + "\n"
    own = getattr(target, "__name__", name)
    if own != name:
        source += f"{name} = {own}\n"
    return source


class ToolSender:
    """Defines each tool in the kernel once (again when its source changes or the kernel's
    state was lost): `pending` gives the code still to run for `tools`, `sent` records it."""

    def __init__(self) -> None:
        self._sent: Dict[str, str] = {}

    def pending(self, tools: Iterable[Tuple[str, Callable[..., Any]]]) -> Tuple[str, Dict[str, str]]:
        code = []
        digests = {}
        for name, func in tools:
            source = tool_source(name, func)
            digest = hashlib.sha256(source.encode()).hexdigest()
            if self._sent.get(name) != digest:
                code.append(source)
                digests[name] = digest
        return "\n".join(code), digests

    def sent(self, digests: Dict[str, str]) -> None:
        self._sent.update(digests)

    def forget(self) -> None:
        """The kernel lost its state: every tool is sent again."""
        self._sent.clear()
