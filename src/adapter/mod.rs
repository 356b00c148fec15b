//! Runtime adapters and the runtime capability registry (spec §9).
//!
//! **Owns:** loading and validating registry entries, resolving `runtime@version` to exactly
//! one validated entry, running version probes (with a verdict cache keyed by the binary's
//! identity), and — through one [`Adapter`] per harness family — a generation's private
//! harness state, its argv and environment, and the meaning of the events its hooks forward.
//!
//! **Never:** guesses semantics from a command name, launches a runtime or version that is
//! not explicitly validated, starts a harness with a resume, fork or continue flag, trusts
//! a hook for termination, or enables in-band reset.

pub mod ackline;
pub mod claude;
pub mod codex;
pub mod credentials;
pub mod fake;
pub mod install;
pub mod opencode;
pub mod pi;

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
    #[error("preparing the {family} harness state in {dir}: {detail}")]
    Prepare {
        family: String,
        dir: PathBuf,
        detail: String,
    },
    #[error("credentials for {runtime} in {path}: {detail}")]
    Credentials {
        runtime: String,
        path: PathBuf,
        detail: String,
    },
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
    /// How `mosaic harness install` fetches this runtime (absent: shipped with Mosaic).
    #[serde(default)]
    pub install: Option<Install>,
    #[serde(skip)]
    pub source: String,
}

/// The npm packages that make up one installed runtime, each `name@version` with
/// `{version}` standing for the validated version being installed.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Install {
    pub npm: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Family {
    Fake,
    ClaudeCode,
    Pi,
    #[serde(rename = "opencode")]
    OpenCode,
    Codex,
}

