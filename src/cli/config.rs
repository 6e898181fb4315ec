//! The configuration file on the command line (docs/configuration.md): `kernelbox serve
//! --config FILE` turns the file into the values of `serve`'s flags (a flag given, or its
//! KERNELBOX_* variable, overrides the file's key), so the file and the flags resolve through
//! one path; `kernelbox config schema|check|migrate`; `serve --print-config`.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use kernelbox::config::file::{
    AuditEntry, AuditPolicyEntry, ConfigFile, HumanDuration, NetworkEntry, OrOff, Secret,
    SessionLimitsEntry, Size, TenantEntry, WorkspacesEntry,
};
use kernelbox::server::Tenants;

use super::serve::ServeArgs;
use super::tenant_source::{file_tenants, TenantsSource};
use super::Exit;

#[derive(Debug, Subcommand)]
pub(crate) enum ConfigCommand {
    /// Print the JSON Schema of the configuration file (docs/config.schema.json).
    Schema {
        /// Print the keys' reference as Markdown instead (docs/configuration.md, "Reference").
        #[arg(long)]
        markdown: bool,
    },
    /// Check a configuration file: exit 0 when `serve --config FILE` would take it, 2 with the
    /// path of the bad key and why.
    Check {
        /// The configuration file (TOML).
        file: PathBuf,
    },
    /// Write a configuration file from `serve`'s flags (and the --tenants JSON file): `kernelbox
    /// config migrate --tenants tenants.json --max-kernels 64 ... > kernelbox.toml`. Secrets
    /// given inline are written as `{ env = "..." }`, never their value.
    Migrate(Box<MigrateArgs>),
}

#[derive(Debug, clap::Args)]
pub(crate) struct MigrateArgs {
    /// Write the file here instead of standard output.
    #[arg(long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    serve: ServeArgs,
}

/// `serve`'s flags alone, to parse them again with the file's values added.
#[derive(Debug, Parser)]
#[command(name = "serve")]
struct ServeOnly {
    #[command(flatten)]
    serve: ServeArgs,
    /// The global `--log-format` and `--log-level` (`super::Cli`), which may follow `serve`:
    /// taken here and left to the global parse.
    #[arg(long, hide = true)]
    log_format: Option<String>,
    #[arg(long, hide = true)]
    log_level: Option<String>,
}

fn usage(message: String) -> anyhow::Error {
    Exit { code: 2, message }.into()
}

/// Runs a `config` verb.
pub(crate) fn run(command: ConfigCommand) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let text = match command {
        ConfigCommand::Schema { markdown: false } => {
            let mut text = serde_json::to_string_pretty(&kernelbox::config::file::schema())?;
            text.push('\n');
            text
        }
        ConfigCommand::Schema { markdown: true } => reference_markdown(),
        ConfigCommand::Check { file } => {
            check(&file)?;
            format!("{}: valid\n", file.display())
        }
        ConfigCommand::Migrate(args) => {
            let MigrateArgs { output, serve } = *args;
            if serve.config.is_some() {
                return Err(usage(
                    "config migrate writes a file from flags: give it no --config".into(),
                ));
            }
            let source = match &serve.tenants {
                Some(path) => TenantsSource::Json(path.clone()),
                None => TenantsSource::Flags,
            };
            let file = file_from_args(&serve, &source, true)?;
            let text = format!(
                "# kernelbox configuration (docs/configuration.md), written by `kernelbox config migrate`\n{}",
                file.to_toml()
            );
            if let Some(path) = output {
                std::fs::write(&path, &text)
                    .map_err(|e| usage(format!("--output {}: {e}", path.display())))?;
                return Ok(ExitCode::SUCCESS);
            }
            text
        }
    };
    let _ = std::io::stdout().write_all(text.as_bytes());
    Ok(ExitCode::SUCCESS)
}

/// Checks a file as `serve --config FILE` would read it (without the engine, the network or
/// secrets' files being needed beyond what the tenants' tokens read).
fn check(path: &Path) -> anyhow::Result<()> {
    let file = ConfigFile::load(path).map_err(|e| usage(e.to_string()))?;
    let args = overlay(&file, path, &[])?;
    let (tenants, source) = match file.tenants.is_empty() {
        false => (
            file_tenants(&file, path)?,
            TenantsSource::Config(path.to_path_buf()),
        ),
        true => (
            super::serve::flags_tenant(&args, "config-check")?,
            TenantsSource::Flags,
        ),
    };
    // The values serve itself refuses (a preload that is no module, a memory below the
    // least), named by their key.
    let config = super::serve::server_config(&args, &source, &tenants)?;
    if let Err(e) = config.validate() {
        let text = e.to_string();
        let flags = file_flags(&file, path)?;
        let key = flags
            .0
            .iter()
            .find(|f| f.id == e.field)
            .map(|f| format!("{}: ", f.key))
            .unwrap_or_default();
        return Err(usage(format!(
            "config file {}: {key}{text}",
            path.display()
        )));
    }
    tenants
        .check_reserved(args.max_kernels)
        .map_err(|e| usage(e.to_string()))?;
    Ok(())
}

