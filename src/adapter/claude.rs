//! The Claude Code adapter (`claude-code`).
//!
//! Each generation gets its own `CLAUDE_CONFIG_DIR`, `HOME`, temp and runtime directories
//! and working directory inside its private area, pre-seeded so that no onboarding or
//! folder-trust screen can hold the pane, and a conversation id the supervisor chose
//! (`--session-id`), checked on every hook event. The contract reaches the model through
//! the SessionStart hook's additional context; the activation challenge is a user turn the
//! supervisor types into the pane, and the ACK is the turn's last assistant message as the
//! Stop hook reports it. The assets are in `adapters/claude-code/`.

use std::path::Path;

use serde_json::{json, Value};

use super::{
    copy_overlay, expand, write_new as write, AckMethod, Adapter, ContractInjection, Family,
    HookEvent, HookRefusal, PrepareCtx, Prepared, RegistryError,
};

pub struct ClaudeCode;

const HOOK_SH: &str = include_str!("../../adapters/claude-code/hook.sh");
const SETTINGS: &str = include_str!("../../adapters/claude-code/settings.json");
const CLAUDE_JSON: &str = include_str!("../../adapters/claude-code/claude.json");

/// A JSON string's inside (no quotes), for filling a JSON template.
fn json_inner(s: &str) -> String {
    let q = Value::String(s.to_string()).to_string();
    q[1..q.len() - 1].to_string()
}

impl Adapter for ClaudeCode {
    fn family(&self) -> Family {
        Family::ClaudeCode
    }

    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError> {
        super::no_directives(Family::ClaudeCode, directives)
    }

    fn forbidden_args(&self) -> &'static [&'static str] {
        &[
            "--resume",
            "-r",
            "--continue",
            "-c",
            "--fork-session",
            "--from-pr",
            "--teleport",
            // Hooks are how the contract and the ACK travel; these switch them off.
            "--bare",
            "--safe-mode",
        ]
    }

    fn allowed_args(&self) -> &'static [&'static str] {
        &[
            "--session-id",
            "{session_id}",
            "--settings",
            "{state_dir}/settings.json",
        ]
    }

    fn surfaces(&self) -> (ContractInjection, AckMethod) {
        (
            ContractInjection::SessionStartHook,
            AckMethod::ChallengeTurn,
        )
    }

    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError> {
        let dir = ctx.state_dir;
        let fail = |detail: String| RegistryError::Prepare {
            family: "claude-code".into(),
            dir: dir.to_path_buf(),
            detail,
        };
        let io = |what: &str, e: std::io::Error| fail(format!("{what}: {e}"));
        let (home, tmp, work) = (dir.join("home"), dir.join("tmp"), dir.join("work"));
        for d in [&home, &tmp, &work] {
            crate::util::durable::ensure_dir(d, 0o700)
                .map_err(|e| fail(format!("{}: {e}", d.display())))?;
        }
        if let Some(o) = ctx.overlay {
            copy_overlay(o, &home, ctx.provider).map_err(&fail)?;
        }
        // The directory the harness starts in, which `.claude.json` records as trusted.
        let cwd = ctx.working_dir(&work);
        let state = json_inner(&dir.display().to_string());
        write(dir, "hook.sh", HOOK_SH, 0o500).map_err(|e| io("hook.sh", e))?;
        write(
            dir,
            "settings.json",
            &SETTINGS.replace("{state_dir}", &state),
            0o400,
        )
        .map_err(|e| io("settings.json", e))?;
        write(
            &home,
            ".claude.json",
            &claude_json(ctx, &cwd).map_err(&fail)?,
            0o600,
        )
        .map_err(|e| io(".claude.json", e))?;
        let session_id = uuid::Uuid::new_v4().to_string();
        let mut vars = ctx.plan.vars.clone();
        vars.state_dir = Some(dir.to_path_buf());
        vars.session_id = Some(session_id.clone());
        let s = |p: &Path| p.display().to_string();
        let env = vec![
            ("CLAUDE_CONFIG_DIR".into(), s(&home)),
            ("HOME".into(), s(&home)),
            // Its session socket goes to $XDG_RUNTIME_DIR/cc-socks; a path too long for a
            // socket would send it to /tmp/cc-socks-<uid>, shared by every session.
            ("XDG_RUNTIME_DIR".into(), s(ctx.run_dir)),
            ("XDG_CONFIG_HOME".into(), s(&home.join(".config"))),
            ("XDG_DATA_HOME".into(), s(&home.join(".local/share"))),
            ("XDG_CACHE_HOME".into(), s(&home.join(".cache"))),
            ("CLAUDE_CODE_TMPDIR".into(), s(&tmp)),
            ("TMPDIR".into(), s(&tmp)),
            // Its updater would start `npm` children that outlive nothing useful.
            ("DISABLE_AUTOUPDATER".into(), "1".into()),
            ("DISABLE_TELEMETRY".into(), "1".into()),
            ("DISABLE_ERROR_REPORTING".into(), "1".into()),
            // Its cost-threshold dialog waits for a person and sends no notification.
            ("DISABLE_COST_WARNINGS".into(), "1".into()),
        ];
        let mut env = env;
        if let Some(url) = ctx.provider {
            env.push(("ANTHROPIC_BASE_URL".into(), url.to_string()));
        }
        Ok(Prepared {
            argv: expand(&ctx.plan.template, &vars, &[]),
            env,
            cwd: Some(cwd),
            conversation_id: Some(session_id),
        })
    }

    fn hook(
        &self,
        event: &str,
        payload: &Value,
        conversation: Option<&str>,
    ) -> Result<HookEvent, HookRefusal> {
        hook_event(event, payload, conversation)
    }

    fn render_contract(&self, contract: &str) -> String {
        session_start_context(contract)
    }

    fn continuation_delivery(&self) -> super::ContinuationDelivery {
        super::ContinuationDelivery::SettledHookAnswer
    }

    fn render_continuation(&self, text: &str) -> String {
        stop_block(text)
    }

    // Its transcripts: `$CLAUDE_CONFIG_DIR/projects/<cwd>/<session>.jsonl`.
    fn artifact_paths(&self) -> &'static [&'static str] {
        &["home/projects"]
    }
}

