"""LangChain deepagents' own agent loop (`create_deep_agent`), with a scripted chat model (no
network LLM), on `KernelboxSandbox` over a real server: `execute` through the commands API,
`write_file` / `read_file` through uploads and the sandbox's own reads, `edit_file`, and the
backend's upload/download directly, errors included."""

from __future__ import annotations

from typing import Any, Iterator, List

from deepagents import create_deep_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage

from kernelbox_client import Client
from kernelbox_client.adapters.deepagents import KernelboxSandbox


class Scripted(GenericFakeChatModel):  # type: ignore[misc]
    """The scripted replies, tools bound or not (the fake model has no tool binding)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> "Scripted":
        return self


def call(name: str, args: dict, i: int) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{i}"}])


def test_a_deep_agent_runs_commands_and_moves_files(server: Any, session_name: str) -> None:
    replies: Iterator[AIMessage] = iter(
        [
            call("write_file", {"file_path": "/work/notes/a.txt", "content": "alpha\nbeta\n"}, 1),
            call("edit_file", {"file_path": "/work/notes/a.txt", "old_string": "beta", "new_string": "gamma"}, 2),
            call("execute", {"command": "cat notes/a.txt; echo err >&2; exit 3"}, 3),
            call("read_file", {"file_path": "/work/notes/a.txt"}, 4),
            call("write_file", {"file_path": "/etc/x", "content": "no"}, 5),
            AIMessage(content="done"),
        ]
    )
    with Client(server.url, server.token()) as client:
        session = client.session(session_name)
        sandbox = KernelboxSandbox(session)
        agent = create_deep_agent(model=Scripted(messages=replies), backend=sandbox)
        state = agent.invoke({"messages": [{"role": "user", "content": "take notes"}]})
        tools = {m.tool_call_id: str(m.content) for m in state["messages"] if isinstance(m, ToolMessage)}
        assert state["messages"][-1].content == "done"
        assert "alpha\ngamma\nerr" in tools["call-3"] and "3" in tools["call-3"], tools["call-3"]
        assert "gamma" in tools["call-4"], tools["call-4"]
        assert "permission_denied" in tools["call-5"], tools["call-5"]
        # The agent's files are the kernel's: a cell reads them.
        assert session.run("print(open('notes/a.txt').read(), end='')").output == "alpha\ngamma\n"
        session.close()


def test_upload_and_download_map_paths_and_errors(server: Any) -> None:
    sandbox = KernelboxSandbox(url=server.url, token=server.token())
    up = sandbox.upload_files([("/work/d/b.bin", b"\x00\xff"), ("rel.txt", b"r"), ("/tmp/x", b"x")])
    assert [u.error for u in up] == [None, None, "permission_denied"]
    down = sandbox.download_files(["/work/d/b.bin", "rel.txt", "/work/missing", "/etc/passwd"])
    got: List[Any] = [(d.content, d.error) for d in down]
    assert got == [(b"\x00\xff", None), (b"r", None), (None, "file_not_found"), (None, "permission_denied")]
    r = sandbox.execute("sleep 30", timeout=1)
    assert r.exit_code is None and "timed out" in r.output
    assert sandbox.id.startswith("deepagents-")
    sandbox.close()
