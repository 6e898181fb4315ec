// The client against a real `kernelbox serve`: state, reset, timeouts, streaming, rich
// results, abort, interrupt, tenants, commands, settings, network, kernels, usage.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { spawn } from "node:child_process";

import { BadRequest, Client, RichResult } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

let server;
let kb;
before(async () => {
  server = await startServer();
  kb = new Client({ url: server.url, token: server.token() });
});
after(async () => {
  await server?.stop();
});

test("state persists across the cells of a session", async () => {
  const s = kb.session(sessionName("state"));
  const first = await s.run("x = 41");
  const second = await s.run("print(x + 1)");
  assert.deepEqual([first.status, first.output, first.exitCode, first.error], ["success", "", 0, undefined]);
  assert.equal(first.kernel.reused, false);
  assert.equal(first.kernel.executionCount, 1);
  assert.equal(second.output, "42\n");
  assert.ok(second.ok);
  assert.equal(second.kernel.reused, true);
  assert.equal(second.kernel.executionCount, 2);
  assert.equal(second.kernel.id, first.kernel.id);
  assert.equal(second.raw.output, "42\n");
  assert.equal(await s.close(), 1);
  assert.equal(await s.close(), 0);
});

test("stdout and stderr come apart, a raised cell's exception is typed, and a Bash kernel is the session's own", async () => {
  const s = kb.session(sessionName("streams"));
  const r = await s.run("import sys\nprint('out')\nprint('err', file=sys.stderr)\n1/0");
  assert.equal(r.status, "error");
  assert.equal(r.stdout, "out\n");
  assert.equal(r.stderr, "err\n");
  assert.equal(r.exception?.name, "ZeroDivisionError");
  assert.equal(r.exception?.value, "division by zero");
  assert.match(r.exception?.traceback ?? "", /ZeroDivisionError/);
  await s.run("x = 1");
  const sh = await s.run("cd /tmp && echo $((6 * 7)) && pwd", { language: "bash" });
  assert.deepEqual([sh.status, sh.stdout], ["success", "42\n/tmp\n"]);
  const langs = (await kb.kernels()).filter((k) => k.session === s.name).map((k) => k.language).sort();
  assert.deepEqual(langs, ["bash", "python"]);
  assert.equal((await s.run("print(x)")).output, "1\n");
  // The contexts share /work, are listed, and one ends alone (docs/contract.md, "Languages").
  await s.run("echo shared > /work/f.txt", { language: "bash" });
  assert.equal((await s.run("print(open('f.txt').read(), end='')")).output, "shared\n");
  const contexts = (await s.contexts()).map((k) => `${k.context}:${k.language}`).sort();
  assert.deepEqual(contexts, ["bash:bash", "python:python"]);
  assert.equal(await s.endContext("bash"), 1);
  assert.equal(await s.endContext("bash"), 0);
  assert.deepEqual((await s.contexts()).map((k) => k.context), ["python"]);
  assert.equal(await s.close(), 1);
});

test("reset starts the session from a fresh kernel", async () => {
  const s = kb.session(sessionName("reset"));
  const first = await s.run("x = 1");
  const r = await s.run("print('x' in globals())", { reset: true });
  assert.equal(r.output, "False\n");
  assert.equal(r.kernel.stateReset, true);
  assert.notEqual(r.kernel.id, first.kernel.id);
  await s.close();
});

test("a cell past its timeout loses the kernel, and the next run says so", async () => {
  const s = kb.session(sessionName("timeout"));
  await s.run("x = 1");
  const r = await s.run("import time\ntime.sleep(30)", { timeout: 1 });
  assert.equal(r.status, "timeout");
  const next = await s.run("print('x' in globals())");
  assert.equal(next.output, "False\n");
  assert.equal(next.kernel.stateLost?.reason, "timeout");
  assert.match(next.kernel.stateLost?.at ?? "", /^\d{4}-\d\d-\d\dT/);
  assert.ok(next.kernel.generation > r.kernel.generation || next.kernel.id !== r.kernel.id);
  await s.close();
});

test("a failing cell is a result, not an exception", async () => {
  const s = kb.session(sessionName("raises"));
  const r = await s.run("print('before')\n1 / 0");
  assert.deepEqual([r.status, r.exitCode, r.ok], ["error", 1, false]);
  assert.ok(r.output.startsWith("before\n"));
  assert.match(r.error ?? "", /ZeroDivisionError/);
  await s.close();
});

