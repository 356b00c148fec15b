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
use crate::adapter::Check;
use crate::protocol::canonical;
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s, Signer};
use crate::protocol::messages::{self as wire, ChainRef, ContractBound, FromHostChain, ToHost};
use crate::protocol::queue::GenerationGate;
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
    /// The checkpoint its workspace was restored from or found equal to, as the workspace's
    /// marker said right after it was prepared (work in a repository; `staged` reports it).
    restored: Option<String>,
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
    /// What this generation's reports repeat (known once its contract is; restored from the
    /// generation record after a restart).
    report_base: Mutex<Option<ReportBase>>,
    /// The coordinator told this host the generation is RUNNING (recorded first): its
    /// effects may be claimed.
    active: std::sync::atomic::AtomicBool,
    /// The coordinator ordered it ended: nothing more of it is dispatched.
    stopping: std::sync::atomic::AtomicBool,
    /// Its progress observer runs (started once: an activation re-sent, or a re-adoption,
    /// starts no second one).
    observing: std::sync::atomic::AtomicBool,
}

/// What every report of a generation repeats (known once its contract is; restored from
/// the generation record after a restart).
#[derive(Debug, Clone, PartialEq)]
struct ReportBase {
    chain: ChainRef,
    bound: ContractBound,
}

/// The keys a generation record stores its report base under (the record's format).
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

impl ReportBase {
    /// From its recorded form: exactly the known keys, strings and integers where each
    /// belongs; anything else is no base (the generation then sends no reports).
    fn from_record(v: &serde_json::Value) -> Option<Self> {
        let t = |k: &str| v.get(k)?.as_str().map(String::from);
        let u = |k: &str| v.get(k)?.as_u64();
        if REPORT_KEYS.iter().any(|k| v.get(*k).is_none()) {
            return None;
        }
        Some(Self {
            chain: ChainRef {
                sot_incarnation: t("sot_incarnation")?,
                coordinator_epoch: u("coordinator_epoch")?,
                assignment_id: t("assignment_id")?,
                lane_id: t("lane_id")?,
                lane_incarnation_id: t("lane_incarnation_id")?,
                assignment_attempt_id: t("assignment_attempt_id")?,
                reservation_id: t("reservation_id")?,
                generation: u("generation")?,
                fence_proof: t("fence_proof")?,
            },
            bound: ContractBound {
                reservation_epoch: u("reservation_epoch")?,
                reservation_deadline: t("reservation_deadline")?,
                runtime_id: t("runtime_id")?,
                digests: wire::Digests {
                    contracts_digest: t("contracts_digest")?,
                    scope_digest: t("scope_digest")?,
                    holds_digest: t("holds_digest")?,
                },
            },
        })
    }

    fn to_record(&self) -> serde_json::Value {
        let (c, b) = (&self.chain, &self.bound);
        serde_json::json!({
            "sot_incarnation": c.sot_incarnation,
            "coordinator_epoch": c.coordinator_epoch,
            "assignment_id": c.assignment_id,
            "lane_id": c.lane_id,
            "lane_incarnation_id": c.lane_incarnation_id,
            "assignment_attempt_id": c.assignment_attempt_id,
            "reservation_id": c.reservation_id,
            "generation": c.generation,
            "fence_proof": c.fence_proof,
            "reservation_epoch": b.reservation_epoch,
            "reservation_deadline": b.reservation_deadline,
            "runtime_id": b.runtime_id,
            "contracts_digest": b.digests.contracts_digest,
            "scope_digest": b.digests.scope_digest,
            "holds_digest": b.digests.holds_digest,
        })
    }

    /// The base of a generation staged by `stage` and given `contract`.
    fn of(stage: &wire::Stage, contract: &wire::Contract) -> Self {
        let a = &stage.authority;
        Self {
            chain: CoordinatedHost::chain_ref(stage),
            bound: ContractBound {
                reservation_epoch: a.reservation_epoch,
                reservation_deadline: a.reservation_deadline.clone(),
                runtime_id: a.runtime_id.clone(),
                digests: contract.digests.clone(),
            },
        }
    }
}

