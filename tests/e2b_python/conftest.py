"""Fixtures for the E2B API's tests: a real `kernelbox serve --e2b-listen` on free loopback
ports (tests/pytest_support/kernelbox_serve.py: a temporary state directory, a tenants file,
every container labelled with the run's case label) driven by E2B's own SDKs from PyPI
(`e2b`, `e2b-code-interpreter`, pinned in requirements.txt), configured as docs/e2b.md says:
`E2B_API_URL` and `E2B_SANDBOX_URL` name the E2B listener, `E2B_API_KEY` is a tenant's token.
Nothing is skipped: a missing binary or engine fails the run.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import Server, docker_ids, stop_and_check  # noqa: E402,F401

#: Seconds the server may take to say where its E2B listener is, after its API listener.
E2B_LINE_DEADLINE = 30.0


def e2b_url(server: Server) -> str:
    """The server's E2B listener, from its "E2B API on http://..." line (bounded wait)."""
    end = time.monotonic() + E2B_LINE_DEADLINE
    while time.monotonic() < end:
        for line in list(server.log):
            if "E2B API on http://" in line:
                return line.split(" on ", 1)[1].split()[0]
        time.sleep(0.05)
    raise AssertionError(f"kernelbox serve never said where its E2B API is: {''.join(server.log)}")


def start(tmp: Path) -> Server:
    case = f"e2b-{uuid.uuid4().hex[:8]}"
    entries = {"main": {"max_kernels": 4}, "other": {"max_kernels": 2}}
    return kernelbox_serve.start_server(tmp, case, entries, "--e2b-listen", "127.0.0.1:0", "--pool", "0")


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for the whole run; the E2B SDK's variables point at it (the main tenant's
    token as the API key) for as long as it runs."""
    s = start(tmp_path_factory.mktemp("server"))
    url = e2b_url(s)
    saved = {k: os.environ.get(k) for k in ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")}
    os.environ.update(E2B_API_URL=url, E2B_SANDBOX_URL=url, E2B_API_KEY=s.token("main"))
    yield s
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    stop_and_check(s)


@pytest.fixture
def url(server: Server) -> str:
    return e2b_url(server)
