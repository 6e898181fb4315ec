"""smolagents: `KernelboxExecutor`, a remote Python executor that `CodeAgent(executor=...)`
runs its code actions with, in one kernelbox session (state kept between steps).

The agent's `final_answer(...)` raises smolagents' `FinalAnswerException` in the kernel; its
value (smolagents' "safe:" JSON) is read back from the cell's error. Tools are sent as their
source, as smolagents does for every remote executor. `install_packages` first asks the
kernel, in one command, which packages it cannot import yet and whether it has a network at
all: a kernel has none unless its tenant's egress policy gives it one (docs/reliability.md,
"Network egress"), and then pip is not run. Otherwise pip installs the missing ones as the
kernel's user, once, without retries (`--retries 0`): a package index the policy refuses fails
at once rather than after pip's backoff. A package asked for (`additional_imports`) that
cannot be installed is an error saying so, raised at once; one a tool's source merely mentions
(smolagents infers tool requirements from imports, optional ones included, e.g. the final
answer's numpy and PIL) is skipped with a message at smolagents' DEBUG level on the
executor's logger (pass the agent's, `logger=`, to follow its verbosity), and the tool meets
the ImportError itself if it really needs it.

A cell that raised goes back to the model as smolagents' own E2B executor sends it: what the
cell printed, then "Executing code yielded an error:" and the traceback, once.
"""

from __future__ import annotations

import json
import re
from io import BytesIO
from typing import Any, List, Optional

from smolagents.local_python_executor import CodeOutput
from smolagents.monitoring import AgentLogger, LogLevel
from smolagents.remote_executors import RemotePythonExecutor
from smolagents.tools import get_tools_definition_code
from smolagents.utils import AgentError

from .._sync import Session
from ._session import OwnedSession

#: The line a `final_answer(...)` call ends its cell's traceback with.
#: (the class is local to the patched `forward`, so its name may come qualified).
_FINAL = re.compile(r"^(?:\S*\.)?FinalAnswerException: ((?:safe|pickle):.*)$", re.MULTILINE)
_TRACEBACK = "Traceback (most recent call last):"
#: A top-level import line of the tools' source.
_IMPORT = re.compile(r"^(import [\w.]+(?: as \w+)?|from [\w.]+ import [\w, ]+)$", re.MULTILINE)


