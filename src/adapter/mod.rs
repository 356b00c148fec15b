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
pub mod modelwire;
pub mod opencode;
pub mod pi;
mod probe;
mod registry;
mod schema;

pub use ackline::{ack_phrase, contract_context, contract_key, handoff_phrase, Check};
pub use probe::*;
pub use registry::*;
pub use schema::*;

use std::path::{Path, PathBuf};

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
    /// Whether the generation runs inside Mosaic's confinement (`crate::confine`): a
    /// harness's own sandbox, which needs namespaces the confinement denies, is then turned
    /// off in favour of the outer one.
    pub confined: bool,
    /// The base URL the harness reaches its model provider at: the gateway's inside a
    /// confined generation, the declared upstream itself in an unconfined one; `None`
    /// when the runtime declares no provider. Written where the family reads it (Claude
    /// Code's `ANTHROPIC_BASE_URL`) and wherever a config overlay says `{mosaic-provider}`.
    pub provider: Option<&'a str>,
    /// The working directory when it is not the private area's `work`: an unconfined
    /// generation's repository workspace (a confined one has it bound over `work`). What
    /// the adapter records as trusted, and the directory the harness starts in.
    pub workspace: Option<&'a Path>,
}

impl PrepareCtx<'_> {
    /// The directory the harness works in: the workspace, else `private` (the area's own).
    pub fn working_dir(&self, private: &Path) -> std::path::PathBuf {
        self.workspace.unwrap_or(private).to_path_buf()
    }
}

/// What a config overlay writes where the harness's provider base URL goes.
pub const PROVIDER_VAR: &str = "{mosaic-provider}";

/// `text` (an overlay file named `name`) with `{mosaic-provider}` replaced by `provider`;
/// refused when it names the variable and the runtime declares no provider.
pub fn expand_provider(text: &str, name: &str, provider: Option<&str>) -> Result<String, String> {
    if !text.contains(PROVIDER_VAR) {
        return Ok(text.to_string());
    }
    match provider {
        Some(url) => Ok(text.replace(PROVIDER_VAR, url)),
        None => Err(format!(
            "config overlay file {name} says {PROVIDER_VAR}, but the runtime declares no provider (providers.<runtime> in the supervisor config)"
        )),
    }
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

/// Copies the regular files at the top of `overlay` into `dest` (0600), `{mosaic-provider}`
/// expanded (`expand_provider`). Symlinks and
/// subdirectories are refused: the overlay is a handful of config files, nothing more.
/// A file the adapter writes itself then collides, which the adapter reports.
pub fn copy_overlay(overlay: &Path, dest: &Path, provider: Option<&str>) -> Result<(), String> {
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
        let text = expand_provider(&text, &name, provider)?;
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

/// How a continuation (spec §14 rule 11) reaches the harness at a settled boundary, and how
/// its result comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContinuationDelivery {
    /// The harness waits in `mosaic lane next` and reports its result with
    /// `mosaic lane continuation-result` (the fake harness).
    LaneNext,
    /// The hook at the end of every turn (Claude Code's and Codex's Stop) waits, once the
    /// generation is active, and answers with a block decision carrying the continuation:
    /// the harness goes on in the same conversation. The result is the answer the turn
    /// ends with at the next Stop.
    SettledHookAnswer,
    /// The harness-side extension asks over the lane socket after each settled boundary
    /// (event `next`) and submits what it gets as a user message of its own session (Pi's
    /// extension, OpenCode's plugin). The result is the answer of the run that message
    /// started, at its settled boundary.
    AssetPrompt,
}

/// The turn typed into an idle Claude Code or Codex pane to bring about the settled boundary
/// (its Stop hook) at which a continuation on its way is given. It carries no continuation.
pub const WAKE_TURN: &str = "Mosaic: your next action is on its way. Reply ok.";

/// The text a real harness is shown for a continuation: its id (which binds the result the
/// harness produces to it) and the next action.
pub fn continuation_text(continuation_id: &str, next_action: &str) -> String {
    format!("Mosaic continuation {continuation_id}. Next action: {next_action}")
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
    /// A turn ended in an error instead of an answer (Claude Code's `StopFailure`: a
    /// provider's refusal it gave up on): the harness is idle, but the turn answered
    /// nothing — no ACK, no continuation's result — and no continuation can be given at it
    /// (its hook's output is not read).
    TurnFailed { error: String },
    /// The harness shows a prompt only a human can answer (Claude Code's permission or
    /// elicitation dialog): the work waits for someone. `prompt` is what it shows.
    WaitingForInput { prompt: String },
    /// A turn started: the harness took a submitted prompt (advisory; tells the
    /// supervisor its typed line was taken, and which turn ends answer the challenge).
    TurnStarted,
    /// The session is ending (advisory: no hook runs on SIGKILL).
    SessionEnd { reason: String },
    /// The harness named its conversation (families that cannot be told one): the first
    /// such id is bound, and every later event must name it.
    Conversation { id: String },
    /// The harness reloaded its extensions in the same conversation (Pi's `/reload`): the
    /// contract already delivered is handed back, as after a compaction; never a first
    /// delivery, never proof of anything ending.
    Reloaded,
    /// The harness was asked to replace the conversation under the live generation (a new
    /// session, a resume, a fork or clone) and its extension refused it: observed, counted.
    ReplacementRefused { what: String },
    /// The extension is ready for the next continuation ([`ContinuationDelivery::AssetPrompt`]):
    /// answered with one (given only while no turn runs), or empty when the generation ends.
    AwaitContinuation,
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
    ) -> Result<HookEvent, HookRefusal>;
    /// What the SessionStart hook prints, carrying `contract` into the model's context.
    fn render_contract(&self, contract: &str) -> String;
    /// How a continuation reaches the harness (every real harness through its own surface).
    fn continuation_delivery(&self) -> ContinuationDelivery;
    /// Whether the supervisor observes this harness's progress in its working directory
    /// (`supervisor::progress`): every real harness, which never calls `mosaic lane
    /// progress` on its own. The fake harness reports its own, as its tests direct.
    fn observes_progress(&self) -> bool {
        true
    }
    /// What the hook or extension prints to hand a continuation's `text` to the harness.
    fn render_continuation(&self, text: &str) -> String {
        text.to_string()
    }
    /// The hook event that waits for a continuation (its `mosaic lane hook` call outlives a
    /// supervisor restart: it asks the restarted one again), if the family has one.
    fn parking_event(&self) -> Option<&'static str> {
        match self.continuation_delivery() {
            ContinuationDelivery::LaneNext => None,
            ContinuationDelivery::SettledHookAnswer => Some("stop"),
            ContinuationDelivery::AssetPrompt => Some("next"),
        }
    }
    /// A turn the supervisor types in at start, for a harness whose session only starts
    /// (and takes its contract) at the first prompt.
    fn bootstrap_turn(&self) -> Option<&'static str> {
        None
    }
    /// Where, under the generation's private area, the harness keeps its own record of its
    /// session (its transcript, or the state file it keeps it in): what is captured, as its
    /// sensitive artifact, when the generation ends. Relative paths, a file or a directory
    /// (taken whole); none may name `..`.
    fn artifact_paths(&self) -> &'static [&'static str];
    /// The conversation id an event names, for a harness that chooses its own: the first
    /// one seen is bound to the generation.
    fn names_conversation(&self, _event: &str, _payload: &serde_json::Value) -> Option<String> {
        None
    }
}