/// `kernelbox serve`: the configuration file applied, then `--print-config` or the server.
pub(super) async fn serve(args: ServeArgs) -> anyhow::Result<ExitCode> {
    use std::io::Write as _;
    let (args, source) = resolve(args)?;
    if args.print_config {
        let file = file_from_args(&args, &source, false)?;
        // Ignoring failure: a closed pipe.
        let _ = std::io::stdout().write_all(file.to_toml().as_bytes());
        return Ok(ExitCode::SUCCESS);
    }
    super::serve::run(args, source, check_keys).await
}

/// Every key of `file` through its flag's parser, the flags this process was given over them,
/// as [`resolve`] did at start: what a reload checks beyond the tenants
/// (`super::tenant_source::FileCheck`).
fn check_keys(file: &ConfigFile, at: &Path) -> anyhow::Result<()> {
    overlay(file, at, &serve_argv()).map(drop)
}

/// `serve`'s arguments with the configuration file (`--config`) applied under the flags given,
/// and where the tenants come from.
fn resolve(args: ServeArgs) -> anyhow::Result<(ServeArgs, TenantsSource)> {
    let Some(path) = args.config.clone() else {
        let source = match &args.tenants {
            Some(path) => TenantsSource::Json(path.clone()),
            None => TenantsSource::Flags,
        };
        return Ok((args, source));
    };
    let file = ConfigFile::load(&path).map_err(|e| usage(e.to_string()))?;
    let args = overlay(&file, &path, &serve_argv())?;
    let source = match (&args.tenants, file.tenants.is_empty()) {
        (Some(json), false) => {
            return Err(usage(format!(
                "--tenants {} and the [[tenants]] of {}: give the tenants in one place",
                json.display(),
                path.display()
            )))
        }
        (Some(json), true) => TenantsSource::Json(json.clone()),
        (None, false) => TenantsSource::Config(path),
        (None, true) => TenantsSource::Flags,
    };
    Ok((args, source))
}

/// The arguments of this process after `serve` (the flags `serve` was given).
fn serve_argv() -> Vec<OsString> {
    std::env::args_os()
        .skip(1)
        .skip_while(|a| a != "serve")
        .skip(1)
        .collect()
}

/// One flag the file sets: the key it comes from, the flag's id, its values.
struct FileFlag {
    key: String,
    /// Flags (ids) that, given, override this key.
    ids: Vec<&'static str>,
    /// The flag to pass (its id).
    id: &'static str,
    value: FlagValue,
}

enum FlagValue {
    One(String),
    Many(Vec<String>),
    Switch,
}

#[derive(Default)]
struct Flags(Vec<FileFlag>);

impl Flags {
    fn one(&mut self, key: &str, id: &'static str, value: Option<String>) {
        if let Some(value) = value {
            self.0.push(FileFlag {
                key: key.into(),
                ids: vec![id],
                id,
                value: FlagValue::One(value),
            });
        }
    }
    fn many(&mut self, key: &str, id: &'static str, values: Vec<String>) {
        if !values.is_empty() {
            self.0.push(FileFlag {
                key: key.into(),
                ids: vec![id],
                id,
                value: FlagValue::Many(values),
            });
        }
    }
    fn switch(&mut self, key: &str, id: &'static str, on: Option<bool>) {
        if on == Some(true) {
            self.0.push(FileFlag {
                key: key.into(),
                ids: vec![id],
                id,
                value: FlagValue::Switch,
            });
        }
    }
    /// A secret: its file as the `*_file` flag, otherwise its value (read now) as the flag.
    fn secret(
        &mut self,
        key: &str,
        (id, file_id): (&'static str, &'static str),
        secret: &Option<Secret>,
    ) -> anyhow::Result<()> {
        let (id, value) = match secret {
            None => return Ok(()),
            Some(Secret::File(f)) => (file_id, f.file.display().to_string()),
            Some(secret) => (
                id,
                secret
                    .resolve()
                    .map_err(|reason| usage(format!("{key}: {reason}")))?,
            ),
        };
        self.0.push(FileFlag {
            key: key.into(),
            ids: vec![id, file_id],
            id,
            value: FlagValue::One(value),
        });
        Ok(())
    }
}

fn text<T: ToString>(v: &Option<T>) -> Option<String> {
    v.as_ref().map(ToString::to_string)
}
fn dur(v: &Option<HumanDuration>) -> Option<String> {
    v.as_ref().map(|d| d.as_str().to_string())
}
fn size(v: &Option<Size>) -> Option<String> {
    v.as_ref().map(|s| s.as_str().to_string())
}
fn path(v: &Option<PathBuf>) -> Option<String> {
    v.as_ref().map(|p| p.display().to_string())
}

