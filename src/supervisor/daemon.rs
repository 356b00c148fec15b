//! The supervisor as a daemon: its coordinator link, its metrics endpoint, the systemd
//! watchdog, and the run loop until SIGTERM.

use std::path::PathBuf;
use std::sync::Arc;

use super::*;

impl Supervisor {
    /// Starts the coordinator link: hello with this host's lanes (`lane@incarnation`),
    /// receipts until acknowledged, and the coordinated chain. Runs until shutdown.
    pub async fn connect_coordinator(
        &self,
        link: &config::CoordinatorLink,
    ) -> Result<(), SupervisorError> {
        let cfg_err = |detail: String| SupervisorError::Config { detail };
        let seed = |p: &std::path::Path| -> Result<[u8; 32], SupervisorError> {
            let text =
                std::fs::read_to_string(p).map_err(|e| cfg_err(format!("{}: {e}", p.display())))?;
            let mut b = [0u8; 32];
            hex::decode_to_slice(text.trim(), &mut b)
                .map_err(|_| cfg_err(format!("{}: expected 64 hex digits", p.display())))?;
            Ok(b)
        };
        let host = self.inner.cfg.host.as_str().to_string();
        let principal = format!("host:{host}");
        let registry = std::fs::read_to_string(&link.trust_registry)
            .map_err(|e| cfg_err(format!("{}: {e}", link.trust_registry.display())))
            .and_then(|t| {
                crate::protocol::TrustRegistry::from_toml(&t).map_err(|e| cfg_err(e.to_string()))
            })?;
        // Its own keys must be in the registry it loads, as its own: a host whose key the
        // registry lacks would connect only to be refused at its hello.
        let own = [
            (
                Some(&link.session_key),
                crate::protocol::schema::Purpose::Session,
                "session",
            ),
            (
                Some(&link.ordinary_key),
                crate::protocol::schema::Purpose::Ordinary,
                "ordinary",
            ),
            (
                link.recovery_key.as_ref(),
                crate::protocol::schema::Purpose::Recovery,
                "recovery",
            ),
        ];
        for (path, purpose, name) in own
            .iter()
            .filter_map(|(p, purpose, name)| p.map(|p| (p, *purpose, *name)))
        {
            let public = ed25519_dalek::SigningKey::from_bytes(&seed(path)?).verifying_key();
            registry
                .check_own(
                    &format!("{principal}/{name}"),
                    &principal,
                    purpose,
                    &public,
                    std::time::SystemTime::now(),
                )
                .map_err(|e| {
                    cfg_err(format!(
                        "{}: {e} (the key file is {})",
                        link.trust_registry.display(),
                        path.display()
                    ))
                })?;
        }
        let tls =
            crate::protocol::transport::client_tls(&crate::protocol::transport::TlsIdentity {
                ca: link.ca.clone(),
                cert: link.cert.clone(),
                key: link.key.clone(),
            })
            .map_err(|e| cfg_err(e.to_string()))?;
        self.publish_lanes().await;
        let state = self.inner.host_state.borrow().clone();
        let params = crate::protocol::transport::LinkParams {
            addr: link.address.clone(),
            fallback_addrs: link.fallback_addresses.clone(),
            server_name: link.server_name.clone(),
            coordinator: link.principal.clone(),
            tls,
            signer: Arc::new(crate::protocol::Signer::new(
                &format!("{principal}/session"),
                &principal,
                &link.trust_domain,
                seed(&link.session_key)?,
            )),
            registry: Arc::new(registry),
            trust_domain: link.trust_domain.clone(),
            host_id: host,
            lanes: state.lanes,
            report: state.report,
            runtimes: self.inner.registry.runtimes(),
            liveness: crate::protocol::transport::Liveness::from_heartbeat_ms(link.heartbeat_ms),
            max_clock_skew_ms: link
                .max_clock_skew_ms
                .unwrap_or(crate::protocol::transport::ClockSkew::DEFAULT_TOLERANCE_MS),
        };
        let fence = Arc::new(authority::AuthorityFence::load(&self.inner.cfg.state_dir)?);
        let audit: link::LinkAudit = {
            let inner = self.inner.clone();
            Arc::new(move |category, detail| {
                tracing::warn!(category, detail, "coordinator frame refused");
                inner
                    .metrics
                    .link_refused
                    .get_or_create(&metrics::HostMetrics::category(category))
                    .inc();
                inner.audit.record(category, None, None, detail);
            })
        };
        let ordinary = Arc::new(crate::protocol::Signer::new(
            &format!("{principal}/ordinary"),
            &principal,
            &link.trust_domain,
            seed(&link.ordinary_key)?,
        ));
        let (out, rx) = tokio::sync::mpsc::channel(256);
        let host =
            coordinated::CoordinatedHost::new(self.clone(), ordinary, params.signer.clone(), out)
                .await;
        if let Some(path) = &link.recovery_key {
            let seed = seed(path)?;
            host.set_recovery_signer(Arc::new(crate::protocol::Signer::new(
                &format!("{principal}/recovery"),
                &principal,
                &link.trust_domain,
                seed,
            )));
        }
        tokio::spawn(link::run_link(
            params,
            self.inner.outbox.clone(),
            Arc::new(host),
            rx,
            self.inner.host_state.subscribe(),
            fence,
            audit,
            Some(self.inner.metrics.clone()),
            Some(self.inner.reported.clone()),
            Some(self.inner.link_session.clone()),
            self.inner.shutdown.subscribe(),
        ));
        Ok(())
    }

