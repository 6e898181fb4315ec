"""`kernelbox mcp` over stdio, driven by the official Python MCP SDK: local kernels, and a
kernelbox server through `--url`."""

from __future__ import annotations

import base64
import subprocess

import anyio
import pytest
import httpx2

from conftest import docker_ids, new_case, wait_for, CASE_KEY
from helpers import stdio_client, text


def test_stdio_lists_execute_code_saying_what_persists_and_what_a_timeout_does():
    async def go():
        async with stdio_client(new_case()) as c:
            return (await c.list_tools()).tools

    tools = anyio.run(go)
    assert sorted(t.name for t in tools) == ["execute_code", "list_files", "read_file", "run_command", "write_file"]
    tool = next(t for t in tools if t.name == "execute_code")
    assert "State persists between calls" in tool.description
    assert "ALL state is lost" in tool.description
    assert tool.input_schema["required"] == ["code"]
    assert set(tool.input_schema["properties"]) == {"code", "language", "reset", "timeout", "child"}


def test_stdio_two_calls_share_state_in_one_kernel_removed_when_the_connection_ends():
    case = new_case()

    async def go():
        async with stdio_client(case) as c:
            first = await c.call_tool("execute_code", {"code": "x = 41"})
            second = await c.call_tool("execute_code", {"code": "print(x + 1)"})
            return first, second, docker_ids(f"{CASE_KEY}={case}")

    first, second, during = anyio.run(go)
    assert first.is_error is False
    assert second.is_error is False
    assert text(second) == "42\n"
    assert len(during) == 1, during
    wait_for("the connection's kernel is removed", lambda: docker_ids(f"{CASE_KEY}={case}") == [])
    assert docker_ids(f"{CASE_KEY}={case}", volumes=True) == []


def test_stdio_a_raised_exception_is_an_error_result_with_its_traceback_and_state_is_kept():
    async def go():
        async with stdio_client(new_case()) as c:
            await c.call_tool("execute_code", {"code": "x = 7"})
            failed = await c.call_tool("execute_code", {"code": "print('before')\n1 / 0"})
            after = await c.call_tool("execute_code", {"code": "print(x)"})
            return failed, after

    failed, after = anyio.run(go)
    assert failed.is_error is True
    body = text(failed)
    assert body.startswith("before\nTraceback (most recent call last):"), body
    assert body.count("ZeroDivisionError: division by zero") == 1, body
    assert after.is_error is False and text(after) == "7\n"


def test_stdio_a_timeout_kills_the_kernel_and_the_next_call_says_its_state_was_lost():
    async def go():
        async with stdio_client(new_case()) as c:
            await c.call_tool("execute_code", {"code": "x = 1"})
            slow = await c.call_tool("execute_code", {"code": "import time\ntime.sleep(60)", "timeout": 1})
            after = await c.call_tool("execute_code", {"code": "print('x' in globals())"})
            return slow, after

    slow, after = anyio.run(go)
    assert slow.is_error is True
    assert "Cell timed out after 1s; the session kernel was killed and its state was lost." in text(slow)
    assert after.is_error is False
    assert text(after) == (
        "[kernelbox] this session's previous kernel was lost (timeout); "
        "the cell ran in a fresh kernel with no earlier state.\nFalse\n"
    )


def test_stdio_a_bad_timeout_is_an_error_result_and_loses_nothing():
    async def go():
        async with stdio_client(new_case()) as c:
            await c.call_tool("execute_code", {"code": "x = 3"})
            bad = await c.call_tool("execute_code", {"code": "x = 4", "timeout": 0})
            after = await c.call_tool("execute_code", {"code": "print(x)"})
            return bad, after

    bad, after = anyio.run(go)
    assert bad.is_error is True
    assert "is not a number of seconds in (0, 3600]" in text(bad), text(bad)
    assert text(after) == "3\n"


def test_stdio_remote_runs_on_the_server_and_its_own_session_goes_at_the_end(server):
    token = server.tokens["main"]
    kernels = lambda: httpx2.get(  # noqa: E731
        f"{server.url}/v1/kernels", headers={"Authorization": f"Bearer {token}"}
    ).json()["kernels"]

    async def go():
        async with stdio_client(server.case, "--url", server.url, "--token", token) as c:
            await c.call_tool("execute_code", {"code": "x = 41"})
            second = await c.call_tool("execute_code", {"code": "print(x + 1)"})
            return second, kernels()

    second, during = anyio.run(go)
    assert text(second) == "42\n"
    assert [k["session"].startswith("mcp-") for k in during] == [True], during
    wait_for("the connection's session is cleared on the server", lambda: kernels() == [])


def test_stdio_remote_named_session_stays_and_is_the_http_api_session(server, session_name):
    token = server.tokens["main"]
    auth = {"Authorization": f"Bearer {token}"}

    async def go():
        args = ("--url", server.url, "--token", token, "--session", session_name)
        async with stdio_client(server.case, *args) as c:
            await c.call_tool("execute_code", {"code": "x = 'kept'"})

    anyio.run(go)
    r = httpx2.post(f"{server.url}/v1/sessions/{session_name}/execute", json={"code": "print(x)"},
                    headers=auth, timeout=60)  # fmt: skip
    assert r.status_code == 200 and r.json()["output"] == "kept\n", r.text
    assert httpx2.delete(f"{server.url}/v1/sessions/{session_name}", headers=auth).status_code == 200


def test_stdio_remote_with_a_wrong_token_is_an_error_result(server):
    async def go():
        async with stdio_client(server.case, "--url", server.url, "--token", "wrong") as c:
            return await c.call_tool("execute_code", {"code": "print(1)"})

    result = anyio.run(go)
    assert result.is_error is True
    assert "401" in text(result) and "Bearer" in text(result), text(result)


def test_stdio_reset_discards_the_state_first():
    async def go():
        async with stdio_client(new_case()) as c:
            await c.call_tool("execute_code", {"code": "x = 1"})
            return await c.call_tool("execute_code", {"code": "print('x' in globals())", "reset": True})

    result = anyio.run(go)
    assert result.is_error is False and text(result) == "False\n", text(result)


#: A 1x1 PNG, base64.
TINY_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
DATASCIENCE = "kernelbox/kernel-datascience:latest"


def test_stdio_an_image_the_cell_displays_is_image_content_and_the_last_value_is_text():
    async def go():
        async with stdio_client(new_case()) as c:
            code = f"print('drawn')\ndisplay({{'image/png': {TINY_PNG!r}, 'text/plain': '<dot>'}}, raw=True)\n6 * 7"
            return await c.call_tool("execute_code", {"code": code})

    result = anyio.run(go)
    assert result.is_error is False
    images = [(c.mime_type, c.data) for c in result.content if c.type == "image"]
    assert images == [("image/png", TINY_PNG)]
    assert text(result) == "drawn\n42"


def test_stdio_a_matplotlib_figure_is_image_content_on_the_datascience_image():
    found = subprocess.run(["docker", "image", "inspect", DATASCIENCE], capture_output=True, timeout=30)
    if found.returncode != 0:
        pytest.skip(f"{DATASCIENCE} is not on the engine")

    async def go():
        async with stdio_client(new_case(), "--image", DATASCIENCE) as c:
            code = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.show()"
            return await c.call_tool("execute_code", {"code": code})

    result = anyio.run(go)
    assert result.is_error is False, text(result)
    images = [c for c in result.content if c.type == "image"]
    assert len(images) == 1 and images[0].mime_type == "image/png"
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
