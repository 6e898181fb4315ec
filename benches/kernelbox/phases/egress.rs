//! Network egress (docs/reliability.md, "Network egress"): an HTTPS request on a new TLS
//! connection from a kernel through kernelbox's proxy, against the same request from a
//! container of the same image on the engine's default bridge, straight to the server; a
//! 100 MiB HTTPS download both ways; and the first cell of a kernel with a policy (never
//! pooled) against a plain kernel's cold first cell. The server is Python's on this host,
//! with a throwaway self-signed certificate; the clients skip its verification (the proxy
//! never reads inside TLS, so verification costs both sides the same).

use std::time::Instant;

use anyhow::{bail, Context, Result};
use kernelbox::config::{EgressConfig, DEFAULT_CA_BUNDLE};
use kernelbox::wire::NetworkPolicy;
use kernelbox::{ExecuteRequest, Orchestrator};
use serde_json::{json, Value};
use tokio::process::Command;

use super::{config, last_json, ok_cell, Bench};
use crate::report::Row;
use crate::stats::{fmt_ms, ms, pq, stats};
use crate::{CASE, IMAGE};

/// Requests timed on each side, each on a new TLS connection.
const REQUESTS: usize = 40;
/// The download's size.
const DOWNLOAD_MIB: usize = 100;

/// The HTTPS server: `/small` answers 2 bytes, `/big` DOWNLOAD_MIB MiB; prints its port.
const SERVER: &str = r#"
import http.server, socketserver, ssl, sys
big = b"x" * (DOWNLOAD_MIB << 20)
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = big if self.path == "/big" else b"ok"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        view = memoryview(body)
        for i in range(0, len(view), 1 << 20):
            self.wfile.write(view[i:i + (1 << 20)])
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(sys.argv[1], sys.argv[2])
s = S(("0.0.0.0", 0), H)
s.socket = ctx.wrap_socket(s.socket, server_side=True)
print(s.server_address[1], flush=True)
s.serve_forever()
"#;

/// The client, in a kernel (through the proxy its environment names) or in a plain container
/// (direct): REQUESTS GETs of /small, each a new connection, then one download of /big.
const CLIENT: &str = r#"
import json, ssl, time, urllib.request
ctx = ssl._create_unverified_context()
opener = urllib.request.build_opener(urllib.request.HTTPSHandler(context=ctx))
base = "https://HOST:PORT"
assert opener.open(base + "/small", timeout=20).read() == b"ok"
times = []
for _ in range(REQUESTS):
    t = time.perf_counter()
    with opener.open(base + "/small", timeout=20) as r:
        r.read()
    times.append((time.perf_counter() - t) * 1000)
t = time.perf_counter()
got = 0
with opener.open(base + "/big", timeout=120) as r:
    while True:
        chunk = r.read(1 << 20)
        if not chunk:
            break
        got += len(chunk)
print(json.dumps({"ms": times, "mib_per_s": got / (1 << 20) / (time.perf_counter() - t), "bytes": got}))
"#;

/// The server process, killed when dropped.
struct Server {
    port: u16,
    _child: tokio::process::Child,
    _dir: tempfile::TempDir,
}

async fn server() -> Result<Server> {
    let dir = tempfile::tempdir()?;
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=kernelbox-bench"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .await
        .context("running openssl for the bench's certificate")?;
    if !made.status.success() {
        bail!("openssl: {}", String::from_utf8_lossy(&made.stderr));
    }
    let code = SERVER.replace("DOWNLOAD_MIB", &DOWNLOAD_MIB.to_string());
    let mut child = Command::new("python3")
        .args(["-c", &code])
        .arg(&cert)
        .arg(&key)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the bench's HTTPS server")?;
    let stdout = child.stdout.take().context("server stdout")?;
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
        .await
        .context("the HTTPS server did not start")??
        .context("the HTTPS server exited")?;
    Ok(Server {
        port: line.trim().parse()?,
        _child: child,
        _dir: dir,
    })
}

fn client(host: &str, port: u16) -> String {
    CLIENT
        .replace("HOST", host)
        .replace("PORT", &port.to_string())
        .replace("REQUESTS", &REQUESTS.to_string())
}

/// The address of the default bridge's gateway: where a container reaches this host.
async fn bridge_gateway() -> Result<String> {
    let out = Command::new("docker")
        .args(["network", "inspect", "bridge", "--format"])
        .arg("{{(index .IPAM.Config 0).Gateway}}")
        .output()
        .await?;
    let gateway = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if gateway.is_empty() {
        bail!("no gateway on the default bridge network");
    }
    Ok(gateway)
}

