//! Runtime adapters and the runtime capability registry (spec §9).
//!
//! **Owns:** loading and validating registry entries, resolving `runtime@version` to exactly
//! one validated entry, running version probes, and building a harness's argv.
//!
//! **Never:** guesses semantics from a command name, launches a runtime or version that is
//! not explicitly validated, or enables in-band reset.

pub mod fake;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("runtime must be written name@version (for example fake@1.0.0), got {0:?}")]
    BadRuntimeRef(String),
    #[error("unknown runtime {runtime:?}; the registry knows: {known}")]
    UnknownRuntime { runtime: String, known: String },
    #[error(
        "runtime {runtime} version {version} is not validated; validated versions: {validated}"
    )]
    UnknownVersion {
        runtime: String,
        version: String,
        validated: String,
    },
    #[error("registry entry {file}: {detail}")]
    BadEntry { file: String, detail: String },
    #[error("registry entries {a} and {b} both claim runtime {runtime} version {version}")]
    Ambiguous {
        runtime: String,
        version: String,
        a: String,
        b: String,
    },
    #[error("cannot read registry directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("version probe for {runtime}@{version} failed: {detail}")]
    Probe {
        runtime: String,
        version: String,
        detail: String,
    },
    #[error("task directives rejected by the {family} adapter: {detail}")]
    Directives { family: String, detail: String },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub runtime: String,
    pub family: Family,
    pub version_range: String,
    pub validated_versions: Vec<String>,
    pub min_validated_version: String,
    pub max_validated_version: String,
    pub in_band_reset: InBandReset,
    pub staging: Staging,
    pub adversarial_evidence_digest: String,
    pub command: Command,
    pub process: Process,
    pub stop: Stop,
    pub contract: Contract,
    pub ack: Ack,
    pub probes: Probes,
    #[serde(skip)]
    pub source: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Fake,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InBandReset {
    Disabled,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Staging {
    Supported,
    Unsupported,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    pub template: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Process {
    pub cgroup_strategy: CgroupStrategy,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CgroupStrategy {
    CgroupV2Generation,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Stop {
    pub graceful_signal: String,
    pub grace_period_ms: u64,
    pub forced: ForcedStop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ForcedStop {
    CgroupKill,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contract {
    pub injection: ContractInjection,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ContractInjection {
    SocketFetch,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub method: AckMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckMethod {
    LaneCli,
}

/// Every probe the spec names must be present; "unsupported" is a deliberate answer, a
/// missing key is a load error.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Probes {
    pub version: VersionProbe,
    pub session_identity: String,
    pub conversation_identity: String,
    pub generation: String,
    pub idle: String,
    pub foreground_command: String,
    pub checkpoint: String,
    pub recovery: String,
    pub descendant_cleanup: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VersionProbe {
    pub command: Vec<String>,
    pub expect: String,
}

impl Entry {
    pub fn graceful_signal(&self) -> Result<nix::sys::signal::Signal, RegistryError> {
        self.stop
            .graceful_signal
            .parse()
            .map_err(|_| self.bad(format!("unknown signal {:?}", self.stop.graceful_signal)))
    }

    pub fn grace_period(&self) -> Duration {
        Duration::from_millis(self.stop.grace_period_ms)
    }

    fn bad(&self, detail: String) -> RegistryError {
        RegistryError::BadEntry {
            file: self.source.clone(),
            detail,
        }
    }

    fn validate(&self) -> Result<semver::VersionReq, RegistryError> {
        let range = semver::VersionReq::parse(&self.version_range)
            .map_err(|e| self.bad(format!("version_range: {e}")))?;
        if self.validated_versions.is_empty() {
            return Err(self.bad("validated_versions is empty".into()));
        }
        let min = semver::Version::parse(&self.min_validated_version)
            .map_err(|e| self.bad(format!("min_validated_version: {e}")))?;
        let max = semver::Version::parse(&self.max_validated_version)
            .map_err(|e| self.bad(format!("max_validated_version: {e}")))?;
        for v in &self.validated_versions {
            let v = semver::Version::parse(v)
                .map_err(|e| self.bad(format!("validated version {v:?}: {e}")))?;
            if !range.matches(&v) || v < min || v > max {
                return Err(self.bad(format!(
                    "validated version {v} lies outside version_range or the min/max bounds"
                )));
            }
        }
        let digest = self.adversarial_evidence_digest.strip_prefix("sha256:");
        if !matches!(digest, Some(h) if h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())) {
            return Err(self.bad("adversarial_evidence_digest must be sha256:<64 hex>".into()));
        }
        if self.command.template.is_empty() {
            return Err(self.bad("command.template is empty".into()));
        }
        if self.stop.grace_period_ms == 0 || self.stop.grace_period_ms > 600_000 {
            return Err(self.bad("stop.grace_period_ms must be 1..=600000".into()));
        }
        self.graceful_signal()?;
        Ok(range)
    }
}

/// A `runtime@version` reference as an operator types it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeRef {
    pub runtime: String,
    pub version: semver::Version,
}

impl RuntimeRef {
    pub fn parse(s: &str) -> Result<Self, RegistryError> {
        let bad = || RegistryError::BadRuntimeRef(s.to_string());
        let (r, v) = s.split_once('@').ok_or_else(bad)?;
        if r.is_empty()
            || !r
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        {
            return Err(bad());
        }
        Ok(Self {
            runtime: r.to_string(),
            version: semver::Version::parse(v).map_err(|_| bad())?,
        })
    }
}

impl std::fmt::Display for RuntimeRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.runtime, self.version)
    }
}

/// The loaded registry.
#[derive(Debug, Clone)]
pub struct Registry {
    entries: Vec<(Entry, semver::VersionReq)>,
}

/// Entries compiled into the binary, so `mosaic up` works from a bare checkout.
const EMBEDDED: &[(&str, &str)] = &[(
    "registry/fake.toml",
    include_str!("../../registry/fake.toml"),
)];

impl Registry {
    pub fn embedded() -> Result<Self, RegistryError> {
        Self::from_sources(EMBEDDED.iter().map(|(n, t)| (n.to_string(), t.to_string())))
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
            sources.push((f.display().to_string(), text));
        }
        Self::from_sources(sources)
    }

    pub fn from_sources(
        sources: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, RegistryError> {
        let mut entries: Vec<(Entry, semver::VersionReq)> = Vec::new();
        for (name, text) in sources {
            let mut e: Entry = toml::from_str(&text).map_err(|err| RegistryError::BadEntry {
                file: name.clone(),
                detail: err.to_string(),
            })?;
            e.source = name;
            let range = e.validate()?;
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
        Ok(Self { entries })
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

/// Substitutes `{bin_dir}`, `{version}` and `{directives}` in a template.
pub fn expand(
    template: &[String],
    bin_dir: &Path,
    version: &str,
    directives: &[String],
) -> Vec<String> {
    let mut out = Vec::new();
    for t in template {
        if t == "{directives}" {
            out.extend(directives.iter().cloned());
        } else {
            out.push(
                t.replace("{bin_dir}", &bin_dir.display().to_string())
                    .replace("{version}", version),
            );
        }
    }
    out
}

/// A launch-ready harness: what the shim will exec.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    pub runtime: RuntimeRef,
    pub argv: Vec<String>,
    pub graceful_signal: nix::sys::signal::Signal,
    pub grace_period: Duration,
}

/// Resolves, validates directives, runs the version probe and builds the argv. Every
/// refusal happens here, before any cgroup, socket or process exists.
pub fn plan_launch(
    registry: &Registry,
    runtime: &str,
    directives: &[String],
    bin_dir: &Path,
) -> Result<LaunchPlan, RegistryError> {
    let r = RuntimeRef::parse(runtime)?;
    let entry = registry.resolve(&r)?;
    match entry.family {
        Family::Fake => fake::validate_directives(directives)?,
    }
    probe_version(entry, &r, bin_dir)?;
    Ok(LaunchPlan {
        argv: expand(
            &entry.command.template,
            bin_dir,
            &r.version.to_string(),
            directives,
        ),
        graceful_signal: entry.graceful_signal()?,
        grace_period: entry.grace_period(),
        runtime: r,
    })
}

/// Runs the entry's version probe; the installed binary must report exactly the version
/// requested. A probe that disagrees, fails or cannot run refuses the launch.
pub fn probe_version(entry: &Entry, r: &RuntimeRef, bin_dir: &Path) -> Result<(), RegistryError> {
    let v = r.version.to_string();
    let fail = |detail: String| RegistryError::Probe {
        runtime: r.runtime.clone(),
        version: v.clone(),
        detail,
    };
    let argv = expand(&entry.probes.version.command, bin_dir, &v, &[]);
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| fail("empty probe command".into()))?;
    let out = std::process::Command::new(prog)
        .args(rest)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| fail(format!("cannot run {prog}: {e}")))?;
    let got = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let want = entry.probes.version.expect.replace("{version}", &v);
    if !out.status.success() || got != want {
        return Err(fail(format!(
            "expected {want:?}, probe printed {got:?} ({})",
            out.status
        )));
    }
    Ok(())
}

/// Helper for tests and `doctor`: the registry's known runtimes as a map.
pub fn summary(reg: &Registry) -> BTreeMap<String, String> {
    reg.entries
        .iter()
        .map(|(e, _)| (e.runtime.clone(), e.validated_versions.join(",")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg() -> Registry {
        Registry::embedded().unwrap()
    }

    #[test]
    fn resolves_only_validated_versions() {
        let r = reg();
        assert!(r.resolve(&RuntimeRef::parse("fake@1.0.0").unwrap()).is_ok());
        // Inside the semver range but never validated: refused.
        assert!(matches!(
            r.resolve(&RuntimeRef::parse("fake@1.0.1").unwrap()),
            Err(RegistryError::UnknownVersion { .. })
        ));
        assert!(matches!(
            r.resolve(&RuntimeRef::parse("fake@2.0.0").unwrap()),
            Err(RegistryError::UnknownVersion { .. })
        ));
        assert!(matches!(
            r.resolve(&RuntimeRef::parse("claude@1.0.0").unwrap()),
            Err(RegistryError::UnknownRuntime { .. })
        ));
    }

    #[test]
    fn malformed_refs_are_refused() {
        for bad in [
            "fake",
            "fake@",
            "@1.0.0",
            "fake@1",
            "fa ke@1.0.0",
            "../x@1.0.0",
        ] {
            assert!(RuntimeRef::parse(bad).is_err(), "{bad}");
        }
    }

    fn with(edit: impl Fn(String) -> String) -> Result<Registry, RegistryError> {
        Registry::from_sources([("t.toml".to_string(), edit(EMBEDDED[0].1.to_string()))])
    }

    #[test]
    fn entries_are_validated_at_load() {
        assert!(with(|s| s).is_ok());
        type Edit = Box<dyn Fn(String) -> String>;
        let cases: Vec<(&str, Edit)> = vec![
            (
                "in-band reset enabled",
                Box::new(|s| {
                    s.replace(
                        "in_band_reset = \"disabled\"",
                        "in_band_reset = \"enabled\"",
                    )
                }),
            ),
            (
                "unknown key",
                Box::new(|s| s.replace("staging = ", "surprise = 1\nstaging = ")),
            ),
            (
                "missing probe",
                Box::new(|s| s.replace("idle = \"unsupported\"\n", "")),
            ),
            (
                "validated outside range",
                Box::new(|s| {
                    s.replace(
                        "validated_versions = [\"1.0.0\"]",
                        "validated_versions = [\"1.2.0\"]",
                    )
                }),
            ),
            (
                "bad digest",
                Box::new(|s| s.replace("sha256:9f2a", "md5:9f2a")),
            ),
            (
                "bad signal",
                Box::new(|s| s.replace("\"SIGTERM\"", "\"SIGNOPE\"")),
            ),
            (
                "zero grace",
                Box::new(|s| s.replace("grace_period_ms = 1500", "grace_period_ms = 0")),
            ),
            (
                "unknown family",
                Box::new(|s| s.replace("family = \"fake\"", "family = \"claude\"")),
            ),
        ];
        for (name, edit) in cases {
            assert!(with(edit).is_err(), "{name} was accepted");
        }
    }

    #[test]
    fn duplicate_claims_are_ambiguous() {
        let t = EMBEDDED[0].1.to_string();
        let e = Registry::from_sources([("a".to_string(), t.clone()), ("b".to_string(), t)])
            .unwrap_err();
        assert!(matches!(e, RegistryError::Ambiguous { .. }));
    }
}
