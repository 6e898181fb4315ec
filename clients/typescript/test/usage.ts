// Not run: compiled by test/typecheck.test.mjs (`tsc --noEmit --strict`) to prove the published
// declarations type a user's code as documented (overloads, narrowing of events and errors).
import { Client, KernelboxError, TooManyRequests, executeCodeTool } from "../dist/index.js";
import type { Execution, RichResult, StreamEvent } from "../dist/index.js";

export async function usage(kb: Client): Promise<void> {
  const s = kb.session("conv-1", { child: "helper" });
  const r: Execution = await s.run("x = 1", { timeout: 5, reset: true, onOutput: (t: string) => t.length, onDisplay: (d: RichResult) => d.png?.byteLength });
  const reason: "timeout" | string | undefined = r.kernel.stateLost?.reason;
  void reason;
  for await (const e of s.stream("print(1)", { signal: new AbortController().signal })) {
    const ev: StreamEvent = e;
    if (ev.type === "output") ev.text.toUpperCase();
    else if (ev.type === "display") ev.result.formats.join();
    else ev.execution.status === "interrupted";
  }
  const bytes: Uint8Array = await s.files.read("a");
  const text: string = await s.files.read("a", { as: "text" });
  const stream: ReadableStream<Uint8Array> = await s.files.read("a", { as: "stream" });
  void [bytes, text, stream];
  await s.files.write("b", new Uint8Array(3));
  const c = await s.commands.run(["ls"], { cwd: "/work", onStdout: (t) => t });
  c.exitCode.toFixed();
  try {
    await kb.kernels({ labels: { team: "a" } });
  } catch (e) {
    if (e instanceof TooManyRequests) e.retryAfter?.toFixed();
    else if (e instanceof KernelboxError) e.code.toUpperCase();
  }
  const tool = executeCodeTool(kb, "conv-1");
  const answer: string = await tool.execute({ code: "1" }, { abortSignal: new AbortController().signal });
  void answer;
}
