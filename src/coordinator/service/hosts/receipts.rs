//! Termination receipts and host reports: ingesting a receipt (acknowledged only once it is
//! durable in PostgreSQL), and reconciling a host's reported state against the rows.

use super::*;

impl Service {
    /// A termination receipt: ingested and reconciled, then acknowledged with a verdict —
    /// `ingested`, `retry:<category>` (the host sends it again later) or
    /// `refused:<category>` (it never will be ingestible).
    pub(super) async fn on_receipt(&self, host: &str, m: Receipt) -> Handled {
        let key = m.receipt_idempotency_key.clone();
        let verdict = match self.ingest_receipt(host, &m).await {
            Ok(()) => Verdict::Ingested,
            Err(e) => {
                let final_refusal = matches!(
                    e.category,
                    Category::NotOwner
                        | Category::Mismatch
                        | Category::BadInput
                        | Category::Conflict
                        | Category::NotFound
                );
                tracing::warn!(host, receipt_key = %key, category = e.category.as_str(), error = %e.message, "termination receipt not ingested");
                self.store.auditor().record(
                    "host-receipt",
                    e.category,
                    None,
                    None,
                    non_empty(&m.lane_incarnation_id),
                    &format!("host:{host} receipt {key}: {}", e.message),
                );
                let category = e.category.as_str().to_string();
                if final_refusal {
                    Verdict::Refused(category)
                } else {
                    Verdict::Retry(category)
                }
            }
        };
        // A host never has a receipt for a lane the coordinator does not know: for
        // receipts, `not-found` counts against the session too.
        let violation = match &verdict {
            Verdict::Refused(c) => Category::parse(c)
                .filter(|c| hostile(*c) || *c == Category::NotFound)
                .map(|c| format!("refused-{}", c.as_str())),
            _ => None,
        };
        let epoch = self.leadership.current().await.map(|l| l.epoch());
        let ack = Outgoing::to_host(
            &self.session,
            &ToHost::ReceiptAck(ReceiptAck {
                idempotency_key: format!("receipt-ack/{key}"),
                coordinator_epoch: epoch.map(|e| e as u64),
                session_id: m.session_id.clone(),
                receipt_idempotency_key: key,
                verdict,
            }),
        );
        Handled {
            replies: vec![ack],
            violation,
            deferred: None,
        }
    }

    pub(super) async fn ingest_receipt(&self, host: &str, m: &Receipt) -> Result<(), OpError> {
        let l = self.leader().await?;
        let body = &m.receipt;
        // The body must be about the very lane and generation the envelope names.
        let same = body["lane_id"].as_str() == Some(m.lane_id.as_str())
            && body["lane_incarnation_id"].as_str() == Some(m.lane_incarnation_id.as_str())
            && body["generation"].as_u64() == Some(m.generation)
            && body["idempotency_key"].as_str() == Some(m.receipt_idempotency_key.as_str())
            && body["host_id"].as_str() == Some(host);
        if !same {
            return Err(OpError::new(
                Category::Mismatch,
                "the receipt body names another lane, generation, key or host than its envelope",
            ));
        }
        let (rec, r) = self
            .step(&l, self.store.ingest_termination(&l, host, body).await)
            .await?;
        tracing::info!(
            receipt_key = %body["idempotency_key"].as_str().unwrap_or(""),
            lane_id = %m.lane_id,
            generation = m.generation,
            reason = %body["termination_reason"].as_str().unwrap_or(""),
            ?rec,
            replayed = r.replayed,
            "termination receipt reconciled"
        );
        if matches!(rec, Reconciliation::Retiring { .. }) {
            match self.store.finish(&l, &m.lane_incarnation_id).await {
                Ok(_) => self.bump(),
                Err(e) => {
                    self.note(&l, &e).await;
                    tracing::warn!(error = %e, "finish after the receipt failed; the watchdog retries");
                }
            }
        }
        Ok(())
    }

