/**
 * The HTTP API without the classes: URLs, request bodies, deadlines, the NDJSON line reader and
 * the stream events, so `client.ts` only moves bytes.
 */
import { CommandResult, Execution, RichResult } from "./types.js";
/** Where the client goes without `url` or `KERNELBOX_URL` (`kernelbox serve`'s default). */
export declare const DEFAULT_URL = "http://127.0.0.1:8080";
/** Seconds the client waits for a control call (and for transport on top of a cell's timeout). */
export declare const DEFAULT_TIMEOUT = 30;
/** The server's default longest cell (`--max-timeout`): a run without `timeout` waits this plus the client's timeout. */
export declare const SERVER_MAX_CELL_SECONDS = 3600;
/** The longest cell timeout the client waits for (a week). */
export declare const MAX_CELL_WAIT: number;
/** Stream events the client understands (the drift test checks the server sends no other). */
export declare const STREAM_EVENTS: readonly ["output", "output_truncated", "display", "result", "error"];
/** A streamed command's events. */
export declare const COMMAND_STREAM_EVENTS: readonly ["stdout", "stderr", "output_truncated", "result", "error"];
/** A background process's output events (docs/processes.md). */
export declare const PROCESS_STREAM_EVENTS: readonly ["stdout", "stderr", "output_truncated", "exit"];
export declare const NDJSON = "application/x-ndjson";
export declare const TAR = "application/x-tar";
export declare const USER_AGENT = "kernelbox-client-typescript/0.1";
/**
 * The longest stream line the client holds (characters): a `result` line carries a cell's
 * displays, which the server caps at 20 MiB per cell by default (docs/results.md), plus its
 * output; a longer line is a `ProtocolError`, never unbounded memory.
 */
export declare const MAX_LINE: number;
/** The environment's variable `name` where one exists (Node, Bun, Deno with --allow-env), else undefined. */
export declare function envVar(name: string): string | undefined;
export declare function sessionPath(session: string, ...rest: string[]): string;
/** `.../files/PATH`, the path one encoded segment; `""` or `"."` is the working directory itself. */
export declare function filePath(session: string, path: string): string;
export declare function childPath(session: string, child: string): string;
/** `/v1/sessions/SESSION/contexts/CONTEXT`. */
export declare function contextPath(session: string, context: string): string;
/** `/v1/snapshots/ID`. */
export declare function snapshotPath(id: string): string;
export declare function workspacePath(name: string): string;
/** `/v1/sessions/S/processes[/ID[/REST]]` (docs/processes.md). */
export declare function processPath(session: string, id?: number, ...rest: string[]): string;
/** The read deadline (seconds) of a call running `timeout` seconds on the server (a cell, a command). */
export declare function runDeadline(timeout: number | undefined, clientTimeout: number): number;
/** An event of a streamed cell, in the order the cell produced it. */
export declare type StreamEvent = {
    type: "output";
    text: string;
    stream: OutputStream;
} | {
    type: "display";
    result: RichResult;
} | {
    type: "result";
    execution: Execution;
};
/** Which of the cell's streams an output event's text came on (a raised cell's traceback apart). */
export declare type OutputStream = "stdout" | "stderr" | "traceback";
/** An event of a streamed command. */
export declare type CommandStreamEvent = {
    type: "stdout";
    text: string;
} | {
    type: "stderr";
    text: string;
} | {
    type: "result";
    result: CommandResult;
};
/** An event of a background process's output stream: its output as it came, then its exit. */
export declare type ProcessEvent = {
    type: "stdout";
    text: string;
} | {
    type: "stderr";
    text: string;
} | {
    type: "outputTruncated";
    bytes: number;
} | {
    type: "exit";
    exitCode: number;
};
/** Reads a streamed execute's NDJSON lines: events out, the `result` last; an `error` event throws. */
export declare class ExecuteStreamReader {
    private dropped;
    done: boolean;
    feed(line: string): StreamEvent | undefined;
    finish(): void;
}
/** Reads a streamed command's NDJSON lines. */
export declare class CommandStreamReader {
    private dropped;
    done: boolean;
    feed(line: string): CommandStreamEvent | undefined;
    finish(): void;
}
/** Reads a background process's output stream; it may end before `exit` (a bounded read). */
export declare class ProcessStreamReader {
    feed(line: string): ProcessEvent | undefined;
    finish(): void;
}
/** The lines of a byte stream (UTF-8, `\n`-separated), the last one without its newline too. */
export declare function lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string>;
