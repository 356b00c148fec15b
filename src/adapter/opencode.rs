//! The OpenCode adapter (`opencode`).
//!
//! Each generation gets its own XDG config, data, state and cache homes, `HOME` and temp
//! directory in its private area (sessions live in the data home's database), the
//! operator's config overlay copied into its config home (provider and model), and a
//! config of Mosaic's own (`OPENCODE_CONFIG`, merged on top) that loads the Mosaic plugin
//! (`adapters/opencode/mosaic.js`) and turns off auto-update, sharing and the default
//! plugins' background install. The plugin fetches the contract when it loads and pushes
//! it onto the system prompt of every request; the activation check is a user turn typed
//! into the pane; the ACK is the session's last assistant text when it goes idle.
//!
//! OpenCode names its session itself, at the first prompt, so the conversation id is the
//! first top-level session the plugin reports; every later event must name that one, and a
//! second top-level session (an in-band `/new`) is refused.

use serde_json::{json, Value};

use super::{
    copy_overlay, expand, write_new, AckMethod, Adapter, ContractInjection, Family, HookEvent,
    HookRefusal, PrepareCtx, Prepared, RegistryError,
};

pub struct OpenCode;

/// The lockfile that tells OpenCode its config directory's plugin package is installed.
const PLUGIN_LOCK: &str = r#"{"name":"mosaic-generation","lockfileVersion":3,"requires":true,"packages":{"":{"dependencies":{"@opencode-ai/plugin":"*"}}}}"#;

const PLUGIN: &str = include_str!("../../adapters/opencode/mosaic.js");

impl Adapter for OpenCode {
    fn family(&self) -> Family {
        Family::OpenCode
    }

    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError> {
        super::no_directives(Family::OpenCode, directives)
    }

