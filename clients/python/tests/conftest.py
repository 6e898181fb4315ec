"""Fixtures: a real `kernelbox serve` (the cargo-built binary; see
tests/pytest_support/kernelbox_serve.py, shared with tests/mcp_python) on a free loopback port
with a temporary state directory and a tenants file, every container it makes labelled with
this run's case label; at the end it is stopped with SIGTERM and the Docker engine is asked
whether anything with the label is left.

The binary is `target/debug/kernelbox` at the repository's root, or `KERNELBOX_BIN`. A
missing binary or engine fails the run: nothing is skipped.
"""

from __future__ import annotations

import json
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import Server, docker_ids, stop_and_check  # noqa: E402,F401

#: The tenants of the main server: `main` for most tests, `tiny` (one kernel) to hit a cap,
#: `other` to check isolation.
TENANTS = {"main": 8, "tiny": 1, "other": 4}


def start_server(
    tmp: Path, *extra: str, tenants: Dict[str, int] = TENANTS, tools: Optional[dict] = None
) -> Server:
    """`kernelbox serve` with `tenants` (name: max_kernels); `tools` (`{"url", "allow"}`) is
    the `main` tenant's tool endpoint."""
    entries = {
        name: {"max_kernels": cap, **({"tools": tools} if tools and name == "main" else {})}
        for name, cap in tenants.items()
    }
    # No warm pool: these tests find a session's kernel by its owner labels, which a kernel
    # taken from the pool does not carry (its owner is in its name; the pool has its own
    # tests in tests/pool.rs).
    case = f"pyclient-{uuid.uuid4().hex[:8]}"
    return kernelbox_serve.start_server(tmp, case, entries, "--pool", "0", *extra)


class ToolEndpoint:
    """A tenant's tool endpoint on loopback: answers `{"tool", "args"}` back and records
    every call's body."""

    def __init__(self) -> None:
        calls: List[dict] = []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                calls.append(body)
                answer = json.dumps({"tool": body["tool"], "args": body["args"]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: object) -> None:
                pass

        self.calls = calls
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = "http://127.0.0.1:%d/tools" % self.httpd.server_address[1]
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def tool_endpoint() -> Iterator[ToolEndpoint]:
    t = ToolEndpoint()
    yield t
    t.close()


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, tool_endpoint: ToolEndpoint
) -> Iterator[Server]:
    """The main server, shared by the tests (each uses its own session names); tenant `main`
    may call the tools `echo` and `other` at `tool_endpoint`."""
    tools = {"url": tool_endpoint.url, "allow": ["echo", "other"]}
    s = start_server(tmp_path_factory.mktemp("server"), tools=tools)
    yield s
    stop_and_check(s)


@pytest.fixture
def session_name(request: pytest.FixtureRequest) -> str:
    """A session name unique to the test."""
    return f"{request.node.name[:80]}-{uuid.uuid4().hex[:6]}".replace("[", "-").replace("]", "")


@pytest.fixture
def client(server: Server) -> Iterator["object"]:
    from kernelbox_client import Client

    with Client(server.url, server.token()) as c:
        yield c


@pytest.fixture(scope="session")
def spec(server: Server) -> dict:
    """The server's `/openapi.json`."""
    import httpx

    r = httpx.get(server.url + "/openapi.json", timeout=30)
    r.raise_for_status()
    return r.json()