/// The flags a configuration file stands for (`docs/configuration.md`, "Keys and flags").
fn file_flags(file: &ConfigFile, at: &Path) -> anyhow::Result<Flags> {
    let mut f = Flags::default();
    let s = &file.server;
    f.one("server.listen", "listen", s.listen.clone());
    f.one("server.state_dir", "state_dir", path(&s.state_dir));
    f.one("server.max_kernels", "max_kernels", text(&s.max_kernels));
    f.one("server.idle_timeout", "idle_timeout", dur(&s.idle_timeout));
    f.one(
        "server.drain_timeout",
        "drain_timeout",
        dur(&s.drain_timeout),
    );
    f.one(
        "server.metrics_listen",
        "metrics_listen",
        s.metrics_listen.clone(),
    );
    f.one("server.e2b_listen", "e2b_listen", s.e2b_listen.clone());
    f.switch("server.public_metrics", "public_metrics", s.public_metrics);
    f.switch("server.console", "console", s.console);
    f.one(
        "server.otlp_endpoint",
        "otlp_endpoint",
        s.otlp_endpoint.clone(),
    );
    f.one(
        "server.mcp_idle_timeout",
        "mcp_idle_timeout",
        dur(&s.mcp_idle_timeout),
    );
    f.one(
        "server.mcp_max_sessions",
        "mcp_max_sessions",
        text(&s.mcp_max_sessions),
    );
    f.one("server.file_sockets", "file_sockets", path(&s.file_sockets));
    // `--label KEY=VALUE` splits at the first `=`: a key holding one would silently become
    // another label.
    if let Some(key) = s
        .labels
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| k.is_empty() || k.contains('='))
    {
        return Err(usage(format!(
            "config file {}: server.labels: {key:?} is not a label's key (empty, or holding `=`)",
            at.display()
        )));
    }
    let labels = s.labels.iter().flatten().map(|(k, v)| format!("{k}={v}"));
    f.many("server.labels", "labels", labels.collect());
    let k = &file.kernels;
    f.one("kernels.image", "image", k.image.clone());
    f.one("kernels.runtime", "runtime", k.runtime.clone());
    f.one("kernels.timeout", "timeout", dur(&k.timeout));
    f.one("kernels.max_timeout", "max_timeout", dur(&k.max_timeout));
    f.one(
        "kernels.interrupt_grace",
        "interrupt_grace",
        dur(&k.interrupt_grace),
    );
    f.one("kernels.memory", "memory", size(&k.memory));
    f.one("kernels.cpus", "cpus", text(&k.cpus));
    f.one("kernels.pids", "pids", text(&k.pids));
    f.one("kernels.project", "project", path(&k.project));
    f.one("kernels.max_upload", "max_upload", size(&k.max_upload));
    f.one(
        "kernels.display_bytes",
        "display_bytes",
        size(&k.display_bytes),
    );
    let cell_bytes = size(&k.display_cell_bytes);
    f.one(
        "kernels.display_cell_bytes",
        "display_cell_bytes",
        cell_bytes,
    );
    let l = &file.limits;
    f.one(
        "limits.header_timeout",
        "header_timeout",
        dur(&l.header_timeout),
    );
    let first = dur(&l.first_header_timeout);
    f.one("limits.first_header_timeout", "first_header_timeout", first);
    f.one(
        "limits.keepalive_timeout",
        "keepalive_timeout",
        dur(&l.keepalive_timeout),
    );
    f.one("limits.body_timeout", "body_timeout", dur(&l.body_timeout));
    f.one("limits.send_timeout", "send_timeout", dur(&l.send_timeout));
    f.one(
        "limits.max_connections",
        "max_connections",
        text(&l.max_connections),
    );
    let unauth = text(&l.max_unauthenticated_connections);
    let (key, id) = (
        "limits.max_unauthenticated_connections",
        "max_unauthenticated_connections",
    );
    f.one(key, id, unauth);
    let per_address = text(&l.max_unauthenticated_per_address);
    let (key, id) = (
        "limits.max_unauthenticated_per_address",
        "max_unauthenticated_per_address",
    );
    f.one(key, id, per_address);
    f.one(
        "limits.min_download_rate",
        "min_download_rate",
        size(&l.min_download_rate),
    );
    let grace = dur(&l.download_rate_grace);
    f.one("limits.download_rate_grace", "download_rate_grace", grace);
    let per_tenant = size(&l.max_pending_results_per_tenant);
    let (key, id) = (
        "limits.max_pending_results_per_tenant",
        "max_pending_results_per_tenant",
    );
    f.one(key, id, per_tenant);
    let pending = size(&l.max_pending_results);
    f.one("limits.max_pending_results", "max_pending_results", pending);
    f.one(
        "limits.min_send_rate",
        "min_send_rate",
        size(&l.min_send_rate),
    );
    f.one(
        "limits.send_rate_grace",
        "send_rate_grace",
        dur(&l.send_rate_grace),
    );
    let p = &file.pool;
    f.one("pool.size", "pool", text(&p.size));
    f.one("pool.max_age", "pool_max_age", dur(&p.max_age));
    f.many(
        "pool.preload",
        "pool_preload",
        p.preload.clone().unwrap_or_default(),
    );
    let languages = p.languages.iter().flatten();
    let languages = languages.map(|(language, n)| format!("{language}={n}"));
    f.many("pool.languages", "pool_languages", languages.collect());
    let e = &file.egress;
    f.one("egress.ca_bundle", "ca_bundle", path(&e.ca_bundle));
    f.one(
        "egress.connections",
        "egress_connections",
        text(&e.connections),
    );
    f.one("egress.rate", "egress_rate", size(&e.rate));
    f.one("egress.audit", "egress_audit", path(&e.audit));
    f.one("egress.secrets", "egress_secrets", path(&e.secrets));
    f.one("egress.ca_dir", "egress_ca_dir", path(&e.ca_dir));
    f.switch("egress.ca_rotate", "egress_ca_rotate", e.ca_rotate);
    let c = &file.cluster;
    f.secret("cluster.url", ("cluster", "cluster_file"), &c.url)?;
    f.one("cluster.node_name", "node_name", c.node_name.clone());
    f.one("cluster.advertise", "advertise", c.advertise.clone());
    f.one("cluster.lease_ttl", "lease_ttl", dur(&c.lease_ttl));
    f.one("cluster.fence_margin", "fence_margin", dur(&c.fence_margin));
    let admin = ("admin_token", "admin_token_file");
    f.secret("cluster.admin_token", admin, &c.admin_token)?;
    f.one(
        "cluster.drain_deadline",
        "drain_deadline",
        dur(&c.drain_deadline),
    );
    let a = &file.audit;
    f.one("audit.file", "audit_file", path(&a.file));
    f.one("audit.rotate", "audit_rotate", size(&a.rotate));
    f.one("audit.keep", "audit_keep", text(&a.keep));
    let h = &file.hibernation;
    f.one("hibernation.max", "hibernate_max", text(&h.max));
    f.one("hibernation.max_age", "hibernate_max_age", dur(&h.max_age));
    let sn = &file.snapshots;
    f.one("snapshots.max", "snapshot_max", text(&sn.max));
    f.one(
        "snapshots.tenant_bytes",
        "snapshot_tenant_bytes",
        size(&sn.tenant_bytes),
    );
    f.one("snapshots.ttl", "snapshot_ttl", dur(&sn.ttl));
    let w = &file.workspaces;
    f.one("workspaces.dir", "workspace_dir", path(&w.dir));
    f.one("workspaces.total", "workspace_total", size(&w.total));
    if file.tenants.is_empty() {
        default_tenant_flags(&mut f, &file.tenant_defaults, at)?;
    }
    Ok(f)
}

