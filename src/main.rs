//! The `mosaic` binary: parses arguments and calls the library. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use mosaic::coordinator::service::OperatorRequest;
use mosaic::supervisor::control::{self, Request};

/// `sha256:<hex>` of a file's bytes (evidence is sent as its digest, never its content).
fn file_digest(p: &std::path::Path) -> anyhow::Result<String> {
    use sha2::Digest;
    let bytes = std::fs::read(p).with_context(|| format!("reading evidence {}", p.display()))?;
    Ok(format!(
        "sha256:{}",
        hex::encode(sha2::Sha256::digest(bytes))
    ))
}

#[derive(Parser)]
#[command(
    name = "mosaic",
    version,
    about = "Fresh-process authority for fleets of AI coding agents"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run everything on this machine (today: the supervisor with N fake-harness lanes).
    Up {
        #[arg(long)]
        state_dir: Option<PathBuf>,
        #[arg(long, default_value_t = 2)]
        lanes: u32,
        /// Run this many supervisors, each a host of its own (certificate, keys, cgroup
        /// subtree, state), as separate processes against one coordinator. Host ids are
        /// `<hostname>-1` … `<hostname>-N`.
        #[arg(long, default_value_t = 1)]
        hosts: u32,
        /// Assign a task, show it reach RUNNING, SIGKILL its harness, show the receipt and
        /// the recovery; then stay up.
        #[arg(long)]
        demo: bool,
        /// Use this PostgreSQL instead of a private cluster in the state dir.
        #[arg(long)]
        database_url: Option<String>,
        /// Where real harnesses are installed (`mosaic harness install`); default
        /// $MOSAIC_HARNESS_ROOT, else /var/lib/mosaic/harnesses.
        #[arg(long)]
        harness_root: Option<PathBuf>,
        /// A runtime's credentials file, `RUNTIME=FILE` (mode 0600; repeatable), e.g.
        /// `claude-code=/etc/mosaic/claude-code.env`.
        #[arg(long = "credentials", value_parser = parse_runtime_path)]
        credentials: Vec<(String, PathBuf)>,
        /// Load runtime registry entries from this directory instead of the built-in ones.
        #[arg(long)]
        registry_dir: Option<PathBuf>,
        /// A runtime's config overlay, `RUNTIME=DIR` (repeatable): config files (provider,
        /// model selection) copied into each of its generations, e.g. `pi=/etc/mosaic/pi`.
        #[arg(long = "harness-config", value_parser = parse_runtime_path)]
        harness_config: Vec<(String, PathBuf)>,
    },
    /// Install the pinned real harnesses from npm (into the harness root), or check them.
    Harness {
        #[command(subcommand)]
        op: HarnessOp,
    },
    /// Run the coordinator daemon (the authority, on PostgreSQL).
    Coordinator {
        #[arg(long)]
        config: PathBuf,
    },
    /// Lanes the coordinator knows, with their incarnation and state.
    Lanes {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Assign a task to a lane: reserve, stage a fresh generation, contract, ACK, activate.
    /// Everything is validated before anything is reserved.
    Assign {
        #[arg(long = "lane")]
        lane_id: String,
        #[arg(long)]
        runtime: String,
        /// The task text; `-` reads it from standard input.
        #[arg(
            long,
            conflicts_with = "task_file",
            required_unless_present = "task_file"
        )]
        task: Option<String>,
        /// Read the task text from this file (for tasks too long for a command line).
        #[arg(long)]
        task_file: Option<PathBuf>,
        /// A capability the assignment may use (repeatable; one effect lease each).
        /// Default: the lane itself.
        #[arg(long = "scope")]
        scope: Vec<String>,
        /// A capability it must not use, even where the scope names it (repeatable).
        #[arg(long = "hold")]
        holds: Vec<String>,
        /// The completion policy (default operator-evidence/v1: COMPLETED only with
        /// `mosaic stop --complete --evidence FILE`).
        #[arg(long)]
        completion_policy: Option<String>,
        /// `running`: return once the generation is RUNNING (or the chain ended).
        #[arg(long)]
        wait: Option<String>,
        /// Resume this assignment (left in recovery, e.g. after its harness died) on a
        /// fresh generation instead of creating a new assignment.
        #[arg(long)]
        resume: Option<String>,
        /// The inactivity policy (`name@version`, published with `mosaic policy publish`)
        /// that decides when idle work is warned, escalated, replaced and reassigned.
        /// Default: default@1.
        #[arg(long)]
        inactivity_policy: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Block active work: a canonical code, an evidence file and the action that would
    /// unblock it (the work keeps its owner; the watchdog leaves it alone).
    Block {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        code: String,
        /// The evidence (required: a blocked claim without evidence is refused).
        #[arg(long)]
        evidence: PathBuf,
        #[arg(long)]
        next_action: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Make blocked work active again: a fresh inactivity period and attempt budget; work
    /// in recovery gets its next attempt from the watchdog at once.
    Unblock {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        next_action: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Hand RUNNING work to an idle lane: the target's fresh generation must acknowledge
    /// the handoff (`mosaic lane handoff-ack`) before responsibility moves, and then still
    /// needs its own activation ACK before it runs.
    Handoff {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long = "to")]
        lane_id: String,
        /// The target's task (default: the current attempt's).
        #[arg(long)]
        task: Option<String>,
        /// Milliseconds the target has to acknowledge and activate (default: the
        /// coordinator's reservation ttl); past it the work stays with its source.
        #[arg(long)]
        within_ms: Option<i64>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Continue RUNNING work with a next action: delivered to its live generation at the
    /// next settled boundary (`mosaic lane next`) and accepted exactly once.
    Continue {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        next_action: String,
        /// Milliseconds it may wait for delivery (default 600000).
        #[arg(long)]
        within_ms: Option<i64>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Inactivity policies: publish a version (frozen once published), show one.
    Policy {
        #[command(subcommand)]
        op: PolicyOp,
    },
    /// Assignments (owners, state, generation) and lanes.
    Status {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Termination receipts the coordinator ingested, with their reconciliation.
    Receipts {
        #[arg(long = "lane")]
        lane_id: Option<String>,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// End an assignment: its leases are revoked at once, its generation stopped, and the
    /// outcome (CANCELLED unless --complete or --fail) becomes final when the host's
    /// termination receipt proves the generation ended. With the host unreachable it
    /// answers `pending` and finishes when the host reconnects; repeating it is idempotent.
    Stop {
        #[arg(long = "assignment")]
        assignment_id: String,
        /// End it COMPLETED; needs --evidence.
        #[arg(long, conflicts_with = "fail", requires = "evidence")]
        complete: bool,
        /// End it FAILED.
        #[arg(long)]
        fail: bool,
        /// A file whose SHA-256 becomes the completion evidence (its content is not sent).
        #[arg(long)]
        evidence: Option<PathBuf>,
        /// Return at once instead of waiting for the host's receipt.
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Cancel an assignment in any unfinished state (a stop with outcome CANCELLED).
    Cancel {
        #[arg(long = "assignment")]
        assignment_id: String,
        #[arg(long)]
        no_wait: bool,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// A live view of every lane (state, runtime, generation, assignment, owner, last
    /// receipt), with keys to attach (Enter), assign, stop, resume and release.
    Tui {
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The coordinator's audit log of refusals (identifiers and categories only).
    Audit {
        /// Only rows after this audit id.
        #[arg(long, default_value_t = 0)]
        since: i64,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Run the per-host supervisor daemon.
    Supervisor {
        #[arg(long)]
        config: PathBuf,
    },
    /// Talk to a running supervisor over its local control socket.
    Host {
        /// Control socket path.
        #[arg(long, conflicts_with_all = ["config", "state_dir"])]
        socket: Option<PathBuf>,
        /// The supervisor's config file (its runtime_dir holds the socket).
        #[arg(long, conflicts_with = "state_dir")]
        config: Option<PathBuf>,
        /// The state dir of `mosaic up` (default: $MOSAIC_STATE_DIR or the user state dir).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Print compact JSON instead of indented JSON.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        op: HostOp,
    },
    /// Check whether this host can run the supervisor.
    Doctor {
        #[arg(long)]
        json: bool,
        /// The cgroup root the supervisor would be configured with.
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
    },
    /// Install missing system packages (tmux, PostgreSQL server) when root with apt.
    Setup,
    /// A private CA and mutual-TLS certificates for coordinators, hosts and operators.
    Pki {
        #[command(subcommand)]
        op: PkiOp,
    },
    /// Inside a generation: fetch the contract, acknowledge the challenge. For operators:
    /// release a quarantined lane, or have its host recreate it.
    Lane {
        #[command(subcommand)]
        op: LaneOp,
    },
}

/// Where the coordinator is: its local socket (from a state dir, or explicit), or a
/// remote operator listener reached with an operator certificate.
#[derive(clap::Args)]
struct CoordinatorAt {
    /// The state dir of `mosaic up` (default: $MOSAIC_STATE_DIR or the user state dir).
    #[arg(long)]
    state_dir: Option<PathBuf>,
    /// The coordinator's operator socket.
    #[arg(long, conflicts_with = "state_dir")]
    coordinator_socket: Option<PathBuf>,
    /// A remote coordinator's operator listener (HOST:PORT or tls://HOST:PORT); needs --ca,
    /// --cert, --key.
    #[arg(long, conflicts_with_all = ["state_dir", "coordinator_socket"], requires_all = ["ca", "cert", "key"])]
    coordinator: Option<String>,
    /// DNS name in the coordinator's certificate (default: the host part of --coordinator).
    #[arg(long)]
    server_name: Option<String>,
    /// The CA certificate, and this operator's certificate and key (`mosaic pki issue-operator`).
    #[arg(long)]
    ca: Option<PathBuf>,
    #[arg(long)]
    cert: Option<PathBuf>,
    #[arg(long)]
    key: Option<PathBuf>,
    /// Print compact JSON.
    #[arg(long)]
    json: bool,
}

impl CoordinatorAt {
    fn target(&self) -> anyhow::Result<mosaic::coordinator::service::OperatorTarget> {
        use mosaic::coordinator::service::OperatorTarget;
        Ok(match (&self.coordinator, &self.coordinator_socket) {
            (Some(at), _) => {
                let (addr, host) = mosaic::coordinator::service::parse_coordinator_addr(at)
                    .map_err(|e| anyhow::anyhow!(e))?;
                OperatorTarget::Remote {
                    addr,
                    server_name: self.server_name.clone().unwrap_or(host),
                    tls: mosaic::protocol::transport::TlsIdentity {
                        ca: self.ca.clone().unwrap_or_default(),
                        cert: self.cert.clone().unwrap_or_default(),
                        key: self.key.clone().unwrap_or_default(),
                    },
                }
            }
            (None, Some(s)) => OperatorTarget::Socket(s.clone()),
            (None, None) => OperatorTarget::Socket(mosaic::up::coordinator_socket(
                &self
                    .state_dir
                    .clone()
                    .unwrap_or_else(mosaic::up::default_state_dir),
            )),
        })
    }

    /// Sends the request and prints the result as JSON; a refusal prints
    /// `{"ok": false, "error": {"category": …, "message": …}}` and exits 1.
    fn call(&self, req: OperatorRequest) -> anyhow::Result<ExitCode> {
        let result = mosaic::coordinator::service::operator_request(&self.target()?, &req);
        self.print(result)
    }

    /// Refuses a request before it is sent (its input could not be read), the same way a
    /// coordinator refusal is printed.
    fn refuse(&self, message: String) -> anyhow::Result<ExitCode> {
        self.print(Err(mosaic::coordinator::service::OpError::new(
            mosaic::coordinator::Category::BadInput,
            message,
        )))
    }

    fn print(
        &self,
        result: Result<serde_json::Value, mosaic::coordinator::service::OpError>,
    ) -> anyhow::Result<ExitCode> {
        let out = match result {
            Ok(v) => (v, ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("mosaic: {e}");
                (
                    serde_json::json!({ "ok": false, "error": e }),
                    ExitCode::FAILURE,
                )
            }
        };
        if self.json {
            println!("{}", serde_json::to_string(&out.0)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&out.0)?);
        }
        Ok(out.1)
    }
}

#[derive(Subcommand)]
enum PolicyOp {
    /// Publish the inactivity policy in FILE (TOML: policy_id, warn_after_ms,
    /// escalate_after_ms, replace_after_ms, replacements_before_reassign, max_attempts,
    /// exhaustion, evidence_kinds).
    Publish {
        file: PathBuf,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Show a published policy and its digest.
    Show {
        policy_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
enum HarnessOp {
    /// Install pinned harnesses from npm (default: every installable registered runtime).
    Install {
        /// runtime@version, e.g. claude-code@2.1.332.
        runtimes: Vec<String>,
        /// Default: $MOSAIC_HARNESS_ROOT, else /var/lib/mosaic/harnesses.
        #[arg(long)]
        root: Option<PathBuf>,
        /// Registry entries to install from instead of the built-in ones.
        #[arg(long)]
        registry_dir: Option<PathBuf>,
    },
}

fn parse_runtime_path(s: &str) -> Result<(String, PathBuf), String> {
    let (rt, path) = s.split_once('=').ok_or_else(|| {
        "expected RUNTIME=PATH, e.g. claude-code=/etc/mosaic/claude-code.env".to_string()
    })?;
    if rt.is_empty() || path.is_empty() {
        return Err("expected RUNTIME=PATH".into());
    }
    Ok((rt.to_string(), PathBuf::from(path)))
}

#[derive(Subcommand)]
enum LaneOp {
    /// Print this generation's contract (waits until it is injected).
    Contract,
    /// Wait for this generation's activation check (harnesses that fetch it here).
    Challenge,
    /// Acknowledge this generation's challenge; returns once the generation is active.
    /// Without --response: fetches the challenge and answers it.
    Ack {
        /// The answer to submit as is (it must carry mosaic-ack:<phrase>).
        #[arg(long)]
        response: Option<String>,
    },
    /// Forward one hook event of a real harness (its JSON on stdin) to the supervisor and
    /// print what the harness should get back. Installed hooks call this; not for humans.
    Hook {
        /// The harness family (e.g. claude-code).
        family: String,
        /// The event (session-start, stop, session-end, …).
        event: String,
    },
    /// Acknowledge this generation's handoff challenge (a handoff target only); returns
    /// once responsibility moved to it.
    HandoffAck,
    /// Report progress with objective evidence (the supervisor digests it; the same
    /// evidence never counts twice). Only an active generation may report.
    Progress {
        /// commit | file-set | test-result
        #[arg(long)]
        kind: String,
        /// The evidence file (file-set, test-result).
        #[arg(long, conflicts_with = "commit", required_unless_present = "commit")]
        evidence: Option<PathBuf>,
        /// The commit id (kind commit).
        #[arg(long)]
        commit: Option<String>,
        /// What this generation does next (one line).
        #[arg(long)]
        next_action: Option<String>,
    },
    /// Wait, settled, for the coordinator's next continuation (each is given once).
    Next,
    /// Report the result of a continuation, with its evidence.
    ContinuationResult {
        #[arg(long = "id")]
        continuation_id: String,
        #[arg(long)]
        evidence: PathBuf,
    },
    /// Report that this generation is blocked: a canonical code, the evidence, and the
    /// executable action that would unblock it.
    Blocked {
        #[arg(long)]
        code: String,
        #[arg(long)]
        evidence: PathBuf,
        #[arg(long)]
        next_action: String,
    },
    /// Return a QUARANTINED lane to IDLE_CLEAN; refused unless every generation's cleanup
    /// was verified and nothing of the lane is still open.
    Release {
        #[arg(long = "lane")]
        lane_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// Have the lane's host destroy and recreate the lane (a fresh incarnation): the way
    /// out of a host-side quarantine or a cleanup that was never verified.
    Recreate {
        #[arg(long = "lane")]
        lane_id: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
enum PkiOp {
    /// Create the CA (ca.pem, ca-key.pem) in DIR.
    Init {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        force: bool,
    },
    /// Issue a coordinator (server) certificate; NAME goes in the SAN.
    IssueCoordinator {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
    /// Issue a host (client) certificate; the host id goes in the SAN.
    IssueHost {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        host_id: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
    /// Issue an operator (client) certificate.
    IssueOperator {
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 365)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
enum HostOp {
    /// Lanes, live generations and their identities.
    Status,
    /// Create a lane (or recreate a destroyed one with a fresh incarnation).
    LaneCreate { lane: String },
    /// Stop the lane's generation and remove the lane.
    LaneDestroy { lane: String },
    /// Start a fresh generation (any previous one is stopped and verified gone first).
    Start {
        #[arg(long)]
        lane: String,
        #[arg(long)]
        runtime: String,
        /// Task directives for the harness.
        directives: Vec<String>,
    },
    /// Stop the lane's generation and print its termination receipt.
    Stop {
        #[arg(long)]
        lane: String,
    },
    /// Termination receipts not yet acknowledged (with --all, acknowledged ones too).
    Receipts {
        #[arg(long)]
        lane: Option<String>,
        #[arg(long)]
        all: bool,
    },
    /// Acknowledge a receipt by idempotency key (the consumer took it over).
    Ack { key: String },
}

/// Logs to journald when running under systemd with a journal, to stderr otherwise.
/// `MOSAIC_LOG` sets the filter (default `info`).
fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOSAIC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let under_systemd =
        std::env::var_os("JOURNAL_STREAM").is_some() || std::env::var_os("INVOCATION_ID").is_some();
    if under_systemd {
        if let Ok(journald) = tracing_journald::layer() {
            let _ = tracing_subscriber::registry()
                .with(filter)
                .with(
                    journald
                        .with_syslog_identifier("mosaic".into())
                        // Fields as journald users query them: LANE_ID=, GENERATION=,
                        // ASSIGNMENT_ID=, RECEIPT_KEY=, REASON=.
                        .with_field_prefix(None),
                )
                .try_init();
            return;
        }
    }
    // Colours only on a terminal: a log file or pipe gets plain `field=value` text.
    use std::io::IsTerminal;
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn main() -> ExitCode {
    mosaic::coordinator::failpoint::setup();
    match run(Cli::parse()) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("mosaic: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.cmd {
        Cmd::Coordinator { config } => {
            init_logging();
            let text = std::fs::read_to_string(&config)
                .with_context(|| format!("reading {}", config.display()))?;
            let cfg: mosaic::coordinator::service::CoordinatorConfig =
                toml::from_str(&text).with_context(|| format!("parsing {}", config.display()))?;
            runtime()?.block_on(mosaic::coordinator::service::run_daemon(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Lanes { at } => at.call(OperatorRequest::Lanes),
        Cmd::Status { at } => at.call(OperatorRequest::Status),
        Cmd::Receipts { lane_id, at } => at.call(OperatorRequest::Receipts { lane_id }),
        Cmd::Stop {
            assignment_id,
            complete,
            fail,
            evidence,
            no_wait,
            at,
        } => {
            let outcome = if complete {
                "completed"
            } else if fail {
                "failed"
            } else {
                "cancelled"
            };
            let evidence_digest = match evidence.map(|p| file_digest(&p)).transpose() {
                Ok(d) => d,
                Err(e) => return at.refuse(format!("{e:#}")),
            };
            at.call(OperatorRequest::Stop {
                assignment_id,
                outcome: Some(outcome.into()),
                evidence_digest,
                wait: !no_wait,
            })
        }
        Cmd::Cancel {
            assignment_id,
            no_wait,
            at,
        } => at.call(OperatorRequest::Stop {
            assignment_id,
            outcome: Some("cancelled".into()),
            evidence_digest: None,
            wait: !no_wait,
        }),
        Cmd::Audit { since, at } => at.call(OperatorRequest::Audit { since }),
        Cmd::Tui { at } => {
            let state_dir = match (&at.coordinator, &at.coordinator_socket) {
                (None, None) => Some(
                    at.state_dir
                        .clone()
                        .unwrap_or_else(mosaic::up::default_state_dir),
                ),
                _ => at.state_dir.clone(),
            };
            mosaic::tui::run(mosaic::tui::TuiOptions {
                target: at.target()?,
                state_dir,
                tmux: mosaic::sysdeps::which("tmux").unwrap_or_else(|| PathBuf::from("tmux")),
            })?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Assign {
            lane_id,
            runtime,
            task,
            task_file,
            scope,
            holds,
            completion_policy,
            wait,
            resume,
            inactivity_policy,
            at,
        } => {
            let wait = match wait.as_deref() {
                None => false,
                Some("running") => true,
                Some(other) => return at.refuse(format!("--wait takes `running`, not {other:?}")),
            };
            let task = match (task.as_deref(), task_file) {
                (_, Some(p)) => match std::fs::read_to_string(&p) {
                    Ok(t) => t,
                    Err(e) => {
                        return at.refuse(format!("reading the task from {}: {e}", p.display()))
                    }
                },
                (Some("-"), None) => {
                    let mut t = String::new();
                    if let Err(e) = std::io::Read::read_to_string(&mut std::io::stdin(), &mut t) {
                        return at.refuse(format!("reading the task from standard input: {e}"));
                    }
                    t
                }
                (Some(t), None) => t.to_string(),
                (None, None) => {
                    return at.refuse(
                        "give the task with --task TEXT, --task - or --task-file PATH".into(),
                    )
                }
            };
            at.call(OperatorRequest::Assign {
                lane_id,
                runtime,
                task,
                scope,
                holds,
                completion_policy,
                wait,
                resume,
                // One id per invocation: a retry inside the client lands on the same
                // reservation.
                request_id: Some(format!("cli-{}", uuid::Uuid::new_v4().simple())),
                inactivity_policy,
            })
        }
        Cmd::Block {
            assignment_id,
            code,
            evidence,
            next_action,
            at,
        } => {
            let evidence_digest = match std::fs::read(&evidence) {
                Ok(b) if !b.is_empty() => mosaic::protocol::work::evidence_digest("blocker", &b),
                Ok(_) => return at.refuse(format!("evidence {} is empty", evidence.display())),
                Err(e) => {
                    return at.refuse(format!("reading evidence {}: {e}", evidence.display()))
                }
            };
            at.call(OperatorRequest::Block {
                assignment_id,
                code,
                evidence_digest,
                next_action,
            })
        }
        Cmd::Handoff {
            assignment_id,
            lane_id,
            task,
            within_ms,
            at,
        } => at.call(OperatorRequest::Handoff {
            assignment_id,
            lane_id,
            task,
            within_ms,
            request_id: Some(format!("cli-{}", uuid::Uuid::new_v4().simple())),
        }),
        Cmd::Continue {
            assignment_id,
            next_action,
            within_ms,
            at,
        } => at.call(OperatorRequest::Continue {
            assignment_id,
            next_action,
            within_ms,
            request_id: Some(format!("cli-{}", uuid::Uuid::new_v4().simple())),
        }),
        Cmd::Unblock {
            assignment_id,
            next_action,
            at,
        } => at.call(OperatorRequest::Unblock {
            assignment_id,
            next_action,
            request_id: Some(format!("cli-{}", uuid::Uuid::new_v4().simple())),
        }),
        Cmd::Policy {
            op: PolicyOp::Publish { file, at },
        } => {
            let policy = match std::fs::read_to_string(&file)
                .map_err(|e| format!("reading {}: {e}", file.display()))
                .and_then(|t| {
                    toml::from_str::<mosaic::coordinator::continuity::InactivityPolicy>(&t)
                        .map_err(|e| format!("parsing {}: {e}", file.display()))
                }) {
                Ok(p) => p,
                Err(e) => return at.refuse(e),
            };
            at.call(OperatorRequest::PolicyPublish { policy })
        }
        Cmd::Policy {
            op: PolicyOp::Show { policy_id, at },
        } => at.call(OperatorRequest::Policy { policy_id }),
        Cmd::Supervisor { config } => {
            init_logging();
            let cfg = mosaic::supervisor::config::Config::load(&config)?;
            runtime()?.block_on(mosaic::supervisor::run_daemon(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up {
            state_dir,
            lanes,
            hosts,
            demo,
            database_url,
            harness_root,
            credentials,
            registry_dir,
            harness_config,
        } => {
            init_logging();
            runtime()?.block_on(mosaic::up::run(mosaic::up::UpOptions {
                state_dir,
                lanes,
                hosts,
                demo,
                database_url,
                harness_root,
                credentials,
                registry_dir,
                harness_config,
            }))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Doctor { json, cgroup_root } => {
            let r = mosaic::doctor::run(cgroup_root.as_deref());
            if json {
                println!("{}", serde_json::to_string_pretty(&r)?);
            } else {
                mosaic::doctor::print_human(&r);
            }
            Ok(if r.can_run_supervisor {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Setup => {
            mosaic::sysdeps::ensure(&[
                mosaic::sysdeps::Dep::Tmux,
                mosaic::sysdeps::Dep::PostgresServer,
                mosaic::sysdeps::Dep::Npm,
            ])?;
            println!("mosaic setup: tmux, the PostgreSQL server binaries and npm are present");
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Lane {
            op: LaneOp::Release { lane_id, at },
        } => at.call(OperatorRequest::LaneRelease {
            lane_id,
            request_id: Some(format!("cli-{}", uuid::Uuid::new_v4().simple())),
        }),
        Cmd::Lane {
            op: LaneOp::Recreate { lane_id, at },
        } => at.call(OperatorRequest::LaneRecreate { lane_id }),
        Cmd::Lane { op } => {
            use mosaic::supervisor::lanesock::{self, LaneRequest};
            let socket = std::env::var_os("MOSAIC_LANE_SOCKET")
                .context("MOSAIC_LANE_SOCKET is not set: run this inside a Mosaic generation")?;
            let read = |p: &std::path::Path| -> anyhow::Result<String> {
                let meta = std::fs::metadata(p)
                    .with_context(|| format!("reading evidence {}", p.display()))?;
                anyhow::ensure!(
                    meta.is_file()
                        && meta.len() as usize <= mosaic::protocol::work::MAX_EVIDENCE_BYTES,
                    "evidence {} must be a regular file of at most {} bytes",
                    p.display(),
                    mosaic::protocol::work::MAX_EVIDENCE_BYTES
                );
                Ok(hex::encode(std::fs::read(p).with_context(|| {
                    format!("reading evidence {}", p.display())
                })?))
            };
            let socket = std::path::Path::new(&socket);
            let req = match op {
                LaneOp::Contract => LaneRequest::Contract,
                LaneOp::Challenge => LaneRequest::Challenge,
                LaneOp::Ack {
                    response: Some(response),
                } => LaneRequest::Ack { response },
                LaneOp::Ack { response: None } => {
                    // The challenge's phrase and the contract's key: the answer binds both.
                    let c =
                        lanesock::call(socket, &LaneRequest::Challenge).context("lane socket")?;
                    if c.ok && c.state.as_deref() == Some("active") {
                        println!("{}", serde_json::to_string(&c)?);
                        return Ok(ExitCode::SUCCESS);
                    }
                    let phrase = c
                        .challenge
                        .as_deref()
                        .and_then(mosaic::adapter::ackline::parse_challenge);
                    let k =
                        lanesock::call(socket, &LaneRequest::Contract).context("lane socket")?;
                    match (phrase, k.contract.as_ref().map(|k| k.key.as_str())) {
                        (Some(p), Some(key)) if !key.is_empty() => LaneRequest::Ack {
                            response: mosaic::adapter::ackline::ack(p, key),
                        },
                        _ => {
                            println!("{}", serde_json::to_string(if c.ok { &k } else { &c })?);
                            return Ok(ExitCode::FAILURE);
                        }
                    }
                }
                LaneOp::Hook { family, event } => {
                    use std::io::Read;
                    const MAX_HOOK_BYTES: u64 = 1 << 20;
                    let mut raw = Vec::new();
                    std::io::stdin()
                        .take(MAX_HOOK_BYTES + 1)
                        .read_to_end(&mut raw)
                        .context("reading the hook event from stdin")?;
                    anyhow::ensure!(
                        raw.len() as u64 <= MAX_HOOK_BYTES,
                        "a hook event is limited to {MAX_HOOK_BYTES} bytes"
                    );
                    let payload: serde_json::Value =
                        serde_json::from_slice(&raw).context("the hook event is not JSON")?;
                    let resp = lanesock::call(
                        socket,
                        &LaneRequest::Hook {
                            family,
                            event,
                            payload,
                        },
                    )
                    .context("lane socket")?;
                    // The harness reads the hook's stdout: only what the adapter rendered.
                    if let Some(out) = &resp.output {
                        println!("{out}");
                    }
                    if !resp.ok {
                        eprintln!("mosaic lane hook: {}", resp.error.unwrap_or_default());
                        // 1, never 2: some harnesses treat 2 as "feed stderr to the model".
                        return Ok(ExitCode::FAILURE);
                    }
                    return Ok(ExitCode::SUCCESS);
                }
                LaneOp::HandoffAck => LaneRequest::HandoffAck,
                LaneOp::Next => LaneRequest::Next,
                LaneOp::ContinuationResult {
                    continuation_id,
                    evidence,
                } => LaneRequest::ContinuationResult {
                    continuation_id,
                    evidence_hex: read(&evidence)?,
                },
                LaneOp::Progress {
                    kind,
                    evidence,
                    commit,
                    next_action,
                } => LaneRequest::Progress {
                    kind,
                    evidence_hex: match (evidence, commit) {
                        (Some(p), _) => read(&p)?,
                        (None, Some(c)) => hex::encode(c.trim()),
                        (None, None) => anyhow::bail!("give --evidence FILE or --commit ID"),
                    },
                    next_action,
                },
                LaneOp::Blocked {
                    code,
                    evidence,
                    next_action,
                } => LaneRequest::Blocked {
                    code,
                    evidence_hex: read(&evidence)?,
                    next_action,
                },
                LaneOp::Release { .. } | LaneOp::Recreate { .. } => unreachable!("matched above"),
            };
            let resp = lanesock::call(socket, &req).context("lane socket")?;
            println!("{}", serde_json::to_string(&resp)?);
            Ok(if resp.ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Harness {
            op:
                HarnessOp::Install {
                    runtimes,
                    root,
                    registry_dir,
                },
        } => {
            use mosaic::adapter::{install, Registry, RuntimeRef};
            let reg = match registry_dir {
                Some(d) => Registry::load_dir(&d)?,
                None => Registry::embedded()?,
            };
            let paths = mosaic::adapter::Paths {
                bin_dir: std::env::current_exe()?
                    .parent()
                    .context("locating this binary")?
                    .to_path_buf(),
                harness_root: std::path::absolute(
                    root.unwrap_or_else(mosaic::up::default_harness_root),
                )?,
            };
            let runtimes = if runtimes.is_empty() {
                install::installable(&reg)
            } else {
                runtimes
            };
            for rt in runtimes {
                let r = RuntimeRef::parse(&rt)?;
                install::install(&reg, &r, &paths, &|line| println!("mosaic harness: {line}"))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Pki { op } => {
            use mosaic::pki::{self, Kind};
            let (issued, what) = match op {
                PkiOp::Init { dir, force } => {
                    let ca = pki::init(&dir, force)?;
                    println!("CA certificate {}", ca.display());
                    return Ok(ExitCode::SUCCESS);
                }
                PkiOp::IssueCoordinator {
                    dir,
                    name,
                    days,
                    force,
                } => (
                    pki::issue(&dir, Kind::Coordinator, &name, days, force)?,
                    "coordinator",
                ),
                PkiOp::IssueHost {
                    dir,
                    host_id,
                    days,
                    force,
                } => (pki::issue(&dir, Kind::Host, &host_id, days, force)?, "host"),
                PkiOp::IssueOperator {
                    dir,
                    name,
                    days,
                    force,
                } => (
                    pki::issue(&dir, Kind::Operator, &name, days, force)?,
                    "operator",
                ),
            };
            println!(
                "{what} {} certificate {} key {}",
                issued.principal,
                issued.cert.display(),
                issued.key.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Host {
            socket,
            config,
            state_dir,
            json,
            op,
        } => {
            let socket = match (socket, config, state_dir) {
                (Some(s), _, _) => s,
                (None, Some(c), _) => {
                    mosaic::supervisor::config::Config::load(&c)?.control_socket()
                }
                (None, None, sd) => {
                    let sd = sd.unwrap_or_else(mosaic::up::default_state_dir);
                    mosaic::up::config_for(&sd, 0)?.control_socket()
                }
            };
            let req = match op {
                HostOp::Status => Request::Status,
                HostOp::LaneCreate { lane } => Request::LaneCreate { lane },
                HostOp::LaneDestroy { lane } => Request::LaneDestroy { lane },
                HostOp::Start {
                    lane,
                    runtime,
                    directives,
                } => Request::Start {
                    lane,
                    runtime,
                    directives,
                },
                HostOp::Stop { lane } => Request::Stop { lane },
                HostOp::Receipts { lane, all } => Request::Receipts {
                    lane,
                    include_acked: all,
                },
                HostOp::Ack { key } => Request::Ack { key },
            };
            let v = control::call(&socket, &req)?;
            if json {
                println!("{}", serde_json::to_string(&v)?);
            } else {
                println!("{}", serde_json::to_string_pretty(&v)?);
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
