//! The cluster under test (docs/cluster.md, "Architecture in words"): a fresh PostgreSQL
//! database, three `kernelbox serve` nodes on loopback (each its own `--state-dir` and
//! `--node-name`, one tenant, the admin token, short leases, labelled with the case label,
//! no warm pool so that every kernel carries its session's labels), and optionally HAProxy
//! in front hashing on `/v1/sessions/{session}` with health checks on `/healthz`. Everything
//! is stopped when the test ends, on panic too ([`Drop`]), and [`Cluster::finish`] asserts
//! through the Docker API that nothing with the case label is left.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tokio::io::AsyncBufReadExt;

use kernelbox::docker::{ContainerInfo, Engine};
use kernelbox::labels;

use crate::common;
use crate::http::{self, Api, Reply};
use crate::postgres;

/// The tenant every test calls as, and its token.
pub const TENANT: &str = "acme";
pub const TOKEN: &str = "cluster-tenant-token";
/// The cluster's admin token (`--admin-token`).
pub const ADMIN: &str = "cluster-admin-token";
/// The header a forwarded request carries (docs/cluster.md, "Routing": one hop at most).
pub const FORWARDED: &str = "x-kernelbox-forwarded-by";
/// The header carrying the cluster's hop secret.
pub const HOP: &str = "x-kernelbox-hop";
/// The header HAProxy adds to each response: the server (node name) it sent the request to.
pub const SERVED_BY: &str = "x-kernelbox-balancer-server";

/// How long a node may take to start serving, a server to come up or go down in HAProxy's
/// eyes, a kernel to be removed: generous, the machine is shared.
pub const SLOW: Duration = Duration::from_secs(60);

/// Clusters run one at a time in this binary: leases of 3 s on a shared 2-core machine
/// must not be starved by another test's nine kernels starting.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// What a test's cluster looks like.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--lease-ttl`.
    pub lease_ttl: &'static str,
    /// `--fence-margin`.
    pub fence_margin: &'static str,
    /// The tenant's `max_kernels` in the tenants file (its cap across the cluster).
    pub tenant_cap: Option<u64>,
    /// HAProxy in front.
    pub balancer: bool,
    /// Each node's `--max-kernels` (its host's cap), if set.
    pub max_kernels: Option<&'static str>,
    /// More tenants in the tenants file: (name, token), no cap.
    pub more_tenants: &'static [(&'static str, &'static str)],
    /// `--drain-deadline`.
    pub drain_deadline: Option<&'static str>,
    /// `--otlp-endpoint` (traces: docs/usage.md, "Traces").
    pub otlp_endpoint: Option<String>,
    /// The tenant has workspaces (docs/workspaces.md; each node's in its state directory).
    pub workspaces: bool,
    /// The tenant's `network` in the tenants file (docs/reliability.md, "Network egress").
    pub network: Option<Value>,
    /// The tenant's workspace `max` (with `workspaces`), if set.
    pub workspace_max: Option<u64>,
    /// `--runtime` (runsc: kernels a drain migrates, docs/cluster.md "Migration on drain").
    pub runtime: Option<&'static str>,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            lease_ttl: "3s",
            fence_margin: "1s",
            tenant_cap: None,
            balancer: false,
            max_kernels: None,
            more_tenants: &[],
            drain_deadline: None,
            otlp_endpoint: None,
            workspaces: false,
            network: None,
            workspace_max: None,
            runtime: None,
        }
    }
}

/// One `kernelbox serve` node.
pub struct Node {
    pub name: String,
    pub addr: SocketAddr,
    pub api: Api,
    /// Its orchestrator's instance id (`io.kernelbox.instance` on its kernels).
    pub instance: String,
    /// `None` once it has exited.
    process: Option<tokio::process::Child>,
    state: PathBuf,
    log: Arc<Mutex<VecDeque<String>>>,
}

/// Lines of a node's stderr kept for a failure's message.
const LOG_LINES: usize = 200;

impl Node {
    /// Its process id (it must be running).
    pub fn pid(&self) -> u32 {
        self.process
            .as_ref()
            .and_then(|p| p.id())
            .unwrap_or_else(|| panic!("node {} is not running", self.name))
    }