/// Without `[[tenants]]`, `[tenant_defaults]` is the one tenant `default`'s: the flags that set
/// it (`--session-max-*`, `--network-allow`, `--audit`, `--workspaces`, `--hibernate`).
fn default_tenant_flags(f: &mut Flags, d: &TenantEntry, at: &Path) -> anyhow::Result<()> {
    let only_with_tenants = [
        ("max_kernels", d.max_kernels.is_some()),
        ("reserved", d.reserved.is_some()),
        ("tools", d.tools.is_some()),
        ("image", d.image.is_some()),
        ("runtime", d.runtime.is_some()),
        ("usage_admin", d.usage_admin.is_some()),
    ];
    if let Some((key, _)) = only_with_tenants.iter().find(|(_, set)| *set) {
        return Err(usage(format!(
            "config file {}: tenant_defaults.{key}: applies to [[tenants]]; without any, the one tenant `default` takes the server's own (e.g. kernels.image, server.max_kernels)",
            at.display()
        )));
    }
    if let Some(limits) = &d.session_limits {
        let key = "tenant_defaults.session_limits";
        f.one(
            &format!("{key}.memory"),
            "session_max_memory",
            size(&limits.memory),
        );
        f.one(
            &format!("{key}.cpus"),
            "session_max_cpus",
            text(&limits.cpus),
        );
        let idle = dur(&limits.idle_timeout);
        f.one(
            &format!("{key}.idle_timeout"),
            "session_max_idle_timeout",
            idle,
        );
    }
    if let Some(network) = &d.network {
        f.many(
            "tenant_defaults.network.allow",
            "network_allow",
            network.allow.clone(),
        );
        f.many(
            "tenant_defaults.network.deny",
            "network_deny",
            network.deny.clone(),
        );
    }
    match &d.audit {
        None | Some(AuditEntry::On(false)) => {}
        Some(AuditEntry::On(true)) => f.switch("tenant_defaults.audit", "audit", Some(true)),
        Some(AuditEntry::Policy(policy)) => {
            f.switch("tenant_defaults.audit", "audit", Some(true));
            f.switch("tenant_defaults.audit.code", "audit_code", policy.code);
        }
    }
    if let Some(w) = d.workspaces.as_ref().and_then(OrOff::on) {
        let key = "tenant_defaults.workspaces";
        f.switch(key, "workspaces", Some(true));
        f.one(&format!("{key}.quota"), "workspace_quota", size(&w.quota));
        f.one(&format!("{key}.ttl"), "workspace_ttl", dur(&w.ttl));
        f.one(&format!("{key}.max"), "workspace_max", text(&w.max));
    }
    f.switch("tenant_defaults.hibernate", "hibernate", d.hibernate);
    Ok(())
}

