"""AutoGen's own `CodeExecutorAgent` loop, with a replayed model (no network LLM), running its
code blocks through `KernelboxCodeExecutor` on a real server: Python blocks as cells (state
kept between turns), a shell block through the commands API, a failing block's exit code."""

from __future__ import annotations

import asyncio
from typing import Any

from autogen_agentchat.agents import CodeExecutorAgent
from autogen_agentchat.messages import CodeExecutionEvent
from autogen_core import CancellationToken
from autogen_core.code_executor import CodeBlock
from autogen_ext.models.replay import ReplayChatCompletionClient

from kernelbox_client import Client
from kernelbox_client.adapters.autogen import KernelboxCodeExecutor


def test_a_code_executor_agent_runs_its_turns_in_one_kernel(server: Any, session_name: str) -> None:
    with Client(server.url, server.token()) as client:
        session = client.session(session_name)

        async def go() -> Any:
            async with KernelboxCodeExecutor(session) as executor:
                model = ReplayChatCompletionClient(
                    [
                        "```python\nx = 41 + 1\nprint('x is', x)\n```",
                        "x is 42.",
                        "```sh\necho shell sees $PWD; ls /work >/dev/null\n```",
                        "The shell is in /work.",
                    ]
                )
                agent = CodeExecutorAgent("coder", executor, model_client=model)
                first = [m async for m in agent.run_stream(task="Compute x.")]
                second = [m async for m in agent.run_stream(task="Where is the shell?")]
                failed = await executor.execute_code_blocks(
                    [CodeBlock("print(x)", "python"), CodeBlock("1 / 0", "python"), CodeBlock("print('never')", "python")],
                    CancellationToken(),
                )
                return first, second, failed

        first, second, failed = asyncio.run(go())
        # Each turn's code ran in the kernel, and its output went back into the agent's loop.
        ran = [m.result for m in first if isinstance(m, CodeExecutionEvent)]
        assert [(r.exit_code, r.output) for r in ran] == [(0, "x is 42\n")], first
        ran = [m.result for m in second if isinstance(m, CodeExecutionEvent)]
        assert [(r.exit_code, r.output) for r in ran] == [(0, "shell sees /work\n")], second
        assert failed.exit_code == 1
        assert failed.output.startswith("42\n") and "ZeroDivisionError" in failed.output
        assert "never" not in failed.output
        assert session.run("print(x)").output == "42\n"
        session.close()
