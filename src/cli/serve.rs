//! `kernelbox serve`: the multi-tenant HTTP API.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tokio_util::sync::CancellationToken;

use kernelbox::config::{parse_bytes, parse_duration};
use kernelbox::server::{self, AppState, Tenant, Tenants};
use kernelbox::Orchestrator;

use super::tenant_source::{load_tenants, FileCheck, TenantsSource};
use super::{Exit, KernelOpts};

#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// The configuration file (TOML; docs/configuration.md). Its keys are the defaults of
    /// every other flag: a flag given (or its KERNELBOX_* variable) overrides the file's key.
    #[arg(long, env = "KERNELBOX_CONFIG")]
    pub(super) config: Option<PathBuf>,
    /// Print the resolved configuration (the file and the flags together) as TOML, secrets
    /// redacted, and exit without starting.
    #[arg(long)]
    pub(super) print_config: bool,
    /// Address to listen on (HOST:PORT).
    #[arg(long, env = "KERNELBOX_LISTEN", default_value = "127.0.0.1:8080")]
    pub(super) listen: String,
    /// Tenants file (JSON). Without it, one tenant `default` whose token is KERNELBOX_TOKEN
    /// (or a generated one, printed at start), on a loopback address.
    #[arg(long, env = "KERNELBOX_TENANTS")]
    pub(super) tenants: Option<PathBuf>,
    /// Live kernels across all tenants (a hard cap, shared fairly between tenants; live
    /// delegated children are not counted).
    #[arg(long, env = "KERNELBOX_MAX_KERNELS", default_value_t = 32)]
    pub(super) max_kernels: usize,
    /// A kernel idle this long is reaped (e.g. 30m).
    #[arg(long, env = "KERNELBOX_IDLE_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    pub(super) idle_timeout: Duration,
    /// Directory of the durable owner catalog, created if missing: after a restart (clean or
    /// not) owners whose kernels were live are told `state_lost: server_restarted` and
    /// generations keep counting. One server per directory (a second one exits with code 2).
    /// Default: $XDG_STATE_HOME/kernelbox, else ~/.local/state/kernelbox.
    #[arg(long, env = "KERNELBOX_STATE_DIR")]
    pub(super) state_dir: Option<PathBuf>,
    /// The most memory one session of the tenant without a tenants file may ask for in its
    /// settings (e.g. 4g; default: --memory, so a session may only lower it). With --tenants,
    /// give each tenant its `session_limits`.
    #[arg(long, env = "KERNELBOX_SESSION_MAX_MEMORY", value_parser = parse_bytes)]
    pub(super) session_max_memory: Option<i64>,
    /// The most CPUs one session may ask for (default: --cpus).
    #[arg(long, env = "KERNELBOX_SESSION_MAX_CPUS")]
    pub(super) session_max_cpus: Option<f64>,
    /// The longest idle timeout one session may ask for (e.g. 4h; default: --idle-timeout).
    #[arg(long, env = "KERNELBOX_SESSION_MAX_IDLE_TIMEOUT", value_parser = parse_duration)]
    pub(super) session_max_idle_timeout: Option<Duration>,
    /// Idle kernels are checkpointed and stopped instead of reaped, and the owner's next call
    /// restores them with their memory (kernels under runsc only: --runtime runsc, or a
    /// tenant's `runtime`; docs/runtimes.md "Hibernation"). With --tenants, every tenant's;
    /// or give a tenant `"hibernate": true` there instead. Hibernated kernels outlive a
    /// restart of the server (a clean stop hibernates the idle ones first).
    #[arg(long, env = "KERNELBOX_HIBERNATE")]
    pub(super) hibernate: bool,
    /// Most hibernated kernels kept on the host; past it the oldest checkpoint goes.
    #[arg(long, env = "KERNELBOX_HIBERNATE_MAX", default_value_t = kernelbox::config::DEFAULT_HIBERNATE_MAX_KERNELS)]
    pub(super) hibernate_max: usize,
    /// A checkpoint older than this is discarded and its loss reported (e.g. 24h; 7d at most).
    #[arg(long, env = "KERNELBOX_HIBERNATE_MAX_AGE", default_value = "24h", value_parser = parse_duration)]
    pub(super) hibernate_max_age: Duration,
    /// Most snapshots one tenant keeps (docs/snapshots.md); the next is refused.
    #[arg(long, env = "KERNELBOX_SNAPSHOT_MAX", default_value_t = kernelbox::config::DEFAULT_SNAPSHOTS_PER_TENANT)]
    pub(super) snapshot_max: usize,
    /// Most bytes of one tenant's snapshots (e.g. 4g); a snapshot past it is refused and removed.
    #[arg(long, env = "KERNELBOX_SNAPSHOT_TENANT_BYTES", default_value = "4g", value_parser = parse_budget)]
    pub(super) snapshot_tenant_bytes: u64,
    /// A snapshot older than this is removed (e.g. 24h).
    #[arg(long, env = "KERNELBOX_SNAPSHOT_TTL", default_value = "24h", value_parser = parse_duration)]
    pub(super) snapshot_ttl: Duration,
    /// Every session of the tenant without a tenants file gets a workspace: its /work kept
    /// past its kernel (docs/workspaces.md). With --tenants, give each tenant its
    /// `workspaces` there instead.
    #[arg(long, env = "KERNELBOX_WORKSPACES")]
    pub(super) workspaces: bool,
    /// Size of each workspace (e.g. 1g); a cell writing past it gets ENOSPC.
    #[arg(long, env = "KERNELBOX_WORKSPACE_QUOTA", default_value = "1g", value_parser = parse_bytes)]
    pub(super) workspace_quota: i64,
    /// A workspace unused this long is deleted (e.g. 7d).
    #[arg(long, env = "KERNELBOX_WORKSPACE_TTL", default_value = "7d", value_parser = parse_duration)]
    pub(super) workspace_ttl: Duration,
    /// Workspaces the tenant may hold at once.
    #[arg(long, env = "KERNELBOX_WORKSPACE_MAX", default_value_t = kernelbox::config::DEFAULT_WORKSPACE_MAX)]
    pub(super) workspace_max: usize,
    /// Directory of the workspaces' disk images (the engine must see it at this path).
    /// Default: the state directory's `workspaces`.
    #[arg(long, env = "KERNELBOX_WORKSPACE_DIR")]
    pub(super) workspace_dir: Option<PathBuf>,
    /// The most bytes of quota all workspaces of this host may add up to (e.g. 500g); a new
    /// workspace past it is refused (507). Default: what the workspace directory's disk can
    /// hold for them at start (its free space plus what the images already take).
    #[arg(long, env = "KERNELBOX_WORKSPACE_TOTAL", value_parser = parse_bytes)]
    pub(super) workspace_total: Option<i64>,
    /// Audit the tenant without a tenants file: one hash-chained JSON line per cell and
    /// command (docs/usage.md, "Audit trail"). With --tenants, give each tenant its `audit`.
    #[arg(long, env = "KERNELBOX_AUDIT")]
    pub(super) audit: bool,
    /// With --audit, record each cell's code itself beside its hash (never its output).
    #[arg(long, env = "KERNELBOX_AUDIT_CODE", requires = "audit")]
    pub(super) audit_code: bool,
    /// Where the audit trail goes: a file (appended to; its chain continues across restarts),
    /// or `-` for standard output. Default: the state directory's `audit.log`.
    #[arg(long, env = "KERNELBOX_AUDIT_FILE")]
    pub(super) audit_file: Option<PathBuf>,
    /// The audit file is rotated (FILE -> FILE.1 -> ...) when it reaches this size.
    #[arg(long, env = "KERNELBOX_AUDIT_ROTATE", default_value = "64m", value_parser = parse_budget)]
    pub(super) audit_rotate: u64,
    /// Rotated audit files kept (FILE.1 .. FILE.N).
    #[arg(long, env = "KERNELBOX_AUDIT_KEEP", default_value_t = kernelbox::audit::DEFAULT_AUDIT_KEEP)]
    pub(super) audit_keep: usize,
    /// On SIGTERM, how long running cells may take to finish before they are stopped.
    #[arg(long, env = "KERNELBOX_DRAIN_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub(super) drain_timeout: Duration,
    /// A request's headers must arrive in full within this time of their first byte, on a
    /// connection past its first request; otherwise it is closed.
    #[arg(long, env = "KERNELBOX_HEADER_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub(super) header_timeout: Duration,
    /// A connection's first request headers must arrive in full within this time of the
    /// accept (or --header-timeout, if shorter); otherwise it is closed.
    #[arg(long, env = "KERNELBOX_FIRST_HEADER_TIMEOUT", default_value = "3s", value_parser = parse_duration)]
    pub(super) first_header_timeout: Duration,
    /// A connection with no request in flight is closed after this long idle.
    #[arg(long, env = "KERNELBOX_KEEPALIVE_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub(super) keepalive_timeout: Duration,
    /// A request's body must arrive in full within this time of its headers; otherwise the
    /// connection is closed.
    #[arg(long, env = "KERNELBOX_BODY_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub(super) body_timeout: Duration,
    /// A response the client stops reading (a write to it blocked this long) has its
    /// connection closed, releasing what the response held (a download's kernel).
    #[arg(long, env = "KERNELBOX_SEND_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub(super) send_timeout: Duration,
    /// A file download read slower than this on average, in bytes per second (e.g. 64k, 1m),
    /// once --download-rate-grace has passed is cut and its kernel released; 0 sets no
    /// minimum.
    #[arg(long, env = "KERNELBOX_MIN_DOWNLOAD_RATE", default_value = "64k", value_parser = parse_rate)]
    pub(super) min_download_rate: u64,
    /// How long a file download runs before --min-download-rate applies.
    #[arg(long, env = "KERNELBOX_DOWNLOAD_RATE_GRACE", default_value = "30s", value_parser = parse_duration)]
    pub(super) download_rate_grace: Duration,
    /// Bytes of responses one tenant may have built and its clients not yet read (e.g. 64m);
    /// past it the tenant's new cells get 429 `too_many_pending_results` until they drain.
    /// Default: 64m (`server::ResponseLimits::default`).
    #[arg(long, env = "KERNELBOX_MAX_PENDING_RESULTS_PER_TENANT", value_parser = parse_budget)]
    pub(super) max_pending_results_per_tenant: Option<u64>,
    /// The same for all tenants together (e.g. 512m). Default: 512m.
    #[arg(long, env = "KERNELBOX_MAX_PENDING_RESULTS", value_parser = parse_budget)]
    pub(super) max_pending_results: Option<u64>,
    /// A response (a cell's result, a stream, a listing) read slower than this on average,
    /// in bytes per second, while it has bytes waiting, once --send-rate-grace has passed, is
    /// cut and what it held released; 0 sets no minimum. Default: 64k.
    #[arg(long, env = "KERNELBOX_MIN_SEND_RATE", value_parser = parse_rate)]
    pub(super) min_send_rate: Option<u64>,
    /// How long a response may have bytes waiting before --min-send-rate applies.
    /// Default: 30s.
    #[arg(long, env = "KERNELBOX_SEND_RATE_GRACE", value_parser = parse_duration)]
    pub(super) send_rate_grace: Option<Duration>,
    /// Most connections open at once (API and metrics listeners together); one more gets a
    /// 503 `too_many_connections` and is closed. Lowered at start, with a notice, when the
    /// open-file limit cannot hold it (docs/reliability.md, "Descriptors").
    #[arg(long, env = "KERNELBOX_MAX_CONNECTIONS", default_value_t = 1024,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) max_connections: u32,
    /// Most connections open at once on which no request has yet carried a valid token
    /// (default: a quarter of --max-connections). When they are all taken, a new connection
    /// takes the slot of one doing nothing useful (the oldest of the address holding the
    /// most), or is refused 503 `too_many_connections` if there is none.
    #[arg(long, env = "KERNELBOX_MAX_UNAUTHENTICATED_CONNECTIONS",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) max_unauthenticated_connections: Option<u32>,
    /// Most of those from one address (an IPv4 address or an IPv6 /64); one more is refused
    /// 503 `too_many_connections`. 0 sets no cap: set 0 behind a reverse proxy, where every
    /// connection comes from the proxy.
    #[arg(
        long,
        env = "KERNELBOX_MAX_UNAUTHENTICATED_PER_ADDRESS",
        default_value_t = 64
    )]
    pub(super) max_unauthenticated_per_address: u32,
    /// Serve `/metrics` only on this address (HOST:PORT), to anyone: make it a private one.
    /// The API listener then answers 404 there. Without it, `/metrics` is on the API
    /// listener, for callers with a tenant's token (see --public-metrics).
    #[arg(long, env = "KERNELBOX_METRICS_LISTEN")]
    pub(super) metrics_listen: Option<String>,
    /// Serve the E2B-compatible API on this address (HOST:PORT): E2B's SDKs then work
    /// unchanged with E2B_API_URL and E2B_SANDBOX_URL set to http://HOST:PORT and
    /// E2B_API_KEY a tenant's token (docs/e2b.md). Off without it.
    #[arg(long, env = "KERNELBOX_E2B_LISTEN")]
    pub(super) e2b_listen: Option<String>,
    /// Serve `/metrics` on the API listener to anyone, without a token. It shows every
    /// tenant's activity: prefer --metrics-listen on a private address.
    #[arg(long, env = "KERNELBOX_PUBLIC_METRICS")]
    pub(super) public_metrics: bool,
    /// Serve the operator's console at `/console` (docs/console.md): the fleet in a browser,
    /// for the admin token (everything) or a tenant's token (that tenant's view only).
    #[arg(long, env = "KERNELBOX_CONSOLE")]
    pub(super) console: bool,
    /// Send OpenTelemetry traces to this OTLP/HTTP receiver (its base URL, e.g.
    /// http://collector:4318; spans are POSTed as JSON to /v1/traces). Off without it. A
    /// caller's W3C traceparent is continued, and passed on to the tenant's tool endpoint.
    #[arg(long, env = "KERNELBOX_OTLP_ENDPOINT")]
    pub(super) otlp_endpoint: Option<String>,
    /// Kernels kept started and ready for new owners (the warm pool): a new session's first
    /// cell then skips the cold start. They count toward --max-kernels (not toward any
    /// tenant's cap). Default 4 (or --max-kernels if lower); 0 turns the pool off.
    #[arg(long, env = "KERNELBOX_POOL")]
    pub(super) pool: Option<usize>,
    /// A pooled kernel older than this is replaced by a fresh one (e.g. 15m).
    #[arg(long, env = "KERNELBOX_POOL_MAX_AGE", default_value = "15m", value_parser = parse_duration)]
    pub(super) pool_max_age: Duration,
    /// Modules each pooled kernel imports before it is offered, comma-separated (e.g.
    /// numpy,pandas,matplotlib.pyplot on the data-science image): a new session's first plot
    /// finds them loaded. Costs each pooled kernel their memory (docs/performance.md).
    #[arg(long, env = "KERNELBOX_POOL_PRELOAD", value_delimiter = ',')]
    pub(super) pool_preload: Vec<String>,
    /// Kernels kept ready per language other than Python, comma-separated LANGUAGE=N (e.g.
    /// bash=1,javascript=1): the first cell of a session's Bash, JavaScript or TypeScript
    /// context then skips the cold start too. They count toward --max-kernels with --pool.
    #[arg(long, env = "KERNELBOX_POOL_LANGUAGES", value_delimiter = ',', value_parser = parse_pool_language)]
    pub(super) pool_languages: Vec<(kernelbox::wire::Language, usize)>,
    /// An MCP session on /v1/mcp with no message for this long ends, and its kernels go
    /// (never less than --max-timeout plus 10 seconds).
    #[arg(long, env = "KERNELBOX_MCP_IDLE_TIMEOUT", default_value = "30m", value_parser = parse_duration)]
    pub(super) mcp_idle_timeout: Duration,
    /// MCP sessions one tenant may hold open at once on /v1/mcp.
    #[arg(long, env = "KERNELBOX_MCP_MAX_SESSIONS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub(super) mcp_max_sessions: u32,
    /// Join a kernelbox cluster whose catalog is this PostgreSQL database
    /// (postgres://USER:PASSWORD@HOST:PORT/DB); see docs/cluster.md. Without it the server
    /// is one host with its catalog in --state-dir.
    #[arg(long, env = "KERNELBOX_CLUSTER", hide_env_values = true)]
    pub(super) cluster: Option<String>,
    /// --cluster read from this file (a `docker secret` or a Kubernetes Secret mounted as a
    /// file), so the database's password is never in the environment.
    #[arg(long, env = "KERNELBOX_CLUSTER_FILE", conflicts_with = "cluster")]
    pub(super) cluster_file: Option<PathBuf>,
    /// This node's name in the cluster (default: the host name).
    #[arg(long, env = "KERNELBOX_NODE_NAME")]
    pub(super) node_name: Option<String>,
    /// How the other nodes reach this one, http://ADDR:PORT (default: http:// and the
    /// --listen address, which must then not be a wildcard).
    #[arg(long, env = "KERNELBOX_ADVERTISE")]
    pub(super) advertise: Option<String>,
    /// How long a node's cluster lease lasts past its last renewal (judged by the database's
    /// clock); a node that dies is reported lost this long after its last renewal.
    #[arg(long, env = "KERNELBOX_LEASE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub(super) lease_ttl: Duration,
    /// A node that cannot renew its lease fences itself (removes every kernel, serves
    /// nothing until it rejoins) this long before the lease could expire.
    #[arg(long, env = "KERNELBOX_FENCE_MARGIN", default_value = "3s", value_parser = parse_duration)]
    pub(super) fence_margin: Duration,
    /// The token of the admin routes (a cluster's GET /v1/nodes, POST /v1/nodes/NODE/drain;
    /// POST /v1/admin/reload, which re-reads the tenants; GET /v1/admin/kernels and tenants,
    /// and the console's admin view); without it they answer 404.
    #[arg(long, env = "KERNELBOX_ADMIN_TOKEN", hide_env_values = true)]
    pub(super) admin_token: Option<String>,
    /// --admin-token read from this file (a `docker secret` or a Kubernetes Secret).
    #[arg(
        long,
        env = "KERNELBOX_ADMIN_TOKEN_FILE",
        conflicts_with = "admin_token"
    )]
    pub(super) admin_token_file: Option<PathBuf>,
    /// A draining node's sessions still live this long after the drain began are ended and
    /// reported `node_drained`; with it a stop (SIGTERM) drains first: no new sessions here,
    /// live ones continue until they end or the deadline passes (docs/cluster.md, "Draining
    /// and upgrades"). Give the engine's stop grace period more than this.
    #[arg(long, env = "KERNELBOX_DRAIN_DEADLINE", value_parser = parse_duration)]
    pub(super) drain_deadline: Option<Duration>,
    #[command(flatten)]
    pub(super) kernel: KernelOpts,
}

