//! `kernelbox cp LOCAL SESSION:PATH` and `kernelbox cp SESSION:PATH LOCAL` against a server,
//! like `docker cp`: a file streams as it is, a directory as a tar (extracted into PATH on
//! upload, unpacked into LOCAL on download).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use bytes::Bytes;
use clap::Args;
use futures::TryStreamExt;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::Frame;
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::transfer::{local_target, open_local, save_file, save_tar};
use super::Exit;
use kernelbox::files::TransferError;
use kernelbox::wire::path as api_path;

#[derive(Debug, Args)]
pub struct CpArgs {
    /// Source: a local path, or SESSION:PATH in the session's kernel (relative to its
    /// working directory). A local path starting with `/` or `.` is always local.
    src: String,
    /// Destination, the other side.
    dst: String,
    /// The kernelbox server.
    #[arg(long, env = "KERNELBOX_URL")]
    url: String,
    /// Bearer token.
    #[arg(long, env = "KERNELBOX_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// The session's delegated child whose kernel is meant.
    #[arg(long)]
    child: Option<String>,
}

/// `SESSION:PATH`, or `None` for a local path.
fn remote(spec: &str) -> Option<(&str, &str)> {
    if spec.starts_with('/') || spec.starts_with('.') {
        return None;
    }
    spec.split_once(':')
}

fn failed(message: String) -> anyhow::Error {
    Exit { code: 3, message }.into()
}

pub async fn run(args: CpArgs) -> anyhow::Result<ExitCode> {
    let base = args.url.trim_end_matches('/').to_string();
    let (session, path, local, upload) = match (remote(&args.src), remote(&args.dst)) {
        (None, Some((s, p))) => (s, p, PathBuf::from(&args.src), true),
        (Some((s, p)), None) => (s, p, PathBuf::from(&args.dst), false),
        _ => {
            return Err(Exit {
                code: 2,
                message: "exactly one of SRC and DST must be SESSION:PATH".into(),
            }
            .into())
        }
    };
    let uri = format!(
        "{base}{}",
        api_path::files(session, path.trim_start_matches('/'), args.child.as_deref())
    );
    let client =
        Client::builder(TokioExecutor::new()).build_http::<UnsyncBoxBody<Bytes, std::io::Error>>();
    let mut request = hyper::Request::builder().uri(&uri);
    if let Some(token) = &args.token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = if upload {
        let source = open_local(&local).await?;
        let body = StreamBody::new(source.body.map_ok(Frame::data)).boxed_unsync();
        request = request.method(hyper::Method::PUT);
        if source.tar {
            request = request.header(CONTENT_TYPE, "application/x-tar");
        }
        request.body(body)?
    } else {
        request
            .method(hyper::Method::GET)
            .header(ACCEPT, "application/x-tar, application/octet-stream")
            .body(
                http_body_util::Empty::new()
                    .map_err(|e| match e {})
                    .boxed_unsync(),
            )?
    };
    let response = client
        .request(request)
        .await
        .map_err(|e| failed(format!("cannot reach the kernelbox server at {base}: {e}")))?;
    let status = response.status();
    let tar = response
        .headers()
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/x-tar"));
    if !status.is_success() {
        let bytes = response.into_body().collect().await?.to_bytes();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        let message = value["error"]["message"]
            .as_str()
            .unwrap_or("request failed");
        return Err(Exit {
            code: if status.is_client_error() { 2 } else { 5 },
            message: format!("server answered {status}: {message}"),
        }
        .into());
    }
    if upload {
        let bytes = response.into_body().collect().await?.to_bytes();
        let value: serde_json::Value =
            serde_json::from_slice(&bytes).context("the server's answer")?;
        eprintln!(
            "{} -> {session}:{} ({} bytes)",
            local.display(),
            value["path"].as_str().unwrap_or(path),
            value["size"]
        );
        return Ok(ExitCode::SUCCESS);
    }
    let body = futures::StreamExt::boxed(
        response
            .into_body()
            .into_data_stream()
            .map_err(|e| TransferError::Helper(format!("the download broke off: {e}"))),
    );
    download(body, tar, session, path, &local).await
}

async fn download(
    body: kernelbox::files::DownloadStream,
    tar: bool,
    session: &str,
    path: &str,
    local: &Path,
) -> anyhow::Result<ExitCode> {
    if tar {
        let files = save_tar(body, local).await?;
        eprintln!("{session}:{path} -> {} ({files} files)", local.display());
    } else {
        let target = local_target(path, Some(local));
        let size = save_file(body, &target).await?;
        eprintln!("{session}:{path} -> {} ({size} bytes)", target.display());
    }
    Ok(ExitCode::SUCCESS)
}
