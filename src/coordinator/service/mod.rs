//! `mosaic coordinator`: the authority core served to hosts over the authenticated
//! WebSocket, and to operators over a local socket (or a mutual-TLS listener).
//!
//! Layout, one concern per file:
//! - `config` — the daemon's configuration and errors;
//! - `leadership` — acquire, renew on a dedicated connection, heal a lapse;
//! - `hosts` — host sessions: who is connected, ownership of every host message, the
//!   reconciliation a hello starts;
//! - `driver` — drives each chain on from its rows: the next transition, the next message;
//! - `watchdog` — what time alone decides: expiry, lease renewal and expiry, chains left
//!   mid-way by a dead process;
//! - `operator` — the operator API (requests, typed errors, sockets, client).
//!
//! **Owns:** nothing durable. Every chain is rows; this process holds connections, signing
//! keys, the sessions it serves and caches. Kill it at any instant and the next leader
//! drives every chain on from the database.
//!
//! **Never:** mutates anything except through `Store` transitions; trusts a host message
//! that failed verification, whose issuer is not the session's TLS peer (the transport
//! refuses those), or that concerns a lane of another host (`hosts` refuses those).

pub mod config;
mod continuations;
mod driver;
mod elastic;
mod holds;

mod hosts;
pub mod leadership;
pub mod notifier;
pub mod operator;
mod retarget;
pub mod trust;
pub(crate) mod waiting;
mod watchdog;

use std::sync::Arc;

use tokio::sync::watch;

pub use config::{read_seed, CoordinatorConfig, ServiceError, Timing};
pub use operator::{
    bind_operators, operator_call, operator_request, operator_request_any, parse_coordinator_addr,
    serve_operators, serve_remote_operators, OpError, OperatorRequest, OperatorTarget,
    RequestState,
};

use super::error::{AuthorityError, Category};
use super::leader::{Candidate, Leader};
use super::secret::CoordinatorSecret;
use super::store::Store;
use crate::protocol::schema::Purpose;
use crate::protocol::transport::{self, ServerParams, TlsIdentity};
use crate::protocol::{Signer, TrustRegistry};

pub struct Service {
    pub store: Store,
    timing: Timing,
    /// Whom harness artifacts are encrypted to (`recovery_recipients`): sent with every
    /// stage.
    recipients: Vec<crate::protocol::artifact::Recipient>,
    leadership: leadership::Leadership,
    /// The registry every host envelope is verified with: the file, reloaded when it
    /// changes, with the database's revocations applied (`trust`).
    registry: crate::protocol::LiveRegistry,
    trust: trust::TrustSource,
    principal: String,
    domain: String,
    session: Arc<Signer>,
    ordinary: Arc<Signer>,
    /// The recovery key (spec §7.3), when configured: without it no retarget is offered.
    recovery: Option<Arc<Signer>>,
    hosts: hosts::Sessions,
    /// Bumped after every transition this process makes: waiters re-read the database.
    changed: watch::Sender<u64>,
    /// Operators waiting on rows, answered by one read per change (`waiting`).
    waiting: waiting::Hub,
    driver: driver::DriverState,
    pub(crate) metrics: crate::coordinator::metrics::CoordinatorMetrics,
    /// Stops the leadership loop and the watchdog sweep ([`Service::shut_down`]).
    shutdown: crate::util::shutdown::Shutdown,
    /// The background work `shut_down` waits for: the watchdog sweep's task and the leadership
    /// loop's thread.
    background: std::sync::Mutex<Background>,
}

#[derive(Default)]
struct Background {
    watchdog: Option<tokio::task::JoinHandle<()>>,
    leadership: Option<std::thread::JoinHandle<()>>,
}

