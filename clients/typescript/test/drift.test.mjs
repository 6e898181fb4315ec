// The client cannot drift from the server: every schema a real server's `/openapi.json`
// reaches from the client's routes has a home in the client, and each interface mirroring a
// schema (`MIRRORS`) has, field by field, the schema's type, optionality (absent or null on
// the wire: optional here) and enumeration values. The check is TypeScript's own: the
// schemas are compiled into types and compared with the client's declarations by `tsc`.

import { after, before, test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

import { COMMAND_STREAM_EVENTS, MIRRORS, PROCESS_STREAM_EVENTS, STREAM_EVENTS } from "../dist/index.js";
import { startServer } from "./server.mjs";

const DIST = resolve(dirname(fileURLToPath(import.meta.url)), "..", "dist", "index.js");

// Schemas the client handles without an interface of its own: the names it reads of each.
const HANDLED = {
  Error: ["error"],
  SnapshotList: ["snapshots"], // client.snapshots()
  SnapshotBody: ["name"], // session.snapshot({name})
  ForkBody: ["count", "sessions"], // session.fork(count | sessions)
  RestoreBody: ["snapshot"], // client.restore(id, session)
  Interrupted: ["interrupted"], // session.interrupt()
  Cleared: ["cleared"], // session.close()
  Released: ["released"], // a child's close()
  KernelList: ["kernels"], // client.kernels()
  ContextList: ["contexts"], // session.contexts()
  WorkspaceList: ["workspaces"], // client.workspaces()
  Deleted: ["deleted"], // files.remove(), client.deleteWorkspace()
  NetworkApplied: ["closed"], // session.setNetwork()
  ProcessList: ["processes"], // session.processes.list()
  StdinWritten: ["written"], // session.processes.writeStdin()
  SignalBody: ["signal"], // session.processes.signal(id, name)
};
// Routes that are not this client's (the operator's and tools').
const NOT_THE_CLIENTS = ["/v1/nodes", "/v1/admin", "/healthz", "/metrics", "/openapi.json", "/v1/mcp"];
// Answers described inline, by route: the fields the client reads.
const INLINE = {
  "get /v1/kernels": ["kernels"],
  "put /v1/sessions/{session}/files/{path}": ["path", "size", "files"],
  "put /v1/sessions/{session}/files": ["path", "size", "files"],
  "put /v1/sessions/{session}/workspace": ["path", "size", "files"],
  "delete /v1/sessions/{session}/files/{path}": ["deleted"],
  "get /v1/workspaces": ["workspaces"],
  "delete /v1/workspaces/{name}": ["deleted"],
};

let spec;
before(async () => {
  const server = await startServer({ tenants: { main: { max_kernels: 1 } } });
  try {
    const r = await fetch(server.url + "/openapi.json");
    assert.equal(r.status, 200);
    spec = await r.json();
  } finally {
    await server.stop();
  }
});

function* refs(node) {
  if (Array.isArray(node)) for (const v of node) yield* refs(v);
  else if (node && typeof node === "object") {
    if (typeof node.$ref === "string" && node.$ref.startsWith("#/components/schemas/")) yield node.$ref.split("/")[3];
    for (const v of Object.values(node)) yield* refs(v);
  }
}

// Routes this client does not cover (docs/typescript-client.md): whom a token stands for, and
// what happened lately (sessions' kernel events, the audit tail, egress refusals): the
// console's (docs/console.md). Each names one route whole.
const NOT_YET = ["/v1/whoami", "/v1/events", "/v1/audit", "/v1/egress/refusals", "/v1/sessions/{session}/events"];
const ours = (path) => !NOT_THE_CLIENTS.some((p) => path.startsWith(p)) && !NOT_YET.some((p) => path.startsWith(p));

function reachable() {
  const schemas = spec.components.schemas;
  const todo = [...refs(Object.fromEntries(Object.entries(spec.paths).filter(([p]) => ours(p))))];
  const seen = new Set();
  while (todo.length) {
    const name = todo.pop();
    if (seen.has(name)) continue;
    seen.add(name);
    todo.push(...refs(schemas[name]));
  }
  return seen;
}

const camel = (s) => s.replace(/_([a-z])/g, (_, c) => c.toUpperCase());

test("every schema the client's routes reach, and every field of it, has a home in the client", () => {
  const schemas = spec.components.schemas;
  const missing = [];
  for (const name of [...reachable()].sort()) {
    const props = Object.keys(schemas[name].properties ?? {});
    if (name in MIRRORS) continue; // the type check below
    if (name in HANDLED) missing.push(...props.filter((p) => !HANDLED[name].includes(p)).map((p) => `${name}.${p}`));
    else if (["ExecuteRequest", "CommandRequest", "ProcessRequest"].includes(name) || name.endsWith("Event")) continue;
    else if (props.length) missing.push(`${name} (the client has no type for it)`);
  }
  assert.deepEqual(missing, [], "the server defines what the client lacks");
});

test("every field of an inline answer is read", () => {
  const missing = [];
  for (const [path, methods] of Object.entries(spec.paths)) {
    if (!ours(path)) continue;
    for (const [method, op] of Object.entries(methods)) {
      for (const [status, response] of Object.entries(op?.responses ?? {})) {
        if (!status.startsWith("2")) continue;
        for (const media of Object.values(response.content ?? {})) {
          const props = Object.keys(media.schema?.properties ?? {});
          const known = INLINE[`${method} ${path}`];
          if (props.length && !known) missing.push(`${method.toUpperCase()} ${path} ${status} (no client type)`);
          else if (props.length) missing.push(...props.filter((p) => !known.includes(p)).map((p) => `${method} ${path}: ${p}`));
        }
      }
    }
  }
  assert.deepEqual(missing, []);
});

function events(union) {
  const schemas = spec.components.schemas;
  const { oneOf, discriminator } = schemas[union];
  assert.equal(discriminator.propertyName, "event");
  assert.deepEqual(oneOf.map((v) => v.$ref).sort(), [...new Set(Object.values(discriminator.mapping))].sort());
  for (const [event, ref] of Object.entries(discriminator.mapping)) {
    assert.equal(schemas[ref.split("/")[3]].properties.event.const, event, ref);
  }
  return Object.keys(discriminator.mapping).sort();
}

test("every stream event is understood", () => {
  assert.deepEqual(events("StreamEvent"), [...STREAM_EVENTS].sort());
  assert.deepEqual(events("CommandEvent"), [...COMMAND_STREAM_EVENTS].sort());
  assert.deepEqual(events("ProcessEvent"), [...PROCESS_STREAM_EVENTS].sort());
});

test("the walk sees the result types", () => {
  const seen = reachable();
  for (const name of ["CellResult", "KernelInfo", "StateLost", "KernelSummary", "Error", "CommandRequest", "CommandResult", "CommandEvent",
    "ProcessRequest", "ProcessInfo", "ProcessList", "ProcessEvent", "SignalBody", "StdinWritten"]) {
    assert.ok(seen.has(name), name);
  }
});

// --- The schemas as TypeScript, checked against the client's declarations by tsc ---

function nullable(schema) {
  if (Array.isArray(schema.type) && schema.type.includes("null")) {
    const rest = schema.type.filter((t) => t !== "null");
    return [true, { ...schema, type: rest.length === 1 ? rest[0] : rest }];
  }
  for (const key of ["anyOf", "oneOf"]) {
    const options = schema[key];
    if (Array.isArray(options) && options.some((o) => o.type === "null" && Object.keys(o).length === 1)) {
      const rest = options.filter((o) => !(o.type === "null" && Object.keys(o).length === 1));
      return [true, rest.length === 1 ? rest[0] : { ...schema, [key]: rest }];
    }
  }
  return [false, schema];
}

const SCALARS = { string: "string", integer: "number", number: "number", boolean: "boolean" };

/** The TypeScript type of a (non-null) schema, client types standing for mirrored schemas. */
const ANNOTATIONS = new Set(["description", "title", "format", "minimum", "maximum", "default", "examples"]);

/** A schema that says nothing of its type: any JSON value. */
const anyJson = (schema) => schema === true || (schema && Object.keys(schema).every((k) => ANNOTATIONS.has(k)));

function tsType(schema, where) {
  if (anyJson(schema)) return "unknown";
  if (schema.$ref) {
    const name = schema.$ref.split("/")[3];
    if (name in MIRRORS) return `K.${MIRRORS[name]}`;
    return tsType(spec.components.schemas[name], where);
  }
  if (Array.isArray(schema.enum)) return schema.enum.map((v) => JSON.stringify(v)).join(" | ");
  if (Array.isArray(schema.oneOf) && schema.oneOf.every((o) => "const" in o)) return schema.oneOf.map((o) => JSON.stringify(o.const)).join(" | ");
  if ("const" in schema) return JSON.stringify(schema.const);
  for (const key of ["anyOf", "oneOf"]) {
    if (Array.isArray(schema[key])) return schema[key].map((o) => `(${tsType(o, where)})`).join(" | ");
  }
  const t = schema.type;
  if (Array.isArray(t)) return t.map((x) => SCALARS[x] ?? `never /* ${x} at ${where} */`).join(" | ");
  if (t in SCALARS) return SCALARS[t];
  if (t === "array") return `Array<${tsType(schema.items ?? {}, where + "[]")}>`;
  if (t === "object" || t === undefined) {
    const values = schema.additionalProperties;
    return `Record<string, ${values && typeof values === "object" ? tsType(values, where + "{}") : "unknown"}>`;
  }
  throw new Error(`${where}: the drift test cannot translate ${JSON.stringify(schema)}`);
}

test("every mirrored interface has each field's type, optionality and values (checked by tsc)", () => {
  const schemas = spec.components.schemas;
  const out = [
    `import type * as K from ${JSON.stringify(DIST)};`,
    "type Eq<A, B> = (<T>() => T extends A ? 1 : 2) extends (<T>() => T extends B ? 1 : 2) ? true : false;",
  ];
  for (const [schemaName, tsName] of Object.entries(MIRRORS)) {
    const schema = schemas[schemaName];
    assert.ok(schema, `the server has no schema ${schemaName} any more`);
    const required = new Set(schema.required ?? []);
    const fields = [];
    for (const [wire, prop] of Object.entries(schema.properties ?? {})) {
      const [mayBeNull, inner] = nullable(prop);
      const optional = mayBeNull || !required.has(wire);
      // Any JSON value: the client may give it a more useful type; only its optionality is checked.
      const type = anyJson(inner) ? `Exclude<K.${tsName}["${camel(wire)}"], undefined>` : tsType(inner, `${schemaName}.${wire}`);
      fields.push(`  ${camel(wire)}${optional ? "?" : ""}: ${type};`);
    }
    out.push(`type Wire_${schemaName} = {\n${fields.join("\n")}\n};`);
    for (const wire of Object.keys(schema.properties ?? {})) {
      const f = camel(wire);
      // One line per field: tsc names the schema and field of any difference.
      out.push(`export const field_${schemaName}_${f}: Eq<Pick<K.${tsName}, "${f}">, Pick<Wire_${schemaName}, "${f}">> = true;`);
    }
  }
  // Every ExecuteRequest and CommandRequest field is an option of run() / commands.run().
  const opts = (name, skip) => Object.keys(schemas[name].properties).filter((p) => !skip.includes(p)).map((p) => JSON.stringify(camel(p)));
  out.push(`export const runOptions: Eq<Exclude<${opts("ExecuteRequest", ["code", "child"]).join(" | ")}, keyof K.RunOptions>, never> = true;`);
  out.push(`export const commandOptions: Eq<Exclude<${opts("CommandRequest", ["command"]).join(" | ")}, keyof K.CommandOptions>, never> = true;`);
  out.push(`export const processOptions: Eq<Exclude<${opts("ProcessRequest", ["command"]).join(" | ")}, keyof K.ProcessStartOptions>, never> = true;`);
  const dir = mkdtempSync(join(tmpdir(), "kernelbox-ts-drift-"));
  const file = join(dir, "drift.ts");
  writeFileSync(file, out.join("\n") + "\n");
  try {
    execFileSync("tsc", ["--noEmit", "--strict", "--exactOptionalPropertyTypes", "--target", "ES2022", "--module", "ES2022",
      "--moduleResolution", "node", "--lib", "ES2022,DOM", file], { encoding: "utf8" });
  } catch (e) {
    // Each error names the line of one field's check: reported as that field.
    const lines = `${e.stdout}${e.stderr}`.split("\n").filter(Boolean);
    const source = out.join("\n").split("\n");
    const named = lines.map((l) => {
      const m = /\((\d+),\d+\): (.*)$/.exec(l);
      const check = m ? /const (\w+)/.exec(source[Number(m[1]) - 1] ?? "") : null;
      return check ? `${check[1]}: ${m[2]}` : l;
    });
    assert.fail(`the client's types differ from the server's schemas (tsc on ${file}):\n${named.join("\n")}\n\n${source.join("\n")}`);
  }
  rmSync(dir, { recursive: true, force: true });
});
