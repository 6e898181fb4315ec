"""Fixtures of the adapters' tests: a real `kernelbox serve` (the cargo-built binary, or
`KERNELBOX_BIN`; tests/pytest_support/kernelbox_serve.py) shared by the tests, every container
labelled with this run's case label and checked gone at the end. Each framework is the real
package pinned in clients/python/requirements-adapters.txt; a missing one fails the run."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "tests" / "pytest_support"))
import kernelbox_serve  # noqa: E402
from kernelbox_serve import Server, stop_and_check  # noqa: E402


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    case = f"pyadapters-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(
        tmp_path_factory.mktemp("server"), case, {"main": {"max_kernels": 8}}, "--pool", "0"
    )
    yield s
    stop_and_check(s)


@pytest.fixture
def session_name(request: pytest.FixtureRequest) -> str:
    return f"{request.node.name[:60]}-{uuid.uuid4().hex[:6]}"
