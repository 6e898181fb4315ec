"""`kernel.restored` typed, against a real `kernelbox serve` whose tenant `sleepy` runs its
kernels under gVisor and hibernates them (docs/runtimes.md, "Hibernation"): an idle kernel,
checkpointed by the server's own reaper (every 30 s at the shortest), comes back to the next
call with its variables."""

from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest

from conftest import Server, kernelbox_serve, stop_and_check
from kernelbox_client import Client, Restored


@pytest.fixture(scope="module")
def hib_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tenants = {"sleepy": {"max_kernels": 2, "runtime": "runsc", "hibernate": True}}
    case = f"pyclient-hib-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(
        tmp_path_factory.mktemp("hib"), case, tenants, "--pool", "0", "--idle-timeout", "1s"
    )
    yield s
    # The test closes its session: nothing is left to hibernate at the stop, and
    # stop_and_check finds nothing.
    stop_and_check(s)


def test_an_idle_kernel_hibernates_and_comes_back_restored(hib_server: Server) -> None:
    with Client(hib_server.url, hib_server.token("sleepy")) as c:
        s = c.session("s")
        first = s.run("x = 41")
        assert first.ok, first.output
        assert first.kernel.restored is None
        # Hibernated: no live kernel of the session any more.
        deadline = time.monotonic() + 90
        while any(k.session == "s" for k in c.kernels()):
            assert time.monotonic() < deadline, "the idle kernel never hibernated"
            time.sleep(0.5)
        back = s.run("print(x + 1)")
        assert back.output == "42\n", back.output
        assert isinstance(back.kernel.restored, Restored)
        assert back.kernel.restored.from_ == "idle"
        assert back.kernel.restored.restore_seconds > 0
        assert back.kernel.id == first.kernel.id and back.kernel.reused
        assert back.kernel.state_lost is None
        again = s.run("print(x)")
        assert again.kernel.restored is None
        # Idle at the stop, it would hibernate to outlive the server (docs/runtimes.md).
        assert s.close() == 1
