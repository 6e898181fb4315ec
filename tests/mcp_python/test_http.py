"""`/v1/mcp` on `kernelbox serve` (streamable HTTP), driven by the official Python MCP SDK and
by plain HTTP requests where a test needs the status codes or the session id."""

from __future__ import annotations

import threading
import time

import anyio
import httpx2
import pytest

from conftest import docker_ids, start_server, stop_and_check, wait_for
from helpers import ACCEPT, RawSession, http_client, sse_messages, text


def kernels(server, tenant="main"):
    r = httpx2.get(f"{server.url}/v1/kernels",
                   headers={"Authorization": f"Bearer {server.tokens[tenant]}"})  # fmt: skip
    return r.json()["kernels"]


def metrics_text(server, tenant="main") -> str:
    """`/metrics`, asked for with a tenant's token (docs/http-api.md, "Metrics")."""
    r = httpx2.get(f"{server.url}/metrics",
                   headers={"Authorization": f"Bearer {server.tokens[tenant]}"})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.text


def mcp_sessions(server) -> int:
    """The `kernelbox_mcp_sessions` gauge."""
    for line in metrics_text(server).splitlines():
        if line.startswith("kernelbox_mcp_sessions "):
            return int(line.split()[1])
    raise AssertionError("no kernelbox_mcp_sessions gauge in /metrics")


def file_bytes(server) -> dict:
    """`kernelbox_file_bytes_total` by direction."""
    out = {}
    for line in metrics_text(server).splitlines():
        if line.startswith("kernelbox_file_bytes_total{"):
            direction = line.split('direction="', 1)[1].split('"', 1)[0]
            out[direction] = int(line.split()[1])
    assert set(out) == {"upload", "download"}, out
    return out


def test_http_file_tools_count_in_the_file_bytes_metric(server, session_name):
    """The MCP file tools move bytes as the file API does, and `/metrics` counts them the same
    (the tests of a module run one at a time, so nothing else moves files meanwhile)."""
    content = "0123456789" * 1000

    async def go():
        async with http_client(f"{server.mcp}?session={session_name}", server.tokens["main"]) as c:
            before = file_bytes(server)
            wrote = await c.call_tool("write_file", {"path": "m.txt", "content": content})
            written = file_bytes(server)
            read = await c.call_tool("read_file", {"path": "m.txt"})
            return before, wrote, written, read, file_bytes(server)

    before, wrote, written, read, after = anyio.run(go)
    assert wrote.is_error is False and read.is_error is False, (text(wrote), text(read))
    assert written == {"upload": before["upload"] + 10_000, "download": before["download"]}
    assert after == {"upload": written["upload"], "download": written["download"] + 10_000}
    r = httpx2.delete(f"{server.url}/v1/sessions/{session_name}",
                      headers={"Authorization": f"Bearer {server.tokens['main']}"})  # fmt: skip
    assert r.status_code == 200, r.text


def test_http_a_missing_or_wrong_token_is_refused(server):
    init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}}  # fmt: skip
    for auth in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Bearer {server.tokens['main']}x"}):
        r = httpx2.post(server.mcp, json=init, headers={"Accept": ACCEPT, **auth})
        assert r.status_code == 401, r.text
        assert r.json()["error"]["code"] == "unauthorized"

    async def go():
        async with http_client(server.mcp, "wrong") as c:
            await c.list_tools()

    # The SDK's client fails to connect (it does not surface the status: the raw requests above
    # check the 401 itself).
    with pytest.raises(BaseException) as refused:
        anyio.run(go)
    assert "MCPError" in repr(refused.value), repr(refused.value)


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_http_lists_execute_code(server, mode):
    async def go():
        async with http_client(server.mcp, server.tokens["main"], mode=mode) as c:
            return (await c.list_tools()).tools

    assert sorted(t.name for t in anyio.run(go)) == ["execute_code", "list_files", "read_file", "run_command", "write_file"]