    /// Sends `signal` (`STOP`, `CONT`, ...) to the node's process.
    pub async fn signal(&self, signal: &str) {
        let pid = self.pid().to_string();
        let status = tokio::process::Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(&pid)
            .status()
            .await
            .expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Its state directory (`--state-dir`).
    pub fn state_dir(&self) -> &std::path::Path {
        &self.state
    }

    /// The last lines the node wrote on stderr.
    pub fn log(&self) -> String {
        let log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        log.iter().cloned().collect::<Vec<_>>().join("\n")
    }

    /// The tenant's kernels on this node (`GET /v1/kernels` is answered by the node itself).
    pub async fn kernels(&self) -> Vec<Value> {
        self.api.kernels(TOKEN).await
    }

    /// The sessions with a kernel on this node.
    pub async fn sessions(&self) -> Vec<String> {
        self.kernels()
            .await
            .iter()
            .filter_map(|k| k["session"].as_str().map(str::to_string))
            .collect()
    }

    /// `GET /healthz`: its status and the epoch it reports.
    pub async fn health(&self) -> (hyper::StatusCode, Option<i64>) {
        let reply = self.api.get("/healthz", None).await;
        let epoch = serde_json::from_slice::<Value>(&reply.body)
            .ok()
            .and_then(|v| v["epoch"].as_i64());
        (reply.status, epoch)
    }

    /// An execute of `code` for `session` carrying the forwarded header, as if another node
    /// had forwarded it.
    /// An execute marked as forwarded by a node: with the cluster's hop secret when given
    /// (as a node sends it), else only the forwarded-by header (as a client could forge it).
    pub async fn execute_forwarded(&self, session: &str, code: &str, hop: Option<&str>) -> Reply {
        let body = bytes::Bytes::from(json!({ "code": code }).to_string());
        let request = self
            .api
            .build(
                hyper::Method::POST,
                &format!("/v1/sessions/{session}/execute"),
                Some(TOKEN),
                false,
                true,
            )
            .header(FORWARDED, "someone");
        let request = match hop {
            Some(secret) => request.header(HOP, secret),
            None => request,
        };
        let request = request
            .body(http_body_util::Full::new(body))
            .expect("request");
        Reply::read(self.api.http.request(request).await.expect("HTTP request")).await
    }
}

/// HAProxy in front of the nodes.
pub struct Balancer {
    pub api: Api,
    stats: Api,
    process: tokio::process::Child,
}

impl Balancer {
    /// Each server's state as HAProxy's statistics say (`UP`, `DOWN`, `UP 1/2`, ...).
    pub async fn servers(&self) -> Vec<(String, String)> {
        let reply = self.stats.get("/stats;csv", None).await;
        assert_eq!(reply.status, hyper::StatusCode::OK, "HAProxy's statistics");
        let text = String::from_utf8_lossy(&reply.body).to_string();
        let mut lines = text.lines();
        let header: Vec<&str> = lines
            .next()
            .expect("the CSV header")
            .trim_start_matches("# ")
            .split(',')
            .collect();
        let column = |name: &str| {
            header
                .iter()
                .position(|h| *h == name)
                .unwrap_or_else(|| panic!("no {name} column in {header:?}"))
        };
        let (px, sv, status) = (column("pxname"), column("svname"), column("status"));
        lines
            .map(|l| l.split(',').collect::<Vec<_>>())
            .filter(|f| {
                f.get(px) == Some(&"nodes") && f.get(sv).is_some_and(|s| s.starts_with('n'))
            })
            .map(|f| (f[sv].to_string(), f[status].to_string()))
            .collect()
    }

