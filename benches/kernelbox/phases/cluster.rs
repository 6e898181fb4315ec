//! The cluster (docs/cluster.md): a warm cell on the node holding its session against the same
//! cell through one forward hop; a new session's first cell with the PostgreSQL catalog
//! against one host's redb catalog; the time from a node's death (`kill -9` of a real
//! `kernelbox serve`) to the first `node_lost` report; cells per second through three nodes
//! against one. Runs when `KERNELBOX_TEST_POSTGRES` names a PostgreSQL server (`.ci/postgres`
//! starts one); each run uses a database of its own, dropped at the end.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kernelbox::server::cluster::{ClusterNode, ClusterOptions};
use kernelbox::server::{AppState, Tenant, Tenants};
use kernelbox::Orchestrator;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::{config, Bench};
use crate::report::Row;
use crate::stats::{fmt_ms, ms, pq, stats};

const TOKEN: &str = "bench-token";

type Http = Client<HttpConnector, Full<bytes::Bytes>>;

/// One in-process node (or a single host, without a cluster): its address and how to stop it.
struct Node {
    addr: std::net::SocketAddr,
    stop: CancellationToken,
    served: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Node {
    async fn finish(self) -> Result<()> {
        self.stop.cancel();
        self.served.await??;
        Ok(())
    }
}

impl Bench {
    /// Phase: the cluster rows, when a PostgreSQL server is named.
    pub async fn cluster(&mut self) -> Result<()> {
        let Ok(server) = std::env::var("KERNELBOX_TEST_POSTGRES") else {
            self.notes.push(
                "cluster rows not measured: set KERNELBOX_TEST_POSTGRES (`eval \"$(bash .ci/postgres)\"`)"
                    .into(),
            );
            return Ok(());
        };
        let (url, drop_db) = fresh_database(&server).await?;
        let result = self.cluster_rows(&url).await;
        drop_db.await?;
        result
    }

    async fn cluster_rows(&mut self, url: &str) -> Result<()> {
        let http: Http = Client::builder(TokioExecutor::new()).build_http();
        let a = self.start_node(Some((url, "bench-a"))).await?;
        let b = self.start_node(Some((url, "bench-b"))).await?;
        // Warm cell: on the node holding the session, and through B (one hop to A).
        let n = self.sizes.warm;
        cell(&http, a.addr, "hop", "x = 1").await?;
        let (mut direct, mut hop) = (Vec::with_capacity(n), Vec::with_capacity(n));
        for i in 0..n + 20 {
            let t = Instant::now();
            cell(&http, a.addr, "hop", "x = 1").await?;
            let d = ms(t.elapsed());
            let t = Instant::now();
            cell(&http, b.addr, "hop", "x = 1").await?;
            let h = ms(t.elapsed());
            if i >= 20 {
                direct.push(d);
                hop.push(h);
            }
        }
        let (d, h) = (stats(&direct), stats(&hop));
        let added = h.p50_ms - d.p50_ms;
        self.rows.push(
            Row::new(format!("warm cell through one forward hop (n={n})"), pq(&h))
                .floor(
                    format!("on the owning node: {}", pq(&d)),
                    h.p50_ms / d.p50_ms,
                )
                .target(
                    format!("hop adds ≤ 0.3 ms p50 (adds {})", fmt_ms(added)),
                    added <= 0.3,
                ),
        );
        // Cold first cell: PostgreSQL catalog (a claim, then the start) against redb.
        let single = self.start_node(None).await?;
        let cold_n = self.sizes.cold;
        let (mut pg, mut redb) = (Vec::new(), Vec::new());
        for i in 0..=cold_n {
            let t = Instant::now();
            cell(&http, a.addr, &format!("cold-pg-{i}"), "x = 1").await?;
            let p = ms(t.elapsed());
            let t = Instant::now();
            cell(&http, single.addr, &format!("cold-redb-{i}"), "x = 1").await?;
            let r = ms(t.elapsed());
            if i > 0 {
                pg.push(p);
                redb.push(r);
            }
        }
        let (p, r) = (stats(&pg), stats(&redb));
        self.rows.push(
            Row::new(
                format!("cold first cell, cluster node, PostgreSQL catalog (n={cold_n})"),
                pq(&p),
            )
            .floor(
                format!("one host, redb catalog: {}", pq(&r)),
                p.p50_ms / r.p50_ms,
            ),
        );
        single.finish().await?;
        // Throughput: owners spread over three nodes against all on one.
        let c = self.start_node(Some((url, "bench-c"))).await?;
        let owners = self.sizes.owners * 2;
        let cells = self.sizes.cells_per_owner;
        let three = [a.addr, b.addr, c.addr];
        let spread = throughput(&http, &three, owners, cells, "tp3").await?;
        let one = throughput(&http, &[a.addr], owners, cells, "tp1").await?;
        self.rows.push(
            Row::new(
                format!("cells/s, {owners} owners x {cells} cells over three nodes (one engine)"),
                format!("{spread:.0}/s"),
            )
            .floor(format!("all on one node: {one:.0}/s"), spread / one)
            .higher_is_better(),
        );
        // A node's death: a real process, killed.
        let death = self.node_death(url, &http, a.addr).await?;
        self.rows.push(Row::new(
            "node killed (`kill -9`) to the first `node_lost` report, lease TTL 3 s",
            format!("{:.2} s", death.as_secs_f64()),
        ));
        self.details.insert(
            "cluster".into(),
            json!({
                "warm_direct": d, "warm_hop": h, "hop_added_p50_ms": added,
                "cold_postgres": p, "cold_redb": r,
                "cells_per_second_three_nodes": spread, "cells_per_second_one_node": one,
                "node_death_to_node_lost_seconds": death.as_secs_f64(),
            }),
        );
        for node in [a, b, c] {
            node.finish().await?;
        }
        Ok(())
    }

