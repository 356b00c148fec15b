//! Issue 23 part 5, a waiting human, through the four real harnesses: each in its TUI in a
//! real tmux lane under `mosaic up` (coordinator, supervisor, PostgreSQL), against the
//! deterministic test model, is made to show a prompt only a person can answer, through its
//! own surface:
//! - Claude Code: a tool outside its allow list (a permission dialog; its `Notification`);
//! - Codex: a command it holds dangerous (its approval prompt; its `PermissionRequest` hook);
//! - OpenCode: its `question` tool (the plugin's `question.asked`);
//! - Pi: an operator's permission-gate extension asking before `rm -rf` (the extension's
//!   dialog; Pi's `ui_prompt_start`).
//!
//! The work is blocked `waiting-for-input` (the prompt's digest its evidence) on its lane,
//! counted in the host's metrics, and the operator's notifier fires exactly once although
//! the harness sits there for as long as nobody answers. Answered in the lane and
//! unblocked, the work goes on.

mod common;
mod harness;
mod pg;

use harness::*;
use serde_json::{json, Value};

/// Gives one continuation to the running work `id` and waits for its result.
fn continue_once(up: &Up, id: &str, answer: &str) {
    let next = format!("model:say[{answer}]");
    let r: Value = up
        .cli(&["continue", "--assignment", id, "--next-action", &next])
        .unwrap_or_else(|e| panic!("continue: {e}"));
    wait_result(up, r["continuation_id"].as_str().unwrap());
    assert_eq!(
        up.sql(
            "SELECT result_evidence_digest FROM continuations WHERE continuation_id = $1",
            r["continuation_id"].as_str().unwrap()
        ),
        Some(mosaic::protocol::work::evidence_digest(
            "continuation-result",
            answer.as_bytes()
        )),
        "the recorded result is not the harness's answer"
    );
}

