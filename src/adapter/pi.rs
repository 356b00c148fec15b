//! The Pi adapter (`pi`).
//!
//! Each generation gets its own `PI_CODING_AGENT_DIR` (settings, models, sessions) and
//! `HOME` in its private area, the operator's config overlay copied in (provider and model
//! selection), Mosaic's extension (`adapters/pi/mosaic.js`) in its extensions directory, and
//! a conversation id the supervisor chose (`--session-id`, in a directory where no session
//! with that id can exist). The contract reaches the model through the extension's
//! `before_agent_start` (system prompt of every run); the activation check is a user turn
//! typed into the pane; the ACK is the run's last assistant text as reported at
//! `agent_settled`, Pi's final idle boundary.

use serde_json::Value;

use super::{
    copy_overlay, expand, write_new, AckMethod, Adapter, ContractInjection, Family, HookEvent,
    HookRefusal, PrepareCtx, Prepared, RegistryError,
};

pub struct Pi;

const EXTENSION: &str = include_str!("../../adapters/pi/mosaic.js");

impl Adapter for Pi {
    fn family(&self) -> Family {
        Family::Pi
    }

    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError> {
        super::no_directives(Family::Pi, directives)
    }

    fn forbidden_args(&self) -> &'static [&'static str] {
        &[
            "--continue",
            "-c",
            "--resume",
            "-r",
            "--session",
            "--fork",
            // Project-local resources are never trusted (prepare adds --no-approve).
            "--approve",
            "-a",
            // The extension is how the contract and the ACK travel.
            "--no-extensions",
            "-ne",
        ]
    }

    fn allowed_args(&self) -> &'static [&'static str] {
        &[
            // The script Pi's Node runs.
            "{harness_root}/pi@{version}/node_modules/@earendil-works/pi-coding-agent/dist/bundle/cli.js",
            "--session-id",
            "{session_id}",
        ]
    }

    fn surfaces(&self) -> (ContractInjection, AckMethod) {
        (
            ContractInjection::BeforeAgentStart,
            AckMethod::ChallengeTurn,
        )
    }

    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError> {
        let dir = ctx.state_dir;
        let fail = |detail: String| RegistryError::Prepare {
            family: "pi".into(),
            dir: dir.to_path_buf(),
            detail,
        };
        let (agent, home, tmp, work) = (
            dir.join("agent"),
            dir.join("home"),
            dir.join("tmp"),
            dir.join("work"),
        );
        for d in [&agent, &home, &tmp, &work, &agent.join("extensions")] {
            crate::util::durable::ensure_dir(d, 0o700)
                .map_err(|e| fail(format!("{}: {e}", d.display())))?;
        }
        if let Some(o) = ctx.overlay {
            copy_overlay(o, &agent, ctx.provider).map_err(&fail)?;
        }
        write_new(&agent.join("extensions"), "mosaic.js", EXTENSION, 0o400)
            .map_err(|e| fail(format!("extensions/mosaic.js: {e}")))?;
        let session_id = uuid::Uuid::new_v4().to_string();
        let mut vars = ctx.plan.vars.clone();
        vars.state_dir = Some(dir.to_path_buf());
        vars.session_id = Some(session_id.clone());
        let s = |p: &std::path::Path| p.display().to_string();
        let env = vec![
            ("PI_CODING_AGENT_DIR".into(), s(&agent)),
            ("HOME".into(), s(&home)),
            ("TMPDIR".into(), s(&tmp)),
            // No downloads of fd/ripgrep, no version check, no telemetry at start.
            ("PI_OFFLINE".into(), "1".into()),
            ("PI_SKIP_VERSION_CHECK".into(), "1".into()),
            ("PI_TELEMETRY".into(), "0".into()),
        ];
        let mut argv = expand(&ctx.plan.template, &vars, &[]);
        // Project-local resources (the working directory's `.pi/`, an ancestor's
        // `.agents/skills`) would make Pi ask at start whether to trust them, in a pane
        // nobody watches, before the generation is active: never trusted, never asked.
        argv.push("--no-approve".to_string());
        Ok(Prepared {
            argv,
            env,
            cwd: Some(ctx.working_dir(&work)),
            conversation_id: Some(session_id),
        })
    }

    fn hook(
        &self,
        event: &str,
        payload: &Value,
        conversation: Option<&str>,
    ) -> Result<HookEvent, HookRefusal> {
        let sid = payload["session_id"].as_str().unwrap_or("");
        if conversation != Some(sid) {
            return Err(HookRefusal::OtherConversation(format!(
                "event about conversation {sid:?}, not this generation's"
            )));
        }
        match event {
            "session-start" => match payload["reason"].as_str() {
                Some("startup") => Ok(HookEvent::SessionStart),
                // The same conversation, its extensions imported again.
                Some("reload") => Ok(HookEvent::Reloaded),
                other => Err(HookRefusal::Replaced(format!(
                    "session_start from {other:?}: a generation only ever starts fresh (in-band reset is disabled)"
                ))),
            },
            "agent-start" => Ok(HookEvent::TurnStarted),
            // An aborted run answered nothing: its partial text neither acknowledges nor
            // answers a continuation.
            "agent-settled" => Ok(HookEvent::Settled {
                last_message: (payload["aborted"] != Value::Bool(true))
                    .then(|| payload["last_assistant_message"].as_str())
                    .flatten()
                    .map(str::to_string),
            }),
            "next" => Ok(HookEvent::AwaitContinuation),
            // An extension's dialog (a select, confirm, input, editor or custom screen)
            // waits for a human: Pi's own `ui_prompt_start`.
            "ui-prompt" => Ok(HookEvent::WaitingForInput {
                prompt: format!(
                    "{}: {}",
                    payload["kind"].as_str().unwrap_or("prompt"),
                    payload["title"].as_str().unwrap_or_default()
                ),
            }),
            // `/new`, `/resume` (session_before_switch), `/fork`, `/clone`
            // (session_before_fork): the extension cancelled them.
            "session-before-switch" | "session-before-fork" => {
                Ok(HookEvent::ReplacementRefused {
                    what: format!(
                        "{event} {}",
                        payload["reason"]
                            .as_str()
                            .or(payload["position"].as_str())
                            .unwrap_or("")
                    )
                    .trim()
                    .to_string(),
                })
            }
            "session-shutdown" => Ok(HookEvent::SessionEnd {
                reason: payload["reason"].as_str().unwrap_or("unknown").to_string(),
            }),
            e => Err(HookRefusal::Unexpected(format!("unexpected Pi event {e:?}"))),
        }
    }

    fn render_contract(&self, contract: &str) -> String {
        contract.to_string()
    }

    fn continuation_delivery(&self) -> super::ContinuationDelivery {
        super::ContinuationDelivery::AssetPrompt
    }

    // Its JSONL sessions live in the agent directory (`PI_CODING_AGENT_DIR`).
    fn artifact_paths(&self) -> &'static [&'static str] {
        &["agent/sessions"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_must_name_this_conversation_and_a_fresh_start() {
        let p = Pi;
        let settled = json!({"session_id": "s1", "aborted": false, "last_assistant_message": "x"});
        assert!(matches!(
            p.hook("agent-settled", &settled, Some("s1")),
            Ok(HookEvent::Settled { .. })
        ));
        assert!(p.hook("agent-settled", &settled, Some("s2")).is_err());
        // agent_end and turn_end are not settled boundaries.
        assert!(p.hook("agent-end", &settled, Some("s1")).is_err());
        assert!(p.hook("turn-end", &settled, Some("s1")).is_err());
        for reason in ["resume", "fork", "new"] {
            let e = json!({"session_id": "s1", "reason": reason});
            assert!(p.hook("session-start", &e, Some("s1")).is_err(), "{reason}");
        }
        // A reload keeps the conversation: the contract is handed back.
        let reload = json!({"session_id": "s1", "reason": "reload"});
        assert_eq!(
            p.hook("session-start", &reload, Some("s1")),
            Ok(HookEvent::Reloaded)
        );
        // An aborted run answers nothing.
        let aborted = json!({"session_id": "s1", "aborted": true, "last_assistant_message": "x"});
        assert_eq!(
            p.hook("agent-settled", &aborted, Some("s1")),
            Ok(HookEvent::Settled { last_message: None })
        );
        // An extension's dialog waits for a human; about another conversation, refused.
        let prompt = json!({"session_id": "s1", "kind": "select", "title": "Allow?"});
        assert_eq!(
            p.hook("ui-prompt", &prompt, Some("s1")),
            Ok(HookEvent::WaitingForInput {
                prompt: "select: Allow?".into()
            })
        );
        assert!(p.hook("ui-prompt", &prompt, Some("s2")).is_err());
        let switch = json!({"session_id": "s1", "reason": "new"});
        assert!(matches!(
            p.hook("session-before-switch", &switch, Some("s1")),
            Ok(HookEvent::ReplacementRefused { .. })
        ));
    }
}
