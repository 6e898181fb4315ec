"""LlamaIndex's own `CodeActAgent` workflow, with a scripted LLM (no network LLM), running the
model's code through `KernelboxCodeExecutor.execute` on a real server: a tool defined in the
kernel from its source, state kept between steps, an error fed back to the model."""

from __future__ import annotations

import asyncio
from typing import Any, Iterator, List

from llama_index.core.agent.workflow import CodeActAgent
from llama_index.core.base.llms.types import (
    CompletionResponse,
    CompletionResponseGen,
    LLMMetadata,
)
from llama_index.core.llms import CustomLLM
from llama_index.core.llms.callbacks import llm_completion_callback

from kernelbox_client import Client
from kernelbox_client.adapters.llama_index import KernelboxCodeExecutor


def add_one(n: int) -> int:
    """Adds one to a number."""
    return n + 1


class Scripted(CustomLLM):  # type: ignore[misc]
    """Answers each step with the next scripted reply, and records the prompts it was shown."""

    replies: List[str]
    seen: List[str] = []

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="scripted")

    @llm_completion_callback()  # type: ignore[misc]
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        self.seen.append(prompt)
        return CompletionResponse(text=self.replies.pop(0))

    @llm_completion_callback()  # type: ignore[misc]
    def stream_complete(
        self, prompt: str, formatted: bool = False, **kwargs: Any
    ) -> CompletionResponseGen:
        response = self.complete(prompt, formatted, **kwargs)

        def gen() -> Iterator[CompletionResponse]:
            yield CompletionResponse(text=response.text, delta=response.text)

        return gen()


def test_a_codeact_agent_runs_its_steps_in_one_kernel(server: Any, session_name: str) -> None:
    llm = Scripted(
        replies=[
            "Start.\n<execute>\nimport os\nx = add_one(41)\nprint('x is', x, os.getcwd())\n</execute>",
            "Fail once.\n<execute>\n1 / 0\n</execute>",
            "Done: x is 42.",
        ],
        seen=[],
    )
    with Client(server.url, server.token()) as client:
        session = client.session(session_name)
        executor = KernelboxCodeExecutor(session, tools=[add_one])
        agent = CodeActAgent(code_execute_fn=executor.execute, tools=[add_one], llm=llm)

        async def go() -> str:
            return str(await agent.run("Add one to 41."))

        answer = asyncio.run(go())
        assert "Done: x is 42." in answer
        assert llm.replies == []
        # The first step's output and the second's error went back to the model.
        assert "x is 42 /work" in llm.seen[1], llm.seen[1]
        assert "ZeroDivisionError" in llm.seen[2], llm.seen[2]
        assert session.run("print(x, add_one(x))").output == "42 43\n"
        session.close()
