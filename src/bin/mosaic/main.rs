//! The `mosaic` binary: parses arguments and calls the library. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;

mod args;
mod at;
mod fleet;
mod lease_args;
mod out;
mod work_args;

use args::*;

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
            // The typed error's category, when the failure has one, so a wrapper script can
            // tell a bad configuration from an unavailable database.
            let category = e.chain().find_map(|c| {
                c.downcast_ref::<mosaic::coordinator::service::ServiceError>()
                    .map(|s| s.category())
                    .or_else(|| {
                        c.downcast_ref::<mosaic::coordinator::AuthorityError>()
                            .map(|a| a.operator_category())
                    })
            });
            match category {
                Some(c) => eprintln!("mosaic: {e:#} [{}]", c.as_str()),
                None => eprintln!("mosaic: {e:#}"),
            }
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
        Cmd::Notifications { at } => at.call(OperatorRequest::Notifications),
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
                request_id: None,
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
            request_id: None,
        }),
        Cmd::Audit { since, at } => at.call(OperatorRequest::Audit { since }),
        Cmd::Tui { at } => {
            let state_dir = match (
                at.coordinator.is_empty(),
                &at.coordinator_socket,
                &at.coordinator_config,
            ) {
                (true, None, None) => Some(
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
            place: place_args,
            runtime,
            task,
            task_file,
            scope,
            holds,
            completion_policy,
            wait,
            resume,
            replace_task,
            inactivity_policy,
            repo,
            base,
            from_checkpoint,
            grant_within,
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
                // The coordinator resumes the assignment's own task.
                (None, None) if resume.is_some() => String::new(),
                (None, None) => {
                    return at.refuse(
                        "give the task with --task TEXT, --task - or --task-file PATH".into(),
                    )
                }
            };
            let place = match place_args.ask(lane_id.is_some()) {
                Ok(p) => p,
                Err(e) => return at.refuse(e),
            };
            at.call(OperatorRequest::Assign {
                lane_id: lane_id.unwrap_or_default(),
                place: place.map(Box::new),
                runtime,
                task,
                scope,
                holds,
                completion_policy,
                wait,
                resume,
                // The client gives it a key (--request-id, or a fresh one).
                request_id: None,
                inactivity_policy,
                repo,
                base,
                replace_task,
                from_checkpoint,
                grant_within_s: grant_within,
            })
        }
        Cmd::Repo {
            op:
                RepoOp::Add {
                    name,
                    path,
                    url,
                    host,
                    copy,
                    setup,
                    setup_timeout,
                    at,
                },
        } => at.call(OperatorRequest::RepoAdd {
            name,
            path,
            url,
            host_id: host,
            copy,
            setup,
            setup_timeout_s: setup_timeout,
        }),
        Cmd::Repo {
            op: RepoOp::List { at },
        } => at.call(OperatorRequest::Repos),
        Cmd::Workspace { op } => work_args::workspace(op),
        Cmd::Checkpoint {
            op: CheckpointOp::List { assignment_id, at },
        } => at.call(OperatorRequest::Checkpoints {
            assignment_id,
            checkpoint_digest: None,
        }),
        Cmd::Checkpoint {
            op:
                CheckpointOp::Show {
                    checkpoint_digest,
                    diff,
                    at,
                },
        } => at.call(OperatorRequest::CheckpointShow {
            checkpoint_digest,
            diff,
        }),
        Cmd::Checkpoint {
            op:
                CheckpointOp::Restore {
                    checkpoint_digest,
                    into,
                    at,
                },
        } => at.print(mosaic::checkpoint_restore::checkpoint_restore(
            &at.targets()?,
            &checkpoint_digest,
            &into,
        )),
        Cmd::Checkpoint {
            op: CheckpointOp::Grants { assignment_id, at },
        } => at.call(OperatorRequest::CheckpointGrants { assignment_id }),
        Cmd::Checkpoint {
            op: CheckpointOp::Gc { dry_run, at },
        } => at.call(OperatorRequest::CheckpointGc {
            dry_run,
            request_id: None,
        }),
        Cmd::Checkpoint {
            op:
                CheckpointOp::Delete {
                    checkpoint_digest,
                    at,
                },
        } => at.call(OperatorRequest::CheckpointDelete {
            checkpoint_digest,
            request_id: None,
        }),
        Cmd::Checkpoint {
            op: CheckpointOp::Deletions { assignment_id, at },
        } => at.call(OperatorRequest::CheckpointDeletions { assignment_id }),
        Cmd::Checkpoint {
            op: CheckpointOp::Reads { assignment_id, at },
        } => at.call(OperatorRequest::CheckpointReads { assignment_id }),
        Cmd::Checkpoint {
            op: CheckpointOp::Releases { assignment_id, at },
        } => at.call(OperatorRequest::WorkspaceReleases { assignment_id }),
        Cmd::Checkpoint {
            op: CheckpointOp::Artifacts { assignment_id, at },
        } => at.call(OperatorRequest::Artifacts { assignment_id }),
        Cmd::Checkpoint {
            op:
                CheckpointOp::Artifact {
                    artifact_digest,
                    identity,
                    out,
                    at,
                },
        } => at.print(mosaic::artifact_recovery::recover(
            &at.targets()?,
            &artifact_digest,
            &identity,
            &out,
        )),
        Cmd::Checkpoint {
            op: CheckpointOp::RevokeGrant { grant_id, at },
        } => at.call(OperatorRequest::CheckpointGrantRevoke {
            grant_id,
            // The client gives it a key (--request-id, or a fresh one).
            request_id: None,
        }),
        Cmd::Block {
            assignment_id,
            code,
            evidence,
            next_action,
            at,
        } => {
            let evidence_digest = match work_args::evidence_digest("blocker", &evidence) {
                Ok(d) => d,
                Err(m) => return at.refuse(m),
            };
            at.call(OperatorRequest::Block {
                assignment_id,
                code,
                evidence_digest,
                next_action,
                request_id: None,
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
            request_id: None,
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
            request_id: None,
        }),
        Cmd::Unblock {
            assignment_id,
            next_action,
            at,
        } => at.call(OperatorRequest::Unblock {
            assignment_id,
            next_action,
            request_id: None,
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
            at.call(OperatorRequest::PolicyPublish {
                policy,
                request_id: None,
            })
        }
        Cmd::Policy {
            op: PolicyOp::Show { policy_id, at },
        } => at.call(OperatorRequest::Policy { policy_id }),
        Cmd::Roster {
            op: RosterOp::Publish { file, at },
        } => {
            let roster = match std::fs::read_to_string(&file)
                .map_err(|e| format!("reading {}: {e}", file.display()))
                .and_then(|t| {
                    toml::from_str::<mosaic::coordinator::placement::Roster>(&t)
                        .map_err(|e| format!("parsing {}: {e}", file.display()))
                }) {
                Ok(r) => r,
                Err(e) => return at.refuse(e),
            };
            at.call(OperatorRequest::RosterPublish {
                roster,
                request_id: None,
            })
        }
        Cmd::Roster {
            op: RosterOp::Show { reservation, at },
        } => at.call(OperatorRequest::Roster {
            reservation_id: reservation,
        }),
        Cmd::Supervisor { config } => {
            init_logging();
            let cfg = mosaic::supervisor::config::Config::load(&config)?;
            runtime()?.block_on(mosaic::supervisor::run_daemon(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up(a) => {
            init_logging();
            runtime()?.block_on(mosaic::up::run(a.into_options()))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Init { op } => fleet::init(op),
        Cmd::Enroll { op } => fleet::enroll(op),
        Cmd::Keys { op } => fleet::keys(op),
        Cmd::Trust { op } => fleet::trust(op),
        Cmd::Db { op } => fleet::db(op),
        Cmd::Doctor {
            coordinator_config: Some(path),
            json,
            ..
        } => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let r = rt.block_on(mosaic::doctor::coordinator(&path));
            if json {
                out::line(format_args!("{}", serde_json::to_string_pretty(&r)?))?;
            } else {
                for c in &r.checks {
                    out::line(format_args!(
                        "{} {:<22} {}",
                        if c.ok { "ok  " } else { "FAIL" },
                        c.name,
                        c.detail
                    ))?;
                }
            }
            Ok(if r.checks.iter().all(|c| c.ok) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Cmd::Doctor {
            json, cgroup_root, ..
        } => {
            let r = mosaic::doctor::run(cgroup_root.as_deref());
            if json {
                out::line(format_args!("{}", serde_json::to_string_pretty(&r)?))?;
            } else {
                out::line(format_args!("{}", mosaic::doctor::render_human(&r)))?;
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
                mosaic::sysdeps::Dep::Git,
                mosaic::sysdeps::Dep::PostgresServer,
                mosaic::sysdeps::Dep::Npm,
            ])?;
            out::line(format_args!(
                "mosaic setup: tmux, git, the PostgreSQL server binaries and npm are present"
            ))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Lane {
            op: LaneOp::Release { lane_id, at },
        } => at.call(OperatorRequest::LaneRelease {
            lane_id,
            request_id: None,
        }),
        Cmd::Lane {
            op: LaneOp::Recreate { lane_id, at },
        } => at.call(OperatorRequest::LaneRecreate {
            lane_id,
            request_id: None,
        }),
        Cmd::Lane {
            op: LaneOp::Elastic(op),
        } => lease_args::run(op),
        Cmd::Retarget(r) => lease_args::retarget(r),
        Cmd::Request {
            op: RequestOp::Show { id, at },
        } => at.call(OperatorRequest::Request { request_id: id }),
        Cmd::Effects {
            assignment_id,
            limit,
            at,
        } => at.call(OperatorRequest::Effects {
            assignment_id,
            limit,
        }),
        Cmd::Effect {
            op:
                EffectOp::Resolve {
                    r:
                        work_args::Resolution {
                            effect_id,
                            applied,
                            evidence,
                            ..
                        },
                    at,
                },
        } => {
            let evidence_digest =
                match work_args::evidence_digest("effect-reconciliation", &evidence) {
                    Ok(d) => d,
                    Err(m) => return at.refuse(m),
                };
            at.call(OperatorRequest::EffectResolve {
                effect_id,
                applied,
                evidence_digest,
                request_id: None,
            })
        }
        Cmd::Lane { op } => {
            use mosaic::supervisor::laneclient::{self, LaneCall};
            let call = match op {
                LaneOp::Contract => LaneCall::Contract,
                LaneOp::Challenge => LaneCall::Challenge,
                LaneOp::Ack { response } => LaneCall::Ack { response },
                LaneOp::Hook { family, event } => LaneCall::Hook { family, event },
                LaneOp::HandoffAck => LaneCall::HandoffAck,
                LaneOp::Next => LaneCall::Next,
                LaneOp::ContinuationResult {
                    continuation_id,
                    evidence,
                } => LaneCall::ContinuationResult {
                    continuation_id,
                    evidence,
                },
                LaneOp::Progress {
                    kind,
                    evidence,
                    commit,
                    next_action,
                } => LaneCall::Progress {
                    kind,
                    evidence,
                    commit,
                    next_action,
                },
                LaneOp::Blocked {
                    code,
                    evidence,
                    next_action,
                } => LaneCall::Blocked {
                    code,
                    evidence,
                    next_action,
                },
                LaneOp::Checkpoint => LaneCall::Checkpoint,
                LaneOp::Push {
                    repo,
                    reference,
                    from,
                    key,
                } => LaneCall::Push {
                    repo,
                    reference,
                    from,
                    key,
                },
                LaneOp::Release { .. } | LaneOp::Recreate { .. } | LaneOp::Elastic(_) => {
                    unreachable!("matched above")
                }
            };
            let socket = laneclient::socket_from_env()?;
            let out = laneclient::run(&socket, call, std::io::stdin().lock())?;
            if let Some(text) = &out.stdout {
                out::line(format_args!("{text}"))?;
            }
            if let Some(text) = &out.stderr {
                eprintln!("{text}");
            }
            // 1, never 2, on failure: some harnesses treat 2 as "feed stderr to the model".
            Ok(if out.success {
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
                // A progress line that cannot be written is not the install's failure: its
                // outcome is the command's result.
                install::install(&reg, &r, &paths, &|line| {
                    let _ = out::line(format_args!("mosaic harness: {line}"));
                })?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Pki { op } => {
            use mosaic::pki::{self, Kind};
            let (issued, what) = match op {
                PkiOp::RecoveryKey { out } => {
                    if out.symlink_metadata().is_ok() {
                        anyhow::bail!(
                            "{} exists: a recovery identity is never overwritten",
                            out.display()
                        );
                    }
                    let recipient = mosaic::artifact_recovery::recovery_key(&out, true)
                        .map_err(anyhow::Error::msg)?;
                    out::line(format_args!(
                        "recovery identity {} (keep it secret); add to the coordinator's recovery_recipients: \"PRINCIPAL={recipient}\"",
                        out.display()
                    ))?;
                    return Ok(ExitCode::SUCCESS);
                }
                PkiOp::Init { dir, force } => {
                    let ca = pki::init(&dir, force)?;
                    out::line(format_args!("CA certificate {}", ca.display()))?;
                    return Ok(ExitCode::SUCCESS);
                }
                PkiOp::IssueCoordinator {
                    dir,
                    name,
                    dns,
                    ips,
                    days,
                    force,
                } => {
                    if !(1..=3650).contains(&days) {
                        anyhow::bail!("validity must be between 1 and 3650 days");
                    }
                    let now = time::OffsetDateTime::now_utc();
                    (
                        pki::issue_to(
                            &dir,
                            &dir,
                            Kind::Coordinator,
                            &name,
                            &pki::ServerNames { dns, ips },
                            (now - pki::BACKDATE, now + time::Duration::days(days)),
                            force,
                        )?,
                        "coordinator",
                    )
                }
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
            out::line(format_args!(
                "{what} {} certificate {} key {}",
                issued.principal,
                issued.cert.display(),
                issued.key.display()
            ))?;
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
                HostOp::Decommission { force } => Request::Decommission { force },
            };
            let v = control::call(&socket, &req)?;
            if json {
                out::line(format_args!("{}", serde_json::to_string(&v)?))?;
            } else {
                out::line(format_args!("{}", serde_json::to_string_pretty(&v)?))?;
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}
