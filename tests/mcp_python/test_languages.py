"""`execute_code` with a `language` over every backend (docs/contract.md, "Languages"): a Bash
cell runs in the session's Bash kernel and a JavaScript cell in its JavaScript kernel, each
one's state kept beside the Python kernel's."""

from __future__ import annotations

import anyio
import pytest

from helpers import text
from test_files import BACKENDS, connect


@pytest.mark.parametrize("backend", BACKENDS)
def test_execute_code_takes_a_language(server, session_name, backend):
    async def go(client):
        async with client() as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            await c.call_tool("execute_code", {"code": "x = 41"})
            await c.call_tool("execute_code", {"code": "y=7; cd /tmp", "language": "bash"})
            sh = await c.call_tool("execute_code", {"code": "echo $y $PWD", "language": "bash"})
            failed = await c.call_tool("execute_code", {"code": "false", "language": "bash"})
            py = await c.call_tool("execute_code", {"code": "print(x + 1)", "language": "python"})
            await c.call_tool("execute_code", {"code": "const z = 6 * 7", "language": "javascript"})
            js = await c.call_tool("execute_code", {"code": "console.log(z)", "language": "javascript"})
            return tools, sh, failed, py, js

    with connect(backend, server, session_name) as client:
        tools, sh, failed, py, js = anyio.run(go, client)
    schema = tools["execute_code"].input_schema
    assert "language" in schema["properties"], schema
    assert sh.is_error is False and text(sh) == "7 /tmp\n", text(sh)
    assert failed.is_error is True and "exit status 1" in text(failed), text(failed)
    assert py.is_error is False and text(py) == "42\n", text(py)
    assert js.is_error is False and text(js) == "42\n", text(js)
