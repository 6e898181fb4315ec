// Files in and out of a session's kernel (docs/files.md) against a real server.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";

import { BadRequest, Client, NotFound } from "../dist/index.js";
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

const sha = (bytes) => createHash("sha256").update(bytes).digest("hex");
const MIB = 1024 * 1024;

test("10 MiB go up and come down byte for byte, as bytes and as a stream", async () => {
  const s = kb.session(sessionName("big"));
  const data = new Uint8Array(randomBytes(10 * MIB));
  const w = await s.files.write("data/big.bin", data);
  assert.deepEqual([w.path, w.size], ["/work/data/big.bin", 10 * MIB]);
  // The kernel reads what was sent.
  const inKernel = await s.run("import hashlib\nprint(hashlib.sha256(open('data/big.bin','rb').read()).hexdigest())");
  assert.equal(inKernel.output.trim(), sha(data));
  const back = await s.files.read("data/big.bin");
  assert.ok(back instanceof Uint8Array);
  assert.equal(back.length, data.length);
  assert.equal(sha(back), sha(data));
  // A stream down, and a stream (async iterable of chunks) up.
  const stream = await s.files.read("data/big.bin", { as: "stream" });
  const hash = createHash("sha256");
  let size = 0;
  for await (const chunk of stream) { hash.update(chunk); size += chunk.length; }
  assert.deepEqual([size, hash.digest("hex")], [data.length, sha(data)]);
  async function* chunks() { for (let i = 0; i < data.length; i += MIB) yield data.subarray(i, i + MIB); }
  const again = await s.files.write("data/again.bin", chunks());
  assert.equal(again.size, 10 * MIB);
  assert.equal(sha(await s.files.read("data/again.bin")), sha(data));
  // A cell's own file downloads exactly.
  await s.run("open('made.bin','wb').write(bytes(range(256)) * 4096)");
  const made = await s.files.read("made.bin");
  assert.equal(made.length, 256 * 4096);
  assert.deepEqual([...made.subarray(0, 4)], [0, 1, 2, 3]);
  assert.equal(made[made.length - 1], 255);
  await s.close();
});

test("text, a Blob and a ReadableStream go up; text comes down", async () => {
  const s = kb.session(sessionName("text"));
  await s.files.write("hello.txt", "héllo\n");
  assert.equal(await s.files.read("hello.txt", { as: "text" }), "héllo\n");
  assert.equal((await s.run("print(open('hello.txt', encoding='utf-8').read(), end='')")).output, "héllo\n");
  await s.files.write("blob.txt", new Blob(["a", "b"]));
  assert.equal(await s.files.read("blob.txt", { as: "text" }), "ab");
  const rs = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode("streamed")); c.close(); } });
  assert.equal((await s.files.write("rs.txt", rs)).size, 8);
  assert.equal(await s.files.read("rs.txt", { as: "text" }), "streamed");
  await s.close();
});

test("list describes entries, remove deletes, a missing file is NotFound", async () => {
  const s = kb.session(sessionName("list"));
  await s.files.write("d/a.txt", "aaa");
  await s.files.write("d/sub/b.txt", "b");
  const listing = await s.files.list("d");
  const byName = Object.fromEntries(listing.entries.map((e) => [e.name, e]));
  assert.deepEqual(Object.keys(byName).sort(), ["a.txt", "sub"]);
  assert.deepEqual([byName["a.txt"].kind, byName["a.txt"].size, byName["sub"].kind], ["file", 3, "dir"]);
  assert.match(byName["a.txt"].modified, /^\d{4}-/);
  assert.equal(await s.files.remove("d/sub"), "/work/d/sub");
  assert.deepEqual((await s.files.list("d")).entries.map((e) => e.name), ["a.txt"]);
  await assert.rejects(s.files.read("d/sub/b.txt"), NotFound);
  // Paths outside the working directory reach the server, which refuses them.
  for (const path of ["../etc/passwd", "/etc/passwd", "a/../../x", ".."]) {
    await assert.rejects(s.files.read(path), (e) => e instanceof BadRequest && e.code === "invalid_path", path);
    await assert.rejects(s.files.write(path, "x"), (e) => e instanceof BadRequest && e.code === "invalid_path", path);
  }
  await s.close();
});

test("a directory comes down as a tar and goes up as one", async () => {
  const s = kb.session(sessionName("tar"));
  await s.files.write("src/x.txt", "x");
  await s.files.write("src/deep/y.txt", "yy");
  const tar = await s.files.read("src", { tar: true });
  assert.ok(tar.length >= 3 * 512);
  const w = await s.files.write("copy", tar, { tar: true });
  assert.equal(w.files, 2);
  assert.equal(await s.files.read("copy/deep/y.txt", { as: "text" }), "yy");
  await s.close();
});

test("another tenant's session of the same name has none of these files", async () => {
  const name = sessionName("iso");
  await kb.session(name).files.write("mine.txt", "mine");
  const other = new Client({ url: server.url, token: server.token("other") }).session(name);
  await assert.rejects(other.files.read("mine.txt"), NotFound);
  await kb.session(name).close();
  await other.close();
});

test("a streamed read is the caller's: its signal aborts it mid-body", async () => {
  const s = kb.session(sessionName("abortread"));
  await s.files.write("big.bin", new Uint8Array(8 * MIB));
  const controller = new AbortController();
  const stream = await s.files.read("big.bin", { as: "stream", signal: controller.signal });
  const reader = stream.getReader();
  const first = await reader.read();
  assert.ok(!first.done && first.value.length > 0);
  controller.abort();
  await assert.rejects(async () => { for (;;) if ((await reader.read()).done) break; }, (e) => e.name === "AbortError");
  assert.equal((await s.files.list()).entries.find((e) => e.name === "big.bin")?.size, 8 * MIB);
  await s.close();
});
