//! The supervisor under a coordinator: it executes the host's side of the activation chain
//! and never decides it.
//!
//! stage → stop any earlier generation, start the coordinator-allocated one, report its
//! verified identity (`staged`) → contract → hand it to the harness over the lane socket;
//! once the harness fetched it, report the exact digest delivered (`injected`) → challenge
//! → when the harness asks to ACK, sign an `ack` binding every §8 field, the process identity
//! included → control `activate` → tell the harness it is active. `stop` stops.
//!
//! **Never:** delivers an envelope for a generation that is not the lane's current one
//! (`GenerationGate`; rejections are audited without payload), gives the harness a key,
//! or acts on a coordinator message it could not verify (the link verifies first).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use super::lanesock::{Contract, GenSession};
use super::link::HostDispatch;
use super::Supervisor;
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s, Signer};
use crate::protocol::queue::GenerationGate;
use crate::protocol::schema::MessageType;
use crate::protocol::{Envelope, Verified};

struct ChainCtx {
    stage: Envelope<Verified>,
    session: Arc<GenSession>,
    identity: Value,
    contract: Mutex<Option<Envelope<Verified>>>,
    challenge: tokio::sync::watch::Sender<Option<String>>,
}

pub struct CoordinatedHost {
    sup: Supervisor,
    signer: Arc<Signer>,
    coordinator: String,
    out: mpsc::Sender<Vec<u8>>,
    chains: Mutex<HashMap<String, Arc<ChainCtx>>>,
    gate: Mutex<GenerationGate>,
}

impl CoordinatedHost {
    pub fn new(
        sup: Supervisor,
        signer: Arc<Signer>,
        coordinator: String,
        out: mpsc::Sender<Vec<u8>>,
    ) -> Arc<Self> {
        Arc::new(Self {
            sup,
            signer,
            coordinator,
            out,
            chains: Mutex::new(HashMap::new()),
            gate: Mutex::new(GenerationGate::new()),
        })
    }

    fn lane_name(&self, lane_id: &str) -> Option<String> {
        let (host, lane) = lane_id.split_once(':')?;
        (host == self.sup.config().host.as_str()).then(|| lane.to_string())
    }

    fn send(&self, t: MessageType, fields: Vec<(&str, Value)>) {
        match self.signer.sign(t, &self.coordinator, fields) {
            Ok(bytes) => {
                if self.out.try_send(bytes).is_err() {
                    tracing::error!(
                        message_type = t.as_str(),
                        "coordinator link queue full; message dropped (the chain will expire)"
                    );
                }
            }
            Err(e) => tracing::error!(message_type = t.as_str(), error = %e, "cannot sign"),
        }
    }

