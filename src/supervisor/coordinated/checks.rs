//! The per-generation authority check every chain envelope passes (reservation, timeline,
//! staging epoch), the handoff ACK's fields, and the link's dispatch into this host.

use super::*;

/// A handoff ACK: the chain, and every bound field of the challenge echoed.
pub(super) fn handoff_ack(
    stage: &wire::Stage,
    contract: &wire::Contract,
    h: &wire::HandoffChallenge,
    identity: &Value,
) -> FromHostChain {
    let base = ReportBase::of(stage, contract);
    FromHostChain::HandoffAck(wire::HandoffAck {
        chain: base.chain,
        bound: base.bound,
        handoff: h.bound.clone(),
        process_identity: canonical::to_json(identity),
        ack_digest: String::new(),
    })
}

/// Whether a coordinator message for a staged generation carries the authority that
/// generation was staged with: the same reservation and timeline, the staging epoch (a
/// later one only for a control message, which a new leader sends for RUNNING work), and a
/// fence proof that opens the stage's commitment (see `protocol::fence`).
pub(super) fn authority_of(m: &ToHost, b: &CoordBinding) -> Result<(), &'static str> {
    let Some(a) = m.authority() else {
        return Err("unaddressed");
    };
    if a.reservation_id != b.reservation_id {
        return Err("other-reservation");
    }
    if a.sot_incarnation != b.sot_incarnation {
        return Err("other-timeline");
    }
    let epoch_ok = match m {
        // Sent for RUNNING work by whichever leader is current.
        ToHost::Activate(_)
        | ToHost::Continuation(_)
        | ToHost::EffectVerdict(_)
        | ToHost::HandoffCheckpoint(_) => a.coordinator_epoch >= b.coordinator_epoch,
        _ => a.coordinator_epoch == b.coordinator_epoch,
    };
    if !epoch_ok {
        return Err("other-epoch");
    }
    if !crate::protocol::fence::opens(&b.fence_proof, &a.fence_proof) {
        return Err("fence-proof-refused");
    }
    Ok(())
}

impl HostDispatch for Arc<CoordinatedHost> {
    fn dispatch(&self, env: Envelope<Verified>, msg: ToHost) -> BoxFuture<'static, ()> {
        let this = self.clone();
        Box::pin(async move {
            let message_id = env.message_id().to_string();
            match msg {
                ToHost::Stage(m) => {
                    tokio::spawn(this.on_stage(m, message_id));
                }
                ToHost::Reconcile(m) => {
                    tokio::spawn(this.on_reconcile(m, message_id));
                }
                // The link consumes receipt verdicts itself.
                ToHost::ReceiptAck(_) => {}
                // An answer to this host's own claim or result, not a delivery to the
                // generation: it waits for no queue (an admission is acted on only while
                // the generation may still dispatch).
                ToHost::EffectVerdict(m) => this.on_effect_verdict(m, &message_id),
                // Answers to this host's own checkpoint transfers.
                msg @ (ToHost::CheckpointStored(_)
                | ToHost::CheckpointData(_)
                | ToHost::WorkspaceReleaseAnswer(_)
                | ToHost::WorkspaceEffectAnswer(_)) => this.on_transfer_answer(msg),
                // An operator's push or merge of done work: made beside everything else.
                ToHost::WorkspaceOrder(m) => this.on_workspace_order(m),
                // Preallocation-free: no lane, generation or queue is involved.
                ToHost::RecoveryChallenge(m) => this.on_recovery_challenge(&env, &m),
                // In order, on the link's task: a contract is never overtaken by its challenge.
                msg => this.route(env, msg).await,
            }
        })
    }
}
