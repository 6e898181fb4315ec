"""The OpenAI Agents SDK's own run loop (`Runner` with a `SandboxAgent`), with the SDK's
`ScriptedModel` (no network LLM), on `KernelboxSandboxClient` over a real server: the agent's
`exec_command` runs as a kernelbox background process in the kernel's container (one still
running past `yield_time_ms` stays so, and `write_stdin` polls and feeds it), the manifest's
files are written through the file API, and the workspace persists and hydrates as a tar."""

from __future__ import annotations

import asyncio
import io
import re
from typing import Any, Callable, List

from agents import Runner
from agents.run import RunConfig
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.testing.model import ScriptedModel, assistant_message, function_call
from agents.items import TResponseOutputItem

from kernelbox_client import Client
from kernelbox_client.adapters.openai_agents import (
    KernelboxSandboxClient,
    KernelboxSandboxClientOptions,
)


def test_a_sandbox_agent_runs_commands_in_a_kernelbox_session(server: Any, session_name: str) -> None:
    model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "cat notes.txt; pwd; echo err >&2"}, call_id="c1")],
            [assistant_message("done")],
        ]
    )
    agent = SandboxAgent(
        name="kb",
        instructions="Use the sandbox.",
        model=model,
        default_manifest=Manifest(entries={"notes.txt": File(content=b"from the manifest\n")}),
    )

    async def main() -> Any:
        client = KernelboxSandboxClient(server.url, server.token())
        options = KernelboxSandboxClientOptions(session_name=session_name)
        config = RunConfig(sandbox=SandboxRunConfig(client=client, options=options))
        result = await Runner.run(agent, "read the notes", run_config=config)
        await client.aclose()
        return result

    result = asyncio.run(main())
    assert result.final_output == "done"
    outputs = [str(i.output) for i in result.new_items if getattr(i, "type", "") == "tool_call_output_item"]
    assert any("from the manifest" in o and "/work" in o for o in outputs), outputs
    assert any("err" in o for o in outputs), outputs
    # The runner made the sandbox session, so it deleted it: the kernel is gone.
    with Client(server.url, server.token()) as kb:
        assert kb.session(session_name).close() == 0


def test_the_workspace_persists_and_hydrates_as_a_tar(server: Any) -> None:
    async def main() -> bytes:
        client = KernelboxSandboxClient(server.url, server.token())
        one = await client.create(manifest=Manifest())
        await one._inner.write("/work/a/b.txt", io.BytesIO(b"kept"))
        tar = (await one._inner.persist_workspace()).read()
        await client.delete(one)
        two = await client.create(manifest=Manifest())
        await two._inner.hydrate_workspace(io.BytesIO(tar))
        got = (await two._inner.read("a/b.txt")).read()
        r = await two._inner.exec("cat", "/work/a/b.txt")
        await client.delete(two)
        await client.aclose()
        return got + b"|" + r.stdout

    assert asyncio.run(main()) == b"kept|kept"


class FollowingModel(ScriptedModel):  # type: ignore[misc]
    """A scripted model whose every step is made from the last tool output it was given (the
    interactive session id the sandbox chose is only known then), as a real model would."""

    def __init__(self, steps: List[Callable[[str], List[TResponseOutputItem]]]) -> None:
        super().__init__()
        self.plan = list(steps)
        self.outputs: List[str] = []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any,
                           **kwargs: Any) -> Any:  # fmt: skip
        items = input if isinstance(input, list) else []
        last = [i for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        output = str(last[-1]["output"]) if last else ""
        if last:
            self.outputs.append(output)
        self.enqueue(self.plan.pop(0)(output))
        return await super().get_response(system_instructions, input, *args, **kwargs)


def session_id(output: str) -> int:
    found = re.search(r"Process running with session ID (\d+)", output)
    assert found, f"no running session in the tool output:\n{output}"
    return int(found.group(1))


def run_following(server: Any, session_name: str, model: FollowingModel) -> Any:
    agent = SandboxAgent(name="kb", instructions="Use the shell.", model=model)

    async def main() -> Any:
        client = KernelboxSandboxClient(server.url, server.token())
        options = KernelboxSandboxClientOptions(session_name=session_name)
        config = RunConfig(sandbox=SandboxRunConfig(client=client, options=options))
        try:
            return await Runner.run(agent, "go", run_config=config)
        finally:
            await client.aclose()

    return asyncio.run(main())


def test_a_command_past_its_yield_time_keeps_running_and_is_polled(
    server: Any, session_name: str
) -> None:
    """`yield_time_ms` is how long to wait for output, not a timeout: `sleep 3` with 500 ms
    comes back running with a session id, and a later `write_stdin` poll gets `done` and the
    exit code."""
    model = FollowingModel([
        lambda _: [function_call("exec_command", {"cmd": "echo begun; sleep 3; echo done; exit 4",
                                                  "yield_time_ms": 500}, call_id="c1")],
        lambda out: [function_call("write_stdin", {"session_id": session_id(out), "chars": "",
                                                   "yield_time_ms": 30_000}, call_id="c2")],
        lambda _: [assistant_message("finished")],
    ])  # fmt: skip
    result = run_following(server, session_name, model)
    assert result.final_output == "finished"
    started, polled = model.outputs
    assert "Process running with session ID" in started and "Process exited" not in started
    assert "done" not in started, started
    assert "Process exited with code 4" in polled and "Process running" not in polled, polled
    # Each line reached the model once, in order, across the two calls.
    text = started.split("Output:", 1)[1] + polled.split("Output:", 1)[1]
    assert re.findall(r"begun|done", text) == ["begun", "done"], (started, polled)


def test_an_interactive_read_gets_what_a_later_call_writes(server: Any, session_name: str) -> None:
    """With `tty=true` the process's stdin stays open: a `read` waits for the line a later
    `write_stdin` sends, and a second poll after it ended is refused as an unknown session."""
    model = FollowingModel([
        lambda _: [function_call("exec_command", {"cmd": "printf 'name? '; read n; echo hi $n",
                                                  "tty": True, "yield_time_ms": 500},
                                 call_id="c1")],
        lambda out: [function_call("write_stdin", {"session_id": session_id(out),
                                                   "chars": "kernelbox\n",
                                                   "yield_time_ms": 30_000}, call_id="c2")],
        lambda _: [assistant_message("greeted")],
    ])  # fmt: skip
    result = run_following(server, session_name, model)
    assert result.final_output == "greeted"
    asked, answered = model.outputs
    assert "name?" in asked and "Process running with session ID" in asked, asked
    assert "hi kernelbox" in answered and "Process exited with code 0" in answered, answered


def test_ctrl_c_interrupts_a_running_session(server: Any, session_name: str) -> None:
    model = FollowingModel([
        lambda _: [function_call("exec_command", {"cmd": "sleep 300", "tty": True,
                                                  "yield_time_ms": 300}, call_id="c1")],
        lambda out: [function_call("write_stdin", {"session_id": session_id(out),
                                                   "chars": "\u0003",
                                                   "yield_time_ms": 30_000}, call_id="c2")],
        lambda _: [assistant_message("stopped")],
    ])  # fmt: skip
    result = run_following(server, session_name, model)
    assert result.final_output == "stopped"
    assert "Process exited with code 130" in model.outputs[1], model.outputs[1]