/// One event of the Claude-style hook protocol (Claude Code, and Codex, which speaks the
/// same JSON): it must name this generation's conversation and be the event the hook was
/// installed for.
/// `.claude.json`: onboarding done, no updater, the working directory trusted, and an
/// `ANTHROPIC_API_KEY` from the credentials file approved in advance. Claude Code asks
/// whether to use a key it finds in its environment ("custom API key detected") and
/// remembers the answer by the key's last 20 characters; unanswered, the dialog holds the
/// session before its first turn, so no activation could reach it. The key it sees is the
/// gateway's placeholder in a confined generation, the value itself in an unconfined one
/// (whose harness holds the whole key in its environment anyway).
fn claude_json(ctx: &PrepareCtx<'_>, work: &Path) -> Result<String, String> {
    let mut v: serde_json::Value = serde_json::from_str(
        &CLAUDE_JSON.replace("{cwd}", &json_inner(&work.display().to_string())),
    )
    .map_err(|e| format!("claude.json template: {e}"))?;
    if let Some((name, value)) = ctx
        .plan
        .secret_env
        .iter()
        .find(|(k, _)| k == "ANTHROPIC_API_KEY")
    {
        let seen = zeroize::Zeroizing::new(if ctx.confined {
            super::credentials::placeholder(name)
        } else {
            value.0.clone()
        });
        let tail: String = seen
            .chars()
            .rev()
            .take(20)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        v["customApiKeyResponses"] = serde_json::json!({"approved": [tail], "rejected": []});
    }
    Ok(v.to_string())
}

pub(super) fn hook_event(
    event: &str,
    payload: &Value,
    conversation: Option<&str>,
) -> Result<HookEvent, HookRefusal> {
    let sid = payload["session_id"].as_str().unwrap_or("");
    if conversation != Some(sid) {
        return Err(HookRefusal::OtherConversation(format!(
            "hook event about conversation {sid:?}, not this generation's"
        )));
    }
    match (event, payload["hook_event_name"].as_str()) {
        ("session-start", Some("SessionStart")) => match payload["source"].as_str() {
            Some("startup") => Ok(HookEvent::SessionStart),
            // The same conversation, its history summarized: not a resume.
            Some("compact") => Ok(HookEvent::ContextCompacted),
            other => Err(HookRefusal::Replaced(format!(
                "SessionStart from {other:?}: a generation only ever starts fresh (in-band reset is disabled)"
            ))),
        },
        ("prompt-submit", Some("UserPromptSubmit")) => Ok(HookEvent::TurnStarted),
        ("stop", Some("Stop")) => Ok(HookEvent::Settled {
            last_message: payload["last_assistant_message"]
                .as_str()
                .map(str::to_string),
        }),
        // Claude Code 2.1.332 ends a turn it cannot complete (a 429 after its retries, or
        // one whose `retry-after` is over a minute) with StopFailure, never Stop.
        ("stop-failure", Some("StopFailure")) => Ok(HookEvent::TurnFailed {
            error: payload["error"]
                .as_str()
                .unwrap_or("unknown")
                .chars()
                .take(64)
                .collect(),
        }),
        // A dialog waiting for a human (a tool outside the allow list, an MCP elicitation);
        // its other notifications (idle at the prompt, a finished subagent) are not.
        ("notification", Some("Notification")) => match payload["notification_type"].as_str() {
            Some(
                kind @ ("permission_prompt" | "worker_permission_prompt" | "elicitation_dialog"
                | "elicitation_url_dialog" | "agent_needs_input"),
            ) => Ok(HookEvent::WaitingForInput {
                prompt: format!(
                    "{kind}: {}",
                    payload["message"].as_str().unwrap_or_default()
                ),
            }),
            _ => Ok(HookEvent::Ignored),
        },
        // Codex asks a human to approve a tool call (a command it holds dangerous, an
        // escalation out of its sandbox): its approval prompt is on screen. The hook's empty
        // answer leaves the decision to whoever answers the prompt.
        ("permission-request", Some("PermissionRequest")) => Ok(HookEvent::WaitingForInput {
            prompt: format!(
                "permission_request: {} {}",
                payload["tool_name"].as_str().unwrap_or_default(),
                payload["tool_input"]
            ),
        }),
        ("session-end", Some("SessionEnd")) => Ok(HookEvent::SessionEnd {
            reason: payload["reason"].as_str().unwrap_or("unknown").to_string(),
        }),
        (e, n) => Err(HookRefusal::Unexpected(format!(
            "unexpected hook {e:?} carrying event {n:?}"
        ))),
    }
}