    /// A hello: adopt the lanes it names, record what the host advertises, and reconcile.
    /// A host's state: the hello that opened its session, or a `report` after a change.
    pub(super) async fn on_state(&self, host: &str, m: HostState) -> Result<(), OpError> {
        if m.host_id != host {
            return Err(OpError::new(
                Category::NotOwner,
                "the report names another host",
            ));
        }
        let l = self.leader().await?;
        // The whole report is refused (and nothing adopted) if any entry is not a lane
        // name and incarnation as hosts make them, or there are more than a host may have.
        let HostState {
            hello,
            session_id,
            lanes,
            runtimes,
            lane_states: report,
            ..
        } = m;
        let lanes_ok = lanes.len() <= report::MAX_LANES
            && lanes.iter().all(|l| {
                l.split_once('@')
                    .is_some_and(|(n, i)| report::lane_name_ok(n) && report::incarnation_ok(i))
            });
        let runtimes_ok = runtimes.len() <= report::MAX_RUNTIMES
            && runtimes.iter().all(|r| report::id_ok(r) && r.len() <= 64);
        if !lanes_ok || !runtimes_ok {
            return Err(OpError::new(
                Category::BadInput,
                format!(
                    "the report's {} are not valid (at most {} lanes named 1-32 of A-Za-z0-9-_, each with an li- incarnation; at most {} runtimes)",
                    if lanes_ok { "runtimes" } else { "lanes" },
                    report::MAX_LANES,
                    report::MAX_RUNTIMES
                ),
            ));
        }
        if self.hosts.runtimes_changed(host, &session_id, &runtimes) {
            self.store.record_host(host, &runtimes).await?;
            self.hosts.runtimes_recorded(host, &session_id, runtimes);
        }
        // Lanes already registered as reported, with no lease waiting for them, need
        // nothing here (unreadable: each lane takes the path below).
        let known = match self.store.lanes_registered(host).await {
            Ok(k) => k,
            Err(e) => {
                tracing::debug!(host, error = %e, "registered lanes unreadable; each reported lane is checked");
                Default::default()
            }
        };
        // `known` is read once, before any lane is taken in: it answers only for a lane's
        // first mention (a report naming a lane twice has each later mention checked).
        let mut mentioned = std::collections::HashSet::new();
        for lane in lanes {
            let Some((name, inc)) = lane.split_once('@') else {
                continue;
            };
            let lane_id = format!("{host}:{name}");
            if mentioned.insert(lane_id.clone())
                && known
                    .get(&lane_id)
                    .is_some_and(|(i, waiting)| i.as_deref() == Some(inc) && !waiting)
            {
                continue;
            }
            if let Err(e) = self
                .store
                .adopt_lane_incarnation(&l, host, &lane_id, inc)
                .await
            {
                self.note(&l, &e).await;
                tracing::warn!(lane_id, error = %e, "lane not registered");
            } else {
                // The lane of a lease the host was told to make: the lease holds it now.
                match self.store.bind_lease(&l, &lane_id, inc).await {
                    Ok(Some(_)) => {
                        tracing::info!(
                            lane_id,
                            lane_incarnation_id = inc,
                            "elastic lane made by its host: leased"
                        );
                    }
                    // (An elastic lane's name no lease holds was adopted closed to work:
                    // `leases_to_destroy` has it destroyed.)
                    Ok(None) => {}
                    Err(e) => {
                        self.note(&l, &e).await;
                        tracing::warn!(lane_id, error = %e, "elastic lane not bound to its lease");
                    }
                }
                self.bump();
            }
        }
        // A session's hello resends whatever every chain of the host waits for; a later
        // report (the host's state changed) only reconciles what it reports.
        self.reconcile_report(&l, host, Some(&report), hello).await;
        if hello {
            self.resend_hand_on_orders(&l, host).await;
        }
        Ok(())
    }

    /// Reconciles a host: what its report shows against the database, then every live
    /// chain of the host driven on (each resends what it waits for).
    pub(crate) async fn reconcile_host(&self, l: &Leader, host: &str, report: Option<&HostReport>) {
        self.reconcile_report(l, host, report, true).await
    }