impl ServeArgs {
    /// The connection bounds the flags ask for.
    fn limits(&self) -> server::Limits {
        server::Limits {
            header_timeout: self.header_timeout,
            first_header_timeout: self.first_header_timeout,
            keepalive_timeout: self.keepalive_timeout,
            body_timeout: self.body_timeout,
            send_timeout: self.send_timeout,
            max_connections: self.max_connections as usize,
            max_unauthenticated: self.max_unauthenticated_connections.map(|n| n as usize),
            max_unauthenticated_per_address: self.max_unauthenticated_per_address as usize,
        }
    }
}

/// A rate in bytes per second: a size as `--memory` takes it (`64k`, `1m`; `/s` may follow),
/// or `0` for none.
fn parse_rate(text: &str) -> Result<u64, String> {
    let size = text.trim();
    let size = size.strip_suffix("/s").unwrap_or(size);
    if size.trim().parse::<f64>() == Ok(0.0) {
        return Ok(0);
    }
    let bytes = parse_bytes(size).map_err(|e| format!("{e}; or 0 for no minimum"))?;
    u64::try_from(bytes).map_err(|e| format!("{text:?}: {e}"))
}

/// A positive size in bytes (`64m`, `1g`).
fn parse_budget(text: &str) -> Result<u64, String> {
    let bytes = parse_bytes(text).map_err(|e| e.to_string())?;
    match u64::try_from(bytes) {
        Ok(0) => Err(format!("{text:?}: must be more than 0")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{text:?}: {e}")),
    }
}

/// One `--pool-languages` entry, LANGUAGE=N (`bash=1`).
fn parse_pool_language(text: &str) -> Result<(kernelbox::wire::Language, usize), String> {
    let (name, n) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not LANGUAGE=N (e.g. bash=1)"))?;
    let language = kernelbox::wire::Language::parse(name.trim())
        .ok_or_else(|| format!("{name:?} is not a language (bash, javascript, typescript)"))?;
    let n = n
        .trim()
        .parse()
        .map_err(|_| format!("{n:?} is not a number of kernels"))?;
    Ok((language, n))
}

/// The warm pool of a server when `--pool` is not given (at most `--max-kernels`).
pub(super) const DEFAULT_POOL: usize = 4;

/// The Python pool's size: `--pool`, else [`DEFAULT_POOL`] within what `--max-kernels` leaves
/// beside `--pool-languages`.
pub(super) fn pool_size(args: &ServeArgs) -> usize {
    let languages = args.pool_languages.iter();
    let languages = languages.fold(0usize, |sum, (_, n)| sum.saturating_add(*n));
    args.pool
        .unwrap_or(DEFAULT_POOL.min(args.max_kernels.saturating_sub(languages)))
}

fn usage(message: String) -> anyhow::Error {
    Exit { code: 2, message }.into()
}

/// Writes a line to stderr in the log format, ignoring failure (`kernelbox::logging::say`).
macro_rules! say {
    ($($arg:tt)*) => {{
        kernelbox::logging::say(&format!($($arg)*));
    }};
}

/// `--session-max-*`: the session limits of the one tenant without a tenants file
/// (`src/settings.rs`).
fn session_limits(args: &ServeArgs) -> anyhow::Result<kernelbox::settings::Limits> {
    if let Some(cpus) = args.session_max_cpus {
        if !(cpus.is_finite() && cpus >= kernelbox::settings::MIN_CPUS) {
            return Err(usage(format!(
                "--session-max-cpus must be at least {}",
                kernelbox::settings::MIN_CPUS
            )));
        }
    }
    Ok(kernelbox::settings::Limits {
        memory_bytes: args.session_max_memory,
        nano_cpus: args.session_max_cpus.map(|c| (c * 1e9).round() as i64),
        idle_timeout: args.session_max_idle_timeout,
    })
}

/// The workspaces' configuration (docs/workspaces.md): each tenant's `workspaces` in the
/// tenants file, or `--workspaces` for the one tenant without a file.
fn workspaces_config(
    args: &ServeArgs,
    source: &TenantsSource,
    tenants: &Tenants,
    state_dir: Option<&std::path::Path>,
) -> anyhow::Result<Option<kernelbox::config::WorkspacesConfig>> {
    let policies = match (source.is_file(), args.workspaces) {
        (true, true) => {
            return Err(usage(
                "--workspaces applies without --tenants; with a tenants file, give each tenant its `workspaces`".into(),
            ))
        }
        (true, false) => tenants.workspaces(),
        (false, true) => std::collections::BTreeMap::from([(
            "default".to_string(),
            kernelbox::config::WorkspacePolicy {
                quota_bytes: args.workspace_quota.max(0) as u64,
                ttl: args.workspace_ttl,
                max: args.workspace_max,
            },
        )]),
        (false, false) => return Ok(None),
    };
    if policies.is_empty() {
        return Ok(None);
    }
    let dir =
        match (&args.workspace_dir, state_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(state)) => state.join("workspaces"),
            (None, None) => return Err(usage(
                "workspaces need --workspace-dir on a cluster node (there is no state directory)"
                    .into(),
            )),
        };
    let dir = if dir.is_absolute() {
        dir
    } else {
        std::env::current_dir()?.join(dir)
    };
    Ok(Some(kernelbox::config::WorkspacesConfig {
        dir,
        tenants: policies,
        total_bytes: args.workspace_total.map(|t| t.max(0) as u64),
    }))
}

