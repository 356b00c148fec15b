//! The deployment commands: `mosaic init`, `mosaic enroll`, `mosaic keys`, `mosaic trust`,
//! `mosaic db init` (README: Production).

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Subcommand;

use crate::at::CoordinatorAt;
use mosaic::coordinator::service::OperatorRequest;
use mosaic::enroll;

#[derive(Subcommand)]
pub(crate) enum InitOp {
    /// Make a coordinator's directory: the private CA (kept if DIR/pki has one), its
    /// certificate for the names hosts dial, its signing keys and secret (0600), a trust
    /// registry with its keys, and its config (DIR/coordinator.toml). With --standby-of:
    /// a standby of the coordinator in that directory (same name, secret and keys; its own
    /// certificate).
    Coordinator {
        #[arg(long)]
        dir: PathBuf,
        /// Its name; its principal is coordinator:NAME.
        #[arg(long, default_value = "main", conflicts_with = "standby_of")]
        name: String,
        #[arg(long, default_value = "mosaic.local", conflicts_with = "standby_of")]
        trust_domain: String,
        /// A DNS name hosts and operators reach it by (repeatable; its certificate names
        /// each, besides localhost and 127.0.0.1).
        #[arg(long = "dns")]
        dns: Vec<String>,
        /// An IP address they reach it at (repeatable).
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        /// Where it serves host sessions.
        #[arg(long, default_value = "0.0.0.0:7443")]
        listen: String,
        /// The PostgreSQL it runs on (`mosaic db init` makes the role and database).
        #[arg(long, required_unless_present = "standby_of")]
        database_url: Option<String>,
        #[arg(long, default_value = "/run/mosaic-coordinator/operator.sock")]
        operator_socket: PathBuf,
        /// A TCP address for remote operators (mutual TLS).
        #[arg(long)]
        operator_listen: Option<String>,
        /// The address operators dial for it (tls://HOST:PORT), named by a standby's
        /// not-leader answer.
        #[arg(long)]
        advertise_operator: Option<String>,
        #[arg(long, default_value = "/var/lib/mosaic-coordinator")]
        state_dir: PathBuf,
        /// The directory of the coordinator this one stands by for.
        #[arg(long)]
        standby_of: Option<PathBuf>,
        #[arg(long, default_value_t = enroll::DEFAULT_DAYS)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum EnrollOp {
    /// Enrol a host (run in the coordinator's directory, where the CA lives): its
    /// certificate and keys, its keys in the trust registry (the running coordinator
    /// reloads it), and a bundle with its supervisor config to copy to the host.
    Host {
        host_id: String,
        /// The coordinator's directory (`mosaic init coordinator --dir`).
        #[arg(long)]
        dir: PathBuf,
        /// The coordinators' host-session addresses, the leader's first (repeatable or
        /// comma-separated; the rest become fallback_addresses).
        #[arg(long, value_delimiter = ',', required = true)]
        coordinator: Vec<String>,
        /// The name the coordinator's certificate is checked against (default: the host
        /// part of the first --coordinator).
        #[arg(long)]
        server_name: Option<String>,
        /// Where to write the bundle (default: DIR/hosts/HOST_ID).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where the bundle will be on the host; its config names files there.
        #[arg(long, default_value = "/etc/mosaic")]
        install_dir: PathBuf,
        /// Lanes (repeatable or comma-separated).
        #[arg(long, value_delimiter = ',', default_value = "lane-1,lane-2")]
        lanes: Vec<String>,
        #[arg(long, default_value = "/var/lib/mosaic")]
        state_dir: PathBuf,
        #[arg(long, default_value = "/run/mosaic")]
        runtime_dir: PathBuf,
        /// The delegated cgroup root, for a supervisor run outside systemd (under systemd
        /// with Delegate=yes, leave it out).
        #[arg(long)]
        cgroup_root: Option<PathBuf>,
        #[arg(long, default_value_t = enroll::DEFAULT_DAYS)]
        days: i64,
        /// Replace the host's keys and certificate (its old keys stop verifying).
        #[arg(long)]
        force: bool,
    },
    /// Enrol an operator: a client certificate for the remote operator listener.
    Operator {
        name: String,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        out: Option<PathBuf>,
        #[arg(long, default_value_t = enroll::DEFAULT_DAYS)]
        days: i64,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum KeysOp {
    /// Print the public half of an Ed25519 seed file (what the trust registry holds).
    Show { file: PathBuf },
    /// Make a new seed file (0600) and print its public half.
    New {
        file: PathBuf,
        #[arg(long)]
        force: bool,
    },
}

#[derive(Subcommand)]
pub(crate) enum TrustOp {
    /// Revoke a key (host:ID/session) or every key of a principal (host:ID, operator:NAME)
    /// at once and for good: its live session closes and everything it sends later is
    /// refused and audited, on every coordinator, across restarts.
    Revoke {
        subject: String,
        #[command(flatten)]
        at: CoordinatorAt,
    },
    /// The trust registry the coordinator uses now: every key, revoked or not.
    List {
        #[command(flatten)]
        at: CoordinatorAt,
    },
}

#[derive(Subcommand)]
pub(crate) enum DbOp {
    /// Create the coordinator's role and database (idempotent), connecting with an
    /// administrator's URL; prints the database_url for `mosaic init coordinator`.
    Init {
        /// An administrator's connection (e.g. `host=/run/postgresql user=postgres`).
        #[arg(long)]
        admin_url: String,
        #[arg(long, default_value = "mosaic")]
        role: String,
        #[arg(long, default_value = "mosaic")]
        database: String,
        /// A file holding the role's password (for a coordinator on another machine);
        /// without it the role logs in by local (peer) authentication only.
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
}

fn print(v: &serde_json::Value) -> anyhow::Result<ExitCode> {
    crate::out::line(format_args!("{}", serde_json::to_string_pretty(v)?))?;
    Ok(ExitCode::SUCCESS)
}

pub(crate) fn init(op: InitOp) -> anyhow::Result<ExitCode> {
    let InitOp::Coordinator {
        dir,
        name,
        trust_domain,
        dns,
        ips,
        listen,
        database_url,
        operator_socket,
        operator_listen,
        advertise_operator,
        state_dir,
        standby_of,
        days,
        force,
    } = op;
    let names = mosaic::pki::ServerNames { dns, ips };
    let v = match standby_of {
        Some(leader_dir) => enroll::init_standby(&enroll::InitStandby {
            dir,
            leader_dir,
            names,
            listen,
            operator_socket,
            operator_listen,
            advertise_operator,
            state_dir,
            days,
            force,
        })?,
        None => enroll::init_coordinator(&enroll::InitCoordinator {
            dir,
            name,
            trust_domain,
            names,
            listen,
            database_url: database_url.unwrap_or_default(),
            operator_socket,
            operator_listen,
            advertise_operator,
            state_dir,
            days,
            force,
        })?,
    };
    print(&v)
}

pub(crate) fn enroll(op: EnrollOp) -> anyhow::Result<ExitCode> {
    let v = match op {
        EnrollOp::Host {
            host_id,
            dir,
            coordinator,
            server_name,
            out,
            install_dir,
            lanes,
            state_dir,
            runtime_dir,
            cgroup_root,
            days,
            force,
        } => enroll::enroll_host(&enroll::EnrollHost {
            dir,
            host_id,
            addresses: coordinator,
            server_name,
            out,
            install_dir,
            lanes,
            state_dir,
            runtime_dir,
            cgroup_root,
            days,
            force,
        })?,
        EnrollOp::Operator {
            name,
            dir,
            out,
            days,
            force,
        } => enroll::enroll_operator(&dir, &name, out.as_deref(), days, force)?,
    };
    print(&v)
}

pub(crate) fn keys(op: KeysOp) -> anyhow::Result<ExitCode> {
    let (file, public) = match op {
        KeysOp::Show { file } => {
            let k = enroll::public_key(&file)?;
            (file, k)
        }
        KeysOp::New { file, force } => {
            let k = enroll::new_seed(&file, force)?;
            (file, k)
        }
    };
    print(&serde_json::json!({
        "file": file,
        "suite": "ed25519-v1",
        "public_key": hex::encode(public.to_bytes()),
    }))
}

pub(crate) fn trust(op: TrustOp) -> anyhow::Result<ExitCode> {
    match op {
        TrustOp::Revoke { subject, at } => at.call(OperatorRequest::TrustRevoke {
            subject,
            request_id: None,
        }),
        TrustOp::List { at } => at.call(OperatorRequest::Trust),
    }
}

pub(crate) fn db(op: DbOp) -> anyhow::Result<ExitCode> {
    let DbOp::Init {
        admin_url,
        role,
        database,
        password_file,
    } = op;
    let password = match password_file {
        Some(p) => Some(
            std::fs::read_to_string(&p)
                .map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let v = rt.block_on(mosaic::coordinator::store::init_database(
        &admin_url,
        &role,
        &database,
        password.as_deref(),
    ))?;
    print(&v)
}
