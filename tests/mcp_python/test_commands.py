"""The `run_command` tool over every backend: `kernelbox mcp` on local kernels (stdio),
`kernelbox mcp --url` through the server's commands API, and `/v1/mcp` on `kernelbox serve`;
driven by the official Python MCP SDK (docs/mcp.md)."""

from __future__ import annotations

import anyio
import pytest

from helpers import text
from test_files import BACKENDS, connect


@pytest.mark.parametrize("backend", BACKENDS)
def test_run_command_beside_the_kernel_streams_apart_and_exit_codes(server, session_name, backend):
    async def go(client):
        async with client() as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            await c.call_tool("execute_code", {"code": "x = 41\nopen('from-cell.txt', 'w').write('cell')"})
            ok = await c.call_tool("run_command", {"command": ["sh", "-c", "cat from-cell.txt; echo; pwd"]})
            failed = await c.call_tool("run_command", {"command": "echo out; echo err >&2; exit 3"})
            given = await c.call_tool("run_command", {
                "command": "cat; echo $K", "cwd": "/tmp", "env": {"K": "v"}, "stdin": "in\n"})
            slow = await c.call_tool("run_command", {"command": "sleep 100 & sleep 100", "timeout": 1})
            after = await c.call_tool("execute_code", {"code": "print(x + 1)"})
            empty = await c.call_tool("run_command", {"command": []})
            return tools, ok, failed, given, slow, after, empty

    with connect(backend, server, session_name) as client:
        tools, ok, failed, given, slow, after, empty = anyio.run(go, client)
    tool = tools["run_command"]
    assert "the Python kernel and its variables are kept" in tool.description
    assert tool.input_schema["required"] == ["command"]
    assert set(tool.input_schema["properties"]) == {"command", "cwd", "env", "stdin", "timeout"}
    assert ok.is_error is False and text(ok) == "exit code 0\nstdout:\ncell\n/work\n", text(ok)
    assert failed.is_error is True
    assert text(failed) == "exit code 3\nstdout:\nout\n\nstderr:\nerr\n", text(failed)
    assert given.is_error is False and text(given) == "exit code 0\nstdout:\nin\nv\n", text(given)
    # A timeout kills the command (and its `sleep 100 &`), not the kernel: `x` is still there.
    assert slow.is_error is True and "the command timed out" in text(slow), text(slow)
    assert after.is_error is False and text(after) == "42\n"
    assert empty.is_error is True and "command" in text(empty), text(empty)