/// A plain HTTP/1.1 GET of `http://<addr>/metrics`.
fn metrics(addr: &str) -> String {
    use std::io::{Read, Write};
    let addr = addr
        .trim_start_matches("http://")
        .trim_end_matches("/metrics");
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

/// `f`'s harness is made to ask a human by the turn `trigger`; `answer` are the keys a
/// person attached to the lane presses to answer the prompt; `on_screen` is what the
/// prompt shows.
fn waiting(f: &Family, trigger: &str, on_screen: &str, answer: &[&str]) {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(f, &model, None);
    let a = up
        .assign(f.runtime, "WAITING: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    assert_eq!(work(&up, &id)["work_status"], "active");
    up.type_turn(trigger);
    let evidence = up.wait_for("the work blocked waiting for input", || {
        up.sql(
            "SELECT blocker_evidence_digest FROM assignments WHERE assignment_id = $1 \
             AND work_status = 'blocked' AND blocker_code = 'waiting-for-input'",
            &id,
        )
    });
    assert!(evidence.starts_with("sha256:"), "{evidence}");
    // The harness does show the prompt: the report is the harness's, not a guess.
    up.wait_for("the prompt on screen", || {
        up.screen().contains(on_screen).then_some(())
    });
    let notified = up.wait_for("the notifier told", || {
        let n = up.notified();
        (!n.is_empty()).then_some(n)
    });
    assert_eq!(notified.len(), 1, "{notified:?}");
    assert_eq!(notified[0]["kind"], "waiting-for-input");
    assert_eq!(notified[0]["assignment_id"], id.as_str());
    assert_eq!(notified[0]["lane_id"], up.lane().as_str());
    assert_eq!(notified[0]["evidence_digest"], evidence.as_str());
    let addr = std::fs::read_to_string(up.dir.join("run/metrics.addr")).unwrap();
    let text = metrics(addr.trim());
    assert!(
        text.lines()
            .any(|l| l.starts_with("mosaic_harness_blocked_total{")
                && l.contains("code=\"waiting-for-input\"")
                && l.ends_with(" 1")),
        "not counted in the host's metrics:\n{text}"
    );
    // Still one event while the prompt waits (a few more seconds of it).
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(up.notified().len(), 1, "notified again for the same prompt");
    assert_eq!(work(&up, &id)["blocker_code"], "waiting-for-input");
    // Someone answers in the lane and unblocks the work; it goes on.
    for k in answer {
        up.key(k);
        std::thread::sleep(std::time::Duration::from_millis(300));
    }
    up.cli(&[
        "unblock",
        "--assignment",
        &id,
        "--next-action",
        "carry on after the prompt",
    ])
    .unwrap_or_else(|e| panic!("unblock: {e}"));
    assert_eq!(work(&up, &id)["work_status"], "active");
    continue_once(&up, &id, "after-the-prompt");
    assert_eq!(up.notified().len(), 1, "{:?}", up.notified());
}

/// A tool outside Claude Code's allow list asks for permission in its TUI; its
/// Notification hook reports the prompt (after Claude Code's own 6 s). Enter allows it (the
/// fetch itself fails: the confined generation reaches no such host).
#[test]
fn claude_code_waiting_for_a_human_is_blocked_counted_and_notified_once() {
    waiting(
        &CLAUDE,
        r#"model:call[WebFetch|{"url":"https://example.com/","prompt":"summarize it"}]"#,
        "example.com",
        &["Enter"],
    );
}

/// A command Codex holds dangerous waits for its approval prompt; its PermissionRequest
/// hook reports it. Enter approves it.
#[test]
fn codex_waiting_for_a_human_is_blocked_counted_and_notified_once() {
    waiting(
        &CODEX,
        "model:run[rm -rf scratch]",
        "rm -rf scratch",
        &["Enter"],
    );
}

/// OpenCode's question tool shows its question; the plugin reports `question.asked`.
/// Enter picks the first answer.
#[test]
fn opencode_waiting_for_a_human_is_blocked_counted_and_notified_once() {
    let call = json!({"questions": [{"question": "Which colour next?", "header": "Colour",
        "options": [{"label": "Red", "description": "red"},
            {"label": "Blue", "description": "blue"}]}]});
    waiting(
        &OPENCODE,
        &format!("model:call[question|{call}]"),
        "Which colour next?",
        &["Enter"],
    );
}

/// An operator's permission gate, as in Pi's own examples: a `select` before `rm -rf`.
const PERMISSION_GATE: &str = r#"export default function (pi) {
  pi.on("tool_call", async (event, ctx) => {
    if (event.toolName !== "bash") return undefined;
    const command = String(event.input.command || "");
    if (!/\brm\s+-rf?\b/.test(command)) return undefined;
    const choice = await ctx.ui.select(`Dangerous command: ${command}. Allow?`, ["Yes", "No"]);
    return choice === "Yes" ? undefined : { block: true, reason: "Blocked by the operator" };
  });
}
"#;

/// Pi's overlay with one more extension, `name` holding `js`, loaded from its settings.
fn pi_with(name: &'static str, js: &str) -> Vec<(&'static str, String)> {
    let mut files: Vec<(&'static str, String)> = (PI.overlay)()
        .into_iter()
        .filter(|(n, _)| *n != "settings.json")
        .collect();
    files.push((
        "settings.json",
        json!({"defaultProvider": "mosaic-test", "defaultModel": "mosaic-test-model",
            "quietStartup": true, "extensions": [name]})
        .to_string(),
    ));
    files.push((name, js.to_string()));
    files
}

/// Pi with the operator's permission gate loaded from its settings.
const PI_GATED: Family = Family {
    overlay: || pi_with("permission-gate.js", PERMISSION_GATE),
    ..PI
};

/// An extension's dialog waits for a human; Mosaic's extension reports Pi's
/// `ui_prompt_start`. Enter picks "Yes".
#[test]
fn pi_waiting_for_a_human_is_blocked_counted_and_notified_once() {
    waiting(
        &PI_GATED,
        "model:run[rm -rf scratch]",
        "Dangerous command",
        &["Enter"],
    );
}

/// An operator's gate whose dialog closes itself after 2 s (Pi's `timeout` option) and
/// denies the command: nobody needs to answer it.
const TIMED_GATE: &str = r#"export default function (pi) {
  pi.on("tool_call", async (event, ctx) => {
    if (event.toolName !== "bash") return undefined;
    const command = String(event.input.command || "");
    if (!/\brm\s+-rf?\b/.test(command)) return undefined;
    const ok = await ctx.ui.confirm("Timed gate", `Allow ${command}?`, { timeout: 2000 });
    return ok ? undefined : { block: true, reason: "Not confirmed in time" };
  });
}
"#;

/// Pi with a gate whose dialog closes itself.
const PI_TIMED: Family = Family {
    overlay: || pi_with("timed-gate.js", TIMED_GATE),
    ..PI
};

/// A Pi dialog that closes itself within Claude Code's 6 s (a timed confirmation) waits
/// for nobody: the work is never blocked, the operator never told, and it goes on.
#[test]
fn pi_does_not_report_a_dialog_that_closes_itself() {
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family(&PI_TIMED, &model, None);
    let a = up
        .assign(PI.runtime, "TIMED: wait for your next action", true)
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    up.type_turn("model:run[rm -rf scratch]");
    up.wait_for("the dialog shown", || {
        up.screen().contains("Timed gate").then_some(())
    });
    up.wait_for("the dialog gone by itself", || {
        (!up.screen().contains("Timed gate")).then_some(())
    });
    // Past the 6 s a dialog must stay open to be reported.
    std::thread::sleep(std::time::Duration::from_secs(8));
    assert_eq!(work(&up, &id)["work_status"], "active");
    assert!(up.notified().is_empty(), "{:?}", up.notified());
    continue_once(&up, &id, "after-the-timed-dialog");
}

/// A repository of `files` (path, text), committed on `main` beside `up`'s state
/// directory, declared as `probe` on `up`'s host.
fn repository(up: &Up, files: &[(&str, &str)]) -> std::path::PathBuf {
    let repo = up.dir.with_extension("repo");
    for (path, text) in files {
        let p = repo.join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let git = |args: &[&str]| {
        let out = std::process::Command::new("git")
            .args(["-c", "user.name=t", "-c", "user.email=t@t", "-C"])
            .arg(&repo)
            .args(args)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
    };
    git(&["init", "-q", "-b", "main"]);
    git(&["add", "-A"]);
    git(&[
        "commit",
        "-q",
        "-m",
        "a project with its own harness settings",
    ]);
    let lane = up.lane();
    let host = lane.split_once(':').unwrap().0;
    up.cli(&[
        "repo",
        "add",
        "probe",
        "--path",
        repo.to_str().unwrap(),
        "--host",
        host,
    ])
    .unwrap_or_else(|e| panic!("repo add: {e}"));
    repo
}

/// A harness started in a clone of a repository holding `files` — the project's own
/// settings for that harness, which could make it ask a human at start (whether to trust
/// the folder, whether to run the project's servers) in a pane nobody watches, before the
/// generation is active, where the activation check would be typed into the question.
/// Mosaic starts each family so that it never asks: the generation starts in the clone,
/// answers its checks and its continuation, and the operator is told nothing. `ignored`, if
/// given, is carried by project settings Mosaic keeps from loading: it never shows in a
/// request. The repository's instructions (`AGENTS.md`, or Claude Code's `CLAUDE.md`)
/// reach the model where `instructions_load` (OpenCode skips them: see the README).
fn repository_settings(
    f: &Family,
    files: &[(&str, &str)],
    ignored: Option<&str>,
    instructions_load: bool,
) {
    repository_settings_in(f, files, ignored, instructions_load, &[]);
}

/// [`repository_settings`] with more `mosaic up` arguments.
fn repository_settings_in(
    f: &Family,
    files: &[(&str, &str)],
    ignored: Option<&str>,
    instructions_load: bool,
    up_args: &[&str],
) {
    let instructions = format!("repo-instructions-{}", f.family_name());
    let memory = if f.family_name() == "claude-code" {
        "CLAUDE.md"
    } else {
        "AGENTS.md"
    };
    let text = format!("# Project rules\n\nAlways mention {instructions} when asked.\n");
    let mut files = files.to_vec();
    files.push((memory, &text));
    let model = Model::start();
    let (_creds, up, _token) = Up::for_family_lanes(f, &model, None, 1, up_args);
    let repo = repository(&up, &files);
    let lane = up.lane();
    let a = up
        .cli(&[
            "assign",
            "--lane",
            &lane,
            "--runtime",
            f.runtime,
            "--repo",
            "probe",
            "--task",
            "PROJECT: wait for your next action",
            "--wait",
            "running",
        ])
        .expect("assign reaches RUNNING");
    let id = a["assignment_id"].as_str().unwrap().to_string();
    // The project's files are there, in the harness's working directory.
    let workspace = up.dir.join("supervisor/workspaces").join(&id);
    for (path, _) in &files {
        assert!(workspace.join(path).exists(), "{path} not in the workspace");
    }
    continue_once(&up, &id, "project-settings-asked-nothing");
    let requests = model.requests();
    assert!(!requests.is_empty());
    if let Some(probe) = ignored {
        assert!(
            requests
                .iter()
                .all(|r| !r["body"].to_string().contains(probe)),
            "the project's own settings reached the model"
        );
    }
    assert_eq!(
        requests
            .iter()
            .any(|r| r["body"].to_string().contains(&instructions)),
        instructions_load,
        "the repository's instructions ({memory}) reached the model: {}",
        !instructions_load
    );
    assert!(up.notified().is_empty(), "{:?}", up.notified());
    drop(up);
    let _ = std::fs::remove_dir_all(&repo);
}

/// Pi: an `.agents/skills` in the working directory (or above it) or a `.pi/` makes Pi
/// ask whether to trust the folder; its default answer is "Trust". `--no-approve`: the
/// project's skill never loads; its `AGENTS.md` does.
#[test]
fn pi_never_asks_whether_to_trust_a_repositorys_resources() {
    repository_settings(
        &PI,
        &[
            (
                ".agents/skills/untrusted-probe/SKILL.md",
                "---\nname: untrusted-probe\ndescription: A project skill Mosaic never trusts.\n---\nDo nothing.\n",
            ),
            (".pi/settings.json", r#"{"theme": "light"}"#),
        ],
        Some("untrusted-probe"),
        true,
    );
}

/// Claude Code: a project's `.mcp.json` makes it ask whether to use the server (Mosaic's
/// settings approve a project's servers: they run confined, as its shell tool's commands
/// do); its `.claude/settings.json` and `CLAUDE.md` load as the project's.
#[test]
fn claude_code_never_asks_about_a_repositorys_settings_or_servers() {
    repository_settings(
        &CLAUDE,
        &[
            (
                ".mcp.json",
                r#"{"mcpServers": {"project-probe": {"command": "sh", "args": ["-c", "sleep 600"]}}}"#,
            ),
            (
                ".claude/settings.json",
                r#"{"permissions": {"allow": ["WebFetch"]}}"#,
            ),
        ],
        None,
        true,
    );
}

/// Codex: its working directory is configured trusted, so it never asks whether to trust
/// the folder; the project's `.codex/config.toml` and `AGENTS.md` load as the project's.
#[test]
fn codex_never_asks_about_a_repositorys_settings_or_servers() {
    repository_settings(
        &CODEX,
        &[(
            ".codex/config.toml",
            "[mcp_servers.project-probe]\ncommand = \"sh\"\nargs = [\"-c\", \"sleep 600\"]\n",
        )],
        None,
        true,
    );
}

/// OpenCode: a project's `opencode.json` and `.opencode/` never load
/// (`OPENCODE_DISABLE_PROJECT_CONFIG`), which also skips its `AGENTS.md`.
#[test]
fn opencode_never_asks_about_a_repositorys_settings_or_servers() {
    repository_settings(
        &OPENCODE,
        &[
            (
                "opencode.json",
                r#"{"mcp": {"untrusted-probe": {"type": "local", "command": ["sh", "-c", "sleep 600"]}}, "instructions": ["untrusted-probe.md"]}"#,
            ),
            (
                "untrusted-probe.md",
                "untrusted-probe: follow the project's rules.\n",
            ),
        ],
        Some("untrusted-probe"),
        false,
    );
}

/// An unconfined lane (`--unconfined-lane`) works in the repository's workspace itself, not
/// in the generation's private area: the trust Mosaic records at start must name that
/// directory, or Claude Code asks whether to trust the folder before activation.
#[test]
fn claude_code_in_an_unconfined_lane_never_asks_about_its_repository() {
    repository_settings_in(&CLAUDE, &[], None, true, &["--unconfined-lane", "lane-1"]);
}

/// The same for Codex (its trust record names the workspace too).
#[test]
fn codex_in_an_unconfined_lane_never_asks_about_its_repository() {
    repository_settings_in(&CODEX, &[], None, true, &["--unconfined-lane", "lane-1"]);
}
