//! Density: N idle kernels, started a few at a time; their start time, the start rate at 50,
//! 250, 500 and 1000 live kernels against `docker run -d` at the same live count, the host
//! memory each costs against an idle container with the same sandbox, their cgroup memory, the
//! helper processes the engine adds, kernelbox's own RSS, and the shutdown that removes them
//! against `docker rm -f`.

use std::ops::Range;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use kernelbox::docker::REMOVAL_CONCURRENCY;
use kernelbox::ExecuteRequest;
use serde_json::{json, Map, Value};

use super::{ok_cell, Bench, DENSITY_CONCURRENCY, RATE_WINDOW};
use crate::floors::{container_floor, docker_rm_f, docker_run_detached};
use crate::host::{
    cgroup_memory, container_processes, describe_processes, vm_rss_bytes, HostMemory, MIB,
};
use crate::report::Row;
use crate::stats::{ms, pq, stats};
use crate::CASE;

/// Containers in the density floor (at most; fewer when fewer kernels are measured).
const DENSITY_FLOOR_MAX: usize = 200;

/// Live kernel counts at which the start rate is measured (those up to N).
const RATE_AT: [usize; 4] = [50, 250, 500, 1000];

/// Let the engine finish with removed containers before the next measurement.
const RATE_SETTLE: Duration = Duration::from_secs(2);

/// The start rate at one live count: kernelbox's window and `docker run -d`'s.
struct RatePoint {
    live: usize,
    kernelbox: Duration,
    docker_run: Duration,
    /// Removing the window's kernels (their sessions cleared, as many at a time as a
    /// shutdown removes) and the window's `docker run -d` containers (`docker rm -f`).
    kernelbox_removal: Duration,
    docker_rm: Duration,
}

impl RatePoint {
    fn kernels_per_s(&self) -> f64 {
        RATE_WINDOW as f64 / self.kernelbox.as_secs_f64()
    }
    fn docker_per_s(&self) -> f64 {
        RATE_WINDOW as f64 / self.docker_run.as_secs_f64()
    }
}

