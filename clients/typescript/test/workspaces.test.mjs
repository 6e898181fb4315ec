// Workspaces and the usage ledger, typed, against a server whose tenants file gives tenant `ws`
// workspaces (docs/workspaces.md), `plain` none, and `admin` the usage admin's reading.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { Client, Conflict, KernelboxError, NotFound, TooManyRequests } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

let server;
let ws;
let plain;
before(async () => {
  server = await startServer({
    tenants: {
      ws: { max_kernels: 2, workspaces: { quota: "64m", max: 4 } },
      plain: { max_kernels: 2 },
      admin: { max_kernels: 1, usage_admin: true },
      one: { max_kernels: 2, workspaces: { quota: "64m", max: 1 } },
    },
  });
  ws = new Client({ url: server.url, token: server.token("ws") });
  plain = new Client({ url: server.url, token: server.token("plain") });
});
after(async () => {
  // Every workspace a test made is deleted by it: stop() finds a left one.
  await server?.stop();
});

const MIB = 1024 * 1024;

test("a tenant at its workspace cap is TooManyRequests, streamed or not", async () => {
  const one = new Client({ url: server.url, token: server.token("one") });
  const held = one.session(sessionName("held"));
  const refused = one.session(sessionName("refused"));
  assert.ok((await held.run("pass")).ok);
  const capped = (e) => e instanceof TooManyRequests && e.code === "too_many_workspaces";
  await assert.rejects(refused.run("pass"), (e) => capped(e) && e.status === 429);
  // Streamed, the refusal comes after the 200, as the stream's `error` event.
  await assert.rejects(refused.run("pass", { onOutput: () => {} }), (e) => capped(e) && e.status === undefined);
  await held.close();
  await refused.close();
  assert.equal(await one.deleteWorkspace(held.name), held.name);
});

test("a workspace outlives its kernel, is listed, refused while mounted, and deleted", async () => {
  const name = sessionName("keep");
  const s = ws.session(name);
  const first = await s.run("open('/work/kept.txt', 'w').write('kept'); print('ok')");
  assert.ok(first.ok, first.output);
  assert.deepEqual(first.kernel.workspace, { name, restored: false });
  const listed = Object.fromEntries((await ws.workspaces()).map((w) => [w.name, w]));
  assert.equal(listed[name].inUse, true);
  assert.equal(listed[name].quotaBytes, 64 * MIB);
  await assert.rejects(ws.deleteWorkspace(name), (e) => e instanceof Conflict && e.code === "workspace_in_use");
  await s.close();
  const again = await s.run("print(open('/work/kept.txt').read())");
  assert.equal(again.output, "kept\n");
  assert.equal(again.kernel.workspace?.restored, true);
  await s.close();
  assert.equal(Object.fromEntries((await ws.workspaces()).map((w) => [w.name, w]))[name].inUse, false);
  assert.equal(await ws.deleteWorkspace(name), name);
  await assert.rejects(ws.deleteWorkspace(name), NotFound);
  await assert.rejects(plain.workspaces(), (e) => e instanceof NotFound && e.code === "workspace_not_found");
});

test("a workspace is saved and restored as a tar without a kernel", async () => {
  const name = sessionName("tar");
  const copy = sessionName("copy");
  const s = ws.session(name);
  assert.ok((await s.run("open('/work/data.txt', 'w').write('42')")).ok);
  await s.close();
  const chunks = [];
  for await (const chunk of await s.files.saveWorkspace()) chunks.push(chunk);
  const tar = Buffer.concat(chunks);
  assert.ok(tar.length >= 1024);
  assert.deepEqual(await ws.kernels(), []); // nothing was started to read it
  assert.ok(tar.includes(Buffer.from("data.txt")));
  const written = await ws.session(copy).files.restoreWorkspace(new Uint8Array(tar));
  assert.ok((written.files ?? 0) >= 1);
  assert.deepEqual(await ws.kernels(), []);
  const r = await ws.session(copy).run("print(open('/work/data.txt').read())");
  assert.equal(r.output, "42\n");
  assert.equal(r.kernel.workspace?.restored, true);
  await assert.rejects(ws.session(sessionName("none")).files.saveWorkspace(), NotFound);
  await ws.session(copy).close();
  for (const w of [name, copy]) await ws.deleteWorkspace(w);
});

test("usage is a typed report of the tenant's own cells; an admin reads another's by day", async () => {
  const name = sessionName("count");
  const s = plain.session(name);
  for (let i = 0; i < 3; i++) assert.ok((await s.run("x = 1")).ok);
  await s.close();
  const report = await plain.usage();
  assert.equal(report.groupBy, "session");
  assert.ok(report.from < report.to);
  assert.equal(report.rows.filter((r) => r.session === name).reduce((n, r) => n + r.cells, 0), 3);
  assert.deepEqual([...new Set(report.rows.map((r) => r.tenant))], ["plain"]);
  await assert.rejects(plain.usage({ tenant: "ws" }), (e) => e instanceof KernelboxError && e.status === 403 && e.code === "forbidden");
  const admin = new Client({ url: server.url, token: server.token("admin") });
  const byDay = await admin.usage({ groupBy: "day", tenant: "plain" });
  assert.equal(byDay.groupBy, "day");
  assert.ok(byDay.rows.filter((r) => r.tenant === "plain").reduce((n, r) => n + r.cells, 0) >= 3);
  assert.ok(byDay.rows.every((r) => r.session === ""));
});
