//! `kernelbox nodes`, `kernelbox drain` and `kernelbox ps --url`: a cluster's nodes, draining
//! one, and every node's kernels, through any node's HTTP API with the admin token
//! (docs/cluster.md, "Admin").

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use kernelbox::client::Client;
use kernelbox::config::parse_duration;

/// Where the cluster is and the admin token.
#[derive(Debug, Args)]
pub(crate) struct AdminOpts {
    /// Any node of the cluster (or the balancer in front).
    #[arg(long, env = "KERNELBOX_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The cluster's admin token (`kernelbox serve --admin-token`).
    #[arg(long, env = "KERNELBOX_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
}

impl AdminOpts {
    fn client(&self) -> Client {
        Client::new(&self.url, Some(self.admin_token.clone()))
    }
}

#[derive(Debug, Args)]
pub(crate) struct NodesArgs {
    #[command(flatten)]
    admin: AdminOpts,
    /// Output format.
    #[arg(long, default_value = "table", value_parser = ["table", "json"])]
    format: String,
}

#[derive(Debug, Args)]
pub(crate) struct DrainArgs {
    /// The node to drain.
    node: String,
    #[command(flatten)]
    admin: AdminOpts,
    /// Take the drain back: sessions may be placed on the node again.
    #[arg(long)]
    undo: bool,
    /// Wait until the node has no live kernel (at most this long; e.g. 10m), then exit 0;
    /// exit 1 if it still has some at the deadline.
    #[arg(long, value_parser = parse_duration)]
    wait: Option<Duration>,
}

/// `kernelbox nodes`.
pub(crate) async fn nodes(args: NodesArgs) -> anyhow::Result<ExitCode> {
    let answer = args.admin.client().nodes().await?;
    if args.format == "json" {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<20} {:<8} {:>6} {:>8} {:>8} {:>10} {:<8}  ADVERTISE",
        "NODE", "STATE", "EPOCH", "KERNELS", "CAPACITY", "LEASE_AGE", "DRAINING"
    );
    for node in answer["nodes"].as_array().into_iter().flatten() {
        println!(
            "{:<20} {:<8} {:>6} {:>8} {:>8} {:>9.1}s {:<8}  {}",
            node["name"].as_str().unwrap_or("?"),
            node["state"].as_str().unwrap_or("?"),
            node["epoch"].to_string(),
            node["live_kernels"].to_string(),
            node["capacity"].to_string(),
            node["lease_age_seconds"].as_f64().unwrap_or(f64::NAN),
            if node["draining"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            node["advertise"].as_str().unwrap_or("?"),
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// `kernelbox drain NODE`.
pub(crate) async fn drain(args: DrainArgs) -> anyhow::Result<ExitCode> {
    let client = args.admin.client();
    client.drain(&args.node, !args.undo).await?;
    let Some(wait) = args.wait.filter(|_| !args.undo) else {
        println!(
            "node {} {}",
            args.node,
            if args.undo {
                "takes new sessions again"
            } else {
                "is draining: no new sessions are placed on it"
            }
        );
        return Ok(ExitCode::SUCCESS);
    };
    let deadline = Instant::now() + wait;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let answer = client.nodes().await?;
        let live = answer["nodes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|n| n["name"].as_str() == Some(args.node.as_str()))
            .and_then(|n| n["live_kernels"].as_u64());
        match live {
            Some(0) | None => {
                println!("node {} is drained: no live kernel", args.node);
                return Ok(ExitCode::SUCCESS);
            }
            Some(n) if Instant::now() >= deadline => {
                println!(
                    "node {} still has {n} live kernel(s) after {wait:?}",
                    args.node
                );
                return Ok(ExitCode::from(1));
            }
            Some(_) => {}
        }
    }
}

/// `kernelbox ps --url URL`: every live node's kernels, one table.
pub(crate) async fn ps(args: super::admin::PsArgs) -> anyhow::Result<ExitCode> {
    let (Some(url), Some(token)) = (args.url.as_deref(), args.admin_token.clone()) else {
        anyhow::bail!("kernelbox ps --url needs --admin-token (or KERNELBOX_ADMIN_TOKEN)");
    };
    if super::admin::session_labels(&args).next().is_some() {
        anyhow::bail!(
            "kernelbox ps --url lists every node's kernels without their labels; filter a tenant's with GET /v1/kernels?label=key:value"
        );
    }
    let client = Client::new(url, Some(token));
    let answer = client.nodes().await?;
    println!(
        "{:<16} {:<14} {:<24} {:<8} {:>4} {:>6} {:>9}  ID",
        "NODE", "TENANT", "OWNER", "STATE", "GEN", "CELLS", "IDLE"
    );
    for node in answer["nodes"].as_array().into_iter().flatten() {
        if node["state"].as_str() != Some("live") {
            continue;
        }
        let name = node["name"].as_str().unwrap_or("?");
        let listed = client.node_kernels(name).await?;
        for k in listed["kernels"].as_array().into_iter().flatten() {
            let tenant = k["tenant"].as_str().unwrap_or("?");
            if args.tenant.as_deref().is_some_and(|t| t != tenant) {
                continue;
            }
            println!(
                "{:<16} {:<14} {:<24} {:<8} {:>4} {:>6} {:>8.0}s  {}",
                name,
                tenant,
                k["owner"].as_str().unwrap_or("?"),
                k["state"].as_str().unwrap_or("?"),
                k["generation"].to_string(),
                k["execution_count"].to_string(),
                k["idle_seconds"].as_f64().unwrap_or(f64::NAN),
                k["id"].as_str().unwrap_or("?"),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