/// The audit trail's configuration (docs/usage.md, "Audit trail"): each tenant's `audit` in
/// the tenants file, or `--audit` for the one tenant without a file; `None` when no tenant is
/// audited.
fn audit_config(
    args: &ServeArgs,
    source: &TenantsSource,
    tenants: &Tenants,
    state_dir: Option<&std::path::Path>,
) -> anyhow::Result<Option<kernelbox::audit::AuditConfig>> {
    use kernelbox::audit::{AuditConfig, AuditPolicy, AuditSink};
    let policies = match (source.is_file(), args.audit) {
        (true, true) => return Err(usage(
            "--audit applies without --tenants; with a tenants file, give each tenant its `audit`"
                .into(),
        )),
        (true, false) => tenants.audits(),
        (false, true) => std::collections::BTreeMap::from([(
            "default".to_string(),
            AuditPolicy {
                code: args.audit_code,
            },
        )]),
        (false, false) => std::collections::BTreeMap::new(),
    };
    if policies.is_empty() {
        if args.audit_file.is_some() {
            return Err(usage(
                "--audit-file names where the audit trail goes, but no tenant is audited (--audit, or `audit` in the tenants file)".into(),
            ));
        }
        return Ok(None);
    }
    let sink = match (&args.audit_file, state_dir) {
        (Some(path), _) if path.as_os_str() == "-" => AuditSink::Stdout,
        (Some(path), _) => AuditSink::File {
            path: path.clone(),
            rotate_bytes: args.audit_rotate,
            keep: args.audit_keep,
        },
        (None, Some(state)) => AuditSink::File {
            path: state.join("audit.log"),
            rotate_bytes: args.audit_rotate,
            keep: args.audit_keep,
        },
        (None, None) => return Err(usage(
            "the audit trail needs --audit-file on a cluster node (there is no state directory)"
                .into(),
        )),
    };
    Ok(Some(AuditConfig {
        sink,
        tenants: policies,
    }))
}

