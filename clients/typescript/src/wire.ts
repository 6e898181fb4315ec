/**
 * The HTTP API without the classes: URLs, request bodies, deadlines, the NDJSON line reader and
 * the stream events, so `client.ts` only moves bytes.
 */

import { ConnectionFailed, errorFor, isObject, KernelboxError, ProtocolError } from "./errors.js";
import { commandResult, CommandResult, execution, Execution, RichResult, richResult } from "./types.js";

/** Where the client goes without `url` or `KERNELBOX_URL` (`kernelbox serve`'s default). */
export const DEFAULT_URL = "http://127.0.0.1:8080";
/** Seconds the client waits for a control call (and for transport on top of a cell's timeout). */
export const DEFAULT_TIMEOUT = 30;
/** The server's default longest cell (`--max-timeout`): a run without `timeout` waits this plus the client's timeout. */
export const SERVER_MAX_CELL_SECONDS = 3600;
/** The longest cell timeout the client waits for (a week). */
export const MAX_CELL_WAIT = 7 * 24 * 3600;
/** Stream events the client understands (the drift test checks the server sends no other). */
export const STREAM_EVENTS = ["output", "output_truncated", "display", "result", "error"] as const;
/** A streamed command's events. */
export const COMMAND_STREAM_EVENTS = ["stdout", "stderr", "output_truncated", "result", "error"] as const;
/** A background process's output events (docs/processes.md). */
export const PROCESS_STREAM_EVENTS = ["stdout", "stderr", "output_truncated", "exit"] as const;
export const NDJSON = "application/x-ndjson";
export const TAR = "application/x-tar";
export const USER_AGENT = "kernelbox-client-typescript/0.1";
/**
 * The longest stream line the client holds (characters): a `result` line carries a cell's
 * displays, which the server caps at 20 MiB per cell by default (docs/results.md), plus its
 * output; a longer line is a `ProtocolError`, never unbounded memory.
 */
export const MAX_LINE = 64 * 1024 * 1024;

/** The environment's variable `name` where one exists (Node, Bun, Deno with --allow-env), else undefined. */
export function envVar(name: string): string | undefined {
  const g = globalThis as { process?: { env?: Record<string, string | undefined> }; Deno?: { env?: { get(n: string): string | undefined } } };
  try {
    return g.process?.env?.[name] ?? g.Deno?.env?.get(name);
  } catch {
    return undefined; // Deno without the permission
  }
}

function segment(value: string): string {
  // Percent-encoded whole, `/` included (the server decodes it), so no HTTP stack resolves a
  // path the server is the one to judge (it refuses escapes with 400). A segment that is only
  // `.` or `..` is resolved by fetch's URL parser however it is encoded: it goes with a
  // trailing `/` (`..%2F`), which the server judges as it would the bare one.
  if (value === "." || value === "..") return encodeURIComponent(value + "/");
  return encodeURIComponent(value);
}

export function sessionPath(session: string, ...rest: string[]): string {
  return ["/v1/sessions", segment(session), ...rest].join("/");
}

/** `.../files/PATH`, the path one encoded segment; `""` or `"."` is the working directory itself. */
export function filePath(session: string, path: string): string {
  if (path === "" || path === ".") return sessionPath(session, "files");
  return sessionPath(session, "files", segment(path));
}

export function childPath(session: string, child: string): string {
  return sessionPath(session, "children", segment(child));
}

/** `/v1/sessions/SESSION/contexts/CONTEXT`. */
export function contextPath(session: string, context: string): string {
  return sessionPath(session, "contexts", segment(context));
}

/** `/v1/snapshots/ID`. */
export function snapshotPath(id: string): string {
  return "/v1/snapshots/" + segment(id);
}

export function workspacePath(name: string): string {
  return "/v1/workspaces/" + segment(name);
}

/** `/v1/sessions/S/processes[/ID[/REST]]` (docs/processes.md). */
export function processPath(session: string, id?: number, ...rest: string[]): string {
  if (id === undefined) return sessionPath(session, "processes");
  if (!Number.isSafeInteger(id) || id < 0) throw new TypeError(`a process id is a whole number (ProcessInfo.id), not ${String(id)}`);
  return sessionPath(session, "processes", String(id), ...rest);
}

/** The read deadline (seconds) of a call running `timeout` seconds on the server (a cell, a command). */
export function runDeadline(timeout: number | undefined, clientTimeout: number): number {
  const run = typeof timeout === "number" && timeout > 0 ? Math.min(timeout, MAX_CELL_WAIT) : SERVER_MAX_CELL_SECONDS;
  return run + clientTimeout;
}

/** An event of a streamed cell, in the order the cell produced it. */
export type StreamEvent =
  | { type: "output"; text: string; stream: OutputStream }
  | { type: "display"; result: RichResult }
  | { type: "result"; execution: Execution };

/** Which of the cell's streams an output event's text came on (a raised cell's traceback apart). */
export type OutputStream = "stdout" | "stderr" | "traceback";

/** An event of a streamed command. */
export type CommandStreamEvent =
  | { type: "stdout"; text: string }
  | { type: "stderr"; text: string }
  | { type: "result"; result: CommandResult };