impl Family {
    pub fn name(self) -> &'static str {
        match self {
            Family::Fake => "fake",
            Family::ClaudeCode => "claude-code",
            Family::Pi => "pi",
            Family::OpenCode => "opencode",
            Family::Codex => "codex",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "fake" => Some(Family::Fake),
            "claude-code" => Some(Family::ClaudeCode),
            "pi" => Some(Family::Pi),
            "opencode" => Some(Family::OpenCode),
            "codex" => Some(Family::Codex),
            _ => None,
        }
    }

    /// This family's adapter.
    pub fn adapter(self) -> &'static dyn Adapter {
        match self {
            Family::Fake => &fake::Fake,
            Family::ClaudeCode => &claude::ClaudeCode,
            Family::Pi => &pi::Pi,
            Family::OpenCode => &opencode::OpenCode,
            Family::Codex => &codex::Codex,
        }
    }
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
    /// The harness fetches it over the lane socket (`mosaic lane contract`).
    SocketFetch,
    /// A SessionStart hook fetches it and hands it to the model as additional context.
    SessionStartHook,
    /// An extension fetches it at session start and appends it to the system prompt of
    /// every run (`before_agent_start`).
    BeforeAgentStart,
    /// A plugin fetches it when it loads and pushes it onto the system prompt of every
    /// request (`experimental.chat.system.transform`).
    SystemTransform,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub method: AckMethod,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AckMethod {
    /// The harness fetches the challenge and answers it over the lane socket.
    LaneCli,
    /// The supervisor submits the challenge as a user turn in the lane's pane; the ACK is
    /// the model's answer, taken from the harness's own turn-end hook.
    ChallengeTurn,
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
    /// The entry's `adversarial_evidence_digest` must be the SHA-256 of the evidence file
    /// its conformance suite produced (`tests/conformance.rs`, regenerated by
    /// `scripts/evidence`), and that file must be about this runtime and versions. A
    /// missing, mismatching or foreign evidence file refuses the entry.
    fn check_evidence(&self, evidence: Option<&[u8]>) -> Result<(), RegistryError> {
        use sha2::Digest;
        let Some(bytes) = evidence else {
            return Err(self.bad(
                "no conformance evidence beside the entry (<entry>.evidence.json); run scripts/evidence".into(),
            ));
        };
        let got = format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)));
        if got != self.adversarial_evidence_digest {
            return Err(self.bad(format!(
                "adversarial_evidence_digest {} is not the digest of its evidence file ({got}); run scripts/evidence",
                self.adversarial_evidence_digest
            )));
        }
        let v: serde_json::Value = serde_json::from_slice(bytes)
            .map_err(|e| self.bad(format!("evidence file is not JSON: {e}")))?;
        let versions: Vec<&str> = v["validated_versions"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_str()).collect())
            .unwrap_or_default();
        if v["runtime"].as_str() != Some(self.runtime.as_str())
            || versions
                != self
                    .validated_versions
                    .iter()
                    .map(String::as_str)
                    .collect::<Vec<_>>()
        {
            return Err(
                self.bad("the evidence file is about another runtime or other versions".into())
            );
        }
        Ok(())
    }

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
        let adapter = self.family.adapter();
        // The command is the family's, token by token: a binary Mosaic installed or ships,
        // then only arguments the adapter knows (an allowlist, so no spelling of a resume,
        // fork or override flag — attached, combined or via a wrapper shell — gets in).
        let ours = |t: &str| t.starts_with("{harness_root}/") || t.starts_with("{bin_dir}/");
        let Some((prog, args)) = self.command.template.split_first() else {
            return Err(self.bad("command.template is empty".into()));
        };
        if !ours(prog) {
            return Err(self.bad(format!(
                "command.template must start with a binary under {{harness_root}}/ or {{bin_dir}}/, not {prog:?}"
            )));
        }
        if let Some(a) = args
            .iter()
            .find(|a| !adapter.allowed_args().contains(&a.as_str()))
        {
            return Err(self.bad(format!(
                "the {} adapter does not take {a:?} (allowed: {:?})",
                self.family.name(),
                adapter.allowed_args()
            )));
        }
        if let Some(a) = self
            .probes
            .version
            .command
            .iter()
            .find(|a| !ours(a) && !["--version", "--probe-version"].contains(&a.as_str()))
        {
            return Err(self.bad(format!("the version probe may not run {a:?}")));
        }
        for arg in self
            .command
            .template
            .iter()
            .chain(&self.probes.version.command)
        {
            let flag = arg.split('=').next().unwrap_or(arg);
            if adapter.forbidden_args().contains(&flag) {
                return Err(self.bad(format!(
                    "{arg:?} would resume, fork or continue an old session; a generation is always a fresh process"
                )));
            }
        }
        if (self.contract.injection, self.ack.method) != adapter.surfaces() {
            return Err(self.bad(format!(
                "the {} adapter injects and acknowledges through {:?}",
                self.family.name(),
                adapter.surfaces()
            )));
        }
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
    probes: std::sync::Arc<ProbeCache>,
}

