//! Supervisor restart: re-adopt what is provably ours, write receipts for what died while
//! no supervisor watched, and quarantine what cannot be proven either way.
//!
//! A live generation is adopted only when its shim reconnects and re-presents the launch
//! nonce from inside the generation's cgroup, with the recorded root PID, start time, boot
//! id and executable. A PID that merely exists proves nothing.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::generation::{self, Link, Observation, Watcher};
use super::receipt::StopCause;
use super::state::{GenRecord, GenStatus, LaneStatus};
use super::{Inner, Lane, SupervisorError};
use crate::shim::proto::{HarnessState, ShimMsg, SupervisorMsg};

#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct RecoveryReport {
    pub lanes: usize,
    pub adopted: usize,
    pub receipts_written: usize,
    pub quarantined: usize,
}

pub(crate) async fn recover(inner: &Arc<Inner>) -> Result<RecoveryReport, SupervisorError> {
    let mut report = RecoveryReport::default();
    let mut live = std::collections::HashSet::new();
    for rec in inner.store.lanes()? {
        let name = rec.lane.clone();
        let mut lane = Lane { rec, live: None };
        if lane.rec.status == LaneStatus::Destroyed {
            inner.insert_slot(&name, lane)?;
            continue;
        }
        report.lanes += 1;
        for g in inner.store.gens(&lane.rec.lane_incarnation_id)? {
            if g.status == GenStatus::Terminated {
                continue;
            }
            match reconcile(inner, g).await {
                Outcome::Adopted(w) => {
                    report.adopted += 1;
                    live.insert((w.rec.lane_incarnation_id.clone(), w.rec.generation));
                    let live = generation::spawn_watcher(w, true);
                    super::spawn_applier(inner.clone(), name.clone(), &live);
                    lane.live = Some(live);
                }
                Outcome::Finished(fin) => {
                    report.receipts_written += 1;
                    if fin.quarantine.is_some() {
                        report.quarantined += 1;
                        // Cleanup not verified: processes may still use the area, and it
                        // is evidence for whoever releases the quarantine.
                        live.insert((
                            fin.receipt.lane_incarnation_id.clone(),
                            fin.receipt.generation,
                        ));
                    }
                    lane.apply_finish(&inner.store, &fin);
                }
            }
        }
        if lane.rec.status == LaneStatus::Active
            && inner.tmux(&name).session_state(&name) == super::tmux::SessionState::Absent
        {
            report.quarantined += 1;
            lane.settle(&inner.store, None, Some("the lane's tmux server is gone"));
        }
        inner.insert_slot(&name, lane)?;
    }
    sweep_harness_areas(inner, &live);
    super::checkpoints::sweep_temporary_indexes(inner);
    super::artifacts::sweep(inner);
    Ok(report)
}

/// Removes private harness areas no live or quarantined generation owns: one whose
/// generation ended while this supervisor was down (or between its verified cleanup and the
/// removal). Nothing can be using them: their cgroups are gone or were verified empty.
fn sweep_harness_areas(inner: &Inner, live: &std::collections::HashSet<(String, u64)>) {
    // The short runtime directories first: those of no kept generation go.
    let keep: std::collections::HashSet<PathBuf> = live
        .iter()
        .map(|(inc, g)| generation::harness_run_dir(inner, inc, *g))
        .collect();
    if let Ok(runs) = std::fs::read_dir(inner.cfg.runtime_dir.join("h")) {
        for r in runs.flatten() {
            if !keep.contains(&r.path()) {
                let _ = std::fs::remove_dir_all(r.path());
            }
        }
    }
    let root = inner.cfg.state_dir.join("harness");
    let Ok(incs) = std::fs::read_dir(&root) else {
        return;
    };
    for inc in incs.flatten() {
        let inc_name = inc.file_name().to_string_lossy().into_owned();
        let Ok(gens) = std::fs::read_dir(inc.path()) else {
            continue;
        };
        for g in gens.flatten() {
            let n = g
                .file_name()
                .to_string_lossy()
                .strip_prefix("gen-")
                .and_then(|n| n.parse::<u64>().ok());
            match n {
                Some(n) if live.contains(&(inc_name.clone(), n)) => {}
                Some(n) => generation::remove_harness_dir(inner, &inc_name, n),
                None => {}
            }
        }
        let _ = std::fs::remove_dir(inc.path()); // only if empty
    }
}

// One value per generation at adoption, moved at once: never stored in bulk.
#[allow(clippy::large_enum_variant)]
enum Outcome {
    Adopted(Watcher),
    Finished(super::Finished),
}

