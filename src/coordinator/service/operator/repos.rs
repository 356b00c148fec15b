//! Repositories: their declaration, and the workspace an `assign` asks for, validated
//! before anything is reserved.

use super::*;
use crate::protocol::repo::{BaseRef, RepoError, RepoName, RepoSetup, RepoSource};

fn bad(e: RepoError) -> OpError {
    OpError::new(Category::BadInput, e.to_string())
}

impl Service {
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
