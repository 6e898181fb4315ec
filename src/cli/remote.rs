//! `kernelbox exec --url`: run a cell on a kernelbox server instead of a local orchestrator.

use std::process::ExitCode;

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{json, Value};

use super::Exit;

/// What to send.
pub struct Remote<'a> {
    pub url: &'a str,
    pub token: Option<&'a str>,
    pub session: &'a str,
    pub child: Option<&'a str>,
    pub code: &'a str,
    pub timeout_seconds: f64,
    pub reset: bool,
}

/// Posts the cell, prints the result JSON; exit 1 when the cell did not succeed.
pub async fn exec(r: Remote<'_>) -> anyhow::Result<ExitCode> {
    let base = r.url.trim_end_matches('/');
    let uri = format!("{base}/v1/sessions/{}/execute", r.session);
    let mut body = json!({"code": r.code, "timeout": r.timeout_seconds, "reset": r.reset});
    if let Some(child) = r.child {
        body["child"] = json!(child);
    }
    let mut request = hyper::Request::post(&uri).header(CONTENT_TYPE, "application/json");
    if let Some(token) = r.token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .with_context(|| format!("--url {uri}"))?;
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = client.request(request).await.map_err(|e| Exit {
        code: 3,
        message: format!("cannot reach the kernelbox server at {base}: {e}"),
    })?;
    let status = response.status();
    let bytes = response.into_body().collect().await?.to_bytes();
    let value: Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("server answered {status} with non-JSON"))?;
    if !status.is_success() {
        let message = value["error"]["message"]
            .as_str()
            .unwrap_or("request failed");
        return Err(Exit {
            code: if status.as_u16() == 401 || status.is_client_error() {
                2
            } else {
                5
            },
            message: format!("server answered {status}: {message}"),
        }
        .into());
    }
    println!("{}", serde_json::to_string_pretty(&value)?);
    Ok(if value["status"] == "success" {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
