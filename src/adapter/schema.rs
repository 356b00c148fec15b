//! The registry's schema (spec §9): what one entry declares about a runtime, checked when
//! it is loaded, and the `runtime@version` reference operators type.

use std::time::Duration;

use serde::Deserialize;

use super::*;

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
    pub(super) fn check_evidence(&self, evidence: Option<&[u8]>) -> Result<(), RegistryError> {
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

    pub(super) fn validate(&self) -> Result<semver::VersionReq, RegistryError> {
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
                    "{arg:?} is Mosaic's to decide: it would resume, fork or continue an old session, switch off the hooks or extensions the contract travels by, or trust what a repository brings; a generation is always a fresh process"
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
