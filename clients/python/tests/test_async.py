"""`AsyncClient`: the surface of `Client` with `await`, against the same real server."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from conftest import Server
from kernelbox_client import (
    AsyncClient,
    AsyncCommands,
    AsyncFiles,
    AsyncProcesses,
    AsyncSession,
    Client,
    Commands,
    Execution,
    Files,
    KernelSummary,
    Processes,
    Session,
    Unauthorized,
)


@pytest.mark.parametrize(
    "sync, asyn",
    [
        (Client, AsyncClient),
        (Session, AsyncSession),
        (Files, AsyncFiles),
        (Commands, AsyncCommands),
        (Processes, AsyncProcesses),
    ],
)
def test_the_async_surface_matches_the_sync_one(sync: type, asyn: type) -> None:
    def surface(cls: type) -> dict:
        return {
            name: inspect.signature(fn).parameters.keys()
            for name, fn in inspect.getmembers(cls, inspect.isfunction)
            if not name.startswith("_")
        }

    assert surface(sync) == surface(asyn)
    for name, fn in inspect.getmembers(asyn, inspect.isfunction):
        if not name.startswith("_") and name != "session":
            # A stream of events (`processes.stream`) is an async generator.
            async_ = inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)
            assert async_, f"{asyn.__name__}.{name} is not async"


def test_async_runs_keep_state_and_stream(server: Server, session_name: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token()) as c:
            s = c.session(session_name)
            assert (await s.run("x = 41")).ok
            chunks = []

            async def on_output(text: str) -> None:
                chunks.append(text)

            r = await s.run("for i in range(3):\n    print(x + i, flush=True)", on_output=on_output)
            assert isinstance(r, Execution) and r.kernel.reused
            assert "".join(chunks) == "41\n42\n43\n" == r.output
            sync_chunks = []
            r = await s.run("print('plain callback')", on_output=sync_chunks.append)
            assert sync_chunks == ["plain callback\n"]
            kernels = [k for k in await c.kernels() if k.session == session_name]
            assert len(kernels) == 1 and isinstance(kernels[0], KernelSummary)
            assert await s.interrupt() == 0
            assert await s.close() == 1
            assert await s.close() == 0

    asyncio.run(main())


def test_async_runs_in_parallel_sessions_concurrently(server: Server, session_name: str) -> None:
    async def main() -> list:
        async with AsyncClient(server.url, server.token()) as c:
            sessions = [c.session(f"{session_name}-{i}") for i in range(3)]
            results = await asyncio.gather(*(s.run(f"print({i})") for i, s in enumerate(sessions)))
            await asyncio.gather(*(s.close() for s in sessions))
            return [r.output for r in results]

    assert asyncio.run(main()) == ["0\n", "1\n", "2\n"]


def test_async_interrupt_stops_a_streaming_cell(server: Server, session_name: str) -> None:
    async def main() -> Execution:
        async with AsyncClient(server.url, server.token()) as c:
            s = c.session(session_name)
            started = asyncio.Event()
            run = asyncio.ensure_future(
                s.run(
                    "import time\nprint('go', flush=True)\ntime.sleep(60)",
                    on_output=lambda _: started.set(),
                )
            )
            await asyncio.wait_for(started.wait(), timeout=60)
            assert await s.interrupt() == 1
            r = await asyncio.wait_for(run, timeout=60)
            await s.close()
            return r

    r = asyncio.run(main())
    # The cell got KeyboardInterrupt: its traceback follows what it wrote.
    assert r.status == "interrupted"
    assert r.output.startswith("go\n") and "KeyboardInterrupt" in r.output


def test_async_errors_are_typed(server: Server, session_name: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, "wrong") as c:
            await c.session(session_name).run("pass")

    with pytest.raises(Unauthorized) as e:
        asyncio.run(main())
    assert e.value.code == "unauthorized"
