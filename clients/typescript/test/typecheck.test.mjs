// The published declarations type a user's code as documented: test/usage.ts compiles under
// `tsc --strict` against dist/*.d.ts.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const USAGE = join(dirname(fileURLToPath(import.meta.url)), "usage.ts");

test("a strict TypeScript user's code type-checks against dist/", () => {
  try {
    execFileSync("tsc", ["--noEmit", "--strict", "--target", "ES2022", "--module", "ES2022", "--moduleResolution", "node", "--lib", "ES2022,DOM,DOM.Iterable", USAGE], { encoding: "utf8" });
  } catch (e) {
    assert.fail(`${e.stdout}${e.stderr}`);
  }
});