    /// Serves this supervisor's metrics on `addr` until shutdown; the bound address is
    /// written to `<runtime_dir>/metrics.addr` and returned.
    pub async fn serve_metrics(&self, addr: &str) -> Result<String, SupervisorError> {
        let listener = crate::metrics::bind(addr)
            .await
            .map_err(|e| SupervisorError::Config {
                detail: e.to_string(),
            })?;
        let bound = listener
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_default();
        let path = self.inner.cfg.runtime_dir.join("metrics.addr");
        crate::util::durable::write_atomic(&path, bound.as_bytes())?;
        tracing::info!(addr = %bound, "metrics at http://{bound}/metrics");
        tokio::spawn(crate::metrics::serve(
            listener,
            self.inner.metrics.registry.clone(),
            None,
            self.inner.shutdown.subscribe(),
        ));
        Ok(bound)
    }
}

/// Pings the systemd watchdog at half its interval — but only when a full status read
/// (every lane's lock, the state the control socket serves) completes in time. A lane
/// stuck under a hung operation therefore stops the pings, and systemd restarts the
/// supervisor (generations keep running and are re-adopted).
async fn watchdog(sup: Supervisor, every: std::time::Duration) {
    let half = every / 2;
    loop {
        tokio::time::sleep(half).await;
        match tokio::time::timeout(half, sup.status_line()).await {
            Ok(line) => crate::systemd::alive(&line),
            Err(_) => tracing::error!(
                "the supervisor's lanes did not answer within {} ms; withholding the watchdog ping",
                half.as_millis()
            ),
        }
    }
}

/// After a generation finishes on its own (crash, SIGKILL, exit), folds the result into
/// the lane record without waiting for the next lane operation.
pub(crate) fn spawn_applier(inner: Arc<Inner>, lane: String, live: &LiveGen) {
    let mut done = live.done.clone();
    tokio::spawn(async move {
        let fin = match done.wait_for(|v| v.is_some()).await {
            Ok(v) => v.clone(),
            Err(_) => return, // watcher ended without finishing: supervisor shutdown
        };
        let Some(fin) = fin else { return };
        let Ok(name) = LaneName::parse(&lane) else {
            return;
        };
        if let Ok(slot) = inner.slot(&name) {
            slot.lock().await.apply_finish(&inner.store, &fin);
        }
        publish(&inner).await;
    });
}

/// Runs the supervisor daemon until SIGTERM or SIGINT.
pub async fn run_daemon(cfg: Config) -> Result<(), SupervisorError> {
    decommission::refuse_if_decommissioned(&cfg.state_dir)?;
    // Every lane's gateway holds descriptors for its connections: a few busy lanes must
    // not starve the rest.
    crate::util::raise_open_file_limit();
    // Everything `mosaic doctor` checks, before anything is created.
    let report = crate::doctor::run(cfg.cgroup_root.as_deref());
    if !report.can_run_supervisor {
        let failed: Vec<String> = report
            .checks
            .iter()
            .filter(|c| c.required && !c.ok)
            .map(|c| format!("{}: {}", c.name, c.detail))
            .collect();
        return Err(SupervisorError::Config {
            detail: format!("this host cannot run the supervisor: {}", failed.join("; ")),
        });
    }
    let sup = Supervisor::open(cfg)?;
    // The daemon lives in `supervisor/` so the delegated root holds no process itself.
    let me = sup.inner.tree.supervisor();
    me.create()?;
    me.join_self()?;
    let report = sup.recover().await?;
    tracing::info!(
        adopted = report.adopted,
        receipts_written = report.receipts_written,
        quarantined = report.quarantined,
        "recovery done"
    );
    for lane in sup.inner.cfg.lanes.clone() {
        match sup.lane_create(lane.as_str()).await {
            Ok(v) => tracing::info!(lane = %v.lane_id, attach = %v.attach, "lane ready"),
            Err(SupervisorError::LaneExists { .. }) => {}
            Err(e) => return Err(e),
        }
    }
    if let Some(link) = sup.inner.cfg.coordinator.clone() {
        sup.connect_coordinator(&link).await?;
    }
    if let Some(addr) = sup.inner.cfg.metrics_listen.clone() {
        sup.serve_metrics(&addr).await?;
    }
    let listener = control::bind(&sup.inner.cfg.control_socket())?;
    tracing::info!(socket = %sup.inner.cfg.control_socket().display(), "supervisor ready");
    // Serving: lanes re-adopted, the control socket bound.
    crate::systemd::ready(&sup.status_line().await);
    if let Some(every) = crate::systemd::watchdog() {
        tokio::spawn(watchdog(sup.clone(), every));
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|source| SupervisorError::Io {
            what: "signal handler",
            path: PathBuf::from("SIGTERM"),
            source,
        })?;
    let mut decommissioned = sup.inner.decommissioned.subscribe();
    let left = tokio::select! {
        r = control::serve(sup.clone(), listener) => { r?; false }
        _ = term.recv() => { tracing::info!("SIGTERM: leaving lanes running"); false }
        _ = tokio::signal::ctrl_c() => { tracing::info!("SIGINT: leaving lanes running"); false }
        _ = decommissioned.wait_for(|d| *d) => true,
    };
    crate::systemd::stopping();
    sup.shutdown();
    let _ = std::fs::remove_file(sup.inner.cfg.control_socket());
    if left {
        sup.remove_traces();
    }
    Ok(())
}
