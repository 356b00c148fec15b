//! A host's side of handing done work on (`coordinator::workspace_effects` decides): its
//! claim of the exact update, and what it observed. Each is answered; an answer this side
//! cannot give now is `retry` (a claim is then not pushed; a settlement is sent again).

use super::*;
use crate::coordinator::workspace_effects::HandOnView;
use crate::protocol::messages::{
    EffectStep, HandOn, HandOnVerdict, WorkspaceEffect, WorkspaceEffectAnswer, WorkspaceOrder,
};
use crate::protocol::repo::{RepoName, RestorePoint};

impl Service {
    /// Sends the order of requested effect `v` to its host (again, to a repeat: the host
    /// makes one executor per effect).
    pub(crate) fn send_hand_on_order(
        &self,
        v: &HandOnView,
        checkpoint: RestorePoint,
    ) -> Result<(), OpError> {
        let bad = |e: String| OpError::new(Category::Internal, format!("recorded effect: {e}"));
        let order = WorkspaceOrder {
            effect_id: v.effect_id.clone(),
            assignment_id: v.assignment_id.clone(),
            kind: HandOn::parse(&v.kind).ok_or_else(|| bad(format!("kind {}", v.kind)))?,
            repository: RepoName::parse(&v.repository).map_err(|e| bad(e.to_string()))?,
            reference: v.reference.clone(),
            checkpoint,
        };
        self.hosts.push(
            &v.host_id,
            Outgoing::to_host(&self.session, &ToHost::WorkspaceOrder(order)),
        )?;
        tracing::info!(effect_id = %v.effect_id, assignment_id = %v.assignment_id, kind = %v.kind,
            reference = %v.reference, host = %v.host_id, "workspace effect ordered");
        Ok(())
    }

