/**
 * The client: `Client`, `Session`, `Files`, `Commands` over the platform's `fetch` (Node >= 18,
 * Deno, Bun, browsers where CORS allows). Every call takes an optional `AbortSignal`: aborting
 * stops the request (the call rejects with the signal's reason), never the kernel; a cell
 * already running goes on (`session.interrupt()` stops it).
 */
import { ConnectionFailed, errorFromResponse, isObject, KernelboxError, ProtocolError, Timeout } from "./errors.js";
import { commandResult, execution, forkOutcome, forkResult, kernelSummary, snapshotInfo, listing, processInfo, sessionSettings, settingsApplied, settingsBody, usageReport, workspaceSummary, written, } from "./types.js";
import { childPath, contextPath, CommandStreamReader, DEFAULT_TIMEOUT, DEFAULT_URL, envVar, ExecuteStreamReader, filePath, lines, NDJSON, processPath, ProcessStreamReader, runDeadline, sessionPath, TAR, USER_AGENT, snapshotPath, workspacePath, } from "./wire.js";
/** A kernelbox server. */
export class Client {
    url;
    timeout;
    token;
    fetchImpl;
    constructor(options = {}) {
        this.url = (options.url ?? envVar("KERNELBOX_URL") ?? DEFAULT_URL).replace(/\/+$/, "");
        this.token = options.token ?? envVar("KERNELBOX_TOKEN");
        this.timeout = options.timeout ?? DEFAULT_TIMEOUT;
        this.fetchImpl = options.fetch ?? globalThis.fetch.bind(globalThis);
    }
    /** A conversation's kernel (started by its first run); `child` a delegated sub-agent's. */
    session(name, options = {}) {
        return new Session(this, name, options.child);
    }
    /** The live kernels of this token's tenant; with `labels`, those of sessions carrying every one. */
    async kernels(options = {}) {
        const query = Object.entries(options.labels ?? {}).map(([k, v]) => ["label", `${k}:${v}`]);
        const body = await this.json({ method: "GET", path: "/v1/kernels", query, signal: options.signal });
        const items = isObject(body) && Array.isArray(body["kernels"]) ? body["kernels"] : [];
        return items.filter(isObject).map(kernelSummary);
    }
    /** The usage ledger (docs/usage.md) from `from` to `to` (RFC 3339 or Unix seconds; default the last day). */
    async usage(options = {}) {
        const query = [];
        if (options.from !== undefined)
            query.push(["from", options.from]);
        if (options.to !== undefined)
            query.push(["to", options.to]);
        query.push(["group_by", options.groupBy ?? "session"]);
        if (options.tenant !== undefined)
            query.push(["tenant", options.tenant]);
        return usageReport(await this.json({ method: "GET", path: "/v1/usage", query, signal: options.signal }));
    }
    /** The tenant's workspaces (docs/workspaces.md); `NotFound` (`workspace_not_found`) when it has none. */
    async workspaces(options = {}) {
        const body = await this.json({ method: "GET", path: "/v1/workspaces", signal: options.signal });
        const items = isObject(body) && Array.isArray(body["workspaces"]) ? body["workspaces"] : [];
        return items.filter(isObject).map(workspaceSummary);
    }
    /** Deletes the workspace `name` and its files; returns the name. `Conflict` while a kernel has it mounted. */
    async deleteWorkspace(name, options = {}) {
        const body = await this.json({ method: "DELETE", path: workspacePath(name), signal: options.signal });
        return isObject(body) ? String(body["deleted"] ?? "") : "";
    }
    /** The tenant's snapshots (docs/snapshots.md). */
    async snapshots(options = {}) {
        const body = await this.json({ method: "GET", path: "/v1/snapshots", signal: options.signal });
        const items = isObject(body) && Array.isArray(body["snapshots"]) ? body["snapshots"] : [];
        return items.filter(isObject).map(snapshotInfo);
    }
    /** One snapshot; `NotFound` (`snapshot_not_found`) for an id that is not the tenant's. */
    async snapshot(id, options = {}) {
        return snapshotInfo(await this.json({ method: "GET", path: snapshotPath(id), signal: options.signal }));
    }
    /** Deletes a snapshot; returns its id. */
    async deleteSnapshot(id, options = {}) {
        const body = await this.json({ method: "DELETE", path: snapshotPath(id), signal: options.signal });
        return isObject(body) ? String(body["deleted"] ?? "") : "";
    }
    /** Starts the new session `session` from a snapshot: its kernel (or `Conflict` when the session has one). */
    async restore(snapshotId, session, options = {}) {
        const body = await this.json({
            method: "POST",
            path: sessionPath(session, "restore"),
            json: { snapshot: snapshotId },
            signal: options.signal,
        });
        return forkOutcome(body);
    }
    // --- transport (used by Session, Files, Commands) ---
    /**
     * Sends `req`; the answer's JSON (undefined for a 404 with `missingOk`).
     * @internal
     */
    async json(req) {
        const text = await this.text(req);
        if (text === undefined)
            return undefined;
        try {
            return JSON.parse(text);
        }
        catch (e) {
            throw new ProtocolError("invalid_response", `${req.method} ${req.path}: the answer is not JSON (${String(e)})`);
        }
    }
    /** @internal */
    async text(req) {
        return this.call(req, async (r) => (r === undefined ? undefined : r.text()));
    }
    /** @internal */
    async bytes(req) {
        return this.call(req, async (r) => new Uint8Array(r === undefined ? new ArrayBuffer(0) : await r.arrayBuffer()));
    }
    /**
     * Sends `req` and hands the answer to `use` while the call's deadline and signal still hold
     * (so reading the body is bounded too); transport failures become typed errors.
     * @internal
     */
    async call(req, use) {
        const url = this.urlOf(req);
        const abort = new CallAbort(req.deadline ?? this.timeout, req.signal);
        try {
            const r = await this.send(req, url, abort.signal);
            if (r.status === 404 && req.missingOk) {
                await r.body?.cancel();
                return await use(undefined);
            }
            if (r.status < 200 || r.status >= 300)
                throw errorFromResponse(r.status, r.headers, await r.text());
            return await use(r);
        }
        catch (e) {
            throw this.failure(e, req, url, abort);
        }
        finally {
            abort.settle(req.streamed === true);
        }
    }
    /**
     * Like `call`, for an NDJSON answer: the deadline and signal hold until the stream ends or
     * its consumer leaves (which closes the connection); `reader` turns lines into events.
     * @internal
     */
    async *events(req, reader) {
        const url = this.urlOf(req);
        const abort = new CallAbort(req.deadline ?? this.timeout, req.signal);
        try {
            const r = await this.send(req, url, abort.signal);
            if (r.status !== 200)
                throw errorFromResponse(r.status, r.headers, await r.text());
            if (r.body === null)
                throw new ProtocolError("invalid_response", `${req.method} ${req.path}: an empty stream`);
            for await (const line of lines(r.body)) {
                const event = reader.feed(line);
                if (event !== undefined)
                    yield event;
            }
            reader.finish();
        }
        catch (e) {
            throw this.failure(e, req, url, abort);
        }
        finally {
            abort.settle(false);
            abort.controller.abort(); // a consumer that left early closes the connection
        }
    }
    urlOf(req) {
        const query = req.query && req.query.length ? "?" + new URLSearchParams(req.query).toString() : "";
        return this.url + req.path + query;
    }
    async send(req, url, signal) {
        const headers = { "User-Agent": USER_AGENT, ...req.headers };
        if (this.token)
            headers["Authorization"] = `Bearer ${this.token}`;
        let body;
        let replayable = true;
        if (req.json !== undefined) {
            headers["Content-Type"] = "application/json";
            body = JSON.stringify(req.json);
        }
        else if (req.body !== undefined) {
            const b = uploadBody(req.body);
            body = b.body;
            replayable = b.replayable;
        }
        for (let attempt = 0;; attempt++) {
            const init = { method: req.method, headers, signal };
            if (body !== undefined) {
                init.body = body;
                if (!replayable)
                    init.duplex = "half"; // a streamed body (Node's fetch requires it)
            }
            try {
                return await this.fetchImpl(url, init);
            }
            catch (e) {
                // A connection closed unanswered after the request was written (a kept-alive one the
                // server closed while idle, or one it closed after reading the request: a crash, a
                // proxy) cannot tell whether the server got it, so only a request that may arrive twice
                // is sent again, once: a GET or HEAD (changes nothing) or a PUT (sets the same state);
                // never a POST (it runs a cell or a command) nor a DELETE (its second answer would
                // say nothing was there). docs/typescript-client.md, "Connections".
                if (attempt === 0 && replayable && RESENDABLE.has(req.method) && !signal.aborted && closedUnanswered(e))
                    continue;
                throw e;
            }
        }
    }
    failure(e, req, url, abort) {
        if (e instanceof KernelboxError)
            return e;
        if (abort.user?.aborted)
            return abort.user.reason;
        const where = `${req.method} ${url}`;
        if (abort.timedOut) {
            const hint = req.method === "POST" && req.path.endsWith("/execute") ? "; the cell may still be running (session.interrupt() stops it)" : "";
            return new Timeout("timeout", `timed out waiting for kernelbox at ${where}${hint}`, { cause: e });
        }
        const cause = isObject(e) && isObject(e.cause) ? e.cause : undefined;
        const what = String(cause?.code ?? cause?.message ?? (e instanceof Error ? e.message : e));
        if (cause?.code === "ECONNREFUSED" || cause?.code === "ENOTFOUND" || cause?.code === "UND_ERR_CONNECT_TIMEOUT") {
            return new ConnectionFailed("connection_failed", `could not connect to kernelbox at ${where}: ${what}`, { cause: e });
        }
        const unsure = RESENDABLE.has(req.method) ? "" : "; not sent again: the server may have received it (a cell or command may have run)";
        return new ConnectionFailed("connection_failed", `the connection to kernelbox broke during ${where}: ${what}${unsure}`, { cause: e });
    }
}
/** One call's abort: its deadline passing (then `timedOut`) or the caller's signal (its reason). */
class CallAbort {
    user;
    controller = new AbortController();
    timedOut = false;
    timer;
    onAbort = () => this.controller.abort(this.user?.reason);
    constructor(seconds, user) {
        this.user = user;
        this.timer = setTimeout(() => {
            this.timedOut = true;
            this.controller.abort();
        }, Math.min(seconds * 1000, 2 ** 31 - 1));
        // A watchdog, never a reason to stay alive: an in-flight request's socket keeps Node (and
        // Bun) running, but a stream its consumer dropped half-read must not hold the process
        // open for its whole deadline (a run's is an hour).
        this.timer.unref?.();
        if (user?.aborted)
            this.onAbort();
        user?.addEventListener("abort", this.onAbort, { once: true });
    }
    get signal() {
        return this.controller.signal;
    }
    /** The call is over: its deadline stops; the caller's signal too unless the body lives on as a stream. */
    settle(keepSignal) {
        clearTimeout(this.timer);
        if (!keepSignal)
            this.user?.removeEventListener("abort", this.onAbort);
    }
}
/** The methods a request may be sent twice with (see `send`). */
const RESENDABLE = new Set(["GET", "HEAD", "PUT"]);
/** Node's fetch (undici) found the connection closed before any answer came. */
function closedUnanswered(e) {
    const cause = e?.cause;
    return cause?.code === "UND_ERR_SOCKET";
}
function uploadBody(data) {
    if (typeof data === "string" || data instanceof Uint8Array || data instanceof ArrayBuffer || data instanceof Blob) {
        return { body: data, replayable: true };
    }
    if (data instanceof ReadableStream)
        return { body: data, replayable: false };
    const iterator = data[Symbol.asyncIterator]();
    const stream = new ReadableStream({
        async pull(controller) {
            const { done, value } = await iterator.next();
            if (done)
                controller.close();
            else
                controller.enqueue(value);
        },
        async cancel() {
            await iterator.return?.();
        },
    });
    return { body: stream, replayable: false };
}
/** One conversation (or one delegated child of it). */
export class Session {
    client;
    name;
    child;
    files;
    commands;
    processes;
    constructor(client, name, child) {
        this.client = client;
        this.name = name;
        this.child = child;
        this.files = new Files(this);
        this.commands = new Commands(this);
        this.processes = new Processes(this);
    }
    executeRequest(code, options, stream) {
        const body = { code };
        if (options.network !== undefined)
            body["network"] = { allow: options.network.allow ?? [], deny: options.network.deny ?? [] };
        if (options.reset)
            body["reset"] = true;
        if (options.timeout !== undefined)
            body["timeout"] = options.timeout;
        if (options.taskId !== undefined)
            body["task_id"] = options.taskId;
        if (options.language !== undefined)
            body["language"] = options.language;
        if (options.context !== undefined)
            body["context"] = options.context;
        if (this.child !== undefined)
            body["child"] = this.child;
        if (options.tools !== undefined)
            body["tools"] = options.tools;
        return {
            method: "POST",
            path: sessionPath(this.name, "execute"),
            json: body,
            headers: { Accept: stream ? NDJSON : "application/json" },
            deadline: runDeadline(options.timeout, this.client.timeout),
            signal: options.signal,
        };
    }
    /**
     * Runs one cell. With `onOutput` or `onDisplay` the answer streams and they get each piece
     * as the cell makes it. A cell that fails is a result (`status`), not an error; errors are
     * calls the server refused.
     */
    async run(code, options = {}) {
        if (options.onOutput || options.onDisplay || options.onStdout || options.onStderr) {
            for await (const event of this.stream(code, options)) {
                if (event.type === "output") {
                    options.onOutput?.(event.text);
                    if (event.stream === "stdout")
                        options.onStdout?.(event.text);
                    else if (event.stream === "stderr")
                        options.onStderr?.(event.text);
                }
                else if (event.type === "display")
                    options.onDisplay?.(event.result);
                else
                    return event.execution;
            }
            throw new ConnectionFailed("stream_ended", "the execute stream ended before the cell's result");
        }
        return execution(await this.client.json(this.executeRequest(code, options, false)));
    }
    /** Runs one cell, streaming: its output and displays as they come, its result last. */
    stream(code, options = {}) {
        return this.client.events(this.executeRequest(code, options, true), new ExecuteStreamReader());
    }
    /** Stops the session's running and queued cells (they end `interrupted`, the kernel kept); how many, 0 when none. */
    async interrupt(options = {}) {
        const body = await this.client.json({ method: "POST", path: sessionPath(this.name, "interrupt"), missingOk: true, signal: options.signal });
        return isObject(body) ? Number(body["interrupted"] ?? 0) : 0;
    }
    /** Snapshots the session's kernel (runsc: its memory too); the kernel goes on (docs/snapshots.md). */
    async snapshot(options = {}) {
        const json = {};
        if (options.name !== undefined)
            json["name"] = options.name;
        return snapshotInfo(await this.client.json({ method: "POST", path: sessionPath(this.name, "snapshots"), json, signal: options.signal }));
    }
    /**
     * Forks the session's kernel into `count` new sessions (or into the sessions named): one
     * snapshot, restored into each; each fork has its kernel or its error.
     */
    async fork(forks, options = {}) {
        const json = typeof forks === "number" ? { count: forks } : { sessions: forks };
        return forkResult(await this.client.json({ method: "POST", path: sessionPath(this.name, "fork"), json, signal: options.signal }));
    }
    /**
     * The session's contexts that have a kernel, each its kernel (`context` names it, `language`
     * says what it runs); they share the session's `/work` (docs/contract.md, "Languages").
     */
    async contexts(options = {}) {
        if (this.child !== undefined)
            throw new TypeError("contexts: the API lists a session's own contexts, not a child's");
        const body = await this.client.json({ method: "GET", path: sessionPath(this.name, "contexts"), signal: options.signal });
        const items = isObject(body) && Array.isArray(body["contexts"]) ? body["contexts"] : [];
        return items.filter(isObject).map(kernelSummary);
    }
    /** Disposes of one context's kernel (`"bash"`, or a named one); the others and the files stay. How many, 0 when none. */
    async endContext(context, options = {}) {
        if (this.child !== undefined)
            throw new TypeError("endContext: the API ends a session's own contexts, not a child's");
        const path = contextPath(this.name, context);
        const body = await this.client.json({ method: "DELETE", path, missingOk: true, signal: options.signal });
        return isObject(body) ? Number(body["released"] ?? 0) : 0;
    }
    /** Disposes of the session's kernels (its children's too), or of this child's; how many, 0 when none. */
    async close(options = {}) {
        const path = this.child === undefined ? sessionPath(this.name) : childPath(this.name, this.child);
        const body = await this.client.json({ method: "DELETE", path, missingOk: true, signal: options.signal });
        const key = this.child === undefined ? "cleared" : "released";
        return isObject(body) ? Number(body[key] ?? 0) : 0;
    }
    /** An alias of `close()`, as agent frameworks name it. */
    clear(options = {}) {
        return this.close(options);
    }
    /**
     * Sets the session's egress policy (docs/reliability.md, "Network egress"), applied at once
     * to its kernel; returns how many of its connections it closed.
     */
    async setNetwork(policy, options = {}) {
        const json = { allow: policy.allow ?? [], deny: policy.deny ?? [] };
        const body = await this.client.json({ method: "PUT", path: sessionPath(this.name, "network"), json, signal: options.signal });
        return isObject(body) ? Number(body["closed"] ?? 0) : 0;
    }
    /** Replaces the session's settings (docs/http-api.md, "Session settings"). */
    async setSettings(settings, options = {}) {
        const json = settingsBody(settings);
        return settingsApplied(await this.client.json({ method: "PUT", path: sessionPath(this.name, "settings"), json, signal: options.signal }));
    }
    /** The session's settings (all absent when it set none). */
    async settings(options = {}) {
        return sessionSettings(await this.client.json({ method: "GET", path: sessionPath(this.name, "settings"), signal: options.signal }));
    }
}
/** Shell commands in the session's kernel container (docs/contract.md, "Commands"). */
export class Commands {
    session;
    constructor(session) {
        this.session = session;
    }
    request(command, options, stream) {
        if (this.session.child !== undefined) {
            throw new TypeError("commands run in a session's own kernel; the API has none for a delegated child");
        }
        const body = { command };
        if (options.cwd !== undefined)
            body["cwd"] = options.cwd;
        if (options.env !== undefined)
            body["env"] = options.env;
        if (options.stdin !== undefined)
            body["stdin"] = options.stdin;
        if (options.timeout !== undefined)
            body["timeout"] = options.timeout;
        return {
            method: "POST",
            path: sessionPath(this.session.name, "commands"),
            json: body,
            headers: { Accept: stream ? NDJSON : "application/json" },
            deadline: runDeadline(options.timeout, this.session.client.timeout),
            signal: options.signal,
        };
    }
    /**
     * Runs `command` (an array of arguments run as given, or a string run by `/bin/sh -c`). A
     * command that fails is a result (`exitCode`), not an error. With `onStdout` / `onStderr`
     * the answer streams.
     */
    async run(command, options = {}) {
        if (options.onStdout || options.onStderr) {
            for await (const event of this.stream(command, options)) {
                if (event.type === "stdout")
                    options.onStdout?.(event.text);
                else if (event.type === "stderr")
                    options.onStderr?.(event.text);
                else
                    return event.result;
            }
            throw new ConnectionFailed("stream_ended", "the command stream ended before the command's result");
        }
        return commandResult(await this.session.client.json(this.request(command, options, false)));
    }
    /** Runs `command`, streaming its stdout and stderr as they come, its result last. */
    stream(command, options = {}) {
        return this.session.client.events(this.request(command, options, true), new CommandStreamReader());
    }
}
/**
 * Background processes in the session's kernel container (docs/processes.md): started beside
 * its cells, as the kernel's user, with no deadline of their own; each has an id to read its
 * output, write its stdin, signal it, kill it and learn its exit code. A process dies with its
 * kernel; a client that goes away does not stop it.
 */
