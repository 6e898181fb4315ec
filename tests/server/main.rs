//! The HTTP API over real HTTP on loopback, against the real Docker engine, on the shared
//! harness (`tests/common`: labels, engine, clean-up; `tests/common/http.rs`: the in-process
//! server and its client). Each test labels what it creates with a unique
//! `io.kernelbox-test.case` and ends by asserting through the Docker API that nothing with
//! that label is left.
//!
//! - `api.rs`: every endpoint and status code, tenant isolation, a tenant's kernel cap
//! - `streaming.rs`: live output, interrupt, a streaming client that does not read
//! - `tools.rs`: tool calls to a real tool endpoint, only allowed tools
//! - `commands.rs`: shell commands beside the kernel: streams apart, exit codes, a timeout
//!   that kills the command's process group and nothing else, streaming, bounds, concurrency
//! - `binary.rs`: the `kernelbox serve` binary: SIGTERM cleanup, tenants-file errors, who may
//!   read `/metrics`
//! - `settings.rs`: per-session settings: environment, limits and labels on the engine's
//!   containers, bounded by the tenant's maximums; a session's own idle timeout
//! - `fuzz.rs`: random requests never get a 5xx or a dropped connection
//! - `processes.rs`: background processes: stdin, output kept and read late, signal, kill, a
//!   flooding process, the per-session bound

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/http.rs"]
mod http;

mod api;
mod binary;
mod commands;
mod fuzz;
mod processes;
mod settings;
mod streaming;
mod tools;
