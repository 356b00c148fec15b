//! `mosaic tui`: a live terminal view of every lane, and the keys to drive them.
//!
//! The view follows the coordinator through its `watch` operator call (it answers when
//! anything changes, or after 20 s), so it is current without polling. Enter attaches to
//! the selected lane's tmux session when the lane runs on this machine (its supervisor's
//! control socket is under the state dir) and returns to the view on detach; the bottom
//! pane previews that session live without attaching (`preview`).
//!
//! Lanes that wait on the operator are marked (`view::mark`): a quarantined lane or host,
//! work in recovery, blocked work (a human prompt as "waiting for input"). `n` selects the
//! next one; past events (a handoff expired) are in the notifications pane.
//!
//! **Never:** shows fence material or keys (the operator API does not hand them out), shows
//! of a lane more than attaching would, lets the harness's output drive the operator's
//! terminal, or acts without the operator pressing a key for it.

mod preview;
mod view;

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Duration;

use ratatui::crossterm::event::{self, Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers};
use ratatui::crossterm::terminal::{
    disable_raw_mode, enable_raw_mode, EnterAlternateScreen, LeaveAlternateScreen,
};
use ratatui::crossterm::ExecutableCommand;
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table, TableState};
use serde_json::Value;

use crate::coordinator::service::{operator_request, OperatorRequest, OperatorTarget};
use preview::{local_lanes, Preview, Shot};
use view::{s, snapshot, LaneRow, Mark, Snapshot};

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

/// What the bottom pane shows; Tab goes to the next.
#[derive(Clone, Copy, PartialEq)]
enum Pane {
    /// The selected lane's own pane, live.
    Preview,
    Receipts,
    Audit,
    Notifications,
}

