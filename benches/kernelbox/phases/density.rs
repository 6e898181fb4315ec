//! Density: N idle kernels, started a few at a time; their start time, the host memory each
//! costs against an idle container with the same sandbox, their cgroup memory, the helper
//! processes the engine adds, and kernelbox's own RSS.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use futures::StreamExt;
use kernelbox::ExecuteRequest;
use serde_json::{json, Map};

use super::{ok_cell, Bench, DENSITY_CONCURRENCY};
use crate::floors::container_floor;
use crate::host::{cgroup_memory, vm_rss_bytes, HostMemory, MIB};
use crate::report::Row;
use crate::stats::{ms, pq, stats};
use crate::CASE;

/// Containers in the density floor (at most; fewer when fewer kernels are measured).
const DENSITY_FLOOR_MAX: usize = 200;

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
        let t0 = Instant::now();
        let kb = self.kb.clone();
        let starts: Vec<Result<f64>> = futures::stream::iter(0..n)
            .map(|i| {
                let kb = kb.clone();
                async move {
                    let t = Instant::now();
                    let r = kb
                        .execute(ExecuteRequest::new(format!("dense-{i}"), "pass"))
                        .await?;
                    ok_cell("density cell", &r)?;
                    Ok(ms(t.elapsed()))
                }
            })
            .buffer_unordered(DENSITY_CONCURRENCY)
            .collect()
            .await;
        let start_wall = t0.elapsed();
        let lat: Vec<f64> = starts.into_iter().collect::<Result<_>>()?;
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
        let mut helper_rows = Vec::new();
        let mut helper_json = Map::new();
        for h in mem1.helpers_since(&mem0) {
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
        let mut row = Row::new(
            format!("host memory per idle kernel (`free -b` used delta / {n})"),
            format!("{per_kernel:.1} MiB"),
        )
        .target("≤ 10 MiB", per_kernel <= 10.0);
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
}
