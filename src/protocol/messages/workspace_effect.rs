//! Handing done work's branch on (`mosaic workspace push|merge`, migration 0027): the
//! coordinator orders one host to make the effect (`workspace_order`: the work's final
//! checkpoint, where its bytes are in the store, the repository and the ref); the host
//! reads the checkpoint, works out the exact ref update in a mirror of its own and claims
//! it (`workspace_effect`, step `claim`), or says why it makes none (`settle` with
//! `declined` or `up-to-date`); only once admitted does it push, then it reports what the
//! remote shows (`settle`). Each host message is answered (`workspace_effect_answer`).

use super::{Fields, WireError};
use crate::protocol::canonical::Value;
use crate::protocol::envelope::s;
use crate::protocol::repo::{object_id_ok, RepoName, RestorePoint};

/// What an effect does with the work's final checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandOn {
    /// Puts it on the work's own branch (`refs/heads/mosaic/<assignment>`) of the remote.
    Push,
    /// Merges it into a branch of the remote (fast-forward, or a merge commit).
    Merge,
}

impl HandOn {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Push => "push",
            Self::Merge => "merge",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "push" => Some(Self::Push),
            "merge" => Some(Self::Merge),
            _ => None,
        }
    }
}

/// A branch ref an effect may update: `refs/heads/` and a plain name.
pub fn branch_ref_ok(r: &str) -> bool {
    r.strip_prefix("refs/heads/").is_some_and(|b| {
        !b.is_empty()
            && b.len() <= 200
            && b.bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._/-".contains(&c))
            && !b.contains("..")
            && !b.starts_with(['/', '.', '-'])
            && !b.ends_with(['/', '.'])
            && !b.ends_with(".lock")
            && !b.contains("//")
            && !b.contains("/.")
    })
}

/// An effect id as the coordinator mints it.
pub fn effect_id_ok(id: &str) -> bool {
    id.strip_prefix("we-").is_some_and(|h| {
        h.len() == 32
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The digest of the exact update an effect makes (what its host claims and the
/// coordinator admits): the effect, what it does where, with which checkpoint, from which
/// old id to which new one.
pub fn hand_on_operation_digest(
    effect_id: &str,
    kind: &str,
    repository: &str,
    reference: &str,
    commit_id: &str,
    old_id: &str,
    new_id: &str,
) -> String {
    format!(
        "sha256:{}",
        crate::util::sha256_hex(
            "mosaic/workspace-effect-operation/v1",
            &[
                effect_id.as_bytes(),
                kind.as_bytes(),
                repository.as_bytes(),
                reference.as_bytes(),
                commit_id.as_bytes(),
                old_id.as_bytes(),
                new_id.as_bytes(),
            ],
        )
    )
}

/// `workspace_order`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceOrder {
    pub effect_id: String,
    pub assignment_id: String,
    pub kind: HandOn,
    pub repository: RepoName,
    /// The ref updated: the work's branch for a push, the branch merged into for a merge.
    pub reference: String,
    /// The work's final checkpoint and where its bytes are in the store.
    pub checkpoint: RestorePoint,
}

/// What a host's `workspace_effect` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EffectStep {
    /// The exact update it will make, if admitted: `reference` from `old_id` (all zeros:
    /// the ref does not exist) to `new_id`.
    Claim {
        old_id: String,
        new_id: String,
        operation_digest: String,
    },
    /// What came of it: `outcome` and the digest of what was observed (`detail`: why, for
    /// a decline or a failure; never a URL or a credential).
    Settle {
        outcome: HandOnOutcome,
        result_digest: String,
        detail: Option<String>,
    },
}

/// A host's settlement of an effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HandOnOutcome {
    /// No claim made, nothing changed (before a claim).
    Declined,
    /// The remote already had it (before a claim).
    UpToDate,
    /// The remote's ref is at the admitted new id.
    Completed,
    /// The remote refused the update (its ref is not at the new id).
    Failed,
    /// Admitted but never sent (the admission's window passed).
    NotDispatched,
    /// It could not be told whether the remote took it.
    Unknown,
}

impl HandOnOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Declined => "declined",
            Self::UpToDate => "up-to-date",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::NotDispatched => "not-dispatched",
            Self::Unknown => "unknown",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [
            Self::Declined,
            Self::UpToDate,
            Self::Completed,
            Self::Failed,
            Self::NotDispatched,
            Self::Unknown,
        ]
        .into_iter()
        .find(|o| o.as_str() == s)
    }

    /// Whether it settles an effect before any claim (else only an admitted one).
    pub fn before_claim(self) -> bool {
        matches!(self, Self::Declined | Self::UpToDate)
    }
}

/// `workspace_effect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceEffect {
    pub effect_id: String,
    pub assignment_id: String,
    pub step: EffectStep,
}