impl Pane {
    fn next(self) -> Self {
        match self {
            Pane::Preview => Pane::Receipts,
            Pane::Receipts => Pane::Audit,
            Pane::Audit => Pane::Notifications,
            Pane::Notifications => Pane::Preview,
        }
    }
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
    notifications: Vec<String>,
    /// The latest look at the selected lane's pane.
    shot: Option<Shot>,
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
    let preview = Preview::start(opts.tmux.clone(), opts.state_dir.clone());
    let mut term = enter()?;
    let mut app = App {
        snap: Snapshot::default(),
        table: TableState::default(),
        pane: Pane::Preview,
        audit: Vec::new(),
        notifications: Vec::new(),
        shot: None,
        message: "connecting…".into(),
        mode: Mode::Browse,
    };
    let result = (|| -> Result<(), TuiError> {
        loop {
            while let Ok(update) = rx.try_recv() {
                match update {
                    Ok(v) => {
                        let now = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .map(|d| d.as_secs_f64())
                            .unwrap_or(0.0);
                        app.snap = snapshot(&v, now);
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
            let selected = app.selected().map(|r| r.lane_id.clone());
            preview.select(selected.as_deref().filter(|_| app.pane == Pane::Preview));
            if let Some(shot) = preview.take() {
                if Some(&shot.lane_id) == selected.as_ref() {
                    app.shot = Some(shot);
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
            app.pane = app.pane.next();
            match app.pane {
                Pane::Audit => refresh_audit(app, opts),
                Pane::Notifications => refresh_notifications(app, opts),
                Pane::Preview | Pane::Receipts => {}
            }
        }
        // The next lane (after the selected one, wrapping) that waits on the operator.
        KeyCode::Char('n') if n > 0 => {
            let from = app.table.selected().unwrap_or(0);
            let next = (1..=n)
                .map(|i| (from + i) % n)
                .find(|&i| matches!(app.snap.rows[i].mark, Some(Mark::Needs(_))));
            match next {
                Some(i) => app.table.select(Some(i)),
                None => app.message = "no lane needs you".into(),
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

fn refresh_notifications(app: &mut App, opts: &TuiOptions) {
    match operator_request(&opts.target, &OperatorRequest::Notifications) {
        Ok(v) => {
            app.notifications = v
                .as_array()
                .into_iter()
                .flatten()
                .map(|r| {
                    let b = &r["body"];
                    format!(
                        "{}  {}  {}{}  {}",
                        s(&b["at"]),
                        s(&r["kind"]),
                        s(&b["lane_id"]),
                        s(&b["target_lane_id"]),
                        match (r["done"] == true, r["last_error"].as_str()) {
                            (true, _) => "delivered".to_string(),
                            (false, Some(e)) => format!("retrying ({e})"),
                            (false, None) => "not delivered yet".to_string(),
                        }
                    )
                })
                .collect();
        }
        Err(e) => app.message = format!("notifications: {e}"),
    }
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
        Constraint::Percentage(45),
        Constraint::Length(2),
    ])
    .areas(f.area());
    let needing = app.snap.needing();
    let mut header = vec![Span::styled(
        format!(
            " Mosaic — coordinator {} — hosts: {}",
            app.snap.leadership, app.snap.hosts
        ),
        Style::default().add_modifier(Modifier::BOLD),
    )];
    if needing > 0 {
        header.push(Span::styled(
            format!("  ! {needing} lane(s) need you (n: next)"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    if let Some(e) = &app.snap.unreachable {
        header.push(Span::styled(
            format!("  database unreachable: {e}"),
            Style::default().fg(Color::Red),
        ));
    }
    f.render_widget(Paragraph::new(Line::from(header)), head);
    let state_color = |st: &str| match st {
        "RUNNING" => Color::Green,
        "IDLE_CLEAN" => Color::Gray,
        "QUARANTINED" => Color::Red,
        "DRAINING" | "RETIRING" => Color::Yellow,
        _ => Color::Cyan,
    };
    let rows: Vec<Row> =
        app.snap
            .rows
            .iter()
            .map(|r| {
                let mark = match &r.mark {
                    Some(m @ Mark::Needs(_)) => Cell::from(format!("! {}", m.text()))
                        .style(Style::default().fg(Color::Red).add_modifier(Modifier::BOLD)),
                    Some(m @ Mark::Note(_)) => Cell::from(format!("· {}", m.text()))
                        .style(Style::default().fg(Color::Yellow)),
                    None => Cell::from(""),
                };
                Row::new(vec![
                    Cell::from(r.lane_id.clone()),
                    Cell::from(r.state.clone()).style(Style::default().fg(state_color(&r.state))),
                    mark,
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
        Constraint::Length(12),
        Constraint::Length(28),
        Constraint::Length(12),
        Constraint::Length(4),
        Constraint::Length(36),
        Constraint::Length(30),
        Constraint::Length(18),
        Constraint::Length(9),
        Constraint::Min(20),
    ];
    let t = Table::new(rows, widths)
        .header(
            Row::new([
                "lane",
                "state",
                "needs",
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
    let selected = app
        .selected()
        .map(|r| (r.lane_id.clone(), r.host_id.clone()));
    let (title, lines): (String, Vec<String>) = match app.pane {
        Pane::Preview => preview_lines(app, selected, bottom.height.saturating_sub(2)),
        Pane::Receipts => (
            " last receipt per lane (Tab: audit) ".into(),
            app.snap.receipts.clone(),
        ),
        Pane::Audit => (
            " audit, newest first (Tab: notifications) ".into(),
            app.audit.clone(),
        ),
        Pane::Notifications => (
            " notifications, newest first (Tab: preview) ".into(),
            app.notifications.clone(),
        ),
    };
    f.render_widget(
        Paragraph::new(lines.into_iter().map(Line::from).collect::<Vec<_>>())
            .block(Block::default().borders(Borders::ALL).title(title)),
        bottom,
    );
    let help = match &app.mode {
        Mode::Assign(text) => format!(" assign to {}: {text}▏ (runtime task…, Enter/Esc)", app.selected().map(|r| r.lane_id.as_str()).unwrap_or("")),
        Mode::Browse => " ↑↓ select  n next needing you  Enter attach  a assign  s stop  R resume  r release  Tab preview/receipts/audit/notifications  q quit".into(),
    };
    f.render_widget(
        Paragraph::new(vec![Line::from(app.message.as_str()), Line::from(help)]),
        foot,
    );
}

/// The preview pane's title and lines: the last `height` lines of the selected lane's
/// pane (trailing blank lines dropped), or why there is nothing to show.
fn preview_lines(
    app: &App,
    selected: Option<(String, String)>,
    height: u16,
) -> (String, Vec<String>) {
    let Some((lane_id, host_id)) = selected else {
        return (" preview (Tab: receipts) ".into(), vec![]);
    };
    let shot = app.shot.as_ref().filter(|s| s.lane_id == lane_id);
    let Some(shot) = shot else {
        return (
            format!(" {lane_id} on {host_id} (Tab: receipts) "),
            vec!["looking…".into()],
        );
    };
    let age = shot.at.elapsed().as_secs();
    let stale = if age >= 3 {
        format!(" — {age} s old")
    } else {
        String::new()
    };
    let title = format!(" {lane_id} on {host_id}, live{stale} (Tab: receipts) ");
    match &shot.text {
        Err(e) => (title, vec![e.clone()]),
        Ok(text) => {
            let lines: Vec<&str> = text.lines().collect();
            let used = lines
                .iter()
                .rposition(|l| !l.trim().is_empty())
                .map_or(0, |i| i + 1);
            let from = used.saturating_sub(usize::from(height));
            (
                title,
                lines[from..used].iter().map(|l| l.to_string()).collect(),
            )
        }
    }
}
