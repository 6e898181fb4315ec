"""`client.workspaces()`, `client.delete_workspace()`, `kernel.workspace` on results, and
`client.usage()` typed, against a real `kernelbox serve` whose tenants file gives tenant `ws`
workspaces (docs/workspaces.md), `plain` none, and `admin` the usage admin's reading
(docs/usage.md)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Iterator

import pytest

from conftest import Server, kernelbox_serve, stop_and_check
from kernelbox_client import (
    AsyncClient,
    Client,
    Conflict,
    KernelboxError,
    NotFound,
    UsageReport,
    WorkspaceSummary,
)


@pytest.fixture(scope="module")
def ws_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tenants = {
        "ws": {"max_kernels": 2, "workspaces": {"quota": "64m", "max": 4}},
        "plain": {"max_kernels": 2},
        "admin": {"max_kernels": 1, "usage_admin": True},
    }
    case = f"pyclient-ws-{uuid.uuid4().hex[:8]}"
    s = kernelbox_serve.start_server(tmp_path_factory.mktemp("ws"), case, tenants, "--pool", "0")
    yield s
    # Every workspace a test made is deleted by it: stop_and_check finds a left one.
    stop_and_check(s)


def test_a_workspace_outlives_its_kernel_and_is_listed_and_deleted(ws_server: Server) -> None:
    name = f"keep-{uuid.uuid4().hex[:6]}"
    with Client(ws_server.url, ws_server.token("ws")) as c:
        s = c.session(name)
        first = s.run("open('/work/kept.txt', 'w').write('kept'); print('ok')")
        assert first.ok, first.output
        assert first.kernel.workspace is not None
        assert (first.kernel.workspace.name, first.kernel.workspace.restored) == (name, False)

        listed = {w.name: w for w in c.workspaces()}
        assert isinstance(listed[name], WorkspaceSummary)
        assert listed[name].in_use and listed[name].quota_bytes == 64 * 1024 * 1024
        # Mounted by a live kernel: refused, and nothing is lost.
        with pytest.raises(Conflict) as busy:
            c.delete_workspace(name)
        assert busy.value.code == "workspace_in_use"

        s.close()
        again = s.run("print(open('/work/kept.txt').read())")
        assert again.output == "kept\n", again.output
        assert again.kernel.workspace is not None and again.kernel.workspace.restored
        s.close()

        assert not {w.name: w for w in c.workspaces()}[name].in_use
        assert c.delete_workspace(name) == name
        assert name not in {w.name for w in c.workspaces()}
        with pytest.raises(NotFound):
            c.delete_workspace(name)


def test_another_tenants_workspace_is_not_found_and_a_tenant_without_them_is_told(
    ws_server: Server,
) -> None:
    name = f"mine-{uuid.uuid4().hex[:6]}"
    with Client(ws_server.url, ws_server.token("ws")) as c, Client(
        ws_server.url, ws_server.token("plain")
    ) as plain:
        s = c.session(name)
        assert s.run("print(1)").ok
        s.close()
        with pytest.raises(NotFound) as none:
            plain.workspaces()
        assert none.value.code == "workspace_not_found"
        with pytest.raises(NotFound):
            plain.delete_workspace(name)
        assert name in {w.name for w in c.workspaces()}
        assert c.delete_workspace(name) == name
        r = plain.session(name).run("print(1)")
        assert r.ok and r.kernel.workspace is None
        plain.session(name).close()


def test_usage_is_a_typed_report_of_the_tenants_own_cells(ws_server: Server) -> None:
    name = f"count-{uuid.uuid4().hex[:6]}"
    with Client(ws_server.url, ws_server.token("plain")) as c:
        s = c.session(name)
        for _ in range(3):
            assert s.run("x = 1").ok
        s.close()
        report = c.usage()
        assert isinstance(report, UsageReport)
        assert report.group_by == "session" and report.from_ < report.to
        mine = [r for r in report if r.session == name]
        assert sum(r.cells for r in mine) == 3
        assert {r.tenant for r in report} == {"plain"}
        with pytest.raises(KernelboxError) as other:
            c.usage(tenant="ws")
        assert (other.value.status, other.value.code) == (403, "forbidden")

    async def admin_reads_by_day() -> UsageReport:
        async with AsyncClient(ws_server.url, ws_server.token("admin")) as a:
            return await a.usage(group_by="day", tenant="plain")

    by_day = asyncio.run(admin_reads_by_day())
    assert by_day.group_by == "day"
    assert sum(r.cells for r in by_day if r.tenant == "plain") >= 3
    assert all(r.session == "" for r in by_day)


def test_a_workspace_is_saved_and_restored_as_a_tar_without_a_kernel(ws_server: Server) -> None:
    import io
    import tarfile

    name = f"tar-{uuid.uuid4().hex[:6]}"
    copy = f"copy-{uuid.uuid4().hex[:6]}"
    with Client(ws_server.url, ws_server.token("ws")) as c:
        s = c.session(name)
        assert s.run("open('/work/data.txt', 'w').write('42')").ok
        s.close()
        saved = io.BytesIO()
        assert s.files.save_workspace(saved) > 0
        assert c.kernels() == []  # nothing was started to read it
        with tarfile.open(fileobj=io.BytesIO(saved.getvalue())) as tar:
            member = tar.extractfile("data.txt")
            assert member is not None and member.read() == b"42"
        written = c.session(copy).files.restore_workspace(saved.getvalue())
        assert written.files is not None and written.files >= 1
        assert c.kernels() == []
        result = c.session(copy).run("print(open('/work/data.txt').read())")
        assert result.output == "42\n"
        assert result.kernel.workspace is not None and result.kernel.workspace.restored
        with pytest.raises(NotFound):
            c.session(f"none-{uuid.uuid4().hex[:6]}").files.save_workspace(io.BytesIO())
        c.session(copy).close()
        for w in (name, copy):
            c.delete_workspace(w)


def test_the_async_client_saves_a_workspace(ws_server: Server) -> None:
    import io
    import tarfile

    name = f"atar-{uuid.uuid4().hex[:6]}"

    async def main() -> None:
        async with AsyncClient(ws_server.url, ws_server.token("ws")) as c:
            s = c.session(name)
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                info = tarfile.TarInfo("a.txt")
                info.size = 1
                tar.addfile(info, io.BytesIO(b"a"))
            await s.files.restore_workspace(buf.getvalue())
            saved = io.BytesIO()
            assert await s.files.save_workspace(saved) > 0
            await c.delete_workspace(name)

    asyncio.run(main())
