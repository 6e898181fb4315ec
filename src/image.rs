//! Building the kernel images (docs/images.md "Images"). The plain preset is an offline base
//! (debootstrap + `docker import`) when the base is missing and no registry is reachable, then
//! `images/Dockerfile` on top of it; the data-science preset is
//! `images/datascience.Dockerfile` on top of the plain image (built first when missing), adding
//! Debian's numpy, pandas, matplotlib, pillow and scipy.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The base image the offline bootstrap produces.
pub const OFFLINE_BASE: &str = "kernelbox/base:bookworm";

/// The image the data-science preset builds.
pub const DATASCIENCE_IMAGE: &str = "kernelbox/kernel-datascience:latest";

/// A kernel image kernelbox knows how to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Preset {
    /// Python's standard library only: the default image ([`crate::config::DEFAULT_IMAGE`]).
    #[default]
    Plain,
    /// The plain image plus numpy, pandas, matplotlib, pillow and scipy from Debian's
    /// packages, matplotlib on Agg with its font cache built in ([`DATASCIENCE_IMAGE`]).
    Datascience,
}

impl Preset {
    /// Every preset, in the order `--preset` lists them.
    pub const ALL: [Preset; 2] = [Preset::Plain, Preset::Datascience];

    /// The name `--preset` takes.
    pub fn name(self) -> &'static str {
        match self {
            Preset::Plain => "plain",
            Preset::Datascience => "datascience",
        }
    }

    /// The tag the preset builds unless told otherwise.
    pub fn tag(self) -> &'static str {
        match self {
            Preset::Plain => crate::config::DEFAULT_IMAGE,
            Preset::Datascience => DATASCIENCE_IMAGE,
        }
    }

    /// The image the preset builds on unless told otherwise.
    pub fn default_base(self) -> &'static str {
        match self {
            Preset::Plain => OFFLINE_BASE,
            Preset::Datascience => Preset::Plain.tag(),
        }
    }

    fn dockerfile(self) -> &'static str {
        match self {
            Preset::Plain => "Dockerfile",
            Preset::Datascience => "datascience.Dockerfile",
        }
    }
}

impl std::str::FromStr for Preset {
    type Err = String;

    fn from_str(s: &str) -> Result<Preset, String> {
        Preset::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Preset::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown preset {s:?} (expected one of: {})",
                    names.join(", ")
                )
            })
    }
}

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
        /// What the step's command or the engine said.
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

/// Builds `tag` from the preset's Dockerfile in `dir` on `base`. A missing base that is the
/// default one is made first: the offline base by bootstrap, the plain image for the
/// data-science preset (`force` rebuilds only `tag`). Progress goes to the terminal as each
/// step runs.
pub fn build(
    dir: &Path,
    preset: Preset,
    tag: &str,
    base: &str,
    force: bool,
) -> Result<(), ImageError> {
    let dockerfile = dir.join(preset.dockerfile());
    if !dockerfile.is_file() {
        return Err(ImageError::NoImagesDir(dir.to_path_buf()));
    }
    if !force && image_exists(tag) {
        eprintln!("kernelbox: image {tag} already present (use --force to rebuild)");
        return Ok(());
    }
    if preset == Preset::Datascience && base == Preset::Plain.tag() && !image_exists(base) {
        eprintln!(
            "kernelbox: the {} preset builds on {base}: building it first",
            preset.name()
        );
        build(dir, Preset::Plain, base, OFFLINE_BASE, false)?;
        eprintln!("kernelbox: [1/2] base image {base}");
    } else if base == OFFLINE_BASE && !image_exists(base) {
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
    if preset == Preset::Datascience {
        eprintln!(
            "kernelbox: [2/2] building {tag}: numpy, pandas, matplotlib, pillow and scipy from \
             the Debian mirror (several minutes)"
        );
    } else {
        eprintln!("kernelbox: [2/2] building {tag}");
    }
    run(
        "docker build",
        Command::new("docker")
            .env("DOCKER_BUILDKIT", "0")
            .args(["build", "--quiet", "--tag", tag, "--file"])
            .arg(&dockerfile)
            .arg("--build-arg")
            .arg(format!("BASE={base}"))
            .arg(dir),
    )?;
    eprintln!("kernelbox: image {tag} ready");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_parse_by_name_and_plain_is_the_default() {
        assert_eq!(Preset::default(), Preset::Plain);
        assert_eq!(Preset::default().tag(), crate::config::DEFAULT_IMAGE);
        for preset in Preset::ALL {
            assert_eq!(preset.name().parse::<Preset>(), Ok(preset));
        }
        assert_eq!(Preset::Datascience.tag(), DATASCIENCE_IMAGE);
        assert_eq!(Preset::Datascience.default_base(), Preset::Plain.tag());
        let err = "scipy".parse::<Preset>().unwrap_err();
        assert!(err.contains("plain, datascience"), "{err}");
    }

    #[test]
    fn a_missing_dockerfile_is_a_clear_error() {
        let dir = std::env::temp_dir().join("kernelbox-no-images-here");
        let err = build(&dir, Preset::Datascience, DATASCIENCE_IMAGE, "x", false).unwrap_err();
        assert!(matches!(err, ImageError::NoImagesDir(_)), "{err}");
    }
}
