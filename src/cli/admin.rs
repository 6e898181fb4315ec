//! Admin verbs that work from Docker labels alone, with or without a running server:
//! `ps`, `inspect`, `logs`, `kill`.

use std::collections::BTreeMap;
use std::process::ExitCode;

use anyhow::Context;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, EventsOptionsBuilder, StatsOptionsBuilder,
};
use clap::Args;
use futures::StreamExt;
use serde::Serialize;

use kernelbox::docker::{ContainerInfo, Engine};
use kernelbox::{labels, BollardEngine};

/// Output format of admin verbs.
#[derive(Debug, Clone, Copy, clap::ValueEnum, PartialEq, Eq)]
pub enum Format {
    /// Aligned columns for people.
    Table,
    /// JSON for scripts.
    Json,
}

#[derive(Debug, Args)]
pub struct PsArgs {
    /// Only this tenant's kernels.
    #[arg(long)]
    pub(crate) tenant: Option<String>,
    /// List a cluster's kernels, every node's, through this node's API (or the balancer in
    /// front: any node answers) instead of this engine's containers (docs/cluster.md, "Admin").
    #[arg(long, requires = "admin_token")]
    pub(crate) url: Option<String>,
    /// The cluster's admin token (with --url).
    #[arg(long, env = "KERNELBOX_ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// Skip the per-kernel memory reading (one stats call per kernel).
    #[arg(long)]
    no_memory: bool,
    /// Only kernels of sessions carrying this label (`key=value`, from the session's settings;
    /// repeat to require several).
    #[arg(long, value_name = "KEY=VALUE")]
    pub(crate) session_label: Vec<String>,
    /// The old spelling of --session-label (deprecated: `serve --label` sets container labels).
    #[arg(long, value_name = "KEY=VALUE", hide = true)]
    pub(crate) label: Vec<String>,
    /// Only kernels of this server: its instance id (the `instance ...` of its `serving` line;
    /// a prefix of at least 4 characters) or its process id.
    #[arg(long, value_name = "INSTANCE|PID")]
    server: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Container id (or unique prefix).
    container: String,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Json)]
    format: Format,
}

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Container id (or unique prefix).
    container: String,
    /// The server's log (what `kernelbox serve` wrote to its standard error, text or JSON;
    /// `-` for standard input): its lifecycle events for this kernel (started, restored,
    /// hibernated, ended, lost, and why) are shown after the engine's.
    #[arg(long, value_name = "FILE")]
    server_log: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("target").required(true).args(["container", "owner", "tenant", "all"])))]
pub struct KillArgs {
    /// Kill one kernel by container id (or unique prefix).
    #[arg(long)]
    container: Option<String>,
    /// Kill every kernel of this owner (`session` or `session::child::id`).
    #[arg(long)]
    owner: Option<String>,
    /// Kill every kernel of this tenant.
    #[arg(long)]
    tenant: Option<String>,
    /// Kill every kernelbox kernel on this engine.
    #[arg(long)]
    all: bool,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    format: Format,
}

/// One kernel, as the admin verbs show it.
#[derive(Debug, Serialize)]
struct Row {
    container: String,
    tenant: String,
    owner: String,
    /// `pooled` for a warm-pool kernel no owner has taken yet, else the engine's state.
    state: String,
    /// Made for the warm pool (taken or not).
    from_pool: bool,
    generation: String,
    /// The instance id of the server that runs it (first 12 characters).
    server: String,
    /// That server's process id.
    server_pid: String,
    age_seconds: u64,
    idle_seconds: Option<u64>,
    busy: Option<bool>,
    cells: Option<u64>,
    memory_bytes: Option<u64>,
    instance: String,
    volume: String,
}

/// What the runner's status file says: (cells run, Unix time of the last change, busy).
type Status = Option<(u64, u64, bool)>;

/// A kernel's `(tenant, owner)`: from its labels, or for a kernel taken from the warm pool
/// from the container name the server gave it at the take (`labels::owner_name`); empty
/// for a pooled kernel nobody has taken.
fn identity(c: &ContainerInfo) -> (String, String) {
    match (c.labels.get(labels::TENANT), c.labels.get(labels::OWNER)) {
        (Some(tenant), Some(owner)) => (tenant.clone(), owner.clone()),
        _ => labels::parse_owner_name(&c.name).unwrap_or_default(),
    }
}