/// `serve`'s arguments: `argv` (the flags given) over the file's keys. A flag given on the
/// command line or by its KERNELBOX_* variable overrides the key.
fn overlay(file: &ConfigFile, at: &Path, argv: &[OsString]) -> anyhow::Result<ServeArgs> {
    let command = ServeOnly::command();
    let matches = command
        .clone()
        .try_get_matches_from(std::iter::once(OsString::from("serve")).chain(argv.iter().cloned()))
        .map_err(|e| usage(first_line(&e.to_string())))?;
    let given: BTreeSet<String> = command
        .get_arguments()
        .map(|a| a.get_id().as_str().to_string())
        .filter(|id| {
            matches!(
                matches.value_source(id),
                Some(
                    clap::parser::ValueSource::CommandLine | clap::parser::ValueSource::EnvVariable
                )
            )
        })
        .collect();
    let flags = file_flags(file, at)?;
    let long = |id: &str| -> String {
        command
            .get_arguments()
            .find(|a| a.get_id() == id)
            .and_then(|a| a.get_long())
            .unwrap_or(id)
            .to_string()
    };
    let mut extra: Vec<OsString> = Vec::new();
    for flag in &flags.0 {
        if flag.ids.iter().any(|id| given.contains(*id)) {
            continue;
        }
        let name = long(flag.id);
        match &flag.value {
            FlagValue::One(v) => extra.push(format!("--{name}={v}").into()),
            FlagValue::Many(vs) => extra.extend(vs.iter().map(|v| format!("--{name}={v}").into())),
            FlagValue::Switch => extra.push(format!("--{name}").into()),
        }
    }
    let all = std::iter::once(OsString::from("serve"))
        .chain(argv.iter().cloned())
        .chain(extra);
    match ServeOnly::try_parse_from(all) {
        Ok(parsed) => Ok(parsed.serve),
        Err(e) => {
            let text = first_line(&e.to_string());
            // The key whose flag clap refused, e.g. "invalid value 'x' for '--idle-timeout <..>'".
            let key = flags.0.iter().find(|flag| {
                let name = format!("--{}", long(flag.id));
                text.match_indices(&name).any(|(i, _)| {
                    matches!(
                        text[i + name.len()..].chars().next(),
                        Some(' ' | '\'' | '=' | '<') | None
                    )
                })
            });
            Err(usage(match key {
                Some(flag) => format!("config file {}: {}: {text}", at.display(), flag.key),
                None => format!("config file {}: {text}", at.display()),
            }))
        }
    }
}

fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    line.strip_prefix("error: ").unwrap_or(line).to_string()
}

/// A size as the flags write it (`512m`), exact.
fn size_of(bytes: u64) -> Size {
    const K: u64 = 1024;
    let text = match bytes {
        0 => "0".to_string(),
        b if b % (K * K * K) == 0 => format!("{}g", b / (K * K * K)),
        b if b % (K * K) == 0 => format!("{}m", b / (K * K)),
        b if b % K == 0 => format!("{}k", b / K),
        b => b.to_string(),
    };
    Size::parse(&text).unwrap_or_else(|_| Size::parse("0").expect("0 is a size"))
}

fn span(d: std::time::Duration) -> Option<HumanDuration> {
    Some(HumanDuration::from_duration(d))
}

