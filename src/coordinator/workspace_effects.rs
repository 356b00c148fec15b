//! Handing done work's branch on (migration 0027, `mosaic workspace push|merge`): an
//! operator's request binds the work's final checkpoint to one host; that host's claim of
//! the exact ref update is admitted by one fenced CAS here before it pushes; what it then
//! observes of the remote settles the effect.
//!
//! - [`Store::request_hand_on`]: the request, for COMPLETED work in a repository whose final
//!   checkpoint is whole in the store, with no other effect of the work open.
//! - [`Store::claim_hand_on`]: the claim CAS — the effect's own host, before its deadline
//!   (database time), while the work is still COMPLETED on that checkpoint; a push's new id
//!   is the checkpoint's commit. The operation digest is derived here, never taken.
//! - [`Store::settle_hand_on`]: what the host observed (a decline or up-to-date before any
//!   claim; completed, failed, not dispatched or unknown after one; a late observation
//!   reconciles an unknown one).
//! - [`Store::resolve_hand_on`]: the operator's way out of an outcome nobody observed.
//!
//! **Never:** admits a claim of another host, of an expired request, of work that is not
//! COMPLETED on the checkpoint the request named, or a second claim of one request;
//! records an outcome its host did not report (or, for a resolution, without the
//! operator's evidence digest).

use const_format::concatcp;
use serde::Serialize;
use serde_json::json;

use super::error::{reject, AuthorityError, Category};
use super::leader::Leader;
use super::rows::RowExt;
use super::states::{Lifecycle, WorkspaceEffectState as S};
use super::store::Store;
use super::txn::{body, request_digest, Receipt, Step};
use crate::protocol::messages::{branch_ref_ok, HandOn, HandOnOutcome};
use crate::protocol::repo::RestorePoint;

/// How long a host has to claim an effect once requested (it reads the checkpoint from the
/// store first).
pub const CLAIM_WITHIN: &str = "10 minutes";
/// How long an admission is good for: a host that has not pushed by then does not.
pub const DISPATCH_WITHIN: &str = "30 seconds";
/// How long after its dispatch window an admitted effect nobody reported may be resolved
/// by hand (its host's git commands are bounded well within it).
pub const UNOBSERVED_AFTER: &str = "15 minutes";

/// An operator's request to hand done work on.
#[derive(Debug, Clone)]
pub struct HandOnRequest {
    pub request_key: String,
    pub kind: HandOn,
    pub assignment_id: String,
    /// For a merge: the branch merged into (default: the branch the work was based on).
    pub into: Option<String>,
    /// The host that makes it (default: the host of the work's last chain).
    pub host_id: Option<String>,
    pub requested_by: String,
}

/// One effect as recorded.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HandOnView {
    pub effect_id: String,
    pub kind: String,
    pub assignment_id: String,
    pub repository: String,
    pub reference: String,
    pub checkpoint_digest: String,
    pub commit_id: String,
    pub host_id: String,
    pub requested_by: String,
    pub state: S,
    pub old_id: Option<String>,
    pub new_id: Option<String>,
    pub operation_digest: Option<String>,
    pub result_digest: Option<String>,
    pub detail: Option<String>,
    pub reconciliation: Option<String>,
    pub requested_at: String,
    pub claim_deadline: String,
    pub admitted_at: Option<String>,
    pub resolved_at: Option<String>,
    /// REQUESTED and before its claim deadline (database time): its host may still claim
    /// it. A REQUESTED one past its deadline can never move but to EXPIRED.
    pub claimable: bool,
}

const VIEW: &str = concatcp!("SELECT effect_id, kind, assignment_id, repository, reference, checkpoint_digest, commit_id, host_id, \
        requested_by, state, old_id, new_id, operation_digest, result_digest, detail, reconciliation, \
        mosaic_ts(requested_at) AS requested_at, mosaic_ts(claim_deadline) AS claim_deadline, \
        mosaic_ts(admitted_at) AS admitted_at, mosaic_ts(resolved_at) AS resolved_at, \
        (state = ", S::Requested.sql(), " AND claim_deadline > clock_timestamp()) AS claimable \
     FROM workspace_effects");

