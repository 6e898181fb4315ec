"""The OpenAI Agents SDK's own run loop (`Runner` with a `SandboxAgent`), with the SDK's
`ScriptedModel` (no network LLM), on `KernelboxSandboxClient` over a real server: the agent's
`exec_command` runs through the commands API in the kernel's container, the manifest's files are
written through the file API, and the workspace persists and hydrates as a tar."""

from __future__ import annotations

import asyncio
import io
from typing import Any

from agents import Runner
from agents.run import RunConfig
from agents.sandbox import Manifest, SandboxAgent, SandboxRunConfig
from agents.sandbox.entries import File
from agents.testing.model import ScriptedModel, assistant_message, function_call

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
