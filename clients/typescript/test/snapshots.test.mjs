// Snapshots, restore and fork (docs/snapshots.md), typed, against a server whose tenant
// `branchy` runs its kernels under runsc (gVisor checkpoints their memory) and `plain` under
// runc (files-only snapshots); and stdout and stderr apart in a streamed run's callbacks.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";

import { Client, NotFound } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

let server;
let branchy;
let plain;
before(async () => {
  server = await startServer({
    tenants: { branchy: { max_kernels: 6, runtime: "runsc" }, plain: { max_kernels: 2 } },
  });
  branchy = new Client({ url: server.url, token: server.token("branchy") });
  plain = new Client({ url: server.url, token: server.token("plain") });
});
after(async () => {
  await server?.stop();
});

test("a snapshot restores, a fork branches, and another tenant never sees it", async () => {
  const s = branchy.session(sessionName("src"));
  assert.ok((await s.run("x = 41")).ok);
  const snap = await s.snapshot({ name: "before" });
  assert.deepEqual([snap.memory, snap.name, snap.runtime, snap.session], [true, "before", "runsc", s.name]);
  assert.deepEqual((await branchy.snapshots()).map((x) => x.id), [snap.id]);
  assert.deepEqual(await branchy.snapshot(snap.id), snap);
  const again = sessionName("again");
  const restored = await branchy.restore(snap.id, again);
  assert.equal(restored.error, undefined);
  assert.equal(restored.kernel?.generation, 1);
  assert.equal((await branchy.session(again).run("print(x + 1)")).output, "42\n");
  const forks = await s.fork(2);
  assert.equal(forks.forks.length, 2);
  assert.ok(forks.forks.every((f) => f.kernel !== undefined && f.error === undefined), JSON.stringify(forks));
  const [first, second] = forks.forks.map((f) => branchy.session(f.session));
  await first.run("x = 0");
  assert.equal((await second.run("print(x)")).output, "41\n");
  assert.equal((await s.run("print(x)")).output, "41\n");
  // A fork into a session that has a kernel fails on its own.
  const fresh = sessionName("fresh");
  const named = await s.fork([again, fresh]);
  assert.equal(named.forks[0].error?.code, "session_exists");
  assert.ok(named.forks[1].kernel !== undefined);
  await assert.rejects(plain.snapshot(snap.id), NotFound);
  await assert.rejects(plain.restore(snap.id, sessionName("stolen")), NotFound);
  assert.deepEqual(await plain.snapshots(), []);
  assert.equal(await branchy.deleteSnapshot(snap.id), snap.id);
  assert.deepEqual(await branchy.snapshots(), []);
  for (const name of [s.name, again, fresh, ...forks.forks.map((f) => f.session)]) await branchy.session(name).close();
});

test("a runc kernel's snapshot is files-only and says so", async () => {
  const s = plain.session(sessionName("runc"));
  assert.ok((await s.run("x = 1\nopen('note.txt', 'w').write('kept')")).ok);
  const snap = await s.snapshot();
  assert.deepEqual([snap.memory, snap.runtime], [false, "runc"]);
  const files = sessionName("files");
  const restored = await plain.restore(snap.id, files);
  assert.equal(restored.error, undefined);
  assert.equal((await plain.session(files).run("print(open('note.txt').read(), 'x' in globals())")).output, "kept False\n");
  assert.equal(await plain.deleteSnapshot(snap.id), snap.id);
  await plain.session(files).close();
  await s.close();
});

test("onStdout and onStderr get one stream each, onOutput both, the traceback neither", async () => {
  const s = plain.session(sessionName("streams"));
  const got = { out: "", err: "", all: "" };
  const r = await s.run("import sys\nprint('o1')\nprint('e1', file=sys.stderr)\nprint('o2')\n1/0", {
    onStdout: (t) => { got.out += t; },
    onStderr: (t) => { got.err += t; },
    onOutput: (t) => { got.all += t; },
  });
  assert.equal(r.status, "error");
  assert.deepEqual([got.out, got.err], ["o1\no2\n", "e1\n"]);
  assert.match(got.all, /ZeroDivisionError/);
  assert.equal(r.exception?.name, "ZeroDivisionError");
  await s.close();
});
