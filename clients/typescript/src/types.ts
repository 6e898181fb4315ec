/**
 * What the server returns, as typed objects with camelCase fields.
 *
 * Each interface mirrors one schema of the server's `/openapi.json` (`MIRRORS` names which):
 * a field the server may omit or send as null is optional here (`undefined` when absent), an
 * enumeration is a union of its values. The drift test (test/drift.test.mjs) compiles the
 * server's schemas into TypeScript and checks each mirror field by field with `tsc`.
 * Fields a newer server adds stay readable in `raw` until the client learns them.
 */

import { isObject, ProtocolError } from "./errors.js";

/** Why a session's previous kernel was lost (docs/contract.md, loss reasons). */
export type LossReason =
  | "idle_reaped" | "evicted" | "timeout" | "oom" | "crashed" | "killed" | "engine_restarted"
  | "server_restarted" | "protocol" | "node_lost" | "runaway" | "node_drained" | "tenant_removed";

export interface StateLost {
  reason: LossReason;
  /** RFC 3339, UTC. */
  at: string;
  /** The session's workspace went too: `/work` is a new, empty workspace. */
  workspaceLost?: boolean;
}

/** The workspace a kernel's `/work` is (docs/workspaces.md). */
export interface WorkspaceInfo {
  name: string;
  /** Its files are an earlier kernel's. */
  restored: boolean;
}

/** How a hibernated kernel came back (docs/runtimes.md, "Hibernation"). */
export interface Restored {
  /** Why it had hibernated: `idle`, `evicted` or `restart`. */
  from: string;
  checkpointSeconds: number;
  restoreSeconds: number;
}

/** Where a kernel a cluster's drain moved came from (docs/cluster.md, "Migration on drain"). */
export interface Migrated {
  /** The node the kernel ran on before its drain. */
  fromNode: string;
}

/** The kernel that ran a cell. */
export interface KernelInfo {
  id: string;
  reused: boolean;
  executionCount: number;
  stateReset: boolean;
  ended: boolean;
  generation: number;
  /** Present when the session's previous kernel (and its state) was lost. */
  stateLost?: StateLost;
  /** Present when the tenant has workspaces. */
  workspace?: WorkspaceInfo;
  /** Present on the first call after the kernel came back from hibernation. */
  restored?: Restored;
  /** Present on the first call after a cluster's drain moved the kernel to another node. */
  migrated?: Migrated;
}