/// The one tenant `default` of a server without a tenants file, its settings from the flags.
pub(super) fn flags_tenant(args: &ServeArgs, token: &str) -> anyhow::Result<Tenants> {
    let mut tenant = Tenant::with_token("default", token);
    tenant.session_limits = session_limits(args)?;
    Tenants::new(vec![tenant]).map_err(|e| usage(e.to_string()))
}

/// The server's configuration from `serve`'s resolved arguments and its tenants, before the
/// descriptor fitting and the validation: what `run` starts with and `kernelbox config check`
/// validates (docs/configuration.md).
pub(super) fn server_config(
    args: &ServeArgs,
    source: &TenantsSource,
    tenants: &Tenants,
) -> anyhow::Result<kernelbox::config::Config> {
    let mut config = args.kernel.config()?;
    // With a tenants file, each tenant's policy is its `network` there (docs/reliability.md,
    // "Network egress"); --network-allow is the policy of the one tenant without a file.
    if source.is_file() {
        if session_limits(args)? != kernelbox::settings::Limits::default() {
            return Err(usage(
                "--session-max-* apply without --tenants; with a tenants file, give each tenant its `session_limits`".into(),
            ));
        }
        if args.kernel.names_a_network() {
            return Err(usage(
                "--network-allow/--network-deny apply without --tenants; with a tenants file, give each tenant its `network`".into(),
            ));
        }
        let networks = tenants.networks();
        if !networks.is_empty() {
            config.egress = Some(args.kernel.egress(networks)?);
        }
    }
    config.tenant_runtimes = tenants.runtimes();
    config.tenant_session_limits = tenants.session_limits();
    config.kernels.max_session_kernels = args.max_kernels;
    config.kernels.idle_timeout = args.idle_timeout;
    config.pool.size = pool_size(args);
    config.pool.max_age = args.pool_max_age;
    config.pool.preload = args.pool_preload.clone();
    config.pool.languages = args.pool_languages.iter().copied().collect();
    config.files.download_min_rate = args.min_download_rate;
    config.files.download_rate_grace = args.download_rate_grace;
    config.housekeeping.watchdog = std::env::current_exe().ok();
    // A cluster node's catalog is the cluster's (docs/cluster.md); one host's is a file.
    let clustered = args.cluster.is_some() || args.cluster_file.is_some();
    config.housekeeping.state_dir = match (clustered, args.state_dir.clone()) {
        (true, _) => None,
        (false, Some(dir)) => Some(dir),
        (false, None) => Some(default_state_dir().ok_or_else(|| {
            usage("no --state-dir given and neither XDG_STATE_HOME nor HOME is set".into())
        })?),
    };
    // The egress CA is kept under --state-dir unless --egress-ca-dir says otherwise (even on
    // a cluster node, whose catalog is elsewhere).
    if args.kernel.egress_ca_dir.is_none() {
        let credentials = config.egress.as_mut().and_then(|e| e.credentials.as_mut());
        if let (Some(credentials), Some(dir)) = (credentials, args.state_dir.clone()) {
            credentials.ca_dir = dir.join(super::EGRESS_CA_DIR);
        }
    }
    let state_dir = config.housekeeping.state_dir.clone();
    config.workspaces = workspaces_config(args, source, tenants, state_dir.as_deref())?;
    config.audit = audit_config(args, source, tenants, state_dir.as_deref())?;
    config.snapshots = kernelbox::config::SnapshotConfig {
        max_per_tenant: args.snapshot_max,
        max_tenant_bytes: args.snapshot_tenant_bytes,
        ttl: args.snapshot_ttl,
        ..Default::default()
    };
    let hibernating = tenants.hibernating();
    if args.hibernate || !hibernating.is_empty() {
        config.hibernate = Some(kernelbox::config::HibernateConfig {
            tenants: (!args.hibernate).then_some(hibernating),
            max_kernels: args.hibernate_max,
            max_age: args.hibernate_max_age,
            ..Default::default()
        });
    }
    Ok(config)
}

