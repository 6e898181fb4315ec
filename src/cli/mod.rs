//! Command-line verbs. Each verb resolves its configuration once, then calls the library.
//!
//! | file | what |
//! |---|---|
//! | `mod.rs` | [`Cli`] and its verbs, the kernel options a local run shares ([`KernelOpts`]), exit codes, `exec` and `sweep` |
//! | `serve.rs` | `kernelbox serve`: the multi-tenant HTTP API |
//! | `config.rs` | the configuration file: `serve --config` as flag values, `config schema`, `check`, `migrate`; `serve --print-config` |
//! | `tenant_source.rs` | where `serve`'s tenants come from (flags, a JSON file, the configuration file), read again by a reload |
//! | `repl.rs` | `kernelbox repl`: cells from standard input, state kept |
//! | `sh.rs` | `kernelbox sh`: one shell command in a session's kernel container |
//! | `remote.rs` | `kernelbox exec --url`, and the exit code of any failed call to a server |
//! | `cp.rs` | `kernelbox cp`: files to and from a server's session, like `docker cp` |
//! | `transfer.rs` | local files to and from kernels, shared by `cp` and `exec`/`repl` `--upload`/`--download` |
//! | `admin.rs` | `ps`, `inspect`, `logs`, `kill`: from Docker labels alone |
//! | `cluster.rs` | `nodes`, `drain` and `ps --url`: a cluster through any node's HTTP API |
//! | `usage.rs` | `kernelbox usage`: a server's usage ledger |
//! | `workspaces.rs` | `kernelbox workspaces`: a tenant's workspaces on a server |
//! | `audit.rs` | `kernelbox audit verify`: an audit trail's hash chain |
//! | `mcp.rs` | `kernelbox mcp`: MCP over standard input/output |

mod admin;
mod audit;
mod cluster;
mod config;
mod cp;
mod mcp;
mod remote;
mod repl;
mod serve;
mod sh;
mod tenant_source;
mod transfer;
mod usage;
mod workspaces;

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use kernelbox::config::{parse_bytes, parse_duration};
use kernelbox::{
    BollardEngine, CellStatus, Config, Engine, ExecuteRequest, Orchestrator, WorkMode,
};