def test_http_an_mcp_session_shares_state_and_its_kernel_goes_when_it_ends(server):
    async def go():
        async with http_client(server.mcp, server.tokens["main"], mode="legacy") as c:
            await c.call_tool("execute_code", {"code": "x = 41"})
            second = await c.call_tool("execute_code", {"code": "print(x + 1)"})
            failed = await c.call_tool("execute_code", {"code": "1 / 0"})
            during = kernels(server)
            mine = [k for k in during if k["session"].startswith("mcp-")]
            assert len(mine) == 1, during
            # A kernel from the warm pool carries its owner in its name, not its labels: the
            # engine is asked by container id.
            assert mine[0]["id"] in docker_ids(server.label)
            return second, failed, mine[0]["session"], mine[0]["id"]

    second, failed, session, kernel_id = anyio.run(go)
    assert second.is_error is False and text(second) == "42\n"
    assert failed.is_error is True and "ZeroDivisionError: division by zero" in text(failed)
    # The SDK ends its MCP session (DELETE) on exit: the kernel goes with it.
    wait_for("the MCP session's kernel is removed", lambda: kernel_id not in docker_ids(server.label))
    assert not [k for k in kernels(server) if k["session"] == session]


@pytest.mark.parametrize("how", ["query", "header"])
def test_http_a_named_session_is_shared_with_the_http_api(server, session_name, how):
    url = f"{server.mcp}?session={session_name}" if how == "query" else server.mcp
    headers = {"Kernelbox-Session": session_name} if how == "header" else {}
    token = server.tokens["main"]

    async def go():
        # `auto` negotiates protocol 2026-07-28, which has no MCP sessions.
        async with http_client(url, token, mode="auto", headers=headers) as c:
            await c.call_tool("execute_code", {"code": "x = 41"})
            return await c.call_tool("execute_code", {"code": "print(x + 1)"})

    assert text(anyio.run(go)) == "42\n"
    auth = {"Authorization": f"Bearer {token}"}
    r = httpx2.post(f"{server.url}/v1/sessions/{session_name}/execute", json={"code": "print(x)"},
                    headers=auth, timeout=60)  # fmt: skip
    assert r.json()["output"] == "41\n", r.text
    assert httpx2.delete(f"{server.url}/v1/sessions/{session_name}", headers=auth).status_code == 200


@pytest.mark.parametrize("mode", ["auto", "2026-07-28"])
def test_http_a_sessionless_client_naming_no_session_runs_in_the_tenants_default_session(server, mode):
    """The bare endpoint, as README shows it, with the SDK's default (session-less) protocol:
    calls share the tenant's session `mcp-default`, which is the HTTP API's session of that
    name and outlives the connection; another tenant's default session is its own."""
    token = server.tokens["main"]
    auth = {"Authorization": f"Bearer {token}"}

    async def go(code):
        async with http_client(server.mcp, token, mode=mode) as c:
            return await c.call_tool("execute_code", {"code": code})

    try:
        first = anyio.run(go, "x = 41")
        second = anyio.run(go, "print(x + 1)")
        assert first.is_error is False, text(first)
        assert second.is_error is False and text(second) == "42\n", text(second)
        r = httpx2.post(f"{server.url}/v1/sessions/mcp-default/execute", json={"code": "print(x)"},
                        headers=auth, timeout=60)  # fmt: skip
        assert r.json()["output"] == "41\n", r.text
        assert [k["session"] for k in kernels(server)].count("mcp-default") == 1
        assert not [k for k in kernels(server, "other") if k["session"] == "mcp-default"]
    finally:
        httpx2.delete(f"{server.url}/v1/sessions/mcp-default", headers=auth)


def test_http_another_tenant_cannot_reach_an_mcp_session(server):
    raw = RawSession(server.mcp, server.tokens["main"])
    assert raw.initialize().status_code == 200
    assert raw.call("x = 1")["isError"] is False
    stolen = raw.request("tools/call", {"name": "execute_code", "arguments": {"code": "print(x)"}},
                         token=server.tokens["other"])  # fmt: skip
    assert stolen.status_code == 404, stolen.text
    assert stolen.json()["error"]["code"] == "not_found"
    assert kernels(server, "other") == []
    assert raw.call("print(x)")["content"][0]["text"] == "1\n"
    assert raw.http.delete(server.mcp, headers=raw.headers()).status_code < 300