pub struct CoordinatedHost {
    sup: Supervisor,
    signer: Arc<Signer>,
    /// The host's session key: its checkpoint transfers are session messages.
    session_signer: Arc<Signer>,
    out: mpsc::Sender<Outgoing>,
    chains: Mutex<HashMap<String, Arc<ChainCtx>>>,
    gate: Mutex<GenerationGate>,
    /// Claims waiting for their verdicts, observations waiting to be recorded.
    effects: effects::Effects,
    /// One stage at a time per lane, so a duplicate stage finds the first one's result.
    staging: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Checkpoint transfers waiting for the coordinator's answers.
    transfers: transfer::Transfers,
    /// The host's recovery key (spec §7.4), when configured: the only key its recovery
    /// ACKs are signed with. Without one it is never a retarget candidate.
    recovery_signer: std::sync::OnceLock<Arc<Signer>>,
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
    /// Makes this host a possible retarget candidate: its recovery ACKs are signed with
    /// `signer` (set once; a second key is ignored).
    pub fn set_recovery_signer(&self, signer: Arc<Signer>) {
        let _ = self.recovery_signer.set(signer);
    }

    /// A recovery challenge (spec §7.3) for this host as candidate: answered with the
    /// recovery ACK binding exactly its facts, signed by the recovery key. The ACK grants
    /// nothing; whether it is consumed is the coordinator's CAS.
    fn on_recovery_challenge(
        &self,
        env: &Envelope<Verified>,
        m: &crate::protocol::messages::RecoveryChallenge,
    ) {
        let Some(signer) = self.recovery_signer.get() else {
            tracing::warn!(recovery_candidate_id = %m.facts.recovery_candidate_id,
                "a recovery challenge arrived, and this host has no recovery key: not answered");
            self.sup
                .audit_stale("recovery-no-key", None, None, env.message_id());
            return;
        };
        if m.facts.candidate_principal != signer.principal {
            self.sup
                .audit_stale("recovery-other-candidate", None, None, env.message_id());
            return;
        }
        let ack = crate::protocol::messages::RecoveryAck::answering(env, m);
        tracing::info!(recovery_candidate_id = %m.facts.recovery_candidate_id,
            assignment_id = %m.facts.assignment_id, "answering a recovery challenge as candidate");
        if self
            .out
            .try_send(Outgoing::new(
                signer,
                crate::protocol::schema::MessageType::RecoveryAck,
                ack.fields(),
            ))
            .is_err()
        {
            tracing::error!("the coordinator link's queue is full: recovery ACK not sent (the coordinator sends the challenge again)");
        }
    }

