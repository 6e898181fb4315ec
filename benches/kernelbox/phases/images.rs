//! The kernel images side by side (docs/images.md "Images"): the plain image and, when it is on the
//! engine, the data-science one (`kernelbox image build --preset datascience`): image size,
//! the cold first cell of a new owner, idle memory per kernel, and on the data-science image
//! the first plot of a fresh kernel (imports included).

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bollard::query_parameters::InspectContainerOptions;
use futures::StreamExt;
use kernelbox::config::DEFAULT_IMAGE;
use kernelbox::image::DATASCIENCE_IMAGE;
use kernelbox::{ExecuteRequest, Scope};
use serde_json::{json, Map, Value};

use super::{ok_cell, Bench, DENSITY_CONCURRENCY};
use crate::host::{cgroup_memory, HostMemory, MIB};
use crate::report::Row;
use crate::stats::{ms, pq, stats, Stats};
use crate::CASE;

/// Idle kernels started per image for its memory figure (at most; fewer with `--density`).
const IDLE_MAX: usize = 20;

/// The cell timed as the data-science image's first plot.
const FIRST_PLOT: &str = "import numpy, pandas, matplotlib.pyplot as plt\n\
    fig, ax = plt.subplots(figsize=(4, 3), dpi=100)\n\
    ax.plot(pandas.Series(numpy.arange(10)) ** 2)\n\
    fig.savefig('/tmp/first.png')\n\
    plt.close(fig)";

/// The label telling the two data-science pools' kernels apart (`true`: the preloading one).
const POOL_KEY: &str = "io.kernelbox-bench.preload";

/// The modules the preloading pool imports (`--pool-preload`).
const PRELOAD: [&str; 3] = ["numpy", "pandas", "matplotlib.pyplot"];

/// A new owner's first cell on the data-science image: a small DataFrame plotted, shown
/// inline (the figure comes back as a PNG bundle).
const FIRST_CELL_PLOT: &str = "import pandas as pd, matplotlib.pyplot as plt\n\
    pd.DataFrame({'x': [1, 2, 3], 'y': [3, 1, 2]}).plot(x='x', y='y')\n\
    plt.show()";

/// One image's figures.
struct ImageFigures {
    size_bytes: u64,
    cold: Stats,
    idle_host_mib: f64,
    idle_cgroup_mib: f64,
    idle_anon_mib: f64,
}

impl Bench {
    /// Phase: the plain and data-science images side by side.
    pub async fn images(&mut self) -> Result<()> {
        self.clear_earlier_sessions().await;
        let present = self.engine.image_exists(DATASCIENCE_IMAGE).await?;
        let mut images = vec![("plain", DEFAULT_IMAGE)];
        if present {
            images.push(("datascience", DATASCIENCE_IMAGE));
        } else {
            self.notes.push(format!(
                "{DATASCIENCE_IMAGE} is not on the engine: its rows are left out (build it \
                 with `kernelbox image build --preset datascience`)"
            ));
        }
        // Cold samples alternate between the images, so both see the same load.
        let n = self.sizes.cold;
        let mut cold: Vec<Vec<f64>> = vec![Vec::new(); images.len()];
        let mut first_plot = Vec::new();
        for (name, image) in &images {
            self.image_cold_once(&format!("img-warmup-{name}"), image, false)
                .await?;
        }
        for i in 0..n {
            for (k, (name, image)) in images.iter().enumerate() {
                let plot = *name == "datascience";
                let (cold_ms, plot_ms) = self
                    .image_cold_once(&format!("img-cold-{name}-{i}"), image, plot)
                    .await?;
                cold[k].push(cold_ms);
                if let Some(p) = plot_ms {
                    first_plot.push(p);
                }
            }
        }
        let idle_n = self.args.density.min(IDLE_MAX);
        let mut figures = Vec::new();
        for (k, (name, image)) in images.iter().enumerate() {
            let (host, cgroup, anon) = self.idle_memory(name, image, idle_n).await?;
            figures.push(ImageFigures {
                size_bytes: self.image_size(image).await?,
                cold: stats(&cold[k]),
                idle_host_mib: host,
                idle_cgroup_mib: cgroup,
                idle_anon_mib: anon,
            });
        }
        let mut details = Map::new();
        let plain_cold = figures[0].cold.p50_ms;
        for ((name, image), f) in images.iter().zip(&figures) {
            let mut cold_row = Row::new(
                format!("{name} image: cold first cell, new owner (n={n})"),
                pq(&f.cold),
            );
            if *name != "plain" {
                cold_row = cold_row.floor(
                    format!("plain image p50 {}", crate::stats::fmt_ms(plain_cold)),
                    f.cold.p50_ms / plain_cold,
                );
            }
            self.rows.push(cold_row);
            self.rows.push(Row::new(
                format!("{name} image: idle kernel memory (mean of {idle_n})"),
                format!(
                    "cgroup {:.1} MiB charged ({:.1} MiB anon)",
                    f.idle_cgroup_mib, f.idle_anon_mib
                ),
            ));
            self.rows.push(Row::new(
                format!("{name} image: size (`{image}`)"),
                format!("{:.0} MB", f.size_bytes as f64 / 1e6),
            ));
            details.insert(
                name.to_string(),
                json!({
                    "image": image,
                    "size_bytes": f.size_bytes,
                    "cold": f.cold,
                    "idle_kernels": idle_n,
                    "idle_host_mib_per_kernel": f.idle_host_mib,
                    "idle_cgroup_mib_per_kernel": f.idle_cgroup_mib,
                    "idle_anon_mib_per_kernel": f.idle_anon_mib,
                }),
            );
        }
        if present {
            self.preload_rows(&mut details).await?;
        }
        if !first_plot.is_empty() {
            let s = stats(&first_plot);
            self.rows.push(Row::new(
                format!(
                    "datascience image: first plot in a fresh kernel (import numpy, pandas, \
                     pyplot; draw; savefig) (n={})",
                    s.n
                ),
                pq(&s),
            ));
            details.insert("datascience_first_plot".into(), json!(s));
        }
        self.notes.push(format!(
            "images method: cold samples alternate between the images (one untimed round \
             first); idle memory starts {idle_n} kernels per image ({DENSITY_CONCURRENCY} at a \
             time), lets them idle 5 s and sums their memory cgroups (the `free -b` used delta \
             over {idle_n} kernels, too small a sample to rise above other load on the host, \
             is only in the JSON); size is the engine's \
             image size (uncompressed layers)"
        ));
        self.details.insert("images".into(), Value::Object(details));
        Ok(())
    }

