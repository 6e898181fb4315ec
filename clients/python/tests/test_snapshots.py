"""Snapshots, restore and fork through the client (docs/snapshots.md), against a real
`kernelbox serve` whose tenant `branchy` runs its kernels under gVisor: `session.snapshot()`,
`client.restore(...)` and `session.fork(n)` carry a kernel's variables into new sessions,
each its own; another tenant's snapshot is not found; a runc tenant's is files-only
(`memory: false`)."""

from __future__ import annotations

import uuid
from typing import Iterator

import pytest

from conftest import Server, kernelbox_serve, stop_and_check
from kernelbox_client import Client, ForkResult, NotFound, SnapshotInfo


@pytest.fixture(scope="module")
def snap_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tenants = {
        "branchy": {"max_kernels": 6, "runtime": "runsc"},
        "plain": {"max_kernels": 2},
    }
    case = f"pyclient-snap-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(tmp_path_factory.mktemp("snap"), case, tenants, "--pool", "0")
    yield s
    stop_and_check(s)


def test_a_snapshot_restores_and_a_fork_branches(snap_server: Server) -> None:
    with Client(snap_server.url, snap_server.token("branchy")) as c:
        s = c.session("src")
        assert s.run("x = 41").ok
        snap = s.snapshot("before")
        assert isinstance(snap, SnapshotInfo)
        assert snap.memory and snap.name == "before" and snap.runtime == "runsc"
        assert [x.id for x in c.snapshots()] == [snap.id]
        assert c.snapshot(snap.id) == snap
        restored = c.restore(snap.id, "again")
        assert restored.ok and restored.kernel is not None and restored.kernel.generation == 1
        assert c.session("again").run("print(x + 1)").output == "42\n"
        forks = s.fork(2)
        assert isinstance(forks, ForkResult) and len(forks.forks) == 2
        assert all(f.ok for f in forks.forks), forks
        first, second = (c.session(f.session) for f in forks.forks)
        first.run("x = 0")
        assert second.run("print(x)").output == "41\n"
        assert s.run("print(x)").output == "41\n"
        # A fork into a session that has a kernel fails on its own.
        named = s.fork(sessions=["again", "fresh"])
        assert named.forks[0].error is not None
        assert named.forks[0].error.code == "session_exists"
        assert named.forks[1].ok
        # Another tenant never sees it.
        with Client(snap_server.url, snap_server.token("plain")) as other:
            with pytest.raises(NotFound):
                other.snapshot(snap.id)
            with pytest.raises(NotFound):
                other.restore(snap.id, "stolen")
            assert other.snapshots() == []
        assert c.delete_snapshot(snap.id) == snap.id
        assert c.snapshots() == []
        for name in ("src", "again", "fresh", *(f.session for f in forks.forks)):
            c.session(name).close()


def test_a_runc_kernel_gets_a_files_only_snapshot(snap_server: Server) -> None:
    with Client(snap_server.url, snap_server.token("plain")) as c:
        s = c.session("s")
        assert s.run("x = 1\nopen('note.txt', 'w').write('kept')").ok
        snap = s.snapshot()
        assert not snap.memory and snap.runtime == "runc"
        restored = c.restore(snap.id, "files")
        assert restored.ok
        back = c.session("files")
        assert back.run("print(open('note.txt').read(), 'x' in globals())").output == "kept False\n"
        assert c.delete_snapshot(snap.id) == snap.id
        back.close()
        s.close()
