/**
 * Typed errors: every failure of a call is a `KernelboxError` carrying the server's `code` and
 * `message` (docs/http-api.md lists them), or a clear transport error. This module is the one
 * place that turns an HTTP status, or a stream's `error` event, into an error class.
 */
/** Base of every error this client throws (an aborted call rethrows its signal's reason). */
export declare class KernelboxError extends Error {
    /** The server's stable code (`unauthorized`, `at_capacity`, ...), or `timeout` / `connection_failed`. */
    readonly code: string;
    /** HTTP status; undefined when no response arrived (or for a stream's `error` event). */
    readonly status: number | undefined;
    /** Seconds of a `Retry-After` header, if any. */
    readonly retryAfter: number | undefined;
    /** The server's human-readable text. */
    readonly detail: string;
    constructor(code: string, message: string, options?: {
        status?: number;
        retryAfter?: number;
        cause?: unknown;
    });
}
/** 400: bad input (names, timeouts, bodies, paths); nothing was run or changed. */
export declare class BadRequest extends KernelboxError {
}
/** 401: a missing or unknown bearer token. */
export declare class Unauthorized extends KernelboxError {
}
/** 404: the caller's tenant has nothing by that name (or the URL is not kernelbox's API). */
export declare class NotFound extends KernelboxError {
}
/** 409: what was asked for is in use (a workspace a kernel has mounted); nothing changed. */
export declare class Conflict extends KernelboxError {
}
/** 413: the request body is over the server's limit. */
export declare class PayloadTooLarge extends KernelboxError {
}
/** 429: a capacity cap (`at_capacity`) or a busy session (`session_busy`); retry after `retryAfter` seconds. */
export declare class TooManyRequests extends KernelboxError {
}
/** 5xx: the engine failed, the kernel could not start, the server is stopping or at its connection limit. */
export declare class ServerError extends KernelboxError {
}
/** No answer in time. A cell may still be running: `session.interrupt()` stops it. */
export declare class Timeout extends KernelboxError {
}
/** The server could not be reached, or the connection broke mid-answer. */
export declare class ConnectionFailed extends KernelboxError {
}
/** The server's answer was not what the API describes (e.g. not JSON). */
export declare class ProtocolError extends KernelboxError {
}
/** The typed error for an HTTP status (or, with `status` undefined, a stream's error code). */
export declare function errorFor(status: number | undefined, code: string, message: string, retryAfter?: number): KernelboxError;
/** The typed error of a non-2xx answer, with the server's code and message. */
export declare function errorFromResponse(status: number, headers: Headers, body: string): KernelboxError;
export declare function isObject(value: unknown): value is Record<string, unknown>;