    /// A host's new session gets the order of every effect it may still claim; an
    /// admitted one it has not reported past its window is UNKNOWN from then on.
    pub(super) async fn resend_hand_on_orders(&self, l: &Leader, host: &str) {
        match self.store.unreported_hand_ons(host).await {
            Ok(ids) => {
                for id in ids {
                    let digest = format!(
                        "sha256:{}",
                        crate::util::sha256_hex(
                            "mosaic/workspace-effect-unreported/v1",
                            &[id.as_bytes()]
                        )
                    );
                    let detail = "its host opened a new session with no report of it past its dispatch window";
                    match self
                        .store
                        .settle_hand_on(
                            l,
                            host,
                            &id,
                            crate::protocol::messages::HandOnOutcome::Unknown,
                            &digest,
                            Some(detail),
                        )
                        .await
                    {
                        Ok(_) => {
                            self.bump();
                            tracing::error!(host, effect_id = %id,
                                "a workspace effect's outcome is unknown: its host's report may still come; else `mosaic workspace resolve`");
                        }
                        Err(e) => {
                            tracing::warn!(host, effect_id = %id, error = %e, "an unreported workspace effect stays as it is")
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot read this host's unreported workspace effects")
            }
        }
        match self.store.claimable_hand_ons(host).await {
            Ok(list) => {
                for (v, p) in list {
                    if let Err(e) = self.send_hand_on_order(&v, p) {
                        tracing::warn!(host, effect_id = %v.effect_id, error = %e.message, "a workspace effect's order not sent");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(host, error = %e, "cannot read the workspace effects waiting for this host")
            }
        }
    }

    pub(super) async fn on_workspace_effect(&self, host: &str, m: WorkspaceEffect) -> Handled {
        let claim = matches!(m.step, EffectStep::Claim { .. });
        let mut admitted = None;
        let mut violation = None;
        let verdict = match self.leader().await {
            Err(e) => HandOnVerdict::Retry(e.category.as_str().into()),
            Ok(l) => {
                let r = match &m.step {
                    EffectStep::Claim {
                        old_id,
                        new_id,
                        operation_digest,
                    } => {
                        self.store
                            .claim_hand_on(&l, host, &m.effect_id, old_id, new_id, operation_digest)
                            .await
                    }
                    EffectStep::Settle {
                        outcome,
                        result_digest,
                        detail,
                    } => {
                        self.store
                            .settle_hand_on(
                                &l,
                                host,
                                &m.effect_id,
                                *outcome,
                                result_digest,
                                detail.as_deref(),
                            )
                            .await
                    }
                };
                match r {
                    Ok(receipt) => {
                        self.bump();
                        match &m.step {
                            // Admitted only while it is, with what and how long: a claim
                            // repeated after its window or its settlement pushes nothing.
                            EffectStep::Claim { old_id, new_id, .. } => {
                                match self.store.hand_on_admission(&m.effect_id).await {
                                    Ok(Some(a)) => {
                                        tracing::info!(host, effect_id = %m.effect_id, old = %old_id, new = %new_id,
                                            replayed = receipt.replayed, window_ms = a.1, "workspace effect admitted");
                                        admitted = Some(a);
                                        HandOnVerdict::Admitted
                                    }
                                    Ok(None) => {
                                        HandOnVerdict::Refused(Category::Expired.as_str().into())
                                    }
                                    Err(e) => HandOnVerdict::Retry(
                                        e.category().map_or("unavailable", |c| c.as_str()).into(),
                                    ),
                                }
                            }
                            EffectStep::Settle { outcome, .. } => {
                                tracing::info!(host, effect_id = %m.effect_id, outcome = outcome.as_str(), "workspace effect settled");
                                HandOnVerdict::Recorded
                            }
                        }
                    }
                    Err(e) => match e.category() {
                        Some(c)
                            if !matches!(
                                c,
                                Category::StaleLeader | Category::NotLeader | Category::Unavailable
                            ) =>
                        {
                            // Audited under the effect's own work (the host's word for it is not
                            // taken); a settlement refused after the fact is an observation the
                            // record does not hold, said loudly with what it was.
                            let asg = self
                                .store
                                .hand_on(&m.effect_id)
                                .await
                                .ok()
                                .flatten()
                                .map(|v| v.assignment_id);
                            let what = match &m.step {
                                EffectStep::Settle {
                                    outcome,
                                    result_digest,
                                    ..
                                } => {
                                    tracing::error!(host, effect_id = %m.effect_id, outcome = outcome.as_str(), result_digest,
                                        category = c.as_str(), error = %e,
                                        "a host's observation of a workspace effect was refused: the record does not hold it");
                                    format!("settle {} ({result_digest})", outcome.as_str())
                                }
                                EffectStep::Claim { .. } => {
                                    tracing::warn!(host, effect_id = %m.effect_id, category = c.as_str(), error = %e,
                                        "a host's workspace effect claim refused");
                                    "claim".to_string()
                                }
                            };
                            self.store.auditor().record(
                                if claim {
                                    "workspace-effect-claim"
                                } else {
                                    "workspace-effect-settle"
                                },
                                c,
                                None,
                                asg.as_deref(),
                                None,
                                &format!("host:{host} effect {} {what}: {e}", m.effect_id),
                            );
                            violation = super::handler::hostile(c)
                                .then(|| format!("refused-{}", c.as_str()));
                            HandOnVerdict::Refused(c.as_str().into())
                        }
                        c => {
                            tracing::warn!(host, effect_id = %m.effect_id, error = %e, "a workspace effect could not be decided now");
                            HandOnVerdict::Retry(c.map_or("unavailable", |c| c.as_str()).into())
                        }
                    },
                }
            }
        };
        let reply = ToHost::WorkspaceEffectAnswer(WorkspaceEffectAnswer {
            effect_id: m.effect_id,
            assignment_id: m.assignment_id,
            claim,
            verdict,
            admitted,
        });
        Handled {
            replies: vec![Outgoing::to_host(&self.session, &reply)],
            violation,
            deferred: None,
        }
    }
}
