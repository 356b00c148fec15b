//! The transport's handler for host sessions: admission (a connected, certificate-named
//! host), the hello, and each verified frame routed to its message handler.

use super::*;

pub(crate) struct HostHandler(pub Arc<Service>);

pub(super) fn host_of(peer: &str) -> Option<&str> {
    peer.strip_prefix("host:").filter(|h| !h.is_empty())
}

/// How long a session challenge stays valid.
pub(super) const CHALLENGE_TTL_MS: i64 = 10_000;

impl Handler for HostHandler {
    fn admit(&self, peer: &str) -> BoxFuture<'static, Result<Admission, transport::Refusal>> {
        let svc = self.0.clone();
        let peer = peer.to_string();
        Box::pin(async move {
            let Some(host) = host_of(&peer) else {
                return Err(transport::Refusal::NotAPeer(format!(
                    "{peer} is not a host principal"
                )));
            };
            let Some(l) = svc.leadership.current().await else {
                return Err(transport::Refusal::NotLeader);
            };
            if let Some(why) = svc.hosts.refusal(host, &svc.timing.liveness) {
                return Err(transport::Refusal::Busy(why));
            }
            let (issued_at, expires_at) = svc
                .store
                .db_now_and(CHALLENGE_TTL_MS)
                .await
                .map_err(|e| transport::Refusal::Unavailable(format!("database: {e}")))?;
            Ok(Admission {
                sot_incarnation: Some(l.sot().to_string()),
                coordinator_epoch: Some(l.epoch() as u64),
                issued_at,
                expires_at,
            })
        })
    }

    fn open(
        &self,
        session: SessionHandle,
        hello: &Envelope<Verified>,
    ) -> BoxFuture<'static, Result<(), transport::Refusal>> {
        let svc = self.0.clone();
        let host_field = FromHostSession::host_named(hello);
        Box::pin(async move {
            let Some(host) = host_of(&session.peer).map(String::from) else {
                return Err(transport::Refusal::NotAPeer("not a host principal".into()));
            };
            match host_field {
                Ok(h) if h == host => {}
                Ok(_) => {
                    return Err(transport::Refusal::BadHello(
                        "the hello names another host".into(),
                    ))
                }
                Err(e) => return Err(transport::Refusal::BadHello(e.to_string())),
            }
            if let Some(ms) = session.clock_offset_ms {
                svc.metrics
                    .host_clock_offset
                    .get_or_create(&crate::coordinator::metrics::HostLabel { host: host.clone() })
                    .set(ms);
            }
            let l = svc
                .leader()
                .await
                .map_err(|_| transport::Refusal::NotLeader)?;
            // Checked again: another session may have been admitted since the challenge.
            if let Some(why) = svc.hosts.refusal(&host, &svc.timing.liveness) {
                return Err(transport::Refusal::Busy(why));
            }
            let epoch = svc
                .store
                .open_host_session(&host, &session.session_id, l.epoch())
                .await
                .map_err(|e| {
                    transport::Refusal::Unavailable(format!("cannot record the session: {e}"))
                })?;
            let sid = session.session_id.clone();
            if let Some((old, why)) = svc
                .hosts
                .install(&host, session, epoch, &svc.timing.liveness)
            {
                let reason = why.to_string();
                tracing::warn!(
                    host,
                    old_session_epoch = old.session_epoch,
                    session_epoch = epoch,
                    reason = %reason,
                    "host session replaced"
                );
                svc.store.auditor().record(
                    "host-session",
                    Category::Conflict,
                    Some(l.epoch()),
                    None,
                    None,
                    &format!("host:{host} session epoch {}: {reason}", old.session_epoch),
                );
                let _ = svc.store.close_host_session(&old.session_id, &reason).await;
            }
            tracing::info!(host, session_epoch = epoch, session_id = %sid, "host session open");
            svc.metrics.sessions_opened.inc();
            svc.bump();
            Ok(())
        })
    }

    fn handle(&self, peer: String, env: Envelope<Verified>) -> BoxFuture<'static, Handled> {
        let svc = self.0.clone();
        Box::pin(async move {
            let Some(host) = host_of(&peer).map(String::from) else {
                return Handled::default();
            };
            let t = env.message_type();
            let started = std::time::Instant::now();
            tracing::debug!(host, message_type = t.as_str(), "host message");
            // Identifiers are looked up, logged and echoed: refuse any that is not shaped
            // like one Mosaic mints, without repeating it.
            if let Some(field) = crate::protocol::messages::malformed_identifier(&env) {
                svc.metrics
                    .host_messages_refused
                    .get_or_create(&crate::coordinator::metrics::TypeCategory {
                        message_type: t.as_str().into(),
                        category: "bad-input".into(),
                    })
                    .inc();
                tracing::warn!(
                    host,
                    message_type = t.as_str(),
                    field,
                    "host message refused: malformed identifier"
                );
                return Handled {
                    replies: vec![],
                    violation: Some(format!("malformed-{field}")),
                    deferred: None,
                };
            }
            // A chain message becomes its typed struct here, once; its handler never reads
            // the envelope's fields.
            let out = match decode(&env) {
                Err(e) => Err(OpError::new(Category::BadInput, e.to_string())),
                // Effects are answered whatever the outcome (the broker waits for it), so they
                // say themselves whether they were hostile; nothing else on the session waits
                // on them, so they run beside the frames that follow (each claim is its own
                // transition; its order against the chain's is the database's).
                Ok(Some(Either::Chain(m)))
                    if matches!(
                        *m,
                        FromHostChain::Effect(_) | FromHostChain::EffectResult(_)
                    ) =>
                {
                    let work = async move {
                        let (replies, violation) = match *m {
                            FromHostChain::Effect(m) => svc.on_effect(&host, m).await,
                            FromHostChain::EffectResult(m) => svc.on_effect_result(&host, m).await,
                            _ => (vec![], None),
                        };
                        Handled {
                            replies,
                            violation,
                            deferred: None,
                        }
                    };
                    return Handled::defer(Box::pin(work));
                }
                Ok(Some(Either::Chain(m))) => svc.on_chain(&host, *m).await.map(|()| vec![]),
                Ok(Some(Either::Session(m))) => match m {
                    FromHostSession::State(m) => svc.on_state(&host, m).await.map(|()| vec![]),
                    FromHostSession::Receipt(m) => return svc.on_receipt(&host, m).await,
                    FromHostSession::Heartbeat => Ok(vec![]),
                    FromHostSession::CheckpointUpload(m) => {
                        return svc.on_checkpoint_upload(&host, m).await
                    }
                    FromHostSession::CheckpointFetch(m) => {
                        return svc.on_checkpoint_fetch(&host, m).await
                    }
                    FromHostSession::WorkspaceRelease(m) => {
                        return svc.on_workspace_release(&host, m).await
                    }
                    FromHostSession::WorkspaceEffect(m) => {
                        return svc.on_workspace_effect(&host, m).await
                    }
                    FromHostSession::RecoveryAck(m) => {
                        svc.on_recovery_ack(&host, *m).await.map(|()| vec![])
                    }
                },
                Ok(None) => Err(OpError::new(
                    Category::BadInput,
                    format!("hosts do not send {}", t.as_str()),
                )),
            };
            tracing::debug!(
                host,
                message_type = t.as_str(),
                micros = started.elapsed().as_micros() as u64,
                "host message handled"
            );
            match out {
                Ok(replies) => Handled::reply(replies),
                Err(e) => {
                    svc.metrics
                        .host_messages_refused
                        .get_or_create(&crate::coordinator::metrics::TypeCategory {
                            message_type: t.as_str().into(),
                            category: e.category.as_str().into(),
                        })
                        .inc();
                    tracing::warn!(host, message_type = t.as_str(), category = e.category.as_str(), error = %e.message, "host message refused");
                    svc.store.auditor().record(
                        &format!("host-{}", t.as_str()),
                        e.category,
                        None,
                        non_empty(env.assignment_id().unwrap_or("")),
                        non_empty(env.address().lane_incarnation_id.unwrap_or("")),
                        &format!("host:{host} message {}: {}", env.message_id(), e.message),
                    );
                    Handled {
                        replies: vec![],
                        violation: hostile(e.category)
                            .then(|| format!("refused-{}", e.category.as_str())),
                        deferred: None,
                    }
                }
            }
        })
    }

    fn closed(&self, peer: &str, session_id: &str, reason: &transport::CloseReason) {
        let abusive = reason.abusive();
        let Some(host) = host_of(peer).map(String::from) else {
            return;
        };
        let svc = self.0.clone();
        svc.hosts.remove(&host, session_id);
        if abusive {
            svc.hosts.penalize(&host);
        }
        let kind = reason.kind();
        svc.metrics
            .sessions_closed
            .get_or_create(&crate::coordinator::metrics::Kind { kind: kind.into() })
            .inc();
        svc.bump();
        tracing::info!(host, session_id, %reason, abusive, "host session closed");
        let (sid, reason) = (session_id.to_string(), reason.to_string());
        tokio::spawn(async move {
            let _ = svc.store.close_host_session(&sid, &reason).await;
        });
    }
}