impl Bench {
    /// Phase 6: density, N idle kernels.
    pub async fn density(&mut self) -> Result<()> {
        let n = self.args.density;
        for s in ["warm", "tools"] {
            self.kb.clear_session(None, s).await;
        }
        for o in 0..self.sizes.owners {
            self.kb.clear_session(None, &format!("tp-{o}")).await;
        }
        let leftover = self.kb.list_kernels(None).len();
        if leftover != 0 {
            bail!("{leftover} kernels still live before the density phase");
        }
        let floor_n = n.min(DENSITY_FLOOR_MAX);
        let floor = container_floor(&self.engine, &self.label, floor_n).await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mem0 = HostMemory::take().await?;
        let rss0 = vm_rss_bytes()?;
        // The ramp to N, paused at each live count of the curve to measure the start rate
        // there; its wall time leaves the pauses out.
        let mut start_wall = Duration::ZERO;
        let mut lat: Vec<f64> = Vec::with_capacity(n);
        let mut curve = Vec::new();
        let mut started = 0;
        for live in RATE_AT.into_iter().filter(|&l| l <= n).chain([n]) {
            if live > started {
                let (wall, mut l) = self.start_idle("dense", started..live).await?;
                start_wall += wall;
                lat.append(&mut l);
                started = live;
            }
            if RATE_AT.contains(&live) && curve.last().is_none_or(|p: &RatePoint| p.live != live) {
                eprintln!("[bench] density: start rate at {live} live kernels");
                curve.push(self.start_rate_at(live).await?);
            }
        }
        let live = self.kb.list_kernels(None).len();
        let containers = self
            .engine
            .list_containers(&[format!("{CASE}={}", self.label)])
            .await?;
        let running = containers.iter().filter(|c| c.state == "running").count();
        if live != n || running != n {
            bail!("expected {n} live kernels, registry has {live}, docker runs {running}");
        }
        // Let the kernels settle into idle before reading memory.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mem1 = HostMemory::take().await?;
        let rss1 = vm_rss_bytes()?;
        let kernel_processes = match containers.first() {
            Some(c) => container_processes(&c.id).await,
            None => Vec::new(),
        };
        let mut helper_rows = Vec::new();
        let mut helper_json = Map::new();
        let mut fuse_per = None;
        for h in mem1.helpers_since(&mem0) {
            if h.kind == "fuse-overlayfs" {
                fuse_per = Some(h.pss_delta_bytes as f64 / n as f64 / MIB);
            }
            let per = h.pss_delta_bytes as f64 / n as f64 / MIB;
            helper_rows.push(if h.processes_added > 0 {
                format!("{} {per:.2} MiB (+{} processes)", h.kind, h.processes_added)
            } else {
                format!("{} {per:.2} MiB", h.kind)
            });
            helper_json.insert(
                h.kind.to_string(),
                json!({"processes_added": h.processes_added, "pss_delta_bytes": h.pss_delta_bytes}),
            );
        }
        let mut cg_usage = 0u64;
        let mut cg_anon = 0u64;
        let mut cg_found = 0usize;
        for c in &containers {
            if let Some((usage, anon)) = cgroup_memory(&c.id) {
                cg_usage += usage;
                cg_anon += anon;
                cg_found += 1;
            }
        }
        let per_kernel = mem1.mib_per(&mem0, n);
        let lat_s = stats(&lat);
        let rate = n as f64 / start_wall.as_secs_f64();
        self.rows.push(Row::new(
            format!("start {n} idle kernels ({DENSITY_CONCURRENCY} at a time)"),
            format!(
                "{:.1} s ({rate:.1} kernels/s); per kernel {}",
                start_wall.as_secs_f64(),
                pq(&lat_s)
            ),
        ));
        for p in &curve {
            let (kb_rate, docker_rate) = (p.kernels_per_s(), p.docker_per_s());
            let mut row = Row::new(
                format!(
                    "start rate at {} live kernels (next {RATE_WINDOW} starts, \
                     {DENSITY_CONCURRENCY} at a time; ratio = time per start ÷ \
                     `docker run -d`'s)",
                    p.live
                ),
                format!("{kb_rate:.1} kernels/s"),
            )
            .floor(
                format!("`docker run -d` at {} live: {docker_rate:.1}/s", p.live),
                docker_rate / kb_rate,
            );
            if p.live == 1000 {
                row = row.target(
                    "≥ 1.5x `docker run -d`'s rate (ratio ≤ 0.67x)",
                    kb_rate >= 1.5 * docker_rate,
                );
            }
            self.rows.push(row);
        }
        let mut row = Row::new(
            format!("host memory per idle kernel (`free -b` used delta / {n})"),
            format!("{per_kernel:.1} MiB"),
        )
        .target("≤ 8 MiB", per_kernel <= 8.0);
        // With a handful of containers the host's noise can outweigh them: no ratio then.
        if floor.per_container_mib > 0.5 {
            row = row.floor(
                format!(
                    "idle `sleep` container, same sandbox ({floor_n}): {:.1} MiB",
                    floor.per_container_mib
                ),
                per_kernel / floor.per_container_mib,
            );
        }
        self.rows.push(row);
        if cg_found > 0 {
            self.rows.push(Row::new(
                format!("container cgroup memory per kernel (mean of {cg_found})"),
                format!(
                    "{:.1} MiB charged ({:.1} MiB anon)",
                    cg_usage as f64 / cg_found as f64 / MIB,
                    cg_anon as f64 / cg_found as f64 / MIB
                ),
            ));
        }
        if !helper_rows.is_empty() {
            self.rows.push(Row::new(
                "host processes per kernel (PSS delta / N)",
                helper_rows.join("; "),
            ));
        }
        if !kernel_processes.is_empty() && !floor.processes.is_empty() {
            let anon = |ps: &[crate::host::ContainerProcess]| -> f64 {
                ps.iter().map(|p| p.anon_bytes as f64).sum::<f64>() / MIB
            };
            let (kernel_anon, floor_anon) = (anon(&kernel_processes), anon(&floor.processes));
            self.rows.push(
                Row::new(
                    "one idle kernel's processes (anonymous/PSS MiB; ratio of anonymous totals)",
                    format!(
                        "{}; anonymous {kernel_anon:.2} MiB",
                        describe_processes(&kernel_processes)
                    ),
                )
                .floor(
                    format!(
                        "idle `sleep` container: {}; anonymous {floor_anon:.2} MiB",
                        describe_processes(&floor.processes)
                    ),
                    kernel_anon / floor_anon,
                ),
            );
        }
        if let Some(fuse) = fuse_per {
            self.notes.push(format!(
                "overlay2: this engine stores containers with fuse-overlayfs, one process per \
                 container ({fuse:.2} MiB PSS per kernel here); on an overlay2 (in-kernel) \
                 engine that process is not there, so a kernel would cost about {:.1} MiB \
                 instead of {per_kernel:.1} (and the image's files mapped by each kernel \
                 would share one page cache, where fuse-overlayfs gives each container its own)",
                per_kernel - fuse
            ));
        }
        let slope = (rss1 as f64 - rss0 as f64).max(0.0) / n as f64;
        let at_1000 = rss1 as f64 + slope * 1000usize.saturating_sub(n) as f64;
        let rss_target = if n >= 1000 { rss1 as f64 } else { at_1000 };
        self.rows.push(
            Row::new(
                format!("kernelbox RSS with {n} kernels (VmRSS)"),
                format!(
                    "{:.1} MiB ({:.1} KiB per kernel; {:.1} MiB at 1000{})",
                    rss1 as f64 / MIB,
                    slope / 1024.0,
                    at_1000 / MIB,
                    if n >= 1000 { "" } else { " extrapolated" }
                ),
            )
            .target("< 150 MiB at 1000 kernels", rss_target < 150.0 * MIB),
        );
        // Shutdown at scale: the N kernels removed as `kernelbox serve` removes them on
        // SIGTERM. Density is the last phase on the bench's orchestrator (main.rs shuts it
        // down again after the phases, with nothing left to do then).
        eprintln!("[bench] density: shutdown with {n} kernels");
        let t = Instant::now();
        self.kb.shutdown().await;
        let shutdown = t.elapsed();
        let filter = [format!("{CASE}={}", self.label)];
        let left_containers = self.engine.list_containers(&filter).await?.len();
        let left_volumes = self.engine.list_volumes(&filter, false).await?.len();
        let rm_per = floor.removal.as_secs_f64() / floor_n as f64;
        let rm_equiv = rm_per * n as f64;
        let shutdown_target = 15.0 * n as f64 / 1000.0;
        self.rows.push(
            Row::new(
                format!("remove {n} idle kernels (shutdown)"),
                format!(
                    "{:.1} s ({:.1} ms per kernel)",
                    shutdown.as_secs_f64(),
                    shutdown.as_secs_f64() * 1000.0 / n as f64
                ),
            )
            .floor(
                format!(
                    "`docker rm -f` of {floor_n} idle `sleep` containers: {:.1} s, \
                     {:.1} ms each, {rm_equiv:.1} s for {n}",
                    floor.removal.as_secs_f64(),
                    rm_per * 1000.0
                ),
                shutdown.as_secs_f64() / rm_equiv,
            )
            .target(
                format!("≤ 15 s for 1000 kernels ({shutdown_target:.1} s for {n})"),
                shutdown.as_secs_f64() <= shutdown_target,
            ),
        );
        if let Some(last) = curve.last() {
            let each = |d: Duration| d.as_secs_f64() * 1000.0 / RATE_WINDOW as f64;
            let lives: Vec<String> = curve.iter().map(|p| p.live.to_string()).collect();
            let kb: Vec<String> = curve
                .iter()
                .map(|p| format!("{:.1}", each(p.kernelbox_removal)))
                .collect();
            let docker: Vec<String> = curve
                .iter()
                .map(|p| format!("{:.1}", each(p.docker_rm)))
                .collect();
            self.rows.push(
                Row::new(
                    format!(
                        "remove {RATE_WINDOW} idle kernels at {} live (sessions cleared, \
                         {REMOVAL_CONCURRENCY} at a time; ratio at {})",
                        lives.join("/"),
                        last.live
                    ),
                    format!("{} ms per kernel", kb.join(" / ")),
                )
                .floor(
                    format!(
                        "`docker rm -f` of the {RATE_WINDOW} `docker run -d` containers: {} ms each",
                        docker.join(" / ")
                    ),
                    last.kernelbox_removal.as_secs_f64() / last.docker_rm.as_secs_f64(),
                ),
            );
        }
        self.notes.push(format!(
            "start-rate curve: the ramp to {n} pauses at each live count of the curve; there \
             {RATE_WINDOW} idle `sleep` containers with a kernel's sandbox are started with \
             `docker run -d` (the CLI, {DENSITY_CONCURRENCY} at a time) and removed, then \
             {RATE_WINDOW} more kernels ({DENSITY_CONCURRENCY} at a time, each to the end of its \
             first cell) and removed; each rate is {RATE_WINDOW} over its window's wall time. \
             The start row's wall time leaves these pauses out. Shutdown: \
             Orchestrator::shutdown with the {n} idle kernels (each kernel's container and \
             staging volume removed, {REMOVAL_CONCURRENCY} at a time), after which docker lists \
             {left_containers} containers and {left_volumes} volumes of the run; its floor is \
             one `docker rm -f` of the memory floor's {floor_n} containers (no volume), until \
             the engine lists none, scaled to {n}"
        ));
        self.notes.push(format!(
            "memory method: host memory per kernel = (`free -b` \"used\" after the {n} kernels \
             idled 5 s − before) / {n}; it includes everything the host spends on a kernel \
             (python, docker-init, the containerd shim, daemon bookkeeping, kernel structures) \
             and also any noise from other processes on the host. Cgroup figures sum each \
             container's memory cgroup (v1 memory.usage_in_bytes / memory.stat total_rss, v2 \
             memory.current / anon) and exclude the shim; helper processes are the containerd \
             shims and fuse-overlayfs mounts, by proportional set size (smaps_rollup Pss). \
             kernelbox RSS is this bench process's \
             VmRSS (the library runs in it): {:.1} MiB after start, {:.1} MiB before the \
             density phase, {:.1} MiB after it",
            self.rss_at_start as f64 / MIB,
            rss0 as f64 / MIB,
            rss1 as f64 / MIB
        ));
        self.details.insert(
            "density".into(),
            json!({
                "kernels": n,
                "concurrency": DENSITY_CONCURRENCY,
                "start_wall_s": start_wall.as_secs_f64(),
                "start_rate_window": RATE_WINDOW,
                "start_rate_curve": curve
                    .iter()
                    .map(|p| json!({
                        "live": p.live,
                        "kernelbox_window_s": p.kernelbox.as_secs_f64(),
                        "kernelbox_per_s": p.kernels_per_s(),
                        "docker_run_d_window_s": p.docker_run.as_secs_f64(),
                        "docker_run_d_per_s": p.docker_per_s(),
                        "kernelbox_removal_s": p.kernelbox_removal.as_secs_f64(),
                        "docker_rm_f_s": p.docker_rm.as_secs_f64(),
                    }))
                    .collect::<Vec<Value>>(),
                "shutdown_s": shutdown.as_secs_f64(),
                "shutdown_left_containers": left_containers,
                "shutdown_left_volumes": left_volumes,
                "floor_rm_f_s": floor.removal.as_secs_f64(),
                "one_kernel_processes": processes_json(&kernel_processes),
                "one_floor_container_processes": processes_json(&floor.processes),
                "kernels_per_second": rate,
                "start_latency": lat_s,
                "host_used_before_bytes": mem0.used_bytes(),
                "host_used_after_bytes": mem1.used_bytes(),
                "host_mib_per_kernel": per_kernel,
                "floor_containers": floor_n,
                "floor_host_mib_per_container": floor.per_container_mib,
                "floor_helpers": floor.helpers,
                "cgroup_containers_found": cg_found,
                "helper_processes": helper_json,
                "cgroup_usage_bytes_total": cg_usage,
                "cgroup_anon_bytes_total": cg_anon,
                "rss_at_start_bytes": self.rss_at_start,
                "rss_before_bytes": rss0,
                "rss_after_bytes": rss1,
                "rss_per_kernel_bytes": slope,
                "rss_at_1000_bytes": at_1000,
            }),
        );
        Ok(())
    }