/// The `(instance id, pid)` of the server that runs a kernel: the instance that restored it
/// (`labels::run_by_name`), else the one whose labels it carries.
fn server_of(c: &ContainerInfo) -> (String, String) {
    match labels::name_claim(&c.name) {
        labels::NameClaim::RunBy { instance, pid, .. } => (instance, pid.to_string()),
        _ => (
            c.labels.get(labels::INSTANCE).cloned().unwrap_or_default(),
            c.labels.get(labels::PID).cloned().unwrap_or_default(),
        ),
    }
}

/// Whether `server` (`ps --server`: an instance id prefix of at least 4 characters, or a
/// process id) names the server that runs `c`.
fn run_by(c: &ContainerInfo, server: &str) -> bool {
    let (instance, pid) = server_of(c);
    pid == server || (server.len() >= 4 && instance.starts_with(server))
}

/// A kernel's row; `computing`: its CPU time says it computes (busy, whatever its status says).
fn row(c: &ContainerInfo, memory: Option<u64>, status: Status, computing: bool) -> Row {
    let get = |k: &str| c.labels.get(k).cloned().unwrap_or_default();
    let created = labels::int(&c.labels, labels::CREATED_AT).unwrap_or(c.created);
    let (tenant, owner) = identity(c);
    let from_pool = c.labels.contains_key(labels::POOL);
    Row {
        container: c.id.chars().take(12).collect(),
        state: if from_pool && owner.is_empty() && c.state == "running" {
            "pooled".into()
        } else {
            c.state.clone()
        },
        tenant,
        owner,
        from_pool,
        // A pooled kernel's labels were fixed before it had an owner: its name at the take
        // carries the generation (`labels::taken_name`).
        generation: c
            .labels
            .get(labels::GENERATION)
            .cloned()
            .or_else(|| labels::name_generation(&c.name).map(|g| g.to_string()))
            .unwrap_or_default(),
        server: server_of(c).0.chars().take(12).collect(),
        server_pid: server_of(c).1,
        age_seconds: kernelbox::clock::unix_now().saturating_sub(created.max(0) as u64),
        // Busy kernels are not idle at all; a kernel without a status has run no cell yet.
        idle_seconds: match status {
            _ if computing => None,
            Some((_, _, true)) => None,
            Some((_, last, false)) => Some(kernelbox::clock::unix_now().saturating_sub(last)),
            None => None,
        },
        busy: match status {
            _ if computing => Some(true),
            Some((_, _, busy)) => Some(busy),
            None => None,
        },
        cells: status.map(|(cells, _, _)| cells),
        memory_bytes: memory,
        instance: get(labels::INSTANCE).chars().take(12).collect(),
        volume: get(labels::VOLUME),
    }
}

/// Kernel containers, optionally only those of a tenant and/or an owner (matched on
/// [`identity`], so kernels taken from the warm pool are found too).
async fn kernels(
    engine: &BollardEngine,
    tenant: Option<&str>,
    owner: Option<&str>,
) -> anyhow::Result<Vec<ContainerInfo>> {
    let filters = vec![labels::managed(), labels::filter(labels::ROLE, "kernel")];
    let mut list = engine.list_containers(&filters).await?;
    list.retain(|c| {
        let (t, o) = identity(c);
        tenant.is_none_or(|want| want == t) && owner.is_none_or(|want| want == o)
    });
    Ok(list)
}

async fn find(engine: &BollardEngine, prefix: &str) -> anyhow::Result<ContainerInfo> {
    let matches: Vec<ContainerInfo> = kernels(engine, None, None)
        .await?
        .into_iter()
        .filter(|c| c.id.starts_with(prefix))
        .collect();
    match matches.len() {
        1 => Ok(matches.into_iter().next().context("one match")?),
        0 => Err(anyhow::anyhow!("no kernelbox kernel with id {prefix}")),
        n => Err(anyhow::anyhow!(
            "{n} kernels match {prefix}; give more of the id"
        )),
    }
}