/// The configuration file `args` stand for: every value resolved, tenants from `source`.
/// `migrating`: a secret given inline is written as its KERNELBOX_* variable instead (a file
/// never holds a secret it was not given).
fn file_from_args(
    args: &ServeArgs,
    source: &TenantsSource,
    migrating: bool,
) -> anyhow::Result<ConfigFile> {
    let mut file = ConfigFile::default();
    let k = &args.kernel;
    let s = &mut file.server;
    s.listen = Some(args.listen.clone());
    let clustered = args.cluster.is_some() || args.cluster_file.is_some();
    s.state_dir = match &args.state_dir {
        Some(dir) => Some(dir.clone()),
        None if clustered => None,
        None => super::serve::default_state_dir(),
    };
    s.max_kernels = Some(args.max_kernels as u64);
    s.idle_timeout = span(args.idle_timeout);
    s.drain_timeout = span(args.drain_timeout);
    s.metrics_listen = args.metrics_listen.clone();
    s.e2b_listen = args.e2b_listen.clone();
    s.public_metrics = Some(args.public_metrics);
    s.console = Some(args.console);
    s.otlp_endpoint = args.otlp_endpoint.clone();
    s.mcp_idle_timeout = span(args.mcp_idle_timeout);
    s.mcp_max_sessions = Some(u64::from(args.mcp_max_sessions));
    s.file_sockets = k.file_sockets.clone();
    if !k.labels.is_empty() {
        s.labels = Some(k.labels.iter().cloned().collect::<BTreeMap<_, _>>());
    }
    let kernels = &mut file.kernels;
    kernels.image = Some(k.image.clone());
    kernels.runtime = Some(k.runtime.to_string());
    kernels.timeout = span(k.timeout);
    kernels.max_timeout = span(
        k.max_timeout
            .unwrap_or_else(|| k.timeout.max(std::time::Duration::from_secs(3600))),
    );
    kernels.interrupt_grace = span(k.interrupt_grace);
    kernels.memory = Some(size_of(k.memory.max(0) as u64));
    kernels.cpus = Some(k.cpus);
    kernels.pids = Some(k.pids);
    kernels.project = k.project.clone();
    kernels.max_upload = Some(size_of(k.max_upload.max(0) as u64));
    kernels.display_bytes = Some(size_of(k.display_bytes.max(0) as u64));
    kernels.display_cell_bytes = Some(size_of(k.display_cell_bytes.max(0) as u64));
    let l = &mut file.limits;
    l.header_timeout = span(args.header_timeout);
    l.first_header_timeout = span(args.first_header_timeout);
    l.keepalive_timeout = span(args.keepalive_timeout);
    l.body_timeout = span(args.body_timeout);
    l.send_timeout = span(args.send_timeout);
    l.max_connections = Some(u64::from(args.max_connections));
    l.max_unauthenticated_connections = args.max_unauthenticated_connections.map(u64::from);
    l.max_unauthenticated_per_address = Some(u64::from(args.max_unauthenticated_per_address));
    l.min_download_rate = Some(size_of(args.min_download_rate));
    l.download_rate_grace = span(args.download_rate_grace);
    let responses = kernelbox::server::ResponseLimits::default();
    let per_tenant = args.max_pending_results_per_tenant;
    l.max_pending_results_per_tenant = Some(size_of(per_tenant.unwrap_or(responses.tenant_bytes)));
    l.max_pending_results = Some(size_of(
        args.max_pending_results.unwrap_or(responses.host_bytes),
    ));
    l.min_send_rate = Some(size_of(args.min_send_rate.unwrap_or(responses.min_rate)));
    l.send_rate_grace = span(args.send_rate_grace.unwrap_or(responses.rate_grace));
    let p = &mut file.pool;
    p.size = Some(super::serve::pool_size(args) as u64);
    p.max_age = span(args.pool_max_age);
    p.preload = (!args.pool_preload.is_empty()).then(|| args.pool_preload.clone());
    p.languages = (!args.pool_languages.is_empty()).then(|| {
        let languages = args.pool_languages.iter();
        languages
            .map(|(l, n)| (l.name().to_string(), *n as u64))
            .collect()
    });
    let e = &mut file.egress;
    e.ca_bundle = Some(k.ca_bundle.clone());
    e.connections = Some(k.egress_connections as u64);
    e.rate = Some(size_of(k.egress_rate.max(0) as u64));
    e.audit = k.egress_audit.clone();
    e.secrets = k.egress_secrets.clone();
    e.ca_dir = k.egress_ca_dir.clone();
    e.ca_rotate = Some(k.egress_ca_rotate);
    let secret = |inline: &Option<String>, file: &Option<PathBuf>, var: &str| match (inline, file) {
        (Some(_), _) if migrating => Some(Secret::env(var)),
        (Some(v), _) => Some(Secret::Inline(v.clone()).redacted()),
        (None, Some(path)) => Some(Secret::file(path.clone())),
        (None, None) => None,
    };
    let c = &mut file.cluster;
    c.url = secret(&args.cluster, &args.cluster_file, "KERNELBOX_CLUSTER");
    c.admin_token = secret(
        &args.admin_token,
        &args.admin_token_file,
        "KERNELBOX_ADMIN_TOKEN",
    );
    c.node_name = args.node_name.clone();
    c.advertise = args.advertise.clone();
    if clustered {
        c.lease_ttl = span(args.lease_ttl);
        c.fence_margin = span(args.fence_margin);
    }
    c.drain_deadline = args.drain_deadline.and_then(span);
    let a = &mut file.audit;
    a.file = args.audit_file.clone();
    a.rotate = Some(size_of(args.audit_rotate));
    a.keep = Some(args.audit_keep as u64);
    let h = &mut file.hibernation;
    h.max = Some(args.hibernate_max as u64);
    h.max_age = span(args.hibernate_max_age);
    let sn = &mut file.snapshots;
    sn.max = Some(args.snapshot_max as u64);
    sn.tenant_bytes = Some(size_of(args.snapshot_tenant_bytes));
    sn.ttl = span(args.snapshot_ttl);
    let w = &mut file.workspaces;
    w.dir = args.workspace_dir.clone();
    w.total = args.workspace_total.map(|t| size_of(t.max(0) as u64));
    match source {
        TenantsSource::Flags => {
            let d = &mut file.tenant_defaults;
            let limits = SessionLimitsEntry {
                memory: args.session_max_memory.map(|m| size_of(m.max(0) as u64)),
                cpus: args.session_max_cpus,
                idle_timeout: args.session_max_idle_timeout.and_then(span),
            };
            d.session_limits = (limits != SessionLimitsEntry::default()).then_some(limits);
            d.network =
                (!k.network_allow.is_empty() || !k.network_deny.is_empty()).then(|| NetworkEntry {
                    allow: k.network_allow.clone(),
                    deny: k.network_deny.clone(),
                });
            d.audit = args.audit.then_some(match args.audit_code {
                true => AuditEntry::Policy(AuditPolicyEntry { code: Some(true) }),
                false => AuditEntry::On(true),
            });
            d.workspaces = args.workspaces.then(|| {
                OrOff::On(WorkspacesEntry {
                    quota: Some(size_of(args.workspace_quota.max(0) as u64)),
                    ttl: span(args.workspace_ttl),
                    max: Some(args.workspace_max as u64),
                })
            });
            d.hibernate = args.hibernate.then_some(true);
        }
        TenantsSource::Json(path) => {
            // Checked as the server checks it, then taken key for key.
            Tenants::load(path).map_err(|e| usage(e.to_string()))?;
            #[derive(serde::Deserialize)]
            struct Json {
                tenants: Vec<TenantEntry>,
            }
            let text = std::fs::read_to_string(path)?;
            let json: Json = serde_json::from_str(&text)
                .map_err(|e| usage(format!("tenants file {}: {e}", path.display())))?;
            file.tenants = json.tenants;
        }
        TenantsSource::Config(path) => {
            let config = ConfigFile::load(path).map_err(|e| usage(e.to_string()))?;
            file_tenants(&config, path)?;
            file.tenants = config
                .tenants
                .iter()
                .map(|t| t.with_defaults(&config.tenant_defaults))
                .collect();
        }
    }
    if args.hibernate && source.is_file() {
        for tenant in &mut file.tenants {
            tenant.hibernate = Some(true);
        }
    }
    Ok(file)
}

