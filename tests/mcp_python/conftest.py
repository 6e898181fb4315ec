"""Fixtures for the MCP tests: the cargo-built `kernelbox` binary, a real `kernelbox serve` on a
free loopback port (temporary state directory, a tenants file), and the Docker engine asked,
by this run's case label, what containers exist. Nothing is skipped: a missing binary or
engine fails the run.

The binary is `target/debug/kernelbox` at the repository's root, or `KERNELBOX_BIN`.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("KERNELBOX_BIN") or REPO / "target" / "debug" / "kernelbox")
CASE_KEY = "io.kernelbox-test.case"
START_DEADLINE = 60.0
STOP_DEADLINE = 90.0


def binary() -> str:
    if not BIN.is_file():
        pytest.fail(f"the kernelbox binary is missing at {BIN}: run `cargo build`", pytrace=False)
    return str(BIN)


def docker_ids(*labels: str, volumes: bool = False) -> List[str]:
    """Containers (or volumes) carrying every `KEY=VALUE` label, asked of the engine."""
    cmd = ["docker", "volume", "ls", "-q"] if volumes else ["docker", "ps", "-aq"]
    for label in labels:
        cmd += ["--filter", f"label={label}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True)
    return out.stdout.split()


def wait_for(what: str, check: Callable[[], bool], deadline: float = 30.0) -> None:
    """Polls `check` (bounded) until it holds; fails naming `what` otherwise."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not so within {deadline}s")
        time.sleep(0.2)


def new_case() -> str:
    return f"mcp-{uuid.uuid4().hex[:8]}"


def clean_env() -> Dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("KERNELBOX_")}


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

    @property
    def mcp(self) -> str:
        return f"{self.url}/v1/mcp"

    def containers(self, *labels: str) -> List[str]:
        return docker_ids(self.label, *labels)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
            raise AssertionError("kernelbox serve did not stop within its deadline after SIGTERM")


def start_server(tmp: Path, *extra: str, tenants=("main", "other")) -> Server:
    case = new_case()
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in tenants}
    tenants_file = tmp / "tenants.json"
    tenants_file.write_text(json.dumps({"tenants": [
        {"name": n, "token_sha256": hashlib.sha256(tokens[n].encode()).hexdigest(), "max_kernels": 4}
        for n in tenants
    ]}))  # fmt: skip
    args = [
        binary(), "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp / "state"),
        "--tenants", str(tenants_file), "--label", f"{CASE_KEY}={case}", *extra,
    ]  # fmt: skip
    proc = subprocess.Popen(
        args, env=clean_env(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
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

    threading.Thread(target=pump, daemon=True).start()
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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A server shared by a module's tests (each uses its own session names)."""
    s = start_server(tmp_path_factory.mktemp("server"))
    yield s
    stop_and_check(s)


@pytest.fixture
def session_name(request: pytest.FixtureRequest) -> str:
    name = "".join(ch if ch.isalnum() else "-" for ch in request.node.name[:60])
    return f"{name}-{uuid.uuid4().hex[:6]}"