/// Entries compiled into the binary, so `mosaic up` works from a bare checkout.
/// The entries built into the binary: each entry with its conformance evidence.
const EMBEDDED: &[(&str, &str, &[u8])] = &[
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

/// Runs the entry's version probe; the installed binary must report exactly the version
/// requested. A probe that disagrees, fails or cannot run refuses the launch.
pub fn probe_version(entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Result<(), RegistryError> {
    let v = r.version.to_string();
    let fail = |detail: String| RegistryError::Probe {
        runtime: r.runtime.clone(),
        version: v.clone(),
        detail,
    };
    let argv = probe_argv(entry, r, paths);
    let (prog, rest) = argv
        .split_first()
        .ok_or_else(|| fail("empty probe command".into()))?;
    // A clean environment and a throwaway HOME/TMPDIR: the probe must not read or write the
    // supervisor's own state (harnesses create config and cache directories on any start),
    // and it is killed if it does not answer in time.
    let home = std::env::temp_dir().join(format!("mosaic-probe-{}", uuid::Uuid::new_v4().simple()));
    crate::util::durable::ensure_dir(&home, 0o700).map_err(|e| fail(e.to_string()))?;
    let out = crate::util::run_bounded(
        std::process::Command::new(prog)
            .args(rest)
            .env_clear()
            .env("PATH", "/usr/local/bin:/usr/bin:/bin")
            .env("HOME", &home)
            .env("TMPDIR", &home)
            // Claude Code puts a socket under $XDG_RUNTIME_DIR, else in /tmp/cc-socks-<uid>.
            .env("XDG_RUNTIME_DIR", &home)
            .env("XDG_CONFIG_HOME", &home)
            .env("XDG_DATA_HOME", &home)
            .env("XDG_STATE_HOME", &home)
            .env("XDG_CACHE_HOME", &home)
            .env("LANG", "C.UTF-8")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null()),
        PROBE_TIMEOUT,
    );
    let _ = std::fs::remove_dir_all(&home);
    let out = out.map_err(|e| fail(format!("cannot run {prog}: {e}")))?;
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

/// How long a version probe may take before it is killed and the launch refused.
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

fn probe_argv(entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Vec<String> {
    let vars = Vars {
        bin_dir: paths.bin_dir.clone(),
        harness_root: paths.harness_root.clone(),
        version: r.version.to_string(),
        ..Vars::default()
    };
    expand(&entry.probes.version.command, &vars, &[])
}

/// The identity of one file a probe runs: a binary replaced, rewritten or touched in place
/// changes at least one of these.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct FileId {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    ctime: (i64, i64),
    mtime: (i64, i64),
}

fn file_id(p: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let real = std::fs::canonicalize(p).ok()?;
    let m = std::fs::metadata(&real).ok()?;
    m.is_file().then(|| FileId {
        path: real,
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        ctime: (m.ctime(), m.ctime_nsec()),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// Passed probes, by runtime and the identity of every file the probe ran. A probe is
/// re-run whenever any of those files changes (a binary swapped or rewritten in place), or
/// its symlink points elsewhere; a failed probe is never remembered.
#[derive(Debug, Default)]
pub struct ProbeCache {
    passed: std::sync::Mutex<std::collections::HashSet<(String, Vec<FileId>)>>,
    runs: std::sync::atomic::AtomicU64,
}

impl ProbeCache {
    /// How many probes actually ran (for tests and metrics).
    pub fn runs(&self) -> u64 {
        self.runs.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl Registry {
    /// The version probe, recalled when the same binary already passed it.
    pub fn probe(&self, entry: &Entry, r: &RuntimeRef, paths: &Paths) -> Result<(), RegistryError> {
        let argv = probe_argv(entry, r, paths);
        let ids: Option<Vec<FileId>> = {
            let files: Vec<FileId> = argv
                .iter()
                .filter(|a| a.starts_with('/'))
                .filter_map(|a| file_id(Path::new(a)))
                .collect();
            // Only a probe whose program is a file we can identify can be cached.
            (argv.first().is_some_and(|a| a.starts_with('/')) && !files.is_empty()).then_some(files)
        };
        let key = ids.map(|ids| (r.to_string(), ids));
        if let Some(k) = &key {
            if self.probes.passed.lock().is_ok_and(|p| p.contains(k)) {
                return Ok(());
            }
        }
        self.probes
            .runs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        probe_version(entry, r, paths)?;
        if let Some(k) = key {
            // The files must not have changed while the probe ran.
            let still: Vec<FileId> = k.1.iter().filter_map(|f| file_id(&f.path)).collect();
            if still == k.1 {
                if let Ok(mut p) = self.probes.passed.lock() {
                    p.insert(k);
                }
            }
        }
        Ok(())
    }

    pub fn probe_cache(&self) -> &ProbeCache {
        &self.probes
    }

    /// The entry for an installable runtime reference (for `mosaic harness install`).
    pub fn entry(&self, r: &RuntimeRef) -> Result<&Entry, RegistryError> {
        self.resolve(r)
    }
}

/// One generation's harness, ready to hand to the shim.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub cwd: Option<PathBuf>,
    /// The conversation id the harness was told to use (checked on every hook event).
    pub conversation_id: Option<String>,
}

/// What one generation's preparation knows.
#[derive(Debug, Clone)]
pub struct PrepareCtx<'a> {
    pub plan: &'a LaunchPlan,
    /// The generation's private harness area (created empty, 0700, by the caller).
    pub state_dir: &'a Path,
    /// A short private runtime directory for the harness's own sockets (0700; on the
    /// supervisor's runtime dir, so its paths fit `sun_path`).
    pub run_dir: &'a Path,
    /// The `mosaic` binary the harness-side assets call back through.
    pub mosaic_exe: &'a Path,
    /// The operator's config overlay for this runtime (provider, model selection), copied
    /// into the harness's config home before the adapter writes its own files.
    pub overlay: Option<&'a Path>,
}

/// Writes a new file (never over an existing one) and syncs it.
pub fn write_new(dir: &Path, name: &str, text: &str, mode: u32) -> Result<(), std::io::Error> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(dir.join(name))?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

/// Copies the regular files at the top of `overlay` into `dest` (0600). Symlinks and
/// subdirectories are refused: the overlay is a handful of config files, nothing more.
/// A file the adapter writes itself then collides, which the adapter reports.
pub fn copy_overlay(overlay: &Path, dest: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(overlay)
        .map_err(|e| format!("config overlay {}: {e}", overlay.display()))?;
    for e in entries {
        let e = e.map_err(|e| format!("config overlay {}: {e}", overlay.display()))?;
        let ft = e
            .file_type()
            .map_err(|err| format!("config overlay {}: {err}", e.path().display()))?;
        if !ft.is_file() {
            return Err(format!(
                "config overlay {}: only regular files are copied, not {}",
                overlay.display(),
                e.path().display()
            ));
        }
        let text = std::fs::read_to_string(e.path())
            .map_err(|err| format!("config overlay {}: {err}", e.path().display()))?;
        let name = e.file_name().to_string_lossy().into_owned();
        write_new(dest, &name, &text, 0o600)
            .map_err(|err| format!("config overlay file {name}: {err}"))?;
    }
    Ok(())
}

/// How the activation challenge reaches the harness.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeDelivery {
    /// The harness asks for it over the lane socket.
    SocketFetch,
    /// The supervisor types it into the lane's pane as a user turn.
    PaneTurn,
}

/// A hook event, as the family's adapter understood it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookEvent {
    /// The session opened: hand the contract to the model. `render` turns the contract
    /// text into what the hook prints.
    SessionStart,
    /// The harness compacted the conversation (its summary replaced the history) and asks
    /// for its session context again: the contract already delivered is handed back, the
    /// same digest, so the model keeps it past the compaction.
    ContextCompacted,
    /// A turn ended and the harness is idle (advisory). `last_message` is the model's
    /// final answer of that turn, where the harness reports it.
    Settled { last_message: Option<String> },
    /// A turn started: the harness took a submitted prompt (advisory; tells the
    /// supervisor its typed line was taken, and which turn ends answer the challenge).
    TurnStarted,
    /// The session is ending (advisory: no hook runs on SIGKILL).
    SessionEnd { reason: String },
    /// The harness named its conversation (families that cannot be told one): the first
    /// such id is bound, and every later event must name it.
    Conversation { id: String },
    /// Understood and of no consequence (a subagent's session, a repeated binding).
    Ignored,
}

/// One harness family's mechanics. Every implementation is stateless: what a generation
/// needs lives in its private area and its records.
pub trait Adapter: Send + Sync {
    fn family(&self) -> Family;
    /// Refuses directives the family cannot take (real harnesses take none: their task
    /// arrives as the contract).
    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError>;
    /// Arguments that would resume, fork or continue a session, or start a daemon: refused
    /// in any template (named even though the allowlist below already keeps them out, so a
    /// too-wide allowlist cannot let them in).
    fn forbidden_args(&self) -> &'static [&'static str];
    /// Every argument a template may carry after its binary, exactly.
    fn allowed_args(&self) -> &'static [&'static str];
    /// The (contract injection, ACK method) pair this adapter implements.
    fn surfaces(&self) -> (ContractInjection, AckMethod);
    /// How the activation check reaches the harness: follows from its ACK method.
    fn challenge_delivery(&self) -> ChallengeDelivery {
        match self.surfaces().1 {
            AckMethod::LaneCli => ChallengeDelivery::SocketFetch,
            AckMethod::ChallengeTurn => ChallengeDelivery::PaneTurn,
        }
    }
    /// Writes the generation's private harness state and returns how to start it there.
    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError>;
    /// Interprets one event the harness-side assets forwarded. `conversation` is the id the
    /// generation was started with; an event about another conversation is refused.
    fn hook(
        &self,
        event: &str,
        payload: &serde_json::Value,
        conversation: Option<&str>,
    ) -> Result<HookEvent, String>;
    /// What the SessionStart hook prints, carrying `contract` into the model's context.
    fn render_contract(&self, contract: &str) -> String;
    /// A turn the supervisor types in at start, for a harness whose session only starts
    /// (and takes its contract) at the first prompt.
    fn bootstrap_turn(&self) -> Option<&'static str> {
        None
    }
    /// The conversation id an event names, for a harness that chooses its own: the first
    /// one seen is bound to the generation.
    fn names_conversation(&self, _event: &str, _payload: &serde_json::Value) -> Option<String> {
        None
    }
}