export class Processes {
    session;
    constructor(session) {
        this.session = session;
    }
    request(method, id, ...rest) {
        if (this.session.child !== undefined) {
            throw new TypeError("background processes run in a session's own kernel; the API has none for a delegated child");
        }
        return { method, path: processPath(this.session.name, id, ...rest) };
    }
    /** Starts `command` (an array of arguments run as given, or a string run by `/bin/sh -c`) and returns at once; starts the kernel if needed. */
    async start(command, options = {}) {
        const json = { command };
        if (options.cwd !== undefined)
            json["cwd"] = options.cwd;
        if (options.env !== undefined)
            json["env"] = options.env;
        if (options.stdin)
            json["stdin"] = true;
        // The session's kernel may be started first (a fresh container).
        const req = { ...this.request("POST"), json, signal: options.signal, deadline: 300 };
        return processInfo(await this.session.client.json(req));
    }
    /** The session's processes, running and recently ended, oldest first. */
    async list(options = {}) {
        const body = await this.session.client.json({ ...this.request("GET"), signal: options.signal });
        const items = isObject(body) && Array.isArray(body["processes"]) ? body["processes"] : [];
        return items.filter(isObject).map(processInfo);
    }
    /** One process; `NotFound` (`no_process`) for an id the session does not have. */
    async get(id, options = {}) {
        return processInfo(await this.session.client.json({ ...this.request("GET", id), signal: options.signal }));
    }
    /**
     * The process's output as events: what the server keeps of it (its newest 256 KiB) first,
     * then live, then `exit`. With `timeout` the stream stops then, whether or not the process
     * ended; leaving the loop early closes the stream, not the process.
     */
    async *stream(id, options = {}) {
        const stop = new AbortController();
        let over = false;
        const timer = options.timeout === undefined ? undefined : setTimeout(() => {
            over = true;
            stop.abort();
        }, Math.min(Math.max(options.timeout, 0) * 1000, 2 ** 31 - 1));
        const onAbort = () => stop.abort(options.signal?.reason);
        if (options.signal?.aborted)
            onAbort();
        options.signal?.addEventListener("abort", onAbort, { once: true });
        const req = { ...this.request("GET", id, "output"), signal: stop.signal, deadline: 7 * 24 * 3600 };
        try {
            for await (const event of this.session.client.events(req, new ProcessStreamReader())) {
                yield event;
                if (event.type === "exit")
                    return;
            }
        }
        catch (e) {
            if (over)
                return; // the read's own bound: not an error
            throw e;
        }
        finally {
            clearTimeout(timer);
            options.signal?.removeEventListener("abort", onAbort);
        }
    }
    /** The process's output, what is kept first: read until it ends, or for `timeout` seconds at most (then `running`). */
    async output(id, options = {}) {
        const stdout = [];
        const stderr = [];
        const all = [];
        let bytesDropped = 0;
        let exitCode;
        for await (const event of this.stream(id, options)) {
            if (event.type === "stdout") {
                stdout.push(event.text);
                all.push(event.text);
                options.onStdout?.(event.text);
            }
            else if (event.type === "stderr") {
                stderr.push(event.text);
                all.push(event.text);
                options.onStderr?.(event.text);
            }
            else if (event.type === "outputTruncated")
                bytesDropped += event.bytes;
            else
                exitCode = event.exitCode;
        }
        const out = { stdout: stdout.join(""), stderr: stderr.join(""), output: all.join(""), running: exitCode === undefined, bytesDropped };
        if (exitCode !== undefined)
            out.exitCode = exitCode;
        return out;
    }
    /** Waits for the process to end (at most `timeout` seconds: then `Timeout`) and returns it, its `exitCode` set. */
    async wait(id, options = {}) {
        for await (const event of this.stream(id, options)) {
            if (event.type === "exit")
                return this.get(id, options);
        }
        throw new Timeout("timeout", `process ${id} is still running after ${String(options.timeout)}s`);
    }
    /** Writes `data` (text as UTF-8, at most 1 MiB) on its stdin; how many bytes. `Conflict` (`stdin_closed`) when closed. */
    async writeStdin(id, data, options = {}) {
        const req = { ...this.request("POST", id, "stdin"), body: data, headers: { "Content-Type": "application/octet-stream" }, signal: options.signal };
        const body = await this.session.client.json(req);
        return isObject(body) ? Number(body["written"] ?? 0) : 0;
    }
    /** Closes its stdin: it reads end of file. */
    async closeStdin(id, options = {}) {
        return processInfo(await this.session.client.json({ ...this.request("DELETE", id, "stdin"), signal: options.signal }));
    }
    /** Sends `name` (`SIGTERM`, `SIGINT`, `SIGKILL`, ...; docs/processes.md) to its command; nothing happens once it ended. */
    async signal(id, name = "SIGTERM", options = {}) {
        const req = { ...this.request("POST", id, "signal"), json: { signal: name }, signal: options.signal };
        return processInfo(await this.session.client.json(req));
    }
    /** Kills it and everything it started, waiting (10 s at most) for it to end; nothing happens once it ended. */
    async kill(id, options = {}) {
        return processInfo(await this.session.client.json({ ...this.request("DELETE", id), signal: options.signal }));
    }
}
/** The files of a session's kernel, relative to its working directory (`/work`; docs/files.md). */
export class Files {
    session;
    constructor(session) {
        this.session = session;
    }
    request(method, path, extra) {
        const s = this.session;
        const req = { method, path: filePath(s.name, path), ...extra };
        if (s.child !== undefined)
            req.query = [["child", s.child]];
        return req;
    }
    /** Stores `data` at `path`, creating parents; starts the kernel if needed. With `tar`, extracts the archive into the directory `path`. */
    async write(path, data, options = {}) {
        const headers = { "Content-Type": options.tar ? TAR : "application/octet-stream" };
        const req = this.request("PUT", path, { body: data, headers, signal: options.signal, deadline: 7 * 24 * 3600 });
        return written(await this.session.client.json(req));
    }
    async read(path, options = {}) {
        const headers = options.tar ? { Accept: TAR } : {};
        const client = this.session.client;
        if (options.as === "stream") {
            // The deadline bounds the answer's headers; the stream is the caller's to read or cancel
            // (its `signal` aborts it too).
            const req = this.request("GET", path, { headers, signal: options.signal, streamed: true });
            const body = await client.call(req, async (r) => r?.body ?? null);
            return body ?? new ReadableStream({ start: (c) => c.close() });
        }
        const req = this.request("GET", path, { headers, signal: options.signal, deadline: 7 * 24 * 3600 });
        const bytes = await client.bytes(req);
        return options.as === "text" ? new TextDecoder().decode(bytes) : bytes;
    }
    /** The entries of the directory at `path`. */
    async list(path = ".", options = {}) {
        const req = this.request("GET", path, { headers: { Accept: "application/json" }, signal: options.signal });
        return listing(await this.session.client.json(req));
    }
    /** Deletes the file or directory tree at `path` (a symlink itself); returns the path removed (`/work/...`). */
    async remove(path, options = {}) {
        const body = await this.session.client.json(this.request("DELETE", path, { signal: options.signal }));
        return isObject(body) ? String(body["deleted"] ?? "") : "";
    }
    /** The session's workspace (docs/workspaces.md) as a tar stream, without starting its kernel. */
    async saveWorkspace(options = {}) {
        const s = this.session;
        const req = { method: "GET", path: sessionPath(s.name, "workspace"), signal: options.signal, streamed: true };
        if (s.child !== undefined)
            req.query = [["child", s.child]];
        const body = await s.client.call(req, async (r) => r?.body ?? null);
        return body ?? new ReadableStream({ start: (c) => c.close() });
    }
    /** Extracts the tar `data` into the session's workspace (made when it has none), without starting its kernel. */
    async restoreWorkspace(data, options = {}) {
        const s = this.session;
        const req = { method: "PUT", path: sessionPath(s.name, "workspace"), body: data, headers: { "Content-Type": TAR }, signal: options.signal, deadline: 7 * 24 * 3600 };
        if (s.child !== undefined)
            req.query = [["child", s.child]];
        return written(await s.client.json(req));
    }
}
