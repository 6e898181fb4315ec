"""The file tools (`write_file`, `read_file`, `list_files`) over every backend: `kernelbox mcp`
on local kernels (stdio), `kernelbox mcp --url` through the server's HTTP file API, and
`/v1/mcp` on `kernelbox serve`; driven by the official Python MCP SDK."""

from __future__ import annotations

import base64
import contextlib

import anyio
import httpx2
import pytest

from conftest import new_case
from helpers import http_client, stdio_client, text

BACKENDS = ["stdio", "stdio-url", "http"]

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@contextlib.contextmanager
def connect(backend, server, session_name):
    """A function making the SDK's client for `backend`; a named server session is cleared after."""
    token = server.tokens["main"]
    if backend == "stdio":
        yield lambda: stdio_client(new_case())
    elif backend == "stdio-url":
        yield lambda: stdio_client(server.case, "--url", server.url, "--token", token)
    else:
        yield lambda: http_client(f"{server.mcp}?session={session_name}", token)
        httpx2.delete(f"{server.url}/v1/sessions/{session_name}",
                      headers={"Authorization": f"Bearer {token}"})  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_write_file_then_a_cell_reads_it(server, session_name, backend):
    async def go(client):
        async with client() as c:
            wrote = await c.call_tool("write_file", {"path": "data/in.txt", "content": "héllo\n"})
            binary = await c.call_tool("write_file", {"path": "b.bin", "content_base64": "AP8="})
            ran = await c.call_tool("execute_code", {"code": (
                "print(open('data/in.txt', encoding='utf-8').read(), end='')\n"
                "print(list(open('b.bin', 'rb').read()))")})  # fmt: skip
            return wrote, binary, ran

    with connect(backend, server, session_name) as client:
        wrote, binary, ran = anyio.run(go, client)
    assert wrote.is_error is False, text(wrote)
    assert text(wrote) == "wrote 7 bytes to /work/data/in.txt"
    assert binary.is_error is False, text(binary)
    assert text(ran) == "héllo\n[0, 255]\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_a_cell_writes_files_and_read_file_returns_them(server, session_name, backend):
    async def go(client):
        async with client() as c:
            await c.call_tool("execute_code", {"code": (
                "import base64\n"
                "open('out.txt', 'w').write('x' * 10)\n"
                f"open('p.png', 'wb').write(base64.b64decode({base64.b64encode(PNG).decode()!r}))\n"
                "open('raw.bin', 'wb').write(bytes([0, 255, 1]))\n"
                "open('big.txt', 'w').write('a' * (2 * 1024 * 1024))")})  # fmt: skip
            return [await c.call_tool("read_file", {"path": p})
                    for p in ["out.txt", "p.png", "raw.bin", "big.txt", "missing.txt"]]  # fmt: skip

    with connect(backend, server, session_name) as client:
        out, png, raw, big, missing = anyio.run(go, client)
    assert out.is_error is False and text(out) == "x" * 10
    assert [(c.type, c.mime_type, base64.b64decode(c.data)) for c in png.content] == [
        ("image", "image/png", PNG)
    ]
    assert raw.is_error is False
    assert text(raw).endswith(base64.b64encode(bytes([0, 255, 1])).decode()), text(raw)
    assert big.is_error is False
    assert big.content[0].text == "a" * (256 * 1024)
    assert "is 2097152 bytes; only its first 262144 are shown" in big.content[1].text
    assert missing.is_error is True
    assert "missing.txt" in text(missing), text(missing)


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_list_files_lists_the_working_directory_and_a_subdirectory(server, session_name, backend):
    async def go(client):
        async with client() as c:
            await c.call_tool("execute_code", {"code": (
                "import os\nos.makedirs('sub', exist_ok=True)\n"
                "open('sub/a.txt', 'w').write('abc')\nopen('top.txt', 'w').write('')")})  # fmt: skip
            return (await c.call_tool("list_files", {}),
                    await c.call_tool("list_files", {"path": "sub"}))  # fmt: skip

    with connect(backend, server, session_name) as client:
        root, sub = anyio.run(go, client)
    assert root.is_error is False, text(root)
    names = [line.split("\t")[0] for line in text(root).splitlines()]
    assert "sub/" in names and "top.txt" in names, text(root)
    assert text(sub).splitlines()[0].startswith("a.txt\tfile\t3 bytes\t"), text(sub)


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_a_dotdot_path_is_an_error_result_and_nothing_breaks(server, session_name, backend):
    async def go(client):
        async with client() as c:
            wrote = await c.call_tool("write_file", {"path": "../escape.txt", "content": "x"})
            read = await c.call_tool("read_file", {"path": "a/../../etc/passwd"})
            listed = await c.call_tool("list_files", {"path": ".."})
            after = await c.call_tool("execute_code", {"code": "print(1 + 1)"})
            return wrote, read, listed, after

    with connect(backend, server, session_name) as client:
        wrote, read, listed, after = anyio.run(go, client)
    for r in (wrote, read, listed):
        assert r.is_error is True, text(r)
        assert "invalid path" in text(r) or ".." in text(r), text(r)
    assert text(after) == "2\n"


