// The quick start runs as written, and the AI-SDK-shaped tool answers a scripted model call.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

import { Client, executeCodeTool } from "../dist/index.js";
import { sessionName, startServer } from "./server.mjs";

const EXAMPLE = join(dirname(fileURLToPath(import.meta.url)), "..", "examples", "quickstart.mjs");

let server;
before(async () => {
  server = await startServer();
});
after(async () => {
  await server?.stop();
});

test("examples/quickstart.mjs runs as is", async () => {
  const env = { ...process.env, KERNELBOX_URL: server.url, KERNELBOX_TOKEN: server.token() };
  const { stdout } = await promisify(execFile)(process.execPath, [EXAMPLE], { env, timeout: 120_000 });
  const lines = stdout.split("\n");
  assert.ok(lines.includes("output: area = 12.57"), stdout);
  assert.deepEqual(lines.filter((l) => l.startsWith("  live> tick")), ["  live> tick 0", "  live> tick 1", "  live> tick 2"]);
  assert.ok(lines.includes("a failing cell is a result: error ZeroDivisionError: division by zero"), stdout);
  assert.ok(lines.includes("file: hello from node"), stdout);
  assert.ok(lines.some((l) => l.startsWith("refused: BadRequest 400 invalid_timeout: timeout -1")), stdout);
  assert.ok(lines.includes("closed kernels: 1"), stdout);
});

test("the AI SDK tool: a scripted model's calls keep state, and failures are answers", async () => {
  const kb = new Client({ url: server.url, token: server.token() });
  const name = sessionName("tool");
  const tool = executeCodeTool(kb, name, { timeout: 60 });
  assert.equal(typeof tool.description, "string");
  assert.deepEqual(tool.parameters.required, ["code"]);
  assert.equal(tool.parameters.properties.code.type, "string");
  // What a framework does with a model's tool calls: parse the arguments, call execute.
  const script = ['{"code": "x = 6 * 7"}', '{"code": "print(x)"}', '{"code": "x / 0"}', '{"code": "x"}'];
  const answers = [];
  for (const args of script) answers.push(await tool.execute(JSON.parse(args), { abortSignal: new AbortController().signal }));
  assert.equal(answers[0], "(no output)");
  assert.equal(answers[1], "42\n");
  assert.match(answers[2], /\[error\].*ZeroDivisionError/s);
  assert.equal(answers[3], "42");
  assert.equal(await kb.session(name).close(), 1);
});
