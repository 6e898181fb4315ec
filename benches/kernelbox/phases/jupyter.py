# The Jupyter reference of the kernelbox bench (phases/jupyter.rs): python jupyter.py N_WARM N_COLD
# times cold starts + first exec and warm execs of ipykernel, and prints them as one JSON line.
import json, sys, time
import ipykernel, jupyter_client
from jupyter_client.manager import start_new_kernel

n_warm, n_cold = int(sys.argv[1]), int(sys.argv[2])

def run(kc, code):
    reply = kc.execute_interactive(code, timeout=30, output_hook=lambda m: None)
    assert reply["content"]["status"] == "ok", reply

cold = []
for _ in range(n_cold):
    t = time.perf_counter()
    km, kc = start_new_kernel(kernel_name="python3")
    run(kc, "x = 1")
    cold.append(time.perf_counter() - t)
    kc.stop_channels()
    km.shutdown_kernel(now=True)

km, kc = start_new_kernel(kernel_name="python3")
for _ in range(20):
    run(kc, "x = 1")
warm = []
for _ in range(n_warm):
    t = time.perf_counter()
    run(kc, "x = 1")
    warm.append(time.perf_counter() - t)
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps({"warm_s": warm, "cold_s": cold, "ipykernel": ipykernel.__version__,
                  "versions": {"ipykernel": ipykernel.__version__,
                               "jupyter_client": jupyter_client.__version__,
                               "python": sys.version.split()[0]}}))