    /// Starts the kernels of the sessions `{prefix}-{i}`, `i` in `range`,
    /// [`DENSITY_CONCURRENCY`] at a time, each to the end of its first cell (`pass`); returns
    /// the wall time and each start's latency in ms.
    async fn start_idle(&self, prefix: &str, range: Range<usize>) -> Result<(Duration, Vec<f64>)> {
        let t0 = Instant::now();
        let starts: Vec<Result<f64>> = futures::stream::iter(range)
            .map(|i| {
                let kb = self.kb.clone();
                async move {
                    let t = Instant::now();
                    let r = kb
                        .execute(ExecuteRequest::new(format!("{prefix}-{i}"), "pass"))
                        .await?;
                    ok_cell("density cell", &r)?;
                    Ok(ms(t.elapsed()))
                }
            })
            .buffer_unordered(DENSITY_CONCURRENCY)
            .collect()
            .await;
        let wall = t0.elapsed();
        Ok((wall, starts.into_iter().collect::<Result<_>>()?))
    }

    /// The start rate with `live` idle kernels up: [`RATE_WINDOW`] `docker run -d` of idle
    /// floor containers, then as many kernel starts, each set timed and then removed.
    async fn start_rate_at(&self, live: usize) -> Result<RatePoint> {
        let up = self.kb.list_kernels(None).len();
        if up != live {
            bail!("expected {live} live kernels for the start rate, the registry has {up}");
        }
        let (docker_run, ids) =
            docker_run_detached(&self.engine, &self.label, RATE_WINDOW, DENSITY_CONCURRENCY)
                .await?;
        let docker_rm = docker_rm_f(&self.engine, &self.label, &ids).await?;
        tokio::time::sleep(RATE_SETTLE).await;
        let prefix = format!("rate-{live}");
        let window = self.start_idle(&prefix, 0..RATE_WINDOW).await;
        // Idle first, as the N kernels are when they are removed.
        tokio::time::sleep(RATE_SETTLE).await;
        let t = Instant::now();
        futures::stream::iter(0..RATE_WINDOW)
            .for_each_concurrent(REMOVAL_CONCURRENCY, |i| {
                let session = format!("{prefix}-{i}");
                async move {
                    self.kb.clear_session(None, &session).await;
                }
            })
            .await;
        let kernelbox_removal = t.elapsed();
        tokio::time::sleep(RATE_SETTLE).await;
        let (kernelbox, _) = window?;
        Ok(RatePoint {
            live,
            kernelbox,
            docker_run,
            kernelbox_removal,
            docker_rm,
        })
    }
}

fn processes_json(processes: &[crate::host::ContainerProcess]) -> Value {
    processes
        .iter()
        .map(|p| json!({"name": p.name, "pss_bytes": p.pss_bytes, "anon_bytes": p.anon_bytes}))
        .collect()
}
