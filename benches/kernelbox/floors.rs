//! The floors: what the engine allows on the same machine, measured with the kernel image and a
//! kernel's sandbox. A line echoed by python3 through a docker attach ([`EchoFloor`], for warm
//! cells), one `docker run --rm IMAGE python3 -c pass` ([`docker_run_once`], for cold starts),
//! idle `sleep` containers ([`container_floor`], for memory per kernel and, removed with
//! `docker rm -f`, for a shutdown), and `docker run -d` of such containers
//! ([`docker_run_detached`], for the start rate at a live count).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use kernelbox::docker::{Chunk, ContainerSpec};
use kernelbox::{Engine, Sandbox};
use serde_json::{json, Map, Value};
use tokio::io::AsyncWriteExt;
use tokio::process::Command;

use crate::events::Window;
use crate::host::{container_processes, ContainerProcess, HostMemory, MIB};
use crate::phases::DENSITY_CONCURRENCY;
use crate::stats::ms;
use crate::{CASE, IMAGE};

/// A floor container: the kernel image and a kernel's sandbox, running `cmd` instead of the
/// runner, labelled with the run's case label.
fn floor_spec(label: &str, cmd: &[&str]) -> ContainerSpec {
    ContainerSpec {
        image: IMAGE.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        env: Vec::new(),
        user: Sandbox::default().user,
        working_dir: "/".into(),
        labels: BTreeMap::from([(CASE.to_string(), label.to_string())]),
        mounts: Vec::new(),
        sandbox: Sandbox::default(),
    }
}

/// `docker run -d` of the floor container of `cmd`: [`floor_spec`]'s image, user, working
/// directory, labels and sandbox as the CLI's flags (what `BollardEngine::create_container`
/// asks of the engine: open stdin, auto-removal, init, no log driver).
fn floor_run_args(label: &str, cmd: &[&str]) -> Vec<String> {
    let spec = floor_spec(label, cmd);
    let s = &spec.sandbox;
    let mut args: Vec<String> = ["run", "-d", "-i", "--rm", "--init"]
        .map(String::from)
        .to_vec();
    let mut flag = |name: &str, value: String| {
        args.push(name.to_string());
        args.push(value);
    };
    flag("--runtime", s.runtime.name().into());
    flag("--network", s.network_mode.clone());
    flag("--cap-drop", "ALL".into());
    flag("--security-opt", "no-new-privileges".into());
    flag("--tmpfs", format!("/tmp:{}", s.tmp_mount_options()));
    flag("--memory", s.memory_bytes.to_string());
    flag("--memory-swap", s.memory_bytes.to_string());
    flag("--cpus", format!("{}", s.nano_cpus as f64 / 1e9));
    flag("--pids-limit", s.pids_limit.to_string());
    flag("--log-driver", "none".into());
    flag("--user", spec.user.clone());
    flag("--workdir", spec.working_dir.clone());
    for (k, v) in &spec.labels {
        flag("--label", format!("{k}={v}"));
    }
    if s.readonly_rootfs {
        args.push("--read-only".into());
    }
    args.push(spec.image.clone());
    args.extend(spec.cmd.iter().cloned());
    args
}