/// Stateful Python kernels in hardened Docker containers, one per agent conversation.
#[derive(Debug, Parser)]
#[command(name = "kernelbox", version, about, long_about = None)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// How log lines on stderr are written: `text` (human-readable) or `json` (one object per
    /// line; docs/logs.md).
    #[arg(long, global = true, env = "KERNELBOX_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,
    /// Log levels as an `EnvFilter` directive string, e.g. `warn,kernelbox::server=info`
    /// (default `warn`; a server adds its access log and lifecycle events at `info`, which
    /// `kernelbox::access=off` turns off; docs/logs.md).
    #[arg(long, global = true, env = "KERNELBOX_LOG")]
    log_level: Option<String>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one cell in a kernel for SESSION and print the result JSON.
    ///
    /// The kernel lives for this command only; use `repl` (or the server) to keep state
    /// across cells.
    Exec(ExecArgs),
    /// Read cells from standard input and run them in one kernel, printing their output.
    ///
    /// A blank line ends a cell. Works interactively and piped:
    /// `printf 'x = 41\n\nprint(x + 1)\n' | kernelbox repl --session demo`.
    Repl(ReplArgs),
    /// Run a shell command in SESSION's kernel container: `kernelbox sh SESSION -- ls -l`.
    ///
    /// Against a server with --url, or in a kernel of its own (gone when it ends). Prints the
    /// command's stdout and stderr and exits with its exit code (124 on a timeout).
    Sh(sh::ShArgs),
    /// Copy files between here and a session's kernel on a server, like `docker cp`:
    /// `kernelbox cp LOCAL SESSION:PATH` or `kernelbox cp SESSION:PATH LOCAL`.
    Cp(cp::CpArgs),
    /// Build the kernel image (offline base bootstrap included when needed).
    Image {
        #[command(subcommand)]
        command: ImageCommand,
    },
    /// Remove leftovers of dead kernelbox instances and stale staging volumes, by label.
    Sweep(SweepArgs),
    /// List kernel containers on this engine (tenant, owner, state, age, memory), by label.
    Ps(admin::PsArgs),
    /// Show one kernel's labels and resource use.
    Inspect(admin::InspectArgs),
    /// Show a kernel's lifecycle events (cell output is never logged on the host).
    Logs(admin::LogsArgs),
    /// Kill kernels by container, owner, tenant, or all; their volumes go too.
    Kill(admin::KillArgs),
    /// Serve the multi-tenant HTTP API until SIGTERM, then remove every kernel.
    Serve(Box<serve::ServeArgs>),
    /// Show a server's usage ledger (docs/usage.md): per session or per day, as a table, JSON
    /// (--json) or CSV (--csv).
    Usage(usage::UsageArgs),
    /// A tenant's workspaces on a server (docs/workspaces.md): `list` (the default) or `rm
    /// NAME`.
    Workspaces(workspaces::WorkspacesArgs),
    /// The audit trail of what ran (docs/usage.md, "Audit trail"): `kernelbox audit verify
    /// FILE...` checks its hash chain.
    Audit {
        #[command(subcommand)]
        command: audit::AuditCommand,
    },
    /// The configuration file of `serve --config` (docs/configuration.md): `schema` prints
    /// its JSON Schema, `check FILE` checks one, `migrate [serve flags]` writes one from flags.
    Config {
        #[command(subcommand)]
        command: config::ConfigCommand,
    },
    /// List a cluster's nodes: state, epoch, live kernels, capacity, lease age, draining.
    Nodes(cluster::NodesArgs),
    /// Drain a cluster node: no new sessions are placed on it (--wait: until it is empty).
    Drain(cluster::DrainArgs),
    /// Serve MCP (Model Context Protocol) tools on standard input/output for one session.
    ///
    /// Runs its own kernels, or with --url calls a kernelbox server. For a desktop agent's
    /// MCP configuration; see docs/mcp.md, "MCP".
    Mcp(mcp::McpArgs),
    /// (internal) Clean up after an orchestrator when its lifeline on stdin closes.
    #[command(hide = true)]
    Watchdog {
        /// Instance id whose containers and volumes to remove.
        #[arg(long)]
        instance: String,
        /// Its server's checkpoints directory tag: only read from the command line by
        /// `kernelbox sweep`, which keeps that directory's hibernated kernels.
        #[arg(long)]
        checkpoints: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum ImageCommand {
    /// Build a kernel image offline: `plain` (the default image) from images/Dockerfile,
    /// bootstrapping its base if needed, or `datascience` (numpy, pandas, matplotlib, pillow,
    /// scipy from Debian's packages) on top of the plain image.
    Build {
        /// Which image: plain (kernelbox/kernel:latest) or datascience
        /// (kernelbox/kernel-datascience:latest).
        #[arg(long, default_value = "plain", value_parser = parse_preset)]
        preset: kernelbox::image::Preset,
        /// Tag of the image to build (default: the preset's).
        #[arg(long)]
        tag: Option<String>,
        /// Base image (default: the preset's: the offline Debian base for plain, where a
        /// registry is reachable an official python image; the plain image for datascience).
        #[arg(long)]
        base: Option<String>,
        /// Directory holding the Dockerfiles and bootstrap script.
        #[arg(long, default_value = "images")]
        dir: PathBuf,
        /// Rebuild even when the image exists.
        #[arg(long)]
        force: bool,
    },
}

fn parse_preset(text: &str) -> Result<kernelbox::image::Preset, String> {
    text.parse()
}

/// Options shared by every verb that runs kernels.
#[derive(Debug, Args, Clone)]
pub struct KernelOpts {
    /// Image to run kernels from, e.g. kernelbox/kernel-datascience:latest (`image build
    /// --preset datascience`); on `serve`, a tenant's `image` in the tenants file overrides it.
    #[arg(long, env = "KERNELBOX_IMAGE", default_value = kernelbox::config::DEFAULT_IMAGE)]
    image: String,
    /// Cell timeout (e.g. 30s, 5m).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    timeout: Duration,
    /// Longest timeout a request may ask for (e.g. 10m); default the larger of --timeout and 1h.
    #[arg(long, env = "KERNELBOX_MAX_TIMEOUT", value_parser = parse_duration)]
    max_timeout: Option<Duration>,
    /// How long an interrupted cell may take to stop on its KeyboardInterrupt before its
    /// kernel is killed (e.g. 5s).
    #[arg(long, env = "KERNELBOX_INTERRUPT_GRACE", default_value = "5s", value_parser = parse_duration)]
    interrupt_grace: Duration,
    /// Memory limit per kernel (e.g. 512m, 1g).
    #[arg(long, default_value = "512m", value_parser = parse_bytes)]
    memory: i64,
    /// CPUs per kernel.
    #[arg(long, default_value_t = 1.0)]
    cpus: f64,
    /// Process/thread limit per kernel.
    #[arg(long, default_value_t = 256)]
    pids: i64,
    /// Bind-mount this directory as the working directory (project mode) instead of a
    /// staging volume (strict mode).
    #[arg(long)]
    project: Option<PathBuf>,
    /// Cap on one file upload into a kernel (e.g. 100m).
    #[arg(long, env = "KERNELBOX_MAX_UPLOAD", default_value = "100m", value_parser = parse_bytes)]
    max_upload: i64,
    /// Largest rich result (display) inline, as JSON (e.g. 5m); a larger one is saved to a
    /// file in the kernel's working directory and a note takes its place.
    #[arg(long, env = "KERNELBOX_DISPLAY_BYTES", default_value = "5m", value_parser = parse_bytes)]
    display_bytes: i64,
    /// Largest total of one cell's rich results (e.g. 20m); past it they are saved to files,
    /// then dropped.
    #[arg(long, env = "KERNELBOX_DISPLAY_CELL_BYTES", default_value = "20m", value_parser = parse_bytes)]
    display_cell_bytes: i64,
    /// Host directory, shared with every kernel (bind-mounted read-only), where file
    /// transfers meet their kernel's helper on a Unix socket instead of going through the
    /// engine's exec streams; it must be the same path for the engine as for this process.
    /// `none`: the exec streams. Default: $XDG_RUNTIME_DIR/kernelbox, else /run/kernelbox
    /// for root, else /tmp/kernelbox-UID.
    #[arg(long, env = "KERNELBOX_FILE_SOCKETS")]
    file_sockets: Option<PathBuf>,
    /// Let kernels reach ENTRY through kernelbox's egress proxy (repeatable): a preset
    /// (`pypi`), a host (`example.com`, `*.example.com`), any host name (`*`) or an address
    /// range (`203.0.113.0/24`), optionally with `:PORT`; the default tenant's policy on
    /// `serve` (with `--tenants`, each tenant's `network` in the file instead). Only names a
    /// host entry allows are resolved; loopback, private and other special addresses need an
    /// entry inside their range (`0.0.0.0/0` is none); the host's own addresses never pass.
    /// None: kernels have no network (docs/reliability.md, "Network egress").
    #[arg(long = "network-allow", value_name = "ENTRY")]
    network_allow: Vec<String>,
    /// Refuse ENTRY even where --network-allow allows it (repeatable).
    #[arg(long = "network-deny", value_name = "ENTRY")]
    network_deny: Vec<String>,
    /// CA bundle mounted read-only into kernels with a network policy (pip and `requests`
    /// trust it): the host's by default.
    #[arg(long, env = "KERNELBOX_CA_BUNDLE", default_value = kernelbox::config::DEFAULT_CA_BUNDLE)]
    ca_bundle: PathBuf,
    /// Egress connections (tunnels included, for their whole life) one kernel may have open
    /// at once.
    #[arg(long, default_value_t = 64)]
    egress_connections: usize,
    /// Egress bytes per second one kernel may move (e.g. 50m).
    #[arg(long, default_value = "50m", value_parser = parse_bytes)]
    egress_rate: i64,
    /// Append one JSON line per egress connection (tenant, session, host, port, bytes,
    /// `allowed` or why refused) to this file, rotated at 64 MiB (5 kept), repeated refusals
    /// counted in one line per 10 s; without it, audit lines go to the log.
    #[arg(long, env = "KERNELBOX_EGRESS_AUDIT")]
    egress_audit: Option<PathBuf>,
    /// Credentials added at the boundary: a JSON file of each tenant's secrets and rules
    /// (`{"tenants": {"default": {"secrets": {"KEY": "..." | {"env": "VAR"}}, "rules":
    /// [{"host": "api.example.com", "headers": {"Authorization": "Bearer ${secrets.KEY}"}}]}}}`);
    /// kernels never see a value (docs/reliability.md, "Credentials at the boundary").
    #[arg(long, env = "KERNELBOX_EGRESS_SECRETS")]
    egress_secrets: Option<PathBuf>,
    /// Where the kernelbox egress CA is kept (generated when missing; put an operator's
    /// egress-ca.crt and egress-ca.key there to use it). Default: the state directory's
    /// egress-ca (on `serve`, --state-dir's when given).
    #[arg(long, env = "KERNELBOX_EGRESS_CA_DIR")]
    egress_ca_dir: Option<PathBuf>,
    /// Replace the egress CA with a new one at start (kernels started after trust the new one).
    #[arg(long)]
    egress_ca_rotate: bool,
    /// Extra label KEY=VALUE on everything created (repeatable).
    #[arg(long = "label", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// OCI runtime of the kernels: runc, or runsc (gVisor: a user-space kernel between the
    /// cell and the host's; no network); on `serve`, a tenant's `runtime` in the tenants file
    /// overrides it (docs/runtimes.md).
    #[arg(long, env = "KERNELBOX_RUNTIME", default_value = "runc", value_parser = kernelbox::KernelRuntime::parse)]
    runtime: kernelbox::KernelRuntime,
}

/// The egress CA's directory inside the state directory, unless `--egress-ca-dir` is given.
const EGRESS_CA_DIR: &str = "egress-ca";

fn parse_label(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

impl KernelOpts {
    /// Egress for `tenants`' policies under these options' CA bundle and limits.
    fn egress(
        &self,
        tenants: BTreeMap<String, kernelbox::wire::NetworkPolicy>,
    ) -> anyhow::Result<kernelbox::config::EgressConfig> {
        let credentials = match &self.egress_secrets {
            Some(path) => Some(kernelbox::config::CredentialsConfig {
                secrets: kernelbox::egress::secrets::Secrets::load(path)?,
                ca_dir: match &self.egress_ca_dir {
                    Some(dir) => dir.clone(),
                    None => serve::default_state_dir()
                        .map(|d| d.join(EGRESS_CA_DIR))
                        .context(
                            "no --egress-ca-dir given and neither XDG_STATE_HOME nor HOME is set",
                        )?,
                },
                rotate_ca: self.egress_ca_rotate,
            }),
            None => None,
        };
        Ok(kernelbox::config::EgressConfig {
            tenants,
            ca_bundle: self.ca_bundle.clone(),
            limits: kernelbox::egress::proxy::Limits {
                connections_per_kernel: self.egress_connections.max(1),
                bytes_per_second: u64::try_from(self.egress_rate).unwrap_or(1).max(1),
                ..Default::default()
            },
            audit: self.egress_audit.clone(),
            credentials,
        })
    }

    /// True when `--network-allow` or `--network-deny` was given.
    fn names_a_network(&self) -> bool {
        !self.network_allow.is_empty() || !self.network_deny.is_empty()
    }

    /// The configuration these options make, not validated yet (its user adds its own).
    fn config(&self) -> anyhow::Result<Config> {
        let mut config = Config::default();
        config.spec.image = self.image.clone();
        config.cells.timeout = self.timeout;
        config.cells.max_timeout = self
            .max_timeout
            .unwrap_or_else(|| self.timeout.max(Duration::from_secs(3600)));
        config.cells.interrupt_grace = self.interrupt_grace;
        config.housekeeping.extra_labels = self.labels.iter().cloned().collect::<BTreeMap<_, _>>();
        config.housekeeping.watchdog = std::env::current_exe().ok();
        config.spec.sandbox.memory_bytes = self.memory;
        config.spec.sandbox.runtime = self.runtime;
        match &self.file_sockets {
            Some(dir) if dir.as_os_str() == "none" => config.files.sockets = None,
            Some(dir) => config.files.sockets = Some(dir.clone()),
            None => {}
        }
        config.files.max_upload_bytes = u64::try_from(self.max_upload).unwrap_or(0);
        if !self.network_allow.is_empty() {
            let policy = kernelbox::wire::NetworkPolicy {
                allow: self.network_allow.clone(),
                deny: self.network_deny.clone(),
            };
            kernelbox::egress::Policy::parse(&policy)?;
            config.egress =
                Some(self.egress(BTreeMap::from([(config.default_tenant.clone(), policy)]))?);
        }
        config.spec.sandbox.nano_cpus = (self.cpus * 1e9) as i64;
        config.spec.sandbox.pids_limit = self.pids;
        config.cells.display.bundle_bytes = usize::try_from(self.display_bytes)?;
        config.cells.display.cell_bytes = usize::try_from(self.display_cell_bytes)?;
        if let Some(dir) = &self.project {
            let dir = dir
                .canonicalize()
                .with_context(|| format!("--project {}", dir.display()))?;
            config.spec.mode = WorkMode::Project(dir);
        }
        Ok(config)
    }
}

/// A `--language` value: one the API names (`python`, `bash`, `javascript`, `typescript`).
fn parse_language(name: &str) -> Result<kernelbox::wire::Language, String> {
    kernelbox::wire::Language::parse(name).ok_or_else(|| {
        let names: Vec<&str> = kernelbox::wire::Language::ALL
            .into_iter()
            .map(kernelbox::wire::Language::name)
            .collect();
        format!("one of {}", names.join(", "))
    })
}

#[derive(Debug, Args)]
struct ExecArgs {
    /// Session (conversation) the kernel belongs to.
    #[arg(long, default_value = "default")]
    session: String,
    /// Delegated child id, when running as a sub-agent.
    #[arg(long)]
    child: Option<String>,
    /// The cell's language: python, bash, javascript or typescript (docs/contract.md,
    /// "Languages").
    #[arg(long, default_value = "python", value_parser = parse_language)]
    language: kernelbox::wire::Language,
    /// Discard the session's kernel first (with --url; a local exec always starts fresh).
    #[arg(long)]
    reset: bool,
    /// Run on a kernelbox server at this URL instead of a local kernel.
    #[arg(long, env = "KERNELBOX_URL")]
    url: Option<String>,
    /// Bearer token for --url.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    files: FileOpts,
    #[command(flatten)]
    kernel: KernelOpts,
    /// Python code to run; `-` reads it from standard input.
    code: String,
}

#[derive(Debug, Args)]
struct ReplArgs {
    /// Session (conversation) the kernel belongs to.
    #[arg(long, default_value = "default")]
    session: String,
    #[command(flatten)]
    files: FileOpts,
    #[command(flatten)]
    kernel: KernelOpts,
}

/// Files in before the first cell and out after the last, for local runs.
#[derive(Debug, Args)]
struct FileOpts {
    /// Copy LOCAL (a file, or a directory's contents) into the kernel at PATH (default:
    /// LOCAL's name) before the first cell (repeatable).
    #[arg(long = "upload", value_name = "LOCAL[:PATH]")]
    upload: Vec<String>,
    /// Copy PATH (a file, or a directory) out of the kernel to LOCAL (default: PATH's name
    /// here) after the last cell (repeatable).
    #[arg(long = "download", value_name = "PATH[:LOCAL]")]
    download: Vec<String>,
}

impl FileOpts {
    async fn upload(&self, orchestrator: &Orchestrator, session: &str) -> anyhow::Result<()> {
        for spec in &self.upload {
            transfer::upload(orchestrator, session, spec).await?;
        }
        Ok(())
    }

    async fn download(&self, orchestrator: &Orchestrator, session: &str) -> anyhow::Result<()> {
        for spec in &self.download {
            transfer::download(orchestrator, session, spec).await?;
        }
        Ok(())
    }
}

#[derive(Debug, Args)]
struct SweepArgs {
    /// Show what would be removed without removing it.
    #[arg(long)]
    dry_run: bool,
    /// Staging volumes older than this are removed.
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    staging_max_age: Duration,
    /// Hibernated kernels hibernated longer ago than this are removed, with their volumes,
    /// unless a live server uses their checkpoints' directory; at most 7d (past 7d they are
    /// removed whatever uses it).
    #[arg(long, default_value = "7d", value_parser = parse_duration)]
    hibernated_max_age: Duration,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    format: String,
}

/// A failure that maps to a documented exit code.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Exit {
    code: u8,
    message: String,
}

/// The exit code for an error that reached the binary's edge.
pub fn exit_code_for(e: &anyhow::Error) -> u8 {
    if let Some(exit) = e.downcast_ref::<Exit>() {
        return exit.code;
    }
    for cause in e.chain() {
        if let Some(err) = client_error(cause) {
            return remote::exit_code(err);
        }
        if let Some(err) = cause.downcast_ref::<kernelbox::EngineError>() {
            return match err {
                kernelbox::EngineError::Unreachable { .. } => 3,
                kernelbox::EngineError::ImageMissing { .. } => 4,
                _ => 5,
            };
        }
        if cause
            .downcast_ref::<kernelbox::config::ConfigError>()
            .is_some()
        {
            return 2;
        }
        // An audit file that cannot be opened, or a state directory in use by another server,
        // damaged, or not creatable is a configuration problem.
        if let Some(kernelbox::StartError::Audit(_)) = cause.downcast_ref::<kernelbox::StartError>()
        {
            return 2;
        }
        if let Some(kernelbox::StartError::Catalog(err)) =
            cause.downcast_ref::<kernelbox::StartError>()
        {
            return match err {
                kernelbox::catalog::CatalogError::Storage { .. } => 5,
                _ => 2,
            };
        }
    }
    5
}

/// A failed call to a server in an error's chain: itself, or inside the I/O error a download
/// read through a reader (`cp` of a directory) carries.
fn client_error<'a>(
    cause: &'a (dyn std::error::Error + 'static),
) -> Option<&'a kernelbox::client::ClientError> {
    cause.downcast_ref().or_else(|| {
        cause
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
            .and_then(|inner| inner.downcast_ref())
    })
}

