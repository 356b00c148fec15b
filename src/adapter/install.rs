//! `mosaic harness install`: puts each pinned real harness, exactly as its registry entry
//! names it, into `<harness root>/<runtime>@<version>/` with npm, and checks it with the
//! entry's version probe. An install is staged in a sibling directory and renamed into
//! place only once npm succeeded, so a failed or interrupted install never looks
//! installed; an existing install whose probe passes is left as it is.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Paths, Registry, RuntimeRef};

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{0}")]
    Registry(#[from] super::RegistryError),
    #[error("{runtime} ships with Mosaic; there is nothing to install")]
    Builtin { runtime: String },
    #[error("npm is not installed (needed to install {runtime}): run `mosaic setup` as root, or install it yourself (Debian: apt-get install npm), or put npm on PATH")]
    NoNpm { runtime: String },
    #[error("npm install of {runtime} into {dir} failed ({status}); its output is above")]
    Npm {
        runtime: String,
        dir: PathBuf,
        status: String,
    },
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where a runtime is installed under `root`.
pub fn dir_of(root: &Path, r: &RuntimeRef) -> PathBuf {
    root.join(r.to_string())
}

/// What happened to one runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    AlreadyInstalled,
    Installed,
}

/// Installs `r` under `paths.harness_root` unless an install that passes its probe is
/// already there. `say` gets one line per step.
pub fn install(
    reg: &Registry,
    r: &RuntimeRef,
    paths: &Paths,
    say: &dyn Fn(&str),
) -> Result<Outcome, InstallError> {
    let entry = reg.entry(r)?;
    let Some(spec) = &entry.install else {
        return Err(InstallError::Builtin {
            runtime: r.to_string(),
        });
    };
    let dest = dir_of(&paths.harness_root, r);
    if dest.exists() {
        match super::probe_version(entry, r, paths) {
            Ok(()) => {
                say(&format!(
                    "{r}: already installed in {} (version probe passes)",
                    dest.display()
                ));
                return Ok(Outcome::AlreadyInstalled);
            }
            Err(e) => say(&format!(
                "{r}: the install in {} fails its probe ({e}); reinstalling",
                dest.display()
            )),
        }
    }
    let npm = crate::sysdeps::which("npm").ok_or_else(|| InstallError::NoNpm {
        runtime: r.to_string(),
    })?;
    let io = |what, path: &Path| {
        let path = path.to_path_buf();
        move |source| InstallError::Io { what, path, source }
    };
    std::fs::create_dir_all(&paths.harness_root).map_err(io("creating", &paths.harness_root))?;
    let staging = paths
        .harness_root
        .join(format!(".{r}.partial-{}", uuid::Uuid::new_v4().simple()));
    let packages: Vec<String> = spec
        .npm
        .iter()
        .map(|p| p.replace("{version}", &r.version.to_string()))
        .collect();
    say(&format!(
        "{r}: npm install {} into {} (from the npm registry; this downloads the harness once)",
        packages.join(" "),
        dest.display()
    ));
    let status = Command::new(&npm)
        .arg("install")
        .arg("--prefix")
        .arg(&staging)
        // Install scripts do run: Claude Code's and OpenCode's put the platform binary (the
        // one for this CPU) in place; with --ignore-scripts they leave a stub that only
        // prints an error. The version probe then checks what was installed.
        .args(["--no-audit", "--no-fund", "--no-save", "--loglevel=error"])
        .args(&packages)
        .status()
        .map_err(io("running", &npm))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(InstallError::Npm {
            runtime: r.to_string(),
            dir: dest,
            status: status.to_string(),
        });
    }
    if dest.exists() {
        std::fs::remove_dir_all(&dest).map_err(io("removing the old install", &dest))?;
    }
    std::fs::rename(&staging, &dest).map_err(io("moving the install into place", &dest))?;
    super::probe_version(entry, r, paths)?;
    say(&format!("{r}: installed; version probe passes"));
    Ok(Outcome::Installed)
}

/// Every registered runtime that can be installed (`runtime@version`).
pub fn installable(reg: &Registry) -> Vec<String> {
    reg.entries()
        .filter(|e| e.install.is_some())
        .flat_map(|e| {
            e.validated_versions
                .iter()
                .map(move |v| format!("{}@{v}", e.runtime))
        })
        .collect()
}