    /// Waits until HAProxy sees `server` in `state` (`UP` or `DOWN`).
    pub async fn wait_server(&self, server: &str, state: &str) {
        poll(&format!("HAProxy sees {server} {state}"), SLOW, || async {
            self.servers()
                .await
                .iter()
                .any(|(s, st)| s == server && st == state)
                .then_some(())
        })
        .await
    }
}

/// A database, three nodes and maybe HAProxy, for one test.
pub struct Cluster {
    pub label: String,
    pub engine: Arc<dyn Engine>,
    pub db: String,
    pub nodes: Vec<Node>,
    pub balancer: Option<Balancer>,
    options: Options,
    dir: tempfile::TempDir,
    done: bool,
    _turn: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts the cluster `options` describe, its label made from `name`.
    pub async fn start(name: &str, options: Options) -> Cluster {
        let turn = ONE_AT_A_TIME.lock().await;
        let label = common::unique(name);
        let engine = common::engine().await;
        let db = postgres::fresh_database();
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut tenant = http::tenant(TENANT, TOKEN);
        if let Some(cap) = options.tenant_cap {
            tenant["max_kernels"] = json!(cap);
        }
        if options.workspaces {
            tenant["workspaces"] = json!({"quota": "16m", "ttl": "1h"});
            if let Some(max) = options.workspace_max {
                tenant["workspaces"]["max"] = json!(max);
            }
        }
        if let Some(network) = &options.network {
            tenant["network"] = network.clone();
        }
        let mut tenants = vec![tenant];
        for (name, token) in options.more_tenants {
            tenants.push(http::tenant(name, token));
        }
        std::fs::write(
            dir.path().join("tenants.json"),
            json!({ "tenants": tenants }).to_string(),
        )
        .expect("write the tenants file");
        let mut cluster = Cluster {
            label,
            engine,
            db,
            nodes: Vec::new(),
            balancer: None,
            options,
            dir,
            done: false,
            _turn: turn,
        };
        for i in 1..=3 {
            let name = format!("n{i}");
            let state = cluster.dir.path().join(format!("state-{name}"));
            let node = cluster.spawn(&name, "127.0.0.1:0", state).await;
            cluster.nodes.push(node);
        }
        if cluster.options.balancer {
            cluster.balancer = Some(cluster.start_balancer().await);
        }
        cluster
    }

    /// The tenants file every node serves (and reloads: docs/http-api.md, "Reloading the
    /// tenants").
    pub fn tenants_file(&self) -> PathBuf {
        self.dir.path().join("tenants.json")
    }

