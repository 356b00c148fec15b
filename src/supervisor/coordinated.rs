//! The supervisor under a coordinator: it executes the host's side of the activation chain
//! and never decides it.
//!
//! stage → start the coordinator-allocated generation, report its verified identity
//! (`staged`) — or, if it cannot be started, write a `never-started` receipt, which ends the
//! coordinator's chain at once → contract → hand it to the harness over the lane socket;
//! once the harness fetched it, report the exact digest delivered (`injected`) → challenge
//! → when the harness asks to ACK, sign an `ack` binding every §8 field, the process
//! identity included → control `activate` → record it durably, then tell the harness.
//! `reconcile` → end the listed generations (stop them, or fence them as never started) and
//! recreate the listed lanes.
//!
//! Every message is handled idempotently (a duplicate stage re-sends `staged`), because the
//! coordinator resends whatever a chain waits for after any fault. A restarted supervisor
//! rebuilds its generation gate and chain map from its generation records.
//!
//! **Never:** delivers an envelope for a generation that is not the lane's current one
//! (`GenerationGate`; rejections are audited without payload), gives the harness a key,
//! starts a generation that already has a receipt, or acts on a coordinator message it
//! could not verify (the link verifies first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::lanesock::{Contract, GenSession, HarnessReport};
use super::link::HostDispatch;
use super::state::CoordBinding;
use super::Supervisor;
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s, Signer};
use crate::protocol::queue::GenerationGate;
use crate::protocol::report::{self, Reconcile};
use crate::protocol::schema::MessageType;
use crate::protocol::transport::Outgoing;
use crate::protocol::{Envelope, Verified};

