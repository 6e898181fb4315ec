"""`session.processes` against a real server (docs/processes.md): a background process started
beside the kernel runs on while the client does other calls; its output is read (what is kept,
then live, then its exit code), bounded reads stop without stopping it, stdin is written and
closed, a signal ends it, a kill ends it and what it started, refusals are typed; the same
with `AsyncClient`."""

from __future__ import annotations

import asyncio
from typing import List

import pytest

from conftest import Server
from kernelbox_client import (
    AsyncClient,
    BadRequest,
    Client,
    Conflict,
    NotFound,
    ProcessInfo,
    Session,
    Timeout,
)


def test_a_process_runs_on_and_its_output_and_exit_code_are_read(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    p = s.processes.start("echo started; read line; echo got $line; echo err >&2; exit 7",
                          stdin=True)  # fmt: skip
    assert isinstance(p, ProcessInfo) and p.running and p.stdin_open
    assert p.command == ["/bin/sh", "-c", p.command[-1]] and p.exit_code is None
    # A bounded read returns while it waits on its stdin: it goes on.
    first = s.processes.output(p.id, timeout=2)
    assert first.running and first.stdout == "started\n", first
    assert [q.id for q in s.processes.list()] == [p.id]
    # A cell runs meanwhile: the process is beside the kernel, not in its way.
    assert s.run("print(6 * 7)").output == "42\n"
    assert s.processes.write_stdin(p.id, "hello\n") == 6
    done = s.processes.wait(p.id, timeout=60)
    assert (done.running, done.exit_code) == (False, 7), done
    out = s.processes.output(p.id)
    assert (out.stdout, out.stderr, out.exit_code) == ("started\ngot hello\n", "err\n", 7), out
    # Both streams, each in its order (two pipes: their order between each other is not kept).
    assert sorted(out.output.splitlines()) == ["err", "got hello", "started"] and not out.running
    # The stream, event by event, ends with `exit`.
    kinds = [e.kind for e in s.processes.stream(p.id)]
    assert kinds[-1] == "exit" and set(kinds) == {"stdout", "stderr", "exit"}, kinds
    # Its stdin closed with its end: a write is refused.
    with pytest.raises(Conflict) as e:
        s.processes.write_stdin(p.id, "late\n")
    assert e.value.code == "stdin_closed"
    s.close()


def test_close_stdin_signal_and_kill(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    cat = s.processes.start(["cat"], stdin=True)
    s.processes.write_stdin(cat.id, b"bytes\n")
    assert not s.processes.close_stdin(cat.id).stdin_open
    assert s.processes.wait(cat.id, timeout=60).exit_code == 0
    assert s.processes.output(cat.id).stdout == "bytes\n"
    # A signal the process does not handle ends it: 128 + the signal.
    sleeper = s.processes.start("sleep 300")
    ended = _signal_until_ended(s, sleeper.id, "TERM")
    assert ended.exit_code == 128 + 15, ended
    # A kill ends the process and what it started.
    tree = s.processes.start("sleep 300 & sleep 300; wait")
    killed = _kill_until_ended(s, tree.id)
    assert not killed.running and killed.exit_code is not None, killed
    left = s.commands.run("ps -eo args | grep -c '^sleep 300' || true")
    assert left.stdout.strip() == "0", left
    s.close()


def _signal_until_ended(s: Session, pid: int, signal: str) -> ProcessInfo:
    """Signals the process (a start leaves it a moment before its pid is known: 409
    `process_starting`, retried) and waits for its end."""
    for _ in range(100):
        try:
            s.processes.signal(pid, signal)
            break
        except Conflict as e:
            assert e.code == "process_starting", e
            s.processes.output(pid, timeout=0.1)
    return s.processes.wait(pid, timeout=60)


def _kill_until_ended(s: Session, pid: int) -> ProcessInfo:
    for _ in range(100):
        try:
            return s.processes.kill(pid)
        except Conflict as e:
            assert e.code == "process_starting", e
            s.processes.output(pid, timeout=0.1)
    raise AssertionError("the process never said its pid")


def test_refusals_are_typed(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    with pytest.raises(NotFound) as nf:
        s.processes.get(12345678)
    assert nf.value.code in ("no_process", "no_kernel"), nf.value
    p = s.processes.start(["true"])
    with pytest.raises(BadRequest) as bad:
        s.processes.signal(p.id, "SIGSEGV")
    assert bad.value.code == "invalid_signal"
    with pytest.raises(Conflict) as closed:
        s.processes.write_stdin(p.id, "x")  # started without stdin
    assert closed.value.code == "stdin_closed"
    with pytest.raises(TypeError):
        s.processes.get("1")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        client.session(session_name, child="helper").processes.start("true")
    # A wait that is over before the process ends is a Timeout; the process goes on.
    sleeper = s.processes.start("sleep 300")
    with pytest.raises(Timeout):
        s.processes.wait(sleeper.id, timeout=0.5)
    assert s.processes.get(sleeper.id).running
    s.close()


def test_async_processes(server: Server, session_name: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token()) as c:
            s = c.session(session_name)
            p = await s.processes.start("read a; echo $a-done", stdin=True)
            seen: List[str] = []

            async def on_stdout(text: str) -> None:
                seen.append(text)

            early = await s.processes.output(p.id, timeout=1, on_stdout=on_stdout)
            assert early.running and early.stdout == "" and seen == []
            await s.processes.write_stdin(p.id, "x\n")
            out = await s.processes.output(p.id, timeout=60, on_stdout=on_stdout)
            assert (out.stdout, out.exit_code) == ("x-done\n", 0) and seen == ["x-done\n"]
            assert (await s.processes.wait(p.id, timeout=60)).exit_code == 0
            events = [e.kind async for e in s.processes.stream(p.id)]
            assert events == ["stdout", "exit"], events
            assert [q.id for q in await s.processes.list()] == [p.id]
            await s.close()

    asyncio.run(main())
