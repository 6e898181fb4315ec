// The committed `dist/` (what users run, needing only Node) is exactly what `tsc` makes of
// `src/`: compiled afresh into a temporary directory and compared file by file.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "..");

function files(dir) {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    return statSync(path).isDirectory() ? files(path) : [path];
  });
}

test("dist/ is the compiled src/ (run `tsc -p clients/typescript` after changing src/)", () => {
  const out = mkdtempSync(join(tmpdir(), "kernelbox-ts-dist-"));
  try {
    execFileSync("tsc", ["-p", ROOT, "--outDir", out], { encoding: "utf8" });
    const fresh = files(out).map((f) => relative(out, f)).sort();
    const committed = files(join(ROOT, "dist")).map((f) => relative(join(ROOT, "dist"), f)).sort();
    assert.deepEqual(committed, fresh);
    for (const f of fresh) {
      assert.equal(readFileSync(join(ROOT, "dist", f), "utf8"), readFileSync(join(out, f), "utf8"), `dist/${f} is stale`);
    }
  } finally {
    rmSync(out, { recursive: true, force: true });
  }
});