/// Runs the server until SIGTERM or SIGINT; exit 0 after a clean shutdown.
/// `args` are resolved (the configuration file applied: `super::config::serve`) and `source`
/// says where the tenants come from.
pub(crate) async fn run(
    args: ServeArgs,
    source: TenantsSource,
    check: FileCheck,
) -> anyhow::Result<ExitCode> {
    // Before anything else: SIGHUP's default action ends the process.
    let hangups = listen_for_hangups();
    let from_env = std::env::var("KERNELBOX_TOKEN")
        .ok()
        .filter(|t| !t.trim().is_empty());
    // The configuration file as read at start: a reload reports the keys changed since that
    // it cannot apply.
    let mut started = None;
    let (tenants, generated) = match &source {
        TenantsSource::Json(_) | TenantsSource::Config(_) => {
            let loaded = load_tenants(&source, check)?;
            started = loaded.file;
            (loaded.tenants, None)
        }
        TenantsSource::Flags => {
            let (token, generated) = match &from_env {
                Some(t) => (t.trim().to_string(), None),
                None => {
                    let t = server::tenants::generate_token();
                    (t.clone(), Some(t))
                }
            };
            (flags_tenant(&args, &token)?, generated)
        }
    };
    let mut config = server_config(&args, &source, &tenants)?;
    // Descriptors (docs/reliability.md, "Descriptors"): the soft limit raised to the hard one,
    // and the connection totals kept well below it.
    let raised = server::descriptors::raise_limit().map_err(|e| usage(e.to_string()))?;
    let egress_total = config.egress.as_ref().map(|e| e.limits.connections);
    let fitted = server::descriptors::fit(
        raised.now,
        args.max_kernels,
        args.max_connections as usize,
        egress_total,
    )
    .map_err(|e| usage(e.to_string()))?;
    if fitted.api != args.max_connections as usize || fitted.egress != egress_total {
        let message = format!(
            "the open-file limit is {}: connections lowered to fit it (API {} -> {}, egress proxy {} -> {}); raise the limit to keep them",
            raised.now,
            args.max_connections,
            fitted.api,
            egress_total.map_or("-".into(), |n| n.to_string()),
            fitted.egress.map_or("-".into(), |n| n.to_string()),
        );
        tracing::warn!("{message}");
        say!("kernelbox: {message}");
    }
    if let (Some(egress), Some(total)) = (config.egress.as_mut(), fitted.egress) {
        egress.limits.connections = total;
    }
    let mut http_limits = args.limits();
    http_limits.max_connections = fitted.api;
    http_limits.max_unauthenticated = http_limits.max_unauthenticated.map(|n| n.min(fitted.api));
    let config = config.validate()?;
    tenants
        .check_reserved(config.kernels.max_session_kernels)
        .map_err(|e| usage(e.to_string()))?;

    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|e| usage(format!("--listen {}: {e}", args.listen)))?;
    let addr = listener.local_addr()?;
    if !source.is_file() && from_env.is_none() && !addr.ip().is_loopback() {
        return Err(usage(format!(
            "--listen {addr} is not a loopback address: without --tenants, set KERNELBOX_TOKEN to serve beyond this host"
        )));
    }

    let metrics = match &args.metrics_listen {
        Some(listen) => Some(
            tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| usage(format!("--metrics-listen {listen}: {e}")))?,
        ),
        None => None,
    };

    let e2b = match &args.e2b_listen {
        Some(listen) => Some(
            tokio::net::TcpListener::bind(listen)
                .await
                .map_err(|e| usage(format!("--e2b-listen {listen}: {e}")))?,
        ),
        None => None,
    };

    // Traces (docs/usage.md, "Traces"): flushed and stopped after the server.
    let telemetry = match &args.otlp_endpoint {
        Some(endpoint) => Some(
            kernelbox::telemetry::init(endpoint, "kernelbox").map_err(|e| usage(e.to_string()))?,
        ),
        None => None,
    };

    // A signal asks for a stop; a cluster node with a drain deadline drains before the
    // server's shutdown begins (`ClusterNode::drain_before_stop`).
    let stop = CancellationToken::new();
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(wait_for_signal(stop.clone()));
    let Some(engine) = connect_with_retry(&stop).await? else {
        return Ok(ExitCode::SUCCESS);
    };
    // The server's image and every image a tenant names must be there before anyone calls.
    for image in std::iter::once(config.spec.image.as_str()).chain(tenants.images()) {
        if !engine.image_exists(image).await? {
            return Err(kernelbox::EngineError::ImageMissing {
                image: image.to_string(),
            }
            .into());
        }
    }
    let (orchestrator, node) = match cluster_options(&args, addr)? {
        None => (Orchestrator::start(config, engine).await?, None),
        Some(options) => {
            let capacity = config.kernels.max_session_kernels;
            let (node, catalog) = server::cluster::ClusterNode::join(options, capacity).await?;
            let catalog =
                std::sync::Arc::new(catalog) as std::sync::Arc<dyn kernelbox::catalog::Catalog>;
            let orchestrator =
                Orchestrator::start_with_catalog(config, engine, Some(catalog)).await?;
            // The node's workspaces are the catalog's: an image of another generation is
            // stale, dropped now (a node coming back) and at every sweep (docs/workspaces.md,
            // "In a cluster").
            if let Some(workspaces) = orchestrator.workspaces() {
                workspaces.set_ledger(node.workspace_ledger());
                if let Err(e) = workspaces.sweep_expired().await {
                    tracing::warn!(error = %e, "dropping stale workspaces at start");
                }
            }
            (orchestrator, Some(node))
        }
    };
    // The API's and the metrics' own addresses are never an egress destination
    // (docs/reliability.md, "Special and host addresses").
    if let Some(egress) = orchestrator.sessions().egress() {
        let mut own = vec![addr];
        if let Some(metrics) = &metrics {
            own.push(metrics.local_addr()?);
        }
        if let Some(e2b) = &e2b {
            own.push(e2b.local_addr()?);
        }
        egress.refuse_listeners(&own);
    }
    let mcp = server::McpOptions {
        idle_timeout: args.mcp_idle_timeout,
        max_sessions_per_tenant: args.mcp_max_sessions as usize,
    };
    let defaults = server::ResponseLimits::default();
    let responses = server::ResponseLimits {
        tenant_bytes: args
            .max_pending_results_per_tenant
            .unwrap_or(defaults.tenant_bytes),
        host_bytes: args.max_pending_results.unwrap_or(defaults.host_bytes),
        min_rate: args.min_send_rate.unwrap_or(defaults.min_rate),
        rate_grace: args.send_rate_grace.unwrap_or(defaults.rate_grace),
    };
    let state = AppState::with_options(orchestrator, tenants.clone(), mcp, responses);
    if let Some(token) = admin_token(&args)? {
        state.admin_with(&token);
    }
    if source.is_file() {
        state.reload_with(server::reload::Reloader::new(
            tenants_loader(
                source.clone(),
                args.kernel.egress_secrets.clone(),
                check,
                started,
            ),
            admin_token(&args)?.as_deref(),
        ));
    }
    let reloads = hangups.map(|hangups| tokio::spawn(reload_on_hangup(hangups, state.clone())));
    if let Some(telemetry) = &telemetry {
        state.trace_with(telemetry.tracer());
    }
    if let Some(node) = node {
        node.start(state.orchestrator().clone());
        node.until_serving().await;
        say!(
            "kernelbox: node {} joined the cluster (epoch {})",
            node.name(),
            node.epoch()
        );
        state.join_cluster(node);
    }
    let stopper = {
        let (stop, shutdown, node) = (stop.clone(), shutdown.clone(), state.cluster().cloned());
        tokio::spawn(async move {
            stop.cancelled().await;
            if let Some(node) = node {
                node.drain_before_stop().await;
            }
            shutdown.cancel();
        })
    };

    say!(
        "kernelbox: serving {} tenant(s) on http://{addr} (instance {})",
        tenants.len(),
        state.orchestrator().instance_id()
    );
    if let Some(metrics) = &metrics {
        say!(
            "kernelbox: metrics on http://{}/metrics",
            metrics.local_addr()?
        );
    }
    if let Some(e2b) = &e2b {
        say!("kernelbox: E2B API on http://{}", e2b.local_addr()?);
    }
    if let Some(token) = generated {
        say!("kernelbox: tenant \"default\" token: {token}");
    }
    let options = server::ServeOptions {
        drain: args.drain_timeout,
        limits: http_limits,
        metrics,
        public_metrics: args.public_metrics,
        e2b,
        console: args.console,
    };
    let served = server::serve_with(listener, state, shutdown, options).await;
    signals.abort();
    stopper.abort();
    if let Some(reloads) = reloads {
        reloads.abort();
    }
    if let Some(telemetry) = telemetry {
        if let Err(e) = telemetry.shutdown().await {
            tracing::warn!(error = %e, "sending the last spans");
        }
    }
    served?;
    say!("kernelbox: stopped; every kernel of this instance was removed");
    Ok(ExitCode::SUCCESS)
}

