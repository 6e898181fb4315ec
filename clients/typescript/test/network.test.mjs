// session.setNetwork() and run({network}) against a server whose tenants file gives tenant
// `net` a network policy (a loopback HTTP server of this test) and `plain` none
// (docs/reliability.md, "Network egress").

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";

import { BadRequest, Client } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

const FETCH = (port) => `
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen("http://127.0.0.1:${port}/", timeout=15).read().decode())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode().strip())
`;

let hello;
let port;
let server;
before(async () => {
  hello = createServer((_, res) => res.end("hello"));
  await new Promise((r) => hello.listen(0, "127.0.0.1", r));
  port = hello.address().port;
  server = await startServer({
    tenants: { net: { max_kernels: 2, network: { allow: [`127.0.0.1:${port}`] } }, plain: { max_kernels: 2 } },
  });
});
after(async () => {
  await server?.stop();
  await new Promise((r) => hello.close(r));
});

test("setNetwork narrows the tenant's policy at once; run({network}) sets it first", async () => {
  const s = new Client({ url: server.url, token: server.token("net") }).session(sessionName("narrow"));
  assert.equal((await s.run(FETCH(port))).output, "hello\n");
  assert.equal(await s.setNetwork({ allow: ["example.com"] }), 0);
  assert.match((await s.run(FETCH(port))).output, /refused \(not_allowed\)/);
  assert.equal((await s.run(FETCH(port), { network: { allow: [`127.0.0.1:${port}`] } })).output, "hello\n");
  await assert.rejects(s.setNetwork({ allow: ["not a host"] }), (e) => e instanceof BadRequest && e.code === "invalid_network" && e.detail.includes("not a host"));
  await s.close();
});

test("a tenant without network cannot set one", async () => {
  const s = new Client({ url: server.url, token: server.token("plain") }).session(sessionName("plain"));
  for (const policy of [{ allow: ["pypi"] }, { allow: [], deny: ["pypi"] }]) {
    await assert.rejects(s.setNetwork(policy), (e) => e instanceof BadRequest && e.code === "network_not_allowed");
  }
  assert.equal(await s.setNetwork({ allow: [] }), 0);
  await s.close();
});