    /// A new owner's first cell plotting a DataFrame with a pool hit on the data-science image,
    /// from a pool that preloads numpy, pandas and pyplot and from one that does not (the
    /// floor: today's first plot), samples alternating; and each pooled kernel's memory.
    async fn preload_rows(&mut self, details: &mut Map<String, Value>) -> Result<()> {
        let n = self.sizes.cold;
        let start = |preload: bool| {
            let mut config = super::config(&self.label);
            config.workspaces = None;
            config.spec.image = DATASCIENCE_IMAGE.into();
            config.pool.size = 1;
            config
                .housekeeping
                .extra_labels
                .insert(POOL_KEY.into(), preload.to_string());
            if preload {
                config.pool.preload = PRELOAD.map(String::from).to_vec();
            }
            kernelbox::Orchestrator::start(config, self.engine.clone())
        };
        let pools = [start(false).await?, start(true).await?];
        let mut plot: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
        let mut memory = [0.0f64; 2];
        for i in 0..n {
            for (k, kb) in pools.iter().enumerate() {
                if !kb.wait_pool_ready(1, Duration::from_secs(120)).await {
                    bail!("the data-science pool (preload: {}) did not fill", k == 1);
                }
                if i == 0 {
                    memory[k] = self.pooled_memory(k == 1).await?;
                }
                let session = format!("img-preload-{k}-{i}");
                let t = Instant::now();
                let r = kb
                    .execute(ExecuteRequest::new(
                        Scope::session(&session),
                        FIRST_CELL_PLOT,
                    ))
                    .await?;
                let took = ms(t.elapsed());
                ok_cell("first cell plot", &r)?;
                if r.kernel.reused || !r.results.iter().any(|b| b.data.contains_key("image/png")) {
                    bail!("the first cell plot was not a new kernel's PNG: {r:?}");
                }
                plot[k].push(took);
                kb.clear_session(None, &session).await;
            }
        }
        for kb in &pools {
            kb.shutdown().await;
        }
        let (plain, preloaded) = (stats(&plot[0]), stats(&plot[1]));
        self.rows.push(
            Row::new(
                format!(
                    "datascience image: new owner's first cell plotting a DataFrame, pool hit, \
                     pool preloading {} (n={n})",
                    PRELOAD.join(", ")
                ),
                pq(&preloaded),
            )
            .floor(
                format!(
                    "pool hit without preload p50 {}",
                    crate::stats::fmt_ms(plain.p50_ms)
                ),
                preloaded.p50_ms / plain.p50_ms,
            ),
        );
        self.rows.push(Row::new(
            "datascience image: memory of a pooled kernel, preloaded vs not".to_string(),
            format!(
                "cgroup {:.1} MiB preloaded, {:.1} MiB not",
                memory[1], memory[0]
            ),
        ));
        details.insert(
            "datascience_preload".into(),
            json!({"preload": PRELOAD, "first_cell_plot_preloaded": preloaded,
                   "first_cell_plot_not_preloaded": plain,
                   "pooled_cgroup_mib_preloaded": memory[1],
                   "pooled_cgroup_mib_not_preloaded": memory[0]}),
        );
        Ok(())
    }