/// The cluster options the flags ask for, if any (checked: exit code 2 otherwise).
fn cluster_options(
    args: &ServeArgs,
    addr: std::net::SocketAddr,
) -> anyhow::Result<Option<server::cluster::ClusterOptions>> {
    let url = match (&args.cluster, &args.cluster_file) {
        (Some(url), _) => url.clone(),
        (None, Some(path)) => read_secret("--cluster-file", path)?,
        (None, None) => return Ok(None),
    };
    let admin_token = admin_token(args)?;
    let node = match &args.node_name {
        Some(name) => name.clone(),
        None => kernelbox::instance::Instance::current().host,
    };
    let advertise = match &args.advertise {
        Some(a) => a.trim_end_matches('/').to_string(),
        None if addr.ip().is_unspecified() => {
            return Err(usage(format!(
                "--listen {addr} is a wildcard address: give --advertise http://ADDR:PORT, how the other nodes reach this one"
            )))
        }
        None => format!("http://{addr}"),
    };
    let options = server::cluster::ClusterOptions {
        url,
        node,
        advertise,
        lease_ttl: args.lease_ttl,
        fence_margin: args.fence_margin,
        admin_token: admin_token.filter(|t| !t.trim().is_empty()),
        drain_deadline: args.drain_deadline,
    };
    if let Some(problem) = options.problem() {
        return Err(usage(problem));
    }
    Ok(Some(options))
}

