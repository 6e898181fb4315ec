# kernelbox runner bootstrap, run as `python3 -c <this file>` with the runner's source in the
# environment variable KERNELBOX_RUNNER.
#
# Both choices save memory in every kernel, because the C heap keeps its peak resident for the
# life of the process: the runner is compiled one top-level definition at a time (a piece's
# parser peak is a fraction of the whole file's: about 0.75 MiB less), and the source does not
# travel on the command line (Python keeps several decoded copies of argv: about 0.35 MiB).
# The variable leaves the environment before any cell runs, so subprocesses never see it (the
# runner removes every other KERNELBOX_ variable).
import os


def _pieces(source):
    # A piece starts at a column-0 `def`, `class` or decorator (not one right after a
    # decorator); statements between definitions stay with the piece before them.
    lines = source.split("\n")
    pieces, start = [], 0
    for i in range(1, len(lines) + 1):
        if i == len(lines) or (
            lines[i].startswith(("def ", "class ", "@")) and not lines[i - 1].startswith("@")
        ):
            # Leading newlines keep line numbers in tracebacks true to the file.
            pieces.append("\n" * start + "\n".join(lines[start:i]))
            start = i
    return pieces


def _run(pieces):
    # The runner gets its own copy of the builtins namespace: a cell that rebinds a builtin
    # (``builtins.len = None``) changes what cells see, never what the runner calls.
    namespace = {"__name__": "__main__", "__builtins__": dict(vars(__builtins__))}
    while pieces:
        exec(compile(pieces.pop(0), "<kernelbox-runner>", "exec"), namespace)


_run(_pieces(os.environ.pop("KERNELBOX_RUNNER")))
