// Background processes (docs/processes.md) through `session.processes`, against a real
// server: a process runs beside the kernel, its output is read (kept, then live, then its exit
// code), a bounded read stops without stopping it, stdin is written and closed, a kill ends it,
// refusals are typed.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { Client, Conflict, NotFound, Timeout } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

let server;
let kb;
before(async () => {
  server = await startServer({ tenants: { main: { max_kernels: 2 } } });
  kb = new Client({ url: server.url, token: server.token("main") });
});
after(async () => {
  await server?.stop();
});

test("a process runs on beside the kernel; its output, stdin and exit code", async () => {
  const s = kb.session(sessionName("proc"));
  const p = await s.processes.start("echo started; read line; echo got $line; echo err >&2; exit 7", { stdin: true });
  assert.ok(p.running && p.stdinOpen && p.exitCode === undefined, JSON.stringify(p));
  const first = await s.processes.output(p.id, { timeout: 2 });
  assert.ok(first.running, JSON.stringify(first));
  assert.equal(first.stdout, "started\n");
  assert.equal((await s.run("print(6 * 7)")).output, "42\n");
  assert.equal(await s.processes.writeStdin(p.id, "hello\n"), 6);
  const done = await s.processes.wait(p.id, { timeout: 60 });
  assert.deepEqual([done.running, done.exitCode], [false, 7]);
  const out = await s.processes.output(p.id);
  assert.deepEqual([out.stdout, out.stderr, out.exitCode, out.running], ["started\ngot hello\n", "err\n", 7, false]);
  // Both streams, each in its order (two pipes: their order between each other is not kept).
  assert.deepEqual(out.output.split("\n").sort(), ["", "err", "got hello", "started"]);
  const kinds = [];
  for await (const e of s.processes.stream(p.id)) kinds.push(e.type);
  assert.equal(kinds.at(-1), "exit");
  assert.deepEqual((await s.processes.list()).map((q) => q.id), [p.id]);
  await assert.rejects(s.processes.writeStdin(p.id, "late\n"), (e) => e instanceof Conflict && e.code === "stdin_closed");
  await s.close();
});

test("close stdin, kill, and refusals", async () => {
  const s = kb.session(sessionName("proc2"));
  const cat = await s.processes.start(["cat"], { stdin: true });
  await s.processes.writeStdin(cat.id, new TextEncoder().encode("bytes\n"));
  assert.equal((await s.processes.closeStdin(cat.id)).stdinOpen, false);
  assert.equal((await s.processes.wait(cat.id, { timeout: 60 })).exitCode, 0);
  assert.equal((await s.processes.output(cat.id)).stdout, "bytes\n");
  const sleeper = await s.processes.start("sleep 300");
  await assert.rejects(s.processes.wait(sleeper.id, { timeout: 0.5 }), (e) => e instanceof Timeout);
  assert.ok((await s.processes.get(sleeper.id)).running);
  let killed;
  for (let i = 0; i < 100 && killed === undefined; i++) {
    try {
      killed = await s.processes.kill(sleeper.id);
    } catch (e) {
      if (!(e instanceof Conflict && e.code === "process_starting")) throw e;
      await s.processes.output(sleeper.id, { timeout: 0.1 });
    }
  }
  assert.ok(killed && !killed.running && killed.exitCode !== undefined, JSON.stringify(killed));
  await assert.rejects(s.processes.get(12345678), (e) => e instanceof NotFound);
  await assert.rejects(s.processes.signal(cat.id, "SIGSEGV"), (e) => e.code === "invalid_signal");
  await assert.rejects(kb.session("x", { child: "c" }).processes.list(), TypeError);
  await s.close();
});