/// The coordinator's answer to a `workspace_effect`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandOnVerdict {
    /// (To a claim.) Admitted: push now, with a lease on the old id.
    Admitted,
    /// (To a settle.) Recorded.
    Recorded,
    /// Refused for good (`category`): a claim makes no push.
    Refused(String),
    /// Not now (no leader, a database fault): a settle is sent again; a claim is not
    /// pushed.
    Retry(String),
}

impl HandOnVerdict {
    fn encode(&self) -> String {
        match self {
            Self::Admitted => "admitted".into(),
            Self::Recorded => "recorded".into(),
            Self::Refused(c) => format!("refused:{c}"),
            Self::Retry(c) => format!("retry:{c}"),
        }
    }

    fn parse(v: &str) -> Option<Self> {
        let cat = |p: &str| super::category_after(v, p);
        match v {
            "admitted" => Some(Self::Admitted),
            "recorded" => Some(Self::Recorded),
            _ => cat("refused:")
                .map(Self::Refused)
                .or_else(|| cat("retry:").map(Self::Retry)),
        }
    }
}

/// `workspace_effect_answer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceEffectAnswer {
    pub effect_id: String,
    pub assignment_id: String,
    /// Whether it answers a claim (else a settle).
    pub claim: bool,
    pub verdict: HandOnVerdict,
    /// With `admitted`: the operation admitted (the host pushes only the update whose
    /// digest this is) and how long its window had left when the answer was made (database
    /// time; the host counts it from before it sent the claim).
    pub admitted: Option<(String, u64)>,
}

fn head(f: &mut Vec<(&'static str, Value)>, what: &str, effect_id: &str, assignment_id: &str) {
    f.extend([
        (
            "idempotency_key",
            s(&format!(
                "{what}/{effect_id}/{}",
                uuid::Uuid::new_v4().simple()
            )),
        ),
        ("sot_incarnation", Value::Null),
        ("coordinator_epoch", Value::Null),
        ("assignment_id", s(assignment_id)),
        ("effect_id", s(effect_id)),
    ]);
}

fn effect_id_of(f: &Fields<'_>) -> Result<String, WireError> {
    let id = f.str("effect_id")?;
    if !effect_id_ok(&id) {
        return Err(f.miss("effect_id", "a workspace effect id (we-…)"));
    }
    Ok(id)
}

impl WorkspaceOrder {
    pub(super) fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        head(f, "workspace-order", &self.effect_id, &self.assignment_id);
        f.extend([
            ("kind", s(self.kind.as_str())),
            ("repository", s(self.repository.as_str())),
            ("reference", s(&self.reference)),
        ]);
        super::checkpoint::restore_fields(f, &self.checkpoint);
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let kind = f.str("kind")?;
        let kind = HandOn::parse(&kind).ok_or_else(|| f.unknown("kind", &kind))?;
        let repository = f.str("repository")?;
        let repository =
            RepoName::parse(&repository).map_err(|_| f.unknown("repository", &repository))?;
        let reference = f.str("reference")?;
        if !branch_ref_ok(&reference) {
            return Err(f.unknown("reference", &reference));
        }
        let checkpoint = f
            .restore()?
            .ok_or_else(|| f.miss("restore_checkpoint_digest", "a checkpoint"))?;
        if !checkpoint.well_formed(&repository) {
            return Err(f.unknown("restore_checkpoint_digest", "not its commit's and tree's"));
        }
        Ok(Self {
            effect_id: effect_id_of(f)?,
            assignment_id: f.str("assignment_id")?,
            kind,
            repository,
            reference,
            checkpoint,
        })
    }
}

impl WorkspaceEffect {
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![];
        head(
            &mut f,
            "workspace-effect",
            &self.effect_id,
            &self.assignment_id,
        );
        match &self.step {
            EffectStep::Claim {
                old_id,
                new_id,
                operation_digest,
            } => f.extend([
                ("step", s("claim")),
                ("old_id", s(old_id)),
                ("new_id", s(new_id)),
                ("operation_digest", s(operation_digest)),
            ]),
            EffectStep::Settle {
                outcome,
                result_digest,
                detail,
            } => {
                f.extend([
                    ("step", s("settle")),
                    ("outcome", s(outcome.as_str())),
                    ("result_digest", s(result_digest)),
                ]);
                if let Some(d) = detail {
                    f.push(("detail", s(d)));
                }
            }
        }
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let step = f.str("step")?;
        let step = match step.as_str() {
            "claim" => {
                if f.opt_str("outcome").is_some() || f.opt_str("detail").is_some() {
                    return Err(f.miss("outcome", "absent from a claim"));
                }
                let (old_id, new_id) = (f.str("old_id")?, f.str("new_id")?);
                if !object_id_ok(&old_id) || !object_id_ok(&new_id) {
                    return Err(f.miss("old_id", "40-hex object ids"));
                }
                let operation_digest = f.str("operation_digest")?;
                if !crate::protocol::envelope::is_digest(&operation_digest) {
                    return Err(f.miss("operation_digest", "a sha256 digest"));
                }
                EffectStep::Claim {
                    old_id,
                    new_id,
                    operation_digest,
                }
            }
            "settle" => {
                if f.opt_str("old_id").is_some() || f.opt_str("new_id").is_some() {
                    return Err(f.miss("old_id", "absent from a settle"));
                }
                let o = f.str("outcome")?;
                let outcome = HandOnOutcome::parse(&o).ok_or_else(|| f.unknown("outcome", &o))?;
                let result_digest = f.str("result_digest")?;
                if !crate::protocol::envelope::is_digest(&result_digest) {
                    return Err(f.miss("result_digest", "a sha256 digest"));
                }
                let detail = f.opt_str("detail");
                if detail
                    .as_deref()
                    .is_some_and(|d| d.chars().count() > 400 || d.chars().any(char::is_control))
                {
                    return Err(f.miss("detail", "at most 400 characters, none a control"));
                }
                EffectStep::Settle {
                    outcome,
                    result_digest,
                    detail,
                }
            }
            other => return Err(f.unknown("step", other)),
        };
        Ok(Self {
            effect_id: effect_id_of(f)?,
            assignment_id: f.str("assignment_id")?,
            step,
        })
    }
}

