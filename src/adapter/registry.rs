//! Loading the registry (embedded entries, or a directory of them), resolving a
//! `runtime@version` to exactly one validated entry, and planning a launch from it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::*;

/// The loaded registry.
#[derive(Debug, Clone)]
pub struct Registry {
    pub(super) entries: Vec<(Entry, semver::VersionReq)>,
    pub(super) probes: std::sync::Arc<ProbeCache>,
}

/// Entries compiled into the binary, so `mosaic up` works from a bare checkout.
/// The entries built into the binary: each entry with its conformance evidence.
pub(super) const EMBEDDED: &[(&str, &str, &[u8])] = &[
    (
        "registry/fake.toml",
        include_str!("../../registry/fake.toml"),
        include_bytes!("../../registry/fake.evidence.json"),
    ),
    (
        "registry/claude-code.toml",
        include_str!("../../registry/claude-code.toml"),
        include_bytes!("../../registry/claude-code.evidence.json"),
    ),
    (
        "registry/pi.toml",
        include_str!("../../registry/pi.toml"),
        include_bytes!("../../registry/pi.evidence.json"),
    ),
    (
        "registry/opencode.toml",
        include_str!("../../registry/opencode.toml"),
        include_bytes!("../../registry/opencode.evidence.json"),
    ),
    (
        "registry/codex.toml",
        include_str!("../../registry/codex.toml"),
        include_bytes!("../../registry/codex.evidence.json"),
    ),
];

/// One registry entry as read: its TOML and the evidence file beside it (`X.toml` →
/// `X.evidence.json`), if there is one.
#[derive(Debug, Clone)]
pub struct Source {
    pub name: String,
    pub text: String,
    pub evidence: Option<Vec<u8>>,
}

impl Registry {
    pub fn embedded() -> Result<Self, RegistryError> {
        Self::from_sources(EMBEDDED.iter().map(|(n, t, e)| Source {
            name: n.to_string(),
            text: t.to_string(),
            evidence: Some(e.to_vec()),
        }))
    }

    /// Loads every `*.toml` in `dir` (and nothing else).
    pub fn load_dir(dir: &Path) -> Result<Self, RegistryError> {
        let io = |source| RegistryError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        let mut sources = Vec::new();
        for f in files {
            let text = std::fs::read_to_string(&f).map_err(|source| RegistryError::Io {
                path: f.clone(),
                source,
            })?;
            let evidence = std::fs::read(f.with_extension("evidence.json")).ok();
            sources.push(Source {
                name: f.display().to_string(),
                text,
                evidence,
            });
        }
        Self::from_sources(sources)
    }

    pub fn from_sources(sources: impl IntoIterator<Item = Source>) -> Result<Self, RegistryError> {
        let mut entries: Vec<(Entry, semver::VersionReq)> = Vec::new();
        for Source {
            name,
            text,
            evidence,
        } in sources
        {
            let mut e: Entry = toml::from_str(&text).map_err(|err| RegistryError::BadEntry {
                file: name.clone(),
                detail: err.to_string(),
            })?;
            e.source = name;
            let range = e.validate()?;
            e.check_evidence(evidence.as_deref())?;
            for (other, _) in &entries {
                if other.runtime != e.runtime {
                    continue;
                }
                if let Some(v) = e
                    .validated_versions
                    .iter()
                    .find(|v| other.validated_versions.contains(v))
                {
                    return Err(RegistryError::Ambiguous {
                        runtime: e.runtime.clone(),
                        version: v.clone(),
                        a: other.source.clone(),
                        b: e.source.clone(),
                    });
                }
            }
            entries.push((e, range));
        }
        Ok(Self {
            entries,
            probes: Default::default(),
        })
    }

