//! The per-generation authority check every chain envelope passes (reservation, timeline,
//! staging epoch), the handoff ACK's fields, and the link's dispatch into this host.

use super::*;

/// A handoff ACK: the chain fields, and every bound field of the challenge echoed.
pub(super) fn handoff_ack_fields(
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
pub(super) fn authority_of(env: &Envelope<Verified>, b: &CoordBinding) -> Result<(), &'static str> {
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