impl WorkspaceEffectAnswer {
    pub(super) fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        head(
            f,
            "workspace-effect-answer",
            &self.effect_id,
            &self.assignment_id,
        );
        f.extend([
            ("step", s(if self.claim { "claim" } else { "settle" })),
            ("verdict", s(&self.verdict.encode())),
        ]);
        if let Some((digest, ms)) = &self.admitted {
            f.extend([
                ("operation_digest", s(digest)),
                ("dispatch_within_ms", crate::protocol::envelope::n(*ms)),
            ]);
        }
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let step = f.str("step")?;
        let claim = match step.as_str() {
            "claim" => true,
            "settle" => false,
            other => return Err(f.unknown("step", other)),
        };
        let v = f.str("verdict")?;
        let verdict = HandOnVerdict::parse(&v).ok_or_else(|| f.unknown("verdict", &v))?;
        // `admitted` answers a claim, `recorded` a settle; never the other way round.
        match (&verdict, claim) {
            (HandOnVerdict::Admitted, false) | (HandOnVerdict::Recorded, true) => {
                return Err(f.unknown("verdict", &v))
            }
            _ => {}
        }
        // An admission names what it admitted and its window; nothing else does.
        let admitted = match (
            &verdict,
            f.opt_str("operation_digest"),
            f.opt_uint("dispatch_within_ms"),
        ) {
            (HandOnVerdict::Admitted, Some(d), Some(ms))
                if crate::protocol::envelope::is_digest(&d) =>
            {
                Some((d, ms))
            }
            (HandOnVerdict::Admitted, ..) => {
                return Err(f.miss("operation_digest", "an admission's digest and window"))
            }
            (_, None, None) => None,
            _ => return Err(f.miss("operation_digest", "absent but from an admission")),
        };
        Ok(Self {
            effect_id: effect_id_of(f)?,
            assignment_id: f.str("assignment_id")?,
            claim,
            verdict,
            admitted,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_round_trip_and_unknown_text_is_refused() {
        for v in [
            HandOnVerdict::Admitted,
            HandOnVerdict::Recorded,
            HandOnVerdict::Refused("wrong-state".into()),
            HandOnVerdict::Retry("unavailable".into()),
        ] {
            assert_eq!(HandOnVerdict::parse(&v.encode()), Some(v));
        }
        for bad in ["", "ok", "refused:", "retry", "admitted:x"] {
            assert_eq!(HandOnVerdict::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn only_plain_branches_are_refs_an_effect_updates() {
        for ok in [
            "refs/heads/main",
            "refs/heads/mosaic/asg-1",
            "refs/heads/a.b_c-d",
        ] {
            assert!(branch_ref_ok(ok), "{ok}");
        }
        for bad in [
            "main",
            "refs/tags/v1",
            "refs/heads/",
            "refs/heads/../x",
            "refs/heads/a..b",
            "refs/heads/-x",
            "refs/heads/x.lock",
            "refs/heads/a//b",
            "refs/heads/a/.b",
            "refs/heads/a b",
            "refs/heads/a~1",
            "refs/heads/x/",
        ] {
            assert!(!branch_ref_ok(bad), "{bad}");
        }
        assert!(effect_id_ok(&format!("we-{}", "a".repeat(32))));
        assert!(!effect_id_ok(&format!("ef-{}", "a".repeat(32))));
        assert!(!effect_id_ok("we-XYZ"));
    }

    #[test]
    fn outcomes_round_trip() {
        for o in [
            HandOnOutcome::Declined,
            HandOnOutcome::UpToDate,
            HandOnOutcome::Completed,
            HandOnOutcome::Failed,
            HandOnOutcome::NotDispatched,
            HandOnOutcome::Unknown,
        ] {
            assert_eq!(HandOnOutcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(HandOnOutcome::parse("done"), None);
    }
}
