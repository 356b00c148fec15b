//! Releasing a host's copy of done work (`workspace_release`, answered by
//! `workspace_release_answer`): a host asks whether it may delete its workspace of an
//! assignment and the checkpoint refs it holds of it (`ask`, with the tree its workspace
//! holds now and the checkpoint it says that tree is), deletes only on `release`, then says
//! it did (`done`). The coordinator answers `release` only for work that has ended and
//! whose files on that host are a checkpoint its store holds (or one deleted under its
//! retention), so a deletion never loses the only copy of anything.

use super::{Fields, WireError};
use crate::protocol::canonical::Value;
use crate::protocol::envelope::{n, s};

/// Which half of a release a host's message is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseStep {
    /// May it delete? `workspace`: the tree its workspace's files make now and the
    /// checkpoint (of the same assignment) it says has that tree; `None` when no workspace
    /// is left there (only checkpoint refs).
    Ask { workspace: Option<HeldTree> },
    /// It deleted: the workspace (if any) and `refs_removed` checkpoint refs.
    Done { refs_removed: u64 },
}

/// The tree a host's workspace holds and the checkpoint it matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldTree {
    pub tree_id: String,
    pub checkpoint_digest: String,
}

/// `workspace_release`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceRelease {
    pub assignment_id: String,
    pub step: ReleaseStep,
}

/// The coordinator's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReleaseVerdict {
    /// (To `ask`.) Delete it: the work has ended and nothing would be lost.
    Release,
    /// (To `done`.) The deletion is recorded.
    Recorded,
    /// Keep it (`active`: the work goes on; `not-stored`: its files are in no checkpoint
    /// the store holds; `not-owner`: this host never held the work; `not-found`).
    Keep(String),
    /// Not now (no leader, a database fault): ask again later.
    Retry(String),
}

impl ReleaseVerdict {
    fn encode(&self) -> String {
        match self {
            Self::Release => "release".into(),
            Self::Recorded => "recorded".into(),
            Self::Keep(c) => format!("keep:{c}"),
            Self::Retry(c) => format!("retry:{c}"),
        }
    }

    fn parse(v: &str) -> Option<Self> {
        let cat = |p: &str| super::category_after(v, p);
        match v {
            "release" => Some(Self::Release),
            "recorded" => Some(Self::Recorded),
            _ => cat("keep:")
                .map(Self::Keep)
                .or_else(|| cat("retry:").map(Self::Retry)),
        }
    }
}

/// `workspace_release_answer`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkspaceReleaseAnswer {
    pub assignment_id: String,
    /// `ask` or `done`: which message it answers.
    pub done: bool,
    pub verdict: ReleaseVerdict,
}

fn session_fields(f: &mut Vec<(&'static str, Value)>, what: &str, assignment_id: &str) {
    f.extend([
        (
            "idempotency_key",
            s(&format!(
                "{what}/{assignment_id}/{}",
                uuid::Uuid::new_v4().simple()
            )),
        ),
        ("sot_incarnation", Value::Null),
        ("coordinator_epoch", Value::Null),
        ("assignment_id", s(assignment_id)),
    ]);
}

impl WorkspaceRelease {
    pub fn fields(&self) -> Vec<(&'static str, Value)> {
        let mut f = vec![];
        session_fields(&mut f, "workspace-release", &self.assignment_id);
        match &self.step {
            ReleaseStep::Ask { workspace } => {
                f.push(("step", s("ask")));
                if let Some(w) = workspace {
                    f.extend([
                        ("tree_id", s(&w.tree_id)),
                        ("checkpoint_digest", s(&w.checkpoint_digest)),
                    ]);
                }
            }
            ReleaseStep::Done { refs_removed } => {
                f.extend([("step", s("done")), ("refs_removed", n(*refs_removed))]);
            }
        }
        f
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let step = f.str("step")?;
        let step = match step.as_str() {
            "ask" => {
                let workspace = match (f.opt_str("tree_id"), f.opt_str("checkpoint_digest")) {
                    (Some(tree_id), Some(checkpoint_digest)) => {
                        if !crate::protocol::repo::object_id_ok(&tree_id) {
                            return Err(f.miss("tree_id", "a 40-hex object id"));
                        }
                        Some(HeldTree {
                            tree_id,
                            checkpoint_digest,
                        })
                    }
                    (None, None) => None,
                    (Some(_), None) => {
                        return Err(f.miss("checkpoint_digest", "present with tree_id"))
                    }
                    (None, Some(_)) => {
                        return Err(f.miss("tree_id", "present with checkpoint_digest"))
                    }
                };
                if f.opt_uint("refs_removed").is_some() {
                    return Err(f.miss("refs_removed", "absent from an ask"));
                }
                ReleaseStep::Ask { workspace }
            }
            "done" => {
                if f.opt_str("tree_id").is_some() || f.opt_str("checkpoint_digest").is_some() {
                    return Err(f.miss("tree_id", "absent from a done"));
                }
                ReleaseStep::Done {
                    refs_removed: f.uint("refs_removed")?,
                }
            }
            other => return Err(f.unknown("step", other)),
        };
        Ok(Self {
            assignment_id: f.str("assignment_id")?,
            step,
        })
    }
}

impl WorkspaceReleaseAnswer {
    pub(super) fn fields(&self, f: &mut Vec<(&'static str, Value)>) {
        session_fields(f, "workspace-release-answer", &self.assignment_id);
        f.extend([
            ("step", s(if self.done { "done" } else { "ask" })),
            ("verdict", s(&self.verdict.encode())),
        ]);
    }

    pub(super) fn decode(f: &Fields<'_>) -> Result<Self, WireError> {
        let step = f.str("step")?;
        let done = match step.as_str() {
            "ask" => false,
            "done" => true,
            other => return Err(f.unknown("step", other)),
        };
        let v = f.str("verdict")?;
        let verdict = ReleaseVerdict::parse(&v).ok_or_else(|| f.unknown("verdict", &v))?;
        // `release` answers an ask, `recorded` a done; never the other way round.
        match (&verdict, done) {
            (ReleaseVerdict::Release, true) | (ReleaseVerdict::Recorded, false) => {
                return Err(f.unknown("verdict", &v))
            }
            _ => {}
        }
        Ok(Self {
            assignment_id: f.str("assignment_id")?,
            done,
            verdict,
        })
    }
}