async fn memory_of(engine: &BollardEngine, id: &str) -> Option<u64> {
    let options = StatsOptionsBuilder::default()
        .stream(false)
        .one_shot(true)
        .build();
    let stats = engine
        .client()
        .stats(id, Some(options))
        .next()
        .await?
        .ok()?;
    stats.memory_stats?.usage
}

/// Reads the runner's status file out of a running kernel (through the archive API).
async fn status_of(engine: &BollardEngine, c: &ContainerInfo) -> Status {
    let path = c.labels.get(labels::STATUS)?;
    let options = DownloadFromContainerOptionsBuilder::default()
        .path(path)
        .build();
    let mut stream = engine
        .client()
        .download_from_container(&c.id, Some(options));
    let mut archive = Vec::new();
    while let Some(chunk) = stream.next().await {
        archive.extend_from_slice(&chunk.ok()?);
        if archive.len() > 64 * 1024 {
            return None;
        }
    }
    let mut tar = tar::Archive::new(archive.as_slice());
    let mut entry = tar.entries().ok()?.next()?.ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut entry, &mut text).ok()?;
    let mut fields = text.split_whitespace().map(|f| f.parse::<u64>().ok());
    Some((fields.next()??, fields.next()??, fields.next()?? == 1))
}

fn human_bytes(b: Option<u64>) -> String {
    match b {
        None => "-".into(),
        Some(b) if b >= 1 << 30 => format!("{:.1}GiB", b as f64 / (1u64 << 30) as f64),
        Some(b) => format!("{:.1}MiB", b as f64 / (1u64 << 20) as f64),
    }
}

fn human_age(s: u64) -> String {
    match s {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m", s / 60),
        s => format!("{}h", s / 3600),
    }
}

fn print_rows(rows: &[Row], format: Format) -> anyhow::Result<()> {
    if format == Format::Json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    println!(
        "{:<12}  {:<12}  {:<12}  {:<28}  {:<8}  {:>3}  {:>6}  {:>6}  {:>5}  {:>9}",
        "CONTAINER", "SERVER", "TENANT", "OWNER", "STATE", "GEN", "AGE", "IDLE", "CELLS", "MEMORY"
    );
    for r in rows {
        println!(
            "{:<12}  {:<12}  {:<12}  {:<28}  {:<8}  {:>3}  {:>6}  {:>6}  {:>5}  {:>9}",
            r.container,
            r.server,
            r.tenant,
            r.owner,
            r.state,
            r.generation,
            human_age(r.age_seconds),
            match (r.busy, r.idle_seconds) {
                (Some(true), _) => "busy".to_string(),
                (_, Some(idle)) => human_age(idle),
                _ => "-".into(),
            },
            r.cells.map(|c| c.to_string()).unwrap_or_else(|| "-".into()),
            human_bytes(r.memory_bytes)
        );
    }
    Ok(())
}

/// How long `ps` and `inspect` watch kernels' CPU time for computation with no cell running.
const CPU_WINDOW: std::time::Duration = std::time::Duration::from_millis(500);

/// The share of a core above which `ps` and `inspect` show a kernel computing, in percent.
/// Below the runaway watch's (`config::RunawayWatch::cpu_percent`): this only shows, and a
/// computing kernel on a loaded host gets less than a third of a core; an idle runner uses
/// next to nothing.
const CPU_BUSY_PERCENT: u32 = 10;

/// The kernels of `ids` that compute (above [`CPU_BUSY_PERCENT`] of a core over
/// [`CPU_WINDOW`], `docs/reliability.md` "Runaway kernels"): shown busy whatever their
/// runner's status file says, since a cell can forge it. Kernels whose cgroup this process
/// cannot read are left out.
async fn computing(ids: Vec<String>) -> std::collections::HashSet<String> {
    use kernelbox::docker::cpu::CpuFile;
    let read = |files: Vec<(String, CpuFile)>| {
        tokio::task::spawn_blocking(move || {
            files
                .into_iter()
                .filter_map(|(id, f)| Some((id, f.read_ns().ok()?)))
                .collect::<BTreeMap<String, u64>>()
        })
    };
    let files: Vec<(String, CpuFile)> = tokio::task::spawn_blocking(move || {
        ids.into_iter()
            .filter_map(|id| Some((id.clone(), CpuFile::find(&id).ok()?)))
            .collect()
    })
    .await
    .unwrap_or_default();
    let before = read(files.clone()).await.unwrap_or_default();
    let started = std::time::Instant::now();
    tokio::time::sleep(CPU_WINDOW).await;
    let after = read(files).await.unwrap_or_default();
    let share = f64::from(CPU_BUSY_PERCENT) / 100.0;
    let threshold = started.elapsed().as_nanos() as f64 * share;
    after
        .into_iter()
        .filter(|(id, ns)| {
            before
                .get(id)
                .is_some_and(|b| ns.saturating_sub(*b) as f64 > threshold)
        })
        .map(|(id, _)| id)
        .collect()
}