impl Service {
    /// Connects, migrates, and starts the leadership loop and the watchdog. Returns at
    /// once: the service stands by until it leads (`wait_leading` waits for that).
    pub async fn start(cfg: &CoordinatorConfig) -> Result<Arc<Self>, ServiceError> {
        let sinks = notifier::Sinks::configured(
            cfg.notify_command.as_deref(),
            cfg.notify_webhook.as_deref(),
        )
        .map_err(|p| ServiceError::Invalid { problems: vec![p] })?;
        let secret_hex =
            std::fs::read_to_string(&cfg.secret_file).map_err(|source| ServiceError::ReadFile {
                path: cfg.secret_file.clone(),
                source,
            })?;
        let secret =
            CoordinatorSecret::from_hex(&secret_hex).map_err(|e| ServiceError::BadFile {
                path: cfg.secret_file.clone(),
                detail: e.to_string(),
            })?;
        let store =
            Store::connect_with(&cfg.database_url, cfg.allow_insecure_database, secret).await?;
        store.migrate().await?;
        let retention =
            crate::coordinator::retention::RetentionPolicy::configured(cfg.checkpoint_retention_s)
                .map_err(|p| ServiceError::Invalid { problems: vec![p] })?;
        store.register_retention(&retention).await?;
        let artifact_retention = crate::coordinator::retention::RetentionPolicy::configured_for(
            crate::coordinator::retention::Classification::Sensitive,
            cfg.artifact_retention_s,
        )
        .map_err(|p| ServiceError::Invalid { problems: vec![p] })?;
        store.register_retention(&artifact_retention).await?;
        let recipients = crate::protocol::artifact::parse_recipients(&cfg.recovery_recipients)
            .map_err(|e| ServiceError::Invalid {
                problems: vec![format!("recovery_recipients: {e}")],
            })?;
        store.register_recipients(&recipients).await?;
        let principal = format!("coordinator:{}", cfg.name);
        let (session_seed, ordinary_seed) =
            (read_seed(&cfg.session_key)?, read_seed(&cfg.ordinary_key)?);
        let own = [
            (Purpose::Session, &session_seed),
            (Purpose::Ordinary, &ordinary_seed),
        ]
        .map(|(purpose, seed)| trust::OwnKey {
            key_id: format!(
                "{principal}/{}",
                if purpose == Purpose::Session {
                    "session"
                } else {
                    "ordinary"
                }
            ),
            purpose,
            public: ed25519_dalek::SigningKey::from_bytes(seed).verifying_key(),
        })
        .to_vec();
        let recovery_seed = cfg.recovery_key.as_deref().map(read_seed).transpose()?;
        let mut own = own;
        if let Some(seed) = &recovery_seed {
            own.push(trust::OwnKey {
                key_id: format!("{principal}/recovery"),
                purpose: Purpose::Recovery,
                public: ed25519_dalek::SigningKey::from_bytes(seed).verifying_key(),
            });
        }
        let trust = trust::TrustSource::new(cfg.trust_registry.clone(), principal.clone(), own);
        // Revocations are authority: a restart applies every one before it verifies anything.
        trust.learn(store.revocations().await?);
        let registry = crate::protocol::LiveRegistry::new(trust.load()?);
        let cand = Candidate {
            holder: principal.clone(),
            credential_digest: format!(
                "sha256:{}",
                crate::util::sha256_hex(
                    "mosaic/coordinator-credential/v1",
                    &[&read_seed(&cfg.ordinary_key)?]
                )
            ),
            launch_id: format!("launch-{}", uuid::Uuid::new_v4().simple()),
        };
        let advertise = cfg.advertise_operator.clone().or_else(|| {
            cfg.operator_listen
                .clone()
                .filter(|a| !(a.starts_with("0.0.0.0:") || a.starts_with("[::]:")))
                .map(|a| format!("tls://{a}"))
        });
        store
            .record_endpoint(&cand.launch_id, &principal, advertise.as_deref())
            .await?;
        let timing = cfg.timing();
        let state_dir = cfg
            .state_dir
            .clone()
            .or_else(|| cfg.secret_file.parent().map(std::path::PathBuf::from))
            .unwrap_or_else(|| std::path::PathBuf::from("."));
        let spool = state_dir.join("audit-spool.jsonl");
        store
            .auditor()
            .spool_to(spool.clone())
            .map_err(|source| ServiceError::ReadFile {
                path: spool,
                source,
            })?;
        let store_stats = store.stats.clone();
        let svc = Arc::new(Self {
            session: Arc::new(Signer::new(
                &format!("{principal}/session"),
                &principal,
                &cfg.trust_domain,
                session_seed,
            )),
            ordinary: Arc::new(Signer::new(
                &format!("{principal}/ordinary"),
                &principal,
                &cfg.trust_domain,
                ordinary_seed,
            )),
            recovery: recovery_seed.map(|seed| {
                Arc::new(Signer::new(
                    &format!("{principal}/recovery"),
                    &principal,
                    &cfg.trust_domain,
                    seed,
                ))
            }),
            store,
            timing,
            recipients,
            leadership: leadership::Leadership::new(),
            registry,
            trust,
            principal,
            domain: cfg.trust_domain.clone(),
            hosts: hosts::Sessions::default(),
            changed: watch::channel(0).0,
            waiting: waiting::Hub::default(),
            driver: driver::DriverState::default(),
            metrics: crate::coordinator::metrics::CoordinatorMetrics::new(&store_stats),
            shutdown: crate::util::shutdown::Shutdown::new(),
            background: std::sync::Mutex::new(Background::default()),
        });
        // Leadership runs on a thread and runtime of its own: no amount of host-session or
        // operator work on the main runtime can delay a renewal past the lease.
        // A runtime that cannot be built fails the start: the thread used to end with a log
        // line, and the coordinator stood by for good, never leading.
        let (l_svc, lease_ms, l_stop) = (svc.clone(), timing.lease_ms, svc.shutdown.signal());
        let (built_tx, built) = tokio::sync::oneshot::channel();
        let leadership = std::thread::Builder::new()
            .name("mosaic-leadership".into())
            .spawn(move || {
                match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => {
                        let _ = built_tx.send(Ok(()));
                        rt.block_on(leadership::run(l_svc, cand, lease_ms, l_stop))
                    }
                    Err(e) => {
                        let _ = built_tx.send(Err(e));
                    }
                }
            })
            .map_err(ServiceError::Io)?;
        match built.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(ServiceError::Io(e)),
            Err(_) => {
                return Err(ServiceError::Serve {
                    what: "leadership",
                    at: "its thread".into(),
                    detail: "the thread ended before its runtime was built".into(),
                })
            }
        }
        let watchdog = tokio::spawn(watchdog::run(svc.clone(), svc.shutdown.signal()));
        tokio::spawn(trust::watch(svc.clone(), svc.shutdown.signal()));
        tokio::spawn(waiting::run(svc.clone(), svc.shutdown.signal()));
        tokio::spawn(notifier::run(svc.clone(), sinks, svc.shutdown.signal()));
        if let Ok(mut b) = svc.background.lock() {
            b.leadership = Some(leadership);
            b.watchdog = Some(watchdog);
        }
        Ok(svc)
    }

    /// Stops the background work and waits for it: the watchdog sweep finishes the step it
    /// is in, and the leadership loop gives up the lease it holds (so a standby need not
    /// wait for it to expire) and ends. Idempotent.
    pub async fn shut_down(&self) {
        self.shutdown.trigger();
        let (watchdog, leadership) = match self.background.lock() {
            Ok(mut b) => (b.watchdog.take(), b.leadership.take()),
            Err(_) => (None, None),
        };
        if let Some(w) = watchdog {
            if let Err(e) = w.await {
                tracing::error!(error = %e, "the watchdog sweep ended abnormally");
            }
        }
        if let Some(t) = leadership {
            match tokio::task::spawn_blocking(move || t.join()).await {
                Ok(Ok(())) => {}
                _ => tracing::error!("the leadership loop ended abnormally"),
            }
        }
    }

    /// Waits until this process leads.
    pub async fn wait_leading(&self) -> Leader {
        loop {
            if let Some(l) = self.leadership.current().await {
                return l;
            }
            tokio::select! {
                _ = self.leadership.wait_gained() => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(100)) => {}
            }
        }
    }

    /// The leadership to act under, or `not-leader` naming the leader's operator address
    /// when it advertises one.
    pub async fn leader(&self) -> Result<Leader, OpError> {
        if let Some(l) = self.leadership.current().await {
            return Ok(l);
        }
        let at = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            self.store.leader_endpoint(),
        )
        .await
        .ok()
        .and_then(Result::ok)
        .flatten();
        let mut e = OpError::new(
            Category::NotLeader,
            match &at {
                Some(a) => format!("this coordinator is standing by; the leader takes operator requests at {a}"),
                None => "this coordinator is standing by; another one leads (or none yet), and it advertises no operator address".to_string(),
            },
        );
        e.leader = at;
        Err(e)
    }

    pub fn leadership_status(&self) -> leadership::LeadershipStatus {
        self.leadership.status()
    }

    /// Reports a failed transition: a stale leadership is dropped at once.
    pub(crate) async fn note(&self, l: &Leader, e: &AuthorityError) {
        if e.category() == Some(Category::StaleLeader) && self.leadership.stale(l.epoch()).await {
            self.leadership_lost();
        }
    }

    /// This process no longer leads: every host session it holds is closed, so each host
    /// reconnects — to whichever coordinator leads now (a standby refuses sessions). A
    /// host kept on a coordinator that cannot act for it would be stranded.
    pub(crate) fn leadership_lost(&self) {
        self.hosts
            .close_all(crate::protocol::transport::CloseReason::NotLeader);
    }

    fn bump(&self) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Hosts with a live session right now.
    pub fn connected_hosts(&self) -> Vec<String> {
        self.hosts.connected()
    }

    /// One line for the service manager's status.
    pub async fn status_line(&self) -> String {
        match self.leadership.current().await {
            Some(l) => format!(
                "leading, epoch {}; {} host sessions",
                l.epoch(),
                self.hosts.views().len()
            ),
            None => format!("standing by (losses {})", self.leadership.status().losses),
        }
    }

    /// Serves `/metrics` on `addr` until `shutdown`; returns the bound address.
    pub async fn serve_metrics(
        self: &Arc<Self>,
        addr: &str,
        shutdown: watch::Receiver<bool>,
    ) -> Result<String, ServiceError> {
        let listener = crate::metrics::bind(addr)
            .await
            .map_err(|e| ServiceError::Serve {
                what: "metrics",
                at: addr.to_string(),
                detail: e.to_string(),
            })?;
        let bound = listener.local_addr()?.to_string();
        let svc = self.clone();
        let refresh: crate::metrics::Refresh = Arc::new(move || {
            let svc = svc.clone();
            Box::pin(async move {
                let epoch = svc.leadership.current().await.map(|l| l.epoch());
                let losses = svc.leadership.status().losses;
                svc.metrics
                    .refresh(&svc.store, epoch, losses, svc.hosts.views().len())
                    .await;
            })
        });
        tokio::spawn(crate::metrics::serve(
            listener,
            self.metrics.registry.clone(),
            Some(refresh),
            shutdown,
        ));
        tracing::info!(addr = %bound, "metrics at http://{bound}/metrics");
        Ok(bound)
    }

    /// Serves host sessions on `listener` until `shutdown` flips, in a task of its own; the
    /// handle is how the process waits for the sessions' closes before it goes.
    pub fn spawn_hosts(
        self: &Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: TlsIdentity,
        shutdown: watch::Receiver<bool>,
    ) -> HostListener {
        HostListener(Some(tokio::spawn(
            self.clone().serve_hosts(listener, tls, shutdown),
        )))
    }

    /// Serves host sessions on `listener` until `shutdown`.
    pub async fn serve_hosts(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        tls: TlsIdentity,
        shutdown: watch::Receiver<bool>,
    ) -> Result<(), ServiceError> {
        let audit = self.store.auditor().clone();
        let params = ServerParams {
            registry: self.registry.clone(),
            audience: self.principal.clone(),
            trust_domain: self.domain.clone(),
            audit: Arc::new(move |peer: &str, v: &transport::Violation, detail: &str| {
                tracing::warn!(peer, violation = %v, detail, "rejected a host frame");
                audit.record(
                    "wire",
                    wire_category(v),
                    None,
                    None,
                    None,
                    &format!("{peer}: {v}: {detail}"),
                );
            }),
            signer: self.session.clone(),
            liveness: self.timing.liveness,
            limits: transport::Limits {
                max_clock_skew_ms: self.timing.max_clock_skew_ms,
                ..transport::Limits::default()
            },
            on_strike: {
                let svc = self.clone();
                Some(Arc::new(move |v: &transport::Violation| {
                    svc.metrics
                        .invalid_frames
                        .get_or_create(&crate::coordinator::metrics::CategoryLabel {
                            category: v.as_str().to_string(),
                        })
                        .inc();
                }))
            },
        };
        transport::serve(
            listener,
            transport::server_tls(&tls)?,
            params,
            Arc::new(hosts::HostHandler(self.clone())),
            shutdown,
        )
        .await?;
        Ok(())
    }
}