async fn reconcile(inner: &Arc<Inner>, g: GenRecord) -> Outcome {
    let cg = inner.tree.at_abs(&g.cgroup);
    let populated = cg.exists() && cg.events().map(|e| e.populated).unwrap_or(true);
    if !populated {
        // Dead while we were away. The shim's exit record, if it got to write one, proves
        // how the harness ended; otherwise the reason is unknown.
        let exit = std::fs::read(&g.exit_record)
            .ok()
            .and_then(|b| serde_json::from_slice::<HarnessState>(&b).ok());
        return Outcome::Finished(
            finish_detached(inner, g, Observation::DiedWhileAway(exit)).await,
        );
    }
    // A generation whose workspace is open may be frozen only for a checkpoint its harness
    // asked for, cut by the crash between freezing and thawing it: thawed before its shim
    // is waited for (a frozen shim cannot reconnect, and would be ended as unverifiable).
    // A held or fenced one stays as it is (re-adoption below decides what it needs).
    if g.status == GenStatus::Live && g.workspace_open() && cg.exists() {
        if let Err(e) = cg.thaw() {
            tracing::error!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                "cannot thaw the generation before re-adopting it");
        }
    }
    match (g.status, g.identity.clone()) {
        (GenStatus::Live, Some(_)) => match reattach(inner, &g).await {
            Ok((w, exit)) => match exit {
                Some(st) => {
                    let mut w = w;
                    let fin = generation::finish(
                        &mut w,
                        Observation::HarnessExited(super::receipt::ObservationSource::Shim, st),
                    )
                    .await;
                    Outcome::Finished(fin)
                }
                None => Outcome::Adopted(w),
            },
            Err(detail) => {
                inner.audit.record(
                    "unverifiable-generation",
                    Some(&g.lane_id),
                    Some(g.generation),
                    &detail,
                );
                let mut fin =
                    finish_detached(inner, g, Observation::Stop(StopCause::Unverifiable)).await;
                fin.receipt.detail = Some(detail.clone());
                fin.quarantine.get_or_insert(format!(
                    "could not re-verify a live generation after restart: {detail}"
                ));
                Outcome::Finished(fin)
            }
        },
        // Still starting when the old supervisor died: its identity was never verified, so
        // it is not adoptable, whatever runs in it.
        _ => {
            let mut fin =
                finish_detached(inner, g, Observation::Stop(StopCause::Unverifiable)).await;
            fin.receipt.detail = Some(
                "the supervisor restarted before this generation's identity was verified".into(),
            );
            Outcome::Finished(fin)
        }
    }
}

/// Finishes a generation that has no live shim link: kill, verify, remove, receipt.
async fn finish_detached(inner: &Arc<Inner>, g: GenRecord, obs: Observation) -> super::Finished {
    let mut w = Watcher {
        inner: inner.clone(),
        graceful: nix::sys::signal::Signal::SIGTERM,
        grace: Duration::ZERO,
        rec: g,
        link: None,
        shim_pidfd: None,
        harness_pidfd: None,
        lane_server: None,
        gateway: None,
    };
    generation::finish(&mut w, obs).await
}

