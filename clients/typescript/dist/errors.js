/**
 * Typed errors: every failure of a call is a `KernelboxError` carrying the server's `code` and
 * `message` (docs/http-api.md lists them), or a clear transport error. This module is the one
 * place that turns an HTTP status, or a stream's `error` event, into an error class.
 */
/** Base of every error this client throws (an aborted call rethrows its signal's reason). */
export class KernelboxError extends Error {
    /** The server's stable code (`unauthorized`, `at_capacity`, ...), or `timeout` / `connection_failed`. */
    code;
    /** HTTP status; undefined when no response arrived (or for a stream's `error` event). */
    status;
    /** Seconds of a `Retry-After` header, if any. */
    retryAfter;
    /** The server's human-readable text. */
    detail;
    constructor(code, message, options = {}) {
        const where = options.status !== undefined ? `HTTP ${options.status} ` : "";
        super(`${where}${code}: ${message}`);
        this.name = new.target.name;
        this.code = code;
        this.detail = message;
        this.status = options.status;
        this.retryAfter = options.retryAfter;
        if (options.cause !== undefined) {
            Object.defineProperty(this, "cause", { value: options.cause, enumerable: false });
        }
    }
}
/** 400: bad input (names, timeouts, bodies, paths); nothing was run or changed. */
export class BadRequest extends KernelboxError {
}
/** 401: a missing or unknown bearer token. */
export class Unauthorized extends KernelboxError {
}
/** 404: the caller's tenant has nothing by that name (or the URL is not kernelbox's API). */
export class NotFound extends KernelboxError {
}
/** 409: what was asked for is in use (a workspace a kernel has mounted); nothing changed. */
export class Conflict extends KernelboxError {
}
/** 413: the request body is over the server's limit. */
export class PayloadTooLarge extends KernelboxError {
}
/** 429: a capacity cap (`at_capacity`) or a busy session (`session_busy`); retry after `retryAfter` seconds. */
export class TooManyRequests extends KernelboxError {
}
/** 5xx: the engine failed, the kernel could not start, the server is stopping or at its connection limit. */
export class ServerError extends KernelboxError {
}
/** No answer in time. A cell may still be running: `session.interrupt()` stops it. */
export class Timeout extends KernelboxError {
}
/** The server could not be reached, or the connection broke mid-answer. */
export class ConnectionFailed extends KernelboxError {
}
/** The server's answer was not what the API describes (e.g. not JSON). */
export class ProtocolError extends KernelboxError {
}
const BY_STATUS = {
    400: BadRequest,
    401: Unauthorized,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: TooManyRequests,
};
// A streamed call reports a failure after its 200 as an `error` event carrying only the code;
// these are the codes the server answers with a status other than 5xx (docs/http-api.md),
// besides the families below (`invalid_*`: 400, `too_many_*`: 429), so a refusal is the same
// class streamed or not (a tenant at its workspace cap is `TooManyRequests` either way).
const BY_CODE = {
    network_not_allowed: BadRequest,
    tool_not_allowed: BadRequest,
    is_a_directory: BadRequest,
    unauthorized: Unauthorized,
    not_found: NotFound,
    no_kernel: NotFound,
    workspace_not_found: NotFound,
    workspace_in_use: Conflict,
    payload_too_large: PayloadTooLarge,
    file_too_large: PayloadTooLarge,
    at_capacity: TooManyRequests,
    session_busy: TooManyRequests,
};
function classOfCode(code) {
    // Own keys only: a code such as `constructor` must not find `Object.prototype`'s.
    if (Object.hasOwn(BY_CODE, code))
        return BY_CODE[code] ?? ServerError;
    if (code.startsWith("invalid"))
        return BadRequest;
    if (code.startsWith("too_many_"))
        return TooManyRequests;
    return ServerError;
}
/** The typed error for an HTTP status (or, with `status` undefined, a stream's error code). */
export function errorFor(status, code, message, retryAfter) {
    let cls;
    if (status !== undefined) {
        cls = BY_STATUS[status] ?? (status >= 500 ? ServerError : KernelboxError);
    }
    else {
        cls = classOfCode(code);
    }
    const options = {};
    if (status !== undefined)
        options.status = status;
    if (retryAfter !== undefined)
        options.retryAfter = retryAfter;
    return new cls(code, message, options);
}
/** The typed error of a non-2xx answer, with the server's code and message. */
export function errorFromResponse(status, headers, body) {
    const header = headers.get("retry-after");
    const seconds = header === null || header.trim() === "" ? NaN : Number(header);
    const retryAfter = Number.isFinite(seconds) ? seconds : undefined;
    let code = `http_${status}`;
    let message = body.slice(0, 500) || "(empty body)";
    try {
        const parsed = JSON.parse(body);
        const err = isObject(parsed) ? parsed["error"] : undefined;
        if (isObject(err) && typeof err["code"] === "string" && typeof err["message"] === "string") {
            code = err["code"];
            message = err["message"];
        }
    }
    catch {
        // not JSON: the start of the body is the message
    }
    return errorFor(status, code, message, retryAfter);
}
export function isObject(value) {
    return typeof value === "object" && value !== null && !Array.isArray(value);
}
