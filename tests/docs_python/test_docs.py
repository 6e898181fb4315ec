"""The commands README.md and docs/*.md show, run as shown and their output compared with
what the page says (docs/README.md, "The docs test"), so that the pages cannot drift from the
program.

Every ```console block carries a marker, an HTML comment on the line before it (invisible on
the rendered page):

- `<!-- docs-test: run -->`: its `$ ` commands are run, in page order, in one bash shell per
  page (so a server one block starts in the background serves the next blocks), their
  standard output and error together compared with the lines under each command;
- `<!-- docs-test: run; server -->`: the same, with a server started first, as README's HTTP
  section starts it (`KERNELBOX_TOKEN=s3cret kernelbox serve --listen 127.0.0.1:8080 &`), for
  a page that shows calls to "the server above";
- `<!-- docs-test: run; setup: SHELL -->`: the same, after SHELL (run silently: the files a
  block assumes, say; `$KB_REPO` is the checkout);
- `<!-- docs-test: skip: WHY -->`: not run, for the reason given (it needs a network, a
  cluster, minutes of image building, or its output is not deterministic).

A block without a marker fails the test: a new example has to be run or say why not.

What is not deterministic is masked on both sides before comparing: container ids (12 hex
digits), instance and request ids (32), idle times, object addresses (`0x...`), durations and timestamps. A line
`...` alone stands for any number of lines, `...` within a line for any text. The commands run against the cargo-built binary (`KERNELBOX_BIN`):
`kernelbox`, `./target/release/kernelbox` and `cargo run --release --` all name it, every
container it makes carries this run's case label (checked gone at the end), and `8080` is a
free port. `kill %N` stops the page's Nth background job and shows the rest of what it
printed. A `$ cat FILE` shows a file the page gives: the file is written first, as shown.
Background jobs are stopped with SIGTERM when the page ends.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "pytest_support"))
from kernelbox_serve import CASE_KEY, REPO, binary, clean_env, docker_ids  # noqa: E402

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
MARKER = re.compile(r"^<!-- docs-test: (run(?:; server)?(?:; setup: (?P<setup>.*?))?|skip: .+) -->$")
#: Longest a page's commands may take, in seconds.
PAGE_DEADLINE = 600


@dataclass
class Command:
    line: str
    expected: List[str] = field(default_factory=list)


@dataclass
class Block:
    page: Path
    line: int
    marker: Optional[str]
    commands: List[Command]

    @property
    def runs(self) -> bool:
        return self.marker is not None and self.marker.startswith("run")

    @property
    def server(self) -> bool:
        return self.marker is not None and "; server" in self.marker

    @property
    def setup(self) -> Optional[str]:
        m = MARKER.match(f"<!-- docs-test: {self.marker} -->") if self.marker else None
        return m.group("setup") if m else None


def blocks(page: Path) -> List[Block]:
    """The ```console blocks of a page, with their markers and commands."""
    lines = page.read_text().splitlines()
    out: List[Block] = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != "```console":
            i += 1
            continue
        before = next((lines[j] for j in range(i - 1, -1, -1) if lines[j].strip()), "")
        m = MARKER.match(before.strip())
        marker = m.group(0)[len("<!-- docs-test: ") : -len(" -->")] if m else None
        start = i + 1
        i += 1
        commands: List[Command] = []
        while i < len(lines) and lines[i].strip() != "```":
            text = lines[i]
            if text.startswith("$ "):
                command = text[2:]
                while (command.endswith("\\") or not complete(command)) and i + 1 < len(lines):
                    i += 1
                    command += "\n" + lines[i]
                commands.append(Command(command))
            elif commands:
                commands[-1].expected.append(text)
            i += 1
        out.append(Block(page, start, marker, commands))
        i += 1
    return out


def complete(command: str) -> bool:
    """Whether a command's quotes are closed (a quoted argument may span lines)."""
    try:
        shlex.split(command)
    except ValueError:
        return False
    return True


def all_blocks() -> List[Block]:
    return [b for page in PAGES for b in blocks(page)]


