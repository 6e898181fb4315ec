/**
 * The client: `Client`, `Session`, `Files`, `Commands` over the platform's `fetch` (Node >= 18,
 * Deno, Bun, browsers where CORS allows). Every call takes an optional `AbortSignal`: aborting
 * stops the request (the call rejects with the signal's reason), never the kernel; a cell
 * already running goes on (`session.interrupt()` stops it).
 */
import { CommandResult, Execution, ForkOutcome, ForkResult, KernelSummary, Language, SnapshotInfo, Listing, NetworkPolicy, ProcessInfo, ProcessOutput, RichResult, SessionSettings, SettingsApplied, UsageGrouping, UsageReport, WorkspaceSummary, Written } from "./types.js";
import { CommandStreamEvent, ProcessEvent, StreamEvent } from "./wire.js";
export interface ClientOptions {
    /** Default `KERNELBOX_URL`, else `http://127.0.0.1:8080`. */
    url?: string;
    /** Default `KERNELBOX_TOKEN`. */
    token?: string;
    /** Seconds a control call may take (and the slack on top of a cell's timeout); default 30. */
    timeout?: number;
    /** A `fetch` of your own (a proxy agent, a test double); default the platform's. */
    fetch?: typeof fetch;
}
/** What every call accepts. */
export interface CallOptions {
    /** Aborting stops this request (the call rejects with the signal's reason), never the kernel. */
    signal?: AbortSignal;
}
export interface RunOptions extends CallOptions {
    /** Seconds the cell may run (the server's default otherwise); past it the kernel is lost (`stateLost.reason == "timeout"`). */
    timeout?: number;
    /** Start from a fresh kernel. */
    reset?: boolean;
    /** An id the server logs and passes to tool calls. */
    taskId?: string;
    /** The language of the session's kernel that runs the cell (`python` by default, or `bash`). */
    language?: Language;
    /** A named context of that language in the session (a kernel of its own). */
    context?: string;
    /** Tools of the tenant's endpoint the cell may call. */
    tools?: string[];
    /** Sets the session's egress policy first (it stays the session's), as `setNetwork` does. */
    network?: NetworkPolicy;
    /** Text as the cell writes it (stdout and stderr interleaved); streams the answer. */
    onOutput?: (text: string) => void;
    /** Each rich result as it is displayed; streams the answer. */
    onDisplay?: (result: RichResult) => void;
    /** Text the cell writes on its stdout; streams the answer. */
    onStdout?: (text: string) => void;
    /** Text the cell writes on its stderr (not the traceback); streams the answer. */
    onStderr?: (text: string) => void;
}
export interface CommandOptions extends CallOptions {
    /** Working directory inside the kernel (default `/work`). */
    cwd?: string;
    env?: Record<string, string>;
    stdin?: string;
    /** Seconds; past it the command's whole process group is killed (`timedOut`), the kernel kept. */
    timeout?: number;
    onStdout?: (text: string) => void;
    onStderr?: (text: string) => void;
}
export interface ProcessStartOptions extends CallOptions {
    /** Working directory inside the kernel (default `/work`). */
    cwd?: string;
    env?: Record<string, string>;
    /** Keep its stdin open for `writeStdin` until `closeStdin` (else it reads end of file at once). */
    stdin?: boolean;
}
export interface ProcessReadOptions extends CallOptions {
    /** Seconds to read at most: then the read stops, the process goes on. Default: until it ends. */
    timeout?: number;
}
/** What `files.write` sends: text (UTF-8), bytes, a Blob, or a stream / async iterable of bytes (streamed, never held whole). */
export declare type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array> | AsyncIterable<Uint8Array>;
export interface WriteOptions extends CallOptions {
    /** `data` is a tar archive extracted into the directory `path`. */
    tar?: boolean;
}
export interface ReadOptions extends CallOptions {
    /** The directory at `path` as a tar archive. */
    tar?: boolean;
}
/** A kernelbox server. */
export declare class Client {
    readonly url: string;
    readonly timeout: number;
    private readonly token;
    private readonly fetchImpl;
    constructor(options?: ClientOptions);
    /** A conversation's kernel (started by its first run); `child` a delegated sub-agent's. */
    session(name: string, options?: {
        child?: string;
    }): Session;
    /** The live kernels of this token's tenant; with `labels`, those of sessions carrying every one. */
    kernels(options?: CallOptions & {
        labels?: Record<string, string>;
    }): Promise<KernelSummary[]>;
    /** The usage ledger (docs/usage.md) from `from` to `to` (RFC 3339 or Unix seconds; default the last day). */
    usage(options?: CallOptions & {
        from?: string;
        to?: string;
        groupBy?: UsageGrouping;
        tenant?: string;
    }): Promise<UsageReport>;
    /** The tenant's workspaces (docs/workspaces.md); `NotFound` (`workspace_not_found`) when it has none. */
    workspaces(options?: CallOptions): Promise<WorkspaceSummary[]>;
    /** Deletes the workspace `name` and its files; returns the name. `Conflict` while a kernel has it mounted. */
    deleteWorkspace(name: string, options?: CallOptions): Promise<string>;
    /** The tenant's snapshots (docs/snapshots.md). */
    snapshots(options?: CallOptions): Promise<SnapshotInfo[]>;
    /** One snapshot; `NotFound` (`snapshot_not_found`) for an id that is not the tenant's. */
    snapshot(id: string, options?: CallOptions): Promise<SnapshotInfo>;
    /** Deletes a snapshot; returns its id. */
    deleteSnapshot(id: string, options?: CallOptions): Promise<string>;
    /** Starts the new session `session` from a snapshot: its kernel (or `Conflict` when the session has one). */
    restore(snapshotId: string, session: string, options?: CallOptions): Promise<ForkOutcome>;
    private urlOf;
    private send;
    private failure;
}
/** One conversation (or one delegated child of it). */
export declare class Session {
    readonly client: Client;
    readonly name: string;
    readonly child?: string | undefined;
    readonly files: Files;
    readonly commands: Commands;
    readonly processes: Processes;
    constructor(client: Client, name: string, child?: string | undefined);
    private executeRequest;
    /**
     * Runs one cell. With `onOutput` or `onDisplay` the answer streams and they get each piece
     * as the cell makes it. A cell that fails is a result (`status`), not an error; errors are
     * calls the server refused.
     */
    run(code: string, options?: RunOptions): Promise<Execution>;
    /** Runs one cell, streaming: its output and displays as they come, its result last. */
    stream(code: string, options?: Omit<RunOptions, "onOutput" | "onDisplay" | "onStdout" | "onStderr">): AsyncGenerator<StreamEvent>;
    /** Stops the session's running and queued cells (they end `interrupted`, the kernel kept); how many, 0 when none. */
    interrupt(options?: CallOptions): Promise<number>;
    /** Snapshots the session's kernel (runsc: its memory too); the kernel goes on (docs/snapshots.md). */
    snapshot(options?: CallOptions & {
        name?: string;
    }): Promise<SnapshotInfo>;
    /**
     * Forks the session's kernel into `count` new sessions (or into the sessions named): one
     * snapshot, restored into each; each fork has its kernel or its error.
     */
    fork(forks: number | string[], options?: CallOptions): Promise<ForkResult>;
    /**
     * The session's contexts that have a kernel, each its kernel (`context` names it, `language`
     * says what it runs); they share the session's `/work` (docs/contract.md, "Languages").
     */
    contexts(options?: CallOptions): Promise<KernelSummary[]>;
    /** Disposes of one context's kernel (`"bash"`, or a named one); the others and the files stay. How many, 0 when none. */
    endContext(context: string, options?: CallOptions): Promise<number>;
    /** Disposes of the session's kernels (its children's too), or of this child's; how many, 0 when none. */
    close(options?: CallOptions): Promise<number>;
    /** An alias of `close()`, as agent frameworks name it. */
    clear(options?: CallOptions): Promise<number>;
    /**
     * Sets the session's egress policy (docs/reliability.md, "Network egress"), applied at once
     * to its kernel; returns how many of its connections it closed.
     */
    setNetwork(policy: NetworkPolicy, options?: CallOptions): Promise<number>;
    /** Replaces the session's settings (docs/http-api.md, "Session settings"). */
    setSettings(settings: SessionSettings, options?: CallOptions): Promise<SettingsApplied>;
    /** The session's settings (all absent when it set none). */
    settings(options?: CallOptions): Promise<SessionSettings>;
}
/** Shell commands in the session's kernel container (docs/contract.md, "Commands"). */
export declare class Commands {
    private readonly session;
    constructor(session: Session);
    private request;
    /**
     * Runs `command` (an array of arguments run as given, or a string run by `/bin/sh -c`). A
     * command that fails is a result (`exitCode`), not an error. With `onStdout` / `onStderr`
     * the answer streams.
     */
    run(command: string | string[], options?: CommandOptions): Promise<CommandResult>;
    /** Runs `command`, streaming its stdout and stderr as they come, its result last. */
    stream(command: string | string[], options?: Omit<CommandOptions, "onStdout" | "onStderr">): AsyncGenerator<CommandStreamEvent>;
}
/**
 * Background processes in the session's kernel container (docs/processes.md): started beside
 * its cells, as the kernel's user, with no deadline of their own; each has an id to read its
 * output, write its stdin, signal it, kill it and learn its exit code. A process dies with its
 * kernel; a client that goes away does not stop it.
 */