/// One coordinated generation's host-side state.
struct ChainCtx {
    lane_incarnation_id: String,
    generation: u64,
    runtime: String,
    binding: CoordBinding,
    /// The stage as received (absent for a generation re-adopted after a restart).
    stage: Option<Envelope<Verified>>,
    /// The harness's hand-off points (absent after a restart: they died with the old
    /// supervisor process).
    session: Option<Arc<GenSession>>,
    identity: Value,
    contract: Mutex<Option<Envelope<Verified>>>,
    challenge: tokio::sync::watch::Sender<Option<String>>,
    /// The handoff challenge of a handoff target's generation (spec §8.1).
    handoff: tokio::sync::watch::Sender<Option<Envelope<Verified>>>,
    /// Continuation claims this host is waiting to accept (until the harness settles).
    offers: Mutex<std::collections::HashSet<String>>,
    /// The chain fields of this generation's reports (known once its contract is; restored
    /// from the generation record after a restart).
    report_fields: Mutex<Option<Vec<(&'static str, Value)>>>,
}

/// The chain fields a host report carries, in the order they are recorded.
const REPORT_KEYS: [&str; 15] = [
    "sot_incarnation",
    "coordinator_epoch",
    "assignment_id",
    "lane_id",
    "lane_incarnation_id",
    "assignment_attempt_id",
    "reservation_id",
    "generation",
    "fence_proof",
    "reservation_epoch",
    "reservation_deadline",
    "runtime_id",
    "contracts_digest",
    "scope_digest",
    "holds_digest",
];

/// Report fields from their recorded form: exactly the known keys, strings and integers.
fn fields_from_record(v: &serde_json::Value) -> Option<Vec<(&'static str, Value)>> {
    REPORT_KEYS
        .iter()
        .map(|k| {
            let x = v.get(*k)?;
            Some((
                *k,
                match x {
                    serde_json::Value::String(t) => s(t),
                    serde_json::Value::Number(u) => n(u.as_u64()?),
                    _ => return None,
                },
            ))
        })
        .collect()
}

fn fields_to_record(f: &[(&'static str, Value)]) -> serde_json::Value {
    crate::protocol::canonical::to_json(&Value::Object(
        f.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
    ))
}

pub struct CoordinatedHost {
    sup: Supervisor,
    signer: Arc<Signer>,
    out: mpsc::Sender<Outgoing>,
    chains: Mutex<HashMap<String, Arc<ChainCtx>>>,
    gate: Mutex<GenerationGate>,
    /// One stage at a time per lane, so a duplicate stage finds the first one's result.
    staging: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn identity_value(id: &super::identity::ProcessIdentity) -> Value {
    Value::Object(vec![
        ("boot_id".into(), s(&id.boot_id)),
        ("cgroup_id".into(), n(id.cgroup_id)),
        ("cgroup_path".into(), s(&id.cgroup_path)),
        ("exe_dev".into(), n(id.exe_dev)),
        ("exe_ino".into(), n(id.exe_ino)),
        ("launch_nonce_digest".into(), s(&id.launch_nonce_digest.0)),
        ("root_pid".into(), n(id.root_pid as u64)),
        ("root_start_time".into(), n(id.root_start_time)),
    ])
}

impl CoordinatedHost {
    /// Builds the host's chain state, rebuilding the gate and chain map from the
    /// supervisor's live generations (a restarted supervisor re-adopted them).
    pub async fn new(
        sup: Supervisor,
        signer: Arc<Signer>,
        out: mpsc::Sender<Outgoing>,
    ) -> Arc<Self> {
        let host = Arc::new(Self {
            sup,
            signer,
            out,
            chains: Mutex::new(HashMap::new()),
            gate: Mutex::new(GenerationGate::new()),
            staging: Mutex::new(HashMap::new()),
        });
        match host.sup.status().await {
            Ok(st) => {
                for lane in st.lanes {
                    let Some(g) = lane.generation else { continue };
                    let Some(binding) = host.sup.binding(&lane.lane, g.generation).await else {
                        continue;
                    };
                    let restored = binding.chain_fields.as_ref().and_then(fields_from_record);
                    // Served again by the re-adoption when it was activated and its fields
                    // recorded (see `adopt::reserve_lane_socket`).
                    let session = match &restored {
                        Some(_) => host.sup.session_of(&lane.lane, g.generation).await,
                        None => None,
                    };
                    if let Ok(mut gate) = host.gate.lock() {
                        let _ =
                            gate.advance(&lane.lane_id, &lane.lane_incarnation_id, g.generation);
                    }
                    let ctx = Arc::new(ChainCtx {
                        lane_incarnation_id: lane.lane_incarnation_id.clone(),
                        generation: g.generation,
                        runtime: g.runtime.clone(),
                        binding,
                        stage: None,
                        session: session.clone(),
                        identity: g
                            .process_identity
                            .as_ref()
                            .map(identity_value)
                            .unwrap_or(Value::Null),
                        contract: Mutex::new(None),
                        challenge: tokio::sync::watch::channel(None).0,
                        handoff: tokio::sync::watch::channel(None).0,
                        offers: Mutex::new(Default::default()),
                        report_fields: Mutex::new(restored),
                    });
                    if let Ok(mut m) = host.chains.lock() {
                        m.insert(lane.lane_id.clone(), ctx.clone());
                    }
                    if let Some(session) = session {
                        tracing::info!(lane_id = %lane.lane_id, generation = g.generation,
                            "re-adopted generation: its lane socket is served again");
                        tokio::spawn(host.clone().report_loop(ctx, session));
                    }
                }
            }
            Err(e) => tracing::error!(error = %e, "cannot rebuild the coordinated chain state"),
        }
        host
    }

    fn lane_name(&self, lane_id: &str) -> Option<String> {
        let (host, lane) = lane_id.split_once(':')?;
        (host == self.sup.config().host.as_str()).then(|| lane.to_string())
    }

    /// Queues a host envelope; the link seals it for the session that sends it.
    fn send(&self, t: MessageType, fields: Vec<(&'static str, Value)>) {
        tracing::debug!(message_type = t.as_str(), "to the coordinator");
        if self
            .out
            .try_send(Outgoing::new(&self.signer, t, fields))
            .is_err()
        {
            tracing::error!(
                message_type = t.as_str(),
                "coordinator link queue full; message dropped (the coordinator resends what the chain waits for)"
            );
        }
    }

    /// The chain fields every ordinary host message repeats from the stage.
    fn chain_fields(
        stage: &Envelope<Verified>,
        contract: Option<&Envelope<Verified>>,
    ) -> Vec<(&'static str, Value)> {
        let mut f = vec![
            ("sot_incarnation", s(stage.str("sot_incarnation"))),
            (
                "coordinator_epoch",
                n(stage.uint("coordinator_epoch").unwrap_or(0)),
            ),
            ("assignment_id", s(stage.str("assignment_id"))),
            ("lane_id", s(stage.str("lane_id"))),
            ("lane_incarnation_id", s(stage.str("lane_incarnation_id"))),
            (
                "assignment_attempt_id",
                s(stage.str("assignment_attempt_id")),
            ),
            ("reservation_id", s(stage.str("reservation_id"))),
            ("generation", n(stage.uint("generation").unwrap_or(0))),
            ("fence_proof", s(stage.str("fence_proof"))),
        ];
        if let Some(c) = contract {
            f.extend([
                (
                    "reservation_epoch",
                    n(stage.uint("reservation_epoch").unwrap_or(0)),
                ),
                ("reservation_deadline", s(stage.str("reservation_deadline"))),
                ("runtime_id", s(stage.str("runtime_id"))),
                ("contracts_digest", s(c.str("contracts_digest"))),
                ("scope_digest", s(c.str("scope_digest"))),
                ("holds_digest", s(c.str("holds_digest"))),
            ]);
        }
        f
    }

    fn send_staged(&self, ctx: &ChainCtx) {
        let Some(stage) = &ctx.stage else { return };
        let mut f = Self::chain_fields(stage, None);
        f.push((
            "idempotency_key",
            s(&format!("staged/{}", stage.str("reservation_id"))),
        ));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Staged, f);
    }

    fn chain_of(&self, lane_id: &str) -> Option<Arc<ChainCtx>> {
        self.chains.lock().ok()?.get(lane_id).cloned()
    }

    async fn on_stage(self: Arc<Self>, stage: Envelope<Verified>) {
        let lane_id = stage.str("lane_id").to_string();
        let inc = stage.str("lane_incarnation_id").to_string();
        let runtime = stage.str("runtime_id").to_string();
        let generation = stage.uint("generation").unwrap_or(0);
        let Some(lane) = self.lane_name(&lane_id) else {
            self.sup.audit_stale(
                "other-host",
                Some(&lane_id),
                Some(generation),
                stage.str("message_id"),
            );
            return;
        };
        if !crate::protocol::fence::is_commitment(stage.str("fence_proof")) {
            self.sup.audit_stale(
                "fence-proof-not-a-commitment",
                Some(&lane_id),
                Some(generation),
                stage.str("message_id"),
            );
            return;
        }
        let lock = match self.staging.lock() {
            Ok(mut m) => m.entry(lane_id.clone()).or_default().clone(),
            Err(_) => return,
        };
        let _one_stage_at_a_time = lock.lock().await;
        // A duplicate of the stage we already acted on: say `staged` again.
        if let Some(ctx) = self.chain_of(&lane_id) {
            if ctx.generation == generation
                && ctx.lane_incarnation_id == inc
                && ctx.binding.reservation_id == stage.str("reservation_id")
            {
                self.send_staged(&ctx);
                return;
            }
        }
        let binding = CoordBinding {
            reservation_id: stage.str("reservation_id").into(),
            assignment_id: stage.str("assignment_id").into(),
            assignment_attempt_id: stage.str("assignment_attempt_id").into(),
            sot_incarnation: stage.str("sot_incarnation").into(),
            coordinator_epoch: stage.uint("coordinator_epoch").unwrap_or(0),
            fence_proof: stage.str("fence_proof").into(),
            activated: false,
            chain_fields: None,
        };
        let session = GenSession::new();
        let started = self
            .sup
            .start_coordinated(
                &lane,
                &runtime,
                &inc,
                generation,
                session.clone(),
                binding.clone(),
            )
            .await;
        let view = match started {
            Ok(v) => v,
            Err(e) => {
                // Refused: a receipt says so, and the coordinator's chain ends at once.
                tracing::error!(lane_id, generation, error = %e, "cannot stage the generation; refusing it");
                if let Err(w) =
                    self.sup
                        .refuse_generation(&lane_id, &inc, generation, &runtime, &e.to_string())
                {
                    tracing::error!(lane_id, generation, error = %w, "cannot record the refusal; the coordinator's reservation will expire");
                }
                self.sup.publish_lanes().await;
                return;
            }
        };
        let Some(id) = view.process_identity else {
            return;
        };
        if let Ok(mut g) = self.gate.lock() {
            let _ = g.advance(&lane_id, &inc, generation);
        }
        let ctx = Arc::new(ChainCtx {
            lane_incarnation_id: inc,
            generation,
            runtime,
            binding,
            stage: Some(stage),
            session: Some(session),
            identity: identity_value(&id),
            contract: Mutex::new(None),
            challenge: tokio::sync::watch::channel(None).0,
            handoff: tokio::sync::watch::channel(None).0,
            offers: Mutex::new(Default::default()),
            report_fields: Mutex::new(None),
        });
        if let Ok(mut m) = self.chains.lock() {
            m.insert(lane_id.clone(), ctx.clone());
        }
        self.send_staged(&ctx);
        self.clone().bootstrap(&ctx, &lane_id);
        tokio::spawn(self.clone().drive(ctx));
    }

    /// For a harness whose session starts at its first prompt: type a bootstrap turn, so its
    /// session-start hook runs and takes the contract.
    fn bootstrap(self: Arc<Self>, ctx: &Arc<ChainCtx>, lane_id: &str) {
        let Some(session) = ctx.session.clone() else {
            return;
        };
        let family = session
            .harness
            .lock()
            .ok()
            .and_then(|h| h.as_ref().map(|(f, _)| *f));
        let Some(text) = family.and_then(|f| f.adapter().bootstrap_turn()) else {
            return;
        };
        let Some(lane) = self.lane_name(lane_id) else {
            return;
        };
        let tmux = self.sup.inner.tmux(&lane);
        let (lane_id, generation) = (lane_id.to_string(), ctx.generation);
        tokio::task::spawn_blocking(move || {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            // Only until the contract is delivered, and never into a successor's pane.
            let waiting = || session.activation.borrow().is_none();
            // Taken once its session-start hook took the contract.
            let taken = || session.delivered.borrow().is_some();
            match tmux.submit_line(&lane, text, text, deadline, &waiting, &taken) {
                Ok(()) => {
                    tracing::info!(%lane_id, generation, "bootstrap turn submitted in the pane")
                }
                Err(e) => {
                    tracing::warn!(%lane_id, generation, error = %e, "cannot submit the bootstrap turn")
                }
            }
        });
    }

    /// Waits for the harness to fetch the contract, reports it; waits for the challenge and
    /// the harness's ACK request, signs the ACK.
    async fn drive(self: Arc<Self>, ctx: Arc<ChainCtx>) {
        let (Some(session), Some(stage)) = (&ctx.session, &ctx.stage) else {
            return;
        };
        let mut delivered = session.delivered.subscribe();
        let Ok(digest) = delivered
            .wait_for(|d| d.is_some())
            .await
            .map(|d| d.clone().unwrap_or_default())
        else {
            return;
        };
        let contract = ctx.contract.lock().ok().and_then(|c| c.clone());
        let Some(contract) = contract else { return };
        if let Ok(mut r) = ctx.report_fields.lock() {
            *r = Some(Self::chain_fields(stage, Some(&contract)));
        }
        let mut f = Self::chain_fields(stage, Some(&contract));
        f.push((
            "idempotency_key",
            s(&format!("injected/{}", stage.str("reservation_id"))),
        ));
        f.push(("delivered_contracts_digest", s(&digest)));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Injected, f);
        // A handoff target's generation: its handoff ACK, when the harness asks for it and
        // the challenge is here, echoing every bound field of the challenge.
        {
            let (this, ctx, session, stage, contract) = (
                self.clone(),
                ctx.clone(),
                session.clone(),
                stage.clone(),
                contract.clone(),
            );
            tokio::spawn(async move {
                let mut asked = session.handoff_ack_requested.subscribe();
                if asked.wait_for(|a| *a).await.is_err() {
                    return;
                }
                let mut hc = ctx.handoff.subscribe();
                let Ok(h) = hc.wait_for(|h| h.is_some()).await.map(|h| h.clone()) else {
                    return;
                };
                let Some(h) = h else { return };
                this.send(
                    MessageType::HandoffAck,
                    handoff_ack_fields(&stage, &contract, &h, &ctx.identity),
                );
            });
        }
        let mut asked = session.ack_requested.subscribe();
        if asked.wait_for(|a| *a).await.is_err() {
            return;
        }
        let mut ch = ctx.challenge.subscribe();
        let Ok(challenge) = ch
            .wait_for(|c| c.is_some())
            .await
            .map(|c| c.clone().unwrap_or_default())
        else {
            return;
        };
        let mut f = Self::chain_fields(stage, Some(&contract));
        f.push(("idempotency_key", s(&format!("ack/{challenge}"))));
        f.push(("challenge_id", s(&challenge)));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Ack, f);
        // Then, for as long as the generation lives: its reports, signed for it.
        tokio::spawn(self.clone().report_loop(ctx.clone(), session.clone()));
    }

    /// For a harness that gets its activation check in its pane: type it in as a user turn.
    /// The ACK is then the model's answer, reported by the harness's turn-end hook.
    fn deliver_challenge(
        self: Arc<Self>,
        ctx: &Arc<ChainCtx>,
        session: Arc<GenSession>,
        lane_id: &str,
        phrase: String,
    ) {
        let family = session
            .harness
            .lock()
            .ok()
            .and_then(|h| h.as_ref().map(|(f, _)| *f));
        let Some(family) = family else { return };
        if family.adapter().challenge_delivery() != crate::adapter::ChallengeDelivery::PaneTurn {
            return;
        }
        let Some(lane) = self.lane_name(lane_id) else {
            return;
        };
        let tmux = self.sup.inner.tmux(&lane);
        let (lane_id, generation) = (lane_id.to_string(), ctx.generation);
        let bootstrapped = family.adapter().bootstrap_turn().is_some();
        tokio::task::spawn_blocking(move || {
            let marker = crate::adapter::ackline::challenge(&phrase);
            let line = crate::adapter::ackline::challenge_prompt(&phrase);
            // Bounded by the chain: the coordinator's challenge deadline ends a generation
            // that never answers.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
            // Only while this generation is the one waiting: never into a successor's pane.
            let waiting = || session.activation.borrow().is_none();
            // Never type into a running turn (where a keystroke could answer a dialog): wait
            // until the harness is idle — every started turn ended, and a bootstrap turn, if
            // the family needs one, finished.
            loop {
                let o = session.observations();
                if !o.busy && (!bootstrapped || o.settled >= 1) {
                    break;
                }
                if !waiting() || std::time::Instant::now() >= deadline {
                    tracing::warn!(%lane_id, generation, "the harness never went idle for its activation check");
                    return;
                }
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            // Only a turn that starts from here on answers the check.
            let started = session.observations().turns_started;
            session
                .answer_turns_after
                .store(started, std::sync::atomic::Ordering::SeqCst);
            // Taken once the harness started a turn for it (or it was already answered).
            let taken = || {
                *session.ack_requested.borrow() || session.observations().turns_started > started
            };
            match tmux.submit_line(&lane, &line, &marker, deadline, &waiting, &taken) {
                Ok(()) => {
                    tracing::info!(%lane_id, generation, "activation check submitted in the pane")
                }
                Err(e) => {
                    tracing::warn!(%lane_id, generation, error = %e, "cannot submit the activation check in the pane")
                }
            }
        });
    }

    /// Signs and sends the RUNNING harness's reports (progress, blocker, continuation
    /// results) for as long as the generation lives — also after a restart, for a re-adopted
    /// generation whose lane socket is served again.
    async fn report_loop(self: Arc<Self>, ctx: Arc<ChainCtx>, session: Arc<GenSession>) {
        let rx = session.reports_rx.lock().ok().and_then(|mut r| r.take());
        let Some(mut rx) = rx else { return };
        while let Some(report) = rx.recv().await {
            let Some(mut f) = ctx.report_fields.lock().ok().and_then(|f| f.clone()) else {
                continue;
            };
            let t = match report {
                HarnessReport::Progress {
                    kind,
                    evidence_digest,
                    next_action,
                } => {
                    f.push((
                        "idempotency_key",
                        s(&format!(
                            "progress/{}/{evidence_digest}",
                            ctx.binding.reservation_id
                        )),
                    ));
                    f.push(("evidence_kind", s(&kind)));
                    f.push(("evidence_digest", s(&evidence_digest)));
                    if let Some(n) = next_action {
                        f.push(("next_action", s(&n)));
                    }
                    MessageType::Progress
                }
                HarnessReport::ContinuationResult {
                    continuation_id,
                    evidence_digest,
                } => {
                    if let Ok(mut r) = session.results.lock() {
                        r.insert(continuation_id.clone(), evidence_digest.clone());
                    }
                    f.push((
                        "idempotency_key",
                        s(&format!("continuation-result/{continuation_id}")),
                    ));
                    f.push(("continuation_id", s(&continuation_id)));
                    f.push(("result_evidence_digest", s(&evidence_digest)));
                    MessageType::ContinuationResult
                }
                HarnessReport::Blocked {
                    code,
                    evidence_digest,
                    next_action,
                } => {
                    f.push((
                        "idempotency_key",
                        s(&format!(
                            "blocked/{}/{evidence_digest}",
                            ctx.binding.reservation_id
                        )),
                    ));
                    f.push(("blocker_code", s(&code)));
                    f.push(("blocker_evidence_digest", s(&evidence_digest)));
                    f.push(("next_action", s(&next_action)));
                    MessageType::Blocked
                }
            };
            tracing::info!(
                lane_incarnation_id = %ctx.lane_incarnation_id,
                generation = ctx.generation,
                message_type = t.as_str(),
                "harness report to the coordinator"
            );
            self.send(t, f);
        }
    }

    async fn route(self: Arc<Self>, env: Envelope<Verified>) {
        // Queue isolation: only the lane's current, unfenced generation receives anything.
        let admitted = match self.gate.lock() {
            Ok(g) => g.admit(&env),
            Err(_) => return,
        };
        if let Err(audit) = admitted {
            let line = serde_json::to_string(&*audit).unwrap_or_default();
            self.sup.audit_stale(
                audit.category,
                Some(&audit.lane_id),
                audit.generation,
                &line,
            );
            return;
        }
        let lane_id = env.str("lane_id").to_string();
        let Some(ctx) = self.chain_of(&lane_id) else {
            return;
        };
        if let Err(why) = authority_of(&env, &ctx.binding) {
            self.sup.audit_stale(
                why,
                Some(&lane_id),
                env.uint("generation"),
                env.str("message_id"),
            );
            return;
        }
        match env.message_type() {
            MessageType::Contract => {
                let Some(session) = &ctx.session else { return };
                let text = env.str("task_text").to_string();
                let digest = crate::protocol::contracts_digest(
                    &text,
                    env.str("scope_digest"),
                    env.str("holds_digest"),
                );
                if digest != env.str("contracts_digest") {
                    self.sup.audit_stale(
                        "contract-digest-mismatch",
                        Some(&lane_id),
                        env.uint("generation"),
                        env.str("message_id"),
                    );
                    return;
                }
                if let Ok(mut c) = ctx.contract.lock() {
                    *c = Some(env.clone());
                }
                let key =
                    crate::adapter::contract_key(&digest, &ctx.lane_incarnation_id, ctx.generation);
                session.contract.send_replace(Some(Contract {
                    task_text: text,
                    contracts_digest: digest,
                    key,
                }));
            }
            MessageType::Challenge => {
                let cid = env.str("challenge_id").to_string();
                ctx.challenge.send_replace(Some(cid.clone()));
                if let Some(session) = &ctx.session {
                    session.challenged.send_replace(true);
                    let phrase =
                        crate::adapter::ack_phrase(&cid, &ctx.lane_incarnation_id, ctx.generation);
                    let fresh = session.phrase.borrow().as_deref() != Some(phrase.as_str());
                    session.phrase.send_replace(Some(phrase.clone()));
                    if fresh {
                        self.clone()
                            .deliver_challenge(&ctx, session.clone(), &lane_id, phrase);
                    }
                }
            }
            MessageType::Continuation => self.clone().on_continuation(ctx, env),
            MessageType::HandoffChallenge => {
                if let Some(session) = &ctx.session {
                    session
                        .handoff
                        .send_replace(Some(env.str("handoff_challenge_id").to_string()));
                }
                let resend = ctx.handoff.borrow().is_some()
                    && ctx
                        .session
                        .as_ref()
                        .is_some_and(|s| *s.handoff_ack_requested.borrow());
                ctx.handoff.send_replace(Some(env.clone()));
                // The coordinator sends the challenge again only while it has no ACK: the
                // first was lost (a coordinator restart, say). Answer again, same key.
                if resend {
                    if let (Some(stage), Some(contract)) = (
                        ctx.stage.as_ref(),
                        ctx.contract.lock().ok().and_then(|c| c.clone()),
                    ) {
                        self.send(
                            MessageType::HandoffAck,
                            handoff_ack_fields(stage, &contract, &env, &ctx.identity),
                        );
                    }
                }
            }
            MessageType::Control if env.str("control_op") == "activate" => {
                let Some(lane) = self.lane_name(&lane_id) else {
                    return;
                };
                // Durable first: a restarted supervisor must know this generation runs.
                let fields = ctx
                    .report_fields
                    .lock()
                    .ok()
                    .and_then(|f| f.as_deref().map(fields_to_record));
                match self.sup.mark_activated(&lane, ctx.generation, fields).await {
                    Ok(true) => {
                        tracing::info!(
                            lane_id,
                            generation = ctx.generation,
                            assignment_id = %ctx.binding.assignment_id,
                            "generation activated by the coordinator"
                        );
                        if let Some(session) = &ctx.session {
                            session.activation.send_replace(Some(Ok(())));
                        }
                    }
                    Ok(false) => {}
                    Err(e) => tracing::error!(lane_id, error = %e, "cannot record the activation"),
                }
            }
            other => tracing::warn!(
                message_type = other.as_str(),
                "unexpected coordinator message"
            ),
        }
    }

    /// A continuation for this generation. `offer`: accepted (signed back) once the harness
    /// is settled — waiting in `mosaic lane next` — and never for a generation this process
    /// cannot reach (no lane socket). `accepted`: the coordinator committed the acceptance
    /// and debited the loop budget; hand it to the waiting harness — only if this process
    /// accepted it — which gets each continuation at most once.
    fn on_continuation(self: Arc<Self>, ctx: Arc<ChainCtx>, env: Envelope<Verified>) {
        let lane_id = env.str("lane_id").to_string();
        let fields = ctx.report_fields.lock().ok().and_then(|f| f.clone());
        let (Some(session), Some(fields)) = (ctx.session.clone(), fields) else {
            self.sup.audit_stale(
                "continuation-unreachable-generation",
                Some(&lane_id),
                env.uint("generation"),
                env.str("message_id"),
            );
            return;
        };
        let next_action = env.str("next_action").to_string();
        if crate::protocol::work::next_action_digest(&next_action) != env.str("next_action_digest")
        {
            self.sup.audit_stale(
                "continuation-digest-mismatch",
                Some(&lane_id),
                env.uint("generation"),
                env.str("message_id"),
            );
            return;
        }
        let id = env.str("continuation_id").to_string();
        match env.str("phase") {
            "accepted" => {
                // Already given and answered: the coordinator is still waiting, so the
                // result report was lost; send it again (the same step, the same key).
                let answered = session
                    .results
                    .lock()
                    .ok()
                    .and_then(|r| r.get(&id).cloned());
                if let Some(evidence) = answered {
                    let mut f = fields;
                    f.push(("idempotency_key", s(&format!("continuation-result/{id}"))));
                    f.push(("continuation_id", s(&id)));
                    f.push(("result_evidence_digest", s(&evidence)));
                    self.send(MessageType::ContinuationResult, f);
                    return;
                }
                let ours = session
                    .accepted_here
                    .lock()
                    .map(|a| a.contains(&id))
                    .unwrap_or(false);
                if !ours {
                    self.sup.audit_stale(
                        "continuation-accepted-by-another-process",
                        Some(&lane_id),
                        env.uint("generation"),
                        env.str("message_id"),
                    );
                    return;
                }
                session
                    .next
                    .send_replace(Some(super::lanesock::Continuation {
                        continuation_id: id,
                        next_action,
                    }));
            }
            "offer" => {
                let claim = env.str("claim_ref").to_string();
                let fresh = ctx
                    .offers
                    .lock()
                    .map(|mut o| o.insert(claim.clone()))
                    .unwrap_or(false);
                if !fresh {
                    return; // already waiting to accept this claim
                }
                tokio::spawn(async move {
                    let mut settled = session.settled.subscribe();
                    // Bounded: a harness that never settles lets the claim lapse, and the
                    // coordinator reclaims or expires it.
                    let ok = tokio::time::timeout(
                        std::time::Duration::from_secs(60),
                        settled.wait_for(|s| *s),
                    )
                    .await;
                    if !matches!(ok, Ok(Ok(_))) {
                        return;
                    }
                    let mut f = fields;
                    f.push((
                        "idempotency_key",
                        s(&format!("continuation-accept/{id}/{claim}")),
                    ));
                    f.push(("continuation_id", s(&id)));
                    f.push(("claim_ref", s(&claim)));
                    f.push(("next_action_digest", s(env.str("next_action_digest"))));
                    f.push(("process_identity", ctx.identity.clone()));
                    if let Ok(mut a) = session.accepted_here.lock() {
                        a.insert(id.clone());
                    }
                    self.send(MessageType::ContinuationAccept, f);
                });
            }
            _ => self.sup.audit_stale(
                "continuation-phase-unknown",
                Some(&lane_id),
                env.uint("generation"),
                env.str("message_id"),
            ),
        }
    }

    /// The coordinator's reconcile: end the listed generations, recreate the listed lanes.
    async fn on_reconcile(self: Arc<Self>, env: Envelope<Verified>) {
        // Ending generations is authority: a reconcile must say whose (the link has checked
        // that timeline and epoch against the highest this host has seen).
        if !matches!(env.get("sot_incarnation"), Some(Value::Str(_)))
            || env.uint("coordinator_epoch").is_none()
        {
            self.sup
                .audit_stale("authority-missing", None, None, env.str("message_id"));
            return;
        }
        let orders: Reconcile = match env.get("lanes").map(|v| report::from_value("reconcile", v)) {
            Some(Ok(o)) => o,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "malformed reconcile");
                return;
            }
            None => return,
        };
        for (lane_id, order) in orders {
            let Some(lane) = self.lane_name(&lane_id) else {
                self.sup
                    .audit_stale("other-host", Some(&lane_id), None, env.str("message_id"));
                continue;
            };
            let this = self.clone();
            tokio::spawn(async move {
                for g in order.end {
                    if let Ok(mut gate) = this.gate.lock() {
                        gate.fence_generation(&lane_id, &order.lane_incarnation_id, g);
                    }
                    let runtime = this
                        .chain_of(&lane_id)
                        .filter(|c| c.generation == g)
                        .map(|c| c.runtime.clone())
                        .unwrap_or_else(|| "unknown".into());
                    match this
                        .sup
                        .end_generation(&lane, &order.lane_incarnation_id, g, &runtime)
                        .await
                    {
                        Ok(o) => {
                            tracing::info!(lane_id, generation = g, outcome = ?o, "generation ended on the coordinator's order")
                        }
                        Err(e) => {
                            tracing::error!(lane_id, generation = g, error = %e, "cannot end the generation")
                        }
                    }
                }
                if order.recreate {
                    tracing::warn!(lane_id, "recreating the lane on the coordinator's order");
                    match this.sup.lane_destroy(&lane).await {
                        Ok(_) | Err(super::SupervisorError::NoSuchLane(_)) => {}
                        Err(e) => {
                            tracing::error!(lane_id, error = %e, "cannot destroy the lane; it stays as it is");
                            return;
                        }
                    }
                    if let Err(e) = this.sup.lane_create(&lane).await {
                        tracing::error!(lane_id, error = %e, "cannot recreate the lane");
                    }
                }
            });
        }
    }
}

/// A handoff ACK: the chain fields, and every bound field of the challenge echoed.
fn handoff_ack_fields(
    stage: &Envelope<Verified>,
    contract: &Envelope<Verified>,
    h: &Envelope<Verified>,
    identity: &Value,
) -> Vec<(&'static str, Value)> {
    let mut f = CoordinatedHost::chain_fields(stage, Some(contract));
    f.push((
        "idempotency_key",
        s(&format!("handoff-ack/{}", h.str("handoff_challenge_id"))),
    ));
    for k in [
        "handoff_challenge_id",
        "source_assignment_attempt_id",
        "responsibility_owner",
        "execution_owner",
        "pending_target",
        "next_action_digest",
        "challenge_deadline",
    ] {
        f.push((k, s(h.str(k))));
    }
    f.push(("process_identity", identity.clone()));
    f
}

/// Whether a coordinator message for a staged generation carries the authority that
/// generation was staged with: the same reservation and timeline, the staging epoch (a
/// later one only for a control message, which a new leader sends for RUNNING work), and a
/// fence proof that opens the stage's commitment (see `protocol::fence`).
fn authority_of(env: &Envelope<Verified>, b: &CoordBinding) -> Result<(), &'static str> {
    if env.str("reservation_id") != b.reservation_id {
        return Err("other-reservation");
    }
    if env.str("sot_incarnation") != b.sot_incarnation {
        return Err("other-timeline");
    }
    let epoch = env.uint("coordinator_epoch").unwrap_or(0);
    let epoch_ok = match env.message_type() {
        // Sent for RUNNING work by whichever leader is current.
        MessageType::Control | MessageType::Continuation => epoch >= b.coordinator_epoch,
        _ => epoch == b.coordinator_epoch,
    };
    if !epoch_ok {
        return Err("other-epoch");
    }
    if !crate::protocol::fence::opens(&b.fence_proof, env.str("fence_proof")) {
        return Err("fence-proof-refused");
    }
    Ok(())
}

impl HostDispatch for Arc<CoordinatedHost> {
    fn dispatch(&self, env: Envelope<Verified>) -> BoxFuture<'static, ()> {
        let this = self.clone();
        Box::pin(async move {
            match env.message_type() {
                MessageType::Stage => {
                    tokio::spawn(this.on_stage(env));
                }
                MessageType::Reconcile => {
                    tokio::spawn(this.on_reconcile(env));
                }
                // In order, on the link's task: a contract is never overtaken by its challenge.
                _ => this.route(env).await,
            }
        })
    }
}
