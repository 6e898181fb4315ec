"""kernelbox from Python: a stateful session, streamed output, a typed error, the drop-in.

Run against a server (docs/http-api.md):

    KERNELBOX_URL=http://127.0.0.1:8080 KERNELBOX_TOKEN=s3cret python examples/quickstart.py
"""

import json
import sys

import kernelbox_client
from kernelbox_client import Client, KernelboxError, RateLimited


def main() -> int:
    with Client() as client:  # KERNELBOX_URL, KERNELBOX_TOKEN
        session = client.session("quickstart")

        session.run("import math\nradius = 2")
        r = session.run("print(f'area = {math.pi * radius ** 2:.2f}')")
        print("output:", r.output, end="")
        print("kernel:", r.kernel.id, "cells run:", r.kernel.execution_count)

        print("streaming:")
        r = session.run(
            "import time\n"
            "for i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.2)",
            on_output=lambda text: print("  live>", text, end=""),
        )
        print("status:", r.status, f"({r.duration_seconds:.2f}s)")

        r = session.run("1 / 0")
        print("a failing cell is a result:", r.status, r.error.strip().splitlines()[-1])

        r = session.run("import time\ntime.sleep(5)", timeout=1)
        print("timeout:", r.status, "->", session.run("pass").kernel.state_lost)

        try:
            session.run("pass", timeout=-1)
        except RateLimited as e:
            print("busy, retry after", e.retry_after)
        except KernelboxError as e:
            print(f"refused: {type(e).__name__} {e.status} {e.code}: {e.message}")

        for k in client.kernels():
            print("live kernel:", k.session, k.state, "cells:", k.execution_count)
        print("closed kernels:", session.close())

    # The drop-in: the result JSON string, one session per task id.
    result = json.loads(kernelbox_client.execute_code("print(6 * 7)", task_id="quickstart-task"))
    print("execute_code:", result["status"], result["output"], end="")
    Client().session(kernelbox_client.session_for_task("quickstart-task")).close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
