//! The reference users know: ipykernel through jupyter_client on the host (no container), in
//! `target/bench-venv`, created when missing within a bounded time, or the comparison is
//! skipped with a note. The timing script is `jupyter.py`.

use std::path::PathBuf;
use std::process::Output;
use std::time::Duration;

use anyhow::{anyhow, bail, Result};
use serde_json::{json, Value};
use tokio::process::Command;

use super::{last_json, Bench};
use crate::report::Row;
use crate::stats::{fmt_ms, pq, stats, Stats};
use crate::target_dir;

const JUPYTER_SCRIPT: &str = include_str!("jupyter.py");

impl Bench {
    /// Phase 7, optional, after the shutdown: ipykernel through jupyter_client, as the
    /// reference users know.
    pub async fn jupyter(&mut self) -> Result<()> {
        if !self.args.jupyter {
            self.notes
                .push("Jupyter comparison skipped (--no-jupyter)".into());
            return Ok(());
        }
        let python = match jupyter_venv().await {
            Ok(p) => p,
            Err(e) => {
                self.notes
                    .push(format!("Jupyter comparison skipped: {e:#}"));
                return Ok(());
            }
        };
        let script = target_dir().join("bench-jupyter.py");
        std::fs::write(&script, JUPYTER_SCRIPT)?;
        let mut run = Command::new(&python);
        run.arg(&script)
            .arg(self.sizes.jupyter_warm.to_string())
            .arg(self.sizes.jupyter_cold.to_string());
        let out = match run_bounded("the script", run, 300).await {
            Ok(out) => out,
            Err(e) => {
                self.notes.push(format!("Jupyter comparison skipped: {e}"));
                return Ok(());
            }
        };
        let v = last_json(
            &String::from_utf8_lossy(&out.stdout),
            "from the Jupyter script",
        )?;
        let series = |k: &str| -> Vec<f64> {
            v.get(k)
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_f64)
                        .map(|s| s * 1e3)
                        .collect()
                })
                .unwrap_or_default()
        };
        let warm = stats(&series("warm_s"));
        let cold = stats(&series("cold_s"));
        // Ratio = kernelbox ÷ Jupyter, against kernelbox's own figure as the "floor".
        let reference = |measure: String, jupyter: &Stats, what: &str, kernelbox_p50: f64| {
            Row::new(
                format!("{measure}; ratio = kernelbox ÷ Jupyter"),
                pq(jupyter),
            )
            .floor(
                format!("kernelbox {what} p50 {}", fmt_ms(kernelbox_p50)),
                kernelbox_p50 / jupyter.p50_ms,
            )
        };
        let ipykernel = v.get("ipykernel").and_then(Value::as_str).unwrap_or("?");
        self.rows.push(reference(
            format!(
                "Jupyter warm exec, ipykernel {ipykernel} on the host, no container (n={})",
                warm.n
            ),
            &warm,
            "warm",
            self.warm_p50,
        ));
        self.rows.push(reference(
            format!("Jupyter cold start + first exec (n={})", cold.n),
            &cold,
            "cold",
            self.cold_p50,
        ));
        self.details.insert(
            "jupyter".into(),
            json!({"warm": warm, "cold": cold, "versions": v.get("versions")}),
        );
        Ok(())
    }
}

/// Runs `cmd` to its end within `limit` seconds (killed past it); an error names `what` and
/// the last line of a failed command's stderr.
async fn run_bounded(what: &str, mut cmd: Command, limit: u64) -> Result<Output> {
    cmd.kill_on_drop(true);
    match tokio::time::timeout(Duration::from_secs(limit), cmd.output()).await {
        Ok(Ok(o)) if o.status.success() => Ok(o),
        Ok(Ok(o)) => Err(anyhow!(
            "{what} failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )),
        Ok(Err(e)) => Err(anyhow!("{what}: {e}")),
        Err(_) => Err(anyhow!("{what} took over {limit} s")),
    }
}

/// `target/bench-venv` with ipykernel and jupyter_client, created when missing (bounded).
async fn jupyter_venv() -> Result<PathBuf> {
    let venv = target_dir().join("bench-venv");
    let python = venv.join("bin").join("python");
    let importable = || async {
        Command::new(&python)
            .args(["-c", "import ipykernel, jupyter_client"])
            .output()
            .await
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if python.exists() && importable().await {
        return Ok(python);
    }
    let mut venv_cmd = Command::new("python3");
    venv_cmd.arg("-m").arg("venv").arg(&venv);
    run_bounded("python3 -m venv", venv_cmd, 60).await?;
    let mut pip = Command::new(venv.join("bin").join("pip"));
    pip.args([
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "ipykernel",
        "jupyter_client",
    ]);
    run_bounded("pip install ipykernel jupyter_client", pip, 180).await?;
    if !importable().await {
        bail!("ipykernel installed but does not import");
    }
    Ok(python)
}
