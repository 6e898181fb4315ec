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
function b64decode(text) {
    const bin = atob(text.replace(/\s+/g, ""));
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++)
        out[i] = bin.charCodeAt(i);
    return out;
}
/**
 * One rich result: a Jupyter MIME bundle (`display(...)` or a cell's last expression). `data`
 * maps MIME types to values as in nbformat (images base64); the getters decode them: `png`
 * and `jpeg` are bytes, `text`, `html`, `svg`, ... strings.
 */
export class RichResult {
    data;
    /** Per-MIME metadata, as in nbformat (an image's `width` and `height`). */
    metadata;
    /** The value of the cell's last expression (Jupyter's `execute_result`). */
    isMainResult;
    constructor(data, metadata = {}, isMainResult = false) {
        this.data = data;
        this.metadata = metadata;
        this.isMainResult = isMainResult;
    }
    /** The MIME types this result carries. */
    get formats() {
        return Object.keys(this.data);
    }
    textOf(mime) {
        const value = this.data[mime];
        if (value === undefined || value === null)
            return undefined;
        // nbformat allows a multi-line string as a list of lines.
        return Array.isArray(value) ? value.join("") : String(value);
    }
    get text() { return this.textOf("text/plain"); }
    get html() { return this.textOf("text/html"); }
    get markdown() { return this.textOf("text/markdown"); }
    get latex() { return this.textOf("text/latex"); }
    get svg() { return this.textOf("image/svg+xml"); }
    get png() {
        const t = this.textOf("image/png");
        return t === undefined ? undefined : b64decode(t);
    }
    get jpeg() {
        const t = this.textOf("image/jpeg");
        return t === undefined ? undefined : b64decode(t);
    }
    /** `application/json`, parsed when the kernel sent it as a string. */
    get json() {
        const value = this.data["application/json"];
        return typeof value === "string" ? JSON.parse(value) : value;
    }
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
};
function obj(v) {
    return isObject(v) ? v : {};
}
function str(v) {
    return typeof v === "string" ? v : v === undefined || v === null ? "" : String(v);
}
function num(v, otherwise = 0) {
    return typeof v === "number" && Number.isFinite(v) ? v : otherwise;
}
function optStr(v) {
    return typeof v === "string" ? v : undefined;
}
function optNum(v) {
    return typeof v === "number" && Number.isFinite(v) ? v : undefined;
}
function optBool(v) {
    return typeof v === "boolean" ? v : undefined;
}
function strMap(v) {
    if (!isObject(v))
        return undefined;
    const out = {};
    for (const [k, value] of Object.entries(v))
        out[k] = str(value);
    return out;
}
/** Sets `key` only when `value` is defined (the types' optional fields are absent, not undefined). */
function put(target, key, value) {
    if (value !== undefined)
        target[key] = value;
}
export function stateLost(v) {
    const d = obj(v);
    const out = { reason: str(d["reason"]), at: str(d["at"]) };
    put(out, "workspaceLost", optBool(d["workspace_lost"]));
    return out;
}
export function kernelInfo(v) {
    const d = obj(v);
    const out = {
        id: str(d["id"]),
        reused: d["reused"] === true,
        executionCount: num(d["execution_count"]),
        stateReset: d["state_reset"] === true,
        ended: d["ended"] === true,
        generation: num(d["generation"]),
    };
    if (isObject(d["state_lost"]))
        out.stateLost = stateLost(d["state_lost"]);
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
    if (isObject(d["migrated"]))
        out.migrated = { fromNode: str(d["migrated"]["from_node"]) };
    return out;
}
export function richResult(v) {
    const d = obj(v);
    return new RichResult(obj(d["data"]), obj(d["metadata"]), d["is_main_result"] === true);
}
export function execution(v, streamBytesDropped = 0) {
    if (!isObject(v))
        throw new ProtocolError("invalid_response", "execute: the result is not a JSON object");
    const d = v;
    const results = Array.isArray(d["results"]) ? d["results"].filter(isObject).map(richResult) : undefined;
    const status = str(d["status"]);
    const out = {
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
export function kernelSummary(v) {
    const d = obj(v);
    const out = {
        id: str(d["id"]),
        tenant: str(d["tenant"]),
        owner: str(d["owner"]),
        session: str(d["session"]),
        language: (optStr(d["language"]) ?? "python"),
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
export function listing(v) {
    const d = obj(v);
    const entries = Array.isArray(d["entries"]) ? d["entries"].filter(isObject) : [];
    const out = {
        entries: entries.map((e) => {
            const entry = { name: str(e["name"]), kind: str(e["kind"]), size: num(e["size"]), modified: str(e["modified"]) };
            return entry;
        }),
        truncated: d["truncated"] === true,
    };
    return out;
}
export function written(v) {
    const d = obj(v);
    const out = { path: str(d["path"]), size: num(d["size"]) };
    put(out, "files", optNum(d["files"]));
    return out;
}
export function commandResult(v, streamBytesDropped = 0) {
    if (!isObject(v))
        throw new ProtocolError("invalid_response", "command: the result is not a JSON object");
    const d = v;
    const exitCode = num(d["exit_code"], -1);
    const timedOut = d["timed_out"] === true;
    const out = {
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
export function processInfo(v) {
    if (!isObject(v))
        throw new ProtocolError("invalid_response", "process: the answer is not a JSON object");
    const d = v;
    const out = {
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
export function sessionSettings(v) {
    const d = obj(v);
    const out = {};
    put(out, "env", strMap(d["env"]));
    const memory = d["memory"];
    if (typeof memory === "number" || typeof memory === "string")
        out.memory = memory;
    put(out, "cpus", optNum(d["cpus"]));
    put(out, "idleTimeout", optNum(d["idle_timeout"]));
    put(out, "labels", strMap(d["labels"]));
    return out;
}
/** The wire form of settings (snake_case, absent fields left out). */
export function settingsBody(s) {
    const out = {};
    if (s.env !== undefined)
        out["env"] = s.env;
    if (s.memory !== undefined)
        out["memory"] = s.memory;
    if (s.cpus !== undefined)
        out["cpus"] = s.cpus;
    if (s.idleTimeout !== undefined)
        out["idle_timeout"] = s.idleTimeout;
    if (s.labels !== undefined)
        out["labels"] = s.labels;
    return out;
}
export function settingsApplied(v) {
    const d = obj(v);
    return { settings: sessionSettings(d["settings"]), restartRequired: d["restart_required"] === true };
}
export function workspaceSummary(v) {
    const d = obj(v);
    return {
        name: str(d["name"]),
        sizeBytes: num(d["size_bytes"]),
        quotaBytes: num(d["quota_bytes"]),
        lastUsed: num(d["last_used"]),
        inUse: d["in_use"] === true,
    };
}
export function usageReport(v) {
    const d = obj(v);
    const rows = Array.isArray(d["rows"]) ? d["rows"].filter(isObject) : [];
    return {
        from: num(d["from"]),
        to: num(d["to"]),
        groupBy: str(d["group_by"]),
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
export function snapshotInfo(v) {
    const d = obj(v);
    const out = {
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
export function forkOutcome(v) {
    const d = obj(v);
    const out = { session: str(d["session"]) };
    if (isObject(d["kernel"])) {
        const k = d["kernel"];
        out.kernel = { id: str(k["id"]), generation: num(k["generation"]), restoreSeconds: num(k["restore_seconds"]) };
    }
    if (isObject(d["error"]))
        out.error = { code: str(d["error"]["code"]), message: str(d["error"]["message"]) };
    return out;
}
export function forkResult(v) {
    const d = obj(v);
    const forks = Array.isArray(d["forks"]) ? d["forks"].map(forkOutcome) : [];
    return { checkpointSeconds: num(d["checkpoint_seconds"]), forks };
}