    /// Builds the host's chain state, rebuilding the gate and chain map from the
    /// supervisor's live generations (a restarted supervisor re-adopted them).
    pub async fn new(
        sup: Supervisor,
        signer: Arc<Signer>,
        session_signer: Arc<Signer>,
        out: mpsc::Sender<Outgoing>,
    ) -> Arc<Self> {
        let host = Arc::new(Self {
            sup,
            signer,
            session_signer,
            out,
            chains: Mutex::new(HashMap::new()),
            gate: Mutex::new(GenerationGate::new()),
            effects: Default::default(),
            staging: Mutex::new(HashMap::new()),
            transfers: Default::default(),
            recovery_signer: std::sync::OnceLock::new(),
        });
        tokio::spawn(Self::resend_results(Arc::downgrade(&host)));
        tokio::spawn(Self::upload_loop(Arc::downgrade(&host)));
        // Tried for half a minute: given up after one failure, every re-adopted generation
        // ran on with no chain (its broker refused everything, its reports were dropped)
        // for the rest of its life. Not forever: a state that stays unreadable must not
        // keep the link (and with it the coordinator's view of this host) from starting.
        let mut tries = 0;
        let st = loop {
            match host.sup.status().await {
                Ok(st) => break Some(st),
                Err(e) if tries < 30 => {
                    tries += 1;
                    tracing::error!(error = %e, "cannot read the lanes' state to rebuild the coordinated chain state; trying again in a second");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Err(e) => {
                    tracing::error!(error = %e, "cannot rebuild the coordinated chain state: re-adopted generations run without their chains (nothing they ask for is admitted)");
                    break None;
                }
            }
        };
        for lane in st.map(|s| s.lanes).unwrap_or_default() {
            let Some(g) = lane.generation else { continue };
            let Some(binding) = host.sup.binding(&lane.lane, g.generation).await else {
                continue;
            };
            let restored = binding
                .chain_fields
                .as_ref()
                .and_then(ReportBase::from_record);
            let activated = binding.activated;
            // Served again by the re-adoption when its fields were recorded (at
            // injection; see `adopt::reserve_lane_socket`), activated or not.
            let session = match &restored {
                Some(_) => host.sup.session_of(&lane.lane, g.generation).await,
                None => None,
            };
            if let Ok(mut gate) = host.gate.lock() {
                let _ = gate.advance(&lane.lane_id, &lane.lane_incarnation_id, g.generation);
            }
            let ctx = Arc::new(ChainCtx {
                lane_incarnation_id: lane.lane_incarnation_id.clone(),
                generation: g.generation,
                runtime: g.runtime.clone(),
                binding,
                stage: None,
                restored: None,
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
                active: std::sync::atomic::AtomicBool::new(activated && restored.is_some()),
                report_base: Mutex::new(restored),
                stopping: std::sync::atomic::AtomicBool::new(false),
                observing: std::sync::atomic::AtomicBool::new(false),
            });
            if let Ok(mut m) = host.chains.lock() {
                m.insert(lane.lane_id.clone(), ctx.clone());
            }
            if let Some(session) = session {
                tracing::info!(lane_id = %lane.lane_id, generation = g.generation,
                    "re-adopted generation: its lane socket is served again");
                if ctx.active.load(std::sync::atomic::Ordering::SeqCst) {
                    host.observe_progress(&ctx, &session);
                }
                tokio::spawn(host.clone().report_loop(ctx, session));
            }
        }
        // Installed once every re-adopted chain is known: a gateway that waits for the
        // broker (`BrokerSlot::ready`) never asks it about a generation it does not know
        // yet (it would be refused as having no authority).
        host.sup
            .broker_slot()
            .install(Arc::new(effects::HostBroker(Arc::downgrade(&host))));
        host
    }

    fn lane_name(&self, lane_id: &str) -> Option<String> {
        let (host, lane) = lane_id.split_once(':')?;
        (host == self.sup.config().host.as_str()).then(|| lane.to_string())
    }

    /// Queues a host chain message; the link seals it for the session that sends it.
    fn send(&self, m: FromHostChain) {
        let t = m.message_type();
        let fields = match m.fields() {
            Ok(f) => f,
            Err(e) => {
                tracing::error!(message_type = t.as_str(), error = %e, "cannot encode a message for the coordinator; not sent");
                return;
            }
        };
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

    /// The chain every host message about this generation speaks for, from its stage.
    fn chain_ref(stage: &wire::Stage) -> ChainRef {
        let a = &stage.authority;
        ChainRef {
            reservation_id: a.reservation_id.clone(),
            lane_id: a.lane_id.clone(),
            lane_incarnation_id: a.lane_incarnation_id.clone(),
            assignment_id: a.assignment_id.clone(),
            assignment_attempt_id: a.assignment_attempt_id.clone(),
            generation: a.generation,
            sot_incarnation: a.sot_incarnation.clone(),
            coordinator_epoch: a.coordinator_epoch,
            fence_proof: a.fence_proof.clone(),
        }
    }

    fn send_staged(&self, ctx: &ChainCtx) {
        let Some(stage) = &ctx.stage else { return };
        self.send(FromHostChain::Staged(wire::Staged {
            chain: Self::chain_ref(stage),
            process_identity: canonical::to_json(&ctx.identity),
            restored_checkpoint_digest: ctx.restored.clone(),
        }));
    }

    fn chain_of(&self, lane_id: &str) -> Option<Arc<ChainCtx>> {
        self.chains.lock().ok()?.get(lane_id).cloned()
    }
}

mod artifact_upload;
mod checks;
mod continuations;
mod effects;
mod hand_on;
mod hand_on_kept;
mod observe;
mod release;
mod reports;
mod stage;
mod transfer;

pub use effects::ADMIT_TIMEOUT;

use checks::*;