/// Directives refused: a real harness takes its task as the contract.
pub fn no_directives(family: Family, directives: &[String]) -> Result<(), RegistryError> {
    if directives.is_empty() {
        return Ok(());
    }
    Err(RegistryError::Directives {
        family: family.name().into(),
        detail: format!(
            "{} takes its task as the contract, not as directives",
            family.name()
        ),
    })
}

/// The text every family puts in front of the model as its contract. It carries the
/// contract key, which the activation answer must repeat: only a model that has this text
/// in its context can acknowledge.
pub fn contract_context(task_text: &str, contracts_digest: &str, key: &str) -> String {
    format!(
        "Mosaic contract {contracts_digest}, contract key {key}. You run as one generation of \
         a Mosaic lane; your task follows. When Mosaic sends an activation check (a line with \
         mosaic-challenge:<hex>), answer it exactly as asked before anything else.\n\n{task_text}"
    )
}

fn derive(label: &[u8], parts: &[&[u8]]) -> String {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(label);
    for p in parts {
        h.update(b"\0");
        h.update(p);
    }
    hex::encode(&h.finalize()[..16])
}

/// The key a generation's contract text carries (derived from the contract's digest and the
/// generation, so a contract delivered to another generation does not fit).
pub fn contract_key(contracts_digest: &str, lane_incarnation_id: &str, generation: u64) -> String {
    derive(
        b"mosaic contract key v1",
        &[
            contracts_digest.as_bytes(),
            lane_incarnation_id.as_bytes(),
            &generation.to_be_bytes(),
        ],
    )[..12]
        .to_string()
}