    /// Starts one node; returns once it serves.
    pub async fn spawn(&self, name: &str, listen: &str, state: PathBuf) -> Node {
        let mut command = serve_on(&self.label, listen);
        if let Some(max) = self.options.max_kernels {
            command.args(["--max-kernels", max]);
        }
        if let Some(runtime) = self.options.runtime {
            command.args(["--runtime", runtime]);
        }
        if self.options.workspaces {
            command.arg("--workspace-dir").arg(state.join("workspaces"));
        }
        let mut process = command
            .arg("--tenants")
            .arg(self.dir.path().join("tenants.json"))
            .args(["--cluster", &self.db, "--node-name", name])
            .arg("--state-dir")
            .arg(&state)
            .args(["--lease-ttl", self.options.lease_ttl])
            .args(["--fence-margin", self.options.fence_margin])
            .args(["--admin-token", ADMIN, "--pool", "0"])
            .args(["--max-unauthenticated-per-address", "0"])
            .args(
                self.options
                    .drain_deadline
                    .into_iter()
                    .flat_map(|d| ["--drain-deadline", d]),
            )
            .args(
                self.options
                    .otlp_endpoint
                    .iter()
                    .flat_map(|e| ["--otlp-endpoint", e.as_str()]),
            )
            .spawn()
            .expect("spawn kernelbox serve");
        let stderr = process.stderr.take().expect("stderr");
        let mut lines = tokio::io::BufReader::new(stderr).lines();
        let log = Arc::new(Mutex::new(VecDeque::new()));
        let keep = {
            let log = log.clone();
            let name = name.to_string();
            move |line: String| {
                if std::env::var_os("KERNELBOX_TEST_LOGS").is_some() {
                    eprintln!("[{name}] {line}");
                }
                let mut log = log.lock().unwrap_or_else(|p| p.into_inner());
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
            }
        };
        let serving = tokio::time::timeout(SLOW, async {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(line.clone());
                // "kernelbox: serving N tenant(s) on http://ADDR (instance ID)"
                if let Some(rest) = line.split(" on http://").nth(1) {
                    let mut words = rest.split_whitespace();
                    let addr: SocketAddr = words.next()?.parse().ok()?;
                    let instance = words
                        .find(|w| *w != "(instance")?
                        .trim_end_matches(')')
                        .to_string();
                    return Some((addr, instance));
                }
            }
            None
        })
        .await;
        let Ok(Some((addr, instance))) = serving else {
            let log = log.lock().unwrap_or_else(|p| p.into_inner());
            panic!(
                "node {name} did not serve within {SLOW:?}:\n{}",
                log.iter().cloned().collect::<Vec<_>>().join("\n")
            );
        };
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                keep(line);
            }
        });
        Node {
            name: name.to_string(),
            addr,
            api: Api::new(addr),
            instance,
            process: Some(process),
            state,
            log,
        }
    }

    /// HAProxy on a free port in front of the three nodes, hashing on the session's path
    /// (`/v1/sessions/{session}`, three levels), checking `/healthz` every second; returns
    /// once it sees every node up.
    async fn start_balancer(&self) -> Balancer {
        let port = free_port();
        let stats_port = free_port();
        let servers: String = self
            .nodes
            .iter()
            .map(|n| format!("    server {} {} check\n", n.name, n.addr))
            .collect();
        let config = format!(
            "global\n    maxconn 512\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client 300s\n    \
             timeout server 300s\n    timeout http-keep-alive 60s\n\
             frontend front\n    bind 127.0.0.1:{port}\n    default_backend nodes\n\
             backend nodes\n    balance uri path-only depth 3\n    hash-type consistent\n    \
             option httpchk\n    http-check send meth GET uri /healthz\n    \
             http-check expect status 200\n    default-server inter 1s fall 2 rise 1\n    \
             http-response set-header {SERVED_BY} %[srv_name]\n{servers}\
             listen stats\n    bind 127.0.0.1:{stats_port}\n    stats enable\n    stats uri /stats\n"
        );
        let path = self.dir.path().join("haproxy.cfg");
        std::fs::write(&path, config).expect("write haproxy.cfg");
        let log = std::fs::File::create(self.dir.path().join("haproxy.log")).expect("log file");
        let process = tokio::process::Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&path)
            .stdout(log.try_clone().expect("log file"))
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .expect("spawn haproxy (apt-get install haproxy)");
        let balancer = Balancer {
            api: Api::new(SocketAddr::from(([127, 0, 0, 1], port))),
            stats: Api::new(SocketAddr::from(([127, 0, 0, 1], stats_port))),
            process,
        };
        poll("HAProxy's statistics answer", SLOW, || async {
            tokio::net::TcpStream::connect(("127.0.0.1", stats_port))
                .await
                .ok()
                .map(|_| ())
        })
        .await;
        for node in &self.nodes {
            balancer.wait_server(&node.name, "UP").await;
        }
        balancer
    }

    /// The balancer (the cluster must have one).
    pub fn balancer(&self) -> &Balancer {
        self.balancer.as_ref().expect("a cluster with a balancer")
    }

    /// The index of the node named `name`.
    pub fn index(&self, name: &str) -> usize {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// The running node holding a kernel of `session`, if any.
    /// Kernels the catalog holds live (what the nodes' fair shares count).
    pub async fn catalog_live_kernels(&self) -> i64 {
        postgres::raw(&self.db)
            .await
            .query_one("SELECT count(*) FROM kb_kernels WHERE state = 'live'", &[])
            .await
            .expect("live kernels")
            .get(0)
    }

    /// The cluster's hop secret, read from the catalog (what only nodes know).
    pub async fn hop_secret(&self) -> String {
        postgres::raw(&self.db)
            .await
            .query_one("SELECT hop_secret FROM kb_cluster WHERE id = 1", &[])
            .await
            .expect("the hop secret")
            .get(0)
    }

    /// The node the catalog places `session` on (live or not), if it has a row.
    pub async fn catalog_node(&self, session: &str) -> Option<String> {
        postgres::raw(&self.db)
            .await
            .query_opt(
                "SELECT node FROM kb_sessions WHERE tenant = $1 AND session = $2",
                &[&TENANT, &session],
            )
            .await
            .expect("the session's row")
            .map(|row| row.get(0))
    }

    pub async fn holder(&self, session: &str) -> Option<usize> {
        for (i, node) in self.nodes.iter().enumerate() {
            if node.process.is_some() && node.sessions().await.iter().any(|s| s == session) {
                return Some(i);
            }
        }
        None
    }

    /// This test's containers, as Docker sees them.
    pub async fn containers(&self) -> Vec<ContainerInfo> {
        common::containers(&self.engine, &self.label).await
    }

    /// This test's containers of `session`.
    pub async fn session_containers(&self, session: &str) -> Vec<ContainerInfo> {
        self.containers()
            .await
            .into_iter()
            .filter(|c| c.labels.get(labels::SESSION).map(String::as_str) == Some(session))
            .collect()
    }

    /// This test's containers made by node `i`'s current run.
    pub async fn node_containers(&self, i: usize) -> Vec<ContainerInfo> {
        let instance = &self.nodes[i].instance;
        self.containers()
            .await
            .into_iter()
            .filter(|c| c.labels.get(labels::INSTANCE) == Some(instance))
            .collect()
    }

    /// `GET /v1/nodes` on node `i`, with the admin token: each node's row by name.
    pub async fn node_rows(&self, i: usize) -> Vec<Value> {
        let reply = self.nodes[i].api.get("/v1/nodes", Some(ADMIN)).await;
        assert_eq!(reply.status, hyper::StatusCode::OK, "{}", reply.json());
        reply.json()["nodes"].as_array().expect("nodes").clone()
    }

    /// `kill -9` of node `i`; returns when it is gone.
    pub async fn kill9(&mut self, i: usize) {
        let mut process = self.nodes[i].process.take().expect("a running node");
        process.kill().await.expect("SIGKILL");
    }

    /// SIGTERM to node `i` (it leaves the cluster gracefully); returns once it exited 0.
    pub async fn stop(&mut self, i: usize) {
        let mut process = self.nodes[i].process.take().expect("a running node");
        let status = common::terminate(&mut process, SLOW).await;
        assert!(
            status.success(),
            "node {} exited {status}",
            self.nodes[i].name
        );
    }

    /// Starts node `i` again: the same name, address and state directory.
    pub async fn restart(&mut self, i: usize) {
        assert!(self.nodes[i].process.is_none(), "node {i} still runs");
        let (name, addr, state) = {
            let n = &self.nodes[i];
            (n.name.clone(), n.addr.to_string(), n.state.clone())
        };
        let node = self.spawn(&name, &addr, state).await;
        assert_eq!(node.addr.to_string(), addr, "the same address");
        self.nodes[i] = node;
    }

    /// Stops every node (SIGTERM: each removes its kernels) and HAProxy, then asserts that
    /// nothing with the case label is left in Docker (a node killed earlier has its kernels
    /// removed by its watchdog) and drops the database.
    pub async fn finish(mut self) {
        for i in 0..self.nodes.len() {
            if self.nodes[i].process.is_some() {
                self.stop(i).await;
            }
        }
        if let Some(mut balancer) = self.balancer.take() {
            let _ = balancer.process.kill().await;
        }
        let gone = common::wait_gone(&self.engine, &self.label, SLOW).await;
        assert!(
            gone.is_some(),
            "containers left: {:?}",
            self.containers().await
        );
        // Workspaces outlive their servers by design: the test deletes them.
        remove_workspaces(&self.label, self.dir.path());
        common::assert_clean(&self.engine, &self.label).await;
        postgres::drop_database(&self.db);
        self.done = true;
    }
}

