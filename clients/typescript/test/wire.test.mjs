// The wire rules without a server: line splitting, stream events, error mapping, paths.

import { test } from "node:test";
import assert from "node:assert/strict";

import { ExecuteStreamReader, filePath, lines, sessionPath } from "../dist/wire.js";
import { BadRequest, Conflict, ConnectionFailed, errorFor, errorFromResponse, NotFound, PayloadTooLarge, ServerError, TooManyRequests } from "../dist/index.js";

const enc = new TextEncoder();
const body = (chunks) => new ReadableStream({ start(c) { for (const x of chunks) c.enqueue(enc.encode(x)); c.close(); } });

test("lines split across chunks, multi-byte characters included", async () => {
  const e = enc.encode("é\n");
  const out = [];
  const stream = new ReadableStream({ start(c) { c.enqueue(enc.encode("a\nb")); c.enqueue(e.subarray(0, 1)); c.enqueue(e.subarray(1)); c.enqueue(enc.encode("\nlast")); c.close(); } });
  for await (const l of lines(stream)) out.push(l);
  assert.deepEqual(out, ["a", "bé", "", "last"]);
  const empty = [];
  for await (const l of lines(body(["x\n", "\n"]))) empty.push(l);
  assert.deepEqual(empty, ["x", ""]);
});

test("a stream's error event is the typed error; a stream cut before its result is ConnectionFailed", () => {
  const r = new ExecuteStreamReader();
  assert.deepEqual(r.feed('{"event":"output","data":"a","stream":"stderr"}'), { type: "output", text: "a", stream: "stderr" });
  // A server that names no stream (older ones) sent stdout.
  assert.deepEqual(r.feed('{"event":"output","data":"a"}'), { type: "output", text: "a", stream: "stdout" });
  assert.equal(r.feed('{"event":"something_new"}'), undefined);
  assert.throws(() => r.feed('{"event":"error","error":{"code":"session_busy","message":"busy"}}'), (e) => e instanceof TooManyRequests && e.status === undefined);
  assert.throws(() => new ExecuteStreamReader().feed('{"event":"error","error":{"code":"kernel_unavailable","message":"m"}}'), ServerError);
  assert.throws(() => new ExecuteStreamReader().finish(), (e) => e instanceof ConnectionFailed && e.code === "stream_ended");
});

test("a stream's error code is the class its HTTP status would be", () => {
  const classOf = (code) => errorFor(undefined, code, "m").constructor;
  const expected = {
    invalid_timeout: BadRequest, network_not_allowed: BadRequest, tool_not_allowed: BadRequest,
    no_kernel: NotFound, workspace_not_found: NotFound, workspace_in_use: Conflict, file_too_large: PayloadTooLarge,
    at_capacity: TooManyRequests, too_many_workspaces: TooManyRequests, too_many_commands: TooManyRequests,
    kernel_unavailable: ServerError, workspaces_full: ServerError, constructor: ServerError, toString: ServerError,
  };
  assert.deepEqual(Object.fromEntries(Object.keys(expected).map((c) => [c, classOf(c).name])),
    Object.fromEntries(Object.entries(expected).map(([c, cls]) => [c, cls.name])));
});

test("an answer that is not kernelbox's JSON keeps its status and the start of its body", () => {
  const e = errorFromResponse(502, new Headers({ "retry-after": "7" }), "<html>bad gateway</html>");
  assert.ok(e instanceof ServerError);
  assert.deepEqual([e.status, e.code, e.detail, e.retryAfter], [502, "http_502", "<html>bad gateway</html>", 7]);
  assert.equal(errorFor(418, "teapot", "m").constructor.name, "KernelboxError");
});

test("names and paths are percent-encoded, dots included", () => {
  assert.equal(sessionPath("a b", "execute"), "/v1/sessions/a%20b/execute");
  assert.equal(sessionPath(".."), "/v1/sessions/..%2F");
  assert.equal(filePath("s", "."), "/v1/sessions/s/files");
  assert.equal(filePath("s", "d/../x y"), "/v1/sessions/s/files/d%2F..%2Fx%20y");
  assert.equal(filePath("s", ".."), "/v1/sessions/s/files/..%2F");
});
