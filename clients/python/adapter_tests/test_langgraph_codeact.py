"""LangGraph CodeAct's own graph (`create_codeact`), with a scripted chat model (no network
LLM), running the model's code through `KernelboxEval` on a real server: a tool defined in the
kernel from its source, state kept between steps, an error fed back to the model."""

from __future__ import annotations

from typing import Any

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langgraph_codeact import create_codeact

from kernelbox_client import Client
from kernelbox_client.adapters.langgraph_codeact import KernelboxEval


def add_one(n: int) -> int:
    """Adds one to a number."""
    return n + 1


def test_a_codeact_graph_runs_its_steps_in_one_kernel(server: Any, session_name: str) -> None:
    model = FakeListChatModel(
        responses=[
            "Start.\n```python\nimport os\nx = add_one(41)\nprint('x is', x, os.getcwd())\n```",
            "Fail once.\n```python\n1 / 0\n```",
            "Done: x is 42.",
        ]
    )
    with Client(server.url, server.token()) as client:
        session = client.session(session_name)
        graph = create_codeact(model, [add_one], KernelboxEval(session)).compile()
        state = graph.invoke({"messages": [{"role": "user", "content": "Add one to 41."}]})
        said = [m.content for m in state["messages"]]
        assert said[-1] == "Done: x is 42."
        # The first step's output and the second's error went back to the model as its input.
        assert "x is 42 /work" in said[2], said
        assert "ZeroDivisionError" in said[4], said
        # The steps ran in the session's kernel, the tool defined there: its state is there.
        assert session.run("print(x, add_one(x))").output == "42 43\n"
        session.close()


def test_the_eval_makes_and_disposes_of_its_own_session(server: Any) -> None:
    run = KernelboxEval(url=server.url, token=server.token())
    assert run("y = 6 * 7\ny", {}) == ("42\n", {})
    name = run.session.name
    run.close()
    with Client(server.url, server.token()) as client:
        assert client.session(name).close() == 0, "close() left the kernel"
