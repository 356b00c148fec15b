//! A host's checkpoint transfers: the parts of the objects it uploads for its own
//! checkpoints, and the parts it fetches to restore the one its stage names
//! (`coordinator::checkpoint_store` decides both). Each part is answered; an answer this
//! side cannot give now (the database) is `retry`, so the host tries again later.

use super::*;
use crate::protocol::messages::{
    CheckpointData, CheckpointFetch, CheckpointStored, CheckpointUpload, DataAnswer, ReleaseStep,
    ReleaseVerdict, StoredVerdict, WorkspaceRelease, WorkspaceReleaseAnswer,
};

impl Service {
    pub(super) async fn on_checkpoint_upload(&self, host: &str, m: CheckpointUpload) -> Handled {
        let (verdict, received) = match self
            .store
            .checkpoint_upload(host, &m, self.timing.checkpoint_max_bytes)
            .await
        {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(host, error = %e, "a checkpoint upload could not be stored now");
                (
                    StoredVerdict::Retry(e.category().map_or("unavailable", |c| c.as_str()).into()),
                    0,
                )
            }
        };
        match &verdict {
            StoredVerdict::Stored => tracing::info!(host, assignment_id = %m.assignment_id,
                role = m.role.as_str(), object = %m.object_digest, size = m.object_size, "checkpoint object stored"),
            StoredVerdict::Refused(c) => {
                tracing::warn!(host, assignment_id = %m.assignment_id, role = m.role.as_str(),
                    object = %m.object_digest, category = %c, "checkpoint upload refused");
                self.store.auditor().record(
                    "checkpoint-upload",
                    Category::parse(c).unwrap_or(Category::BadInput),
                    None,
                    Some(&m.assignment_id),
                    Some(&m.lane_incarnation_id),
                    &format!("host:{host} {} {}: {c}", m.role.as_str(), m.object_digest),
                );
            }
            _ => {}
        }
        let violation = match &verdict {
            StoredVerdict::Refused(c) => Category::parse(c)
                .filter(|c| matches!(c, Category::NotOwner | Category::Mismatch))
                .map(|c| format!("refused-{}", c.as_str())),
            _ => None,
        };
        let reply = ToHost::CheckpointStored(CheckpointStored {
            object_digest: m.object_digest,
            verdict,
            received,
        });
        Handled {
            replies: vec![Outgoing::to_host(&self.session, &reply)],
            violation,
            deferred: None,
        }
    }

    pub(super) async fn on_checkpoint_fetch(&self, host: &str, m: CheckpointFetch) -> Handled {
        let answer = match self.store.checkpoint_fetch(host, &m).await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(host, error = %e, "a checkpoint fetch could not be served now");
                DataAnswer::Refused("unavailable".into())
            }
        };
        if let DataAnswer::Refused(c) = &answer {
            tracing::warn!(host, assignment_id = %m.assignment_id, reservation_id = %m.reservation_id,
                object = %m.object_digest, category = %c, "checkpoint fetch refused");
            self.store.auditor().record(
                "checkpoint-fetch",
                Category::parse(c).unwrap_or(Category::NotOwner),
                None,
                Some(&m.assignment_id),
                None,
                &format!(
                    "host:{host} reservation {} object {}: {c}",
                    m.reservation_id, m.object_digest
                ),
            );
            if c == "corrupt" {
                tracing::error!(object = %m.object_digest, "a checkpoint object in the store does not match its digest: refused, never served");
            }
        } else if m.offset == 0 {
            tracing::info!(host, assignment_id = %m.assignment_id, reservation_id = %m.reservation_id,
                object = %m.object_digest, "checkpoint object served for a restore");
        }
        let reply = ToHost::CheckpointData(CheckpointData {
            object_digest: m.object_digest,
            offset: m.offset,
            answer,
        });
        Handled::reply(vec![Outgoing::to_host(&self.session, &reply)])
    }

    /// A host's release of its copy of done work (`coordinator::workspace_release`).
    pub(super) async fn on_workspace_release(&self, host: &str, m: WorkspaceRelease) -> Handled {
        let done = matches!(m.step, ReleaseStep::Done { .. });
        let verdict = match self.store.workspace_release(host, &m).await {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(host, error = %e, "a workspace release could not be answered now");
                ReleaseVerdict::Retry(e.category().map_or("unavailable", |c| c.as_str()).into())
            }
        };
        match (&verdict, &m.step) {
            (ReleaseVerdict::Release, ReleaseStep::Ask { workspace }) => {
                tracing::info!(host, assignment_id = %m.assignment_id,
                    checkpoint = workspace.as_ref().map_or("-", |w| w.checkpoint_digest.as_str()),
                    "a host may release its copy of done work")
            }
            (ReleaseVerdict::Recorded, ReleaseStep::Done { refs_removed }) => {
                tracing::info!(host, assignment_id = %m.assignment_id, refs_removed,
                    "a host released its copy of done work")
            }
            (ReleaseVerdict::Keep(c), _)
                if c == "not-owner" || c == "not-found" || c == "not-released" =>
            {
                tracing::warn!(host, assignment_id = %m.assignment_id, category = %c,
                    "a workspace release refused");
                self.store.auditor().record(
                    "workspace-release",
                    match c.as_str() {
                        "not-owner" => Category::NotOwner,
                        "not-found" => Category::NotFound,
                        _ => Category::WrongState,
                    },
                    None,
                    Some(&m.assignment_id),
                    None,
                    &format!("host:{host}: {c}"),
                );
            }
            _ => {}
        }
        let reply = ToHost::WorkspaceReleaseAnswer(WorkspaceReleaseAnswer {
            assignment_id: m.assignment_id,
            done,
            verdict,
        });
        Handled {
            replies: vec![Outgoing::to_host(&self.session, &reply)],
            violation: None,
            deferred: None,
        }
    }
}
