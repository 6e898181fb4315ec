//! The warm cell round trip through the HTTP API on loopback.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use kernelbox::server::{AppState, Tenant, Tenants};
use kernelbox::Orchestrator;
use serde_json::json;

use super::{config, Bench};
use crate::report::Row;
use crate::stats::{ms, pq, stats};

impl Bench {
    /// Phase 2: the warm cell round trip through the HTTP API on loopback (keep-alive
    /// connection), on an in-process server with its own orchestrator.
    pub async fn http(&mut self) -> Result<()> {
        let n = self.sizes.warm;
        let kb = Orchestrator::start(config(&self.label), self.engine.clone()).await?;
        let tenants = Tenants::new(vec![Tenant::with_token("default", "bench-token")])?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shutdown = tokio_util::sync::CancellationToken::new();
        let server = tokio::spawn(kernelbox::server::serve(
            listener,
            AppState::new(kb, tenants),
            shutdown.clone(),
            Duration::from_secs(5),
        ));
        let client: Client<_, Full<bytes::Bytes>> =
            Client::builder(TokioExecutor::new()).build_http();
        let uri = format!("http://{addr}/v1/sessions/http/execute");
        let mut samples = Vec::with_capacity(n);
        for i in 0..n + 20 {
            let request = hyper::Request::post(&uri)
                .header("authorization", "Bearer bench-token")
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from_static(
                    br#"{"code": "x = 1"}"#,
                )))?;
            let t = Instant::now();
            let response = client.request(request).await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            let elapsed = ms(t.elapsed());
            if !status.is_success() || !body.starts_with(br#"{"status":"success""#) {
                bail!(
                    "http cell failed: {status} {}",
                    String::from_utf8_lossy(&body)
                );
            }
            // The first 20 include the kernel's start and connection set-up.
            if i >= 20 {
                samples.push(elapsed);
            }
        }
        shutdown.cancel();
        server.await??;
        let h = stats(&samples);
        let ratio = h.p50_ms / self.attach_p50;
        let row = Row::new(
            format!("warm cell `x = 1`, HTTP on loopback (n={n})"),
            pq(&h),
        );
        self.rows.push(self.vs_attach(row, h.p50_ms));
        self.details
            .insert("http".into(), json!({"http_wall": h, "ratio_p50": ratio}));
        Ok(())
    }
}
