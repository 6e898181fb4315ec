// kernelbox from Node, with nothing but the client: run it as is with
//   KERNELBOX_URL=http://127.0.0.1:8080 KERNELBOX_TOKEN=s3cret node clients/typescript/examples/quickstart.mjs
import { Client, KernelboxError } from "../dist/index.js";

const kb = new Client(); // KERNELBOX_URL, KERNELBOX_TOKEN
const s = kb.session("quickstart");

await s.run("import math\nr = 2");
let r = await s.run("print(f'area = {math.pi * r * r:.2f}')");
console.log("output:", r.output.trim());
console.log("kernel:", r.kernel.id, "cells run:", r.kernel.executionCount);

console.log("streaming:");
r = await s.run("import time\nfor i in range(3):\n    print('tick', i, flush=True)\n    time.sleep(0.2)", {
  onOutput: (text) => process.stdout.write(text.replace(/^(?=.)/gm, "  live> ")),
});
console.log(`status: ${r.status}`);

r = await s.run("1 / 0");
console.log("a failing cell is a result:", r.status, r.error?.trim().split("\n").at(-1));

await s.files.write("data/hello.txt", "hello from node\n");
console.log("file:", (await s.files.read("data/hello.txt", { as: "text" })).trim());

try {
  await s.run("pass", { timeout: -1 });
} catch (e) {
  if (!(e instanceof KernelboxError)) throw e;
  console.log(`refused: ${e.name} ${e.status} ${e.code}: ${e.detail}`);
}

for (const k of await kb.kernels()) console.log("live kernel:", k.session, k.state, "cells:", k.executionCount);
console.log("closed kernels:", await s.close());
