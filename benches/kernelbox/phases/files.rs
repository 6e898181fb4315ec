//! File transfer throughput through the HTTP API (`PUT`/`GET /v1/sessions/{s}/files/{path}`),
//! 10 MiB and 100 MiB, beside the floor `docker cp` of the same file into and out of the same
//! kernel's working directory, in the same run. The session's kernel is started by a cell
//! first (an upload to a session without a kernel would start one and count its cold start),
//! and every row is the median of at least 3 rounds (5 without `--quick`). The upload rows
//! also show the engine's own intake: its archive endpoint fed the file from memory, no CLI
//! (every path into a container goes through the engine: what the engine alone takes in).

use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kernelbox::server::{AppState, Tenant, Tenants};
use kernelbox::Orchestrator;
use serde_json::json;

use super::{config, Bench};
use crate::report::Row;

/// Runs `docker cp FROM TO`; returns its wall time.
async fn docker_cp(from: &str, to: &str) -> Result<Duration> {
    let t = Instant::now();
    let out = tokio::process::Command::new("docker")
        .args(["cp", "-q", from, to])
        .output()
        .await
        .context("spawning docker cp")?;
    if !out.status.success() {
        bail!(
            "docker cp failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(t.elapsed())
}

/// A tar holding one file `name` with `data`.
fn tar_of(name: &str, data: &[u8]) -> Result<bytes::Bytes> {
    let mut header = tar::Header::new_gnu();
    header.set_size(data.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::with_capacity(data.len() + 4096));
    builder.append_data(&mut header, name, data)?;
    Ok(bytes::Bytes::from(builder.into_inner()?))
}

/// Deletes files of the bench's session through the API.
async fn delete_files(
    client: &Client<HttpConnector, Full<bytes::Bytes>>,
    base: &str,
    names: &[String],
) -> Result<()> {
    for name in names {
        let request = hyper::Request::delete(format!("{base}/{name}"))
            .header("authorization", "Bearer bench-token")
            .body(Full::new(bytes::Bytes::new()))?;
        let response = client.request(request).await?;
        let status = response.status();
        response.into_body().collect().await?;
        if !status.is_success() {
            bail!("deleting {name} failed: {status}");
        }
    }
    Ok(())
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

impl Bench {
    /// Phase: upload and download throughput against `docker cp`.
    pub async fn files(&mut self) -> Result<()> {
        let kb = Orchestrator::start(config(&self.label), self.engine.clone()).await?;
        let tenants = Tenants::new(vec![Tenant::with_token("default", "bench-token")])?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(kernelbox::server::serve(
            listener,
            AppState::new(kb.clone(), tenants),
            shutdown.clone(),
            Duration::from_secs(5),
        ));
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let base = format!("http://{addr}/v1/sessions/files/files");
        // The kernel first: the rows measure transfers, not a cold start.
        let started = client
            .request(
                hyper::Request::post(format!("http://{addr}/v1/sessions/files/execute"))
                    .header("authorization", "Bearer bench-token")
                    .header("content-type", "application/json")
                    .body(Full::new(bytes::Bytes::from_static(b"{\"code\": \"1\"}")))?,
            )
            .await?;
        if !started.status().is_success() {
            bail!("starting the files kernel failed: {}", started.status());
        }
        started.into_body().collect().await?;
        let dir = tempfile::tempdir()?;
        let mut details = serde_json::Map::new();
        let rounds = if self.args.quick { 3 } else { 5 };
        for mib in [10usize, 100] {
            let data = bytes::Bytes::from(vec![0x5a; mib * 1024 * 1024]);
            let local = dir.path().join(format!("f{mib}.bin"));
            std::fs::write(&local, &data)?;
            let (mut up, mut down, mut cp_in, mut cp_out) = (vec![], vec![], vec![], vec![]);
            let mut api_in = vec![];
            for round in 0..rounds {
                let uri = format!("{base}/f{mib}-{round}.bin");
                let request = hyper::Request::put(&uri)
                    .header("authorization", "Bearer bench-token")
                    .body(Full::new(data.clone()))?;
                let t = Instant::now();
                let response = client.request(request).await?;
                let status = response.status();
                response.into_body().collect().await?;
                up.push(mib as f64 / t.elapsed().as_secs_f64());
                if !status.is_success() {
                    bail!("upload failed: {status}");
                }
                let request = hyper::Request::get(&uri)
                    .header("authorization", "Bearer bench-token")
                    .body(Full::new(bytes::Bytes::new()))?;
                let t = Instant::now();
                let mut body = client.request(request).await?.into_body();
                let mut n = 0;
                while let Some(frame) = body.frame().await {
                    n += frame?.into_data().map(|d| d.len()).unwrap_or(0);
                }
                down.push(mib as f64 / t.elapsed().as_secs_f64());
                if n != data.len() {
                    bail!("download returned {n} bytes");
                }
                // The floor: docker cp of the same file, same kernel, same directory.
                let kernel = kb
                    .list_kernels(None)
                    .into_iter()
                    .find(|k| k.session == "files")
                    .context("the files kernel")?;
                let target = format!("{}:/work/cp{mib}-{round}.bin", kernel.id);
                cp_in.push(
                    mib as f64
                        / docker_cp(&local.to_string_lossy(), &target)
                            .await?
                            .as_secs_f64(),
                );
                let back = dir.path().join(format!("back{mib}-{round}.bin"));
                cp_out.push(
                    mib as f64
                        / docker_cp(&target, &back.to_string_lossy())
                            .await?
                            .as_secs_f64(),
                );
                std::fs::remove_file(&back)?;
                // The working directory holds 256 MiB: each round leaves it empty again.
                delete_files(
                    &client,
                    &base,
                    &[
                        format!("f{mib}-{round}.bin"),
                        format!("cp{mib}-{round}.bin"),
                    ],
                )
                .await?;
                // The engine's own intake, for reference: its archive endpoint fed the same
                // file straight from memory (what `docker cp` does, without the CLI).
                let archive = tar_of(&format!("api{mib}-{round}.bin"), &data)?;
                let t = Instant::now();
                self.engine.upload(&kernel.id, "/work", archive).await?;
                api_in.push(mib as f64 / t.elapsed().as_secs_f64());
                delete_files(&client, &base, &[format!("api{mib}-{round}.bin")]).await?;
            }
            let (up, down, cp_in, cp_out, api_in) = (
                median(up),
                median(down),
                median(cp_in),
                median(cp_out),
                median(api_in),
            );
            self.rows.push(
                Row::new(
                    format!("upload {mib} MiB, HTTP PUT"),
                    format!("{up:.0} MiB/s"),
                )
                .floor(
                    format!("docker cp in {cp_in:.0} MiB/s (engine archive PUT {api_in:.0})"),
                    cp_in / up,
                )
                .target("at least docker cp", up >= cp_in),
            );
            self.rows.push(
                Row::new(
                    format!("download {mib} MiB, HTTP GET"),
                    format!("{down:.0} MiB/s"),
                )
                .floor(format!("docker cp out {cp_out:.0} MiB/s"), cp_out / down)
                .target("at least docker cp", down >= cp_out),
            );
            details.insert(
                format!("{mib}MiB"),
                json!({"upload_mib_s": up, "download_mib_s": down, "docker_cp_in_mib_s": cp_in, "docker_cp_out_mib_s": cp_out, "engine_archive_put_mib_s": api_in}),
            );
        }
        shutdown.cancel();
        server.await??;
        self.details
            .insert("files".into(), serde_json::Value::Object(details));
        Ok(())
    }
}
