"""Every refusal is a typed `KernelboxError` carrying the server's code and message; transport
failures are clear `Timeout` / `ConnectionFailed` errors."""

from __future__ import annotations

import socket
import threading
from pathlib import Path
from typing import Iterator

import pytest

from conftest import Server, start_server, stop_and_check
from kernelbox_client import (
    BadRequest,
    Client,
    ConnectionFailed,
    KernelboxError,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    ServerError,
    Timeout,
    Unauthorized,
)
from kernelbox_client import _wire


def test_a_wrong_token_is_unauthorized(server: Server, session_name: str) -> None:
    with Client(server.url, "not-a-token") as c:
        with pytest.raises(Unauthorized) as e:
            c.session(session_name).run("pass")
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    assert e.value.message == "a valid `Authorization: Bearer TOKEN` header is required"
    assert isinstance(e.value, KernelboxError)
    assert server.containers(f"io.kernelbox.session={session_name}") == []


def test_a_bad_timeout_is_a_bad_request_with_the_servers_message(
    client: Client, session_name: str
) -> None:
    for bad in (0, -1, 1e300, 4000):
        with pytest.raises(BadRequest) as e:
            client.session(session_name).run("pass", timeout=bad)
        assert (e.value.status, e.value.code) == (400, "invalid_timeout")
        assert e.value.message.startswith("timeout ")
        assert e.value.message.endswith("is not a number of seconds in (0, 3600]")


def test_a_bad_session_name_is_a_bad_request(client: Client) -> None:
    for name in ("has space", "a::b", "x" * 129, "../etc"):
        with pytest.raises(BadRequest) as e:
            client.session(name).run("pass")
        assert e.value.code in ("invalid_name", "invalid_path"), e.value


def test_a_body_over_the_limit_is_payload_too_large(client: Client, session_name: str) -> None:
    with pytest.raises(PayloadTooLarge) as e:
        client.session(session_name).run("#" * (1024 * 1024 + 1))
    assert (e.value.status, e.value.code) == (413, "payload_too_large")
    assert "1048576" in e.value.message


def test_a_wrong_base_url_is_not_found(server: Server, session_name: str) -> None:
    with Client(server.url + "/api", server.token()) as c:
        with pytest.raises(NotFound) as e:
            c.session(session_name).run("pass")
    assert (e.value.status, e.value.code) == (404, "not_found")
    assert e.value.message == f"no route for POST /api/v1/sessions/{session_name}/execute"


def test_a_tenant_at_its_cap_is_rate_limited_with_retry_after(
    server: Server, session_name: str
) -> None:
    """Tenant `tiny` may hold one kernel; while it runs a cell, a second session cannot
    evict it and is refused 429 `at_capacity`."""
    started = threading.Event()
    with Client(server.url, server.token("tiny")) as c:
        busy = c.session(session_name + "-busy")
        results = []

        def hold() -> None:
            results.append(
                busy.run(
                    "import time\nprint('holding', flush=True)\ntime.sleep(60)",
                    on_output=lambda _: started.set(),
                )
            )

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert started.wait(timeout=60), "the holding cell never started"
            with pytest.raises(RateLimited) as e:
                c.session(session_name + "-second").run("pass")
            assert (e.value.status, e.value.code, e.value.retry_after) == (429, "at_capacity", 1)
            assert "tiny" in e.value.message
        finally:
            busy.interrupt()
            t.join(timeout=60)
        assert results and results[0].status == "interrupted"
        busy.close()


@pytest.fixture
def one_connection_server(tmp_path: Path) -> Iterator[Server]:
    s = start_server(tmp_path, "--max-connections", "1")
    yield s
    stop_and_check(s)


def test_a_server_at_its_connection_limit_is_a_server_error(one_connection_server: Server) -> None:
    s = one_connection_server
    host, port = s.url.removeprefix("http://").split(":")
    # One kept-alive connection, answered once with a token, holds the only slot (one that
    # never authenticated would give it up to the next connection).
    with socket.create_connection((host, int(port)), timeout=10) as held:
        held.sendall(
            f"GET /v1/kernels HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {s.token()}\r\n\r\n".encode()
        )
        assert held.recv(4096).startswith(b"HTTP/1.1 200")
        with Client(s.url, s.token()) as c:
            with pytest.raises(ServerError) as e:
                c.kernels()
    assert (e.value.status, e.value.code, e.value.retry_after) == (503, "too_many_connections", 1)