@pytest.mark.parametrize("backend", BACKENDS)
def test_files_a_file_written_to_a_child_is_seen_by_the_childs_cell_not_the_parents(
    server, session_name, backend
):
    """`child` on the file tools and on execute_code addresses the session's delegated child's
    kernel, as `?child=NAME` does on the HTTP file API and `child` on execute."""
    token = server.tokens["main"]
    auth = {"Authorization": f"Bearer {token}"}
    if backend == "stdio":
        client = lambda: stdio_client(new_case(), "--session", session_name)  # noqa: E731
    elif backend == "stdio-url":
        args = ("--url", server.url, "--token", token, "--session", session_name)
        client = lambda: stdio_client(server.case, *args)  # noqa: E731
    else:
        client = lambda: http_client(f"{server.mcp}?session={session_name}", token)  # noqa: E731
    helper = {"child": "helper"}

    async def go():
        async with client() as c:
            wrote = await c.call_tool("write_file", {"path": "c.txt", "content": "child's", **helper})
            read = await c.call_tool("read_file", {"path": "c.txt", **helper})
            listed = await c.call_tool("list_files", helper)
            parent = await c.call_tool("execute_code", {"code": (
                "import os\nprint(os.path.exists('c.txt'), sorted(os.listdir('.')))")})  # fmt: skip
            parent_read = await c.call_tool("read_file", {"path": "c.txt"})
            parent_list = await c.call_tool("list_files", {})
            bad = await c.call_tool("write_file", {"path": "x", "content": "", "child": "bad::name"})
            # The child's own cell, through execute_code's `child`, reads it.
            child_cell = await c.call_tool("execute_code", {
                "code": "print(open('c.txt').read())", **helper})  # fmt: skip
            bad_cell = await c.call_tool("execute_code", {"code": "1", "child": "bad::name"})
            return wrote, read, listed, parent, parent_read, parent_list, bad, child_cell, bad_cell

    wrote, read, listed, parent, parent_read, parent_list, bad, child_cell, bad_cell = anyio.run(go)
    assert text(wrote) == "wrote 7 bytes to /work/c.txt", text(wrote)
    assert read.is_error is False and text(read) == "child's", text(read)
    assert "c.txt\tfile\t7 bytes\t" in text(listed), text(listed)
    # The session's own kernel (started by the cell) has no such file.
    assert text(parent) == "False ['.kernelbox']\n", text(parent)
    assert parent_read.is_error is True and "c.txt" in text(parent_read), text(parent_read)
    assert "c.txt" not in text(parent_list), text(parent_list)
    assert bad.is_error is True and "bad::name" in text(bad), text(bad)
    assert child_cell.is_error is False and text(child_cell) == "child's\n", text(child_cell)
    assert bad_cell.is_error is True and "bad::name" in text(bad_cell), text(bad_cell)
    if backend != "stdio":
        # The child's own cell, through the HTTP API on the same named session, reads it.
        r = httpx2.post(f"{server.url}/v1/sessions/{session_name}/execute",
                        json={"code": "print(open('c.txt').read())", **helper},
                        headers=auth, timeout=60)  # fmt: skip
        assert r.status_code == 200 and r.json()["output"] == "child's\n", r.text
        r = httpx2.delete(f"{server.url}/v1/sessions/{session_name}", headers=auth)
        assert r.status_code == 200, r.text


def test_files_reading_with_no_kernel_is_an_error_result_saying_files_die_with_it():
    async def go():
        async with stdio_client(new_case()) as c:
            tools = {t.name: t for t in (await c.list_tools()).tools}
            return tools, await c.call_tool("read_file", {"path": "x.txt"})

    tools, read = anyio.run(go)
    for name in ("write_file", "read_file", "list_files"):
        assert "live and die with the kernel" in tools[name].description
    assert set(tools["write_file"].input_schema["properties"]) == {
        "path", "content", "content_base64", "child"
    }
    for name in ("read_file", "list_files"):
        assert "child" in tools[name].input_schema["properties"], tools[name].input_schema
    assert read.is_error is True
    assert "no live kernel" in text(read), text(read)