/// The admin token (`--admin-token`, or `--admin-token-file`), if any: the cluster's admin
/// routes and the reload route answer to it.
fn admin_token(args: &ServeArgs) -> anyhow::Result<Option<String>> {
    Ok(match (&args.admin_token, &args.admin_token_file) {
        (Some(token), _) => Some(token.clone()),
        (None, Some(path)) => Some(read_secret("--admin-token-file", path)?),
        (None, None) => None,
    })
}

/// What a reload re-reads (`server::reload`; docs/http-api.md, "Reloading the tenants"): the
/// tenants' file (`load_tenants`) and the egress secrets file the server started with
/// (`secrets`: `--egress-secrets`, or the configuration file's `[egress] secrets` under it).
/// The other keys of a configuration file changed since `started` (the secrets file's path
/// among them) are reported as needing a restart.
fn tenants_loader(
    source: TenantsSource,
    secrets: Option<PathBuf>,
    check: FileCheck,
    started: Option<kernelbox::config::file::ConfigFile>,
) -> server::reload::Loader {
    Box::new(move || {
        let loaded = load_tenants(&source, check).map_err(|e| e.to_string())?;
        let needs_restart = match (&started, &loaded.file) {
            (Some(before), Some(now)) => kernelbox::config::file::needs_restart(before, now),
            _ => Vec::new(),
        };
        let secrets = secrets
            .as_deref()
            .map(kernelbox::egress::secrets::Secrets::load)
            .transpose()
            .map_err(|e| e.to_string())?;
        Ok(server::reload::Source {
            tenants: loaded.tenants,
            secrets,
            needs_restart,
        })
    })
}

