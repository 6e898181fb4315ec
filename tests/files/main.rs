//! Files in and out of a session's kernel (docs/files.md "Files in and out of a kernel"), end to end:
//! the real server over real HTTP, real kernels on the real engine, the helper inside them. On
//! the shared harness (`tests/common`: labels, engine, clean-up; `tests/common/http.rs`: the
//! in-process server, a real `kernelbox serve`, their client and a session's files through it).
//!
//! - `transfer.rs`: uploads and downloads byte for byte, beside a running cell, 100 MiB
//!   streamed, the project directory, a transfer against the idle reaper
//! - `listing.rs`: directory listings, odd and long names
//! - `archives.rs`: tar archives in and out, refused whole
//! - `isolation.rs`: paths confined to the working directory, a session's own kernel only
//! - `limits.rs`: the upload cap and a full working directory
//! - `clients.rs`: clients that break off, stop reading or go slowly; deadlines and rates
//! - `helper.rs`: the resident helper: reused, one-shot helpers beside it, its idle end
//! - `hostile.rs`: cells that kill, forge or stop their helper
//! - `channel.rs`: the file channel (the helper's socket) and its fallback
//! - `cli.rs`: `kernelbox cp` and `kernelbox exec --upload/--download`

#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/http.rs"]
mod http;

mod archives;
mod channel;
mod cli;
mod clients;
mod helper;
mod hostile;
mod isolation;
mod limits;
mod listing;
mod transfer;

use std::time::Duration;

use http::{tenant, tenants, TestServer};
use rand::RngCore;
use serde_json::Value;

// What the concern files share: the two tenants, their server, and the fixtures more than
// one of them uses.

const TOKEN: &str = "tok-files";
const OTHER: &str = "tok-files-other";

async fn server(name: &str, tweak: impl FnOnce(&mut kernelbox::Config)) -> TestServer {
    TestServer::start(
        name,
        tenants(vec![tenant("files", TOKEN), tenant("others", OTHER)]),
        tweak,
    )
    .await
}

fn random_bytes(n: usize) -> Vec<u8> {
    let mut data = vec![0u8; n];
    rand::rng().fill_bytes(&mut data);
    data
}

fn output(result: &Value) -> String {
    result["output"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn tar_of(entries: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (name, data) in entries {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, *data).unwrap();
    }
    builder.into_inner().unwrap()
}

/// A cell's code that writes `forged` (a Python bytes expression) to the resident helper's
/// stdout from a thread, so the bytes reach the host ahead of the helper's next answer.
fn forge(forged: &str) -> String {
    format!(
        "import os, threading\npids = [p for p in os.listdir('/proc') if p.isdigit() and \
         b'kernelbox file helper' in open('/proc/%s/cmdline' % p, 'rb').read()]\n\
         out = open('/proc/%s/fd/1' % pids[0], 'wb', buffering=0)\n\
         threading.Thread(target=out.write, args=({forged},), daemon=True).start()\n\
         print(len(pids))"
    )
}

/// Host pids of the file helpers running in `container` (Docker's top: the helper's command
/// line carries its source, whose first line names it).
async fn helper_pids(container: &str) -> Vec<String> {
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let top = docker
        .top_processes(
            container,
            Some(bollard::query_parameters::TopOptions {
                ps_args: "-eo pid,args".into(),
            }),
        )
        .await
        .expect("docker top");
    let mut pids: Vec<String> = top
        .processes
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.iter().any(|f| f.contains("kernelbox file helper")))
        .map(|p| p[0].clone())
        .collect();
    pids.sort();
    pids
}

/// Waits, bounded, until `container` runs `want` file helpers and returns their pids (what
/// it runs at the deadline otherwise): a transfer's helper goes back to its kernel, or ends,
/// a moment after the client has the whole answer.
async fn helpers_settle(container: &str, want: usize) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let pids = helper_pids(container).await;
        if pids.len() == want || std::time::Instant::now() > deadline {
            return pids;
        }
        tokio::task::yield_now().await;
    }
}
