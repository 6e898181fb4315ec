//! Building the kernel image: an offline base (debootstrap + `docker import`) when the base is
//! missing and no registry is reachable, then `images/Dockerfile` on top of it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The base image the offline bootstrap produces.
pub const OFFLINE_BASE: &str = "kernelbox/base:bookworm";

/// An image build failed.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The images/ directory with the Dockerfile and bootstrap script was not found.
    #[error("images directory not found at {0} (run from the kernelbox checkout or pass --dir)")]
    NoImagesDir(PathBuf),
    /// A build step failed.
    #[error("{step} failed: {message}")]
    Step {
        /// Which step.
        step: &'static str,
        /// Details.
        message: String,
    },
}

fn run(step: &'static str, cmd: &mut Command) -> Result<(), ImageError> {
    let status = cmd.status().map_err(|e| ImageError::Step {
        step,
        message: e.to_string(),
    })?;
    if status.success() {
        Ok(())
    } else {
        Err(ImageError::Step {
            step,
            message: format!("exited with {status}"),
        })
    }
}

fn image_exists(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Builds `tag` from `dir/Dockerfile` on `base`, bootstrapping the offline base first when it
/// is the default one and missing. Progress goes to the terminal as each step runs.
pub fn build(dir: &Path, tag: &str, base: &str, force: bool) -> Result<(), ImageError> {
    if !dir.join("Dockerfile").is_file() {
        return Err(ImageError::NoImagesDir(dir.to_path_buf()));
    }
    if !force && image_exists(tag) {
        eprintln!("kernelbox: image {tag} already present (use --force to rebuild)");
        return Ok(());
    }
    if base == OFFLINE_BASE && !image_exists(base) {
        eprintln!("kernelbox: [1/2] bootstrapping base image {base} offline");
        run(
            "bootstrap base image",
            Command::new("bash")
                .arg(dir.join("bootstrap-base.sh"))
                .arg(base),
        )?;
    } else {
        eprintln!("kernelbox: [1/2] base image {base}");
    }
    eprintln!("kernelbox: [2/2] building {tag}");
    run(
        "docker build",
        Command::new("docker")
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "--quiet", "--tag", tag, "--build-arg"])
            .arg(format!("BASE={base}"))
            .arg(dir),
    )?;
    eprintln!("kernelbox: image {tag} ready");
    Ok(())
}
