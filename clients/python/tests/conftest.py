"""Fixtures: a real `kernelbox serve` (the cargo-built binary) on a free loopback port with a
temporary state directory and a tenants file, every container it makes labelled with this
run's case label; at the end it is stopped with SIGTERM and the Docker engine is asked
whether anything with the label is left.

The binary is `target/debug/kernelbox` at the repository's root, or `KERNELBOX_BIN`. A
missing binary or engine fails the run: nothing is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[3]
BIN = Path(os.environ.get("KERNELBOX_BIN") or REPO / "target" / "debug" / "kernelbox")
CASE_KEY = "io.kernelbox-test.case"
#: Seconds a server may take to say where it listens, and to stop after SIGTERM.
START_DEADLINE = 60.0
STOP_DEADLINE = 90.0

#: The tenants of the main server: `main` for most tests, `tiny` (one kernel) to hit a cap,
#: `other` to check isolation.
TENANTS = {"main": 8, "tiny": 1, "other": 4}


def docker_ids(*labels: str, volumes: bool = False) -> List[str]:
    """Containers (or volumes) carrying every `KEY=VALUE` label, asked of the engine."""
    cmd = ["docker", "volume", "ls", "-q"] if volumes else ["docker", "ps", "-aq"]
    for label in labels:
        cmd += ["--filter", f"label={label}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.split()


@dataclass
class Server:
    """A running `kernelbox serve`."""

    url: str
    tokens: Dict[str, str]
    case: str
    proc: subprocess.Popen
    log: List[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{CASE_KEY}={self.case}"

    def token(self, tenant: str = "main") -> str:
        return self.tokens[tenant]

    def containers(self, *labels: str) -> List[str]:
        return docker_ids(self.label, *labels)

    def stop(self) -> int:
        """SIGTERM, then wait (bounded) for the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise AssertionError("kernelbox serve did not stop within its deadline after SIGTERM")


def start_server(
    tmp: Path, *extra: str, tenants: Dict[str, int] = TENANTS, tools: Optional[dict] = None
) -> Server:
    """`kernelbox serve` with `tenants` (name: max_kernels); `tools` (`{"url", "allow"}`) is
    the `main` tenant's tool endpoint."""
    if not BIN.is_file():
        pytest.fail(
            f"the kernelbox binary is missing at {BIN}: build it with `cargo build` "
            "(or point KERNELBOX_BIN at one)",
            pytrace=False,
        )
    case = f"pyclient-{uuid.uuid4().hex[:8]}"
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in tenants}
    tenants_file = tmp / "tenants.json"
    tenants_file.write_text(
        json.dumps(
            {
                "tenants": [
                    {
                        "name": name,
                        "token_sha256": hashlib.sha256(tokens[name].encode()).hexdigest(),
                        "max_kernels": cap,
                        **({"tools": tools} if tools and name == "main" else {}),
                    }
                    for name, cap in tenants.items()
                ]
            }
        )
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERNELBOX_")}
    args = [
        str(BIN), "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp / "state"),
        "--tenants", str(tenants_file), "--label", f"{CASE_KEY}={case}",
        # No warm pool: these tests find a session's kernel by its owner labels, which a
        # kernel taken from the pool does not carry (its owner is in its name; the pool has
        # its own tests in tests/pool.rs).
        "--pool", "0", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    log: List[str] = []
    lines: "queue.Queue[str]" = queue.Queue()

    def pump() -> None:
        # Drains stderr for the server's whole life so it can never block on a full pipe.
        assert proc.stderr is not None
        for line in proc.stderr:
            log.append(line)
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, name=f"kernelbox-serve-{case}", daemon=True).start()
    deadline = time.monotonic() + START_DEADLINE
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            proc.kill()
            pytest.fail(f"kernelbox serve said nothing within {START_DEADLINE}s: {''.join(log)}")
        if not line:
            pytest.fail(f"kernelbox serve exited ({proc.wait()}): {''.join(log)}", pytrace=False)
        if " on http://" in line:
            url = line.split(" on ", 1)[1].split()[0]
            return Server(url=url, tokens=tokens, case=case, proc=proc, log=log)


def stop_and_check(server: Server) -> None:
    code = server.stop()
    assert code == 0, f"kernelbox serve exited {code}: {''.join(server.log)}"
    assert server.containers() == [], "containers left behind by the server"
    assert docker_ids(server.label, volumes=True) == [], "volumes left behind by the server"


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