function b64decode(text: string): Uint8Array {
  const bin = atob(text.replace(/\s+/g, ""));
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * One rich result: a Jupyter MIME bundle (`display(...)` or a cell's last expression). `data`
 * maps MIME types to values as in nbformat (images base64); the getters decode them: `png`
 * and `jpeg` are bytes, `text`, `html`, `svg`, ... strings.
 */
export class RichResult {
  data: Record<string, unknown>;
  /** Per-MIME metadata, as in nbformat (an image's `width` and `height`). */
  metadata: Record<string, unknown>;
  /** The value of the cell's last expression (Jupyter's `execute_result`). */
  isMainResult: boolean;

  constructor(data: Record<string, unknown>, metadata: Record<string, unknown> = {}, isMainResult = false) {
    this.data = data;
    this.metadata = metadata;
    this.isMainResult = isMainResult;
  }

  /** The MIME types this result carries. */
  get formats(): string[] {
    return Object.keys(this.data);
  }

  private textOf(mime: string): string | undefined {
    const value = this.data[mime];
    if (value === undefined || value === null) return undefined;
    // nbformat allows a multi-line string as a list of lines.
    return Array.isArray(value) ? value.join("") : String(value);
  }

  get text(): string | undefined { return this.textOf("text/plain"); }
  get html(): string | undefined { return this.textOf("text/html"); }
  get markdown(): string | undefined { return this.textOf("text/markdown"); }
  get latex(): string | undefined { return this.textOf("text/latex"); }
  get svg(): string | undefined { return this.textOf("image/svg+xml"); }
  get png(): Uint8Array | undefined {
    const t = this.textOf("image/png");
    return t === undefined ? undefined : b64decode(t);
  }
  get jpeg(): Uint8Array | undefined {
    const t = this.textOf("image/jpeg");
    return t === undefined ? undefined : b64decode(t);
  }
  /** `application/json`, parsed when the kernel sent it as a string. */
  get json(): unknown {
    const value = this.data["application/json"];
    return typeof value === "string" ? JSON.parse(value) : value;
  }
}

export type CellStatus = "success" | "error" | "timeout" | "interrupted";

/** The result of one cell (docs/contract.md); `raw` is the JSON as the server sent it. */
/** The language of a session's kernel (docs/contract.md, "Languages"); `javascript` and `typescript` are refused for now. */
export type Language = "python" | "bash" | "javascript" | "typescript";

/** The exception a cell raised, typed (docs/contract.md, "stdout and stderr"). */
export interface CellException {
  /** The exception's class name, e.g. `ZeroDivisionError`. */
  name: string;
  /** Its text. */
  value: string;
  /** The formatted traceback. */
  traceback: string;
}

export interface Execution {
  /** `interrupted`: stopped by `session.interrupt()`, the kernel kept. */
  status: CellStatus;
  output: string;
  exitCode: number;
  toolCallsMade: number;
  durationSeconds: number;
  kernel: KernelInfo;
  error?: string;
  /** What the cell wrote on its stdout (fd 1). */
  stdout: string;
  /** What the cell wrote on its stderr (fd 2); not the traceback (that is in `exception`). */
  stderr: string;
  /** The exception the cell raised, when it raised. */
  exception?: CellException;
  results?: RichResult[];
  stdoutTruncated?: boolean;
  stdoutBytesTotal?: number;
  stdoutBytesOmitted?: number;
  warning?: string;
  hint?: string;
  /** Output bytes a streamed run never delivered (the server's `output_truncated`); `output` still has them. */
  streamBytesDropped: number;
  /** The cell succeeded. */
  ok: boolean;
  /** The bundle of the cell's last expression, when it had a value. */
  mainResult: RichResult | undefined;
  raw: Record<string, unknown>;
}

/** A live kernel of the caller's tenant (`client.kernels()`). */
export interface KernelSummary {
  id: string;
  tenant: string;
  owner: string;
  session: string;
  child?: string;
  /** The kernel's language. */
  language: Language;
  /** The session's context it serves (a language's default context is named by the language). */
  context: string;
  generation: number;
  /** `starting`, `idle` or `busy`. */
  state: string;
  executionCount: number;
  idleSeconds: number;
  attached: number;
  labels?: Record<string, string>;
}

export type FileKind = "file" | "dir" | "symlink" | "other";

/** One entry of a directory listing. */
export interface FileEntry {
  name: string;
  kind: FileKind;
  size: number;
  /** RFC 3339, UTC. */
  modified: string;
}

/** A directory's entries; `truncated` when it held more than were listed. */
export interface Listing {
  entries: FileEntry[];
  truncated: boolean;
}

/** What a write stored: the absolute path in the kernel, the bytes, for a tar the files extracted. */
export interface Written {
  path: string;
  size: number;
  files?: number;
}

/** What `session.commands.run()` did (docs/contract.md, "Commands"). */
export interface CommandResult {
  /** -1 when killed at its timeout or the engine could not tell. */
  exitCode: number;
  stdout: string;
  stderr: string;
  durationSeconds: number;
  timedOut: boolean;
  stdoutTruncated?: boolean;
  stdoutBytesTotal?: number;
  stderrTruncated?: boolean;
  stderrBytesTotal?: number;
  streamBytesDropped: number;
  /** It exited 0 and did not time out. */
  ok: boolean;
  raw: Record<string, unknown>;
}

/** A background process (docs/processes.md): started beside the session's kernel, running until it ends, is killed or its kernel goes. */
export interface ProcessInfo {
  /** Its id in the session: the handle every other call takes. */
  id: number;
  /** The argument vector it runs (`["/bin/sh", "-c", LINE]` for a shell line). */
  command: string[];
  /** When it started, RFC 3339. */
  startedAt: string;
  /** True until its output ended (it, and everything holding its output, are gone). */
  running: boolean;
  /** True while its stdin is open (started with `stdin: true`, not closed yet). */
  stdinOpen: boolean;
  /** Bytes it wrote on stdout and stderr in all. */
  outputBytes: number;
  /** Its leader's process id inside the container, once known. */
  pid?: number;
  /** Its working directory, as asked. */
  cwd?: string;
  /** Its exit code once it ended (128 + the signal when a signal ended it; -1 when the engine could not tell). */
  exitCode?: number;
  raw: Record<string, unknown>;
}

/** What `processes.output()` read of a background process: its kept output, then what it wrote while the call waited. */
export interface ProcessOutput {
  stdout: string;
  stderr: string;
  /** stdout and stderr as they came, interleaved. */
  output: string;
  /** Its exit code once it ended; absent while it runs (the wait was over first). */
  exitCode?: number;
  /** True when it had not ended by the time the call returned. */
  running: boolean;
  /** Bytes it wrote that were no longer kept (its oldest output past the server's 256 KiB). */
  bytesDropped: number;
}

/** A session's egress policy (docs/reliability.md, "Network egress"); deny wins; no allow: no network. */
export interface NetworkPolicy {
  allow?: string[];
  deny?: string[];
}

/** A session's settings (docs/http-api.md, "Session settings"); absent: the server's default. */
export interface SessionSettings {
  env?: Record<string, string>;
  /** Bytes, or a size such as `"512m"`. */
  memory?: number | string;
  cpus?: number;
  /** Seconds. */
  idleTimeout?: number;
  labels?: Record<string, string>;
}

/** What setting a session's settings answers. */
export interface SettingsApplied {
  settings: SessionSettings;
  /** A live kernel runs with another environment, memory or CPU: they apply from its next kernel. */
  restartRequired: boolean;
}

/** One of the tenant's workspaces (docs/workspaces.md). */
export interface WorkspaceSummary {
  name: string;
  sizeBytes: number;
  quotaBytes: number;
  /** Unix seconds. */
  lastUsed: number;
  /** A kernel has it mounted now. */
  inUse: boolean;
}

/** One session's usage in one bucket (docs/usage.md). */
export interface UsageRow {
  tenant: string;
  session: string;
  start: number;
  kernelSeconds: number;
  cpuSeconds: number;
  peakMemoryBytes: number;
  cells: number;
  cellSeconds: number;
  commands: number;
  fileBytesIn: number;
  fileBytesOut: number;
  poolHits: number;
  networkBytesIn: number;
  networkBytesOut: number;
}

export type UsageGrouping = "session" | "day" | "hour";

/** The usage ledger over a range (docs/usage.md), Unix seconds. */
export interface UsageReport {
  from: number;
  to: number;
  groupBy: UsageGrouping;
  rows: UsageRow[];
}

/** A snapshot of a session's kernel (docs/snapshots.md). */
export interface SnapshotInfo {
  id: string;
  name?: string;
  /** The session it was taken of. */
  session: string;
  created: string;
  expires: string;
  bytes: number;
  /** The kernel's memory is in it (runsc); false for a files-only snapshot. */
  memory: boolean;
  runtime: string;
  checkpointSeconds: number;
}

/** The kernel a restore or a fork started. */
export interface RestoredKernel {
  id: string;
  generation: number;
  restoreSeconds: number;
}

/** An error's code and message, as the server's error body carries them. */
export interface ErrorDetail {
  code: string;
  message: string;
}

/** One fork (or a restore): its session and its kernel, or why it failed. */
export interface ForkOutcome {
  session: string;
  kernel?: RestoredKernel;
  error?: ErrorDetail;
}

/** A fork's answer: the forks in order, each with its kernel or its error. */
export interface ForkResult {
  checkpointSeconds: number;
  forks: ForkOutcome[];
}

/** Each interface above, by the schema of `/openapi.json` it mirrors (the drift test reads this). */
export const MIRRORS = {
  StateLost: "StateLost",
  WorkspaceInfo: "WorkspaceInfo",
  Restored: "Restored",
  Migrated: "Migrated",
  KernelInfo: "KernelInfo",
  RichResult: "RichResult",
  CellResult: "Execution",
  CellException: "CellException",
  KernelSummary: "KernelSummary",
  FileEntry: "FileEntry",
  Listing: "Listing",
  Written: "Written",
  CommandResult: "CommandResult",
  NetworkPolicy: "NetworkPolicy",
  SessionSettings: "SessionSettings",
  SettingsApplied: "SettingsApplied",
  WorkspaceSummary: "WorkspaceSummary",
  UsageRow: "UsageRow",
  UsageReport: "UsageReport",
  SnapshotInfo: "SnapshotInfo",
  RestoredKernel: "RestoredKernel",
  ForkOutcome: "ForkOutcome",
  ForkResult: "ForkResult",
  ErrorDetail: "ErrorDetail",
  ProcessInfo: "ProcessInfo",
} as const;

// --- Reading JSON into the types (lenient: a missing field gets its type's zero) ---

type Json = Record<string, unknown>;

function obj(v: unknown): Json {
  return isObject(v) ? v : {};
}
function str(v: unknown): string {
  return typeof v === "string" ? v : v === undefined || v === null ? "" : String(v);
}
function num(v: unknown, otherwise = 0): number {
  return typeof v === "number" && Number.isFinite(v) ? v : otherwise;
}
function optStr(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}
function optNum(v: unknown): number | undefined {
  return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}
function optBool(v: unknown): boolean | undefined {
  return typeof v === "boolean" ? v : undefined;
}
function strMap(v: unknown): Record<string, string> | undefined {
  if (!isObject(v)) return undefined;
  const out: Record<string, string> = {};
  for (const [k, value] of Object.entries(v)) out[k] = str(value);
  return out;
}
/** Sets `key` only when `value` is defined (the types' optional fields are absent, not undefined). */
function put<T, K extends keyof T>(target: T, key: K, value: T[K] | undefined): void {
  if (value !== undefined) target[key] = value;
}

export function stateLost(v: unknown): StateLost {
  const d = obj(v);
  const out: StateLost = { reason: str(d["reason"]) as LossReason, at: str(d["at"]) };
  put(out, "workspaceLost", optBool(d["workspace_lost"]));
  return out;
}

export function kernelInfo(v: unknown): KernelInfo {
  const d = obj(v);
  const out: KernelInfo = {
    id: str(d["id"]),
    reused: d["reused"] === true,
    executionCount: num(d["execution_count"]),
    stateReset: d["state_reset"] === true,
    ended: d["ended"] === true,
    generation: num(d["generation"]),
  };
  if (isObject(d["state_lost"])) out.stateLost = stateLost(d["state_lost"]);
  if (isObject(d["workspace"])) {
    const w = d["workspace"];
    out.workspace = { name: str(w["name"]), restored: w["restored"] === true };
  }
  if (isObject(d["restored"])) {
    const r = d["restored"];
    out.restored = {
      from: str(r["from"]),
      checkpointSeconds: num(r["checkpoint_seconds"]),
      restoreSeconds: num(r["restore_seconds"]),
    };
  }
  if (isObject(d["migrated"])) out.migrated = { fromNode: str(d["migrated"]["from_node"]) };
  return out;
}

export function richResult(v: unknown): RichResult {
  const d = obj(v);
  return new RichResult(obj(d["data"]), obj(d["metadata"]), d["is_main_result"] === true);
}

export function execution(v: unknown, streamBytesDropped = 0): Execution {
  if (!isObject(v)) throw new ProtocolError("invalid_response", "execute: the result is not a JSON object");
  const d = v;
  const results = Array.isArray(d["results"]) ? d["results"].filter(isObject).map(richResult) : undefined;
  const status = str(d["status"]) as CellStatus;
  const out: Execution = {
    status,
    output: str(d["output"]),
    stdout: str(d["stdout"]),
    stderr: str(d["stderr"]),
    exitCode: num(d["exit_code"], -1),
    toolCallsMade: num(d["tool_calls_made"]),
    durationSeconds: num(d["duration_seconds"]),
    kernel: kernelInfo(d["kernel"]),
    streamBytesDropped,
    ok: status === "success",
    mainResult: results?.find((r) => r.isMainResult),
    raw: d,
  };
  put(out, "error", optStr(d["error"]));
  if (isObject(d["exception"])) {
    const e = d["exception"];
    out.exception = { name: str(e["name"]), value: str(e["value"]), traceback: str(e["traceback"]) };
  }
  put(out, "results", results);
  put(out, "stdoutTruncated", optBool(d["stdout_truncated"]));
  put(out, "stdoutBytesTotal", optNum(d["stdout_bytes_total"]));
  put(out, "stdoutBytesOmitted", optNum(d["stdout_bytes_omitted"]));
  put(out, "warning", optStr(d["warning"]));
  put(out, "hint", optStr(d["hint"]));
  return out;
}

export function kernelSummary(v: unknown): KernelSummary {
  const d = obj(v);
  const out: KernelSummary = {
    id: str(d["id"]),
    tenant: str(d["tenant"]),
    owner: str(d["owner"]),
    session: str(d["session"]),
    language: (optStr(d["language"]) ?? "python") as Language,
    context: optStr(d["context"]) ?? "python",
    generation: num(d["generation"]),
    state: str(d["state"]),
    executionCount: num(d["execution_count"]),
    idleSeconds: num(d["idle_seconds"]),
    attached: num(d["attached"]),
  };
  put(out, "child", optStr(d["child"]));
  put(out, "labels", strMap(d["labels"]));
  return out;
}

export function listing(v: unknown): Listing {
  const d = obj(v);
  const entries = Array.isArray(d["entries"]) ? d["entries"].filter(isObject) : [];
  const out: Listing = {
    entries: entries.map((e) => {
      const entry: FileEntry = { name: str(e["name"]), kind: str(e["kind"]) as FileKind, size: num(e["size"]), modified: str(e["modified"]) };
      return entry;
    }),
    truncated: d["truncated"] === true,
  };
  return out;
}

export function written(v: unknown): Written {
  const d = obj(v);
  const out: Written = { path: str(d["path"]), size: num(d["size"]) };
  put(out, "files", optNum(d["files"]));
  return out;
}

export function commandResult(v: unknown, streamBytesDropped = 0): CommandResult {
  if (!isObject(v)) throw new ProtocolError("invalid_response", "command: the result is not a JSON object");
  const d = v;
  const exitCode = num(d["exit_code"], -1);
  const timedOut = d["timed_out"] === true;
  const out: CommandResult = {
    exitCode,
    stdout: str(d["stdout"]),
    stderr: str(d["stderr"]),
    durationSeconds: num(d["duration_seconds"]),
    timedOut,
    streamBytesDropped,
    ok: exitCode === 0 && !timedOut,
    raw: d,
  };
  put(out, "stdoutTruncated", optBool(d["stdout_truncated"]));
  put(out, "stdoutBytesTotal", optNum(d["stdout_bytes_total"]));
  put(out, "stderrTruncated", optBool(d["stderr_truncated"]));
  put(out, "stderrBytesTotal", optNum(d["stderr_bytes_total"]));
  return out;
}

export function processInfo(v: unknown): ProcessInfo {
  if (!isObject(v)) throw new ProtocolError("invalid_response", "process: the answer is not a JSON object");
  const d = v;
  const out: ProcessInfo = {
    id: num(d["id"]),
    command: Array.isArray(d["command"]) ? d["command"].map(str) : [],
    startedAt: str(d["started_at"]),
    running: d["running"] === true,
    stdinOpen: d["stdin_open"] === true,
    outputBytes: num(d["output_bytes"]),
    raw: d,
  };
  put(out, "pid", optNum(d["pid"]));
  put(out, "cwd", optStr(d["cwd"]));
  put(out, "exitCode", optNum(d["exit_code"]));
  return out;
}

export function sessionSettings(v: unknown): SessionSettings {
  const d = obj(v);
  const out: SessionSettings = {};
  put(out, "env", strMap(d["env"]));
  const memory = d["memory"];
  if (typeof memory === "number" || typeof memory === "string") out.memory = memory;
  put(out, "cpus", optNum(d["cpus"]));
  put(out, "idleTimeout", optNum(d["idle_timeout"]));
  put(out, "labels", strMap(d["labels"]));
  return out;
}

/** The wire form of settings (snake_case, absent fields left out). */
export function settingsBody(s: SessionSettings): Json {
  const out: Json = {};
  if (s.env !== undefined) out["env"] = s.env;
  if (s.memory !== undefined) out["memory"] = s.memory;
  if (s.cpus !== undefined) out["cpus"] = s.cpus;
  if (s.idleTimeout !== undefined) out["idle_timeout"] = s.idleTimeout;
  if (s.labels !== undefined) out["labels"] = s.labels;
  return out;
}

export function settingsApplied(v: unknown): SettingsApplied {
  const d = obj(v);
  return { settings: sessionSettings(d["settings"]), restartRequired: d["restart_required"] === true };
}

export function workspaceSummary(v: unknown): WorkspaceSummary {
  const d = obj(v);
  return {
    name: str(d["name"]),
    sizeBytes: num(d["size_bytes"]),
    quotaBytes: num(d["quota_bytes"]),
    lastUsed: num(d["last_used"]),
    inUse: d["in_use"] === true,
  };
}

export function usageReport(v: unknown): UsageReport {
  const d = obj(v);
  const rows = Array.isArray(d["rows"]) ? d["rows"].filter(isObject) : [];
  return {
    from: num(d["from"]),
    to: num(d["to"]),
    groupBy: str(d["group_by"]) as UsageGrouping,
    rows: rows.map((r) => ({
      tenant: str(r["tenant"]),
      session: str(r["session"]),
      start: num(r["start"]),
      kernelSeconds: num(r["kernel_seconds"]),
      cpuSeconds: num(r["cpu_seconds"]),
      peakMemoryBytes: num(r["peak_memory_bytes"]),
      cells: num(r["cells"]),
      cellSeconds: num(r["cell_seconds"]),
      commands: num(r["commands"]),
      fileBytesIn: num(r["file_bytes_in"]),
      fileBytesOut: num(r["file_bytes_out"]),
      poolHits: num(r["pool_hits"]),
      networkBytesIn: num(r["network_bytes_in"]),
      networkBytesOut: num(r["network_bytes_out"]),
    })),
  };
}

export function snapshotInfo(v: unknown): SnapshotInfo {
  const d = obj(v);
  const out: SnapshotInfo = {
    id: str(d["id"]),
    session: str(d["session"]),
    created: str(d["created"]),
    expires: str(d["expires"]),
    bytes: num(d["bytes"]),
    memory: d["memory"] === true,
    runtime: str(d["runtime"]),
    checkpointSeconds: num(d["checkpoint_seconds"]),
  };
  put(out, "name", optStr(d["name"]));
  return out;
}

export function forkOutcome(v: unknown): ForkOutcome {
  const d = obj(v);
  const out: ForkOutcome = { session: str(d["session"]) };
  if (isObject(d["kernel"])) {
    const k = d["kernel"];
    out.kernel = { id: str(k["id"]), generation: num(k["generation"]), restoreSeconds: num(k["restore_seconds"]) };
  }
  if (isObject(d["error"])) out.error = { code: str(d["error"]["code"]), message: str(d["error"]["message"]) };
  return out;
}

export function forkResult(v: unknown): ForkResult {
  const d = obj(v);
  const forks = Array.isArray(d["forks"]) ? d["forks"].map(forkOutcome) : [];
  return { checkpointSeconds: num(d["checkpoint_seconds"]), forks };
}