impl HandOnView {
    fn from_row(r: &tokio_postgres::Row) -> Result<Self, AuthorityError> {
        Ok(Self {
            effect_id: r.col("effect_id")?,
            kind: r.col("kind")?,
            assignment_id: r.col("assignment_id")?,
            repository: r.col("repository")?,
            reference: r.col("reference")?,
            checkpoint_digest: r.col("checkpoint_digest")?,
            commit_id: r.col("commit_id")?,
            host_id: r.col("host_id")?,
            requested_by: r.col("requested_by")?,
            state: r.col("state")?,
            old_id: r.col("old_id")?,
            new_id: r.col("new_id")?,
            operation_digest: r.col("operation_digest")?,
            result_digest: r.col("result_digest")?,
            detail: r.col("detail")?,
            reconciliation: r.col("reconciliation")?,
            requested_at: r.col("requested_at")?,
            claim_deadline: r.col("claim_deadline")?,
            admitted_at: r.col("admitted_at")?,
            resolved_at: r.col("resolved_at")?,
            claimable: r.col("claimable")?,
        })
    }

    /// Still open: claimable, admitted, or unknown.
    pub fn open(&self) -> bool {
        self.claimable || matches!(self.state, S::Admitted | S::Unknown)
    }
}

/// The effect id a request key names (the same request is the same effect).
pub fn effect_id(request_key: &str) -> String {
    let h = crate::util::sha256_hex("mosaic/workspace-effect-id/v1", &[request_key.as_bytes()]);
    format!("we-{}", &h[..32])
}

/// The digest of the exact update `v` makes from `old_id` to `new_id`.
pub fn operation_digest(v: &HandOnView, old_id: &str, new_id: &str) -> String {
    crate::protocol::messages::hand_on_operation_digest(
        &v.effect_id,
        &v.kind,
        &v.repository,
        &v.reference,
        &v.commit_id,
        old_id,
        new_id,
    )
}

fn bad(op: &'static str, m: impl Into<String>) -> AuthorityError {
    reject(op, Category::BadInput, m)
}