/// Refusals that a well-behaved host never provokes: they count against the session's
/// invalid-frame budget. (Chain races — a late ACK, an expired reservation — do not.)
pub(super) fn hostile(c: Category) -> bool {
    matches!(
        c,
        Category::NotOwner | Category::Mismatch | Category::BadInput | Category::FenceMismatch
    )
}

pub(super) fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// Checks that an ordinary host message is about a chain of this host, and that every
/// chain field it carries is that chain's: lane, incarnation, assignment, attempt,
/// generation, the timeline and epoch the chain was staged under, and the fence
/// commitment of its generation.
pub(super) fn owned(
    host: &str,
    m: &crate::protocol::messages::ChainRef,
    c: &ChainRow,
    l: &Leader,
    fence_commitment: &str,
) -> Result<(), OpError> {
    if c.host_id != host {
        return Err(OpError::new(
            Category::NotOwner,
            format!(
                "reservation {} is on a lane of another host",
                c.chain.reservation_id
            ),
        ));
    }
    let ch = &c.chain;
    let checks: [(&str, Option<String>, String); 7] = [
        ("lane_id", Some(m.lane_id.clone()), ch.lane_id.clone()),
        (
            "lane_incarnation_id",
            Some(m.lane_incarnation_id.clone()),
            ch.lane_incarnation_id.clone(),
        ),
        (
            "assignment_id",
            Some(m.assignment_id.clone()),
            ch.assignment_id.clone(),
        ),
        (
            "assignment_attempt_id",
            Some(m.assignment_attempt_id.clone()),
            ch.assignment_attempt_id.clone(),
        ),
        (
            "generation",
            Some(m.generation.to_string()),
            c.generation.map(|g| g.to_string()).unwrap_or_default(),
        ),
        (
            "sot_incarnation",
            Some(m.sot_incarnation.clone()),
            l.sot().to_string(),
        ),
        (
            "coordinator_epoch",
            Some(m.coordinator_epoch.to_string()),
            c.reservation_coordinator_epoch.to_string(),
        ),
    ];
    for (field, got, want) in &checks {
        if got.as_deref() != Some(want.as_str()) {
            return Err(OpError::new(
                Category::Mismatch,
                format!("{field} does not match reservation {}", ch.reservation_id),
            ));
        }
    }
    if !crate::util::ct::eq(m.fence_proof.as_bytes(), fence_commitment.as_bytes()) {
        return Err(OpError::new(
            Category::FenceMismatch,
            format!(
                "fence_proof is not the commitment of reservation {}'s generation",
                ch.reservation_id
            ),
        ));
    }
    Ok(())
}

/// A host message, typed: a chain message or a session message.
enum Either {
    Chain(Box<FromHostChain>),
    Session(FromHostSession),
}

/// The one place a host's envelope becomes its typed message; `Ok(None)` for a type hosts
/// do not send.
fn decode(
    env: &Envelope<Verified>,
) -> Result<Option<Either>, crate::protocol::messages::WireError> {
    if let Some(m) = FromHostChain::decode(env)? {
        return Ok(Some(Either::Chain(Box::new(m))));
    }
    Ok(FromHostSession::decode(env)?.map(Either::Session))
}
