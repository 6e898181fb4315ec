/**
 * What the server returns, as typed objects with camelCase fields.
 *
 * Each interface mirrors one schema of the server's `/openapi.json` (`MIRRORS` names which):
 * a field the server may omit or send as null is optional here (`undefined` when absent), an
 * enumeration is a union of its values. The drift test (test/drift.test.mjs) compiles the
 * server's schemas into TypeScript and checks each mirror field by field with `tsc`.
 * Fields a newer server adds stay readable in `raw` until the client learns them.
 */
/** Why a session's previous kernel was lost (docs/contract.md, loss reasons). */
export declare type LossReason = "idle_reaped" | "evicted" | "timeout" | "oom" | "crashed" | "killed" | "engine_restarted" | "server_restarted" | "protocol" | "node_lost" | "runaway" | "node_drained" | "tenant_removed";
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
/**
 * One rich result: a Jupyter MIME bundle (`display(...)` or a cell's last expression). `data`
 * maps MIME types to values as in nbformat (images base64); the getters decode them: `png`
 * and `jpeg` are bytes, `text`, `html`, `svg`, ... strings.
 */
export declare class RichResult {
    data: Record<string, unknown>;
    /** Per-MIME metadata, as in nbformat (an image's `width` and `height`). */
    metadata: Record<string, unknown>;
    /** The value of the cell's last expression (Jupyter's `execute_result`). */
    isMainResult: boolean;
    constructor(data: Record<string, unknown>, metadata?: Record<string, unknown>, isMainResult?: boolean);
    /** The MIME types this result carries. */
    get formats(): string[];
    private textOf;
    get text(): string | undefined;
    get html(): string | undefined;
    get markdown(): string | undefined;
    get latex(): string | undefined;
    get svg(): string | undefined;
    get png(): Uint8Array | undefined;
    get jpeg(): Uint8Array | undefined;
    /** `application/json`, parsed when the kernel sent it as a string. */
    get json(): unknown;
}
export declare type CellStatus = "success" | "error" | "timeout" | "interrupted";
/** The result of one cell (docs/contract.md); `raw` is the JSON as the server sent it. */
/** The language of a session's kernel (docs/contract.md, "Languages"); `javascript` and `typescript` are refused for now. */
export declare type Language = "python" | "bash" | "javascript" | "typescript";
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
export declare type FileKind = "file" | "dir" | "symlink" | "other";
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
export declare type UsageGrouping = "session" | "day" | "hour";
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
export declare const MIRRORS: {
    readonly StateLost: "StateLost";
    readonly WorkspaceInfo: "WorkspaceInfo";
    readonly Restored: "Restored";
    readonly Migrated: "Migrated";
    readonly KernelInfo: "KernelInfo";
    readonly RichResult: "RichResult";
    readonly CellResult: "Execution";
    readonly CellException: "CellException";
    readonly KernelSummary: "KernelSummary";
    readonly FileEntry: "FileEntry";
    readonly Listing: "Listing";
    readonly Written: "Written";
    readonly CommandResult: "CommandResult";
    readonly NetworkPolicy: "NetworkPolicy";
    readonly SessionSettings: "SessionSettings";
    readonly SettingsApplied: "SettingsApplied";
    readonly WorkspaceSummary: "WorkspaceSummary";
    readonly UsageRow: "UsageRow";
    readonly UsageReport: "UsageReport";
    readonly SnapshotInfo: "SnapshotInfo";
    readonly RestoredKernel: "RestoredKernel";
    readonly ForkOutcome: "ForkOutcome";
    readonly ForkResult: "ForkResult";
    readonly ErrorDetail: "ErrorDetail";
    readonly ProcessInfo: "ProcessInfo";
};
declare type Json = Record<string, unknown>;
export declare function stateLost(v: unknown): StateLost;
export declare function kernelInfo(v: unknown): KernelInfo;
export declare function richResult(v: unknown): RichResult;
export declare function execution(v: unknown, streamBytesDropped?: number): Execution;
export declare function kernelSummary(v: unknown): KernelSummary;
export declare function listing(v: unknown): Listing;
export declare function written(v: unknown): Written;
export declare function commandResult(v: unknown, streamBytesDropped?: number): CommandResult;
export declare function processInfo(v: unknown): ProcessInfo;
export declare function sessionSettings(v: unknown): SessionSettings;
/** The wire form of settings (snake_case, absent fields left out). */
export declare function settingsBody(s: SessionSettings): Json;
export declare function settingsApplied(v: unknown): SettingsApplied;
export declare function workspaceSummary(v: unknown): WorkspaceSummary;
export declare function usageReport(v: unknown): UsageReport;
export declare function snapshotInfo(v: unknown): SnapshotInfo;
export declare function forkOutcome(v: unknown): ForkOutcome;
export declare function forkResult(v: unknown): ForkResult;
export {};
