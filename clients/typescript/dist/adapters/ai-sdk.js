/**
 * A kernelbox tool in the shape the Vercel AI SDK's `tool({description, parameters, execute})`
 * takes (and most TypeScript agent frameworks accept): a plain object, written without
 * importing the framework. `parameters` is a JSON Schema; wrap it with the SDK's
 * `jsonSchema(...)` when passing it to `generateText({tools})`.
 */
/** Longest text the tool hands back to the model (the start and the end kept). */
const MAX_ANSWER = 20000;
function clip(text) {
    if (text.length <= MAX_ANSWER)
        return text;
    const half = MAX_ANSWER / 2;
    return `${text.slice(0, half)}\n... [${text.length - MAX_ANSWER} characters omitted] ...\n${text.slice(-half)}`;
}
/**
 * The `execute_code` tool of one conversation (`session`): state persists across calls; a
 * failing cell is an answer the model reads, not an exception; the SDK's `abortSignal` stops
 * the request, never the kernel.
 */
export function executeCodeTool(client, session, options = {}) {
    const s = options.child === undefined ? client.session(session) : client.session(session, { child: options.child });
    return {
        description: "Run Python code in a persistent, sandboxed Jupyter-style kernel. Variables, imports and files in /work persist between calls. Returns the printed output, the last expression's value, or the error.",
        parameters: {
            type: "object",
            properties: { code: { type: "string", description: "Python source to run, as a notebook cell." } },
            required: ["code"],
            additionalProperties: false,
        },
        async execute({ code }, callOptions = {}) {
            const runOptions = {};
            if (options.timeout !== undefined)
                runOptions.timeout = options.timeout;
            if (callOptions.abortSignal !== undefined)
                runOptions.signal = callOptions.abortSignal;
            const r = await s.run(code, runOptions);
            const parts = [];
            if (r.output)
                parts.push(r.output);
            const main = r.mainResult?.text;
            if (main !== undefined)
                parts.push(main);
            const images = (r.results ?? []).filter((x) => x.png !== undefined).length;
            if (images)
                parts.push(`[${images} image(s) displayed]`);
            if (r.status !== "success")
                parts.push(`[${r.status}] ${r.error ?? ""}`.trim());
            if (r.kernel.stateLost)
                parts.push(`[the kernel was restarted: ${r.kernel.stateLost.reason}; earlier variables are gone]`);
            return clip(parts.join("\n") || "(no output)");
        },
    };
}