export declare class Processes {
    private readonly session;
    constructor(session: Session);
    private request;
    /** Starts `command` (an array of arguments run as given, or a string run by `/bin/sh -c`) and returns at once; starts the kernel if needed. */
    start(command: string | string[], options?: ProcessStartOptions): Promise<ProcessInfo>;
    /** The session's processes, running and recently ended, oldest first. */
    list(options?: CallOptions): Promise<ProcessInfo[]>;
    /** One process; `NotFound` (`no_process`) for an id the session does not have. */
    get(id: number, options?: CallOptions): Promise<ProcessInfo>;
    /**
     * The process's output as events: what the server keeps of it (its newest 256 KiB) first,
     * then live, then `exit`. With `timeout` the stream stops then, whether or not the process
     * ended; leaving the loop early closes the stream, not the process.
     */
    stream(id: number, options?: ProcessReadOptions): AsyncGenerator<ProcessEvent>;
    /** The process's output, what is kept first: read until it ends, or for `timeout` seconds at most (then `running`). */
    output(id: number, options?: ProcessReadOptions & {
        onStdout?: (text: string) => void;
        onStderr?: (text: string) => void;
    }): Promise<ProcessOutput>;
    /** Waits for the process to end (at most `timeout` seconds: then `Timeout`) and returns it, its `exitCode` set. */
    wait(id: number, options?: ProcessReadOptions): Promise<ProcessInfo>;
    /** Writes `data` (text as UTF-8, at most 1 MiB) on its stdin; how many bytes. `Conflict` (`stdin_closed`) when closed. */
    writeStdin(id: number, data: string | Uint8Array, options?: CallOptions): Promise<number>;
    /** Closes its stdin: it reads end of file. */
    closeStdin(id: number, options?: CallOptions): Promise<ProcessInfo>;
    /** Sends `name` (`SIGTERM`, `SIGINT`, `SIGKILL`, ...; docs/processes.md) to its command; nothing happens once it ended. */
    signal(id: number, name?: string, options?: CallOptions): Promise<ProcessInfo>;
    /** Kills it and everything it started, waiting (10 s at most) for it to end; nothing happens once it ended. */
    kill(id: number, options?: CallOptions): Promise<ProcessInfo>;
}
/** The files of a session's kernel, relative to its working directory (`/work`; docs/files.md). */
export declare class Files {
    private readonly session;
    constructor(session: Session);
    private request;
    /** Stores `data` at `path`, creating parents; starts the kernel if needed. With `tar`, extracts the archive into the directory `path`. */
    write(path: string, data: FileData, options?: WriteOptions): Promise<Written>;
    /** The file at `path`: bytes (default), text (UTF-8) or a stream; with `tar`, the directory at `path` as a tar archive. */
    read(path: string, options?: ReadOptions & {
        as?: "bytes";
    }): Promise<Uint8Array>;
    read(path: string, options: ReadOptions & {
        as: "text";
    }): Promise<string>;
    read(path: string, options: ReadOptions & {
        as: "stream";
    }): Promise<ReadableStream<Uint8Array>>;
    /** The entries of the directory at `path`. */
    list(path?: string, options?: CallOptions): Promise<Listing>;
    /** Deletes the file or directory tree at `path` (a symlink itself); returns the path removed (`/work/...`). */
    remove(path: string, options?: CallOptions): Promise<string>;
    /** The session's workspace (docs/workspaces.md) as a tar stream, without starting its kernel. */
    saveWorkspace(options?: CallOptions): Promise<ReadableStream<Uint8Array>>;
    /** Extracts the tar `data` into the session's workspace (made when it has none), without starting its kernel. */
    restoreWorkspace(data: FileData, options?: CallOptions): Promise<Written>;
}
