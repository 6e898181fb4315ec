//! `kernelbox usage`: a server's usage ledger (docs/usage.md, "Reading the ledger") as a
//! table, JSON or CSV.

use std::process::ExitCode;

use clap::Args;

use kernelbox::client::Client;
use kernelbox::usage::{GroupBy, UsageRow};
use kernelbox::wire::UsageQuery;

#[derive(Debug, Args)]
pub(crate) struct UsageArgs {
    /// The kernelbox server's base URL.
    #[arg(long, env = "KERNELBOX_URL", default_value = "http://127.0.0.1:8080")]
    url: String,
    /// The tenant's bearer token.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: String,
    /// Start: RFC 3339 or seconds since the epoch (default a day before --to).
    #[arg(long)]
    from: Option<String>,
    /// End (exclusive): RFC 3339 or seconds since the epoch (default now).
    #[arg(long)]
    to: Option<String>,
    /// One row per session, per day or per hour.
    #[arg(long, default_value = "session", value_parser = ["session", "day", "hour"])]
    group_by: String,
    /// One tenant's usage (a usage admin's token).
    #[arg(long)]
    tenant: Option<String>,
    /// Print JSON.
    #[arg(long, conflicts_with = "csv")]
    json: bool,
    /// Print CSV.
    #[arg(long)]
    csv: bool,
}

/// The columns, in table and CSV order.
const HEADER: [&str; 14] = [
    "tenant",
    "session",
    "start",
    "kernel_seconds",
    "cpu_seconds",
    "peak_memory_bytes",
    "cells",
    "cell_seconds",
    "commands",
    "file_bytes_in",
    "file_bytes_out",
    "pool_hits",
    "network_bytes_in",
    "network_bytes_out",
];

fn cells(r: &UsageRow) -> [String; 14] {
    [
        r.tenant.clone(),
        r.session.clone(),
        humantime::format_rfc3339_seconds(
            std::time::UNIX_EPOCH + std::time::Duration::from_secs(r.start),
        )
        .to_string(),
        format!("{:.1}", r.kernel_seconds),
        format!("{:.3}", r.cpu_seconds),
        r.peak_memory_bytes.to_string(),
        r.cells.to_string(),
        format!("{:.3}", r.cell_seconds),
        r.commands.to_string(),
        r.file_bytes_in.to_string(),
        r.file_bytes_out.to_string(),
        r.pool_hits.to_string(),
        r.network_bytes_in.to_string(),
        r.network_bytes_out.to_string(),
    ]
}

pub(crate) async fn usage(args: UsageArgs) -> anyhow::Result<ExitCode> {
    let query = UsageQuery {
        from: args.from,
        to: args.to,
        group_by: Some(match args.group_by.as_str() {
            "day" => GroupBy::Day,
            "hour" => GroupBy::Hour,
            _ => GroupBy::Session,
        }),
        tenant: args.tenant,
    };
    let report = Client::new(&args.url, Some(args.token))
        .usage(&query)
        .await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if args.csv {
        println!("{}", HEADER.join(","));
        for r in &report.rows {
            // Names cannot hold a comma or a quote (docs/http-api.md): no quoting needed.
            println!("{}", cells(r).join(","));
        }
    } else {
        println!(
            "{:<16} {:<20} {:<20} {:>9} {:>9} {:>12} {:>6} {:>9} {:>5} {:>10} {:>10} {:>5}",
            "TENANT",
            "SESSION",
            "START",
            "KERNEL_S",
            "CPU_S",
            "PEAK_MEM",
            "CELLS",
            "CELL_S",
            "CMDS",
            "BYTES_IN",
            "BYTES_OUT",
            "POOL"
        );
        for r in &report.rows {
            let c = cells(r);
            println!(
                "{:<16} {:<20} {:<20} {:>9} {:>9} {:>12} {:>6} {:>9} {:>5} {:>10} {:>10} {:>5}",
                c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8], c[9], c[10], c[11]
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
