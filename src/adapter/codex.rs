//! The Codex CLI adapter (`codex`).
//!
//! Each generation gets its own `CODEX_HOME` (config, hooks, sessions), `HOME` and temp
//! directory in its private area. `config.toml` is the operator's overlay with Mosaic's
//! settings forced on top (no managed daemon, no update check, the working directory
//! trusted, no `notify`); `hooks.json` is Mosaic's. Codex runs `SessionStart` at the first
//! submitted prompt, so the supervisor types a bootstrap turn at start: its SessionStart
//! hook hands the contract to the model as additional context, and only then is the
//! activation challenge issued and typed in as the next turn. The ACK is the Stop hook's
//! `last_assistant_message`. Codex names its thread itself: the first SessionStart's
//! `session_id` becomes the generation's conversation.

use serde_json::Value;

use super::{
    expand, write_new, AckMethod, Adapter, ContractInjection, Family, HookEvent, HookRefusal,
    PrepareCtx, Prepared, RegistryError,
};

pub struct Codex;

const HOOK_SH: &str = include_str!("../../adapters/codex/hook.sh");
const HOOKS: &str = include_str!("../../adapters/codex/hooks.json");

/// The operator's `config.toml` (if any) with Mosaic's settings forced on top.
fn config_toml(
    overlay: Option<&std::path::Path>,
    work: &std::path::Path,
    confined: bool,
    provider: Option<&str>,
) -> Result<String, String> {
    let mut t: toml::Table = match overlay.map(|o| o.join("config.toml")) {
        Some(p) if p.exists() => {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            super::expand_provider(&text, "config.toml", provider)?
                .parse()
                .map_err(|e| format!("{}: {e}", p.display()))?
        }
        _ => toml::Table::new(),
    };
    // Its turn-complete notifications also fire for internal threads; the Stop hook is the
    // settled signal.
    t.remove("notify");
    t.insert(
        "check_for_update_on_startup".into(),
        toml::Value::Boolean(false),
    );
    // Under Mosaic's confinement Codex's own sandbox (bwrap in new namespaces) cannot start
    // (namespaces are denied) and would fail every tool call: the outer boundary is the
    // sandbox, whatever the overlay says. Unconfined, Codex keeps its own.
    if confined {
        t.insert(
            "sandbox_mode".into(),
            toml::Value::String("danger-full-access".into()),
        );
    }
    let features = t
        .entry("features")
        .or_insert_with(|| toml::Value::Table(Default::default()));
    let Some(features) = features.as_table_mut() else {
        return Err("config.toml: features is not a table".into());
    };
    // No `codex app-server --managed-daemon` that outlives the TUI.
    features.insert("daemon_auto_start".into(), toml::Value::Boolean(false));
    let projects = t
        .entry("projects")
        .or_insert_with(|| toml::Value::Table(Default::default()));
    let Some(projects) = projects.as_table_mut() else {
        return Err("config.toml: projects is not a table".into());
    };
    let mut trusted = toml::Table::new();
    trusted.insert("trust_level".into(), toml::Value::String("trusted".into()));
    projects.insert(work.display().to_string(), toml::Value::Table(trusted));
    Ok(t.to_string())
}

impl Adapter for Codex {
    fn family(&self) -> Family {
        Family::Codex
    }

    fn validate_directives(&self, directives: &[String]) -> Result<(), RegistryError> {
        super::no_directives(Family::Codex, directives)
    }