    /// The chain fields every ordinary host message repeats from the stage envelope.
    fn chain_fields<'a>(
        stage: &'a Envelope<Verified>,
        contract: Option<&'a Envelope<Verified>>,
    ) -> Vec<(&'static str, Value)> {
        let mut f = vec![
            (
                "message_id",
                s(&format!("msg-{}", uuid::Uuid::new_v4().simple())),
            ),
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

    async fn on_stage(self: Arc<Self>, stage: Envelope<Verified>) {
        let lane_id = stage.str("lane_id").to_string();
        let Some(lane) = self.lane_name(&lane_id) else {
            tracing::warn!(lane_id, "stage for a lane of another host");
            return;
        };
        let generation = stage.uint("generation").unwrap_or(0);
        let session = GenSession::new();
        let started = self
            .sup
            .start_coordinated(
                &lane,
                stage.str("runtime_id"),
                stage.str("lane_incarnation_id"),
                generation,
                session.clone(),
            )
            .await;
        let view = match started {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(lane_id, generation, error = %e, "cannot stage the generation; the coordinator's reservation will expire");
                return;
            }
        };
        let Some(id) = view.process_identity else {
            return;
        };
        let identity = Value::Object(vec![
            ("boot_id".into(), s(&id.boot_id)),
            ("cgroup_id".into(), n(id.cgroup_id)),
            ("cgroup_path".into(), s(&id.cgroup_path)),
            ("exe_dev".into(), n(id.exe_dev)),
            ("exe_ino".into(), n(id.exe_ino)),
            ("launch_nonce_digest".into(), s(&id.launch_nonce_digest.0)),
            ("root_pid".into(), n(id.root_pid as u64)),
            ("root_start_time".into(), n(id.root_start_time)),
        ]);
        if let Ok(mut g) = self.gate.lock() {
            let _ = g.advance(&lane_id, stage.str("lane_incarnation_id"), generation);
        }
        let ctx = Arc::new(ChainCtx {
            stage,
            session: session.clone(),
            identity: identity.clone(),
            contract: Mutex::new(None),
            challenge: tokio::sync::watch::channel(None).0,
        });
        if let Ok(mut m) = self.chains.lock() {
            m.insert(lane_id.clone(), ctx.clone());
        }
        let mut f = Self::chain_fields(&ctx.stage, None);
        f.push((
            "idempotency_key",
            s(&format!("staged/{}", ctx.stage.str("reservation_id"))),
        ));
        f.push(("process_identity", identity));
        self.send(MessageType::Staged, f);
        tokio::spawn(self.clone().drive(ctx));
    }

    /// Waits for the harness to fetch the contract, reports it; waits for the challenge and
    /// the harness's ACK request, signs the ACK.
    async fn drive(self: Arc<Self>, ctx: Arc<ChainCtx>) {
        let mut delivered = ctx.session.delivered.subscribe();
        let Ok(digest) = delivered
            .wait_for(|d| d.is_some())
            .await
            .map(|d| d.clone().unwrap_or_default())
        else {
            return;
        };
        let contract = match ctx.contract.lock() {
            Ok(c) => c.clone(),
            Err(_) => None,
        };
        let Some(contract) = contract else { return };
        let mut f = Self::chain_fields(&ctx.stage, Some(&contract));
        f.push((
            "idempotency_key",
            s(&format!("injected/{}", ctx.stage.str("reservation_id"))),
        ));
        f.push(("delivered_contracts_digest", s(&digest)));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Injected, f);
        let mut asked = ctx.session.ack_requested.subscribe();
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
        let mut f = Self::chain_fields(&ctx.stage, Some(&contract));
        f.push(("idempotency_key", s(&format!("ack/{challenge}"))));
        f.push(("challenge_id", s(&challenge)));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Ack, f);
    }

    fn route(&self, env: Envelope<Verified>) {
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
        let ctx = match self.chains.lock() {
            Ok(m) => m.get(&lane_id).cloned(),
            Err(_) => None,
        };
        let Some(ctx) = ctx else { return };
        if env.str("reservation_id") != ctx.stage.str("reservation_id") {
            self.sup.audit_stale(
                "other-reservation",
                Some(&lane_id),
                env.uint("generation"),
                env.str("message_id"),
            );
            return;
        }
        match env.message_type() {
            MessageType::Contract => {
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
                ctx.session.contract.send_replace(Some(Contract {
                    task_text: text,
                    contracts_digest: digest,
                }));
            }
            MessageType::Challenge => {
                ctx.challenge
                    .send_replace(Some(env.str("challenge_id").to_string()));
            }
            MessageType::Control if env.str("control_op") == "activate" => {
                tracing::info!(
                    lane_id,
                    generation = env.uint("generation"),
                    "generation activated by the coordinator"
                );
                ctx.session.activation.send_replace(Some(Ok(())));
            }
            MessageType::Stop => {
                if let Ok(mut g) = self.gate.lock() {
                    g.fence(&lane_id);
                }
                let sup = self.sup.clone();
                let lane = self.lane_name(&lane_id);
                tokio::spawn(async move {
                    if let Some(lane) = lane {
                        if let Err(e) = sup.stop(&lane).await {
                            tracing::error!(lane, error = %e, "coordinator stop failed");
                        }
                    }
                });
            }
            other => tracing::warn!(
                message_type = other.as_str(),
                "unexpected coordinator message"
            ),
        }
    }
}

impl HostDispatch for Arc<CoordinatedHost> {
    fn dispatch(&self, env: Envelope<Verified>) -> BoxFuture<'static, ()> {
        let this = self.clone();
        Box::pin(async move {
            match env.message_type() {
                MessageType::Stage => {
                    tokio::spawn(this.on_stage(env));
                }
                _ => this.route(env),
            }
        })
    }
}