    /// The host's orders for elastic lanes: make the lane of each lease waiting for it,
    /// destroy the incarnation of each lease whose destruction was decided.
    pub(crate) async fn lease_orders(&self, host: &str, orders: &mut BTreeMap<String, LaneOrder>) {
        match self.store.leases_to_create(host).await {
            Ok(lanes) => {
                for lane_id in lanes {
                    orders.entry(lane_id).or_default().create = true;
                }
            }
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot list the leases waiting for their lane")
            }
        }
        match self.store.leases_to_destroy(host).await {
            Ok(lanes) => {
                for (lane_id, inc) in lanes {
                    let o = orders.entry(lane_id).or_default();
                    o.incarnation = inc;
                    o.destroy = true;
                }
            }
            Err(e) => tracing::warn!(host, error = %e, "cannot list the leases being destroyed"),
        }
    }

    pub(super) async fn reconcile_report(
        &self,
        l: &Leader,
        host: &str,
        report: Option<&HostReport>,
        resend: bool,
    ) {
        let lanes = match self.store.lanes_of_host(host).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot reconcile");
                return;
            }
        };
        // Every chain this pass looks at, read at once: one read per report, not one per
        // generation of every lane of the host.
        let lane_name = |lane_id: &str| lane_id.split_once(':').map_or("", |(_, n)| n).to_string();
        let wanted: Vec<(String, i64)> = lanes
            .iter()
            .flat_map(|lane| {
                let inc = &lane.lane_incarnation_id;
                let reported: Vec<i64> = report
                    .and_then(|r| r.get(&lane_name(&lane.lane_id)))
                    .filter(|r| &r.lane_incarnation_id == inc)
                    .map(|r| r.generations.iter().map(|g| g.generation as i64).collect())
                    .unwrap_or_default();
                reported
                    .into_iter()
                    .chain(lane.unended_generation)
                    .map(move |g| (inc.clone(), g))
            })
            .collect();
        let mut chains: HashMap<(String, i64), ChainRow> =
            match self.store.chains_of_generations(&wanted).await {
                Ok(v) => v
                    .into_iter()
                    .filter_map(|c| Some(((c.chain.lane_incarnation_id.clone(), c.generation?), c)))
                    .collect(),
                Err(e) => {
                    tracing::warn!(host, error = %e, "cannot reconcile");
                    return;
                }
            };
        let mut orders: BTreeMap<String, LaneOrder> = BTreeMap::new();
        for lane in lanes {
            let name = lane_name(&lane.lane_id);
            let name = name.as_str();
            let inc = lane.lane_incarnation_id.clone();
            let rep = report
                .and_then(|r| r.get(name))
                .filter(|r| r.lane_incarnation_id == inc);
            let mut end: BTreeSet<i64> = BTreeSet::new();
            let (mut hold, mut release) = (BTreeSet::new(), BTreeSet::new());
            // A recreate the coordinator ordered retires the old incarnation when the new
            // one is reported (`adopt_lane_incarnation`), with the recreate's meaning.
            if rep.is_some_and(|r| r.status == "destroyed") && !lane.recreate_requested {
                // The host tore the lane down (verified) and says so: it is gone here too,
                // before anything else can be reserved on it.
                let r = self
                    .store
                    .retire_destroyed_lane(l, host, &lane.lane_id, &inc)
                    .await;
                if self.step(l, r).await.is_ok() {
                    tracing::info!(lane_id = %lane.lane_id, incarnation = %inc, "the host destroyed the lane: retired");
                }
                continue;
            }
            if let Some(rep) = rep {
                if rep.status == "quarantined" {
                    let reason = format!(
                        "host: {}",
                        rep.quarantine_reason.clone().unwrap_or_default()
                    );
                    if lane.host_quarantine_reason.as_deref() != Some(reason.as_str()) {
                        let r = self
                            .store
                            .host_quarantine(
                                l,
                                &inc,
                                rep.quarantine_reason.as_deref().unwrap_or("quarantined"),
                            )
                            .await;
                        if self.step(l, r).await.is_ok() {
                            tracing::warn!(lane_id = %lane.lane_id, reason, "the host quarantined the lane");
                            // The quarantine asked this lane's generations to end: read
                            // their chains again, so this pass orders it.
                            let again: Vec<(String, i64)> = rep
                                .generations
                                .iter()
                                .map(|g| (inc.clone(), g.generation as i64))
                                .chain(lane.unended_generation.map(|u| (inc.clone(), u)))
                                .collect();
                            if let Ok(v) = self.store.chains_of_generations(&again).await {
                                for c in v {
                                    if let Some(g) = c.generation {
                                        chains.insert((inc.clone(), g), c);
                                    }
                                }
                            }
                        }
                    }
                }
                for g in &rep.generations {
                    let gen = g.generation as i64;
                    match chains.get(&(inc.clone(), gen)) {
                        None => {
                            end.insert(gen);
                        }
                        Some(c)
                            if c.stop_requested || c.generation_state == Some(GenState::Ended) =>
                        {
                            end.insert(gen);
                        }
                        Some(c)
                            if c.lane_state.is_preactivation()
                                && c.reservation_open
                                && !g.chain_held =>
                        {
                            let r = self.store.end_chain(l, &c.chain, EndCause::Abandoned).await;
                            if self.step(l, r).await.is_ok() {
                                tracing::warn!(lane_id = %lane.lane_id, generation = gen, "the host lost the chain before activation: ended in recovery");
                            }
                            end.insert(gen);
                        }
                        Some(c)
                            if c.lane_state == LaneState::Running
                                && c.reservation_open
                                && !g.activated =>
                        {
                            self.push_activated(l, c).await;
                        }
                        // A handoff offer holds the source's workspace; its end releases it
                        // (`holds.rs`): the host's `held` agrees with the database.
                        Some(c) if !g.held && c.workspace_held() => {
                            hold.insert(gen);
                        }
                        Some(c) if g.held && c.workspace_releasable() => {
                            release.insert(gen);
                        }
                        Some(_) => {}
                    }
                }
            }
            // A generation the coordinator asked to end — or one the host reported live
            // (`staged`) and now no longer lists — is over on the host: it answers with its
            // receipt (sent again if it was lost), or fences it as never started.
            if let Some(u) = lane.unended_generation {
                if let Some(c) = chains.remove(&(inc.clone(), u)) {
                    let gone = rep.is_some_and(|r| {
                        c.generation_state == Some(GenState::Live)
                            && !r.generations.iter().any(|g| g.generation as i64 == u)
                    });
                    if c.stop_requested || gone {
                        end.insert(u);
                    }
                }
            }
            if !end.is_empty() || !hold.is_empty() || !release.is_empty() || lane.recreate_requested
            {
                orders.insert(
                    lane.lane_id.clone(),
                    LaneOrder {
                        incarnation: inc,
                        end,
                        hold,
                        release,
                        recreate: lane.recreate_requested,
                        ..LaneOrder::default()
                    },
                );
            }
        }
        self.lease_orders(host, &mut orders).await;
        self.push_reconcile(l, host, &orders).await;
        if resend {
            self.advance_all(l, Some(host)).await;
        }
    }
}