/// Waits for the generation's shim to reconnect and re-verifies it against the record.
async fn reattach(
    inner: &Arc<Inner>,
    g: &GenRecord,
) -> Result<(Watcher, Option<crate::shim::proto::ExitStatus>), String> {
    let recorded = g.identity.clone().ok_or("no recorded identity")?;
    let listener = generation::bind_socket(&g.socket).map_err(|e| e.to_string())?;
    let deadline =
        tokio::time::Instant::now() + Duration::from_millis(inner.cfg.reattach_timeout_ms);
    let mut last = String::from("the shim did not reconnect");
    loop {
        let stream = match tokio::time::timeout_at(deadline, listener.accept()).await {
            Ok(Ok((stream, _))) => stream,
            // Refused by the kernel (out of descriptors): not the shim's failure, so not
            // a reason to judge a live generation unverifiable before the deadline.
            Ok(Err(e)) => {
                last = format!("accepting its connection: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(_) => {
                let _ = std::fs::remove_file(&g.socket);
                return Err(last);
            }
        };
        let mut link = Link::from_stream(stream);
        let hello = tokio::time::timeout_at(deadline, link.recv()).await;
        let (pid, start_time, nonce, harness) = match hello {
            Ok(Ok(Some(ShimMsg::Hello {
                pid,
                start_time,
                nonce,
                harness: Some(h),
            }))) => (pid, start_time, nonce, h),
            _ => {
                last = "a connection did not present a reattach hello".into();
                inner
                    .audit
                    .record("bad-hello", Some(&g.lane_id), Some(g.generation), &last);
                let _ = link
                    .send(&SupervisorMsg::Reject {
                        reason: "bad-hello".into(),
                    })
                    .await;
                continue;
            }
        };
        let verdict = generation::verify_hello(
            inner,
            &link,
            &recorded.cgroup_path,
            &g.nonce_digest,
            Some(&recorded),
            generation::Hello {
                pid,
                start_time,
                nonce_hex: &nonce.0,
            },
        );
        let (shim_pidfd, _) = match verdict {
            Ok(v) => v,
            Err(e) => {
                last = e.to_string();
                inner
                    .audit
                    .record(e.category(), Some(&g.lane_id), Some(g.generation), &last);
                let _ = link
                    .send(&SupervisorMsg::Reject {
                        reason: e.category().into(),
                    })
                    .await;
                continue;
            }
        };
        if Some(harness.harness_pid) != recorded.harness_pid {
            last = "the shim reports a different harness pid than recorded".into();
            inner.audit.record(
                "harness-mismatch",
                Some(&g.lane_id),
                Some(g.generation),
                &last,
            );
            let _ = link
                .send(&SupervisorMsg::Reject {
                    reason: "harness-mismatch".into(),
                })
                .await;
            continue;
        }
        // The harness pidfd is reopened only if it is still the recorded process.
        let harness_pidfd = match (harness.exit, recorded.harness_start_time) {
            (None, Some(st)) => crate::supervisor::identity::observe(harness.harness_pid)
                .ok()
                .filter(|o| o.start_time == st && o.cgroup == recorded.cgroup_path)
                .and_then(|_| {
                    rustix::process::Pid::from_raw(harness.harness_pid).and_then(|p| {
                        rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
                    })
                }),
            _ => None,
        };
        if link.send(&SupervisorMsg::Adopted).await.is_err() {
            last = "the shim hung up during reattach".into();
            continue;
        }
        drop(listener);
        let _ = std::fs::remove_file(&g.socket);
        let entry = crate::adapter::RuntimeRef::parse(&g.runtime)
            .ok()
            .and_then(|r| inner.registry.resolve(&r).ok().cloned());
        let (graceful, grace) = match entry {
            Some(e) => (
                e.graceful_signal()
                    .unwrap_or(nix::sys::signal::Signal::SIGTERM),
                e.grace_period(),
            ),
            None => (
                nix::sys::signal::Signal::SIGTERM,
                Duration::from_millis(g.grace_period_ms),
            ),
        };
        let gateway = harness
            .gateway_fd
            .and_then(|fd| reserve_gateway(inner, g, &shim_pidfd, fd));
        // An activated generation's workspace is open (unless fenced or held), any other's
        // closed: again, in case
        // the old process died between switching it and recording why (idempotent
        // otherwise). One that cannot be opened stays read-only (it writes nothing it was
        // not allowed to); one that cannot be closed is frozen until it is ended.
        if g.workspace.is_some() && harness.exit.is_none() {
            let open = g.workspace_open();
            let switched = super::start::open_workspace(g, open).await;
            // Open: nothing may keep it frozen (a checkpoint its harness asked for, or a
            // hold, cut by the crash between freezing it and thawing it).
            if open && switched.is_ok() {
                if let Err(e) = inner.tree.at_abs(&g.cgroup).thaw() {
                    tracing::error!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                        "cannot thaw the re-adopted generation");
                }
            }
            if let Err(e) = switched {
                tracing::error!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                    "cannot switch the re-adopted generation's workspace");
                if !open {
                    let cg = inner.tree.at_abs(&g.cgroup);
                    let frozen = tokio::task::spawn_blocking(move || {
                        cg.freeze_and_wait(std::time::Duration::from_secs(5))
                            .map_err(|e| e.to_string())
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
                    if let Err(e) = frozen {
                        tracing::error!(lane_id = %g.lane_id, error = %e, "cannot freeze it either");
                    }
                }
            }
        }
        tracing::info!(lane_id = %g.lane_id, generation = g.generation, root_pid = pid, "generation re-adopted");
        let w = Watcher {
            inner: inner.clone(),
            rec: g.clone(),
            link: Some(link),
            shim_pidfd: Some(shim_pidfd),
            harness_pidfd,
            graceful,
            grace,
            // A restarted supervisor does not resume a coordinated chain mid-way (the
            // coordinator's expiry handles it), but a generation whose chain fields were
            // recorded (at injection) gets its lane socket served again: activated, its
            // harness goes on reporting and taking continuations; not yet recorded as
            // activated, it takes the activation the coordinator sends again.
            lane_server: reserve_lane_socket(inner, g),
            gateway,
        };
        return Ok((w, harness.exit));
    }
}

/// The broker's listener of a re-adopted generation, served again on the listener its shim
/// kept (requests made while no supervisor ran waited in its backlog), with the credentials
/// read again from the runtime's file. A provider no longer declared answers its requests
/// 404; credentials that cannot be read are refused per request with the reason.
fn reserve_gateway(
    inner: &Arc<Inner>,
    g: &GenRecord,
    shim: &std::os::fd::OwnedFd,
    fd: i32,
) -> Option<super::gateway::Gateway> {
    let runtime = crate::adapter::RuntimeRef::parse(&g.runtime).ok()?.runtime;
    let upstream = inner.cfg.providers.get(&runtime).cloned();
    let secrets = match inner.cfg.credentials.get(&runtime) {
        None => Ok(Vec::new()),
        Some(path) => crate::adapter::credentials::load(&runtime, path)
            .map(|v| {
                v.into_iter()
                    .map(|(k, v)| (super::gateway::placeholder(&k), v))
                    .collect()
            })
            .map_err(|e| {
                tracing::error!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                    "cannot read the re-adopted generation's credentials; its provider requests are refused");
                "the supervisor cannot read this runtime's credentials (see its log)".to_string()
            }),
    };
    let listener = match super::harness::take_listener(shim, fd) {
        Ok(l) => l,
        Err(e) => {
            tracing::warn!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                "cannot take the re-adopted generation's gateway listener; its provider requests go unanswered");
            return None;
        }
    };
    let route = super::gateway::Route {
        lane_id: g.lane_id.clone(),
        generation: g.generation,
        runtime,
        upstream,
        secrets,
        broker: inner.broker.clone(),
    };
    match super::gateway::serve(listener, route, inner.metrics.clone()) {
        Ok(gw) => Some(gw),
        Err(e) => {
            tracing::warn!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                "cannot serve the re-adopted generation's gateway");
            None
        }
    }
}