/// The keys' reference of docs/configuration.md, generated from the schema: one table per
/// section, each key with its type and description.
pub(crate) fn reference_markdown() -> String {
    let schema = kernelbox::config::file::schema();
    let mut out = String::new();
    let empty = serde_json::Map::new();
    let props = schema["properties"].as_object().unwrap_or(&empty);
    for (section, sub) in props {
        let (title, sub) = match sub["type"].as_str() {
            Some("array") => (format!("[[{section}]]"), &sub["items"]),
            _ => (format!("[{section}]"), sub),
        };
        out.push_str(&format!(
            "### `{title}`\n\n{}\n\n",
            one_line(&props[section])
        ));
        out.push_str("| key | type | description |\n|---|---|---|\n");
        if let Some(keys) = object_props(sub) {
            for (key, value) in keys {
                out.push_str(&format!(
                    "| `{key}` | {} | {} |\n",
                    type_of(value),
                    one_line(value)
                ));
                if let Some(inner) = object_props(value) {
                    for (k2, v2) in inner {
                        out.push_str(&format!(
                            "| `{key}.{k2}` | {} | {} |\n",
                            type_of(v2),
                            one_line(v2)
                        ));
                    }
                }
            }
        }
        out.push('\n');
    }
    out
}

/// The properties of an object schema, or of the object among an `anyOf` (an optional table).
fn object_props(schema: &serde_json::Value) -> Option<&serde_json::Map<String, serde_json::Value>> {
    if let Some(props) = schema["properties"].as_object() {
        return Some(props);
    }
    // Nested: an optional table a tenant may also turn off (`OrOff`), or `audit`'s; a secret's
    // `{ file }` / `{ env }` are its forms, not keys.
    let secret = schema["description"]
        .as_str()
        .is_some_and(|d| d.starts_with("A secret"));
    if secret {
        return None;
    }
    schema["anyOf"].as_array()?.iter().find_map(object_props)
}

