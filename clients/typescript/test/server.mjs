// A real `kernelbox serve` for the tests (as clients/python/tests does it): the cargo-built
// binary (`target/debug/kernelbox` at the repository's root, or KERNELBOX_BIN) on a free
// loopback port, a temporary state directory and a tenants file, every container labelled
// with this run's case label. `stop()` sends SIGTERM, then asks the Docker engine whether
// anything with the label is left. A missing binary or engine fails the run: nothing is skipped.

import { spawn, execFileSync } from "node:child_process";
import { createHash, randomUUID } from "node:crypto";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const HERE = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(HERE, "..", "..", "..");
export const BIN = process.env.KERNELBOX_BIN || join(REPO, "target", "debug", "kernelbox");
const CASE_KEY = "io.kernelbox-test.case";
const START_DEADLINE_MS = 60_000;
const STOP_DEADLINE_MS = 90_000;

/** The tenants most tests use: `main`, `tiny` (one kernel, to hit a cap), `other` (isolation). */
export const TENANTS = { main: { max_kernels: 8 }, tiny: { max_kernels: 1 }, other: { max_kernels: 4 } };

/** Containers (or volumes) carrying every `KEY=VALUE` label, asked of the engine. */
export function dockerIds(labels, { volumes = false } = {}) {
  const args = volumes ? ["volume", "ls", "-q"] : ["ps", "-aq"];
  for (const l of labels) args.push("--filter", `label=${l}`);
  return execFileSync("docker", args, { encoding: "utf8", timeout: 30_000 }).split(/\s+/).filter(Boolean);
}

export async function startServer({ tenants = TENANTS, extra = [] } = {}) {
  if (!existsSync(BIN)) throw new Error(`the kernelbox binary is missing at ${BIN}: build it with \`cargo build\` (or point KERNELBOX_BIN at one)`);
  const tmp = mkdtempSync(join(tmpdir(), "kernelbox-ts-"));
  const caseLabel = `tsclient-${randomUUID().slice(0, 8)}`;
  const tokens = {};
  const entries = [];
  for (const [name, entry] of Object.entries(tenants)) {
    tokens[name] = `tok-${name}-${randomUUID()}`;
    entries.push({ name, token_sha256: createHash("sha256").update(tokens[name]).digest("hex"), ...entry });
  }
  writeFileSync(join(tmp, "tenants.json"), JSON.stringify({ tenants: entries }));
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("KERNELBOX_")));
  // No warm pool: tests find a session's kernel by its owner labels, which a pooled kernel lacks.
  const args = ["serve", "--listen", "127.0.0.1:0", "--state-dir", join(tmp, "state"), "--tenants", join(tmp, "tenants.json"),
    "--label", `${CASE_KEY}=${caseLabel}`, "--pool", "0", ...extra];
  const proc = spawn(BIN, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  const log = [];
  const url = await new Promise((resolveUrl, reject) => {
    let pending = "";
    const timer = setTimeout(() => { proc.kill("SIGKILL"); reject(new Error(`kernelbox serve said nothing within ${START_DEADLINE_MS} ms: ${log.join("")}`)); }, START_DEADLINE_MS);
    proc.stderr.setEncoding("utf8");
    // Drained for the server's whole life so it never blocks on a full pipe.
    proc.stderr.on("data", (chunk) => {
      log.push(chunk);
      pending += chunk;
      const m = /\son (http:\/\/\S+)/.exec(pending);
      if (m) { clearTimeout(timer); resolveUrl(m[1]); }
    });
    proc.on("exit", (code) => { clearTimeout(timer); reject(new Error(`kernelbox serve exited (${code}): ${log.join("")}`)); });
  });
  const label = `${CASE_KEY}=${caseLabel}`;
  return {
    url, tokens, label, log,
    token: (tenant = "main") => tokens[tenant],
    containers: (...labels) => dockerIds([label, ...labels]),
    /** SIGTERM; asserts a clean exit and nothing left behind. */
    async stop() {
      const code = await new Promise((res) => {
        if (proc.exitCode !== null) return res(proc.exitCode);
        const t = setTimeout(() => { proc.kill("SIGKILL"); res("killed after the stop deadline"); }, STOP_DEADLINE_MS);
        proc.once("exit", (c) => { clearTimeout(t); res(c); });
        proc.kill("SIGTERM");
      });
      rmSync(tmp, { recursive: true, force: true });
      if (code !== 0) throw new Error(`kernelbox serve exited ${code}: ${log.join("")}`);
      const left = dockerIds([label]);
      const volumes = dockerIds([label], { volumes: true });
      if (left.length || volumes.length) throw new Error(`left behind: containers ${left} volumes ${volumes}`);
    },
  };
}

let counter = 0;
/** A session name unique to the test. */
export function sessionName(what) {
  return `${what.replace(/[^A-Za-z0-9._-]/g, "-").slice(0, 60)}-${process.pid}-${++counter}`;
}