/// Runs the coordinator daemon until SIGTERM/SIGINT.
/// Pings the systemd watchdog at half its interval while the leadership loop (on its own
/// thread) keeps turning; a stuck loop — the one whose stall would cost the lease — stops
/// the pings and systemd restarts the coordinator.
async fn watchdog(svc: Arc<Service>, every: std::time::Duration) {
    let half = every / 2;
    loop {
        tokio::time::sleep(half).await;
        let since = svc.leadership.since_turn();
        if since < every {
            crate::systemd::alive(&svc.status_line().await);
        } else {
            tracing::error!(
                since_ms = since.as_millis() as u64,
                "the leadership loop has not turned; withholding the watchdog ping"
            );
        }
    }
}

/// What must hold before the coordinator starts anything: its secret and keys readable by
/// it alone, its certificate files present, its trust registry valid.
pub fn preflight(cfg: &CoordinatorConfig) -> Result<(), ServiceError> {
    use std::os::unix::fs::PermissionsExt;
    let mut problems = Vec::new();
    for (what, p) in [
        ("secret_file", &cfg.secret_file),
        ("session_key", &cfg.session_key),
        ("ordinary_key", &cfg.ordinary_key),
        ("key", &cfg.key),
    ] {
        match std::fs::metadata(p) {
            Ok(m) if m.permissions().mode() & 0o077 != 0 => problems.push(format!(
                "{what} {} is readable by others (mode {:o}); chmod 600 it",
                p.display(),
                m.permissions().mode() & 0o777
            )),
            Ok(_) => {}
            Err(e) => problems.push(format!("{what} {}: {e}", p.display())),
        }
    }
    for (what, p) in [("ca", &cfg.ca), ("cert", &cfg.cert)] {
        if let Err(e) = std::fs::metadata(p) {
            problems.push(format!("{what} {}: {e}", p.display()));
        }
    }
    if let Err(e) = crate::protocol::artifact::parse_recipients(&cfg.recovery_recipients) {
        problems.push(format!("recovery_recipients: {e}"));
    }
    match std::fs::read_to_string(&cfg.trust_registry) {
        Ok(t) => {
            if let Err(e) = TrustRegistry::from_toml(&t) {
                problems.push(format!("trust_registry: {e}"));
            }
        }
        Err(e) => problems.push(format!(
            "trust_registry {}: {e}",
            cfg.trust_registry.display()
        )),
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(ServiceError::Invalid { problems })
    }
}