    fn forbidden_args(&self) -> &'static [&'static str] {
        &[
            "--continue",
            "-c",
            "--session",
            "-s",
            "--fork",
            // Plugins are how the contract and the ACK travel.
            "--pure",
            // A second process serving the same state outlives nothing useful.
            "serve",
            "attach",
        ]
    }

    fn allowed_args(&self) -> &'static [&'static str] {
        &[]
    }

    fn surfaces(&self) -> (ContractInjection, AckMethod) {
        (ContractInjection::SystemTransform, AckMethod::ChallengeTurn)
    }

    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError> {
        let dir = ctx.state_dir;
        let fail = |detail: String| RegistryError::Prepare {
            family: "opencode".into(),
            dir: dir.to_path_buf(),
            detail,
        };
        let (config, data, state, cache, home, tmp, work) = (
            dir.join("config"),
            dir.join("data"),
            dir.join("state"),
            dir.join("cache"),
            dir.join("home"),
            dir.join("tmp"),
            dir.join("work"),
        );
        let oc_config = config.join("opencode");
        for d in [
            &config, &oc_config, &data, &state, &cache, &home, &tmp, &work,
        ] {
            crate::util::durable::ensure_dir(d, 0o700)
                .map_err(|e| fail(format!("{}: {e}", d.display())))?;
        }
        if let Some(o) = ctx.overlay {
            copy_overlay(o, &oc_config, ctx.provider).map_err(&fail)?;
        }
        // OpenCode installs `@opencode-ai/plugin` from the npm registry into every config
        // directory at start, and loads plugins only once that is done: under confinement
        // (no network) it waits for the registry until its install gives up, and without
        // it every generation downloads the package again. It skips the install when the
        // directory has a `node_modules` and a lockfile naming the package; Mosaic's plugin
        // imports nothing from it.
        crate::util::durable::ensure_dir(&oc_config.join("node_modules"), 0o700)
            .map_err(|e| fail(format!("config node_modules: {e}")))?;
        write_new(&oc_config, "package-lock.json", PLUGIN_LOCK, 0o400)
            .map_err(|e| fail(format!("package-lock.json: {e}")))?;
        write_new(dir, "mosaic.js", PLUGIN, 0o400).map_err(|e| fail(format!("mosaic.js: {e}")))?;
        let own = json!({
            "$schema": "https://opencode.ai/config.json",
            "plugin": [format!("file://{}", dir.join("mosaic.js").display())],
            "autoupdate": false,
            "share": "disabled",
        });
        write_new(dir, "opencode.json", &own.to_string(), 0o400)
            .map_err(|e| fail(format!("opencode.json: {e}")))?;
        let mut vars = ctx.plan.vars.clone();
        vars.state_dir = Some(dir.to_path_buf());
        let s = |p: &std::path::Path| p.display().to_string();
        let env = vec![
            ("OPENCODE_CONFIG".into(), s(&dir.join("opencode.json"))),
            ("XDG_CONFIG_HOME".into(), s(&config)),
            ("XDG_DATA_HOME".into(), s(&data)),
            ("XDG_STATE_HOME".into(), s(&state)),
            ("XDG_CACHE_HOME".into(), s(&cache)),
            ("HOME".into(), s(&home)),
            ("TMPDIR".into(), s(&tmp)),
            // Never another harness's state, no updater, no downloads at start.
            ("OPENCODE_DISABLE_CLAUDE_CODE".into(), "1".into()),
            ("OPENCODE_DISABLE_AUTOUPDATE".into(), "1".into()),
            ("OPENCODE_DISABLE_MODELS_FETCH".into(), "1".into()),
            ("OPENCODE_DISABLE_LSP_DOWNLOAD".into(), "1".into()),
            ("OPENCODE_DISABLE_DEFAULT_PLUGINS".into(), "1".into()),
            ("OPENCODE_DISABLE_SHARE".into(), "1".into()),
            ("OPENCODE_DISABLE_PROJECT_CONFIG".into(), "1".into()),
        ];
        Ok(Prepared {
            argv: expand(&ctx.plan.template, &vars, &[]),
            env,
            cwd: Some(ctx.working_dir(&work)),
            conversation_id: None,
        })
    }

    fn hook(
        &self,
        event: &str,
        payload: &Value,
        conversation: Option<&str>,
    ) -> Result<HookEvent, HookRefusal> {
        let sid = payload["session_id"].as_str();
        // Every event but the plugin's start and a session's creation must be about the
        // bound conversation.
        let ours = |what: &str| match conversation {
            Some(c) if sid == Some(c) => Ok(()),
            _ => Err(HookRefusal::OtherConversation(format!(
                "{what} about session {sid:?}, not this generation's conversation"
            ))),
        };
        match event {
            "session-start" => match payload["reason"].as_str() {
                Some("startup") => Ok(HookEvent::SessionStart),
                other => Err(HookRefusal::Replaced(format!(
                    "plugin start from {other:?}"
                ))),
            },
            "session-created" => {
                let Some(sid) = sid.filter(|s| !s.is_empty()) else {
                    return Err(HookRefusal::Unexpected(
                        "session.created without a session id".into(),
                    ));
                };
                if !payload["parent_id"].is_null() {
                    // A subagent's session: not the conversation, nothing to bind.
                    return Ok(HookEvent::Ignored);
                }
                match conversation {
                    None => Ok(HookEvent::Conversation { id: sid.to_string() }),
                    Some(c) if c == sid => Ok(HookEvent::Ignored),
                    Some(_) => Err(HookRefusal::Replaced(
                        "a second top-level session: a generation has one conversation (in-band reset is disabled)"
                            .into(),
                    )),
                }
            }
            "session-busy" => {
                ours("busy event")?;
                Ok(HookEvent::TurnStarted)
            }
            "next" => {
                ours("continuation wait")?;
                Ok(HookEvent::AwaitContinuation)
            }
            // A question or permission ask on screen (the plugin names the conversation a
            // subagent's ask belongs to).
            "waiting-for-input" => {
                ours("prompt")?;
                Ok(HookEvent::WaitingForInput {
                    prompt: format!(
                        "{}: {}",
                        payload["kind"].as_str().unwrap_or("prompt"),
                        payload["prompt"].as_str().unwrap_or_default()
                    ),
                })
            }
            "session-idle" => {
                ours("idle event")?;
                Ok(HookEvent::Settled {
                    last_message: payload["last_assistant_message"]
                        .as_str()
                        .map(str::to_string),
                })
            }
            e => Err(HookRefusal::Unexpected(format!(
                "unexpected OpenCode event {e:?}"
            ))),
        }
    }

    fn render_contract(&self, contract: &str) -> String {
        contract.to_string()
    }

    fn continuation_delivery(&self) -> super::ContinuationDelivery {
        super::ContinuationDelivery::AssetPrompt
    }

    // Its sessions: the database and its write-ahead log in `$XDG_DATA_HOME/opencode`,
    // and the storage directory beside them (not its logs, binaries or snapshots).
    fn artifact_paths(&self) -> &'static [&'static str] {
        &[
            "data/opencode/opencode.db",
            "data/opencode/opencode.db-wal",
            "data/opencode/storage",
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_question_or_permission_ask_of_this_conversation_waits_for_a_human() {
        let o = OpenCode;
        let ask = json!({"session_id": "ses_1", "kind": "question.asked", "prompt": "Which?"});
        assert_eq!(
            o.hook("waiting-for-input", &ask, Some("ses_1")),
            Ok(HookEvent::WaitingForInput {
                prompt: "question.asked: Which?".into()
            })
        );
        let category = |r: Result<HookEvent, HookRefusal>| r.map_err(|e| e.category());
        assert_eq!(
            category(o.hook("waiting-for-input", &ask, Some("ses_2"))),
            Err("other-conversation")
        );
        assert_eq!(
            category(o.hook("waiting-for-input", &ask, None)),
            Err("other-conversation")
        );
    }

    #[test]
    fn the_first_top_level_session_is_the_conversation_and_the_only_one() {
        let o = OpenCode;
        let created = json!({"session_id": "ses_1", "parent_id": null});
        assert_eq!(
            o.hook("session-created", &created, None),
            Ok(HookEvent::Conversation { id: "ses_1".into() })
        );
        assert_eq!(
            o.hook("session-created", &created, Some("ses_1")),
            Ok(HookEvent::Ignored)
        );
        let second = json!({"session_id": "ses_2", "parent_id": null});
        assert!(o.hook("session-created", &second, Some("ses_1")).is_err());
        let child = json!({"session_id": "ses_3", "parent_id": "ses_1"});
        assert_eq!(
            o.hook("session-created", &child, Some("ses_1")),
            Ok(HookEvent::Ignored)
        );
        let idle = json!({"session_id": "ses_1", "last_assistant_message": "x"});
        assert!(matches!(
            o.hook("session-idle", &idle, Some("ses_1")),
            Ok(HookEvent::Settled { .. })
        ));
        // Idle before any conversation, or about another session: refused.
        assert!(o.hook("session-idle", &idle, None).is_err());
        assert!(o.hook("session-idle", &idle, Some("ses_2")).is_err());
    }
}
