//! `mosaic tui`: a live terminal view of every lane, and the keys to drive them.
//!
//! The view follows the coordinator through its `watch` operator call (it answers when
//! anything changes, or after 20 s), so it is current without polling. Enter attaches to
//! the selected lane's tmux session when the lane runs on this machine (its supervisor's
//! control socket is under the state dir) and returns to the view on detach.
//!
//! **Never:** shows task text, fence material or keys (the operator API does not hand them
//! out), or acts without the operator pressing a key for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::crossterm::ExecutableCommand;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use serde_json::Value;

use crate::coordinator::service::{operator_request, OperatorRequest, OperatorTarget};

#[derive(Debug, thiserror::Error)]
pub enum TuiError {
    #[error("terminal: {0}")]
    Terminal(#[from] std::io::Error),
}

/// Where the view comes from, and where local lanes' tmux servers are.
pub struct TuiOptions {
    pub target: OperatorTarget,
    /// A `mosaic up` state dir: its supervisors' control sockets say where to attach.
    pub state_dir: Option<PathBuf>,
    pub tmux: PathBuf,
}

/// One row of the lane table.
#[derive(Debug, Clone, Default)]
struct LaneRow {
    lane_id: String,
    state: String,
    runtime: String,
    generation: String,
    assignment: String,
    lifecycle: String,
    /// The work record's status where it says more than the lifecycle: blocked (with its
    /// code), handoff, or the watchdog's step.
    work: String,
    owner: String,
    since: String,
    last_receipt: String,
}

#[derive(Default)]
struct Snapshot {
    rows: Vec<LaneRow>,
    leadership: String,
    hosts: String,
    receipts: Vec<String>,
}

fn s(v: &Value) -> String {
    match v {
        Value::String(x) => x.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn snapshot(v: &Value) -> Snapshot {
    let mut by_lane: BTreeMap<String, LaneRow> = BTreeMap::new();
    for l in v["lanes"].as_array().into_iter().flatten() {
        let id = s(&l["lane_id"]);
        by_lane.insert(
            id.clone(),
            LaneRow {
                lane_id: id,
                state: s(&l["state"]),
                generation: s(&l["unended_generation"]),
                since: s(&l["since"]).get(11..19).unwrap_or("").to_string(),
                ..Default::default()
            },
        );
    }
    // The assignment holding each lane (its lane_state is set only while it does).
    for a in v["assignments"].as_array().into_iter().flatten() {
        let Some(row) = by_lane.get_mut(&s(&a["lane_id"])) else {
            continue;
        };
        let holds = !a["lane_state"].is_null();
        let recovering = a["state"] == "RECOVERY";
        if holds || (recovering && row.assignment.is_empty()) {
            row.assignment = s(&a["assignment_id"]);
            row.lifecycle = s(&a["state"]);
            row.work = match (
                s(&a["work_status"]).as_str(),
                s(&a["watchdog_step"]).as_str(),
            ) {
                ("blocked", _) => format!("blocked: {}", s(&a["blocker_code"])),
                ("handoff", _) => format!("handoff → {}", s(&a["pending_target"])),
                (_, "none" | "") => String::new(),
                (_, step) => step.to_string(),
            };
            row.runtime = s(&a["runtime_id"]);
            row.owner = s(&a["execution_owner"]);
            if row.generation.is_empty() && holds {
                row.generation = s(&a["generation"]);
            }
        }
    }
    for r in v["last_receipts"].as_array().into_iter().flatten() {
        if let Some(row) = by_lane.get_mut(&s(&r["lane_id"])) {
            row.last_receipt = format!(
                "gen {} {} ({})",
                s(&r["generation"]),
                s(&r["reason"]),
                s(&r["reconciliation"])
            );
        }
    }
    let lead = &v["leadership"];
    Snapshot {
        rows: by_lane.into_values().collect(),
        leadership: format!(
            "{} epoch {} (losses {})",
            s(&lead["state"]),
            s(&v["coordinator_epoch"]),
            s(&lead["losses"])
        ),
        hosts: v["hosts_connected"]
            .as_array()
            .map(|h| h.iter().map(s).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        receipts: v["last_receipts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                format!(
                    "{}  {}  gen {}  {} / {}  → {}",
                    s(&r["at"]),
                    s(&r["lane_id"]),
                    s(&r["generation"]),
                    s(&r["source"]),
                    s(&r["reason"]),
                    s(&r["reconciliation"])
                )
            })
            .collect(),
    }
}

/// What the bottom pane shows.
#[derive(Clone, Copy, PartialEq)]
enum Pane {
    Receipts,
    Audit,
}

enum Mode {
    Browse,
    /// Typing `runtime task…` for an assign to the selected lane.
    Assign(String),
}

struct App {
    snap: Snapshot,
    table: TableState,
    pane: Pane,
    audit: Vec<String>,
    message: String,
    mode: Mode,
}

impl App {
    fn selected(&self) -> Option<&LaneRow> {
        self.table.selected().and_then(|i| self.snap.rows.get(i))
    }
}

/// Long-polls `watch` on its own thread and hands each answer to the view.
fn follow(target: OperatorTarget, tx: mpsc::Sender<Result<Value, String>>) {
    std::thread::spawn(move || {
        let mut version = u64::MAX;
        loop {
            let r = operator_request(&target, &OperatorRequest::Watch { version });
            match r {
                Ok(v) => {
                    version = v["version"].as_u64().unwrap_or(u64::MAX);
                    if tx.send(Ok(v)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    if tx.send(Err(e.to_string())).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_secs(1));
                }
            }
        }
    });
}

/// The tmux socket of each lane on this machine, from the supervisors under `state_dir`.
fn local_lanes(state_dir: &Path) -> BTreeMap<String, (PathBuf, String)> {
    let mut out = BTreeMap::new();
    let run = state_dir.join("run");
    let mut sockets = vec![run.join("control.sock")];
    if let Ok(rd) = std::fs::read_dir(&run) {
        for e in rd.flatten() {
            sockets.push(e.path().join("control.sock"));
        }
    }
    for sock in sockets.into_iter().filter(|p| p.exists()) {
        if let Ok(st) =
            crate::supervisor::control::call(&sock, &crate::supervisor::control::Request::Status)
        {
            for l in st["lanes"].as_array().into_iter().flatten() {
                out.insert(
                    s(&l["lane_id"]),
                    (PathBuf::from(s(&l["tmux_socket"])), s(&l["lane"])),
                );
            }
        }
    }
    out
}

type Term = ratatui::Terminal<ratatui::backend::CrosstermBackend<std::io::Stdout>>;

fn enter() -> Result<Term, TuiError> {
    enable_raw_mode()?;
    std::io::stdout().execute(EnterAlternateScreen)?;
    Ok(ratatui::Terminal::new(
        ratatui::backend::CrosstermBackend::new(std::io::stdout()),
    )?)
}

fn leave() {
    let _ = disable_raw_mode();
    let _ = std::io::stdout().execute(LeaveAlternateScreen);
}

/// Runs the view until `q`.
pub fn run(opts: TuiOptions) -> Result<(), TuiError> {
    let (tx, rx) = mpsc::channel();
    follow(opts.target.clone(), tx);
    let mut term = enter()?;
    let mut app = App {
        snap: Snapshot::default(),
        table: TableState::default(),
        pane: Pane::Receipts,
        audit: Vec::new(),
        message: "connecting…".into(),
        mode: Mode::Browse,
    };
    let result = (|| -> Result<(), TuiError> {
        loop {
            while let Ok(update) = rx.try_recv() {
                match update {
                    Ok(v) => {
                        app.snap = snapshot(&v);
                        if app.table.selected().is_none() && !app.snap.rows.is_empty() {
                            app.table.select(Some(0));
                        }
                        if app.message == "connecting…" {
                            app.message.clear();
                        }
                    }
                    Err(e) => app.message = format!("coordinator: {e}"),
                }
            }
            term.draw(|f| draw(f, &mut app))?;
            if !event::poll(Duration::from_millis(250))? {
                continue;
            }
            let Event::Key(k) = event::read()? else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            if !key(&mut app, k, &opts, &mut term)? {
                return Ok(());
            }
        }
    })();
    leave();
    result
}

/// Handles one key; false to quit.
fn key(app: &mut App, k: KeyEvent, opts: &TuiOptions, term: &mut Term) -> Result<bool, TuiError> {
    if let Mode::Assign(text) = &mut app.mode {
        match k.code {
            KeyCode::Esc => app.mode = Mode::Browse,
            KeyCode::Backspace => {
                text.pop();
            }
            KeyCode::Char(c) => text.push(c),
            KeyCode::Enter => {
                let input = std::mem::take(text);
                app.mode = Mode::Browse;
                assign(app, opts, &input, None);
            }
            _ => {}
        }
        return Ok(true);
    }
    let n = app.snap.rows.len();
    match k.code {
        KeyCode::Char('q') => return Ok(false),
        KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => return Ok(false),
        KeyCode::Down | KeyCode::Char('j') if n > 0 => {
            app.table
                .select(Some((app.table.selected().unwrap_or(0) + 1).min(n - 1)));
        }
        KeyCode::Up | KeyCode::Char('k') if n > 0 => {
            app.table
                .select(Some(app.table.selected().unwrap_or(0).saturating_sub(1)));
        }
        KeyCode::Tab => {
            app.pane = if app.pane == Pane::Receipts {
                Pane::Audit
            } else {
                Pane::Receipts
            };
            if app.pane == Pane::Audit {
                refresh_audit(app, opts);
            }
        }
        KeyCode::Char('a') if app.selected().is_some() => {
            app.mode = Mode::Assign("fake@1.0.0 ".into());
        }
        KeyCode::Char('s') | KeyCode::Char('x') => {
            if let Some(r) = app.selected().cloned() {
                if r.assignment.is_empty() {
                    app.message = format!("{}: nothing to stop", r.lane_id);
                } else {
                    let req = OperatorRequest::Stop {
                        assignment_id: r.assignment.clone(),
                        outcome: Some("cancelled".into()),
                        evidence_digest: None,
                        wait: false,
                        request_id: None,
                    };
                    app.message = match operator_request(&opts.target, &req) {
                        Ok(v) => format!("stop {}: {}", r.assignment, s(&v["state"])),
                        Err(e) => format!("stop {}: {e}", r.assignment),
                    };
                }
            }
        }
        KeyCode::Char('r') => {
            if let Some(r) = app.selected().cloned() {
                let req = OperatorRequest::LaneRelease {
                    lane_id: r.lane_id.clone(),
                    request_id: None,
                };
                app.message = match operator_request(&opts.target, &req) {
                    Ok(_) => format!("{}: released", r.lane_id),
                    Err(e) => format!("release {}: {e}", r.lane_id),
                };
            }
        }
        KeyCode::Char('R') => {
            if let Some(r) = app.selected().cloned() {
                if r.lifecycle == "RECOVERY" {
                    let input = format!("{} ", r.runtime);
                    // The resumed assignment keeps its task; the prompt text is ignored
                    // beyond the runtime.
                    assign(app, opts, &input, Some(r.assignment.clone()));
                } else {
                    app.message = format!("{}: no assignment in recovery to resume", r.lane_id);
                }
            }
        }
        KeyCode::Enter => {
            if let Some(r) = app.selected().cloned() {
                attach(app, opts, term, &r.lane_id)?;
            }
        }
        _ => {}
    }
    Ok(true)
}

fn assign(app: &mut App, opts: &TuiOptions, input: &str, resume: Option<String>) {
    let Some(lane) = app.selected().map(|r| r.lane_id.clone()) else {
        return;
    };
    let (runtime, task) = input.trim().split_once(' ').unwrap_or((input.trim(), ""));
    let task = if resume.is_some() && task.is_empty() {
        "resume"
    } else {
        task
    };
    let req = OperatorRequest::Assign {
        lane_id: lane.clone(),
        runtime: runtime.to_string(),
        task: task.to_string(),
        scope: vec![],
        holds: vec![],
        completion_policy: None,
        wait: false,
        resume,
        request_id: None,
        inactivity_policy: None,
        repo: None,
        base: None,
        replace_task: false,
        from_checkpoint: None,
        grant_within_s: None,
        place: None,
    };
    app.message = match operator_request(&opts.target, &req) {
        Ok(v) => format!(
            "assign {lane}: {} {}",
            s(&v["assignment_id"]),
            s(&v["state"])
        ),
        Err(e) => format!("assign {lane}: {e}"),
    };
}

fn refresh_audit(app: &mut App, opts: &TuiOptions) {
    match operator_request(&opts.target, &OperatorRequest::Audit { since: 0 }) {
        Ok(v) => {
            app.audit = v
                .as_array()
                .into_iter()
                .flatten()
                .rev()
                .take(200)
                .map(|r| {
                    format!(
                        "{}  {}  {}  {}",
                        s(&r["at"]),
                        s(&r["operation"]),
                        s(&r["category"]),
                        s(&r["detail"])
                    )
                })
                .collect();
        }
        Err(e) => app.message = format!("audit: {e}"),
    }
}

/// Hands the terminal to `tmux attach` for the lane, and takes it back on detach.
fn attach(
    app: &mut App,
    opts: &TuiOptions,
    term: &mut Term,
    lane_id: &str,
) -> Result<(), TuiError> {
    let lanes = opts
        .state_dir
        .as_deref()
        .map(local_lanes)
        .unwrap_or_default();
    let Some((socket, name)) = lanes.get(lane_id) else {
        app.message = format!(
            "{lane_id} does not run on this machine (or no --state-dir): attach on its host with `mosaic host status`'s attach line"
        );
        return Ok(());
    };
    leave();
    let status = std::process::Command::new(&opts.tmux)
        .arg("-S")
        .arg(socket)
        .args(["attach", "-t", &format!("={name}")])
        // Inside another tmux (or this one), attaching must not refuse to nest.
        .env_remove("TMUX")
        .status();
    *term = enter()?;
    term.clear()?;
    app.message = match status {
        Ok(st) if st.success() => format!("detached from {lane_id}"),
        Ok(st) => format!("tmux attach to {lane_id} ended with {st}"),
        Err(e) => format!("cannot run tmux: {e}"),
    };
    Ok(())
}

fn draw(f: &mut ratatui::Frame, app: &mut App) {
    let [head, table, bottom, foot] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Min(6),
        Constraint::Length(8),
        Constraint::Length(2),
    ])
    .areas(f.area());
    f.render_widget(
        Paragraph::new(format!(
            " Mosaic — coordinator {} — hosts: {}",
            app.snap.leadership, app.snap.hosts
        ))
        .style(Style::default().add_modifier(Modifier::BOLD)),
        head,
    );
    let state_color = |st: &str| match st {
        "RUNNING" => Color::Green,
        "IDLE_CLEAN" => Color::Gray,
        "QUARANTINED" => Color::Red,
        "DRAINING" | "RETIRING" => Color::Yellow,
        _ => Color::Cyan,
    };
    let rows: Vec<Row> = app
        .snap
        .rows
        .iter()
        .map(|r| {
            Row::new(vec![
                Cell::from(r.lane_id.clone()),
                Cell::from(r.state.clone()).style(Style::default().fg(state_color(&r.state))),
                Cell::from(r.runtime.clone()),
                Cell::from(r.generation.clone()),
                Cell::from(r.assignment.clone()),
                Cell::from(if r.work.is_empty() {
                    r.lifecycle.clone()
                } else {
                    format!("{} · {}", r.lifecycle, r.work)
                }),
                Cell::from(r.owner.clone()),
                Cell::from(r.since.clone()),
                Cell::from(r.last_receipt.clone()),
            ])
        })
        .collect();
    let widths = [
        Constraint::Length(22),
        Constraint::Length(18),
        Constraint::Length(12),
        Constraint::Length(4),
        Constraint::Length(36),
        Constraint::Length(36),
        Constraint::Length(18),
        Constraint::Length(9),
        Constraint::Min(20),
    ];
    let t = Table::new(rows, widths)
        .header(
            Row::new([
                "lane",
                "state",
                "runtime",
                "gen",
                "assignment",
                "lifecycle · work",
                "exec owner",
                "since",
                "last receipt",
            ])
            .style(Style::default().add_modifier(Modifier::BOLD)),
        )
        .block(Block::default().borders(Borders::ALL).title(" lanes "))
        .row_highlight_style(Style::default().add_modifier(Modifier::REVERSED));
    f.render_stateful_widget(t, table, &mut app.table);
    let (title, lines) = match app.pane {
        Pane::Receipts => (" last receipt per lane (Tab: audit) ", &app.snap.receipts),
        Pane::Audit => (" audit, newest first (Tab: receipts) ", &app.audit),
    };
    f.render_widget(
        Paragraph::new(
            lines
                .iter()
                .map(|l| Line::from(l.as_str()))
                .collect::<Vec<_>>(),
        )
        .block(Block::default().borders(Borders::ALL).title(title)),
        bottom,
    );
    let help = match &app.mode {
        Mode::Assign(text) => format!(" assign to {}: {text}▏ (runtime task…, Enter/Esc)", app.selected().map(|r| r.lane_id.as_str()).unwrap_or("")),
        Mode::Browse => " ↑↓ select  Enter attach  a assign  s stop  R resume  r release  Tab receipts/audit  q quit".into(),
    };
    f.render_widget(
        Paragraph::new(vec![Line::from(app.message.as_str()), Line::from(help)]),
        foot,
    );
}