/** An event of a background process's output stream: its output as it came, then its exit. */
export type ProcessEvent =
  | { type: "stdout"; text: string }
  | { type: "stderr"; text: string }
  | { type: "outputTruncated"; bytes: number }
  | { type: "exit"; exitCode: number };

function parseLine(line: string, what: string): Record<string, unknown> {
  let value: unknown;
  try {
    value = JSON.parse(line);
  } catch (e) {
    throw new ProtocolError("invalid_response", `${what}: a line is not JSON (${String(e)})`);
  }
  if (!isObject(value)) throw new ProtocolError("invalid_response", `${what}: an event is not an object`);
  return value;
}

function streamError(event: Record<string, unknown>): KernelboxError {
  const err = isObject(event["error"]) ? event["error"] : {};
  return errorFor(undefined, String(err["code"] ?? "error"), String(err["message"] ?? ""));
}

/** Reads a streamed execute's NDJSON lines: events out, the `result` last; an `error` event throws. */
export class ExecuteStreamReader {
  private dropped = 0;
  done = false;

  feed(line: string): StreamEvent | undefined {
    if (line.trim() === "") return undefined;
    const event = parseLine(line, "execute stream");
    switch (event["event"]) {
      case "output":
        return {
          type: "output",
          text: String(event["data"] ?? ""),
          stream: (typeof event["stream"] === "string" ? event["stream"] : "stdout") as OutputStream,
        };
      case "display":
        return { type: "display", result: richResult(event["data"]) };
      case "output_truncated":
        this.dropped += typeof event["bytes"] === "number" ? event["bytes"] : 0;
        return undefined;
      case "result":
        if (!isObject(event["result"])) throw new ProtocolError("invalid_response", "execute stream: bad result event");
        this.done = true;
        return { type: "result", execution: execution(event["result"], this.dropped) };
      case "error":
        throw streamError(event);
      default:
        return undefined; // events a newer server adds are skipped (the drift test sees them)
    }
  }

  finish(): void {
    if (!this.done) {
      throw new ConnectionFailed(
        "stream_ended",
        "the execute stream ended before the cell's result; the cell may still be running (session.interrupt() stops it)",
      );
    }
  }
}

/** Reads a streamed command's NDJSON lines. */
export class CommandStreamReader {
  private dropped = 0;
  done = false;

  feed(line: string): CommandStreamEvent | undefined {
    if (line.trim() === "") return undefined;
    const event = parseLine(line, "command stream");
    switch (event["event"]) {
      case "stdout":
      case "stderr":
        return { type: event["event"], text: String(event["data"] ?? "") };
      case "output_truncated":
        this.dropped += typeof event["bytes"] === "number" ? event["bytes"] : 0;
        return undefined;
      case "result":
        if (!isObject(event["result"])) throw new ProtocolError("invalid_response", "command stream: bad result event");
        this.done = true;
        return { type: "result", result: commandResult(event["result"], this.dropped) };
      case "error":
        throw streamError(event);
      default:
        return undefined;
    }
  }

  finish(): void {
    if (!this.done) {
      throw new ConnectionFailed(
        "stream_ended",
        "the command stream ended before the command's result; the command may still be running (its timeout ends it)",
      );
    }
  }
}

/** Reads a background process's output stream; it may end before `exit` (a bounded read). */
export class ProcessStreamReader {
  feed(line: string): ProcessEvent | undefined {
    if (line.trim() === "") return undefined;
    const event = parseLine(line, "process output");
    switch (event["event"]) {
      case "stdout":
      case "stderr":
        return { type: event["event"], text: String(event["data"] ?? "") };
      case "output_truncated":
        return { type: "outputTruncated", bytes: typeof event["bytes"] === "number" ? event["bytes"] : 0 };
      case "exit":
        return { type: "exit", exitCode: typeof event["exit_code"] === "number" ? event["exit_code"] : -1 };
      default:
        return undefined; // events a newer server adds are skipped (the drift test sees them)
    }
  }

  finish(): void {}
}

/** The lines of a byte stream (UTF-8, `\n`-separated), the last one without its newline too. */
export async function* lines(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  // The pieces of the line being read: each chunk is searched once (a long line arriving in
  // many chunks is never rescanned) and joined when its newline comes.
  let pieces: string[] = [];
  let held = 0;
  try {
    for (;;) {
      const { done, value } = await reader.read();
      const text = done ? decoder.decode() : decoder.decode(value, { stream: true });
      let start = 0;
      let nl: number;
      while ((nl = text.indexOf("\n", start)) >= 0) {
        pieces.push(text.slice(start, nl));
        yield pieces.join("");
        pieces = [];
        held = 0;
        start = nl + 1;
      }
      if (start < text.length) {
        pieces.push(text.slice(start));
        held += text.length - start;
        if (held > MAX_LINE) throw new ProtocolError("invalid_response", `a stream line is longer than ${MAX_LINE} characters`);
      }
      if (done) break;
    }
    if (held > 0) yield pieces.join("");
  } finally {
    reader.releaseLock();
    // Stops the download when the consumer leaves early (a broken loop, an abort).
    await body.cancel().catch(() => undefined);
  }
}
