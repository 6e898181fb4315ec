/**
 * A kernelbox tool in the shape the Vercel AI SDK's `tool({description, parameters, execute})`
 * takes (and most TypeScript agent frameworks accept): a plain object, written without
 * importing the framework. `parameters` is a JSON Schema; wrap it with the SDK's
 * `jsonSchema(...)` when passing it to `generateText({tools})`.
 */
import type { Client } from "../client.js";
export interface ExecuteCodeTool {
    description: string;
    parameters: {
        type: "object";
        properties: {
            code: {
                type: "string";
                description: string;
            };
        };
        required: ["code"];
        additionalProperties: false;
    };
    /** Runs the cell in the conversation's kernel; what the model reads back. */
    execute(args: {
        code: string;
    }, options?: {
        abortSignal?: AbortSignal;
    }): Promise<string>;
}
/**
 * The `execute_code` tool of one conversation (`session`): state persists across calls; a
 * failing cell is an answer the model reads, not an exception; the SDK's `abortSignal` stops
 * the request, never the kernel.
 */
export declare function executeCodeTool(client: Client, session: string, options?: {
    timeout?: number;
    child?: string;
}): ExecuteCodeTool;