/// The audit category of a refused frame or session: what kind of wrong it was, not one
/// catch-all.
fn wire_category(v: &transport::Violation) -> Category {
    use transport::Violation as V;
    match v {
        V::Unverified(_) | V::BinaryFrame | V::Hostile(_) | V::SessionClosedAbusive => {
            Category::BadInput
        }
        V::IssuerNotPeer | V::OtherSession => Category::NotOwner,
        V::SecondHello | V::Replayed | V::SessionRefused => Category::Conflict,
    }
}

/// The host listener's task ([`Service::spawn_hosts`]).
pub struct HostListener(Option<tokio::task::JoinHandle<Result<(), ServiceError>>>);

impl HostListener {
    /// Once the shutdown flipped: waits until every host session sent its close frame
    /// ("coordinator shutting down") and read the host's, bounded inside `serve`. Aborted
    /// instead, a session's socket was reset, and its host logged "connection reset" rather
    /// than why. Returns at once if the listener already ended.
    pub async fn closed(mut self) {
        let Some(task) = self.0.take() else { return };
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the host listener ended with an error"),
            Err(e) => tracing::error!(error = %e, "the host listener's task failed"),
        }
    }

    /// Resolves only if the listener ends before the shutdown (it cannot serve): the
    /// process must not run on without it. Pending for good once it has resolved.
    pub async fn failed(&mut self) -> ServiceError {
        let Some(task) = self.0.as_mut() else {
            return std::future::pending().await;
        };
        let ended = task.await;
        self.0 = None;
        match ended {
            Ok(Err(e)) => e,
            Ok(Ok(())) => ServiceError::Serve {
                what: "host sessions",
                at: "its listener".into(),
                detail: "the listener stopped".into(),
            },
            Err(e) => ServiceError::Serve {
                what: "host sessions",
                at: "its listener".into(),
                detail: format!("its task failed: {e}"),
            },
        }
    }
}

