"""`session.set_network(allow=..., deny=...)` and `run(network=...)` against a real
`kernelbox serve` whose tenants file gives tenant `net` a network policy and `plain` none
(docs/reliability.md, "Network egress")."""

from __future__ import annotations

import asyncio
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator, Tuple

import pytest

from conftest import Server, kernelbox_serve, stop_and_check
from kernelbox_client import BadRequest, Client

FETCH = """
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://127.0.0.1:%d/", timeout=15).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode().strip())
"""


class Hello(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = b"hello"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def net_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[Server, int]]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    port = httpd.server_address[1]
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    tenants = {
        "net": {"max_kernels": 2, "network": {"allow": ["127.0.0.1:%d" % port]}},
        "plain": {"max_kernels": 2},
    }
    case = f"pyclient-net-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(tmp_path_factory.mktemp("net"), case, tenants, "--pool", "0")
    yield s, port
    stop_and_check(s)
    httpd.shutdown()
    httpd.server_close()


def test_set_network_narrows_the_tenants_policy_at_once(net_server: Tuple[Server, int]) -> None:
    server, port = net_server
    with Client(server.url, server.token("net")) as c:
        s = c.session("narrow")
        assert s.run(FETCH % port).output == "hello\n"
        assert s.set_network(allow=["example.com"]) == 0
        assert "refused (not_allowed)" in s.run(FETCH % port).output
        out = s.run(FETCH % port, network={"allow": ["127.0.0.1:%d" % port], "deny": []}).output
        assert out == "hello\n"
        with pytest.raises(BadRequest) as e:
            s.set_network(allow=["not a host"])
        assert e.value.code == "invalid_network"
        assert "not a host" in e.value.message
        with pytest.raises(TypeError):
            s.set_network(allow="pypi")
        s.close()


def test_a_tenant_without_network_cannot_set_one(net_server: Tuple[Server, int]) -> None:
    server, _ = net_server
    with Client(server.url, server.token("plain")) as c:
        s = c.session("plain")
        with pytest.raises(BadRequest) as e:
            s.set_network(allow=["pypi"])
        assert e.value.code == "network_not_allowed"
        # Not even a deny-only policy is kept for it; a policy with no entry changes nothing.
        with pytest.raises(BadRequest) as e:
            s.set_network(allow=[], deny=["pypi"])
        assert e.value.code == "network_not_allowed"
        assert s.set_network(allow=[]) == 0


def test_the_async_session_sets_its_network_too(net_server: Tuple[Server, int]) -> None:
    from kernelbox_client import AsyncClient

    server, port = net_server

    async def main() -> None:
        async with AsyncClient(server.url, server.token("net")) as c:
            s = c.session("async")
            assert await s.set_network(allow=["127.0.0.1:%d" % port]) == 0
            assert (await s.run(FETCH % port)).output == "hello\n"
            await s.close()

    asyncio.run(main())