    fn forbidden_args(&self) -> &'static [&'static str] {
        &[
            "resume",
            "fork",
            "--last",
            "app-server",
            "mcp-server",
            // Hooks are how the contract and the ACK travel.
            "--disable-hooks",
        ]
    }

    fn allowed_args(&self) -> &'static [&'static str] {
        &["--dangerously-bypass-hook-trust"]
    }

    fn surfaces(&self) -> (ContractInjection, AckMethod) {
        (
            ContractInjection::SessionStartHook,
            AckMethod::ChallengeTurn,
        )
    }

    fn bootstrap_turn(&self) -> Option<&'static str> {
        Some("Mosaic: session start. Wait for the activation check.")
    }

    fn prepare(&self, ctx: &PrepareCtx<'_>) -> Result<Prepared, RegistryError> {
        let dir = ctx.state_dir;
        let fail = |detail: String| RegistryError::Prepare {
            family: "codex".into(),
            dir: dir.to_path_buf(),
            detail,
        };
        let (home, tmp, work) = (dir.join("home"), dir.join("tmp"), dir.join("work"));
        for d in [&home, &tmp, &work] {
            crate::util::durable::ensure_dir(d, 0o700)
                .map_err(|e| fail(format!("{}: {e}", d.display())))?;
        }
        if let Some(o) = ctx.overlay {
            // Everything but config.toml as is; config.toml merged below.
            for e in std::fs::read_dir(o).map_err(|e| fail(format!("{}: {e}", o.display())))? {
                let e = e.map_err(|e| fail(e.to_string()))?;
                if e.file_name() == "config.toml" {
                    continue;
                }
                if !e.file_type().map(|t| t.is_file()).unwrap_or(false) {
                    return Err(fail(format!(
                        "config overlay: only regular files are copied, not {}",
                        e.path().display()
                    )));
                }
                let text =
                    std::fs::read_to_string(e.path()).map_err(|err| fail(err.to_string()))?;
                let text =
                    super::expand_provider(&text, &e.file_name().to_string_lossy(), ctx.provider)
                        .map_err(&fail)?;
                write_new(&home, &e.file_name().to_string_lossy(), &text, 0o600)
                    .map_err(|err| fail(format!("config overlay: {err}")))?;
            }
        }
        // The directory the harness starts in, which the config records as trusted.
        let cwd = ctx.working_dir(&work);
        let config = config_toml(ctx.overlay, &cwd, ctx.confined, ctx.provider).map_err(&fail)?;
        write_new(&home, "config.toml", &config, 0o600)
            .map_err(|e| fail(format!("config.toml: {e}")))?;
        let state = Value::String(dir.display().to_string()).to_string();
        let state = &state[1..state.len() - 1];
        write_new(
            &home,
            "hooks.json",
            &HOOKS.replace("{state_dir}", state),
            0o400,
        )
        .map_err(|e| fail(format!("hooks.json: {e}")))?;
        write_new(dir, "hook.sh", HOOK_SH, 0o500).map_err(|e| fail(format!("hook.sh: {e}")))?;
        let mut vars = ctx.plan.vars.clone();
        vars.state_dir = Some(dir.to_path_buf());
        let s = |p: &std::path::Path| p.display().to_string();
        let mut argv = expand(&ctx.plan.template, &vars, &[]);
        if ctx.confined {
            // The config says so too; the flag also holds when a TUI mode switch would
            // bring the configured default back.
            argv.extend(["--sandbox".to_string(), "danger-full-access".to_string()]);
        }
        Ok(Prepared {
            argv,
            env: vec![
                ("CODEX_HOME".into(), s(&home)),
                ("HOME".into(), s(&home)),
                ("TMPDIR".into(), s(&tmp)),
            ],
            cwd: Some(cwd),
            conversation_id: None,
        })
    }

    fn names_conversation(&self, event: &str, payload: &Value) -> Option<String> {
        (event == "session-start" && payload["hook_event_name"] == "SessionStart")
            .then(|| payload["session_id"].as_str().map(str::to_string))
            .flatten()
            .filter(|s| !s.is_empty())
    }

    fn hook(
        &self,
        event: &str,
        payload: &Value,
        conversation: Option<&str>,
    ) -> Result<HookEvent, HookRefusal> {
        // Codex speaks Claude Code's hook protocol.
        super::claude::hook_event(event, payload, conversation)
    }

    fn render_contract(&self, contract: &str) -> String {
        super::claude::session_start_context(contract)
    }

    fn continuation_delivery(&self) -> super::ContinuationDelivery {
        super::ContinuationDelivery::SettledHookAnswer
    }

    fn render_continuation(&self, text: &str) -> String {
        super::claude::stop_block(text)
    }

    // Its rollouts: `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-*.jsonl`.
    fn artifact_paths(&self) -> &'static [&'static str] {
        &["home/sessions"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_operator_config_keeps_its_provider_and_loses_what_would_outlive_or_misreport() {
        let dir =
            std::env::temp_dir().join(format!("mosaic-codex-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("config.toml"),
            "model = \"m\"\nnotify = [\"x\"]\n[features]\ndaemon_auto_start = true\n[model_providers.p]\nbase_url = \"http://x\"\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("config.toml"),
            "model = \"m\"\nsandbox_mode = \"workspace-write\"\nnotify = [\"x\"]\n[features]\ndaemon_auto_start = true\n[model_providers.p]\nbase_url = \"http://x\"\n",
        )
        .unwrap();
        let open: toml::Table = config_toml(Some(&dir), std::path::Path::new("/w"), false, None)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(open["sandbox_mode"].as_str(), Some("workspace-write"));
        let t: toml::Table = config_toml(Some(&dir), std::path::Path::new("/w"), true, None)
            .unwrap()
            .parse()
            .unwrap();
        // Confined: Codex's own sandbox off, the outer one in its place.
        assert_eq!(t["sandbox_mode"].as_str(), Some("danger-full-access"));
        assert_eq!(t["model"].as_str(), Some("m"));
        assert!(t.get("notify").is_none());
        assert_eq!(t["features"]["daemon_auto_start"].as_bool(), Some(false));
        assert_eq!(t["projects"]["/w"]["trust_level"].as_str(), Some("trusted"));
        assert_eq!(
            t["model_providers"]["p"]["base_url"].as_str(),
            Some("http://x")
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn the_first_session_start_names_the_conversation() {
        let c = Codex;
        let start =
            json!({"session_id": "t1", "hook_event_name": "SessionStart", "source": "startup"});
        assert_eq!(
            c.names_conversation("session-start", &start),
            Some("t1".into())
        );
        assert_eq!(c.names_conversation("stop", &start), None);
        assert_eq!(
            c.hook("session-start", &start, Some("t1")),
            Ok(HookEvent::SessionStart)
        );
        assert!(c.hook("session-start", &start, Some("t2")).is_err());
        let resumed =
            json!({"session_id": "t1", "hook_event_name": "SessionStart", "source": "resume"});
        assert!(c.hook("session-start", &resumed, Some("t1")).is_err());
    }
}