def test_every_console_block_is_run_or_says_why_not() -> None:
    unmarked = [f"{b.page.relative_to(REPO)}:{b.line}" for b in all_blocks() if b.marker is None]
    assert not unmarked, f"console blocks with no docs-test marker: {unmarked}"


def masked(text: str, port: int) -> str:
    text = text.replace(f":{port}", ":8080")
    # The shell's own notices of a background job's end.
    text = re.sub(r"(?m)^\[\d+\][+-]? +(Done|Terminated|Exit \d+) .*\n?", "", text)
    text = re.sub(r"\b[0-9a-f]{32}\b", "<hex32>", text)
    text = re.sub(r"\b[0-9a-f]{12}\b", "<id>", text)
    text = re.sub(r'("(?:duration|idle)_seconds": ?)[0-9.e-]+', r"\1<seconds>", text)
    text = re.sub(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>", text)
    text = re.sub(r"\b0x[0-9a-f]+\b", "0x<address>", text)
    text = re.sub(r"(?im)^date: .*$", "date: <date>", text)
    return "\n".join(line.rstrip() for line in text.splitlines())


def matches(expected: List[str], actual: str) -> bool:
    """Whether `actual` is `expected`, a line `...` standing for any number of lines and
    `...` within a line for any text."""
    pattern = ""
    for line in expected:
        if line.strip() == "...":
            pattern += r"(?:[^\n]*\n)*?"
        else:
            pattern += r"[^\n]*?".join(re.escape(part) for part in line.split("...")) + r"\n"
    return re.fullmatch(pattern, actual + "\n" if actual else "") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: What names the binary in the pages' commands.
BINARY_NAMES = [("cargo run --release -- ", "kernelbox "), ("./target/release/kernelbox", "kernelbox")]

#: A background job's first line is its output at start (`serving ... on ...`): the shell waits
#: for it, then shows it where the page does.
PRELUDE = """
kernelbox() {
  local label=()
  case "$1" in exec|repl|serve|mcp|sh) label=("$1" --label "$KB_CASE"); shift ;; esac
  # In a subshell (a background job, a pipeline's stage) the binary takes its place, so that
  # a signal to the job reaches it and waiting for the job waits for it.
  if [ "$BASHPID" != "$$" ]; then exec "$KB_BIN" "${label[@]}" "$@"; fi
  "$KB_BIN" "${label[@]}" "$@"
}
background_ready() {
  local log=$1
  for _ in $(seq 1 600); do
    grep -q . "$log" 2>/dev/null && { head -n 1 "$log"; return 0; }
    kill -0 "$!" 2>/dev/null || { cat "$log"; return 1; }
    sleep 0.1
  done
  echo "docs-test: the background job printed nothing in 60 s"; return 1
}
"""


def script(page_blocks: List[Block], port: int) -> Tuple[str, List[Tuple[Block, Command]]]:
    """The shell script running a page's blocks, and its commands in order (each command's
    output follows an `@@docs-test N@@` line)."""
    parts = ["set -m\n", PRELUDE]
    order: List[Tuple[Block, Command]] = []
    logs: List[str] = []
    for n_block, block in enumerate(page_blocks):
        if block.server:
            logs.append(f"server-{n_block}.log")
            parts.append(
                f"KERNELBOX_TOKEN=s3cret kernelbox serve --listen 127.0.0.1:{port} > {logs[-1]} 2>&1 &\n"
                f"background_ready {logs[-1]} > /dev/null\n"
            )
        if block.setup:
            setup = block.setup.replace("8080", str(port))
            parts.append(f"{{ {setup} ; }} > /dev/null 2>&1\n")
        for command in block.commands:
            text = command.line
            for shown, real in BINARY_NAMES:
                text = text.replace(shown, real)
            text = text.replace("8080", str(port))
            shows = re.fullmatch(r"cat ([\w.-]+)", text)
            if shows:
                # `$ cat FILE` shows a file the page gives: written first, as shown.
                content = "\n".join(command.expected).replace("8080", str(port))
                parts.append(f"cat > {shows.group(1)} <<'DOCS_TEST_EOF'\n{content}\nDOCS_TEST_EOF\n")
            # On a line of its own (a `curl -s` answer ends with no newline), keeping `$?`.
            parts.append(f"kb_status=$?; printf '\\n@@docs-test {len(order)}@@\\n'; (exit $kb_status)\n")
            stripped = text.rstrip()
            killed = re.fullmatch(r"kill( -\w+)? %(\d+)", stripped)
            if stripped.endswith("&") and not stripped.endswith("&&"):
                # Its first line is shown at once; the rest when the page stops it.
                logs.append(f"background-{len(order)}.log")
                parts.append(f"{stripped[:-1]} > {logs[-1]} 2>&1 &\nbackground_ready {logs[-1]}\n")
            elif killed and int(killed.group(2)) <= len(logs):
                job = killed.group(2)
                parts.append(f"{text}\nwait %{job}\ntail -n +2 {logs[int(job) - 1]}\n")
            else:
                parts.append(f"{text}\n")
            order.append((block, command))
    # Each background job is a process group of its own (`set -m`): SIGTERM reaches the
    # server itself, not only the shell function that started it, and the page ends when
    # every group is gone (the server stops its kernels first).
    parts.append(
        "printf '\\n@@docs-test end@@\\n'\n"
        "jobs=$(jobs -p)\nfor job in $jobs; do kill -TERM -- -$job 2>/dev/null; done\n"
        # (the server is the job's child: waiting for the job is not waiting for it)
        "for job in $jobs; do for _ in $(seq 1 900); do kill -0 -- -$job 2>/dev/null || break; sleep 0.1; done; done\n"
    )
    return "".join(parts), order


RUN_PAGES = [p for p in PAGES if any(b.runs for b in blocks(p))]


@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(REPO)) for p in RUN_PAGES])
def test_the_pages_commands_print_what_the_page_shows(page: Path) -> None:
    case = f"docs-{uuid.uuid4().hex[:8]}"
    port = free_port()
    text, order = script([b for b in blocks(page) if b.runs], port)
    env = clean_env()
    env.update(KB_BIN=binary(), KB_CASE=f"{CASE_KEY}={case}", KB_REPO=str(REPO))
    # `python` is this test's, which has the client and the MCP SDK.
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    with tempfile.TemporaryDirectory() as work:
        env["KERNELBOX_STATE_DIR"] = str(Path(work) / "state")
        try:
            run = subprocess.run(
                ["bash", "-c", text], cwd=work, env=env, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, text=True, timeout=PAGE_DEADLINE, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        finally:
            left = docker_ids(f"{CASE_KEY}={case}") + docker_ids(f"{CASE_KEY}={case}", volumes=True)
    output = run.stdout
    pieces = re.split(r"\n@@docs-test (\d+|end)@@\n", run.stdout)
    shown: Dict[int, str] = {int(n): out for n, out in zip(pieces[1::2], pieces[2::2]) if n != "end"}
    failures = []
    for n, (block, command) in enumerate(order):
        actual = masked(shown.get(n, "<not run>"), port)
        expected = [masked(line, port) for line in command.expected]
        if not matches(expected, actual):
            failures.append(
                f"{page.relative_to(REPO)}:{block.line}: $ {command.line}\n"
                f"--- the page shows:\n" + "\n".join(expected) + f"\n--- it printed:\n{actual}\n"
            )
    assert not failures, "\n".join(failures)
    assert not left, f"left behind: {left}\n{output[-2000:]}"


def test_the_matcher_takes_ellipses_for_any_lines() -> None:
    assert matches(["a", "...", "d"], "a\nb\nc\nd")
    assert matches(["a", "...", "d"], "a\nd")
    assert not matches(["a", "d"], "a\nb\nd")
    assert matches([], "")
    assert matches(['{"a":1,...,"z":2}'], '{"a":1,"b":3,"z":2}')
    assert complete("echo 'a\nb'") and not complete("echo 'a")
    assert masked('"duration_seconds":0.0068, "id": "82e9308d9354"', 1) == '"duration_seconds":<seconds>, "id": "<id>"'