def test_an_unreachable_server_is_a_clear_connection_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "t") as c:
        with pytest.raises(ConnectionFailed) as e:
            c.kernels()
    assert e.value.code == "connection_failed" and e.value.status is None
    assert f"could not connect to kernelbox at GET http://127.0.0.1:{port}/v1/kernels: " in str(
        e.value
    )


def test_a_server_that_never_answers_is_a_clear_timeout() -> None:
    # A listening socket nobody reads: the connection opens, no answer ever comes.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = "http://127.0.0.1:%d" % silent.getsockname()[1]
        with Client(url, "t", timeout=0.5) as c:
            with pytest.raises(Timeout) as e:
                c.kernels()
            assert str(e.value) == (
                f"timeout: timed out waiting for an answer from kernelbox at GET {url}/v1/kernels"
            )
            with pytest.raises(Timeout) as e:
                # A run waits for its cell's timeout plus the client's before giving up.
                c.session("s").run("pass", timeout=0.5)
            assert "the cell may still be running (session.interrupt() stops it)" in str(e.value)


def test_a_connection_closed_after_the_request_was_read_never_runs_a_cell_twice() -> None:
    """A server that reads each request whole, counts it, then closes without answering: the
    client cannot tell this from a kept-alive connection closed idle, so a POST (a cell, a
    command) arrives exactly once; a GET or PUT is sent again once."""
    arrived: dict = {}
    lock = threading.Lock()

    def serve(conn: socket.socket) -> None:
        with conn:
            got = b""
            while b"\r\n\r\n" not in got:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                got += chunk
            head, _, body = got.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            key = " ".join(head.split(b"\r\n")[0].decode().split(" ")[:2])
            with lock:
                arrived[key] = arrived.get(key, 0) + 1

    with socket.socket() as closer:
        closer.bind(("127.0.0.1", 0))
        closer.listen(8)

        def accept() -> None:
            while True:
                try:
                    conn, _ = closer.accept()
                except OSError:
                    return
                threading.Thread(target=serve, args=(conn,), daemon=True).start()

        threading.Thread(target=accept, daemon=True).start()
        url = "http://127.0.0.1:%d" % closer.getsockname()[1]
        with Client(url, "t") as c:
            s = c.session("s")
            calls = [
                ("POST /v1/sessions/s/execute", lambda: s.run("x = 1")),
                ("POST /v1/sessions/s/execute", lambda: s.run("x = 1", on_output=print)),
                ("POST /v1/sessions/s/commands", lambda: s.commands.run("true")),
                ("GET /v1/sessions/s/settings", lambda: s.settings()),
            ]
            for line, call in calls:
                arrived.clear()
                with pytest.raises(ConnectionFailed):
                    call()
                assert arrived == {line: 1 if line.startswith("POST") else 2}, line
        closer.shutdown(socket.SHUT_RDWR)


def test_a_streams_error_event_raises_the_typed_error() -> None:
    reader = _wire.StreamReader()
    assert reader.feed('{"event":"output","data":"a","stream":"stdout"}') == ("stdout", "a")
    with pytest.raises(RateLimited) as e:
        reader.feed('{"event":"error","error":{"code":"session_busy","message":"busy"}}')
    assert (e.value.code, e.value.message, e.value.status) == ("session_busy", "busy", None)
    with pytest.raises(ServerError):
        _wire.StreamReader().feed(
            '{"event":"error","error":{"code":"kernel_unavailable","message":"m"}}'
        )


def test_a_stream_cut_before_its_result_is_a_connection_error() -> None:
    reader = _wire.StreamReader()
    reader.feed('{"event":"output","data":"a"}')
    with pytest.raises(ConnectionFailed) as e:
        reader.finish()
    assert e.value.code == "stream_ended"


def test_refusals_in_a_row_on_kept_alive_connections_stay_typed(server: Server) -> None:
    """The server may close a kept-alive connection after refusing a request whose body it
    did not read; the next call on it must still get its answer, not a broken connection."""
    with Client(server.url, "wrong") as c:
        seen = set()
        for _ in range(500):
            try:
                c.session("s").run("1")
            except KernelboxError as e:
                seen.add((type(e).__name__, e.code))
    assert seen == {("Unauthorized", "unauthorized")}