def test_http_sessions_are_capped_per_tenant_and_end_when_idle_with_their_kernel_and_stream(tmp_path):
    # A session's idle timeout is never below the longest cell plus 10 seconds: keep cells short.
    server = start_server(tmp_path, "--mcp-idle-timeout", "3s", "--mcp-max-sessions", "1",
                          "--timeout", "1s", "--max-timeout", "1s")  # fmt: skip
    try:
        first = RawSession(server.mcp, server.tokens["main"])
        assert first.initialize().status_code == 200
        assert first.call("x = 1")["isError"] is False
        # One more MCP session for the same tenant is refused; another tenant still gets one.
        second = RawSession(server.mcp, server.tokens["main"]).initialize()
        assert second.status_code == 429, second.text
        assert second.json()["error"]["code"] == "at_capacity"
        assert second.headers["retry-after"] == "1"
        assert RawSession(server.mcp, server.tokens["other"]).initialize().status_code == 200
        metrics = metrics_text(server)
        assert mcp_sessions(server) == 2
        assert 'kernelbox_requests_rejected_total{reason="mcp_sessions"} 1\n' in metrics
        # The session's event stream (GET) lasts no longer than the session: idle for 3 s, the
        # session ends, and so do its stream and its kernel.
        started = time.monotonic()
        with first.http.stream("GET", server.mcp, headers=first.headers(), timeout=30) as stream:
            assert stream.status_code == 200
            for _ in stream.iter_bytes():
                pass
        assert time.monotonic() - started < 30
        wait_for("the idle session's kernel is removed", lambda: kernels(server) == [])
        wait_for("its container is removed", lambda: server.containers("io.kernelbox.tenant=main") == [])
        gone = first.request("tools/list", {})
        assert gone.status_code == 404, gone.text
        wait_for("the gauge counts the ended session out", lambda: mcp_sessions(server) < 2)
        # Its place is free again.
        assert RawSession(server.mcp, server.tokens["main"]).initialize().status_code == 200
    finally:
        stop_and_check(server)


def test_http_the_sse_messages_helper_reads_json_and_sse():
    assert sse_messages('{"a": 1}') == [{"a": 1}]
    assert sse_messages('id: 0\nretry: 3000\ndata:\n\ndata: {"b": 2}\n\n') == [{"b": 2}]


def test_http_an_open_event_stream_does_not_hold_the_shutdown(tmp_path):
    server = start_server(tmp_path)
    raw = RawSession(server.mcp, server.tokens["main"])
    assert raw.initialize().status_code == 200
    assert raw.call("x = 1")["isError"] is False
    opened = threading.Event()
    ended = threading.Event()

    def listen():
        with raw.http.stream("GET", server.mcp, headers=raw.headers(), timeout=120) as stream:
            opened.set()
            try:
                for _ in stream.iter_bytes():
                    pass
            except httpx2.HTTPError:
                pass
        ended.set()

    threading.Thread(target=listen, daemon=True).start()
    assert opened.wait(30)
    started = time.monotonic()
    # The drain deadline is 30 s; the stream must not make the server wait for it.
    stop_and_check(server)
    assert time.monotonic() - started < 15, time.monotonic() - started
    assert ended.wait(10)


def test_http_a_cell_running_past_the_idle_timeout_does_not_end_its_session(tmp_path):
    server = start_server(tmp_path, "--mcp-idle-timeout", "1s", "--timeout", "5s", "--max-timeout", "5s")
    try:
        raw = RawSession(server.mcp, server.tokens["main"])
        assert raw.initialize().status_code == 200
        assert raw.call("x = 5")["isError"] is False
        slow = raw.call("import time\ntime.sleep(3)\nprint(x)")
        assert slow["isError"] is False and slow["content"][0]["text"] == "5\n", slow
    finally:
        stop_and_check(server)


def test_http_an_image_the_cell_displays_is_image_content(server, session_name):
    png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="

    async def go():
        async with http_client(f"{server.mcp}?session={session_name}", server.tokens["main"]) as c:
            return await c.call_tool("execute_code", {"code": f"display({{'image/png': {png!r}}}, raw=True)"})

    result = anyio.run(go)
    assert result.is_error is False
    assert [(c.type, c.mime_type, c.data) for c in result.content if c.type == "image"] == [("image", "image/png", png)]
    auth = {"Authorization": f"Bearer {server.tokens['main']}"}
    assert httpx2.delete(f"{server.url}/v1/sessions/{session_name}", headers=auth).status_code == 200