    /// The memory cgroup charge of the ready pooled kernel of the pool that preloads (or
    /// not), MiB.
    async fn pooled_memory(&self, preload: bool) -> Result<f64> {
        let pooled: Vec<_> = self
            .engine
            .list_containers(&[
                format!("{CASE}={}", self.label),
                format!("{POOL_KEY}={preload}"),
            ])
            .await?
            .into_iter()
            .filter(|c| c.labels.contains_key(kernelbox::labels::POOL))
            .filter(|c| kernelbox::labels::parse_owner_name(&c.name).is_none())
            .collect();
        let charged: Vec<u64> = pooled
            .iter()
            .filter_map(|c| cgroup_memory(&c.id).map(|(u, _)| u))
            .collect();
        if charged.is_empty() {
            bail!("no pooled data-science kernel to measure");
        }
        Ok(charged.iter().sum::<u64>() as f64 / charged.len() as f64 / MIB)
    }

    /// The sessions of earlier phases, cleared so the engine holds only this phase's kernels.
    async fn clear_earlier_sessions(&self) {
        for s in ["warm", "tools"] {
            self.kb.clear_session(None, s).await;
        }
        for o in 0..self.sizes.owners {
            self.kb.clear_session(None, &format!("tp-{o}")).await;
        }
    }

    /// One timed first cell of a new owner on `image` (ms), then, when `plot`, the timed first
    /// plot in that fresh kernel; the kernel is then cleared.
    async fn image_cold_once(
        &self,
        session: &str,
        image: &str,
        plot: bool,
    ) -> Result<(f64, Option<f64>)> {
        let request = |code: &str| ExecuteRequest::new(Scope::session(session).image(image), code);
        let t = Instant::now();
        let r = self.exec(request("x = 1")).await?;
        let cold = ms(t.elapsed());
        ok_cell("cold cell", &r)?;
        if r.kernel.reused {
            bail!("cold cell on {image} reused a kernel");
        }
        let plot_ms = if plot {
            let t = Instant::now();
            let r = self.exec(request(FIRST_PLOT)).await?;
            ok_cell("first plot", &r)?;
            Some(ms(t.elapsed()))
        } else {
            None
        };
        self.kb.clear_session(None, session).await;
        Ok((cold, plot_ms))
    }

    /// `n` idle kernels on `image`: host MiB per kernel, cgroup charged and anon MiB per kernel.
    async fn idle_memory(&self, name: &str, image: &str, n: usize) -> Result<(f64, f64, f64)> {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let mem0 = HostMemory::take().await?;
        let kb = self.kb.clone();
        let started: Vec<Result<()>> = futures::stream::iter(0..n)
            .map(|i| {
                let kb = kb.clone();
                let request = ExecuteRequest::new(
                    Scope::session(format!("img-idle-{name}-{i}")).image(image),
                    "pass",
                );
                async move {
                    let r = kb.execute(request).await?;
                    ok_cell("idle kernel", &r)
                }
            })
            .buffer_unordered(DENSITY_CONCURRENCY)
            .collect()
            .await;
        started.into_iter().collect::<Result<Vec<()>>>()?;
        tokio::time::sleep(Duration::from_secs(5)).await;
        let mem1 = HostMemory::take().await?;
        let prefix = format!("img-idle-{name}-");
        let containers: Vec<_> = self
            .engine
            .list_containers(&[format!("{CASE}={}", self.label)])
            .await?
            .into_iter()
            .filter(|c| {
                c.labels
                    .get(kernelbox::labels::SESSION)
                    .is_some_and(|s| s.starts_with(&prefix))
            })
            .collect();
        if containers.len() != n {
            bail!(
                "expected {n} kernels on {image}, docker lists {}",
                containers.len()
            );
        }
        let (mut usage, mut anon, mut found) = (0u64, 0u64, 0usize);
        for c in &containers {
            let inspected = self
                .docker
                .inspect_container(&c.id, None::<InspectContainerOptions>)
                .await?;
            let on = inspected.config.and_then(|c| c.image).unwrap_or_default();
            if on != image {
                bail!("kernel {} runs {on}, not {image}", c.id);
            }
            if let Some((u, a)) = cgroup_memory(&c.id) {
                usage += u;
                anon += a;
                found += 1;
            }
        }
        for i in 0..n {
            self.kb
                .clear_session(None, &format!("img-idle-{name}-{i}"))
                .await;
        }
        let per = |bytes: u64| {
            if found == 0 {
                f64::NAN
            } else {
                bytes as f64 / found as f64 / MIB
            }
        };
        Ok((mem1.mib_per(&mem0, n), per(usage), per(anon)))
    }

    /// The engine's size of `image`, in bytes.
    async fn image_size(&self, image: &str) -> Result<u64> {
        let info = self.docker.inspect_image(image).await?;
        Ok(info.size.unwrap_or(0).max(0) as u64)
    }
}
