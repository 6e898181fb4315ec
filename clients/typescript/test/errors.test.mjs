// Every refusal is a typed error carrying the server's code and message; transport failures
// are clear Timeout / ConnectionFailed errors.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:net";

import {
  BadRequest, Client, ConnectionFailed, KernelboxError, NotFound, PayloadTooLarge, Timeout, TooManyRequests, Unauthorized,
} from "../dist/index.js";
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

test("a wrong token is Unauthorized, and nothing starts", async () => {
  const name = sessionName("token");
  const bad = new Client({ url: server.url, token: "not-a-token" });
  const e = await bad.session(name).run("pass").catch((x) => x);
  assert.ok(e instanceof Unauthorized && e instanceof KernelboxError);
  assert.deepEqual([e.status, e.code], [401, "unauthorized"]);
  assert.equal(e.detail, "a valid `Authorization: Bearer TOKEN` header is required");
  assert.deepEqual(server.containers(`io.kernelbox.session=${name}`), []);
  // Refusals in a row on kept-alive connections stay typed.
  for (let i = 0; i < 50; i++) await assert.rejects(bad.session("s").run("1"), Unauthorized);
});

test("a bad session name is a BadRequest", async () => {
  for (const name of ["has space", "a::b", "x".repeat(129), "../etc", ".."]) {
    const e = await kb.session(name).run("pass").catch((x) => x);
    assert.ok(e instanceof BadRequest, String(e));
    assert.ok(["invalid_name", "invalid_path"].includes(e.code), e.code);
  }
});

test("a bad timeout is a BadRequest with the server's message", async () => {
  const e = await kb.session(sessionName("timeout")).run("pass", { timeout: -1 }).catch((x) => x);
  assert.ok(e instanceof BadRequest);
  assert.deepEqual([e.status, e.code], [400, "invalid_timeout"]);
  assert.match(e.detail, /is not a number of seconds in \(0, 3600\]$/);
});

test("a body over the limit is PayloadTooLarge", async () => {
  const e = await kb.session(sessionName("big")).run("#".repeat(1024 * 1024 + 1)).catch((x) => x);
  assert.ok(e instanceof PayloadTooLarge);
  assert.equal(e.code, "payload_too_large");
});

test("a wrong base URL is NotFound", async () => {
  const c = new Client({ url: server.url + "/api", token: server.token() });
  const e = await c.session("s").run("pass").catch((x) => x);
  assert.ok(e instanceof NotFound);
  assert.equal(e.detail, "no route for POST /api/v1/sessions/s/execute");
});

test("a tenant at its cap is TooManyRequests with retryAfter", async () => {
  // Tenant `tiny` may hold one kernel; while it runs a cell, a second session cannot evict it.
  const tiny = new Client({ url: server.url, token: server.token("tiny") });
  const busy = tiny.session(sessionName("busy"));
  let started;
  const isStarted = new Promise((r) => { started = r; });
  const holding = busy.run("import time\nprint('holding', flush=True)\ntime.sleep(60)", { onOutput: () => started() });
  try {
    await isStarted;
    const e = await tiny.session(sessionName("second")).run("pass").catch((x) => x);
    assert.ok(e instanceof TooManyRequests, String(e));
    assert.deepEqual([e.status, e.code, e.retryAfter], [429, "at_capacity", 1]);
    assert.match(e.detail, /tiny/);
  } finally {
    await busy.interrupt();
  }
  assert.equal((await holding).status, "interrupted");
  await busy.close();
});

test("an unreachable server is a clear ConnectionFailed", async () => {
  const probe = createServer();
  await new Promise((r) => probe.listen(0, "127.0.0.1", r));
  const port = probe.address().port;
  await new Promise((r) => probe.close(r));
  const e = await new Client({ url: `http://127.0.0.1:${port}`, token: "t" }).kernels().catch((x) => x);
  assert.ok(e instanceof ConnectionFailed, String(e));
  assert.equal(e.status, undefined);
  assert.match(e.message, new RegExp(`could not connect to kernelbox at GET http://127.0.0.1:${port}/v1/kernels`));
});

test("a server that never answers is a clear Timeout", async () => {
  const sockets = [];
  const silent = createServer((sock) => sockets.push(sock));
  await new Promise((r) => silent.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${silent.address().port}`;
  try {
    const c = new Client({ url, token: "t", timeout: 0.5 });
    const e = await c.kernels().catch((x) => x);
    assert.ok(e instanceof Timeout, String(e));
    assert.equal(e.message, `timeout: timed out waiting for kernelbox at GET ${url}/v1/kernels`);
    const r = await c.session("s").run("pass", { timeout: 0.5 }).catch((x) => x);
    assert.ok(r instanceof Timeout);
    assert.match(r.message, /the cell may still be running \(session\.interrupt\(\) stops it\)/);
  } finally {
    sockets.forEach((s) => s.destroy());
    await new Promise((r) => silent.close(r));
  }
});

test("a connection closed after the server read the request: a POST (cell, command) arrives exactly once, a GET or PUT is sent again once", async () => {
  // A server that reads each request whole, counts it, then closes without answering: the
  // client cannot tell this from a kept-alive connection closed idle, so it must not resend
  // what runs code.
  const arrived = new Map();
  const closer = createServer((sock) => {
    let got = Buffer.alloc(0);
    sock.on("data", (chunk) => {
      got = Buffer.concat([got, chunk]);
      const end = got.indexOf("\r\n\r\n");
      if (end < 0) return;
      const head = got.subarray(0, end).toString("latin1");
      const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      if (got.length < end + 4 + length) return;
      const line = head.split("\r\n")[0].split(" ").slice(0, 2).join(" ");
      arrived.set(line, (arrived.get(line) ?? 0) + 1);
      sock.destroy();
    });
    sock.on("error", () => {});
  });
  await new Promise((r) => closer.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${closer.address().port}`;
  try {
    const s = new Client({ url, token: "t" }).session("s");
    const calls = [
      ["POST /v1/sessions/s/execute", () => s.run("x = 1")],
      ["POST /v1/sessions/s/execute", () => s.run("x = 1", { onOutput: () => {} })],
      ["POST /v1/sessions/s/commands", () => s.commands.run("true")],
      ["DELETE /v1/sessions/s", () => s.close()],
      ["GET /v1/sessions/s/settings", () => s.settings()],
      ["PUT /v1/sessions/s/files/f", () => s.files.write("f", "abc")],
    ];
    for (const [line, call] of calls) {
      arrived.clear();
      const e = await call().catch((x) => x);
      assert.ok(e instanceof ConnectionFailed, `${line}: ${e}`);
      const once = !line.startsWith("GET") && !line.startsWith("PUT");
      assert.deepEqual([...arrived], [[line, once ? 1 : 2]], line);
      if (once) assert.match(e.message, /not sent again: the server may have received it/);
    }
  } finally {
    await new Promise((r) => closer.close(r));
  }
});

test("a workspace call for a tenant without workspaces is NotFound", async () => {
  const e = await kb.workspaces().catch((x) => x);
  assert.ok(e instanceof NotFound, String(e));
  assert.equal(e.code, "workspace_not_found");
});