/// The SIGHUP stream, installed at once (so a SIGHUP no longer ends the process); `None`,
/// with a warning, when it cannot be.
fn listen_for_hangups() -> Option<tokio::signal::unix::Signal> {
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(hangups) => Some(hangups),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP: reload with POST /v1/admin/reload");
            None
        }
    }
}

/// Reloads the tenants on every SIGHUP and says how it went on stderr (one line: applied or
/// refused, and the report as JSON).
async fn reload_on_hangup(mut hangups: tokio::signal::unix::Signal, state: AppState) {
    while hangups.recv().await.is_some() {
        let report = state.reload().await;
        let verdict = if report.applied { "applied" } else { "refused" };
        let json = serde_json::to_string(&report).unwrap_or_default();
        say!("kernelbox: reload {verdict}: {json}");
    }
}

/// A secret given as a file (its content, surrounding white space trimmed); exit code 2 when
/// it cannot be read or is empty.
fn read_secret(flag: &str, path: &std::path::Path) -> anyhow::Result<String> {
    // Bounded, and never waiting on a FIFO (`Secret::resolve`).
    kernelbox::config::file::Secret::file(path)
        .resolve()
        .map_err(|e| usage(format!("{flag} {e}")))
}

/// The XDG state directory of the user running the server: per-user, writable without root,
/// and kept across reboots (unlike /run or /tmp).
pub(super) fn default_state_dir() -> Option<PathBuf> {
    let from = |var: &str| {
        std::env::var_os(var)
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
    };
    from("XDG_STATE_HOME")
        .map(|d| d.join("kernelbox"))
        .or_else(|| from("HOME").map(|h| h.join(".local/state/kernelbox")))
}

/// Connects to the engine, retrying with backoff (up to 30 s apart) while it is unreachable,
/// so a server started before its engine comes up by itself. `None` when told to stop first.
async fn connect_with_retry(
    shutdown: &CancellationToken,
) -> anyhow::Result<Option<std::sync::Arc<dyn kernelbox::Engine>>> {
    let mut backoff = Duration::from_millis(500);
    loop {
        match super::connect().await {
            Ok(engine) => return Ok(Some(engine)),
            Err(e)
                if e.chain().any(|c| {
                    c.downcast_ref::<kernelbox::EngineError>()
                        .is_some_and(kernelbox::EngineError::is_unreachable)
                }) =>
            {
                say!(
                    "kernelbox: {e:#}; retrying in {}",
                    humantime::format_duration(backoff)
                );
            }
            Err(e) => return Err(e),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(Duration::from_secs(30));
    }
}

async fn wait_for_signal(shutdown: CancellationToken) {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    say!("kernelbox: shutting down (finishing running cells, then removing kernels)");
    shutdown.cancel();
}

#[cfg(test)]
mod tests {
    use super::{parse_rate, ServeArgs};

    #[test]
    fn the_connection_flags_default_to_the_servers_own_limits() {
        #[derive(Debug, clap::Parser)]
        struct Cli {
            #[command(flatten)]
            serve: ServeArgs,
        }
        let cli = <Cli as clap::Parser>::try_parse_from(["serve"]).expect("no flags");
        assert_eq!(cli.serve.limits(), kernelbox::server::Limits::default());
        assert_eq!(
            cli.serve.public_metrics,
            kernelbox::server::ServeOptions::default().public_metrics
        );
        let cli = <Cli as clap::Parser>::try_parse_from([
            "serve",
            "--max-connections",
            "64",
            "--max-unauthenticated-per-address",
            "0",
            "--first-header-timeout",
            "2s",
            "--public-metrics",
        ])
        .expect("flags");
        assert!(cli.serve.public_metrics);
        let limits = cli.serve.limits();
        assert_eq!(limits.unauthenticated(), 16);
        assert_eq!(limits.max_unauthenticated_per_address, 0);
        assert_eq!(
            limits.first_header_timeout,
            std::time::Duration::from_secs(2)
        );
    }

    #[test]
    fn a_rate_is_a_size_per_second_and_zero_is_none() {
        assert_eq!(parse_rate("64k"), Ok(64 * 1024));
        assert_eq!(parse_rate("1m/s"), Ok(1024 * 1024));
        assert_eq!(parse_rate("100"), Ok(100));
        assert_eq!(parse_rate("0"), Ok(0));
        assert_eq!(parse_rate(" 0.0 "), Ok(0));
        assert!(parse_rate("fast").is_err());
        assert!(parse_rate("-1k").is_err());
    }
}