impl Bench {
    /// Phase: the egress proxy's added latency and throughput, and a policy kernel's start.
    pub async fn egress(&mut self) -> Result<()> {
        let server = server().await?;
        let mut c = config(&self.label);
        c.pool.size = 0;
        c.egress = Some(EgressConfig {
            tenants: [(
                c.default_tenant.clone(),
                NetworkPolicy {
                    allow: vec![format!("127.0.0.1:{}", server.port)],
                    deny: vec![],
                },
            )]
            .into(),
            ca_bundle: DEFAULT_CA_BUNDLE.into(),
            // The proxy itself, not the default per-kernel cap of 50 MiB/s.
            limits: kernelbox::egress::proxy::Limits {
                bytes_per_second: 1 << 40,
                ..Default::default()
            },
            audit: None,
            credentials: None,
        });
        let kb = Orchestrator::start(c, self.engine.clone()).await?;
        let measured = self.egress_rows(&kb, server.port).await;
        kb.shutdown().await;
        measured
    }

    async fn egress_rows(&mut self, kb: &Orchestrator, port: u16) -> Result<()> {
        // A policy kernel's first cell: never from the pool (docs/reliability.md).
        let mut firsts = Vec::new();
        for i in 0..self.sizes.cold.min(10) {
            let session = format!("egress-cold-{i}");
            let t = Instant::now();
            let r = kb.execute(ExecuteRequest::new(&session, "x = 1")).await?;
            firsts.push(ms(t.elapsed()));
            ok_cell("policy kernel's first cell", &r)?;
            kb.clear_session(None, &session).await;
        }
        let first = stats(&firsts);
        self.rows.push(
            Row::new(
                format!(
                    "first cell of a kernel with a network policy (n={})",
                    firsts.len()
                ),
                pq(&first),
            )
            .floor(
                format!("plain cold first cell p50 {}", fmt_ms(self.cold_p50)),
                first.p50_ms / self.cold_p50,
            ),
        );

        let r = kb
            .execute(ExecuteRequest::new(
                "egress-client",
                client("127.0.0.1", port),
            ))
            .await?;
        ok_cell("the proxied client", &r)?;
        let proxied = last_json(&r.output, "from the proxied client")?;
        kb.clear_session(None, "egress-client").await;

        let gateway = bridge_gateway().await?;
        let out = Command::new("docker")
            .args(["run", "--rm", "--network", "bridge", "--label"])
            .arg(format!("{CASE}={}", self.label))
            .args([IMAGE, "python3", "-c", &client(&gateway, port)])
            .kill_on_drop(true)
            .output()
            .await
            .context("docker run of the direct client")?;
        if !out.status.success() {
            bail!(
                "the direct client failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let direct = last_json(
            &String::from_utf8_lossy(&out.stdout),
            "from the direct client",
        )?;

        let times = |v: &Value| -> Vec<f64> {
            v["ms"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_f64).collect())
                .unwrap_or_default()
        };
        let (p, d) = (stats(&times(&proxied)), stats(&times(&direct)));
        self.rows.push(
            Row::new(
                format!("HTTPS request, new connection, through the egress proxy (n={REQUESTS})"),
                pq(&p),
            )
            .floor(
                format!("direct from a bridge container: {}", pq(&d)),
                p.p50_ms / d.p50_ms,
            ),
        );
        let (pt, dt) = (
            proxied["mib_per_s"].as_f64().unwrap_or(f64::NAN),
            direct["mib_per_s"].as_f64().unwrap_or(f64::NAN),
        );
        self.rows.push(
            Row::new(
                format!("{DOWNLOAD_MIB} MiB HTTPS download through the egress proxy"),
                format!("{pt:.0} MiB/s"),
            )
            .floor(
                format!("direct from a bridge container: {dt:.0} MiB/s"),
                dt / pt,
            ),
        );
        self.notes.push(format!(
            "egress: an HTTPS request on a new connection took p50 {} through the proxy \
             (CONNECT, the ClientHello's check, the upstream connect) and {} direct from a \
             container on the default bridge (a difference below zero is this host's noise); \
             the download ran with the per-kernel rate cap lifted (its default is 50 MiB/s, \
             `--egress-rate`)",
            fmt_ms(p.p50_ms),
            fmt_ms(d.p50_ms)
        ));
        self.details.insert(
            "egress".into(),
            json!({"proxied": proxied, "direct": direct, "policy_first_cell_ms": firsts}),
        );
        Ok(())
    }
}
