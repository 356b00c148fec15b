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
use crate::protocol::messages::{self as wire, ToHost};
use crate::protocol::queue::GenerationGate;
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
    stage: Option<wire::Stage>,
    /// The harness's hand-off points (absent after a restart: they died with the old
    /// supervisor process).
    session: Option<Arc<GenSession>>,
    identity: Value,
    contract: Mutex<Option<wire::Contract>>,
    challenge: tokio::sync::watch::Sender<Option<String>>,
    /// The handoff challenge of a handoff target's generation (spec §8.1).
    handoff: tokio::sync::watch::Sender<Option<wire::HandoffChallenge>>,
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
        stage: &wire::Stage,
        contract: Option<&wire::Contract>,
    ) -> Vec<(&'static str, Value)> {
        let a = &stage.authority;
        let mut f = vec![
            ("sot_incarnation", s(&a.sot_incarnation)),
            ("coordinator_epoch", n(a.coordinator_epoch)),
            ("assignment_id", s(&a.assignment_id)),
            ("lane_id", s(&a.lane_id)),
            ("lane_incarnation_id", s(&a.lane_incarnation_id)),
            ("assignment_attempt_id", s(&a.assignment_attempt_id)),
            ("reservation_id", s(&a.reservation_id)),
            ("generation", n(a.generation)),
            ("fence_proof", s(&a.fence_proof)),
        ];
        if let Some(c) = contract {
            f.extend([
                ("reservation_epoch", n(a.reservation_epoch)),
                ("reservation_deadline", s(&a.reservation_deadline)),
                ("runtime_id", s(&a.runtime_id)),
                ("contracts_digest", s(&c.digests.contracts_digest)),
                ("scope_digest", s(&c.digests.scope_digest)),
                ("holds_digest", s(&c.digests.holds_digest)),
            ]);
        }
        f
    }

    fn send_staged(&self, ctx: &ChainCtx) {
        let Some(stage) = &ctx.stage else { return };
        let mut f = Self::chain_fields(stage, None);
        f.push((
            "idempotency_key",
            s(&format!("staged/{}", stage.authority.reservation_id)),
        ));
        f.push(("process_identity", ctx.identity.clone()));
        self.send(MessageType::Staged, f);
    }

    fn chain_of(&self, lane_id: &str) -> Option<Arc<ChainCtx>> {
        self.chains.lock().ok()?.get(lane_id).cloned()
    }
}

mod checks;
mod continuations;
mod reports;
mod stage;

use checks::*;