/// Starts `n` idle `sleep` floor containers with `docker run -d` (the CLI), `concurrency` at a
/// time; returns the wall time and their ids. The caller removes them ([`docker_rm_f`]); on an
/// error those started are removed here.
pub async fn docker_run_detached(
    engine: &Arc<dyn Engine>,
    label: &str,
    n: usize,
    concurrency: usize,
) -> Result<(Duration, Vec<String>)> {
    let args = floor_run_args(label, &["sleep", "infinity"]);
    let t = Instant::now();
    let started: Vec<Result<String>> = futures::stream::iter(0..n)
        .map(|_| {
            let args = args.clone();
            async move {
                let out = Command::new("docker")
                    .args(&args)
                    .kill_on_drop(true)
                    .output()
                    .await
                    .context("spawning docker")?;
                if !out.status.success() {
                    bail!(
                        "docker run -d failed: {}",
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
            }
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let wall = t.elapsed();
    let ids: Vec<String> = started
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    if let Some(Err(e)) = started.into_iter().find(Result::is_err) {
        let _ = docker_rm_f(engine, label, &ids).await;
        return Err(e.context("starting the docker run -d floor containers"));
    }
    Ok((wall, ids))
}

/// Removes containers with one `docker rm -f ID...` (the CLI removes them in parallel) and
/// waits until the engine lists none of them; returns the wall time of both. A container whose
/// auto-removal the kill set off may be reported as already being removed: that is waited for.
pub async fn docker_rm_f(
    engine: &Arc<dyn Engine>,
    label: &str,
    ids: &[String],
) -> Result<Duration> {
    let t = Instant::now();
    if ids.is_empty() {
        return Ok(t.elapsed());
    }
    let out = Command::new("docker")
        .args(["rm", "-f"])
        .args(ids)
        .kill_on_drop(true)
        .output()
        .await
        .context("spawning docker")?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let unexpected = stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .any(|l| !l.contains("already in progress") && !l.contains("No such container"));
        if unexpected {
            bail!("docker rm -f failed: {stderr}");
        }
    }
    let filter = [format!("{CASE}={label}")];
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = engine.list_containers(&filter).await?;
        if !listed.iter().any(|c| ids.contains(&c.id)) {
            return Ok(t.elapsed());
        }
        if Instant::now() > deadline {
            bail!("docker rm -f: containers still listed after 60 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The floor of a warm round trip: one line echoed by python3 through a docker attach, in a
/// container created through the same [`Engine`] with the same sandbox as a kernel's (limits,
/// read-only root, no network, no log driver), so only kernelbox's own work differs.
pub struct EchoFloor {
    engine: Arc<dyn Engine>,
    id: String,
    output: futures::stream::BoxStream<'static, Result<Chunk, kernelbox::EngineError>>,
    input: std::pin::Pin<Box<dyn tokio::io::AsyncWrite + Send>>,
    buf: Vec<u8>,
}

impl EchoFloor {
    pub async fn start(engine: &Arc<dyn Engine>, label: &str) -> Result<EchoFloor> {
        let script = "import sys\nfor l in sys.stdin: sys.stdout.write(l); sys.stdout.flush()";
        let spec = floor_spec(label, &["python3", "-u", "-c", script]);
        let id = engine
            .create_container(&spec)
            .await
            .context("creating the attach floor container")?;
        let started = async {
            let attached = engine.attach(&id).await?;
            engine.start(&id).await?;
            Ok::<_, anyhow::Error>(attached)
        }
        .await;
        let attached = match started {
            Ok(a) => a,
            Err(e) => {
                let _ = engine.remove_container(&id).await;
                return Err(e);
            }
        };
        let mut floor = EchoFloor {
            engine: engine.clone(),
            id,
            output: attached.output,
            input: attached.input,
            buf: Vec::new(),
        };
        for _ in 0..20 {
            floor.sample().await?;
        }
        Ok(floor)
    }

    /// One echo round trip, in milliseconds.
    pub async fn sample(&mut self) -> Result<f64> {
        let t = Instant::now();
        self.input.write_all(b"ping\n").await?;
        self.input.flush().await?;
        let (buf, output) = (&mut self.buf, &mut self.output);
        let echoed = async {
            loop {
                if let Some(pos) = buf.iter().position(|&b| b == b'\n') {
                    buf.drain(..=pos);
                    return Ok(());
                }
                match output.next().await {
                    Some(Ok(Chunk::Stdout(message))) => buf.extend_from_slice(&message),
                    Some(Ok(Chunk::Stderr(message))) => {
                        bail!("echo container: {}", String::from_utf8_lossy(&message))
                    }
                    Some(Err(e)) => return Err(e.into()),
                    None => bail!("echo container's attach stream ended"),
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(30), echoed)
            .await
            .context("echo timed out")??;
        Ok(ms(t.elapsed()))
    }

    pub async fn stop(self) {
        let _ = self.engine.remove_container(&self.id).await;
    }
}

/// One `docker run --rm IMAGE python3 -c pass` through the CLI.
pub async fn docker_run_once(label: &str) -> Result<Window> {
    let w = Window::begin();
    let out = Command::new("docker")
        .args(["run", "--rm", "--label", &format!("{CASE}={label}"), IMAGE])
        .args(["python3", "-c", "pass"])
        .kill_on_drop(true)
        .output()
        .await
        .context("spawning docker")?;
    let w = w.end();
    if !out.status.success() {
        bail!(
            "docker run failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(w)
}

/// The engine's own cost of an idle container, for the density floor.
pub struct ContainerFloor {
    pub per_container_mib: f64,
    /// Per helper kind, its PSS growth per container in MiB.
    pub helpers: Value,
    /// Removing them all with `docker rm -f` ([`docker_rm_f`]): the shutdown's floor.
    pub removal: Duration,
    /// One of them, process by process.
    pub processes: Vec<ContainerProcess>,
}

/// Starts `n` containers that only sleep, with a kernel's sandbox (init, limits, read-only
/// root, no network) through the same [`Engine`], and measures host memory as for kernels:
/// what any container costs on this host before kernelbox runs Python in it. Then times their
/// removal with `docker rm -f`.
pub async fn container_floor(
    engine: &Arc<dyn Engine>,
    label: &str,
    n: usize,
) -> Result<ContainerFloor> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = HostMemory::take().await?;
    let spec = floor_spec(label, &["sleep", "infinity"]);
    let started: Vec<Result<String>> = futures::stream::iter(0..n)
        .map(|_| async {
            let id = engine.create_container(&spec).await?;
            engine.start(&id).await?;
            Ok(id)
        })
        .buffer_unordered(DENSITY_CONCURRENCY)
        .collect()
        .await;
    let ids: Vec<String> = started
        .iter()
        .filter_map(|r| r.as_ref().ok().cloned())
        .collect();
    let measured = async {
        if let Some(Err(e)) = started.into_iter().find(Result::is_err) {
            return Err(e.context("starting the density floor containers"));
        }
        // Let them settle into idle before reading memory, as the kernels do.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let after = HostMemory::take().await?;
        let helpers: Map<String, Value> = after
            .helpers_since(&before)
            .into_iter()
            .map(|h| {
                let per = h.pss_delta_bytes as f64 / n as f64 / MIB;
                (h.kind.to_string(), json!(per))
            })
            .collect();
        let processes = match ids.first() {
            Some(id) => container_processes(id).await,
            None => Vec::new(),
        };
        Ok((after.mib_per(&before, n), Value::Object(helpers), processes))
    }
    .await;
    let removal = docker_rm_f(engine, label, &ids).await;
    // Whatever the CLI left (after an error) goes through the engine.
    futures::stream::iter(ids.clone())
        .for_each_concurrent(kernelbox::docker::REMOVAL_CONCURRENCY, |id| async move {
            let _ = engine.remove_container(&id).await;
        })
        .await;
    let (per_container_mib, helpers, processes) = measured?;
    Ok(ContainerFloor {
        per_container_mib,
        helpers,
        removal: removal?,
        processes,
    })
}
