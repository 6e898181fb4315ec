/**
 * kernelbox's TypeScript client (docs/typescript-client.md): zero runtime dependencies, the
 * platform's `fetch`, `ReadableStream` and `AbortSignal`.
 *
 * | file | what it holds |
 * |---|---|
 * | client.ts | `Client`, `Session`, `Files`, `Commands`, `Processes`: the calls, deadlines, abort |
 * | wire.ts | URLs, deadlines, the NDJSON reader and the stream events |
 * | types.ts | the server's answers as typed objects, each mirroring an `/openapi.json` schema |
 * | errors.ts | the typed errors, from an HTTP status or a stream's `error` event |
 * | adapters/ai-sdk.ts | a tool in the Vercel AI SDK's shape |
 */
export * from "./errors.js";
export * from "./types.js";
export { COMMAND_STREAM_EVENTS, DEFAULT_TIMEOUT, DEFAULT_URL, PROCESS_STREAM_EVENTS, STREAM_EVENTS, } from "./wire.js";
export { Client, Commands, Files, Processes, Session, } from "./client.js";
export { executeCodeTool } from "./adapters/ai-sdk.js";