pub async fn run_daemon(cfg: CoordinatorConfig) -> Result<(), ServiceError> {
    preflight(&cfg)?;
    // Each host session and each pending handshake (up to 512) is a descriptor.
    crate::util::raise_open_file_limit();
    let svc = Service::start(&cfg).await?;
    let listener = tokio::net::TcpListener::bind(&cfg.listen).await?;
    let (stop, rx) = watch::channel(false);
    let tls = TlsIdentity {
        ca: cfg.ca.clone(),
        cert: cfg.cert.clone(),
        key: cfg.key.clone(),
    };
    let mut hosts = svc.spawn_hosts(listener, tls.clone(), rx.clone());
    if let Some(addr) = &cfg.metrics_listen {
        svc.serve_metrics(addr, rx).await?;
    }
    let ops = tokio::spawn(serve_operators(
        svc.clone(),
        bind_operators(&cfg.operator_socket)?,
    ));
    let remote = match &cfg.operator_listen {
        Some(addr) => Some(tokio::spawn(serve_remote_operators(
            svc.clone(),
            tokio::net::TcpListener::bind(addr).await?,
            tls.clone(),
        ))),
        None => None,
    };
    tracing::info!(principal = %svc.principal, listen = %cfg.listen, "coordinator serving (standing by until it leads)");
    // Serving: listeners bound, the leadership loop running (leading or standing by).
    crate::systemd::ready(&svc.status_line().await);
    if let Some(every) = crate::systemd::watchdog() {
        tokio::spawn(watchdog(svc.clone(), every));
    }
    tokio::spawn(trust::reload_on_hangup(svc.clone()));
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let outcome = tokio::select! {
        _ = term.recv() => Ok(()),
        _ = tokio::signal::ctrl_c() => Ok(()),
        e = hosts.failed() => Err(e),
    };
    crate::systemd::stopping();
    let _ = stop.send(true);
    // The leadership loop releases the lease as it stops.
    svc.shut_down().await;
    hosts.closed().await;
    ops.abort();
    if let Some(r) = remote {
        r.abort();
    }
    let _ = std::fs::remove_file(&cfg.operator_socket);
    outcome
}

#[cfg(test)]
mod wire_audit_tests {
    use super::*;
    use transport::Violation as V;

    #[test]
    fn a_refused_frame_is_audited_by_what_was_wrong_with_it() {
        assert_eq!(wire_category(&V::Replayed), Category::Conflict);
        assert_eq!(wire_category(&V::SecondHello), Category::Conflict);
        assert_eq!(wire_category(&V::IssuerNotPeer), Category::NotOwner);
        assert_eq!(wire_category(&V::OtherSession), Category::NotOwner);
        assert_eq!(
            wire_category(&V::Unverified("bad-signature")),
            Category::BadInput
        );
        assert_eq!(wire_category(&V::SessionRefused), Category::Conflict);
        // The label is the one the audit and the metric have always shown.
        assert_eq!(V::Replayed.as_str(), "replayed");
        assert_eq!(V::Unverified("too-large").as_str(), "too-large");
        assert_eq!(
            V::Hostile("malformed-lane_id".into()).as_str(),
            "malformed-lane_id"
        );
    }
}