impl Store {
    /// One effect by id.
    pub async fn hand_on(&self, effect_id: &str) -> Result<Option<HandOnView>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(&format!("{VIEW} WHERE effect_id = $1"), &[&effect_id])
            .await?
            .map(|r| HandOnView::from_row(&r))
            .transpose()
    }

    /// The effects (of one assignment), oldest first.
    pub async fn hand_ons(
        &self,
        assignment_id: Option<&str>,
    ) -> Result<Vec<HandOnView>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            &format!("{VIEW} WHERE $1::text IS NULL OR assignment_id = $1 ORDER BY requested_at, effect_id"),
            &[&assignment_id],
        )
        .await?
        .iter()
        .map(HandOnView::from_row)
        .collect()
    }

    /// The update admitted for effect `effect_id` and the milliseconds its window has left
    /// (database time), if it is ADMITTED and its window has not passed.
    pub async fn hand_on_admission(
        &self,
        effect_id: &str,
    ) -> Result<Option<(String, u64)>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query_opt(
            "SELECT operation_digest, \
                    floor(extract(epoch FROM dispatch_until - clock_timestamp()) * 1000)::bigint AS left_ms \
             FROM workspace_effects WHERE effect_id = $1 AND state = $2 AND dispatch_until > clock_timestamp()",
            &[&effect_id, &S::Admitted],
        )
        .await?
        .map(|r| Ok((r.col("operation_digest")?, r.col::<i64>("left_ms")?.max(0) as u64)))
        .transpose()
    }

    /// The effects host `host_id` may still claim (requested, before their deadline).
    pub async fn claimable_hand_ons(
        &self,
        host_id: &str,
    ) -> Result<Vec<(HandOnView, RestorePoint)>, AuthorityError> {
        let c = self.pool.get().await?;
        let views: Vec<HandOnView> = c
            .query(
                &format!(
                    "{VIEW} WHERE host_id = $1 AND state = $2 AND claim_deadline > clock_timestamp() ORDER BY requested_at"
                ),
                &[&host_id, &S::Requested],
            )
            .await?
            .iter()
            .map(HandOnView::from_row)
            .collect::<Result<_, _>>()?;
        drop(c);
        let mut out = vec![];
        for v in views {
            if let Some(p) = self
                .point_where("ck.checkpoint_digest = $1", &v.checkpoint_digest)
                .await?
            {
                out.push((v, p));
            }
        }
        Ok(out)
    }

    /// The effects host `host_id` was admitted for whose dispatch window passed with no
    /// report: seen when its next session opens, they are UNKNOWN from then on (its report,
    /// if it comes, reconciles them; else the operator does).
    pub async fn unreported_hand_ons(&self, host_id: &str) -> Result<Vec<String>, AuthorityError> {
        let c = self.pool.get().await?;
        c.query(
            "SELECT effect_id FROM workspace_effects WHERE host_id = $1 AND state = $2 AND dispatch_until < clock_timestamp()",
            &[&host_id, &S::Admitted],
        )
        .await?
        .iter()
        .map(|r| r.col("effect_id"))
        .collect()
    }

    /// The request (see the module docs): the effect, and the checkpoint its host reads.
    /// The same request key again is the same effect.
    pub async fn request_hand_on(
        &self,
        l: &Leader,
        r: &HandOnRequest,
    ) -> Result<(HandOnView, Option<RestorePoint>), AuthorityError> {
        const OP: &str = "workspace-effect";
        if r.request_key.is_empty() || r.request_key.len() > 200 {
            return Err(bad(OP, "a request key is 1 to 200 characters"));
        }
        let effect_id = effect_id(&r.request_key);
        // The same request again is the effect it made, whatever changed since.
        if let Some(v) = self.hand_on(&effect_id).await? {
            let point = self
                .point_where("ck.checkpoint_digest = $1", &v.checkpoint_digest)
                .await?;
            return Ok((v, point));
        }
        // Validated before anything is written.
        let c = self.pool.get().await?;
        let Some(a) = c
            .query_opt(
                "SELECT lifecycle, repository, base_ref, final_checkpoint_digest FROM assignments WHERE assignment_id = $1",
                &[&r.assignment_id],
            )
            .await?
        else {
            return Err(reject(OP, Category::NotFound, format!("no assignment {}", r.assignment_id)));
        };
        drop(c);
        let Some(repository) = a.col::<Option<String>>("repository")? else {
            return Err(reject(OP, Category::WrongState,
                format!("assignment {} has no workspace (it was not assigned with --repo): there is no branch to hand on", r.assignment_id)));
        };
        let lifecycle: Lifecycle = a.col("lifecycle")?;
        let final_ck: Option<String> = a.col("final_checkpoint_digest")?;
        let checkpoint_digest = match (lifecycle, final_ck) {
            (Lifecycle::Completed, Some(d)) => d,
            (l, _) => {
                return Err(reject(OP, Category::WrongState, format!(
                    "assignment {} is {}: only COMPLETED work is handed on (its final checkpoint is what is pushed)",
                    r.assignment_id, l.as_str()
                )))
            }
        };
        let reference = match (r.kind, &r.into) {
            (HandOn::Push, None) => format!(
                "refs/heads/{}",
                crate::protocol::repo::branch_of(&r.assignment_id)
            ),
            (HandOn::Push, Some(_)) => {
                return Err(bad(
                    OP,
                    "--into is for a merge; a push goes to the work's own branch",
                ))
            }
            (HandOn::Merge, Some(b)) => {
                format!("refs/heads/{}", b.strip_prefix("refs/heads/").unwrap_or(b))
            }
            (HandOn::Merge, None) => {
                let base: String = a.col("base_ref")?;
                if crate::protocol::repo::object_id_ok(&base) || base == "HEAD" {
                    return Err(bad(OP, format!(
                        "the work was based on {base}, not a branch: name the branch to merge into (--into)"
                    )));
                }
                format!(
                    "refs/heads/{}",
                    base.strip_prefix("refs/heads/").unwrap_or(&base)
                )
            }
        };
        if !branch_ref_ok(&reference) {
            return Err(bad(
                OP,
                format!("{reference} is not a branch an effect may update"),
            ));
        }
        let Some(point) = self
            .point_where("ck.checkpoint_digest = $1", &checkpoint_digest)
            .await?
        else {
            return Err(reject(OP, Category::NotFound, format!(
                "the final checkpoint {checkpoint_digest} is no longer recorded (deleted under its retention)"
            )));
        };
        if point.bundle_object.is_none()
            || (point.base_commit_id.is_some() && point.base_object.is_none())
        {
            return Err(reject(OP, Category::Unavailable, format!(
                "the final checkpoint {checkpoint_digest} is not whole in the coordinator's store yet (its host uploads it): try again shortly"
            )));
        }
        let host_id = match &r.host_id {
            Some(h) => h.strip_prefix("host:").unwrap_or(h).to_string(),
            None => match self.workspace_of(&r.assignment_id).await? {
                Some((_, h)) => h,
                None => point.host_id.clone(),
            },
        };
        if !crate::protocol::report::id_ok(&host_id) {
            return Err(bad(OP, "a host id is letters, digits and . _ : -"));
        }
        let step = Step::new(
            OP,
            l,
            format!("workspace-effect/{}", r.request_key),
            request_digest(
                OP,
                &[r.kind.as_str(), &r.assignment_id, &reference, &host_id],
            ),
        )
        .about(Some(&r.assignment_id), None);
        let (x, sot, epoch, kind) = (r.clone(), l.sot().to_string(), l.epoch(), r.kind.as_str());
        let (id, commit) = (effect_id.clone(), point.commit_id.clone());
        let receipt = self
            .transition(
                &step,
                body!([x, sot, id, reference, checkpoint_digest, commit, host_id, repository] |f| {
                    // One request of a work at a time, and none while a claim of its effects
                    // commits: their rows pin the check below.
                    f.read("SELECT 1 FROM assignments WHERE assignment_id = $1 FOR UPDATE", &[&x.assignment_id]).await?;
                    f.read("SELECT 1 FROM workspace_effects WHERE assignment_id = $1 FOR UPDATE", &[&x.assignment_id]).await?;
                    let d = f.cas(
                        concatcp!("INSERT INTO workspace_effects (effect_id, request_key, kind, assignment_id, repository, reference, \
                             checkpoint_digest, commit_id, host_id, requested_by, sot_incarnation, coordinator_epoch, claim_deadline) \
                         SELECT $1, $2, $3, a.assignment_id, $4, $5, $6, $7, $8, $9, $10, $11, clock_timestamp() + interval '", CLAIM_WITHIN, "' \
                         FROM assignments a WHERE a.assignment_id = $12 AND a.lifecycle = ", Lifecycle::Completed.sql(), " \
                           AND a.final_checkpoint_digest = $6 \
                           AND EXISTS (SELECT 1 FROM checkpoints ck JOIN checkpoint_objects o ON o.object_digest = ck.bundle_object \
                                       WHERE ck.checkpoint_digest = $6 AND ck.assignment_id = a.assignment_id AND o.stored_at IS NOT NULL) \
                           AND NOT EXISTS (SELECT 1 FROM workspace_effects e WHERE e.assignment_id = a.assignment_id \
                                 AND (e.state IN (", S::Admitted.sql(), ", ", S::Unknown.sql(), ") \
                                      OR (e.state = ", S::Requested.sql(), " AND e.claim_deadline > clock_timestamp()))) \
                         RETURNING effect_id"),
                        &[&id, &x.request_key, &kind, &repository, &reference, &checkpoint_digest, &commit, &host_id,
                          &x.requested_by, &sot, &epoch, &x.assignment_id],
                    ).await?;
                    let d = match d {
                        Ok(d) => d,
                        Err(u) => {
                            let open = u.read_opt(
                                concatcp!("SELECT effect_id, state FROM workspace_effects WHERE assignment_id = $1 \
                                     AND (state IN (", S::Admitted.sql(), ", ", S::Unknown.sql(), ") \
                                          OR (state = ", S::Requested.sql(), " AND claim_deadline > clock_timestamp())) LIMIT 1"),
                                &[&x.assignment_id]).await?;
                            return Err(match open {
                                Some(o) => {
                                    let (e, s): (String, String) = (o.col("effect_id")?, o.col("state")?);
                                    u.reject(Category::Conflict, format!(
                                        "effect {e} of this work is still open ({s}): it settles first (`mosaic workspace effects`)"
                                    )).await?
                                }
                                None => u.reject(Category::WrongState, "the work is no longer COMPLETED on that checkpoint, or the checkpoint is no longer stored").await?,
                            });
                        }
                    };
                    // Requests nobody claimed in time are closed for good.
                    d.exec(concatcp!("UPDATE workspace_effects SET state = ", S::Expired.sql(), ", resolved_at = clock_timestamp() \
                         WHERE assignment_id = $1 AND state = ", S::Requested.sql(), " AND claim_deadline <= clock_timestamp()"),
                        &[&x.assignment_id]).await?;
                    d.decide(json!({ "effect_id": id, "kind": kind, "assignment_id": x.assignment_id, "reference": reference,
                        "checkpoint_digest": checkpoint_digest, "commit_id": commit, "host_id": host_id }))
                }),
            )
            .await?;
        let id = receipt.str("effect_id")?;
        let view = self
            .hand_on(&id)
            .await?
            .ok_or_else(|| AuthorityError::Invariant {
                op: OP,
                detail: format!("effect {id} has a receipt but no row"),
            })?;
        Ok((view, Some(point)))
    }

    /// The claim CAS (see the module docs): host `host_id` will update the effect's ref from
    /// `old_id` to `new_id`. A repeat of the same claim returns its receipt (`replayed`).
    pub async fn claim_hand_on(
        &self,
        l: &Leader,
        host_id: &str,
        effect_id: &str,
        old_id: &str,
        new_id: &str,
        shown_digest: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "workspace-effect-claim";
        if !crate::protocol::repo::object_id_ok(old_id)
            || !crate::protocol::repo::object_id_ok(new_id)
            || old_id == new_id
        {
            return Err(bad(OP, "a claim names two different 40-hex object ids"));
        }
        let Some(v) = self.hand_on(effect_id).await? else {
            return Err(reject(OP, Category::NotFound, "no such workspace effect"));
        };
        if v.host_id != host_id {
            return Err(reject(
                OP,
                Category::NotOwner,
                format!("effect {effect_id} is not host:{host_id}'s to make"),
            ));
        }
        let digest = operation_digest(&v, old_id, new_id);
        if !crate::util::ct::eq(digest.as_bytes(), shown_digest.as_bytes()) {
            return Err(reject(
                OP,
                Category::Mismatch,
                "the claim's operation digest is not its update's",
            ));
        }
        let step = Step::new(
            OP,
            l,
            format!("workspace-effect-claim/{effect_id}"),
            request_digest(OP, &[old_id, new_id]),
        )
        .about(Some(&v.assignment_id), None);
        let (id, host, old, new) = (
            effect_id.to_string(),
            host_id.to_string(),
            old_id.to_string(),
            new_id.to_string(),
        );
        self.transition(
            &step,
            body!([id, host, old, new, digest] |f| {
                let d = f.cas(
                    concatcp!("UPDATE workspace_effects e SET state = ", S::Admitted.sql(), ", old_id = $3, new_id = $4, operation_digest = $5, \
                         admitted_at = clock_timestamp(), dispatch_until = clock_timestamp() + interval '", DISPATCH_WITHIN, "' \
                     FROM assignments a \
                     WHERE e.effect_id = $1 AND e.host_id = $2 AND e.state = ", S::Requested.sql(), " AND e.claim_deadline > clock_timestamp() \
                       AND a.assignment_id = e.assignment_id AND a.lifecycle = ", Lifecycle::Completed.sql(), " \
                       AND a.final_checkpoint_digest = e.checkpoint_digest AND (e.kind <> 'push' OR $4 = e.commit_id) \
                     RETURNING e.assignment_id, mosaic_ts(e.dispatch_until) AS dispatch_until"),
                    &[&id, &host, &old, &new, &digest],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let row = u.read_opt(
                            "SELECT e.state, e.claim_deadline > clock_timestamp() AS in_time, e.kind, e.commit_id, \
                                    a.lifecycle, a.final_checkpoint_digest IS NOT DISTINCT FROM e.checkpoint_digest AS same \
                             FROM workspace_effects e JOIN assignments a ON a.assignment_id = e.assignment_id WHERE e.effect_id = $1",
                            &[&id]).await?;
                        let Some(row) = row else {
                            return Err(u.reject(Category::NotFound, "no such workspace effect").await?);
                        };
                        let state: S = row.col("state")?;
                        return Err(if state != S::Requested {
                            u.reject(Category::WrongState, format!("the effect is {}: it is claimed once", state.as_str())).await?
                        } else if !row.col::<bool>("in_time")? {
                            u.reject(Category::Expired, "the effect was not claimed before its deadline (database time)").await?
                        } else if row.col::<String>("lifecycle")? != Lifecycle::Completed.as_str() || !row.col::<bool>("same")? {
                            u.reject(Category::WrongState, "the work is no longer COMPLETED on the checkpoint the effect names").await?
                        } else {
                            u.reject(Category::Mismatch, "a push puts exactly the final checkpoint's commit on its ref").await?
                        });
                    }
                };
                let (asg, until): (String, String) = (d.row().col("assignment_id")?, d.row().col("dispatch_until")?);
                d.decide(json!({ "effect_id": id, "assignment_id": asg, "old_id": old, "new_id": new,
                    "operation_digest": digest, "dispatch_until": until }))
            }),
        )
        .await
    }

    /// What host `host_id` observed of its effect (see the module docs). The same
    /// settlement again returns its receipt.
    pub async fn settle_hand_on(
        &self,
        l: &Leader,
        host_id: &str,
        effect_id: &str,
        outcome: HandOnOutcome,
        result_digest: &str,
        detail: Option<&str>,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "workspace-effect-settle";
        if !crate::protocol::envelope::is_digest(result_digest)
            || detail.is_some_and(|d| d.is_empty() || d.chars().count() > 400)
        {
            return Err(bad(
                OP,
                "a settlement needs a sha256 result digest and at most 400 characters of detail",
            ));
        }
        let Some(v) = self.hand_on(effect_id).await? else {
            return Err(reject(OP, Category::NotFound, "no such workspace effect"));
        };
        if v.host_id != host_id {
            return Err(reject(
                OP,
                Category::NotOwner,
                format!("effect {effect_id} is not host:{host_id}'s"),
            ));
        }
        // From each state the outcome may settle, the state it moves to.
        let (from, to, reconciliation, detail) = match outcome {
            HandOnOutcome::Declined => {
                (S::Requested, S::Declined, None, detail.map(str::to_string))
            }
            HandOnOutcome::UpToDate => {
                (S::Requested, S::UpToDate, None, detail.map(str::to_string))
            }
            // Never claimed (its claim went unanswered): nothing was pushed.
            HandOnOutcome::NotDispatched if v.state == S::Requested => (
                S::Requested,
                S::Declined,
                None,
                Some(
                    detail
                        .unwrap_or("its claim went unanswered: nothing was pushed")
                        .to_string(),
                ),
            ),
            HandOnOutcome::NotDispatched if v.state == S::Unknown => (
                S::Unknown,
                S::Reconciled,
                Some(format!("observed-late: {}", outcome.as_str())),
                detail.map(str::to_string),
            ),
            HandOnOutcome::NotDispatched => (
                S::Admitted,
                S::NotDispatched,
                None,
                detail.map(str::to_string),
            ),
            HandOnOutcome::Unknown => (S::Admitted, S::Unknown, None, detail.map(str::to_string)),
            HandOnOutcome::Completed | HandOnOutcome::Failed if v.state == S::Unknown => (
                S::Unknown,
                S::Reconciled,
                Some(format!("observed-late: {}", outcome.as_str())),
                detail.map(str::to_string),
            ),
            HandOnOutcome::Completed => {
                (S::Admitted, S::Completed, None, detail.map(str::to_string))
            }
            HandOnOutcome::Failed => (S::Admitted, S::Failed, None, detail.map(str::to_string)),
        };
        let step = Step::new(
            OP,
            l,
            format!("workspace-effect-settle/{effect_id}/{}", from.as_str()),
            request_digest(
                OP,
                &[
                    outcome.as_str(),
                    result_digest,
                    detail.as_deref().unwrap_or(""),
                ],
            ),
        )
        .about(Some(&v.assignment_id), None);
        let (id, digest) = (effect_id.to_string(), result_digest.to_string());
        let resolved = to != S::Unknown;
        self.transition(
            &step,
            body!([id, digest, detail, reconciliation] |f| {
                let d = f.cas(
                    "UPDATE workspace_effects SET state = $3, result_digest = $4, \
                         detail = coalesce($5, detail), reconciliation = $6, \
                         resolved_at = CASE WHEN $7 THEN clock_timestamp() END \
                     WHERE effect_id = $1 AND state = $2 RETURNING assignment_id",
                    &[&id, &from, &to, &digest, &detail, &reconciliation, &resolved],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let now = u.read_opt("SELECT state FROM workspace_effects WHERE effect_id = $1", &[&id]).await?;
                        let now: Option<String> = now.map(|r| r.col("state")).transpose()?;
                        return Err(u.reject(Category::WrongState, format!(
                            "the effect is {}, not {}: that settlement does not apply", now.unwrap_or_default(), from.as_str()
                        )).await?);
                    }
                };
                let asg: String = d.row().col("assignment_id")?;
                d.decide(json!({ "effect_id": id, "assignment_id": asg, "state": to, "result_digest": digest,
                    "reconciliation": reconciliation }))
            }),
        )
        .await
    }

    /// The operator settles an effect whose outcome nobody observed (UNKNOWN, or ADMITTED
    /// and unreported long past its dispatch window), with the digest of its evidence.
    pub async fn resolve_hand_on(
        &self,
        l: &Leader,
        effect_id: &str,
        applied: bool,
        evidence_digest: &str,
        request_id: &str,
    ) -> Result<Receipt, AuthorityError> {
        const OP: &str = "workspace-effect-resolve";
        if !crate::protocol::envelope::is_digest(evidence_digest) {
            return Err(bad(
                OP,
                "resolving an effect needs the sha256 digest of its evidence",
            ));
        }
        let verdict = if applied { "applied" } else { "not applied" };
        let step = Step::new(
            OP,
            l,
            format!("workspace-effect-resolve/{effect_id}/{request_id}"),
            request_digest(OP, &[effect_id, verdict, evidence_digest]),
        );
        let (id, how) = (
            effect_id.to_string(),
            format!("operator: {verdict} (evidence {evidence_digest})"),
        );
        self.transition(
            &step,
            body!([id, how] |f| {
                let d = f.cas(
                    concatcp!("UPDATE workspace_effects SET state = ", S::Reconciled.sql(), ", reconciliation = $2, resolved_at = clock_timestamp() \
                     WHERE effect_id = $1 AND (state = ", S::Unknown.sql(), " OR (state = ", S::Admitted.sql(), " \
                           AND dispatch_until + interval '", UNOBSERVED_AFTER, "' < clock_timestamp())) \
                     RETURNING assignment_id"),
                    &[&id, &how],
                ).await?;
                let d = match d {
                    Ok(d) => d,
                    Err(u) => {
                        let known = u.read_opt("SELECT state FROM workspace_effects WHERE effect_id = $1", &[&id]).await?;
                        return Err(match known {
                            None => u.reject(Category::NotFound, "no such workspace effect").await?,
                            Some(_) => u.reject(Category::WrongState, concatcp!(
                                "only an effect whose outcome is unknown (or admitted and unreported for ",
                                UNOBSERVED_AFTER, " past its window) is resolved by hand")).await?,
                        });
                    }
                };
                let asg: String = d.row().col("assignment_id")?;
                d.decide(json!({ "effect_id": id, "assignment_id": asg, "reconciliation": how, "state": S::Reconciled }))
            }),
        )
        .await
    }
}