// A cell-side helper: a valid RGB PNG of w x h pixels, standard library only.
const MAKE_PNG = `
import struct, zlib
def make_png(w, h):
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    rows = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * w for _ in range(h))
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
class Picture:
    def __init__(self, w, h): self.w, self.h = w, h
    def _repr_png_(self): return make_png(self.w, self.h)
    def __repr__(self): return f"Picture({self.w}x{self.h})"
class Table:
    def _repr_html_(self): return "<table><tr><td>1</td></tr></table>"
    def __repr__(self): return "Table()"
`;

function pngSize(png) {
  assert.deepEqual([...png.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
  const view = new DataView(png.buffer, png.byteOffset, png.byteLength);
  return [view.getUint32(16), view.getUint32(20)];
}

test("a PNG result is decoded to bytes; the last expression is the main result", async () => {
  const s = kb.session(sessionName("png"));
  await s.run(MAKE_PNG);
  const r = await s.run("Picture(4, 3)");
  assert.equal(r.results.length, 1);
  const main = r.mainResult;
  assert.ok(main instanceof RichResult && main.isMainResult);
  assert.ok(main.png instanceof Uint8Array);
  assert.deepEqual(pngSize(main.png), [4, 3]);
  assert.equal(main.text, "Picture(4x3)");
  assert.ok(main.formats.includes("image/png"));
  const html = (await s.run("Table()")).mainResult;
  assert.equal(html.html, "<table><tr><td>1</td></tr></table>");
  assert.equal(html.png, undefined);
  await s.close();
});

test("output and display events stream in the order the cell made them", async () => {
  const s = kb.session(sessionName("order"));
  await s.run(MAKE_PNG);
  const code = "print('a', flush=True)\ndisplay(Picture(1, 2))\nprint('b', flush=True)\ndisplay(Table(), Picture(2, 1))";
  const seen = [];
  let last;
  for await (const event of s.stream(code)) {
    if (event.type === "output") seen.push(["output", event.text]);
    else if (event.type === "display") seen.push(["display", event.result.png ? pngSize(event.result.png) : event.result.formats[0]]);
    else { seen.push(["result", event.execution.status]); last = event.execution; }
  }
  assert.deepEqual(seen, [
    ["output", "a\n"], ["display", [1, 2]], ["output", "b\n"], ["display", "text/html"], ["display", [2, 1]], ["result", "success"],
  ]);
  assert.deepEqual(last.results.map((x) => x.isMainResult), [false, false, false]);
  // The callbacks of run() see the same order.
  const calls = [];
  const r = await s.run(code, { onOutput: (t) => calls.push(t), onDisplay: (d) => calls.push(d.formats.join(",")) });
  assert.deepEqual(calls, ["a\n", "image/png,text/plain", "b\n", "text/html,text/plain", "image/png,text/plain"]);
  assert.equal(r.output, "a\nb\n");
  await s.close();
});

test("abort mid-cell stops the request, not the kernel: the cell finishes and its state is kept", async () => {
  const s = kb.session(sessionName("abort"));
  await s.run("x = 1");
  const controller = new AbortController();
  // Not 3 s: aborting a request in flight makes Node's fetch (undici) open a spare connection
  // it sends nothing on, which the server closes at --first-header-timeout (3 s); the runs
  // below, waiting for this cell, would then be sent on it just as it closes, and a POST
  // is never sent again (docs/typescript-client.md, "Connections").
  const started = s.run("import time\nprint('started', flush=True)\ntime.sleep(1)\nx = 2\nprint('done', flush=True)", {
    signal: controller.signal,
    onOutput: () => controller.abort(),
  });
  await assert.rejects(started, (e) => e.name === "AbortError");
  // The kernel went on with the cell: the next one runs after it, in the same kernel.
  const r = await s.run("print(x)");
  assert.equal(r.output, "2\n");
  assert.equal(r.kernel.reused, true);
  assert.equal(r.kernel.stateLost, undefined);
  // An already-aborted signal sends nothing.
  await assert.rejects(s.run("x = 3", { signal: AbortSignal.abort() }), (e) => e.name === "AbortError");
  assert.equal((await s.run("print(x)")).output, "2\n");
  await s.close();
});

test("a stream its consumer drops half-read does not keep Node running for its deadline", async () => {
  const name = sessionName("dropped");
  // One event taken, the iterator dropped without return(): the run's hour-long deadline
  // must not hold the process (nor must a file stream never read).
  const script = `
    import { Client } from ${JSON.stringify(new URL("../dist/index.js", import.meta.url).href)};
    const s = new Client().session(${JSON.stringify(name)});
    const it = s.stream("print(1)")[Symbol.asyncIterator]();
    if ((await it.next()).value.type !== "output") process.exit(3);
    await s.files.write("f", "abc");
    await s.files.read("f", { as: "stream" });
    await s.close();
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], {
    env: { ...process.env, KERNELBOX_URL: server.url, KERNELBOX_TOKEN: server.token() },
    stdio: ["ignore", "ignore", "inherit"],
  });
  // A generous bound, far below the hour the deadline would hold it.
  const killer = setTimeout(() => child.kill("SIGKILL"), 120_000);
  const [code, signal] = await new Promise((res) => child.once("exit", (c, sig) => res([c, sig])));
  clearTimeout(killer);
  assert.deepEqual([code, signal], [0, null]);
});

test("interrupt stops a running cell and keeps its kernel", async () => {
  const s = kb.session(sessionName("interrupt"));
  let interrupted;
  const r = await s.run("import time\nprint('started', flush=True)\ntime.sleep(60)", {
    onOutput: () => { interrupted ??= s.interrupt(); },
  });
  assert.equal(await interrupted, 1);
  assert.equal(r.status, "interrupted");
  assert.equal((await s.run("pass")).kernel.reused, true);
  assert.equal(await s.interrupt(), 0);
  await s.close();
});

test("two tenants are isolated: same session name, different kernels and files", async () => {
  const other = new Client({ url: server.url, token: server.token("other") });
  const name = sessionName("tenants");
  const mine = kb.session(name);
  const theirs = other.session(name);
  await mine.run("secret = 'main'");
  await mine.files.write("secret.txt", "main");
  const r = await theirs.run("print('secret' in globals())");
  assert.equal(r.output, "False\n");
  assert.notEqual(r.kernel.id, (await mine.run("pass")).kernel.id);
  assert.deepEqual((await theirs.files.list()).entries.map((e) => e.name).filter((n) => n === "secret.txt"), []);
  assert.deepEqual((await other.kernels()).map((k) => k.tenant), ["other"]);
  assert.ok((await kb.kernels()).every((k) => k.tenant === "main"));
  await mine.close();
  await theirs.close();
});

test("a child has its own kernel", async () => {
  const name = sessionName("child");
  const parent = kb.session(name);
  const child = kb.session(name, { child: "helper-1" });
  await parent.run("who = 'parent'");
  await child.run("who = 'child'");
  assert.equal((await parent.run("print(who)")).output, "parent\n");
  assert.equal((await child.run("print(who)")).output, "child\n");
  assert.equal(await child.close(), 1);
  assert.equal((await parent.run("print(who)")).output, "parent\n");
  await parent.close();
});

test("commands run beside the kernel, foreground and streamed", async () => {
  const s = kb.session(sessionName("commands"));
  const r = await s.commands.run(["sh", "-c", "echo out; echo err >&2; exit 3"]);
  assert.deepEqual([r.exitCode, r.stdout, r.stderr, r.timedOut, r.ok], [3, "out\n", "err\n", false, false]);
  const piped = await s.commands.run("cat; pwd", { stdin: "hello\n", env: { A: "1" } });
  assert.equal(piped.stdout, "hello\n/work\n");
  const out = [];
  const err = [];
  const streamed = await s.commands.run("echo one; echo two >&2", { onStdout: (t) => out.push(t), onStderr: (t) => err.push(t) });
  assert.deepEqual([out.join(""), err.join(""), streamed.ok], ["one\n", "two\n", true]);
  const slow = await s.commands.run("sleep 30", { timeout: 1 });
  assert.equal(slow.timedOut, true);
  assert.throws(() => kb.session(s.name, { child: "c" }).commands.stream("true"), TypeError);
  await s.close();
});

test("settings and labels round-trip; kernels filter by label", async () => {
  const s = kb.session(sessionName("settings"));
  assert.deepEqual(await s.settings(), {});
  const applied = await s.setSettings({ env: { GREETING: "hi" }, idleTimeout: 120, labels: { team: "ts" } });
  assert.equal(applied.restartRequired, false);
  assert.deepEqual(applied.settings.env, { GREETING: "hi" });
  assert.equal(applied.settings.idleTimeout, 120);
  assert.equal((await s.run("import os\nprint(os.environ['GREETING'])")).output, "hi\n");
  const labelled = await kb.kernels({ labels: { team: "ts" } });
  assert.deepEqual(labelled.map((k) => [k.session, k.labels]), [[s.name, { team: "ts" }]]);
  await assert.rejects(s.setSettings({ memory: "lots" }), BadRequest);
  await s.close();
});

test("usage reports this tenant's cells", async () => {
  const s = kb.session(sessionName("usage"));
  await s.run("pass");
  await s.close();
  const report = await kb.usage();
  assert.equal(report.groupBy, "session");
  assert.ok(report.to >= report.from);
  assert.ok(report.rows.every((r) => r.tenant === "main"));
});