fn one_line(schema: &serde_json::Value) -> String {
    schema["description"]
        .as_str()
        .unwrap_or("")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// A short type: `string`, `integer`, `size`, `duration`, `secret`, `table`...
fn type_of(schema: &serde_json::Value) -> String {
    let mut kinds: Vec<&'static str> = Vec::new();
    kinds_of(schema, true, &mut kinds);
    kinds.join(" \\| ")
}

fn kinds_of(schema: &serde_json::Value, top: bool, kinds: &mut Vec<&'static str>) {
    let mut add = |k: &'static str| {
        if !kinds.contains(&k) {
            kinds.push(k);
        }
    };
    // The value types of `values.rs` by their own description (a field's is its own).
    let named = schema["description"].as_str().and_then(|d| {
        [
            ("A size:", "size"),
            ("A duration:", "duration"),
            ("A secret", "secret"),
        ]
        .into_iter()
        .find_map(|(prefix, name)| d.starts_with(prefix).then_some(name))
    });
    if let (false, Some(name)) = (top, named) {
        add(name);
        return;
    }
    let types: Vec<&str> = match &schema["type"] {
        serde_json::Value::String(t) => vec![t.as_str()],
        serde_json::Value::Array(ts) => ts.iter().filter_map(|t| t.as_str()).collect(),
        _ => Vec::new(),
    };
    if schema["const"].is_boolean() {
        add("boolean");
    }
    for t in types {
        match t {
            "string" => add("string"),
            "integer" => add("integer"),
            "number" => add("number"),
            "boolean" => add("boolean"),
            "array" => add("array"),
            "object" => add("table"),
            _ => {}
        }
    }
    for key in ["anyOf", "oneOf"] {
        for sub in schema[key].as_array().into_iter().flatten() {
            kinds_of(sub, false, kinds);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// True when `doc` names `--flag` itself (not a longer flag it begins).
    fn names_flag(doc: &str, long: &str) -> bool {
        let flag = format!("--{long}");
        doc.match_indices(&flag).any(|(i, _)| {
            !doc[i + flag.len()..]
                .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        })
    }

    fn read(path: &str) -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path))
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    #[test]
    fn the_shipped_schema_is_the_generated_one() {
        let generated = serde_json::to_string_pretty(&kernelbox::config::file::schema())
            .expect("schema")
            + "\n";
        assert!(
            read("docs/config.schema.json") == generated,
            "docs/config.schema.json is stale: run `kernelbox config schema > docs/config.schema.json`"
        );
    }

    #[test]
    fn the_configuration_reference_is_generated_from_the_schema() {
        let doc = read("docs/configuration.md");
        let begin = "<!-- reference: generated by `kernelbox config schema --markdown` -->\n";
        let end = "<!-- end of reference -->";
        let start = doc.find(begin).expect("the reference's start marker") + begin.len();
        let stop = doc[start..].find(end).expect("its end marker") + start;
        assert!(
            doc[start..stop].trim() == reference_markdown().trim(),
            "docs/configuration.md's reference is stale: paste `kernelbox config schema --markdown` between its markers"
        );
    }

    #[test]
    fn every_flag_of_every_verb_is_in_the_cli_docs() {
        let doc = read("docs/cli.md");
        let mut missing = Vec::new();
        let cli = super::super::Cli::command();
        for verb in cli.get_subcommands().filter(|v| !v.is_hide_set()) {
            if !doc.contains(&format!("kernelbox {}", verb.get_name())) {
                missing.push(format!("verb {}", verb.get_name()));
            }
            let mut commands = vec![verb];
            commands.extend(verb.get_subcommands());
            for command in commands {
                for arg in command.get_arguments() {
                    if let Some(long) = arg.get_long() {
                        if !arg.is_hide_set() && !names_flag(&doc, long) {
                            missing.push(format!("{} --{long}", command.get_name()));
                        }
                    }
                }
            }
        }
        assert!(missing.is_empty(), "docs/cli.md misses: {missing:?}");
    }

    #[test]
    fn every_serve_flag_is_in_the_configuration_docs_with_its_key() {
        let doc = read("docs/configuration.md");
        let missing: Vec<String> = ServeOnly::command()
            .get_arguments()
            .filter(|a| !a.is_hide_set())
            .filter_map(|a| a.get_long())
            .filter(|long| !names_flag(&doc, long))
            .map(str::to_string)
            .collect();
        assert!(
            missing.is_empty(),
            "docs/configuration.md misses the flags {missing:?}"
        );
    }
}
