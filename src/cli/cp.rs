//! `kernelbox cp LOCAL SESSION:PATH` and `kernelbox cp SESSION:PATH LOCAL` against a server,
//! like `docker cp`: a file streams as it is, a directory as a tar (extracted into PATH on
//! upload, unpacked into LOCAL on download).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use super::transfer::{local_target, open_local, save_file, save_tar};
use super::Exit;
use kernelbox::client::{Client, Content, Download, Fetched, FileTarget};

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

pub async fn run(args: CpArgs) -> anyhow::Result<ExitCode> {
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
    let client = Client::new(&args.url, args.token.clone());
    let target = FileTarget {
        session,
        child: args.child.as_deref(),
        path: path.trim_start_matches('/'),
    };
    if upload {
        let source = open_local(&local).await?;
        let written = client
            .upload(&target, source.tar, Content::Stream(source.body))
            .await?;
        eprintln!(
            "{} -> {session}:{} ({} bytes)",
            local.display(),
            written.path,
            written.size
        );
        return Ok(ExitCode::SUCCESS);
    }
    match client.download(&target, true).await? {
        Fetched::Tar { body } => download(body, true, session, path, &local).await,
        Fetched::File { body, .. } => download(body, false, session, path, &local).await,
        Fetched::Listing(_) => anyhow::bail!(
            "{session}:{path} is a directory, and the server listed it instead of sending a tar"
        ),
    }
}

/// Saves a download at `local`: a tar unpacked into it, a file written to it.
async fn download(
    body: Download,
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
