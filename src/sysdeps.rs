//! System packages Mosaic needs (tmux; git for workspaces; PostgreSQL server binaries),
//! found or installed.
//!
//! Installs only when it can do so safely and non-interactively: as root, with apt-get.
//! Otherwise it stops and prints the exact command to run.

use std::path::PathBuf;
use std::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum SysdepsError {
    #[error("missing system packages: {missing}. Install them with:\n    {command}")]
    Missing { missing: String, command: String },
    #[error("`{command}` failed ({status}); install the packages by hand:\n    {manual}")]
    InstallFailed {
        command: String,
        status: String,
        manual: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dep {
    Tmux,
    /// Workspaces: an assignment that names a repository works in a clone of it.
    Git,
    PostgresServer,
    /// For `mosaic harness install` (the real harnesses come from the npm registry).
    Npm,
}

impl Dep {
    pub fn package(self) -> &'static str {
        match self {
            Dep::Tmux => "tmux",
            Dep::Git => "git",
            Dep::PostgresServer => "postgresql",
            Dep::Npm => "npm",
        }
    }
    pub fn present(self) -> bool {
        match self {
            Dep::Tmux => which("tmux").is_some(),
            Dep::Git => which("git").is_some(),
            Dep::PostgresServer => pg_bin("initdb").is_some() && pg_bin("pg_ctl").is_some(),
            Dep::Npm => which("npm").is_some(),
        }
    }
}

/// Looks `name` up on PATH.
pub fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|c| c.is_file())
    })
}

/// A PostgreSQL server binary: on PATH, or in Debian's versioned directory (newest first).
/// What `tmux -V` prints (`tmux 3.3a`).
pub fn tmux_version(bin: &std::path::Path) -> std::io::Result<String> {
    let out = Command::new(bin).arg("-V").output()?;
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn pg_bin(name: &str) -> Option<PathBuf> {
    if let Some(p) = which(name) {
        return Some(p);
    }
    let mut dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((v, e.path().join("bin").join(name)))
        })
        .filter(|(_, p)| p.is_file())
        .collect();
    dirs.sort();
    dirs.pop().map(|(_, p)| p)
}

/// Makes sure `deps` are installed: returns at once if they are; installs them with apt
/// when root; otherwise fails with the command to run.
pub fn ensure(deps: &[Dep]) -> Result<(), SysdepsError> {
    let missing: Vec<&str> = deps
        .iter()
        .filter(|d| !d.present())
        .map(|d| d.package())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let pkgs = missing.join(" ");
    let manual = format!("sudo apt-get update && sudo apt-get install -y {pkgs}");
    let root = nix::unistd::geteuid().is_root();
    if !root || which("apt-get").is_none() {
        return Err(SysdepsError::Missing {
            missing: pkgs,
            command: manual,
        });
    }
    eprintln!("mosaic: installing missing packages: {pkgs}");
    for args in [vec!["update", "-q"], {
        let mut v = vec!["install", "-y", "-q", "--no-install-recommends"];
        v.extend(missing.iter().copied());
        v
    }] {
        let st = Command::new("apt-get")
            .args(&args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status();
        match st {
            Ok(s) if s.success() => {}
            Ok(s) => {
                return Err(SysdepsError::InstallFailed {
                    command: format!("apt-get {}", args.join(" ")),
                    status: s.to_string(),
                    manual,
                })
            }
            Err(e) => {
                return Err(SysdepsError::InstallFailed {
                    command: format!("apt-get {}", args.join(" ")),
                    status: e.to_string(),
                    manual,
                })
            }
        }
    }
    let still: Vec<&str> = deps
        .iter()
        .filter(|d| !d.present())
        .map(|d| d.package())
        .collect();
    if still.is_empty() {
        Ok(())
    } else {
        Err(SysdepsError::Missing {
            missing: still.join(" "),
            command: manual,
        })
    }
}