impl Drop for Cluster {
    /// On a panic: every process killed, whatever has the case label removed, the database
    /// dropped (each best effort: the panic is what the test reports).
    fn drop(&mut self) {
        if self.done {
            return;
        }
        for node in &mut self.nodes {
            if let Some(p) = node.process.as_mut() {
                let _ = p.start_kill();
            }
            if std::thread::panicking() {
                eprintln!("--- node {} (last lines) ---\n{}", node.name, node.log());
            }
        }
        if let Some(b) = self.balancer.as_mut() {
            let _ = b.process.start_kill();
        }
        let label = self.label.clone();
        remove_workspaces(&label, self.dir.path());
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            rt.block_on(async {
                let Ok(engine) = kernelbox::BollardEngine::connect().await else {
                    return;
                };
                let filter = [format!("{}={label}", common::CASE)];
                if let Ok(cs) = engine.list_containers(&filter).await {
                    for c in cs {
                        let _ = engine.remove_container(&c.id).await;
                    }
                }
                if let Ok(vs) = engine.list_volumes(&filter, false).await {
                    for v in vs {
                        let _ = kernelbox::docker::remove_volume_when_free(&engine, &v.name).await;
                    }
                }
            })
        })
        .join();
        let db = self.db.clone();
        let _ = std::panic::catch_unwind(|| postgres::drop_database(&db));
    }
}