    /// An in-process server: a cluster node named `cluster.1` of the catalog at `cluster.0`,
    /// or one host with a redb catalog in a temporary directory. No warm pool.
    async fn start_node(&self, cluster: Option<(&str, &str)>) -> Result<Node> {
        let mut config = config(&self.label);
        config.pool.size = 0;
        // Room for every session of the phase (the hop, the cold starts, the throughput).
        config.kernels.max_session_kernels = 64;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let tenants = Tenants::new(vec![Tenant::with_token("default", TOKEN)])?;
        let state = match cluster {
            Some((url, name)) => {
                let options = ClusterOptions {
                    url: url.to_string(),
                    node: name.to_string(),
                    advertise: format!("http://{addr}"),
                    lease_ttl: Duration::from_secs(10),
                    fence_margin: Duration::from_secs(3),
                    admin_token: None,
                    drain_deadline: None,
                };
                let (node, catalog) =
                    ClusterNode::join(options, config.kernels.max_session_kernels).await?;
                let catalog = Arc::new(catalog) as Arc<dyn kernelbox::catalog::Catalog>;
                let kb = Orchestrator::start_with_catalog(
                    config.validate()?,
                    self.engine.clone(),
                    Some(catalog),
                )
                .await?;
                node.start(kb.clone());
                let state = AppState::new(kb, tenants);
                state.join_cluster(node);
                state
            }
            None => {
                let dir = std::env::temp_dir().join(format!("kb-bench-redb-{}", self.label));
                config.housekeeping.state_dir = Some(dir);
                AppState::new(
                    Orchestrator::start(config, self.engine.clone()).await?,
                    tenants,
                )
            }
        };
        let stop = CancellationToken::new();
        let served = tokio::spawn(kernelbox::server::serve(
            listener,
            state,
            stop.clone(),
            Duration::from_secs(5),
        ));
        Ok(Node { addr, stop, served })
    }

    /// Starts a real `kernelbox serve` node, gives it a session, kills it, and times how long
    /// until a call of that session on `survivor` reports `node_lost`.
    async fn node_death(
        &self,
        url: &str,
        http: &Http,
        survivor: std::net::SocketAddr,
    ) -> Result<Duration> {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let state = std::env::temp_dir().join(format!("kb-bench-victim-{}", self.label));
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"))
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--cluster",
                url,
            ])
            .args([
                "--node-name",
                "bench-victim",
                "--lease-ttl",
                "3s",
                "--fence-margin",
                "1s",
            ])
            .args([
                "--pool",
                "0",
                "--label",
                &format!("io.kernelbox-test.case={}", self.label),
            ])
            .arg("--state-dir")
            .arg(&state)
            .env("KERNELBOX_TOKEN", TOKEN)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("starting a kernelbox serve node")?;
        let victim: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while cell(http, victim, "victim", "x = 1").await.is_err() {
            if Instant::now() > deadline {
                bail!("the victim node did not serve within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        child.start_kill()?;
        let killed = Instant::now();
        child.wait().await?;
        loop {
            if let Ok(result) = cell(http, survivor, "victim", "x = 1").await {
                if result["kernel"]["state_lost"]["reason"] == "node_lost" {
                    return Ok(killed.elapsed());
                }
                bail!("the victim's session answered without node_lost: {result}");
            }
            if killed.elapsed() > Duration::from_secs(60) {
                bail!("no node_lost within 60 s of the kill");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// One cell over HTTP; its result, or an error for any refusal.
async fn cell(http: &Http, addr: std::net::SocketAddr, session: &str, code: &str) -> Result<Value> {
    let request = hyper::Request::post(format!("http://{addr}/v1/sessions/{session}/execute"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(
            json!({"code": code}).to_string(),
        )))?;
    let response = http.request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    if !status.is_success() {
        bail!("{status}: {}", String::from_utf8_lossy(&body));
    }
    let value: Value = serde_json::from_slice(&body)?;
    if value["status"] != "success" {
        bail!("cell failed: {value}");
    }
    Ok(value)
}

/// `owners` sessions, each running `cells` cells in turn, all at once, sent to the nodes in
/// turn: cells per second.
async fn throughput(
    http: &Http,
    nodes: &[std::net::SocketAddr],
    owners: usize,
    cells: usize,
    prefix: &str,
) -> Result<f64> {
    let t = Instant::now();
    let runs = (0..owners).map(|o| {
        let addr = nodes[o % nodes.len()];
        let session = format!("{prefix}-{o}");
        async move {
            for _ in 0..cells {
                cell(http, addr, &session, "x = 1").await?;
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    for r in futures::future::join_all(runs).await {
        r?;
    }
    Ok((owners * cells) as f64 / t.elapsed().as_secs_f64())
}

/// A new database on the PostgreSQL server at `server` (a URL), and a future that drops it.
async fn fresh_database(
    server: &str,
) -> Result<(String, impl std::future::Future<Output = Result<()>>)> {
    let name = format!(
        "kb_bench_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let (client, connection) = tokio_postgres::connect(server, tokio_postgres::NoTls)
        .await
        .context("connecting to KERNELBOX_TEST_POSTGRES")?;
    let conn = tokio::spawn(connection);
    client
        .batch_execute(&format!("CREATE DATABASE {name}"))
        .await?;
    let base = server.rsplit_once('/').map_or(server, |(b, _)| b);
    let url = format!("{base}/{name}");
    let drop = async move {
        client
            .batch_execute(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .await?;
        drop(client);
        let _ = conn.await;
        Ok(())
    };
    Ok((url, drop))
}
