//! Repositories: their declaration, and the workspace an `assign` asks for, validated
//! before anything is reserved.

use super::*;
use crate::protocol::repo::{BaseRef, RepoError, RepoName, RepoSetup, RepoSource};

fn bad(e: RepoError) -> OpError {
    OpError::new(Category::BadInput, e.to_string())
}

impl Service {
    /// Repositories, checkpoints and grants: the operator's requests about work's homes.
    /// `who` is named in the record of any checkpoint material it reads.
    pub(super) async fn workspace_request(
        &self,
        r: OperatorRequest,
        who: &str,
    ) -> Result<serde_json::Value, OpError> {
        Ok(match r {
            OperatorRequest::RepoAdd {
                name,
                path,
                url,
                host_id,
                copy,
                setup,
                setup_timeout_s,
            } => {
                let setup = RepoSetup::parse(&copy, &setup, setup_timeout_s).map_err(bad)?;
                self.repo_add(&name, path, url, host_id, &setup).await?
            }
            OperatorRequest::Repos => json!(self.store.repositories().await?),
            OperatorRequest::Checkpoints {
                assignment_id,
                checkpoint_digest,
            } => {
                json!(
                    self.store
                        .checkpoints(assignment_id.as_deref(), checkpoint_digest.as_deref())
                        .await?
                )
            }
            OperatorRequest::CheckpointShow {
                checkpoint_digest,
                diff,
            } => {
                self.store
                    .checkpoint_show(&checkpoint_digest, diff, &std::env::temp_dir(), who)
                    .await?
            }
            OperatorRequest::CheckpointRead {
                checkpoint_digest,
                object_digest,
                offset,
            } => {
                self.store
                    .checkpoint_read(&checkpoint_digest, &object_digest, offset, who)
                    .await?
            }
            OperatorRequest::Artifacts { assignment_id } => {
                json!(self.store.artifacts(assignment_id.as_deref()).await?)
            }
            OperatorRequest::ArtifactRead {
                artifact_digest,
                offset,
            } => {
                self.store
                    .artifact_read(&artifact_digest, offset, who)
                    .await?
            }
            OperatorRequest::CheckpointGrants { assignment_id } => {
                json!(self.store.grants(assignment_id.as_deref()).await?)
            }
            OperatorRequest::CheckpointGrantRevoke { grant_id, .. } => {
                let l = self.leader().await?;
                // Again: the same answer (it took effect); consumed: refused.
                let g = self.store.grants(None).await?;
                match g.iter().find(|g| g.binding.grant_id == grant_id) {
                    Some(g) if g.revoked_at.is_some() => {
                        json!({ "grant_id": grant_id, "revoked_at": g.revoked_at,
                                "target_assignment_id": g.binding.target_assignment_id })
                    }
                    _ => self.store.revoke_grant(&l, &grant_id).await?,
                }
            }
            OperatorRequest::CheckpointGc { dry_run, .. } => {
                let l = self.leader().await?;
                self.store
                    .checkpoint_gc(&l, "retention", None, dry_run)
                    .await?
            }
            OperatorRequest::CheckpointDelete {
                checkpoint_digest, ..
            } => {
                let l = self.leader().await?;
                // A harness artifact's digest (naming no checkpoint: a checkpoint is never
                // shadowed by an artifact of the same digest) is its own deletion.
                if crate::protocol::envelope::is_digest(&checkpoint_digest)
                    && self
                        .store
                        .checkpoints(None, Some(&checkpoint_digest))
                        .await?
                        .is_empty()
                    && self.store.is_artifact(&checkpoint_digest).await?
                {
                    self.store.delete_artifact(&l, &checkpoint_digest).await?
                } else {
                    self.store
                        .checkpoint_gc(&l, "operator", Some(&checkpoint_digest), false)
                        .await?
                }
            }
            OperatorRequest::CheckpointDeletions { assignment_id } => {
                json!(
                    self.store
                        .checkpoint_deletions(assignment_id.as_deref())
                        .await?
                )
            }
            OperatorRequest::CheckpointReads { assignment_id } => {
                json!(
                    self.store
                        .checkpoint_reads(assignment_id.as_deref())
                        .await?
                )
            }
            OperatorRequest::WorkspaceReleases { assignment_id } => {
                json!(
                    self.store
                        .workspace_releases(assignment_id.as_deref())
                        .await?
                )
            }
            _ => return Err(OpError::new(Category::Internal, "not a workspace request")),
        })
    }

    /// Why a chain ended before RUNNING, in its host's words (a launch that failed says
    /// what failed), once its receipt is in: `"; its host said: …"`, or nothing.
    pub(super) async fn host_said(&self, c: &ChainRow) -> Result<String, OpError> {
        Ok(match c.generation {
            Some(g) => self
                .store
                .receipt_detail(&c.chain.lane_incarnation_id, g)
                .await?
                .map(|d| format!("; its host said: {d}"))
                .unwrap_or_default(),
            None => String::new(),
        })
    }