/// Removes the workspaces the nodes left (docs/workspaces.md: they outlive their servers):
/// the volumes labelled `label`, then the loop devices of the disk images under `dir` (each
/// node's state directory's `workspaces`); the images go with `dir`.
fn remove_workspaces(label: &str, dir: &std::path::Path) {
    let run = |args: &[&str]| {
        std::process::Command::new(args[0])
            .args(&args[1..])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    let filter = format!("label={}={label}", common::CASE);
    let role = "label=io.kernelbox.role=workspace";
    let volumes = run(&[
        "docker", "volume", "ls", "-q", "--filter", &filter, "--filter", role,
    ]);
    for v in volumes.split_whitespace() {
        run(&["docker", "volume", "rm", v]);
    }
    for state in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let images = state.path().join("workspaces");
        for image in std::fs::read_dir(images).into_iter().flatten().flatten() {
            let image = image.path().to_string_lossy().into_owned();
            for line in run(&["losetup", "-j", &image]).lines() {
                if let Some((dev, _)) = line.split_once(':') {
                    run(&["losetup", "-d", dev]);
                }
            }
        }
    }
}

/// `kernelbox serve` as `common::serve_command` makes it (labelled, stderr piped, killed
/// when dropped), but listening on `listen`: a node restarts on its address, the one
/// HAProxy's config names (`--listen` may be given once).
fn serve_on(label: &str, listen: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kernelbox"));
    cmd.args(["serve", "--listen", listen, "--label"])
        .arg(format!("{}={label}", common::CASE))
        .env_remove("KERNELBOX_TOKEN")
        .env_remove("KERNELBOX_TENANTS")
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// A free loopback port (bound and released: HAProxy's config needs it before it starts).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// Polls `check` (every 100 ms) until it gives a value; panics naming `what` past `limit`.
pub async fn poll<T, F, Fut>(what: &str, limit: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(value) = check().await {
            return value;
        }
        assert!(start.elapsed() < limit, "{what}: not within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A successful execute's result (status 200, `success`).
pub fn success(reply: &Reply) -> Value {
    let result = reply.json();
    assert_eq!(reply.status, hyper::StatusCode::OK, "{result}");
    assert_eq!(result["status"], "success", "{result}");
    result
}

/// The kernel id a result names.
pub fn kernel_id(result: &Value) -> String {
    result["kernel"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no kernel id in {result}"))
        .to_string()
}

/// The kernel generation a result names.
pub fn generation(result: &Value) -> u64 {
    result["kernel"]["generation"]
        .as_u64()
        .unwrap_or_else(|| panic!("no generation in {result}"))
}

/// The reason of the loss a result reports, if any (`kernel.state_lost.reason`).
pub fn lost(result: &Value) -> Option<String> {
    result["kernel"]["state_lost"]["reason"]
        .as_str()
        .map(str::to_string)
}

/// The node HAProxy sent a request to.
pub fn served_by(reply: &Reply) -> String {
    reply
        .headers
        .get(SERVED_BY)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_else(|| panic!("no {SERVED_BY} header"))
        .to_string()
}