/// `kernelbox ps`
pub async fn ps(engine: &BollardEngine, args: PsArgs) -> anyhow::Result<ExitCode> {
    let mut rows = Vec::new();
    let wanted = kernelbox::settings::label_filters(session_labels(&args).map(String::as_str))
        .map_err(|e| anyhow::anyhow!("--session-label: {e}"))?;
    let mut listed = kernels(engine, args.tenant.as_deref(), None).await?;
    listed.retain(|c| {
        wanted
            .iter()
            .all(|(k, v)| c.labels.get(&format!("{}{k}", labels::META_PREFIX)) == Some(v))
            && args.server.as_deref().is_none_or(|s| run_by(c, s))
    });
    let running: Vec<String> = listed
        .iter()
        .filter(|c| c.state == "running")
        .map(|c| c.id.clone())
        .collect();
    let computing = computing(running).await;
    for c in listed {
        let (memory, status) = if c.state != "running" {
            (None, None)
        } else if args.no_memory {
            (None, status_of(engine, &c).await)
        } else {
            (memory_of(engine, &c.id).await, status_of(engine, &c).await)
        };
        rows.push(row(&c, memory, status, computing.contains(&c.id)));
    }
    rows.sort_by(|a, b| (&a.tenant, &a.owner).cmp(&(&b.tenant, &b.owner)));
    print_rows(&rows, args.format)?;
    Ok(ExitCode::SUCCESS)
}

/// `ps`'s session label filters: `--session-label`, and the deprecated `--label` (saying so
/// on standard error).
pub(crate) fn session_labels(args: &PsArgs) -> impl Iterator<Item = &String> {
    if !args.label.is_empty() {
        eprintln!(
            "kernelbox: `ps --label` is deprecated, use `ps --session-label` (it filters on session labels; `serve --label` sets container labels)"
        );
    }
    args.session_label.iter().chain(&args.label)
}