    /// The grant an `assign --from-checkpoint` makes, checked before anything is reserved:
    /// a new assignment in a repository, an end checkpoint of another assignment's work in
    /// it, whose bytes the lane's host has or the store holds. `(digest, lifetime ms)`.
    pub(super) async fn grant_for(
        &self,
        a: &AssignRequest,
        repository: Option<&(RepoName, BaseRef)>,
        lane: &crate::coordinator::model::LaneView,
    ) -> Result<Option<(String, i64)>, OpError> {
        let Some(digest) = &a.from_checkpoint else {
            if a.grant_within_s.is_some() {
                return Err(OpError::new(
                    Category::BadInput,
                    "--grant-within needs --from-checkpoint",
                ));
            }
            return Ok(None);
        };
        if a.base.is_some() {
            return Err(OpError::new(
                Category::BadInput,
                "--from-checkpoint starts from the checkpoint's own base: no --base",
            ));
        }
        let Some((repo, _)) = repository.filter(|_| a.resume.is_none()) else {
            return Err(OpError::new(
                Category::BadInput,
                "--from-checkpoint starts a new assignment in a repository (--repo, not --resume)",
            ));
        };
        let secs = a.grant_within_s.map_or(
            crate::coordinator::grants::DEFAULT_GRANT_MS / 1000,
            i64::from,
        );
        if !(1..=86_400).contains(&secs) {
            return Err(OpError::new(
                Category::BadInput,
                "--grant-within is 1 s to 24 h",
            ));
        }
        let (_, host, stored) = self.store.grantable(digest, repo.as_str()).await?;
        if !stored && host != lane.host_id {
            return Err(OpError::new(
                Category::WrongState,
                format!("checkpoint {digest} is on host:{host} only (not in the store): start the assignment on a lane of host:{host}"),
            ));
        }
        Ok(Some((digest.clone(), secs * 1000)))
    }

    /// `mosaic repo add`.
    pub(super) async fn repo_add(
        &self,
        name: &str,
        path: Option<String>,
        url: Option<String>,
        host_id: Option<String>,
        setup: &RepoSetup,
    ) -> Result<serde_json::Value, OpError> {
        let name = RepoName::parse(name).map_err(bad)?;
        let source = match (path, url) {
            (Some(p), None) => RepoSource::path(&p).map_err(bad)?,
            (None, Some(u)) => RepoSource::url(&u).map_err(bad)?,
            _ => {
                return Err(OpError::new(
                    Category::BadInput,
                    "a repository comes from exactly one of a path (on one host) or a URL",
                ))
            }
        };
        let host = host_id.map(|h| h.strip_prefix("host:").unwrap_or(&h).to_string());
        let (repo, added) = self
            .store
            .add_repository(&name, &source, host.as_deref(), setup)
            .await?;
        Ok(json!({ "repository": repo, "added": added }))
    }

    /// The repository and base ref of an `assign`, checked: declared, reachable from the
    /// lane's host; a resume names no other repository than its work's, and goes to
    /// another host than its workspace's only when its latest checkpoint is in the store
    /// (its stage restores it there).
    pub(super) async fn workspace_for(
        &self,
        a: &AssignRequest,
        lane: &crate::coordinator::model::LaneView,
    ) -> Result<Option<(RepoName, BaseRef)>, OpError> {
        if let Some(resumed) = &a.resume {
            let has = self.store.workspace_of(resumed).await?;
            if let (Some(asked), Some((own, _))) = (&a.repo, &has) {
                if asked != own {
                    return Err(OpError::new(
                        Category::BadInput,
                        format!("{resumed} works in repository {own}, not {asked}: a resume keeps its workspace"),
                    ));
                }
            }
            if a.repo.is_none() && a.base.is_some() {
                return Err(OpError::new(Category::BadInput, "--base needs --repo"));
            }
            // Elsewhere only from a checkpoint the store holds (or its own host's).
            if has.is_some() {
                if let Some(why) = self
                    .store
                    .workspace_cannot_move(resumed, &lane.host_id)
                    .await?
                {
                    return Err(OpError::new(
                        Category::WrongState,
                        format!("{resumed} cannot resume on host:{}: {why}", lane.host_id),
                    ));
                }
            }
            return Ok(None); // a resume keeps its own
        }
        let Some(name) = &a.repo else {
            if a.base.is_some() {
                return Err(OpError::new(Category::BadInput, "--base needs --repo"));
            }
            return Ok(None);
        };
        let name = RepoName::parse(name).map_err(bad)?;
        let base = BaseRef::parse(a.base.as_deref().unwrap_or(BaseRef::DEFAULT)).map_err(bad)?;
        let Some(repo) = self.store.repository(name.as_str()).await? else {
            return Err(OpError::new(
                Category::NotFound,
                format!(
                    "no repository {} (mosaic repo add {} --path DIR --host H | --url URL)",
                    name.as_str(),
                    name.as_str()
                ),
            ));
        };
        if !repo.reachable_from(&lane.host_id) {
            return Err(OpError::new(
                Category::BadInput,
                format!(
                    "repository {} is a path on host:{}; lane {} is on host:{}",
                    name.as_str(),
                    repo.host_id.as_deref().unwrap_or("?"),
                    lane.lane_id,
                    lane.host_id
                ),
            ));
        }
        Ok(Some((name, base)))
    }
}