    /// The one entry that validates exactly this runtime and version, or a clear refusal.
    pub fn resolve(&self, r: &RuntimeRef) -> Result<&Entry, RegistryError> {
        let same: Vec<&(Entry, semver::VersionReq)> = self
            .entries
            .iter()
            .filter(|(e, _)| e.runtime == r.runtime)
            .collect();
        if same.is_empty() {
            let mut known: Vec<&str> = self
                .entries
                .iter()
                .map(|(e, _)| e.runtime.as_str())
                .collect();
            known.dedup();
            return Err(RegistryError::UnknownRuntime {
                runtime: r.runtime.clone(),
                known: known.join(", "),
            });
        }
        let v = r.version.to_string();
        same.iter()
            .find(|(e, range)| range.matches(&r.version) && e.validated_versions.contains(&v))
            .map(|(e, _)| e)
            .ok_or_else(|| RegistryError::UnknownVersion {
                runtime: r.runtime.clone(),
                version: v,
                validated: same
                    .iter()
                    .flat_map(|(e, _)| e.validated_versions.iter().cloned())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter().map(|(e, _)| e)
    }

    pub fn runtimes(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (e, _) in &self.entries {
            for v in &e.validated_versions {
                out.push(format!("{}@{v}", e.runtime));
            }
        }
        out
    }
}

/// The values a template may name. Launch-time values (`state_dir`, `session_id`) are
/// filled in by the adapter once the generation's private area exists.
#[derive(Debug, Clone, Default)]
pub struct Vars {
    pub bin_dir: PathBuf,
    pub harness_root: PathBuf,
    pub version: String,
    pub state_dir: Option<PathBuf>,
    pub session_id: Option<String>,
}

/// Substitutes the template's `{…}` names; `{directives}` becomes one argument per word.
pub fn expand(template: &[String], vars: &Vars, directives: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for t in template {
        if t == "{directives}" {
            out.extend(directives.iter().cloned());
            continue;
        }
        let mut v = t
            .replace("{bin_dir}", &vars.bin_dir.display().to_string())
            .replace("{harness_root}", &vars.harness_root.display().to_string())
            .replace("{version}", &vars.version);
        if let Some(d) = &vars.state_dir {
            v = v.replace("{state_dir}", &d.display().to_string());
        }
        if let Some(id) = &vars.session_id {
            v = v.replace("{session_id}", id);
        }
        out.push(v);
    }
    out
}

/// Where the launch finds its binaries.
#[derive(Debug, Clone)]
pub struct Paths {
    /// Directory of `mosaic` and `mosaic-fake-harness`.
    pub bin_dir: PathBuf,
    /// Root of installed harnesses: `<root>/<runtime>@<version>/` (`mosaic harness install`).
    pub harness_root: PathBuf,
}

/// A validated launch, before the generation's private area exists.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub runtime: RuntimeRef,
    pub family: Family,
    /// The command template with the plan-time names filled in.
    pub template: Vec<String>,
    pub directives: Vec<String>,
    pub vars: Vars,
    pub graceful_signal: nix::sys::signal::Signal,
    pub grace_period: Duration,
    /// The runtime's credentials (from the supervisor config), for its environment only.
    pub secret_env: Vec<(String, crate::shim::proto::SecretValue)>,
}

/// Resolves, validates directives, runs (or recalls) the version probe. Every refusal
/// happens here, before any cgroup, socket or process exists.
pub fn plan_launch(
    registry: &Registry,
    runtime: &str,
    directives: &[String],
    paths: &Paths,
) -> Result<LaunchPlan, RegistryError> {
    let r = RuntimeRef::parse(runtime)?;
    let entry = registry.resolve(&r)?;
    entry.family.adapter().validate_directives(directives)?;
    registry.probe(entry, &r, paths)?;
    let vars = Vars {
        bin_dir: paths.bin_dir.clone(),
        harness_root: paths.harness_root.clone(),
        version: r.version.to_string(),
        state_dir: None,
        session_id: None,
    };
    Ok(LaunchPlan {
        template: entry.command.template.clone(),
        directives: directives.to_vec(),
        family: entry.family,
        vars,
        graceful_signal: entry.graceful_signal()?,
        grace_period: entry.grace_period(),
        secret_env: Vec::new(),
        runtime: r,
    })
}