/// The phrase a harness must answer to acknowledge `challenge_id`: derived from the
/// challenge and the generation, so it cannot be produced without seeing the challenge
/// turn, and it does not reveal the challenge id itself.
pub fn ack_phrase(challenge_id: &str, lane_incarnation_id: &str, generation: u64) -> String {
    derive(
        b"mosaic harness ack v1",
        &[
            challenge_id.as_bytes(),
            lane_incarnation_id.as_bytes(),
            &generation.to_be_bytes(),
        ],
    )
}

pub use ackline::answer_binds;

/// Checks a task for `runtime_id` (`family@version`): what every task must be
/// (`protocol::task::validate_envelope`), then the family's own grammar where it has one.
pub fn validate_task(runtime_id: &str, task: &str) -> Result<(), crate::protocol::task::TaskError> {
    let family = crate::protocol::task::validate_envelope(runtime_id, task)?;
    match family.as_str() {
        // The fake harness's task is its directive list.
        "fake" => crate::fake_harness::parse_all(&[task])
            .map(|_| ())
            .map_err(|e| crate::protocol::task::TaskError::Grammar {
                family,
                detail: e.to_string(),
            }),
        // Real harnesses take free text.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_limits_and_family_grammar() {
        use crate::protocol::task::{TaskError, MAX_TASK_BYTES};
        let validate = validate_task;
        assert_eq!(validate("fake@1.0.0", "  "), Err(TaskError::Empty));
        assert!(validate("fake@1.0.0", "print=hi spawn=2").is_ok());
        assert!(matches!(
            validate("fake@1.0.0", "print=hi frobnicate"),
            Err(TaskError::Grammar { .. })
        ));
        assert!(validate("claude-code@2.1.332", "frobnicate the repo").is_ok());
        let big = "x".repeat(MAX_TASK_BYTES);
        assert!(matches!(
            validate("other@1", &big),
            Err(TaskError::TooLarge { .. })
        ));
        assert!(validate("other@1", &"x".repeat(MAX_TASK_BYTES - 2)).is_ok());
        assert!(matches!(
            validate("nofamily", "x"),
            Err(TaskError::BadRuntime(_))
        ));
    }

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

    fn source(name: &str, text: String) -> Source {
        Source {
            name: name.into(),
            text,
            evidence: Some(EMBEDDED[0].2.to_vec()),
        }
    }

    fn with(edit: impl Fn(String) -> String) -> Result<Registry, RegistryError> {
        Registry::from_sources([source("t.toml", edit(EMBEDDED[0].1.to_string()))])
    }

    #[test]
    fn evidence_must_be_present_match_and_be_about_the_entry() {
        let t = EMBEDDED[0].1.to_string();
        let e = |evidence: Option<Vec<u8>>| {
            Registry::from_sources([Source {
                name: "t.toml".into(),
                text: t.clone(),
                evidence,
            }])
        };
        assert!(e(Some(EMBEDDED[0].2.to_vec())).is_ok());
        assert!(e(None).is_err(), "missing evidence accepted");
        let mut changed = EMBEDDED[0].2.to_vec();
        changed.push(b' ');
        assert!(
            e(Some(changed)).is_err(),
            "evidence not matching the digest accepted"
        );
        // A typed-in digest that matches a foreign file is refused too.
        let foreign = br#"{"runtime":"other","validated_versions":["1.0.0"]}"#.to_vec();
        let digest = {
            use sha2::Digest;
            format!("sha256:{}", hex::encode(sha2::Sha256::digest(&foreign)))
        };
        let re = Registry::from_sources([Source {
            name: "t.toml".into(),
            text: t
                .lines()
                .map(|l| {
                    if l.starts_with("adversarial_evidence_digest") {
                        format!("adversarial_evidence_digest = \"{digest}\"")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
            evidence: Some(foreign),
        }]);
        assert!(re.is_err(), "evidence about another runtime accepted");
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
                Box::new(|s| {
                    s.replace(
                        "adversarial_evidence_digest = \"sha256:",
                        "adversarial_evidence_digest = \"md5:",
                    )
                }),
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
    fn probe_verdicts_are_cached_by_binary_identity_and_redone_when_it_changes() {
        use std::os::unix::fs::PermissionsExt;
        let reg = reg();
        let r = RuntimeRef::parse("fake@1.0.0").unwrap();
        let entry = reg.resolve(&r).unwrap();
        let dir =
            std::env::temp_dir().join(format!("mosaic-probe-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("mosaic-fake-harness");
        let write = |v: &str| {
            // Replaced, not rewritten: a new inode, as an upgrade would install it.
            let tmp = dir.join("next");
            std::fs::write(&tmp, format!("#!/bin/sh\necho 'fake {v}'\n")).unwrap();
            std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
            std::fs::rename(&tmp, &bin).unwrap();
        };
        let paths = Paths {
            bin_dir: dir.clone(),
            harness_root: dir.clone(),
        };
        write("1.0.0");
        reg.probe(entry, &r, &paths).unwrap();
        reg.probe(entry, &r, &paths).unwrap();
        assert_eq!(
            reg.probe_cache().runs(),
            1,
            "an unchanged binary was probed again"
        );
        // Swapped in place for another version: probed again, and refused.
        write("9.9.9");
        assert!(
            reg.probe(entry, &r, &paths).is_err(),
            "a swapped binary was accepted"
        );
        assert!(
            reg.probe(entry, &r, &paths).is_err(),
            "a failed probe was cached"
        );
        assert_eq!(reg.probe_cache().runs(), 3);
        // Touched in place (same inode, new change time): probed again.
        write("1.0.0");
        reg.probe(entry, &r, &paths).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o700)).unwrap();
        reg.probe(entry, &r, &paths).unwrap();
        assert_eq!(reg.probe_cache().runs(), 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn templates_that_resume_or_fork_are_refused() {
        let claude = include_str!("../../registry/claude-code.toml");
        let load = |t: String| {
            let evidence =
                br#"{"runtime":"claude-code","validated_versions":["2.1.332"]}"#.to_vec();
            let digest = {
                use sha2::Digest;
                format!("sha256:{}", hex::encode(sha2::Sha256::digest(&evidence)))
            };
            let t = t
                .lines()
                .map(|l| {
                    if l.starts_with("adversarial_evidence_digest") {
                        format!("adversarial_evidence_digest = \"{digest}\"")
                    } else {
                        l.to_string()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
            Registry::from_sources([Source {
                name: "c.toml".into(),
                text: t,
                evidence: Some(evidence),
            }])
        };
        assert!(load(claude.to_string()).is_ok());
        for flag in [
            "--resume",
            "--continue",
            "--fork-session",
            "-c",
            "--bare",
            "-cr",
            "--resume=x",
            "--model",
        ] {
            let t = claude.replace(
                "\"--session-id\", ",
                &format!("\"{flag}\", \"--session-id\", "),
            );
            assert!(load(t).is_err(), "{flag} accepted");
        }
        // Not a binary Mosaic installed: a wrapper shell could run anything.
        let t = claude.replace(
            "\"{harness_root}/claude-code@{version}/node_modules/.bin/claude\",\n    \"--session-id\"",
            "\"/bin/sh\", \"-c\", \"claude --resume\",\n    \"--session-id\"",
        );
        assert!(load(t).is_err(), "a wrapper shell accepted");
        // The family decides its surfaces: a Claude Code entry cannot claim socket fetch.
        let t = claude.replace(
            "injection = \"session-start-hook\"",
            "injection = \"socket-fetch\"",
        );
        assert!(load(t).is_err());
    }

    #[test]
    fn only_an_answer_carrying_the_phrase_acknowledges() {
        let p = ack_phrase("ch-1", "li-1", 3);
        assert_ne!(p, ack_phrase("ch-2", "li-1", 3));
        assert_ne!(p, ack_phrase("ch-1", "li-1", 4));
        let k = contract_key("sha256:aa", "li-1", 3);
        assert_ne!(k, contract_key("sha256:ab", "li-1", 3));
        assert_ne!(k, contract_key("sha256:aa", "li-1", 4));
        assert!(answer_binds(&format!("mosaic-ack:{p}-{k}"), &p, &k));
        assert!(answer_binds(
            &format!("Sure. `mosaic-ack:{p}-{k}`."),
            &p,
            &k
        ));
        // The phrase without the contract key: the challenge was seen, the contract was not.
        assert!(!answer_binds(&format!("mosaic-ack:{p}"), &p, &k));
        assert!(!answer_binds(&format!("mosaic-ack:{p}-{k}0"), &p, &k));
        assert!(!answer_binds(&format!("mosaic-challenge:{p}"), &p, &k));
        assert!(!answer_binds("mosaic-ack:", &p, &k));
        assert!(!answer_binds(&p, &p, &k));
    }

    #[test]
    fn duplicate_claims_are_ambiguous() {
        let t = EMBEDDED[0].1.to_string();
        let e = Registry::from_sources([source("a", t.clone()), source("b", t)]).unwrap_err();
        assert!(matches!(e, RegistryError::Ambiguous { .. }));
    }
}