class KernelboxExecutor(RemotePythonExecutor):  # type: ignore[misc]
    """Runs a `CodeAgent`'s code in a kernelbox session: `session` (a `Session`), or a new
    session named `session_name` (default a fresh `smolagents-...`) on the server at
    `url`/`token` (default `KERNELBOX_URL` / `KERNELBOX_TOKEN`). `timeout` is each step's cell
    timeout in seconds (default the server's). `cleanup()` disposes of the session's kernel
    when this executor made the session."""

    def __init__(
        self,
        additional_imports: Optional[List[str]] = None,
        logger: Optional[AgentLogger] = None,
        *,
        session: Optional[Session] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        session_name: Optional[str] = None,
        timeout: Optional[float] = None,
        allow_pickle: bool = False,
    ) -> None:
        super().__init__(
            list(additional_imports or []),
            logger or AgentLogger(level=LogLevel.INFO),
            allow_pickle,
        )
        self._owned = OwnedSession("smolagents", session, url, token, session_name)
        self.session = self._owned.session
        self.timeout = timeout
        self._required = True
        self.installed_packages = self.install_packages(self.additional_imports)

    def send_tools(self, tools: Any) -> None:
        """As smolagents' remote executors do (the final answer patched, the tools' packages
        installed, their source run in the kernel), except that the imports smolagents hoists
        to the top of the tools' source are guarded: it hoists them from anywhere in a tool,
        optional ones inside `try` included (the final answer's numpy and PIL), and a kernel
        without them must still define the tools."""
        if "final_answer" in tools:
            self._patch_final_answer_with_exception(tools["final_answer"])
        wanted = {
            pkg
            for tool in tools.values()
            for pkg in tool.to_dict()["requirements"]
            if pkg not in self.installed_packages + ["smolagents"]
        }
        if "PIL" in wanted:
            wanted.discard("PIL")
            wanted.add("pillow")
        if wanted:
            # Inferred from the tools' source, so best effort: see the module's doc.
            self._required = False
            try:
                self.installed_packages += self.install_packages(sorted(wanted))
            finally:
                self._required = True
        code = _guard_imports(get_tools_definition_code(tools))
        if code:
            self.logger.log(self.run_code_raise_errors(code).logs)

    def run_code_raise_errors(self, code: str) -> CodeOutput:
        r = self.session.run(code, timeout=self.timeout)
        if r.status == "success":
            return CodeOutput(output=_main_result(r.results), logs=r.output, is_final_answer=False)
        error = r.error or r.status
        final = _FINAL.findall(r.output + "\n" + error)
        if final:
            logs = r.output.rsplit(_TRACEBACK, 1)[0]
            value = self._deserialize_final_answer(final[-1], self.allow_pickle)
            return CodeOutput(output=value, logs=logs, is_final_answer=True)
        raise AgentError(
            f"{_without(r.output, error)}\nExecuting code yielded an error:\n{error}", self.logger
        )

    def install_packages(self, additional_imports: List[str]) -> List[str]:
        """Installs with pip (as the kernel's user) the packages of `additional_imports` the
        kernel cannot import yet, when it has a network (see the module's doc); returns the
        names it was given."""
        names = sorted({p.split(".")[0] for p in additional_imports if p and p != "*"})
        if not names:
            return additional_imports
        found = self.session.commands.run(["python3", "-c", _PROBE, *names], timeout=self.timeout)
        probed = json.loads(found.stdout or "{}") if found.ok else {}
        missing = probed.get("missing", names)
        if not missing:
            return additional_imports
        if probed.get("network") is False:
            self._not_installed(
                missing,
                "the kernel has no network (its tenant's egress policy gives it none), so pip "
                "was not run",
            )
            return additional_imports
        pip = self.session.commands.run(
            ["python3", "-m", "pip", "install", "--user", "--no-input", "--retries", "0",
             "--timeout", "15", *missing],  # fmt: skip
            timeout=self.timeout,
        )
        if not pip.ok:
            self._not_installed(
                missing,
                f"pip failed (exit {pip.exit_code}); the package index is reached only when "
                f"the tenant's egress policy allows `pypi`.\n{pip.stderr[-2000:]}",
            )
        return additional_imports

    def _not_installed(self, missing: List[str], why: str) -> None:
        """A package the kernel cannot import and could not get: an error when it was asked
        for, else a message at DEBUG level (see the module's doc)."""
        message = f"kernelbox: {' '.join(missing)} not installed: {why}"
        if self._required:
            raise AgentError(message, self.logger)
        self.logger.log(f"{message}; the tools that import them will fail.", level=LogLevel.DEBUG)

    def cleanup(self) -> None:
        """Disposes of the session's kernel when this executor made the session."""
        self._owned.close()

    def delete(self) -> None:
        self.cleanup()


#: Run in the kernel by `install_packages`: which of its arguments it cannot import, and whether
#: it has a network interface besides loopback (a kernel without egress has none).
_PROBE = (
    "import importlib.util, json, socket, sys\n"
    "missing = [n for n in sys.argv[1:] if importlib.util.find_spec(n) is None]\n"
    "network = any(name != 'lo' for _, name in socket.if_nameindex())\n"
    "print(json.dumps({'missing': missing, 'network': network}))"
)


def _without(output: str, error: str) -> str:
    """`output` without its tail `error` (a raised cell's output ends with its traceback,
    which `error` also is), so that the traceback reaches the model once."""
    tail = error.rstrip("\n")
    head = output.rstrip("\n")
    if tail and head.endswith(tail):
        return head[: len(head) - len(tail)]
    return output


def _main_result(results: List[Any]) -> Any:
    """The value of the cell's last expression: an image (PIL, when installed here) or its
    text; None when it had none."""
    for result in results:
        if not result.is_main_result:
            continue
        image = result.png or result.jpeg
        if image is not None:
            try:
                import PIL.Image

                return PIL.Image.open(BytesIO(image))
            except ImportError:
                return image
        return result.text
    return None


def _guard_imports(code: str) -> str:
    """`code` with each top-level import made optional (`try: ... except ImportError: pass`)."""
    return _IMPORT.sub(lambda m: f"try:\n    {m.group(1)}\nexcept ImportError:\n    pass", code)
