//! The `mosaic` binary: parses arguments and calls the library. Nothing else lives here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use mosaic::supervisor::control::{self, Request};

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
        /// Show a generation start, a SIGKILL, its receipt and the recovery, then exit.
        #[arg(long)]
        demo: bool,
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
    /// First process of a generation (started by the supervisor inside a tmux pane).
    #[command(hide = true)]
    Shim {
        #[arg(long)]
        cgroup: PathBuf,
        #[arg(long)]
        socket: PathBuf,
        #[arg(long)]
        nonce_file: PathBuf,
        #[arg(long)]
        exit_record: PathBuf,
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

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("MOSAIC_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

fn main() -> ExitCode {
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
        Cmd::Shim {
            cgroup,
            socket,
            nonce_file,
            exit_record,
        } => {
            let args = mosaic::shim::ShimArgs {
                cgroup,
                socket,
                nonce_file,
                exit_record,
            };
            let e = match mosaic::shim::run(args) {
                Err(e) => e,
                Ok(never) => match never {},
            };
            eprintln!("mosaic shim: {e}");
            Ok(ExitCode::from(126))
        }
        Cmd::Supervisor { config } => {
            init_logging();
            let cfg = mosaic::supervisor::config::Config::load(&config)?;
            runtime()?.block_on(mosaic::supervisor::run_daemon(cfg))?;
            Ok(ExitCode::SUCCESS)
        }
        Cmd::Up {
            state_dir,
            lanes,
            demo,
        } => {
            init_logging();
            runtime()?.block_on(mosaic::up::run(mosaic::up::UpOptions {
                state_dir,
                lanes,
                demo,
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
            ])?;
            println!("mosaic setup: tmux and the PostgreSQL server binaries are present");
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