/// `family`'s [`Adapter::artifact_paths`], owned (as a generation's record keeps them).
pub fn artifact_paths_of(family: Family) -> Vec<String> {
    family
        .adapter()
        .artifact_paths()
        .iter()
        .map(|p| p.to_string())
        .collect()
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

pub use ackline::answer_binds;

/// Why a harness's hook event was refused (each one is counted as a refused event and
/// changes nothing).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookRefusal {
    /// The event is about another conversation than the one the generation was started
    /// with (or, before it has one, names none).
    #[error("{0}")]
    OtherConversation(String),
    /// The event would replace the conversation under a live generation (a resume, a
    /// clear, a second session): in-band reset is disabled.
    #[error("{0}")]
    Replaced(String),
    /// An event this family does not send, or one without a field it needs.
    #[error("{0}")]
    Unexpected(String),
}

impl HookRefusal {
    /// A stable category for counting and the lane socket's answer.
    pub fn category(&self) -> &'static str {
        match self {
            Self::OtherConversation(_) => "other-conversation",
            Self::Replaced(_) => "conversation-replaced",
            Self::Unexpected(_) => "unexpected-event",
        }
    }
}

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
    fn the_provider_variable_is_expanded_or_refused() {
        let t = r#"{"baseUrl": "{mosaic-provider}/v1"}"#;
        assert_eq!(
            expand_provider(t, "m.json", Some("http://127.0.0.1:4741")).unwrap(),
            r#"{"baseUrl": "http://127.0.0.1:4741/v1"}"#
        );
        assert!(expand_provider(t, "m.json", None)
            .unwrap_err()
            .contains("declares no provider"));
        assert_eq!(expand_provider("plain", "m.json", None).unwrap(), "plain");
    }

    #[test]
    fn duplicate_claims_are_ambiguous() {
        let t = EMBEDDED[0].1.to_string();
        let e = Registry::from_sources([source("a", t.clone()), source("b", t)]).unwrap_err();
        assert!(matches!(e, RegistryError::Ambiguous { .. }));
    }
}
