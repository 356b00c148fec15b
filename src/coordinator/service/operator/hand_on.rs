//! `mosaic workspace push|merge|effects|resolve`: handing done work's branch on
//! (`coordinator::workspace_effects` decides; the host's push executor makes it).

use super::*;
use crate::coordinator::states::WorkspaceEffectState;
use crate::coordinator::workspace_effects::{HandOnRequest, HandOnView};
use crate::protocol::messages::HandOn;

/// How long a request waits for its host's outcome before answering with the effect as it
/// stands (it goes on; `mosaic workspace effects` shows it).
const HAND_ON_WAIT: Duration = Duration::from_secs(120);

impl Service {
    pub(super) async fn hand_on_request(
        &self,
        r: OperatorRequest,
        who: &str,
    ) -> Result<serde_json::Value, OpError> {
        Ok(match r {
            OperatorRequest::WorkspaceEffects { assignment_id } => {
                json!(self.store.hand_ons(assignment_id.as_deref()).await?)
            }
            OperatorRequest::WorkspaceResolve {
                effect_id,
                applied,
                evidence_digest,
                request_id: rid,
            } => {
                let l = self.leader().await?;
                let r = self
                    .store
                    .resolve_hand_on(&l, &effect_id, applied, &evidence_digest, &request_id(rid))
                    .await;
                json!(self.settled(&l, r).await?.body)
            }
            OperatorRequest::WorkspaceEffect {
                assignment_id,
                kind,
                into,
                host_id,
                wait,
                request_id: rid,
            } => {
                let kind = HandOn::parse(&kind).ok_or_else(|| {
                    OpError::new(Category::BadInput, "a workspace effect is push or merge")
                })?;
                let l = self.leader().await?;
                let req = HandOnRequest {
                    request_key: request_id(rid),
                    kind,
                    assignment_id,
                    into,
                    host_id,
                    requested_by: who.to_string(),
                };
                let r = self.store.request_hand_on(&l, &req).await;
                let (view, point) = self.settled(&l, r).await?;
                if let (true, Some(point)) = (view.claimable, point) {
                    if let Err(e) = self.send_hand_on_order(&view, point) {
                        // Sent when the host's next session opens, if still in time.
                        let mut out = json!(view);
                        out["note"] = json!(format!(
                            "{}: the order goes to the host when it connects, if before {}",
                            e.message, view.claim_deadline
                        ));
                        return Ok(out);
                    }
                }
                let view = if wait {
                    self.hand_on_settled(&view.effect_id).await?
                } else {
                    view
                };
                let mut out = json!(view);
                if view.open() {
                    out["note"] = json!(
                        "not settled yet: `mosaic workspace effects --assignment` shows what becomes of it"
                    );
                }
                out
            }
            _ => {
                return Err(OpError::new(
                    Category::Internal,
                    "not a workspace effect request",
                ))
            }
        })
    }

    /// The effect once its host settled it (or as it stands after `HAND_ON_WAIT`).
    async fn hand_on_settled(&self, effect_id: &str) -> Result<HandOnView, OpError> {
        let until = std::time::Instant::now() + HAND_ON_WAIT;
        let mut pause = Duration::from_millis(20);
        loop {
            let v = self.store.hand_on(effect_id).await?.ok_or_else(|| {
                OpError::new(Category::Internal, format!("effect {effect_id} vanished"))
            })?;
            if !(v.claimable || v.state == WorkspaceEffectState::Admitted)
                || std::time::Instant::now() >= until
            {
                return Ok(v);
            }
            let mut changed = self.changed.subscribe();
            let _ = tokio::time::timeout(pause, changed.changed()).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}