/// What a Stop hook prints to keep the harness going with `text` as its next input: a block
/// decision, whose reason the harness hands to the model (Claude Code, and Codex).
pub(super) fn stop_block(text: &str) -> String {
    json!({"decision": "block", "reason": text}).to_string()
}

/// What a SessionStart hook prints to hand the contract to the model.
pub(super) fn session_start_context(contract: &str) -> String {
    json!({"hookSpecificOutput": {
        "hookEventName": "SessionStart",
        "additionalContext": contract,
    }})
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_events_must_name_this_conversation() {
        let a = ClaudeCode;
        let stop =
            json!({"session_id": "s1", "hook_event_name": "Stop", "last_assistant_message": "x"});
        assert!(matches!(
            a.hook("stop", &stop, Some("s1")),
            Ok(HookEvent::Settled { .. })
        ));
        let category = |r: Result<HookEvent, HookRefusal>| r.map_err(|e| e.category());
        assert_eq!(
            category(a.hook("stop", &stop, Some("s2"))),
            Err("other-conversation")
        );
        assert_eq!(
            category(a.hook("stop", &stop, None)),
            Err("other-conversation")
        );
        // The event the hook was installed for must be the event it carries.
        assert_eq!(
            category(a.hook("session-start", &stop, Some("s1"))),
            Err("unexpected-event")
        );
        let resumed =
            json!({"session_id": "s1", "hook_event_name": "SessionStart", "source": "resume"});
        assert_eq!(
            category(a.hook("session-start", &resumed, Some("s1"))),
            Err("conversation-replaced")
        );
        let compacted =
            json!({"session_id": "s1", "hook_event_name": "SessionStart", "source": "compact"});
        assert_eq!(
            a.hook("session-start", &compacted, Some("s1")),
            Ok(HookEvent::ContextCompacted)
        );
        assert!(a.hook("session-start", &compacted, Some("s2")).is_err());
        let clear =
            json!({"session_id": "s1", "hook_event_name": "SessionStart", "source": "clear"});
        assert!(a.hook("session-start", &clear, Some("s1")).is_err());
    }

    #[test]
    fn dialogs_and_approval_asks_wait_for_a_human_and_nothing_else_does() {
        let a = ClaudeCode;
        let note = |kind: &str| {
            json!({"session_id": "s1", "hook_event_name": "Notification",
                "notification_type": kind, "message": "m"})
        };
        for kind in [
            "permission_prompt",
            "worker_permission_prompt",
            "elicitation_dialog",
            "elicitation_url_dialog",
            "agent_needs_input",
        ] {
            assert_eq!(
                a.hook("notification", &note(kind), Some("s1")),
                Ok(HookEvent::WaitingForInput {
                    prompt: format!("{kind}: m")
                }),
                "{kind}"
            );
        }
        for kind in ["idle_prompt", "agent_completed", "auth_success"] {
            assert_eq!(
                a.hook("notification", &note(kind), Some("s1")),
                Ok(HookEvent::Ignored),
                "{kind}"
            );
        }
        // Codex's approval prompt, through the same hook protocol.
        let ask = json!({"session_id": "s1", "hook_event_name": "PermissionRequest",
            "tool_name": "Bash", "tool_input": {"command": "rm -rf x"}});
        assert!(matches!(
            a.hook("permission-request", &ask, Some("s1")),
            Ok(HookEvent::WaitingForInput { .. })
        ));
        assert!(a.hook("permission-request", &ask, Some("s2")).is_err());
    }
}
