"""A real `kernelbox serve` for the Python test suites (clients/python/tests and
tests/mcp_python; their conftests put this directory on `sys.path`): the cargo-built binary on
a free loopback port with a temporary state directory and a tenants file, every container it
makes labelled with the run's case label; stopped with SIGTERM, after which the Docker engine
is asked whether anything with the label is left.

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("KERNELBOX_BIN") or REPO / "target" / "debug" / "kernelbox")
CASE_KEY = "io.kernelbox-test.case"
#: Seconds a server may take to say where it listens, and to stop after SIGTERM.
START_DEADLINE = 60.0
STOP_DEADLINE = 90.0


def binary() -> str:
    """The kernelbox binary's path; fails the run when it is missing."""
    if not BIN.is_file():
        pytest.fail(
            f"the kernelbox binary is missing at {BIN}: build it with `cargo build` "
            "(or point KERNELBOX_BIN at one)",
            pytrace=False,
        )
    return str(BIN)


def clean_env() -> Dict[str, str]:
    """This process's environment without any `KERNELBOX_*` variable."""
    return {k: v for k, v in os.environ.items() if not k.startswith("KERNELBOX_")}


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

    @property
    def mcp(self) -> str:
        """The server's MCP endpoint."""
        return f"{self.url}/v1/mcp"

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


def start_server(tmp: Path, case: str, tenants: Dict[str, Dict[str, Any]], *extra: str) -> Server:
    """`kernelbox serve` in `tmp` labelled `case`, with `extra` flags; `tenants` maps each
    tenant's name to the rest of its tenants-file entry (`max_kernels`, `tools`, ...). Each
    tenant gets a fresh token (`Server.tokens`). Returns once the server has said where it
    listens (its "... on http://ADDR" line), at most `START_DEADLINE` seconds."""
    command = binary()
    tokens = {name: f"tok-{name}-{uuid.uuid4().hex}" for name in tenants}
    tenants_file = tmp / "tenants.json"
    tenants_file.write_text(json.dumps({"tenants": [
        {"name": name, "token_sha256": hashlib.sha256(tokens[name].encode()).hexdigest(), **entry}
        for name, entry in tenants.items()
    ]}))  # fmt: skip
    args = [
        command, "serve", "--listen", "127.0.0.1:0", "--state-dir", str(tmp / "state"),
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
    """Stops the server, then asserts it exited 0 and left no container or volume behind."""
    code = server.stop()
    assert code == 0, f"kernelbox serve exited {code}: {''.join(server.log)}"
    assert server.containers() == [], "containers left behind by the server"
    assert docker_ids(server.label, volumes=True) == [], "volumes left behind by the server"