/// The lane socket of a re-adopted coordinated generation, served again at the path its
/// harness already knows, answering only that generation's cgroup. Nothing for a
/// generation whose chain fields were never recorded (its contract was never reported
/// delivered, so it was never activated).
fn reserve_lane_socket(inner: &Arc<Inner>, g: &GenRecord) -> Option<super::lanesock::LaneServer> {
    // Served whether or not the activation was recorded: a supervisor that died between
    // the coordinator's activation and its own record takes the re-sent activation here
    // (until then the session is not active, and the lane socket answers as before it).
    let c = g.coord.as_ref()?;
    let digest = c
        .chain_fields
        .as_ref()?
        .get("contracts_digest")?
        .as_str()?
        .to_string();
    let session = super::lanesock::GenSession::new();
    // The results the harness gave a previous supervisor process: answered again from here.
    session.keep_results_at(
        inner
            .store
            .continuation_results_path(&g.lane_incarnation_id, g.generation),
    );
    session.keep_conversation_at(
        inner
            .store
            .conversation_path(&g.lane_incarnation_id, g.generation),
    );
    if let Some(family) = crate::adapter::RuntimeRef::parse(&g.runtime)
        .ok()
        .and_then(|r| inner.registry.resolve(&r).ok().map(|e| e.family))
    {
        session.bind_harness(family, g.conversation_id.clone());
    }
    session.delivered.send_replace(Some(digest));
    if c.activated {
        session.activation.send_replace(Some(Ok(())));
    }
    let _ = session.assignment_id.set(c.assignment_id.clone());
    if inner.cfg.confined(&g.lane) {
        let area = super::generation::harness_dir(inner, &g.lane_incarnation_id, g.generation);
        let _ = session.push.set(super::harness::push_ctx(inner, g, &area));
    }
    let path = super::lanesock::path_for(&g.socket);
    let cg = inner.tree.at_abs(&g.cgroup);
    let _ = std::fs::remove_file(&path);
    match super::lanesock::serve(&path, inner.tree.rel(cg.path()), session.clone(), g.uid) {
        Ok(server) => Some(server),
        Err(e) => {
            tracing::warn!(lane_id = %g.lane_id, generation = g.generation, error = %e,
                "cannot serve the re-adopted generation's lane socket; its reports are lost until it is replaced");
            None
        }
    }
}
