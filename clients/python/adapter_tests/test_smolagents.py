"""smolagents' own `CodeAgent` loop, with a scripted model (no network LLM), running its code
actions through `KernelboxExecutor` on a real server: state kept between steps, a tool sent as
source and called in the kernel, an error fed back to the model, `final_answer`."""

from __future__ import annotations

from io import StringIO
import uuid
from typing import Any, List

from rich.console import Console

from smolagents import CodeAgent, Tool
from smolagents.utils import AgentError
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.monitoring import AgentLogger, LogLevel, TokenUsage

from kernelbox_client import Client
from kernelbox_client.adapters.smolagents import KernelboxExecutor


class AddOne(Tool):  # type: ignore[misc]
    name = "add_one"
    description = "Adds one to a number."
    inputs = {"n": {"type": "integer", "description": "the number"}}
    output_type = "integer"

    def forward(self, n: int) -> int:
        return n + 1


class Scripted(Model):  # type: ignore[misc]
    """Answers each step with the next scripted reply, and records what it was shown."""

    def __init__(self, replies: List[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)
        self.seen: List[str] = []

    def generate(self, messages: Any, stop_sequences: Any = None, **kwargs: Any) -> ChatMessage:
        self.seen.append(str(messages[-1]))
        return ChatMessage(
            role=MessageRole.ASSISTANT,
            content=self.replies.pop(0),
            token_usage=TokenUsage(input_tokens=0, output_tokens=0),
        )


def test_a_code_agent_runs_its_steps_in_one_kernel(server: Any, session_name: str) -> None:
    model = Scripted(
        [
            "Thought: start.\n<code>\nimport os\nx = add_one(41)\nprint('x is', x, os.getcwd())\n</code>",
            "Thought: fail once.\n<code>\n1 / 0\n</code>",
            "Thought: done.\n<code>\nfinal_answer({'x': x, 'host': os.uname().nodename != ''})\n</code>",
        ]
    )
    with Client(server.url, server.token()) as client:
        session = client.session(session_name)
        executor = KernelboxExecutor(["json", "math.*"], session=session)
        agent = CodeAgent(tools=[AddOne()], model=model, executor=executor, max_steps=5)
        answer = agent.run("Add one to 41.")
        assert answer == {"x": 42, "host": True}
        assert model.replies == []
        # The second step's error went back to the model, kernelbox's traceback with it, once
        # (as smolagents' E2B executor sends it: the logs, then the error).
        error = model.seen[2]
        assert error.count("ZeroDivisionError: division by zero") == 1, error
        assert error.count("Traceback (most recent call last)") == 1, error
        assert error.count("Executing code yielded an error:") == 1, error
        assert "x is 42 /work" in model.seen[1], model.seen[1]
        # The steps ran in the session's kernel: its state is there.
        assert session.run("print(x)").output == "42\n"
        session.close()


def test_the_executor_makes_and_disposes_of_its_own_session(server: Any) -> None:
    executor = KernelboxExecutor(url=server.url, token=server.token())
    out = executor("y = 6 * 7\ny")
    assert (out.output, out.is_final_answer) == ("42", False)
    name = executor.session.name
    executor.cleanup()
    with Client(server.url, server.token()) as client:
        assert client.session(name).close() == 0, "cleanup() left the kernel"


def test_with_no_network_the_tools_packages_are_not_pip_installed_and_nothing_prints_at_off(
    server: Any, session_name: str, capsys: Any
) -> None:
    """The final answer tool's source mentions numpy and PIL, which the kernel lacks: on a
    tenant without egress the executor asks the kernel, finds no network and runs no pip (a
    pip run would fail and say so); the skip is a DEBUG message on the executor's logger, so a
    logger at OFF prints nothing of it."""

    def run(level: LogLevel, name: str) -> str:
        text = StringIO()
        logger = AgentLogger(level=level, console=Console(file=text, width=200))
        model = Scripted(["Thought: done.\n<code>\nfinal_answer(add_one(1))\n</code>"])
        with Client(server.url, server.token()) as client:
            session = client.session(name)
            executor = KernelboxExecutor(session=session, logger=logger)
            agent = CodeAgent(
                tools=[AddOne()], model=model, executor=executor, verbosity_level=LogLevel.OFF
            )
            assert agent.run("Add one to 1.") == 2
            session.close()
        return text.getvalue()

    debug = run(LogLevel.DEBUG, session_name)
    assert "kernelbox: numpy pillow not installed: the kernel has no network" in debug, debug
    assert "pip failed" not in debug, debug
    assert run(LogLevel.OFF, session_name + "-off") == ""
    assert "kernelbox" not in capsys.readouterr().out


def test_a_package_asked_for_that_the_kernel_cannot_get_fails_at_once(server: Any) -> None:
    with Client(server.url, server.token()) as client:
        session = client.session(f"asked-{uuid.uuid4().hex[:6]}")
        try:
            KernelboxExecutor(["numpy"], session=session)
            raise AssertionError("no error")
        except AgentError as e:
            assert "numpy not installed: the kernel has no network" in str(e), str(e)
        finally:
            session.close()
