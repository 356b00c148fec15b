//! Harness artifacts this host sealed, uploaded to the coordinator's store (role
//! `artifact`, the same parts and answers as a checkpoint's objects): once the store holds
//! one whole and verified, this host's copy goes; one the store refuses for good stays
//! here (its only copy), marked so it is not sent again, and says why in the log.

use super::transfer::{UploadHead, Uploaded, NO_ANSWER, NO_LINK};
use super::*;
use crate::protocol::messages::ObjectRole;
use crate::supervisor::artifacts;

impl CoordinatedHost {
    /// One round over the artifacts not uploaded yet; `failures` counts failed rounds per
    /// artifact (said at warn the first time and every 30th).
    pub(super) async fn artifact_round(&self, failures: &mut HashMap<String, u64>) {
        let inner = self.sup.inner.clone();
        let Ok(list) = tokio::task::spawn_blocking(move || artifacts::pending(&inner)).await else {
            return;
        };
        for (note, file) in list {
            let a = &note.artifact;
            let head = UploadHead {
                assignment_id: note.assignment_id.clone(),
                lane_incarnation_id: note.lane_incarnation_id.clone(),
                generation: note.generation,
                checkpoint_digest: a.digest.clone(),
                base_commit_id: None,
            };
            match self
                .send_object(&head, ObjectRole::Artifact, &file, &a.digest, a.size)
                .await
            {
                Ok(Uploaded::Stored) => {
                    failures.remove(&a.digest);
                    artifacts::stored(&file);
                    tracing::info!(assignment_id = %note.assignment_id, generation = note.generation,
                        artifact_digest = %a.digest, "harness artifact stored by the coordinator; this host's copy removed");
                }
                Ok(Uploaded::Refused(c)) => {
                    failures.remove(&a.digest);
                    let mark = artifacts::refused_mark(&file.with_extension("json"));
                    if let Err(e) = crate::util::durable::write_atomic(&mark, c.as_bytes()) {
                        tracing::warn!(error = %e, "cannot mark a refused artifact; it is sent again");
                    }
                    tracing::error!(assignment_id = %note.assignment_id, generation = note.generation,
                        artifact_digest = %a.digest, refusal = %c, file = %file.display(),
                        "the coordinator's store refused a harness artifact for good: it stays on this host only");
                }
                Err(e) => {
                    let n = failures.entry(a.digest.clone()).or_default();
                    *n += 1;
                    if *n == 1 || *n % 30 == 0 {
                        tracing::warn!(assignment_id = %note.assignment_id, generation = note.generation,
                            error = %e, attempts = *n, "artifact upload not finished; trying again later");
                    }
                    if e == NO_LINK || e == NO_ANSWER {
                        return;
                    }
                }
            }
        }
    }
}