async fn connect() -> anyhow::Result<Arc<dyn Engine>> {
    let engine = BollardEngine::connect().await?;
    engine.ping().await?;
    Ok(Arc::new(engine))
}

pub(crate) async fn start(opts: &KernelOpts) -> anyhow::Result<Orchestrator> {
    let config = opts.config()?.validate()?;
    let engine = connect().await?;
    if !engine.image_exists(&config.spec.image).await? {
        return Err(kernelbox::EngineError::ImageMissing {
            image: config.spec.image.clone(),
        }
        .into());
    }
    Ok(Orchestrator::start(config, engine).await?)
}

impl Cli {
    /// True for the long-running verbs that must survive a peer closing a socket.
    pub fn is_server(&self) -> bool {
        matches!(self.command, Command::Serve(_) | Command::Watchdog { .. })
    }

    /// The log format and level directives given (`--log-format`, `--log-level`).
    pub fn logging(&self) -> (kernelbox::logging::LogFormat, Option<&str>) {
        let format = self.log_format.parse().unwrap_or_default();
        (format, self.log_level.as_deref())
    }
}

/// Runs the chosen verb.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Exec(args) => exec(args).await,
        Command::Repl(args) => {
            let orchestrator = start(&args.kernel).await?;
            let result = async {
                args.files.upload(&orchestrator, &args.session).await?;
                let code = repl::run(&orchestrator, &args.session).await?;
                args.files.download(&orchestrator, &args.session).await?;
                anyhow::Ok(code)
            }
            .await;
            orchestrator.shutdown().await;
            result
        }
        Command::Image { command } => match command {
            ImageCommand::Build {
                preset,
                tag,
                base,
                dir,
                force,
            } => {
                let tag = tag.unwrap_or_else(|| preset.tag().to_string());
                let base = base.unwrap_or_else(|| preset.default_base().to_string());
                tokio::task::spawn_blocking(move || {
                    kernelbox::image::build(&dir, preset, &tag, &base, force)
                })
                .await??;
                Ok(ExitCode::SUCCESS)
            }
        },
        Command::Cp(args) => cp::run(args).await,
        Command::Sh(args) => sh::run(args).await,
        Command::Sweep(args) => sweep(args).await,
        Command::Usage(args) => usage::usage(args).await,
        Command::Workspaces(args) => workspaces::workspaces(args).await,
        Command::Audit { command } => audit::run(command),
        Command::Ps(args) if args.url.is_some() => cluster::ps(args).await,
        Command::Ps(args) => admin::ps(&BollardEngine::connect().await?, args).await,
        Command::Inspect(args) => admin::inspect(&BollardEngine::connect().await?, args).await,
        Command::Logs(args) => admin::logs(&BollardEngine::connect().await?, args).await,
        Command::Kill(args) => admin::kill(&BollardEngine::connect().await?, args).await,
        Command::Serve(args) => config::serve(*args).await,
        Command::Config { command } => config::run(command),
        Command::Nodes(args) => cluster::nodes(args).await,
        Command::Drain(args) => cluster::drain(args).await,
        Command::Mcp(args) => mcp::run(args).await,
        Command::Watchdog { instance, .. } => {
            let engine = connect().await?;
            kernelbox::instance::watchdog::run(engine.as_ref(), &instance).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

async fn exec(args: ExecArgs) -> anyhow::Result<ExitCode> {
    let code = if args.code == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading code from stdin")?;
        text
    } else {
        args.code.clone()
    };
    if let Some(url) = &args.url {
        if !args.files.upload.is_empty() || !args.files.download.is_empty() {
            return Err(Exit {
                code: 2,
                message:
                    "--upload and --download are for local runs; with --url use `kernelbox cp`"
                        .into(),
            }
            .into());
        }
        return remote::exec(remote::Remote {
            url,
            token: args.token.as_deref(),
            session: &args.session,
            child: args.child.as_deref(),
            code: &code,
            timeout_seconds: args.kernel.timeout.as_secs_f64(),
            reset: args.reset,
            language: args.language,
        })
        .await;
    }
    let orchestrator = start(&args.kernel).await?;
    let request = ExecuteRequest {
        scope: kernelbox::Scope {
            child: args.child.clone(),
            ..kernelbox::Scope::session(args.session.clone()).language(args.language)
        },
        code,
        ..ExecuteRequest::default()
    };
    // Ctrl-C interrupts the cell (and so kills the kernel) instead of orphaning it.
    let cancel = tokio_util::sync::CancellationToken::new();
    let request = ExecuteRequest {
        cancel: Some(cancel.clone()),
        ..request
    };
    let ctrl_c = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            cancel.cancel();
        }
    });
    let result = async {
        args.files.upload(&orchestrator, &args.session).await?;
        let result = orchestrator.execute(request).await?;
        // The result is printed even when a download fails.
        let downloaded = args.files.download(&orchestrator, &args.session).await;
        anyhow::Ok((result, downloaded))
    }
    .await;
    ctrl_c.abort();
    orchestrator.shutdown().await;
    let (result, downloaded) = result?;
    let mut out = std::io::stdout().lock();
    serde_json::to_writer_pretty(&mut out, &result)?;
    writeln!(out)?;
    downloaded?;
    Ok(if result.status == CellStatus::Success {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

async fn sweep(args: SweepArgs) -> anyhow::Result<ExitCode> {
    let spare = kernelbox::config::HIBERNATED_SPARED_FOR;
    if args.hibernated_max_age > spare {
        return Err(Exit {
            code: 2,
            message: format!(
                "--hibernated-max-age: at most {} (hibernated kernels are spared no longer)",
                humantime::format_duration(spare)
            ),
        }
        .into());
    }
    let engine = connect().await?;
    let me = kernelbox::instance::Instance::current();
    // Hibernated kernels first: the orphans' sweep leaves them to their own rule.
    let mut report = kernelbox::instance::sweep::sweep_hibernated(
        engine.as_ref(),
        &me,
        args.hibernated_max_age,
        args.dry_run,
    )
    .await?;
    let orphans =
        kernelbox::instance::sweep::sweep_orphans(engine.as_ref(), &me, args.dry_run).await?;
    report.containers.extend(orphans.containers);
    report.volumes.extend(orphans.volumes);
    let stale = kernelbox::instance::sweep::sweep_stale_staging(
        engine.as_ref(),
        args.staging_max_age,
        &[],
        args.dry_run,
    )
    .await?;
    report.volumes.extend(stale);
    if args.format == "json" {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        let verb = if args.dry_run {
            "would remove"
        } else {
            "removed"
        };
        println!(
            "{verb} {} container(s), {} volume(s)",
            report.containers.len(),
            report.volumes.len()
        );
        for c in &report.containers {
            println!("container  {}", kernelbox::docker::short_id(c));
        }
        for v in &report.volumes {
            println!("volume     {v}");
        }
        for h in &report.hibernated {
            println!(
                "hibernated {} {} ({} old): {} ({})",
                kernelbox::docker::short_id(&h.container),
                h.name,
                humantime::format_duration(Duration::from_secs(h.age_seconds)),
                match (h.removed, args.dry_run) {
                    (true, true) => "would remove",
                    (true, false) => "removed",
                    (false, _) => "kept",
                },
                h.why
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
