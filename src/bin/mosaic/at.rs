//! Where the coordinator is, for every operator command (`--state-dir`, `--coordinator-socket`,
//! `--config`, `$MOSAIC_COORDINATOR_SOCKET`, or remote `--coordinator` listeners), and how an
//! answer is printed.

use std::path::PathBuf;
use std::process::ExitCode;

use mosaic::coordinator::service::OperatorRequest;

/// Where the coordinator is: its local socket (from a state dir, or explicit), or a
/// remote operator listener reached with an operator certificate.
#[derive(clap::Args)]
pub(crate) struct CoordinatorAt {
    /// The state dir of `mosaic up` (default: $MOSAIC_STATE_DIR or the user state dir).
    #[arg(long)]
    pub(crate) state_dir: Option<PathBuf>,
    /// The coordinator's operator socket (default: $MOSAIC_COORDINATOR_SOCKET, else the
    /// one --config names, else the state dir's).
    #[arg(long, conflicts_with = "state_dir")]
    pub(crate) coordinator_socket: Option<PathBuf>,
    /// The coordinator's config file: its operator_socket is used.
    #[arg(long = "config", conflicts_with_all = ["state_dir", "coordinator_socket"])]
    pub(crate) coordinator_config: Option<PathBuf>,
    /// Remote coordinators' operator listeners (HOST:PORT or tls://HOST:PORT; repeat it or
    /// separate them with commas: a standby's `not-leader` answer is followed to the
    /// leader, an unreachable one skipped); needs --ca, --cert, --key.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["state_dir", "coordinator_socket", "coordinator_config"], requires_all = ["ca", "cert", "key"])]
    pub(crate) coordinator: Vec<String>,
    /// DNS name in the coordinator's certificate (default: the host part of --coordinator).
    #[arg(long)]
    pub(crate) server_name: Option<String>,
    /// The CA certificate, and this operator's certificate and key (`mosaic pki issue-operator`).
    #[arg(long)]
    pub(crate) ca: Option<PathBuf>,
    #[arg(long)]
    pub(crate) cert: Option<PathBuf>,
    #[arg(long)]
    pub(crate) key: Option<PathBuf>,
    /// Print compact JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// The idempotency key of a request that changes anything (default: a fresh `cli-…`).
    /// Repeating a request with its key returns its outcome and never carries it out twice;
    /// use the key an `unknown` answer named.
    #[arg(long)]
    pub(crate) request_id: Option<String>,
}

impl CoordinatorAt {
    /// Where to send requests, in order: the remote listeners given, or one local socket
    /// (explicit, from the environment, from the coordinator's config, or the state dir's).
    pub(crate) fn targets(
        &self,
    ) -> anyhow::Result<Vec<mosaic::coordinator::service::OperatorTarget>> {
        use mosaic::coordinator::service::OperatorTarget;
        if !self.coordinator.is_empty() {
            return self
                .coordinator
                .iter()
                .map(|at| {
                    let (addr, host) = mosaic::coordinator::service::parse_coordinator_addr(at)
                        .map_err(|e| anyhow::anyhow!(e))?;
                    Ok(OperatorTarget::Remote {
                        addr,
                        server_name: self.server_name.clone().unwrap_or(host),
                        tls: mosaic::protocol::transport::TlsIdentity {
                            ca: self.ca.clone().unwrap_or_default(),
                            cert: self.cert.clone().unwrap_or_default(),
                            key: self.key.clone().unwrap_or_default(),
                        },
                    })
                })
                .collect();
        }
        let env = std::env::var_os("MOSAIC_COORDINATOR_SOCKET")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from);
        let socket = if let Some(s) = &self.coordinator_socket {
            s.clone()
        } else if let Some(c) = &self.coordinator_config {
            let text =
                std::fs::read_to_string(c).map_err(|e| anyhow::anyhow!("{}: {e}", c.display()))?;
            let cfg: mosaic::coordinator::service::CoordinatorConfig =
                toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", c.display()))?;
            cfg.operator_socket
        } else if let (Some(s), None) = (env, &self.state_dir) {
            s
        } else {
            mosaic::up::coordinator_socket(
                &self
                    .state_dir
                    .clone()
                    .unwrap_or_else(mosaic::up::default_state_dir),
            )
        };
        Ok(vec![OperatorTarget::Socket(socket)])
    }

    /// The first target (for a request that goes to one coordinator, like a watch).
    pub(crate) fn target(&self) -> anyhow::Result<mosaic::coordinator::service::OperatorTarget> {
        self.targets()?
            .into_iter()
            .next()
            .ok_or_else(|| anyhow::anyhow!("no coordinator given"))
    }

    /// Sends the request and prints the result as JSON; a refusal prints
    /// `{"ok": false, "error": {"category": …, "message": …}}` and exits 1.
    pub(crate) fn call(&self, mut req: OperatorRequest) -> anyhow::Result<ExitCode> {
        if let Some(id) = &self.request_id {
            if req.mutation().is_none() {
                return self.refuse(
                    "--request-id is for requests that change something; this one only reads"
                        .into(),
                );
            }
            req.set_request_id(id.clone());
        }
        let result = mosaic::coordinator::service::operator_request_any(&self.targets()?, &req);
        self.print(result)
    }

    /// Refuses a request before it is sent (its input could not be read), the same way a
    /// coordinator refusal is printed.
    pub(crate) fn refuse(&self, message: String) -> anyhow::Result<ExitCode> {
        self.print(Err(mosaic::coordinator::service::OpError::new(
            mosaic::coordinator::Category::BadInput,
            message,
        )))
    }

    pub(crate) fn print(
        &self,
        result: Result<serde_json::Value, mosaic::coordinator::service::OpError>,
    ) -> anyhow::Result<ExitCode> {
        let out = match result {
            Ok(v) => (v, ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("mosaic: {e}");
                // 3: the request may or may not have taken effect (its key is in the answer).
                let code = if e.state.is_some() {
                    ExitCode::from(3)
                } else {
                    ExitCode::FAILURE
                };
                (serde_json::json!({ "ok": false, "error": e }), code)
            }
        };
        if self.json {
            crate::out::line(format_args!("{}", serde_json::to_string(&out.0)?))?;
        } else {
            crate::out::line(format_args!("{}", serde_json::to_string_pretty(&out.0)?))?;
        }
        Ok(out.1)
    }
}
