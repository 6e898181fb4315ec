"""`session.commands.run()` against a real server (docs/contract.md, "Commands"): stdout and
stderr apart, exit codes, argv and shell strings, cwd/env/stdin, a timeout that kills the
command and keeps the kernel's state, streaming, refusals; the same with `AsyncClient`."""

from __future__ import annotations

import asyncio
from typing import List

import pytest

from conftest import Server
from kernelbox_client import AsyncClient, BadRequest, Client, CommandResult


def test_a_command_runs_beside_the_kernel(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    r = s.commands.run("echo out; echo err >&2; pwd; exit 3")
    assert isinstance(r, CommandResult)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n/work\n", "err\n", False)
    assert not r.ok and r.duration_seconds > 0 and r.raw["exit_code"] == 3
    # An argument vector is run as given (no shell); stdin, env and cwd reach it.
    r = s.commands.run(
        ["sh", "-c", 'cat; echo "$GREETING"; pwd'],
        cwd="/tmp",
        env={"GREETING": "hi"},
        stdin="from stdin\n",
    )
    assert r.ok and r.stdout == "from stdin\nhi\n/tmp\n", r
    # The command shares the kernel's files.
    assert s.commands.run(["sh", "-c", "echo made > by-command.txt"]).ok
    cell = s.run("print(open('by-command.txt').read().strip())")
    assert cell.output == "made\n", (cell, s.commands.run("pwd; ls -la"))
    s.close()


def test_a_timeout_kills_the_command_and_keeps_the_kernel(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    assert s.run("x = 42").ok
    r = s.commands.run("sleep 100 & sleep 100", timeout=1)
    assert r.timed_out and r.exit_code == -1 and not r.ok, r
    after = s.run("print(x)")
    assert after.output == "42\n" and after.kernel.reused, "the kernel did not survive"
    s.close()


def test_a_streamed_command_reports_each_stream_as_it_writes(
    client: Client, session_name: str
) -> None:
    s = client.session(session_name)
    out: List[str] = []
    err: List[str] = []
    r = s.commands.run(
        "echo one; echo two >&2; echo three", on_stdout=out.append, on_stderr=err.append
    )
    assert "".join(out) == "one\nthree\n" == r.stdout
    assert "".join(err) == "two\n" == r.stderr
    assert r.ok and r.stream_bytes_dropped == 0
    s.close()


def test_a_bad_command_is_refused(client: Client, session_name: str) -> None:
    s = client.session(session_name)
    with pytest.raises(BadRequest) as e:
        s.commands.run([])
    assert e.value.code == "invalid_command"
    with pytest.raises(BadRequest) as e:
        s.commands.run("true", timeout=-1)
    assert e.value.code == "invalid_timeout"
    with pytest.raises(ValueError):
        client.session(session_name, child="c").commands.run("true")
    s.close()


def test_async_commands_run_and_stream(server: Server, session_name: str) -> None:
    async def main() -> None:
        async with AsyncClient(server.url, server.token()) as c:
            s = c.session(session_name)
            r = await s.commands.run(["sh", "-c", "echo a; echo b >&2; exit 1"])
            assert (r.exit_code, r.stdout, r.stderr) == (1, "a\n", "b\n")
            seen: List[str] = []

            async def on_stdout(text: str) -> None:
                seen.append(text)

            r = await s.commands.run("echo streamed", on_stdout=on_stdout)
            assert r.ok and "".join(seen) == "streamed\n"
            await s.close()

    asyncio.run(main())
