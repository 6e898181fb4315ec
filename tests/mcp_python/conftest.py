"""Fixtures for the MCP tests: the cargo-built `kernelbox` binary, a real `kernelbox serve` on a
free loopback port (temporary state directory, a tenants file; see
tests/pytest_support/kernelbox_serve.py, shared with clients/python/tests), and the Docker
engine asked, by this run's case label, what containers exist. Nothing is skipped: a missing
binary or engine fails the run.

The binary is `target/debug/kernelbox` at the repository's root, or `KERNELBOX_BIN`.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import (  # noqa: E402,F401
    CASE_KEY,
    Server,
    binary,
    clean_env,
    docker_ids,
    stop_and_check,
)


def wait_for(what: str, check: Callable[[], bool], deadline: float = 30.0) -> None:
    """Polls `check` (bounded) until it holds; fails naming `what` otherwise."""
    end = time.monotonic() + deadline
    while not check():
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not so within {deadline}s")
        time.sleep(0.2)


def new_case() -> str:
    return f"mcp-{uuid.uuid4().hex[:8]}"


def start_server(tmp: Path, *extra: str, tenants=("main", "other")) -> Server:
    """`kernelbox serve` with `tenants`, four kernels each, and the `extra` flags."""
    entries = {name: {"max_kernels": 4} for name in tenants}
    return kernelbox_serve.start_server(tmp, new_case(), entries, *extra)


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