/// `kernelbox inspect`
pub async fn inspect(engine: &BollardEngine, args: InspectArgs) -> anyhow::Result<ExitCode> {
    let c = find(engine, &args.container).await?;
    let memory = memory_of(engine, &c.id).await;
    let status = status_of(engine, &c).await;
    let computing = computing(vec![c.id.clone()]).await.contains(&c.id);
    let r = row(&c, memory, status, computing);
    if args.format == Format::Table {
        print_rows(&[r], Format::Table)?;
    } else {
        let labels: BTreeMap<&String, &String> = c
            .labels
            .iter()
            .filter(|(k, _)| k.starts_with(labels::PREFIX) || !k.starts_with("io."))
            .collect();
        let out = serde_json::json!({ "kernel": r, "id": c.id, "labels": labels });
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernelbox logs`: kernels run without a log driver (cell output never lands on the host's
/// disk), so this shows the kernel's lifecycle as the engine recorded it.
pub async fn logs(engine: &BollardEngine, args: LogsArgs) -> anyhow::Result<ExitCode> {
    let c = find(engine, &args.container).await?;
    let since = labels::int(&c.labels, labels::CREATED_AT).unwrap_or(c.created) - 1;
    let until = kernelbox::clock::unix_now() + 1;
    let filters = std::collections::HashMap::from([
        ("container".to_string(), vec![c.id.clone()]),
        ("type".to_string(), vec!["container".to_string()]),
    ]);
    let options = EventsOptionsBuilder::default()
        .since(&since.to_string())
        .until(&until.to_string())
        .filters(&filters)
        .build();
    let mut events = engine.client().events(Some(options));
    println!(
        "# lifecycle of {} (cell output is not logged by design)",
        kernelbox::docker::short_id(&c.id)
    );
    while let Some(event) = events.next().await {
        let event = event?;
        let when = event
            .time
            .and_then(|t| u64::try_from(t).ok())
            .map(|t| {
                humantime::format_rfc3339_seconds(
                    std::time::UNIX_EPOCH + std::time::Duration::from_secs(t),
                )
                .to_string()
            })
            .unwrap_or_default();
        let attrs = event.actor.and_then(|a| a.attributes).unwrap_or_default();
        let detail = ["exitCode", "signal"]
            .iter()
            .filter_map(|k| attrs.get(*k).map(|v| format!("{k}={v}")))
            .collect::<Vec<_>>()
            .join(" ");
        println!("{when}  {:<8} {detail}", event.action.unwrap_or_default());
    }
    if let Some(path) = &args.server_log {
        let short = kernelbox::docker::short_id(&c.id);
        println!(
            "# the server's lifecycle events for {short} ({})",
            path.display()
        );
        let input: Box<dyn std::io::Read> = if path.as_os_str() == "-" {
            Box::new(std::io::stdin())
        } else {
            Box::new(
                std::fs::File::open(path)
                    .with_context(|| format!("opening the server's log {}", path.display()))?,
            )
        };
        let mut reader = std::io::BufReader::new(input);
        let mut line = Vec::new();
        loop {
            line.clear();
            // A line is read in pieces of at most MAX_LOG_LINE bytes (memory stays bounded
            // whatever the file holds); a lifecycle event is far shorter.
            let n = std::io::BufRead::read_until(
                &mut std::io::Read::take(&mut reader, MAX_LOG_LINE),
                b'\n',
                &mut line,
            )?;
            if n == 0 {
                break;
            }
            let text = String::from_utf8_lossy(&line);
            if is_lifecycle_of(text.trim_end(), short) {
                println!("{}", text.trim_end());
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The longest server log line `logs --server-log` reads whole (a lifecycle event is a few
/// hundred bytes).
const MAX_LOG_LINE: u64 = 64 * 1024;

/// Whether a line of the server's log (text or JSON, `docs/logs.md`) is a lifecycle event of
/// the kernel whose container's short id is `short`.
fn is_lifecycle_of(line: &str, short: &str) -> bool {
    if line.starts_with('{') {
        let Ok(event) = serde_json::from_str::<serde_json::Value>(line) else {
            return false;
        };
        return event["target"] == kernelbox::logging::LIFECYCLE_TARGET
            && event["container"] == short;
    }
    // The text format quotes a `container` it records as text: `container="3f2a9c0e1b7d"`.
    line.contains(kernelbox::logging::LIFECYCLE_TARGET)
        && line.split_whitespace().any(|field| {
            field
                .strip_prefix("container=")
                .is_some_and(|value| value.trim_matches('"') == short)
        })
}

/// `kernelbox kill`
pub async fn kill(engine: &BollardEngine, args: KillArgs) -> anyhow::Result<ExitCode> {
    let targets: Vec<ContainerInfo> = if let Some(prefix) = &args.container {
        vec![find(engine, prefix).await?]
    } else if let Some(owner) = &args.owner {
        kernels(engine, None, Some(owner)).await?
    } else if let Some(tenant) = &args.tenant {
        kernels(engine, Some(tenant), None).await?
    } else {
        kernels(engine, None, None).await?
    };
    let mut rows = Vec::new();
    for c in &targets {
        engine.remove_container(&c.id).await?;
        if let Some(volume) = c.labels.get(labels::VOLUME) {
            kernelbox::docker::remove_volume_when_free(engine, volume).await?;
        }
        rows.push(row(c, None, None, false));
    }
    if args.format == Format::Json {
        print_rows(&rows, Format::Json)?;
    } else {
        println!("killed {} kernel(s)", rows.len());
        for r in &rows {
            println!("{}  {}  {}", r.container, r.tenant, r.owner);
        }
    }
    Ok(ExitCode::SUCCESS)
}
